#!/usr/bin/env bash
# The flight recorder and `cooktrain diagnose` (core/README.md, Flight recorder): a 4-rank job
# (tp 2 x dp 2, or dp 4) with a fault planted by COOKTRAIN_FAULT_COMM hangs; the watchdog ends it, every
# rank writes its record (the watchdog's ranks at once, the others on the SIGTERM of the abort),
# and diagnose names the rank, group, op and sequence number:
#   - a skipped collective: rank 2 never calls the world group's allreduce #3;
#   - a mismatched one: rank 1 enters a barrier where its tp group's collective #7 is an allreduce;
#   - a rank that sleeps (30 s) before the world group's collective #3, outside communication.
# Also: SIGUSR2 to the job's mpirun writes every rank's record while the job trains on (and it
# still finishes) and diagnose calls them a running job; a job in a reused run_dir moves the
# earlier job's records aside, and diagnose reads one job's records only (a killed rank has none,
# another job's record left in flight/ is named and ignored); diagnose refuses a directory
# without records and a corrupt record (exit 2, hint).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup
four=(--set parallel.tp=2 --set train.steps=8 --set parallel.timeout_s=3)

# planted NAME FAULT EXPECTED: the job with COOKTRAIN_FAULT_COMM=FAULT ends (exit 1, within
# mpi_setup's bound), every rank wrote a record, and diagnose's diagnosis line is EXPECTED.
planted() {
    local name=$1 fault=$2 want=$3 d=$tmp/$1
    shift 3
    selected "$name" || return 0
    mkdir -p "$d"
    # 5 s between the abort's SIGTERM and SIGKILL, not Open MPI's 1: on a busy machine a rank may
    # need more than a second to write its record (core/README.md, Flight recorder)
    expect_exit 1 "$name: the job ends" -- env COOKTRAIN_FAULT_COMM="$fault" OMPI_MCA_odls_base_sigkill_timeout=5 \
        "${MPIRUN[@]}" -np 4 -x COOKTRAIN_FAULT_COMM "$BIN" "${base[@]}" "${four[@]}" "$@" \
        --set log.run_dir="$d"
    expect_text "planted fault on rank" "$name: the fault was planted"
    local n
    n=$(find "$d/flight" -name 'rank-*.txt' 2>/dev/null | wc -l)
    if [ "$n" = 4 ]; then ok "$name: all 4 ranks wrote a flight record"; else fail "$name: all 4 ranks wrote a flight record (got $n)"; fi
    if expect_exit 0 "$name: diagnose" -- "$BIN" diagnose "$d"; then
        expect_text "written on watchdog" "$name: a rank's watchdog wrote its record"
        local got
        got=$(printf '%s\n' "$OUT_TEXT" | grep '^diagnosis: ')
        if [ "$got" = "$want" ]; then
            ok "$name: $got"
        else
            fail "$name: diagnosis \"$got\", expected \"$want\""
        fi
    fi
}

# dp 4: rank 2 goes on into the next step, whose first collectives (the dp reductions) come a
# forward and most of a backward later, so the skipped one is clearly the first entered. (With
# tp 2 it would meet its tp partner, waiting in the skipped one, within a layer: two operations
# each waiting for the other, a few milliseconds apart, and "first" a matter of clocks.)
planted "skipped" 2:world:3:skip \
    "diagnosis: rank 2 never entered collective #3 (allreduce, i32, 16 bytes) on group world (ranks 0 1 2 3)" \
    --set parallel.tp=1
planted "mismatched" 1:tp:7:mismatch \
    "diagnosis: collective #7 on group tp (ranks 0 1) differs between ranks: rank 0 allreduce (f32, 16384 bytes), rank 1 barrier (u8, 0 bytes)"
planted "sleeping" 3:world:3:sleep:30 \
    "diagnosis: rank 3 never entered collective #3 (allreduce, i32, 16 bytes) on group world (ranks 0 1 2 3)"

# ---- SIGUSR2: a record on demand, the job goes on ------------------------------------------------
# Sent as the README says, to the job's mpirun (which passes it on to every rank): each rank
# writes a record at its own moment, so one may hold a collective another has not reached yet;
# diagnose must call that a running job, not a hang.
if selected "usr2"; then
    d=$tmp/usr2
    mkdir -p "$d"
    : >"$d/out.txt"
    "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" --set train.steps=300 --set log.interval=1 \
        --set log.run_dir="$d" >"$d/out.txt" 2>&1 &
    pid=$!
    waited=0
    while ! grep -q '^step    20/' "$d/out.txt" && [ $waited -lt 1200 ]; do sleep 0.05; waited=$((waited + 1)); done
    kill -USR2 "$(pgrep -P "$pid" -x mpirun)" # $pid is the timeout guard's
    wait "$pid"
    rc=$?
    n=$(find "$d/flight" -name 'rank-*.txt' 2>/dev/null | wc -l)
    if [ "$rc" = 0 ] && [ "$n" = 2 ] && grep -q '^step   300/300' "$d/out.txt"; then
        ok "usr2: both ranks wrote a record and the job finished"
    else
        fail "usr2: both ranks wrote a record and the job finished (exit $rc, $n records)"
        tail -3 "$d/out.txt" | sed 's/^/    /'
    fi
    if expect_exit 0 "usr2: diagnose of a healthy job" -- "$BIN" diagnose "$d"; then
        expect_text "written on SIGUSR2" "usr2: the records say why they were written"
        expect_text "diagnosis: not hung" "usr2: diagnose calls the snapshots a running job"
        expect_text "the records were written" "usr2: diagnose says the records are not simultaneous"
    fi
fi

# ---- a reused run_dir: an earlier job's records are moved aside, never mixed in -----------------
# The usr2 job's records are in $tmp/usr2; a job there whose rank 1 is killed (SIGKILL: no record)
# must be diagnosed from its own records: rank 1 has none.
if selected "usr2" && selected "reused"; then
    d=$tmp/usr2
    "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" --set train.steps=3000 --set log.interval=1 \
        --set log.run_dir="$d" >"$d/out2.txt" 2>&1 &
    pid=$!
    waited=0
    while ! grep -q '^step    20/' "$d/out2.txt" && [ $waited -lt 1200 ]; do sleep 0.05; waited=$((waited + 1)); done
    for p in $(pgrep -f -- "train.steps=3000"); do
        grep -qz '^OMPI_COMM_WORLD_RANK=1$' "/proc/$p/environ" 2>/dev/null && kill -9 "$p"
    done
    wait "$pid"
    early=$(find "$d/flight/earlier" -name 'rank-*.txt' 2>/dev/null | wc -l)
    if [ "$early" = 2 ]; then ok "reused: the earlier job's 2 records moved to flight/earlier/"; else fail "reused: the earlier job's 2 records moved to flight/earlier/ (found $early)"; fi
    if expect_exit 0 "reused: diagnose" -- "$BIN" diagnose "$d"; then
        expect_text "flight records: 1 of 2 ranks" "reused: one record of this job, not two"
        expect_text "rank 1: no record" "reused: rank 1 has no record"
        expect_text "diagnosis: rank 1 wrote no flight record" "reused: the diagnosis names the killed rank"
    fi
    # a record of another job left in flight/ (as an older cooktrain left them) is named, not used
    cp "$(find "$d/flight/earlier" -name 'rank-00001.txt' | head -1)" "$d/flight/rank-00001.txt"
    if expect_exit 0 "reused: diagnose with another job's record in flight/" -- "$BIN" diagnose "$d"; then
        expect_text "flight records: 1 of 2 ranks" "reused: another job's record is not counted"
        expect_text "ignored rank-00001.txt: another job's record" "reused: it is named as ignored"
    fi
fi

# ---- bad input ------------------------------------------------------------------------------------
if selected "bad"; then
    mkdir -p "$tmp/empty"
    expect_exit 2 "diagnose of a directory without records" -- "$BIN" diagnose "$tmp/empty"
    expect_text "no flight records" "the refusal says there are none"
    expect_text "hint:" "with a hint"
    mkdir -p "$tmp/corrupt/flight"
    printf 'cooktrain flight record 1\nrank 0 world 2 pid 1 host h reason x time 1 capacity 4 recorded 1\nop 7 allreduce\n' \
        >"$tmp/corrupt/flight/rank-00000.txt"
    expect_exit 2 "diagnose of a corrupt record" -- "$BIN" diagnose "$tmp/corrupt"
    expect_text "rank-00000.txt:3: not a cooktrain flight record (op line)" "the refusal names the file and line"
fi

# ---- stragglers -----------------------------------------------------------------------------------
# A rank that stays slow (COOKTRAIN_FAULT_COMM=2:world:1:slow:0.05: 50 ms of sleep before each of
# its world collectives, two or more a step, against about 40 ms of compute) is named from the
# third progress line on (log.straggler_intervals 3), in the progress line and the metrics
# (straggler_rank, every rank's rank_compute_s and rank_wait_s), and the report draws each rank's
# compute; the same run without the fault names nobody (a false straggler needs a rank 20% above
# the median three progress lines in a row).
if selected "straggler"; then
    d=$tmp/straggler
    mkdir -p "$d"
    strag=(--set train.steps=10 --set log.interval=2)
    if expect_exit 0 "straggler: a slow rank 2" -- env COOKTRAIN_FAULT_COMM=2:world:1:slow:0.05 \
        "${MPIRUN[@]}" -np 4 -x COOKTRAIN_FAULT_COMM "$BIN" "${base[@]}" "${strag[@]}" \
        --set log.metrics="$d/slow.jsonl"; then
        expect_text "straggler: rank 2 (host 0) ran" "straggler: the progress line names rank 2"
        if out=$(python3 - "$d/slow.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"rank_compute_s"' in l]
named = [l["straggler_rank"] for l in lines]
if len(lines) != 6 or any(len(l["rank_compute_s"]) != 4 or len(l["rank_wait_s"]) != 4 for l in lines):
    sys.exit(f"{len(lines)} progress lines with every rank's times, expected 6 of 4 ranks")
if named[:2] != [-1, -1] or named[2:] != [2] * 4:
    sys.exit(f"straggler_rank {named}, expected nobody twice, then rank 2")
if any(max(range(4), key=lambda r: l["rank_compute_s"][r]) != 2 for l in lines[2:]):
    sys.exit("rank 2 is not the slowest where it is named")
print(f"straggler_rank {named}, ratio {lines[-1]['straggler_ratio']}")
PY
        ); then ok "straggler: the metrics name rank 2 from the third progress line ($out)"; else fail "straggler: $out"; fi
        if expect_exit 0 "straggler: report" -- "$BIN" report "$d/slow.jsonl" -o "$d/slow.html"; then
            if out=$(python3 test/tools/check_report.py "$d/slow.html" "$d/slow.jsonl"); then
                ok "straggler: the report draws each rank's compute ($out)"
            else
                fail "straggler: the report: $out"
            fi
        fi
    fi
    if expect_exit 0 "straggler: no fault" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" "${strag[@]}" \
        --set log.metrics="$d/even.jsonl"; then
        if printf '%s\n' "$OUT_TEXT" | grep -q "straggler:"; then
            fail "straggler: a run without the fault names one: $(printf '%s\n' "$OUT_TEXT" | grep -m1 'straggler:')"
        else
            ok "straggler: a run without the fault names nobody"
        fi
    fi
fi
