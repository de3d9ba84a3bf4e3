#!/usr/bin/env python3
"""The resource usage of every CUDA kernel, from ptxas: cuda/resources.md, whole.

  python3 scripts/cuda_resources.py [BUILD] > cuda/resources.md       (BUILD: default build/)

The real build keeps ptxas's report (-Xptxas -v) beside each object: BUILD/cuda/NAME.o.ptxas
(cuda/cuda.mk). One row per kernel instantiation and architecture: registers per thread, static
shared memory, stack frame and spills (the build fails on spills and local memory, so those two
columns stay 0 — they are shown so a reader sees it). Names are demangled with c++filt.
test/cli/cli_cuda.sh checks that cuda/resources.md is this script's output for the current build.
"""
import glob
import os
import re
import subprocess
import sys


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return dict(zip(names, out))


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    rows = []
    for path in sorted(glob.glob(os.path.join(build, "cuda", "*.o.ptxas"))):
        source = "cuda/" + os.path.basename(path)[:-len(".o.ptxas")] + ".cu"
        if not os.path.exists(source):  # the report of a kernel file since removed
            continue
        entry = arch = None
        props = {}
        for line in open(path):
            m = re.search(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'", line)
            if m:
                entry, arch = m.group(1), m.group(2)
                continue
            m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                          line)
            if m and entry:
                props = {"stack": int(m.group(1)), "spill": int(m.group(2)) + int(m.group(3))}
                continue
            m = re.search(r"Used (\d+) registers", line)
            if m and entry:
                smem = re.search(r"(\d+) bytes smem", line)
                rows.append((source, entry, arch, int(m.group(1)), int(smem.group(1)) if smem else 0,
                             props.get("stack", 0), props.get("spill", 0)))
                entry = None
    if not rows:
        sys.exit("no ptxas reports under %s/cuda (build with nvcc first)" % build)
    names = demangle(sorted({r[1] for r in rows}))
    print("# Resource usage of the CUDA kernels\n")
    print("Per kernel instantiation and architecture, from the nvcc build's `-Xptxas -v` reports")
    print("(`python3 scripts/cuda_resources.py build > cuda/resources.md`; test/cli/cli_cuda.sh fails")
    print("when this file differs from the build's reports). Spills and local memory fail the build,")
    print("so those columns stay 0. Dynamic shared memory (attention's tiles, the norms' backward")
    print("accumulators) is not in the static column: each kernel file gives its sizes.\n")
    print("| file | kernel | arch | registers | static smem (B) | stack (B) | spills (B) |")
    print("|---|---|---|---:|---:|---:|---:|")
    for source, entry, arch, regs, smem, stack, spill in sorted(rows, key=lambda r: (r[0], names[r[1]], r[2])):
        kernel = names[entry].replace("|", "\\|").replace("__nv_bfloat16", "bf16")
        print("| %s | `%s` | %s | %d | %d | %d | %d |" % (source, kernel, arch, regs, smem, stack, spill))


if __name__ == "__main__":
    main()
