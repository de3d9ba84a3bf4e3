#!/usr/bin/env bash
# Pipeline parallelism and full 3D layouts (parallel/README.md, Pipeline parallel; test/README.md)
# under mpirun:
#   - every schedule's gradients against one process running the same microbatches (bit for bit
#     where the order of the microbatch sums is the same, within the rounding of that sum
#     otherwise; a reversed-backward schedule at pp 2 x dp 2), and activations freed as the
#     simulator predicts (test/mpi/mpi_test_pp.c at 2 and 4 ranks);
#   - equivalence against world size 1 on configs/test-tiny.yaml for every tp x pp x dp
#     factorisation of 2, 4 and 8 ranks with pp > 1 (the ones with pp = 1 are in
#     cli_mpi_dp.sh and cli_mpi_tp.sh), covering every schedule, ZeRO stage, recompute and
#     sequence-parallel setting at 4 and at 8 ranks (pairwise, not the full cross product);
#     memory and dp/tp traffic against their formulas;
#   - invalid layouts: exit 2 on every rank, one message, no hang.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup

# `cooktrain plan`: the simulator from the command line.
if expect_exit 0 "plan 1f1b pp=4 m=8" -- "$BIN" plan --schedule 1f1b --pp 4 --microbatches 8; then
    expect_text "rank 3 |" "plan prints one timeline row per rank"
    expect_text "theory bubble 27.27%" "plan states the theoretical bubble (3/11)"
    expect_text "bubble  27.27%" "plan's simulated bubble equals it"
    expect_text "deadlock: no" "plan reports no deadlock"
fi
expect_exit 0 "plan from a config" -- "$BIN" plan --config configs/test-tiny.yaml --set parallel.pp=2 \
    --set parallel.schedule=interleaved --set parallel.virtual_stages=2
expect_text "interleaved pipeline: pp=2 v=2 m=8" "plan takes pp, v and m from the config"
# The zero-bubble schedules: simulated with F, B and W apart (a third of 1F1B's idle for ZB-H1,
# the V's skew for ZB-V at p = 4, m = 8).
if expect_exit 0 "plan zbh1 pp=4 m=8" -- "$BIN" plan --schedule zbh1 --pp 4 --microbatches 8 --costs 1,1,1; then
    expect_text "bubble  11.11%" "zbh1: a third of 1F1B's idle (3 of 27)"
    expect_text "rank 3 |......F0B0F1B1F2B2F3B3W0F4B4W1" "zbh1: rank 3 holds its weight parts back"
fi
if expect_exit 0 "plan zbv pp=4 m=8" -- "$BIN" plan --schedule zbv --pp 4 --microbatches 8; then
    expect_text "zbv pipeline: pp=4 v=2 m=8" "zbv runs two chunks a rank"
    expect_text "rank 0 |F0:0F1:0F2:0F3:0F4:0F5:0F6:0F0:7B0:7W0:7" "zbv: rank 0 holds both ends of the V"
    expect_text "bubble   5.88%" "zbv: only the V's skew idles (1.5 of 25.5)"
fi
expect_exit 2 "plan with malformed costs" -- "$BIN" plan --schedule zbh1 --pp 2 --microbatches 2 --costs 1,2
# Each chunk's own costs: a slower last stage (the LM head) leaves the first one idle.
if expect_exit 0 "plan zbh1 with per-chunk costs" -- "$BIN" plan --schedule zbh1 --pp 2 --microbatches 4 \
    --costs 1,1,0.5/2,2,1; then
    # (1 + 1 + 0.5) x 4 = 10 and (2 + 2 + 1) x 4 = 20 of 21 (rank 1 starts after one forward of
    # rank 0); printed in units of the mean stage forward, 1.5
    expect_text "rank 0: busy 6.667  bubble  52.38%" "per-chunk costs: rank 0 waits for the slower stage"
    expect_text "rank 1: busy 13.333  bubble   4.76%" "per-chunk costs: the slower stage is busy"
fi
expect_exit 2 "plan with costs for 3 of 2 chunks" -- "$BIN" plan --schedule zbh1 --pp 2 --microbatches 2 \
    --costs 1,1,1/1,1,1/1,1,1
expect_text "hint:" "malformed costs have a hint"
expect_exit 2 "zbv with one chunk a rank" -- "$BIN" train --config configs/test-tiny.yaml --set parallel.pp=2 \
    --set parallel.schedule=zbv
expect_text "parallel.virtual_stages: 2" "the refusal says how many chunks zbv runs"
expect_exit 2 "plan with an unknown schedule" -- "$BIN" plan --schedule zigzag --pp 2 --microbatches 2
expect_text "hint:" "unknown schedule has a hint"
expect_exit 2 "plan interleaved with m not a multiple of pp" -- "$BIN" plan --schedule interleaved --pp 4 --microbatches 6 --virtual-stages 2

for np in 2 4; do run_mpi_program "$np" "$BUILD/test/mpi_test_pp"; done

equivalence_setup

if reference_run "$tmp"; then
    # tp pp dp schedule v zero sp recompute micro_batch extra
    while read -r tp pp dp sched v zero sp rc micro extra; do
        name="tp=$tp pp=$pp dp=$dp $sched v=$v zero=$zero sp=$sp recompute=$rc micro_batch=$micro $extra"
        selected "$name" || continue
        # shellcheck disable=SC2086
        if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np $((tp * pp * dp)) "$BIN" "${base[@]}" \
            --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.schedule="$sched" \
            --set parallel.virtual_stages="$v" --set parallel.zero_stage="$zero" \
            --set parallel.sequence_parallel="$sp" --set train.recompute="$rc" \
            --set train.micro_batch="$micro" $extra \
            --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin"; then
            expect_text "all bit-identical" "$name: every replica holds the same bytes"
            check_against_reference "$name" "$tmp"
        fi
    done <<'RUNS'
1 2 1 1f1b 1 0 false none 2
1 4 1 gpipe 1 1 false full 2
2 2 1 interleaved 2 0 true none 2
1 2 2 1f1b 1 2 false none 2
1 2 2 interleaved 2 3 false full 2
1 8 1 1f1b 1 0 false none 2
2 4 1 gpipe 1 1 true none 2
4 2 1 1f1b 1 2 false full 2
1 4 2 interleaved 2 0 false none 2
2 2 2 1f1b 1 3 true full 2
1 2 4 gpipe 1 2 false none 2
1 2 2 interleaved 2 3 false full 2 --set parallel.bucket_mb=0.3
1 2 1 zbh1 1 0 false none 2
1 4 1 zbh1 1 1 false full 2
2 2 1 zbh1 1 0 true none 2
1 2 2 zbh1 1 2 false none 2 --set parallel.bucket_mb=0.3
1 2 1 zbv 2 0 false none 2
1 4 1 zbv 2 1 false full 2
2 2 1 zbv 2 0 true none 2
1 2 2 zbv 2 3 false full 2
RUNS
fi

# ZB-H1 against 1F1B on the same layout: the weight parts run later, in the same microbatch
# order, so every sum is 1F1B's: the same bytes, not merely close.
if selected "zbh1 bit for bit"; then
    for s in 1f1b zbh1; do
        expect_exit 0 "train pp=4 $s" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" --set parallel.pp=4 \
            --set parallel.schedule="$s" --set train.micro_batch=2 --set log.metrics="$tmp/$s.jsonl" \
            --dump-params "$tmp/$s.bin"
    done
    if cmp -s "$tmp/1f1b.bin" "$tmp/zbh1.bin"; then
        ok "zbh1 bit for bit: the final parameters are 1F1B's bytes"
    else
        fail "zbh1 bit for bit: the final parameters differ from 1F1B's"
    fi
    # Under ZeRO 2 each microbatch's gradients are reduced on their own, from a slot held from
    # the input part to the weight part while other microbatches' input parts run between.
    for s in 1f1b zbh1; do
        expect_exit 0 "train pp=2 dp=2 zero=2 $s" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" \
            --set parallel.pp=2 --set parallel.zero_stage=2 --set parallel.schedule="$s" \
            --set train.micro_batch=2 --dump-params "$tmp/$s-z2.bin"
    done
    if cmp -s "$tmp/1f1b-z2.bin" "$tmp/zbh1-z2.bin"; then
        ok "zbh1 bit for bit: at dp=2 ZeRO 2 too, 1F1B's bytes"
    else
        fail "zbh1 bit for bit: at dp=2 ZeRO 2 the final parameters differ from 1F1B's"
    fi
    # A checkpoint saved under 1F1B resumes under ZB-H1 and ends on the same bytes again.
    if expect_exit 0 "zbh1 bit for bit: 1f1b to step 3" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" \
        --set parallel.pp=4 --set train.micro_batch=2 --set checkpoint.dir="$tmp/ck" \
        --set checkpoint.interval=3 --set train.stop_after=3 &&
        expect_exit 0 "zbh1 bit for bit: resumed under zbh1" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" \
            --set parallel.pp=4 --set parallel.schedule=zbh1 --set train.micro_batch=2 \
            --set checkpoint.dir="$tmp/ck" --dump-params "$tmp/resumed.bin"; then
        expect_text "resum" "zbh1 bit for bit: the second run resumed"
        if cmp -s "$tmp/1f1b.bin" "$tmp/resumed.bin"; then
            ok "zbh1 bit for bit: resumed from a 1f1b checkpoint, 1F1B's bytes"
        else
            fail "zbh1 bit for bit: resumed from a 1f1b checkpoint, the parameters differ"
        fi
    fi
fi

# --profile measures each chunk's forward, input part and weight part and feeds them to the
# simulator: one triple per chunk (zbv: 4 at pp 2), which plan takes back as --costs.
if selected "profile chunk costs" && expect_exit 0 "train pp=2 zbv --profile" -- "${MPIRUN[@]}" -np 2 \
    "$BIN" "${base[@]}" --set parallel.pp=2 --set parallel.schedule=zbv --set parallel.virtual_stages=2 \
    --set train.steps=2 --profile; then
    if printf '%s\n' "$OUT_TEXT" | grep -qE "simulated with them: idle per rank [0-9.]+% [0-9.]+% of"; then
        ok "profile chunk costs: the simulator's idle per rank"
    else
        fail "profile chunk costs: no simulated idle per rank"
    fi
    costs=$(printf '%s\n' "$OUT_TEXT" | sed -n 's/^pipeline by chunk .*`): \([0-9.,/]*\)$/\1/p' | tail -1)
    if [[ $costs =~ ^([0-9]+\.[0-9]+,[0-9]+\.[0-9]+,[0-9]+\.[0-9]+/){3}[0-9]+\.[0-9]+,[0-9]+\.[0-9]+,[0-9]+\.[0-9]+$ ]]; then
        ok "profile chunk costs: four chunks' F,B,W ($costs)"
        expect_exit 0 "profile chunk costs: plan takes them back" -- "$BIN" plan --schedule zbv --pp 2 \
            --microbatches 8 --costs "$costs"
    else
        fail "profile chunk costs: no line of four F,B,W triples ('$costs')"
    fi
fi

# scripts/bench_pp.sh runs (its figures are scripts/README.md's; here only that every schedule's
# row has them) and refuses what it cannot run.
if selected "bench_pp"; then
    if expect_exit 0 "bench_pp.sh, one short run a schedule" -- bash scripts/bench_pp.sh --pps 2 --ms 2 \
        --schedules "1f1b zbh1 zbv" --steps 2 --data "$TEST_DATA"; then
        rows=$(printf '%s\n' "$OUT_TEXT" | grep -cE '^ +2 +2 (1f1b|zbh1|zbv) +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$')
        if [ "$rows" = 3 ]; then ok "bench_pp.sh: a full row for each schedule"; else fail "bench_pp.sh: $rows full rows of 3"; fi
    fi
    expect_exit 2 "bench_pp.sh with an unknown schedule" -- bash scripts/bench_pp.sh --schedules zigzag
    expect_text "hint:" "bench_pp.sh's refusal has a hint"
fi

# Bad layouts: exit 2 everywhere, one message from rank 0.
expect_exit 2 "layers not splittable over pp" -- "${MPIRUN[@]}" -np 3 "$BIN" "${base[@]}" --set parallel.pp=3
expect_text "n_layer" "the split message names model.n_layer"
expect_text "hint:" "the split message has a hint"
n=$(printf '%s\n' "$OUT_TEXT" | grep -c '^cooktrain:')
if [ "$n" = 1 ]; then ok "bad split printed once (rank 0)"; else fail "bad split printed $n times"; fi
expect_exit 2 "interleaved with microbatches not a multiple of pp" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" \
    --set parallel.pp=4 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 --set train.micro_batch=8
expect_text "interleaved" "the message names the interleaved schedule"
expect_exit 2 "pp x tp x dp differs from the world size" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" \
    --set parallel.pp=2 --set parallel.dp=3
expect_text "hint:" "the grid message has a hint"
if expect_exit 0 "an explicit uneven split (pp_layers)" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" \
    --set parallel.pp=2 --set parallel.pp_layers=5,11 --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin"; then
    check_against_reference "uneven split (5,11)" "$tmp"
fi

# `plan` predicts what a run measures: rank 0's memory by category and its dp/tp bytes per step.
layout=(--set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero_stage=3
        --set parallel.sequence_parallel=true --set train.recompute=full --set train.micro_batch=2)
if expect_exit 0 "plan --json for tp2 pp2 dp2 ZeRO-3 SP recompute" -- "$BIN" plan --config configs/test-tiny.yaml "${layout[@]}" --json; then
    printf '%s\n' "$OUT_TEXT" | head -1 >"$tmp/plan.json"
    if expect_exit 0 "the same layout trained" -- "${MPIRUN[@]}" -np 8 "$BIN" "${base[@]}" "${layout[@]}" \
        --set train.steps=1 --set train.warmup_steps=1 --set log.metrics="$tmp/planned.jsonl"; then
        if python3 - "$tmp/plan.json" "$tmp/planned.jsonl" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2])]
setup = [r for r in rows if r.get("setup")][0]
step = [r for r in rows if "loss" in r][0]
ok = (plan["params_bytes"] == setup["mem_params"] and plan["grads_bytes"] == setup["mem_grads"]
      and plan["optim_bytes"] == setup["mem_optim"] and plan["tp_bytes"] == step["tp_bytes"]
      and step["dp_bytes"] == plan["dp_bytes"])
print(plan, setup, step["dp_bytes"], step["tp_bytes"]) if not ok else None
sys.exit(0 if ok else 1)
PY
        then ok "plan's memory and traffic equal the run's"; else fail "plan's memory and traffic equal the run's"; fi
    fi
fi
