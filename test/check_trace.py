#!/usr/bin/env python3
"""check_trace.py — the merged trace of a multi-rank run (log.trace; test/cli_mpi_trace.sh).

  python3 test/check_trace.py MERGED.json WORLD STEPS TOLERANCE_S

One process per rank 0..WORLD-1, each named ("rank R (host H, ...)") and holding its threads
("steps", "compute", "dp comm") and STEPS step spans. Time 0 is the end of the barrier at start,
so every span starts at or after 0 and step 1 begins within a few seconds of it; and step k begins
on every rank within TOLERANCE_S of the others: each begins as the step's first world allreduce
ends, one moment on every rank. Prints the worst spread.
"""
import json
import sys


def main():
    path, world, steps, tol = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    events = json.load(open(path))["traceEvents"]
    errors = []
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    if sorted(names) != list(range(world)):
        errors.append(f"processes {sorted(names)}, expected 0..{world - 1}")
    for pid, name in names.items():
        if not name.startswith(f"rank {pid} (host "):
            errors.append(f"process {pid} named {name!r}")
    threads = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "thread_name"}
    for r in range(world):
        for t in ("steps", "compute", "dp comm"):
            if (r, t) not in threads:
                errors.append(f"rank {r} lacks thread {t!r}")
    spans = [e for e in events if e.get("ph") == "X"]
    if any(e["ts"] < 0 for e in spans):
        errors.append("a span before time 0 (the barrier at start)")
    begin = {}
    for e in spans:
        if e["name"].startswith("step "):
            begin.setdefault(int(e["name"].split()[1]), {})[e["pid"]] = e["ts"] / 1e6
    if sorted(begin) != list(range(1, steps + 1)):
        errors.append(f"steps {sorted(begin)}, expected 1..{steps}")
    worst = 0.0
    for k, by_rank in sorted(begin.items()):
        if sorted(by_rank) != list(range(world)):
            errors.append(f"step {k} on ranks {sorted(by_rank)}")
            continue
        worst = max(worst, max(by_rank.values()) - min(by_rank.values()))
    if begin.get(1) and max(begin[1].values()) > 5:
        errors.append(f"step 1 begins {max(begin[1].values()):.3f} s after time 0")
    if worst > tol:
        errors.append(f"a step begins {worst:.3f} s apart on two ranks (tolerance {tol} s): clocks not aligned")
    if errors:
        print("; ".join(errors[:5]))
        sys.exit(1)
    print(f"{world} ranks, {steps} steps; step starts at most {1e3 * worst:.1f} ms apart")


if __name__ == "__main__":
    main()
