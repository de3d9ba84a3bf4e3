#!/usr/bin/env bash
# The merged timeline (core/README.md, Logging): log.trace at 4 ranks (pp 2 x dp 2) writes every
# rank's file and, from rank 0, one merged trace (test/tools/check_trace.py): a named process per rank
# with its threads and step spans, on one clock. COOKTRAIN_TRACE_SKEW_S=10 sets rank r's trace
# clock 10·r seconds off, as hosts' clocks disagree; aligned on the barrier at start, every step
# still begins within 0.5 s on every rank (it begins when a world allreduce ends: milliseconds
# apart even on 2 oversubscribed cores, while an unaligned merge is off by 10 s or more).
# cores: 2 (the idle check below times two ranks: run_tests.sh runs it alone)
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

# The pipeline's actions in the trace (thread "pipeline actions": F, B, W or BW with microbatch and
# chunk): every weight part after its input part, every backward after its forward, and each
# rank's idle time in a step within 10 points of the simulator's bubble for that rank, given each
# chunk's measured costs (test/tools/check_trace.py --pipeline), plus the spread of that rank's
# idle over the steps compared. The bound: the executor's messages and copies between actions
# cost about 2 points here (actions of 0.3-1.3 ms), and a step's idle varies by several points
# on a 2-core machine (the median of steps 2-6 is compared); a machine busy with something else
# preempts ranks between actions, which no simulator sees but the spread shows. A different
# order of actions, or spans that are not the actions', moves it further (1F1B's last rank idles
# about 20 points more than ZB-H1's at this size).
for sv in "zbh1 1" "zbv 2" "1f1b 1"; do
    set -- $sv
    selected "pipeline actions $1" || continue
    if expect_exit 0 "train pp=2 $1 with log.trace" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" \
        --set parallel.pp=2 --set parallel.schedule="$1" --set parallel.virtual_stages="$2" \
        --set train.steps=6 --set log.trace="$tmp/pp-$1.json"; then
        if out=$(python3 test/tools/check_trace.py --pipeline "$tmp/pp-$1.json" "$BIN" "$1" 2 "$2" 8 0.10); then
            ok "pipeline actions $1: $out"
        else
            fail "pipeline actions $1: $out"
        fi
    fi
done
