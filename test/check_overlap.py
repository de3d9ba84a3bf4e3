#!/usr/bin/env python3
"""Overlap of data-parallel reductions with backward, from the traces of a dp run (log.trace):

  check_overlap.py TRACE.rank0.json TRACE.rank1.json ...

In the last microbatch, some unit's reduction must be seen complete (polled between ops) before
the backward pass has ended. Reductions that only start, or are only seen complete, after
backward fail this. Asked of any rank: a reduction needs every rank, so the one that runs ahead
may see its reductions complete only once the others catch up — but then the one behind sees
each of its reductions complete right after starting it, while its backward runs. Prints the
counts per rank; exits 1 when no rank shows one."""
import json
import sys

found, counts = False, []
for path in sys.argv[1:]:
    ev = json.load(open(path))["traceEvents"]
    spans = [e for e in ev if e.get("ph") == "X"]
    last_mb = max(e["args"]["microbatch"] for e in spans)
    spans = [e for e in spans if e["args"]["microbatch"] == last_mb]
    bwd_end = max(e["ts"] + e["dur"] for e in spans if e["name"].startswith("backward"))
    reduces = [e for e in spans if e["name"].startswith("reduce")]
    done = [e for e in reduces if e["ts"] + e["dur"] < bwd_end]
    counts.append("rank %d %d of %d" % (len(counts), len(done), len(reduces)))
    found = found or bool(done)
print("reductions complete before backward ends: " + ", ".join(counts))
sys.exit(0 if found else 1)
