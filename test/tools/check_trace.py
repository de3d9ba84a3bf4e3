#!/usr/bin/env python3
"""check_trace.py — the merged trace of a multi-rank run (log.trace; test/mpi/cli_mpi_trace.sh).

  python3 test/tools/check_trace.py MERGED.json WORLD STEPS TOLERANCE_S

One process per rank 0..WORLD-1, each named ("rank R (host H, ...)") and holding its threads
("steps", "compute", "dp comm") and STEPS step spans. Time 0 is the end of the barrier at start,
so every span starts at or after 0 and step 1 begins within a few seconds of it; and step k begins
on every rank within TOLERANCE_S of the others: each begins as the step's first world allreduce
ends, one moment on every rank. Prints the worst spread.

  python3 test/tools/check_trace.py --device-wait MERGED.json RANK GROUP WAIT MIN_S

The device's side of a run on the CUDA backend with NCCL (emulated: CUEMU_EAGER=1), where one
rank was made late by MIN_S / 0.5 seconds (COOKTRAIN_FAULT_COMM). Rank RANK has a thread
"device comm GROUP" of spans from the communication stream's events, every one inside the run
(after time 0, before the last step ends), its collectives' spans one after another (one stream),
the longest lasting at least MIN_S (the operation the late rank joined late); and its compute
stream's longest wait (spans named
WAIT: "exposed comm" or "pipeline wait") lasts at least MIN_S and lies inside a step. A host-side
measurement (the host does not wait under NCCL) finds no such wait.

  python3 test/tools/check_trace.py --timeline TRACE.json STEPS

One rank's trace: STEPS step spans, one after another, and every unit's backward span (on the
CUDA backend its times come from the compute stream's marks, turned into host time at each
step's end) inside a step, backward spans in the order the stream ran them (two never cross: they are apart, or one
holds the other). A wrong conversion of device time (an anchor taken before the stream was idle, a sign
error) puts them outside their step or out of order.

  python3 test/tools/check_trace.py --pipeline MERGED.json BIN SCHEDULE PP V M BOUND

A pipelined run's actions (thread "pipeline actions": F, B, W or BW, microbatch:chunk). In every
step each rank runs each of its compute actions once; no backward before its forward, no weight
part (W) before its input part (B) has ended. Then the idle time: each rank's measured idle in a
step (1 - its actions' time over the step's pipeline span, first action to last on any rank) is
compared with the simulator's bubble for that rank (BIN plan --schedule SCHEDULE --costs F,B,W
with each chunk's mean F, B and W of steps 2 on), median over steps 2 on: within BOUND (a
fraction of the span) plus the spread of the rank's idle over those steps (the noise of a machine
that preempts ranks between actions, which no simulator sees). The simulator's transfers are free and its actions start the moment they can; the
executor's copies, messages and bookkeeping between actions are the difference.
"""
import json
import re
import statistics
import subprocess
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


def device_wait(path, rank, group, wait, min_s):
    events = json.load(open(path))["traceEvents"]
    errors = []
    threads = {e["args"]["name"]: e["tid"] for e in events
               if e.get("name") == "thread_name" and e["pid"] == rank}
    spans = [e for e in events if e.get("ph") == "X" and e["pid"] == rank]
    steps = [e for e in spans if e["name"].startswith("step ")]
    end = max((e["ts"] + e["dur"] for e in steps), default=0)
    tid = threads.get(f"device comm {group}")
    comm = [e for e in spans if e["tid"] == tid] if tid is not None else []
    if not comm:
        errors.append(f"rank {rank} has no spans on thread 'device comm {group}' (threads: {sorted(threads)})")
    outside = [e for e in comm if e["ts"] < 0 or e["ts"] + e["dur"] > end]
    if outside:
        errors.append(f"{len(outside)} device comm spans outside the run [0, {end / 1e6:.3f} s], "
                      f"e.g. {outside[0]['name']} at {outside[0]['ts'] / 1e6:.3f} s")
    # collectives run one after another on the group's stream: their spans cannot overlap (the
    # times print to the nanosecond)
    coll = sorted((e for e in comm if " peer " not in e["name"]), key=lambda e: e["ts"])
    for a, b in zip(coll, coll[1:]):
        if a["ts"] + a["dur"] > b["ts"] + 0.002:
            errors.append(f"device spans {a['name']} and {b['name']} overlap on one stream")
            break
    # the late rank's operation waits on the device: rank 0's copy of it lasts about as long
    top = max(comm, key=lambda e: e["dur"], default=None)
    if top is not None and top["dur"] / 1e6 < min_s:
        errors.append(f"longest device {group} span {top['name']}: {top['dur'] / 1e6:.3f} s, "
                      f"expected at least {min_s} s")
    waits = [e for e in spans if e["name"] == wait]
    longest = max(waits, key=lambda e: e["dur"], default=None)
    if longest is None or longest["dur"] / 1e6 < min_s:
        got = f"{longest['dur'] / 1e6:.3f} s" if longest else "none"
        errors.append(f"longest '{wait}' on rank {rank}: {got}, expected at least {min_s} s")
    elif not any(s["ts"] <= longest["ts"] and longest["ts"] + longest["dur"] <= s["ts"] + s["dur"]
                 for s in steps):
        errors.append(f"the longest '{wait}' (at {longest['ts'] / 1e6:.3f} s) is in no step")
    if errors:
        print("; ".join(errors[:5]))
        sys.exit(1)
    print(f"rank {rank}: {len(comm)} device spans on group {group}, longest {top['name']} "
          f"{top['dur'] / 1e6:.3f} s; longest '{wait}' {longest['dur'] / 1e6:.3f} s")


def timeline(path, steps):
    events = json.load(open(path))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    step = sorted((e for e in spans if e["name"].startswith("step ")), key=lambda e: e["ts"])
    back = sorted((e for e in spans if e["name"].startswith("backward ")), key=lambda e: e["ts"])
    errors = []
    if len(step) != steps:
        errors.append(f"{len(step)} step spans, expected {steps}")
    for a, b in zip(step, step[1:]):
        if a["ts"] + a["dur"] > b["ts"] + 0.002:
            errors.append(f"{a['name']} overlaps {b['name']}")
    if not back:
        errors.append("no backward spans")
    outside = [e for e in back if not any(
        s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] for s in step)]
    if outside:
        e = outside[0]
        errors.append(f"{len(outside)} backward spans in no step, e.g. {e['name']} at "
                      f"{e['ts'] / 1e6:.6f} s for {e['dur'] / 1e6:.6f} s")
    # disjoint or nested (the tied embedding's unit spans from the head's backward to its own end)
    for a, b in zip(back, back[1:]):
        a_end, b_end = a["ts"] + a["dur"], b["ts"] + b["dur"]
        if b["ts"] + 0.002 < a_end < b_end - 0.002:
            errors.append(f"backward spans cross: {a['name']} and {b['name']}")
            break
    if errors:
        print("; ".join(errors[:5]))
        sys.exit(1)
    print(f"{len(back)} backward spans inside {len(step)} steps, in order")


def pipeline(path, binary, schedule, pp, v, m, bound):
    events = json.load(open(path))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    tid = {(e["pid"], e["args"]["name"]): e["tid"] for e in events if e.get("name") == "thread_name"}
    errors = []
    steps = {}  # step -> rank -> [(kind, mb, chunk, t0, t1)]
    for r in range(pp):
        t = tid.get((r, "pipeline actions"))
        if t is None:
            print(f"rank {r} has no 'pipeline actions' thread")
            sys.exit(1)
        bounds = sorted((int(e["name"].split()[1]), e["ts"], e["ts"] + e["dur"])
                        for e in spans if e["pid"] == r and e["name"].startswith("step "))
        for e in spans:
            if e["pid"] != r or e["tid"] != t:
                continue
            k, mc = e["name"].split()
            mb, c = (int(x) for x in mc.split(":"))
            step = next((n for n, a, b in bounds if a - 1 <= e["ts"] <= b + 1), None)
            if step is None:
                errors.append(f"rank {r}: {e['name']} in no step")
                continue
            steps.setdefault(step, {}).setdefault(r, []).append((k, mb, c, e["ts"], e["ts"] + e["dur"]))
    kinds = {"zbh1": "FBW", "zbv": "FBW"}.get(schedule, "F BW")
    per_rank = m * v * (3 if kinds == "FBW" else 2)
    cost = {}  # (kind, chunk) -> seconds
    idle = {r: [] for r in range(pp)}
    for step, by_rank in sorted(steps.items()):
        if sorted(by_rank) != list(range(pp)):
            errors.append(f"step {step}: actions on ranks {sorted(by_rank)}")
            continue
        lo = min(a[3] for acts in by_rank.values() for a in acts)
        hi = max(a[4] for acts in by_rank.values() for a in acts)
        for r, acts in by_rank.items():
            if len(acts) != per_rank or len({a[:3] for a in acts}) != len(acts):
                errors.append(f"step {step} rank {r}: {len(acts)} actions, expected {per_rank} distinct")
            end = {a[:3]: a[4] for a in acts}
            for k, mb, c, t0, t1 in acts:
                need = {"W": "B", "B": "F", "BW": "F"}.get(k)
                if need and not (end.get((need, mb, c), float("inf")) <= t0 + 0.002):
                    errors.append(f"step {step} rank {r}: {k} {mb}:{c} before its {need} ended")
                if step > 1:
                    cost.setdefault((k, c), []).append(t1 - t0)
            if step > 1:
                idle[r].append(1 - sum(a[4] - a[3] for a in acts) / (hi - lo))
    if errors:
        print("; ".join(errors[:5]))
        sys.exit(1)
    triples = []
    for c in range(pp * v):  # each chunk's own costs, in ms
        f = statistics.mean(cost[("F", c)]) * 1e-3
        if kinds == "FBW":
            b, w = statistics.mean(cost[("B", c)]) * 1e-3, statistics.mean(cost[("W", c)]) * 1e-3
        else:  # a whole backward: the simulator charges B + W
            b = w = statistics.mean(cost[("BW", c)]) * 1e-3 / 2
        triples.append(f"{f:.4f},{b:.4f},{w:.4f}")
    cmd = [binary, "plan", "--schedule", schedule, "--pp", str(pp), "--microbatches", str(m),
           "--costs", "/".join(triples)]
    if schedule == "interleaved":
        cmd += ["--virtual-stages", str(v)]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    predicted = {int(r): float(x) / 100 for r, x in re.findall(r"rank (\d+): busy \S+ +bubble +([\d.]+)%", out)}
    if sorted(predicted) != list(range(pp)):
        print(f"no per-rank bubble from {' '.join(cmd)}: {out[:200]}")
        sys.exit(1)
    rows, over = [], False
    for r in range(pp):
        got = statistics.median(idle[r])
        spread = max(idle[r]) - min(idle[r])  # the steps' own noise: preemption, not the schedule
        off = abs(got - predicted[r])
        over = over or off > bound + spread
        rows.append(f"rank {r} idle {100 * got:.1f}% vs {100 * predicted[r]:.1f}% "
                    f"({100 * off:.1f} points off, bound {100 * bound:.0f} + spread {100 * spread:.1f})")
    msg = (f"{len(steps)} steps, W after its B, B after its F; chunk costs (ms) {'/'.join(triples)}; "
           + ", ".join(rows))
    if over:
        print("idle off the simulator's: " + msg)
        sys.exit(1)
    print(msg)


if __name__ == "__main__":
    if sys.argv[1] == "--pipeline":
        a = sys.argv[2:]
        pipeline(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), float(a[6]))
        sys.exit(0)
    if sys.argv[1] == "--timeline":
        timeline(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "--device-wait":
        device_wait(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], float(sys.argv[6]))
    else:
        main()
