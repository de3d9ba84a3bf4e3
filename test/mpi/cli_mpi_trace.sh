#!/usr/bin/env bash
# The merged timeline (core/README.md, Logging): log.trace at 4 ranks (pp 2 x dp 2) writes every
# rank's file and, from rank 0, one merged trace (test/tools/check_trace.py): a named process per rank
# with its threads and step spans, on one clock. COOKTRAIN_TRACE_SKEW_S=10 sets rank r's trace
# clock 10·r seconds off, as hosts' clocks disagree; aligned on the barrier at start, every step
# still begins within 0.5 s on every rank (it begins when a world allreduce ends: milliseconds
# apart even on 2 oversubscribed cores, while an unaligned merge is off by 10 s or more).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup

if expect_exit 0 "train at 4 ranks with log.trace and clocks 10 s apart" -- env COOKTRAIN_TRACE_SKEW_S=10 \
    "${MPIRUN[@]}" -np 4 -x COOKTRAIN_TRACE_SKEW_S "$BIN" "${base[@]}" --set parallel.pp=2 \
    --set log.trace="$tmp/trace.json"; then
    n=$(ls "$tmp"/trace.rank*.json 2>/dev/null | wc -l)
    if [ "$n" = 4 ]; then ok "every rank wrote its own file"; else fail "every rank wrote its own file ($n)"; fi
    if out=$(python3 test/tools/check_trace.py "$tmp/trace.json" 4 4 0.5); then
        ok "the merged trace: $out"
    else
        fail "the merged trace: $out"
    fi
fi
