#!/usr/bin/env python3
"""Checks a --device-idle run (core/README.md, Device idle) against the host delay planted in it.

usage: check_idle.py METRICS LOG OP SECONDS [--interval K] [--coverage F]

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
    ops fill its step but for the batch read and the syncs: ~99.8% on the CPU backend).
Prints a one-line summary; exits 1 with the first failure.
"""
import json
import math
import re
import sys


def fail(msg):
    print(msg)
    sys.exit(1)


def main():
    args = sys.argv[1:]
    coverage, interval = None, 1
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
