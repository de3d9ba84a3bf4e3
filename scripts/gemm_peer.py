#!/usr/bin/env python3
"""The GEMMs of a cooktrain training step, shape by shape, against the same shapes through PyTorch.

usage: gemm_peer.py [--reps N] [--no-torch] LABEL=LOG ...

LOG is the output of a `cooktrain train --device-idle` run. Its last "device busy by GEMM shape"
line (core/README.md, Device idle) gives, per GEMM shape of the step, the device's time inside
those calls (on its own clock, nothing synced) and the calls per step. A shape reads
`OP MxNxK TT AB>C[ acc]`: C (M x N) = op(A) (M x K) . op(B) (K x N), row-major; TT the transposes
of A and B; AB>C the operand and output types; acc where the product adds onto C; OP gemm,
gemm_bias (the bias in the epilogue) or gemm_bias_gelu (bias and GELU, the pre-activation kept).

Each shape is timed in PyTorch on the GPU with its operands in the same memory layout (a
transposed operand is a transposed view, so cuBLAS gets the same transpose flags) and the same
output type: torch.mm, torch.addmm for a bias or an accumulation, out_dtype=torch.float32 where C
is fp32 and the operands bf16; fp32 with TF32 off. GELU is not in PyTorch's GEMM (the eager model
runs it as its own kernel), so a gemm_bias_gelu shape is timed as its addmm and cooktrain's
figure holds the GELU and the second output besides. The time is the median of 5 rounds of N
calls (default 20) between CUDA events, after a warm-up round.

Per LABEL: a row per shape (calls a step, cooktrain's ms a call, PyTorch's, the ratio, what
PyTorch ran), then the step's GEMMs in total (each side's ms a call times the calls) and their
ratio: the target is cooktrain within 1.15x of PyTorch. With --no-torch, or where torch
cannot be imported or has no GPU, only cooktrain's columns (the script says why).
"""
import re
import sys

PREFIX = "device busy by GEMM shape (rank 0, ms/step, calls/step):"
SHAPE = re.compile(r"(gemm|gemm_bias|gemm_bias_gelu) ([0-9]+)x([0-9]+)x([0-9]+) ([NT])([NT]) "
                   r"(f32|bf16)>(f32|bf16)( acc)? ([0-9.]+) \(([0-9]+)\)")


def parse(log):
    """The shapes of LOG's last GEMM line: dicts with op, M, N, K, ta, tb, ab, c, acc, ms (a step),
    calls (a step)."""
    lines = [l for l in open(log, errors="replace") if l.startswith(PREFIX)]
    if not lines:
        raise ValueError(f"{log}: no '{PREFIX.split(' (')[0]}' line (a --device-idle run prints one)")
    shapes = []
    for entry in lines[-1][len(PREFIX):].split(" | "):
        m = SHAPE.fullmatch(entry.strip())
        if not m:
            raise ValueError(f"{log}: not a GEMM shape entry: {entry.strip()!r}")
        g = m.groups()
        shapes.append(dict(op=g[0], M=int(g[1]), N=int(g[2]), K=int(g[3]), ta=g[4] == "T",
                           tb=g[5] == "T", ab=g[6], c=g[7], acc=bool(g[8]), ms=float(g[9]),
                           calls=int(g[10])))
    return shapes


def name(s):
    return "%s %dx%dx%d %s%s %s>%s%s" % (s["op"], s["M"], s["N"], s["K"], "NT"[s["ta"]],
                                         "NT"[s["tb"]], s["ab"], s["c"], " acc" if s["acc"] else "")


class Torch:
    """PyTorch's time for a shape, cached by everything the call depends on."""

    def __init__(self, reps):
        import torch  # here, so that the parsing and the table need no torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch %s: torch.cuda.is_available() is false" % torch.__version__)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.torch, self.reps, self.cache = torch, reps, {}

    def time(self, s):
        key = (s["op"], s["M"], s["N"], s["K"], s["ta"], s["tb"], s["ab"], s["c"], s["acc"])
        if key not in self.cache:
            self.cache[key] = self._time(s)
        return self.cache[key]

    def _time(self, s):
        torch = self.torch
        dt = {"bf16": torch.bfloat16, "f32": torch.float32}
        ab, c = dt[s["ab"]], dt[s["c"]]
        M, N, K = s["M"], s["N"], s["K"]
        # the stored operands, as cooktrain's: A (M x K) or, transposed, (K x M); B likewise
        a = torch.randn(K, M, device="cuda", dtype=ab).t() if s["ta"] else \
            torch.randn(M, K, device="cuda", dtype=ab)
        b = torch.randn(N, K, device="cuda", dtype=ab).t() if s["tb"] else \
            torch.randn(K, N, device="cuda", dtype=ab)
        wide = c != ab  # bf16 operands, an fp32 C
        kw = {"out_dtype": torch.float32} if wide else {}
        if s["op"] != "gemm":  # the bias in the product's call, a row broadcast (F.linear's)
            bias = torch.randn(N, device="cuda", dtype=c)
            call, form = (lambda: torch.addmm(bias, a, b, **kw)), "addmm(bias)"
        elif s["acc"]:
            cm = torch.randn(M, N, device="cuda", dtype=c)
            if wide:
                call, form = (lambda: torch.addmm(cm, a, b, **kw)), "addmm(C)"
            else:
                call, form = (lambda: cm.addmm_(a, b)), "C.addmm_"
        else:
            call, form = (lambda: torch.mm(a, b, **kw)), "mm"
        if s["op"] == "gemm_bias_gelu":
            form += ", no GELU"
        if wide:
            form += ", out_dtype f32"
        try:
            call()
        except (TypeError, RuntimeError) as e:  # an older torch: no out_dtype
            if not wide:
                raise
            kw.clear()
            form = form.replace("out_dtype f32", "bf16 out: %s" % str(e)[:60])
            if s["acc"] and s["op"] == "gemm":
                cm = cm.to(ab)
                call = lambda: cm.addmm_(a, b)
            elif s["op"] != "gemm":
                bias = bias.to(ab)
        call()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(self.reps):
                call()
            t1.record()
            t1.synchronize()
            times.append(t0.elapsed_time(t1) / self.reps)
        del a, b
        return sorted(times)[len(times) // 2], form


def report(label, shapes, peer, why):
    print("== GEMMs by shape, %s: cooktrain's device time in a step's calls (--device-idle) "
          "against PyTorch's at the same shape" % label)
    if peer is None:
        print("   PyTorch not timed: %s" % why)
    w = max(len(name(s)) for s in shapes)
    head = "  %-*s %6s %11s" % (w, "shape", "calls", "ours ms")
    print(head + (" %11s %8s  %s" % ("torch ms", "ratio", "torch ran") if peer else ""))
    ours_total = torch_total = 0.0
    failed = 0
    for s in shapes:
        per_call = s["ms"] / s["calls"] if s["calls"] else 0.0
        ours_total += s["ms"]
        row = "  %-*s %6d %11.4f" % (w, name(s), s["calls"], per_call)
        if peer is not None:
            try:
                ms, form = peer.time(s)
            except Exception as e:  # one shape's failure (out of memory) leaves the others
                failed += 1
                row += " %11s %8s  failed: %s: %s" % ("-", "-", type(e).__name__, str(e)[:80])
            else:
                torch_total += ms * s["calls"]
                row += " %11.4f %7.2fx  %s" % (ms, per_call / ms if ms > 0 else float("nan"),
                                               form)
        print(row)
    line = "  all GEMMs of a step: cooktrain %.3f ms" % ours_total
    if peer is not None and not failed:
        line += ", PyTorch %.3f ms (its ms a call x the calls): %.2fx (target: within 1.15x)" % (
            torch_total, ours_total / torch_total if torch_total > 0 else float("nan"))
    elif peer is not None:
        line += "; no PyTorch total: %d shape(s) failed" % failed
    print(line)
    print("  (ms: a call; ratio: cooktrain's time over PyTorch's)")


def main(argv):
    reps, use_torch, runs = 20, True, []
    i = 0
    while i < len(argv):
        if argv[i] == "--reps" and i + 1 < len(argv) and argv[i + 1].isdigit():
            reps, i = max(1, int(argv[i + 1])), i + 2
        elif argv[i] == "--no-torch":
            use_torch, i = False, i + 1
        elif "=" in argv[i] and not argv[i].startswith("-"):
            runs.append(argv[i].rsplit("=", 1))  # a label may hold "=" (B=16), a path rarely
            i += 1
        else:
            print("gemm_peer: unknown argument %r" % argv[i], file=sys.stderr)
            print("hint: " + __doc__.strip().splitlines()[2], file=sys.stderr)
            return 2
    if not runs:
        print("gemm_peer: no LABEL=LOG given", file=sys.stderr)
        print("hint: " + __doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    parsed = []
    for label, log in runs:
        try:
            parsed.append((label, parse(log)))
        except (OSError, ValueError) as e:
            print("gemm_peer: %s" % e, file=sys.stderr)
            print("hint: give the output of a cooktrain train --device-idle run", file=sys.stderr)
            return 2
    peer, why = None, "--no-torch"
    if use_torch:
        try:
            peer = Torch(reps)
        except Exception as e:  # no torch, no GPU: cooktrain's columns only
            why = "%s: %s" % (type(e).__name__, e)
    for label, shapes in parsed:
        report(label, shapes, peer, why)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
