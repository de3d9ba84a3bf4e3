#!/usr/bin/env python3
"""Overlap of data-parallel reductions with backward, from the traces of a dp run (log.trace):

  check_overlap.py [--every-microbatch] TRACE.rank0.json TRACE.rank1.json ...

In the last microbatch, some unit's reduction must be seen complete (polled between ops) before
the backward pass has ended. Reductions that only start, or are only seen complete, after
backward fail this. Asked of any rank: a reduction needs every rank, so the one that runs ahead
may see its reductions complete only once the others catch up — but then the one behind sees
each of its reductions complete right after starting it, while its backward runs. Prints the
counts per rank; exits 1 when no rank shows one.

--every-microbatch asks the same of every microbatch instead of the last (ZeRO-2 and -3 reduce
after each microbatch's backward): more chances for one rank to be behind the other, for runs
whose ranks may keep in step (the emulated GPUs, where which rank is behind is up to the OS).

  check_overlap.py --ring TRACE.rank0.json ...

Ring attention (context parallelism; core/model/ring_attention.h records the spans): every kv
hop must be in flight across the block computed while it travels (started before the block
starts, seen complete only after it ends: "fwd 2 kv hop 1" across "fwd 2 block 1"), and every
dK/dV partial sent after backward block s across block s + 1. Exits 1 on any hop that is not, or
when there are no hops."""
import json
import re
import sys


def ring(paths):
    bad, n = [], 0
    for path in paths:
        spans = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
        blocks = {e["name"]: e for e in spans if " block " in e["name"]}
        for e in spans:
            m = re.match(r"(fwd|bwd) (\d+) (kv|dkv) hop (\d+)$", e["name"])
            if not m:
                continue
            step = int(m.group(4)) + (1 if m.group(3) == "dkv" else 0)
            b = blocks.get("%s %s block %d" % (m.group(1), m.group(2), step))
            if b is None:  # the partial returning to its owner after the last block
                continue
            n += 1
            if not (e["ts"] <= b["ts"] and e["ts"] + e["dur"] >= b["ts"] + b["dur"]):
                bad.append("%s: %s not in flight across %s" % (path, e["name"], b["name"]))
    print("ring hops in flight across their blocks: %d of %d" % (n - len(bad), n))
    for line in bad[:5]:
        print("  " + line)
    return 0 if n and not bad else 1


if "--ring" in sys.argv[1:]:
    sys.exit(ring([a for a in sys.argv[1:] if not a.startswith("--")]))

every = "--every-microbatch" in sys.argv[1:]
found, counts = False, []
for path in [a for a in sys.argv[1:] if not a.startswith("--")]:
    ev = json.load(open(path))["traceEvents"]
    spans = [e for e in ev if e.get("ph") == "X"]
    mbs = sorted({e["args"]["microbatch"] for e in spans})
    n_done = n_reduces = 0
    for mb in mbs if every else mbs[-1:]:
        mine = [e for e in spans if e["args"]["microbatch"] == mb]
        bwd = [e["ts"] + e["dur"] for e in mine if e["name"].startswith("backward")]
        if not bwd:
            continue
        reduces = [e for e in mine if e["name"].startswith("reduce")]
        n_done += sum(1 for e in reduces if e["ts"] + e["dur"] < max(bwd))
        n_reduces += len(reduces)
    counts.append("rank %d %d of %d" % (len(counts), n_done, n_reduces))
    found = found or n_done > 0
print("reductions complete before backward ends: " + ", ".join(counts))
sys.exit(0 if found else 1)
