#!/usr/bin/env bash
# Local checkpoints (parallel/README.md, Local checkpoints): test-tiny at pp 2 x dp 2 on 4 ranks,
# checkpoint.local_interval 1 into checkpoint.local_dir, no persistent saves before the end. A
# local save is written in the background and published at a later step boundary, so a job that
# dies in step 8 has local step 6 complete and step 7 in flight:
#   - a job whose rank 1 skips a world collective during step 8 ends by the watchdog (exit 1);
#     rank 1's local folder is wiped (its storage lost); the restart gathers local step 6 into
#     checkpoint.dir, rank 1's file from its partner's copy, and ends on the bytes of an
#     uninterrupted run: nothing mixed, one completed step (7) lost;
#   - the same crash, then local step 6's rank-0 file corrupted in both copies (its own and its
#     partner's): the restart takes the step before (two are kept), bytes again equal;
#   - every rank SIGKILLed during step 7's local save: before its own file is written, with the
#     transfers to the partners posted, and halfway through writing a partner's copy: the restart
#     takes step 6, bytes equal (a kill during a save loses nothing more);
#   - pp 2 x dp 4 on 8 ranks killed in a local save, restarted on 4 (parallel.auto_layout): the
#     old ranks' folders are read by the new ranks, the step resumed resharded, the run equal to
#     world size 1 within compare_runs.py's tolerances;
#   - checkpoint.local_interval without checkpoint.dir is refused (exit 2, hint).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup
pp=(--set parallel.pp=2 --set train.steps=8)

expect_exit 0 "reference: 8 steps uninterrupted" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" "${pp[@]}" \
    --dump-params "$tmp/ref.bin"

# crashed NAME: a job with local checkpoints every step whose rank 1 skips its 30th world
# collective (during step 8), ended by the watchdog; its local folders under $tmp/NAME/local.
crashed() {
    local d=$tmp/$1
    mkdir -p "$d"
    expect_exit 1 "$1: the job dies in step 8" -- env COOKTRAIN_FAULT_COMM=1:world:30:skip \
        OMPI_MCA_odls_base_sigkill_timeout=5 "${MPIRUN[@]}" -np 4 -x COOKTRAIN_FAULT_COMM "$BIN" \
        "${base[@]}" "${pp[@]}" --set checkpoint.dir="$d/ck" --set checkpoint.local_interval=1 \
        --set checkpoint.local_dir="$d/local/%h" --set parallel.timeout_s=3 \
        --set log.run_dir="$d/run"
}
# restarted NAME STEP: the same job again, without the fault, resumes from local step STEP and
# ends on the reference's bytes; its metrics' setup line says so.
restarted() {
    local d=$tmp/$1
    if expect_exit 0 "$1: restart" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" "${pp[@]}" \
        --set checkpoint.dir="$d/ck" --set checkpoint.local_interval=1 \
        --set checkpoint.local_dir="$d/local/%h" --dump-params "$d/final.bin" \
        --set log.run_dir="$d/run"; then
        if grep '"setup"' "$d/run/metrics.jsonl" | tail -1 | grep -q "\"local_restore_step\": $2,"; then
            ok "$1: the metrics' setup line names local step $2"
        else
            fail "$1: the metrics' setup line lacks local_restore_step $2"
        fi
        expect_text "checkpoint: local step $2 is newer than" "$1: the restart gathers local step $2"
        expect_text "resumed from $d/ck/step-0000000$2 at step $2" "$1: and resumes from it"
        if cmp -s "$tmp/ref.bin" "$d/final.bin"; then
            ok "$1: the final parameters are the uninterrupted run's bytes"
        else
            fail "$1: the final parameters differ from the uninterrupted run's"
        fi
        # finished with a persistent checkpoint: the node memory is given back
        left=$(find "$d/local" -name 'rank-*' -type d 2>/dev/null | wc -l)
        if [ "$left" = 0 ]; then ok "$1: the finished run removed its local folders"; else fail "$1: $left local folders left"; fi
    fi
}

if selected "lost storage"; then
    crashed lost
    job=$(ls "$tmp/lost/local/0")
    rm -rf "$tmp/lost/local/0/$job/rank-00001" # rank 1's node-local storage is gone
    restarted lost 6
    expect_text "(1 from partners' copies" "lost: rank 1's file came from its partner"
    expect_text "the run before had logged step 7, so 1 step is run again (from step 7)" \
        "lost: the log says what was lost"
    # the report shows the restart: from where, and the step lost (7 ran, then ran again)
    if expect_exit 0 "lost: report of the crashed and restarted run" -- \
        "$BIN" report "$tmp/lost/run" -o "$tmp/lost/report.html"; then
        OUT_TEXT=$(cat "$tmp/lost/report.html")
        expect_text "resumed at 7 (a local checkpoint, 1 rank file from partners' copies; 1 step lost)" \
            "lost: the report's table says how the run was restarted"
        expect_text "resumed at step 7 (local checkpoint)</text>" "lost: its charts mark the restart"
        if out=$(python3 test/tools/check_report.py "$tmp/lost/report.html" "$tmp/lost/run/metrics.jsonl" 2>&1); then
            ok "lost: the report checks against its metrics (check_report.py)"
        else
            fail "lost: check_report.py: $out"
        fi
    fi
fi

if selected "torn copy"; then
    crashed torn
    job=$(ls "$tmp/torn/local/0")
    # rank 0's partner on one host is rank 1: corrupt step 6's rank-0 file in both folders
    for holder in 00000 00001; do
        f=$tmp/torn/local/0/$job/rank-$holder/step-00000006/rank-00000.bin
        printf '\xff\xff\xff\xff' | dd of="$f" bs=1 seek=1000 conv=notrunc status=none
    done
    restarted torn 5
fi

# killed POINT: every rank SIGKILLed at checkpoint crash point POINT of local step 7.
for point in local-mid-save local-in-transfer local-mid-replica; do
    selected "killed at $point" || continue
    d=$tmp/$point
    mkdir -p "$d"
    expect_exit 137 "$point: every rank killed in step 7's local save" -- \
        env COOKTRAIN_CKPT_CRASH="$point@7" "${MPIRUN[@]}" -np 4 -x COOKTRAIN_CKPT_CRASH "$BIN" \
        "${base[@]}" "${pp[@]}" --set checkpoint.dir="$d/ck" --set checkpoint.local_interval=1 \
        --set checkpoint.local_dir="$d/local/%h" --set log.run_dir="$d/run"
    restarted "$point" 6
done

# fewer ranks: pp 2 x dp 4 on 8 ranks, every rank killed in step 7's local save; the restart has
# 4 ranks and parallel.auto_layout (the planner's choice for 4 ranks): its ranks read the 8 folders between them (the
# files of ranks 4-7 are in those ranks' folders, which no rank of the new run is named after),
# gather local step 6 and resume it resharded; the run matches world size 1.
if selected "fewer ranks"; then
    d=$tmp/fewer
    mkdir -p "$d"
    few=("${base[@]}" "${pp[@]}" --set checkpoint.dir="$d/ck" --set checkpoint.local_interval=1
         --set checkpoint.local_dir="$d/local/%h" --set parallel.auto_layout=true
         --set parallel.dp=4 --set log.metrics="$d/run.jsonl")
    expect_exit 0 "fewer ranks: reference (world size 1, 8 steps)" -- "$BIN" "${base[@]}" \
        --set train.steps=8 --set log.metrics="$d/ref.jsonl" --dump-params "$d/ref.bin" \
        --dump-init-params "$d/init.bin"
    expect_exit 137 "fewer ranks: 8 ranks killed in step 7's local save" -- \
        env COOKTRAIN_CKPT_CRASH="local-mid-save@7" "${MPIRUN[@]}" -np 8 -x COOKTRAIN_CKPT_CRASH "$BIN" \
        "${few[@]}"
    if expect_exit 0 "fewer ranks: the restart on 4 ranks" -- "${MPIRUN[@]}" -np 4 "$BIN" "${few[@]}" \
        --dump-params "$d/run.bin"; then
        expect_layout_chosen "tp 1 x pp 2 x dp 4" 4 "fewer ranks: parallel.auto_layout"
        expect_text "checkpoint: local step 6 is newer than" "fewer ranks: local step 6 gathered"
        if out=$(python3 test/tools/compare_runs.py "$d/ref.jsonl" "$d/ref.bin" "$d/run.jsonl" \
            "$d/run.bin" --init "$d/init.bin"); then
            ok "fewer ranks: the run, 8 ranks then 4, matches world size 1; $out"
        else
            fail "fewer ranks: $out"
        fi
        left=$(find "$d/local" -name 'rank-*' -type d 2>/dev/null | wc -l)
        if [ "$left" = 0 ]; then ok "fewer ranks: the finished run removed all 8 folders"; else fail "fewer ranks: $left local folders left"; fi
    fi
fi

expect_exit 2 "local checkpoints without checkpoint.dir" -- "$BIN" "${base[@]}" \
    --set checkpoint.local_interval=1
expect_text "checkpoint.local_interval=1 but checkpoint.dir is not set" "the refusal names the key"
expect_text "hint:" "the refusal has a hint"
