#!/usr/bin/env python3
"""Checks a --device-idle run (core/README.md, Device idle) against the host delay planted in it.

usage: check_idle.py METRICS LOG OP SECONDS [--interval K] [--coverage F] [--gemm-shapes N]
                     [--gemm "OP MxNxK TT AB>C[ acc]=CALLS"]...

The run trained with log.interval K (default 1), log.metrics METRICS (stdout in LOG) and
COOKTRAIN_FAULT_HOST_DELAY=OP:1:SECONDS, so the host slept SECONDS before the first call of OP, in
step 1. Checks:
  - every training line has device_busy_s and device_idle_s, finite and >= 0, and the two add up
    to no more than the step's wall time (step_time_s, which also holds the step's reads and the
    waits around it): the audit times the stream inside the step;
  - step 1 was idle at least SECONDS (the stream waited for the sleeping host), and its progress
    line names OP first among the ops whose start the stream waited for, at >= SECONDS;
  - every later step was idle less than SECONDS and less than a quarter of its busy time (the
    same model's ops with nobody sleeping: the idle time is launch and host overhead, ~2% here);
  - each progress line (after step 1, every K-th step and the last) gives the metrics' idle and
    busy times averaged over the steps since the line before (to the printed digits): a line
    counts its steps' ops and no others, not those of an evaluation between two steps;
  - with --coverage F: busy + idle is at least F of every step's wall time (a synchronous backend's
    ops fill its step but for the batch read and the syncs: ~99.8% on the CPU backend);
  - each progress line is followed by the time in ops by op ("device busy by op"), whose times
    add up to the line's time in ops and whose calls to its ops/step (to the printed digits), and
    by the GEMM ops' time by shape ("device busy by GEMM shape"), whose times and calls add up to
    those of the GEMM ops (gemm, gemm_bias, gemm_bias_gelu) in the by-op line;
  - with --gemm-shapes N: that line has N shapes; with --gemm SPEC=CALLS (repeatable): it has the
    shape SPEC, called CALLS times a step.
Prints a one-line summary; exits 1 with the first failure.
"""
import json
import math
import re
import sys


def fail(msg):
    print(msg)
    sys.exit(1)


GEMM_OPS = ("gemm", "gemm_bias", "gemm_bias_gelu")


def entries(line, prefix):
    """The "NAME MS (CALLS)" entries of a by-op or by-shape line, as (name, ms, calls)."""
    if not line.startswith(prefix):
        fail(f"expected a line starting {prefix!r}, got: {line.strip()[:120]}")
    out = []
    for e in line[len(prefix):].split(" | "):
        m = re.fullmatch(r"\s*(.+) ([0-9.]+) \(([0-9]+)\)\s*", e)
        if not m:
            fail(f"not an entry 'NAME MS (CALLS)': {e!r} in {line.strip()[:120]}")
        out.append((m.group(1), float(m.group(2)), float(m.group(3))))
    return out


def check_busy_lines(log_lines, n_shapes, want_gemms):
    """Each device idle line's two by-op lines (see the top of the file)."""
    for i, line in enumerate(log_lines):
        if not line.startswith("device idle (rank 0, ms/step):"):
            continue
        m = re.match(r".*: [0-9.]+ between ops, ([0-9.]+) in ops .*, ([0-9]+) ops/step;", line)
        busy, n_ops = float(m.group(1)), float(m.group(2))
        ops = entries(log_lines[i + 1] if i + 1 < len(log_lines) else "",
                      "device busy by op (rank 0, ms/step, calls/step):")
        total = sum(ms for _, ms, _ in ops)
        if abs(total - busy) > 0.0005 * (len(ops) + 1):  # each figure rounded to 0.001
            fail(f"the by-op times add up to {total:.3f} ms, the line's time in ops is {busy}")
        calls = sum(c for _, _, c in ops)
        if abs(calls - n_ops) > 0.5 * (len(ops) + 1):  # each count rounded to an integer
            fail(f"the by-op calls add up to {calls:.0f}, the line says {n_ops:.0f} ops/step")
        gemm_ops = [(ms, c) for name, ms, c in ops if name in GEMM_OPS]
        if not gemm_ops:
            continue
        shapes = entries(log_lines[i + 2] if i + 2 < len(log_lines) else "",
                         "device busy by GEMM shape (rank 0, ms/step, calls/step):")
        for what, got, want, unit in (
                ("times", sum(ms for _, ms, _ in shapes), sum(ms for ms, _ in gemm_ops), 0.0005),
                ("calls", sum(c for _, _, c in shapes), sum(c for _, c in gemm_ops), 0.5)):
            if abs(got - want) > unit * (len(shapes) + len(gemm_ops)):
                fail(f"the GEMM shapes' {what} add up to {got:.3f}, the GEMM ops' to {want:.3f}")
        for name, _, _ in shapes:
            if not re.fullmatch(r"(gemm|gemm_bias|gemm_bias_gelu) [0-9]+x[0-9]+x[0-9]+ [NT][NT] "
                                r"(f32|bf16)>(f32|bf16)( acc)?", name):
                fail(f"not a GEMM shape 'OP MxNxK TT AB>C[ acc]': {name!r}")
        if n_shapes is not None and len(shapes) != n_shapes:
            fail(f"{len(shapes)} GEMM shapes, expected {n_shapes}: "
                 + ", ".join(name for name, _, _ in shapes))
        for spec, want in want_gemms:
            got = [c for name, _, c in shapes if name == spec]
            if got != [want]:
                fail(f"GEMM shape {spec!r}: {got or 'absent'} calls a step, expected {want:.0f} "
                     f"(shapes: " + ", ".join(name for name, _, _ in shapes) + ")")


def main():
    args = sys.argv[1:]
    coverage, interval, n_shapes, want_gemms = None, 1, None, []
    while "--gemm" in args:
        i = args.index("--gemm")
        spec, _, calls = args[i + 1].rpartition("=")
        want_gemms.append((spec, float(calls)))
        del args[i : i + 2]
    if "--gemm-shapes" in args:
        i = args.index("--gemm-shapes")
        n_shapes = int(args[i + 1])
        del args[i : i + 2]
    for opt in ("--coverage", "--interval"):
        if opt in args:
            i = args.index(opt)
            if opt == "--coverage":
                coverage = float(args[i + 1])
            else:
                interval = int(args[i + 1])
            del args[i : i + 2]
    if len(args) != 4:
        fail(__doc__.strip().splitlines()[2])
    metrics, log, op, seconds = args[0], args[1], args[2], float(args[3])
    steps = []
    for line in open(metrics):
        d = json.loads(line)
        if "step" in d and "step_time_s" in d and "val_loss" not in d:
            steps.append(d)
    if len(steps) < 2:
        fail(f"{metrics}: {len(steps)} training lines, need 2 or more")
    for d in steps:
        for key in ("device_busy_s", "device_idle_s"):
            if key not in d:
                fail(f"step {d['step']}: no {key}")
            if not math.isfinite(d[key]) or d[key] < 0:
                fail(f"step {d['step']}: {key} = {d[key]}")
        busy, idle, wall = d["device_busy_s"], d["device_idle_s"], d["step_time_s"]
        # step_time_s is printed to 1e-4 s, the others to 1e-6
        if busy + idle > wall + 1e-4:
            fail(f"step {d['step']}: busy {busy} + idle {idle} > the step's {wall} s")
        if coverage is not None and busy + idle < coverage * wall:
            fail(f"step {d['step']}: busy {busy} + idle {idle} cover less than {coverage} of "
                 f"the step's {wall} s")
    first, rest = steps[0], steps[1:]
    if first["step"] != 1:
        fail(f"the first training line is step {first['step']}, not 1")
    if first["device_idle_s"] < seconds:
        fail(f"step 1: idle {first['device_idle_s']} s, but the host slept {seconds} s before {op}")
    for d in rest:
        if d["device_idle_s"] >= seconds or d["device_idle_s"] > 0.25 * d["device_busy_s"]:
            fail(f"step {d['step']}: idle {d['device_idle_s']} s against busy "
                 f"{d['device_busy_s']} s with nothing planted")
    lines = [l for l in open(log) if l.startswith("device idle (rank 0, ms/step):")]
    groups, group = [], []  # the steps each line covers
    for d in steps:
        group.append(d)
        if d["step"] == 1 or d["step"] % interval == 0 or d is steps[-1]:
            groups.append(group)
            group = []
    if len(lines) != len(groups):
        fail(f"{log}: {len(lines)} device idle lines for {len(groups)} intervals")
    for group, line in zip(groups, lines):
        m = re.match(r"device idle \(rank 0, ms/step\): ([0-9.]+) between ops, ([0-9.]+) in ops",
                     line)
        if not m:
            fail(f"not a device idle line: {line.strip()}")
        for got, key in ((float(m.group(1)), "device_idle_s"), (float(m.group(2)), "device_busy_s")):
            want = 1e3 * sum(d[key] for d in group) / len(group)
            if abs(got - want) > 0.0005 + 0.0005:  # the line's rounding and the metrics'
                fail(f"steps {group[0]['step']}-{group[-1]['step']}: the line says {got} ms, "
                     f"the metrics' {key} {want:.4f} ms a step")
    check_busy_lines(open(log).read().splitlines(), n_shapes, want_gemms)
    m = re.search(r"waited longest before: (\S+) ([0-9.]+) \(", lines[0])
    if not m:
        fail(f"step 1's line names no op: {lines[0].strip()}")
    if m.group(1) != op or float(m.group(2)) < 1e3 * seconds:
        fail(f"step 1's longest wait is before {m.group(1)} ({m.group(2)} ms), not before {op}")
    print(f"step 1 idle {1e3 * first['device_idle_s']:.1f} ms (the host slept "
          f"{1e3 * seconds:.0f} before {op}), later steps "
          f"{max(1e3 * d['device_idle_s'] for d in rest):.2f} ms at most against "
          f"{min(1e3 * d['device_busy_s'] for d in rest):.1f} busy")


if __name__ == "__main__":
    main()
