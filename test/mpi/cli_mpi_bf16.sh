#!/usr/bin/env bash
# bf16 mixed precision through the real binary (core/README.md, Precision), on
# configs/test-tiny.yaml:
#   - learning: a bf16 run's validation loss after the same steps is within 1% of the fp32 run's
#     (both start from the same fp32 initial values: the master weights);
#   - the comparator in bf16: compare_runs.py --self-test --noise catches planted differences;
#   - equivalence: every layout family — dp with ZeRO 0-3 (fp32 and bf16 gradient reduction),
#     tp with and without sequence parallelism, every pipeline schedule, recompute, 3D, context
#     parallelism (cp 2 alone, with tp + SP, cp 4 with ZeRO-2 and a bf16 reduction) — trained
#     in bf16 against bf16 at world size 1, within the distance of the bf16 reference from its
#     fp32 twin (compare_runs.py states the allowance and why); every dp replica bit-identical;
#     memory per category (fp32 master weights included) and dp/tp bytes equal to the bf16
#     formulas, exactly.
# MPI tests run one at a time, one thread per rank, passive waiting (test/README.md, MPI tests).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup

# Learning: 30 steps of the tiny model in each precision, validation loss at the end.
learn=(--set train.steps=30 --set train.warmup_steps=3 --set train.eval_interval=30
       --set train.eval_steps=2 --set data.val="$TEST_DATA/val.bin")
val_loss() { python3 -c 'import json,sys; print([json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "val_loss" in l][-1])' "$1"; }
if selected "learning" &&
    expect_exit 0 "train 30 steps in fp32" -- "$BIN" "${base[@]}" "${learn[@]}" \
        --set train.precision=fp32 --set log.metrics="$tmp/learn32.jsonl" &&
    expect_exit 0 "train 30 steps in bf16" -- "$BIN" "${base[@]}" "${learn[@]}" \
        --set train.precision=bf16 --set log.metrics="$tmp/learn16.jsonl"; then
    expect_text "precision: bf16 mixed (train.precision: bf16)" "the run says it trains in bf16"
    v32=$(val_loss "$tmp/learn32.jsonl") v16=$(val_loss "$tmp/learn16.jsonl")
    if python3 -c 'import sys; a,b=map(float,sys.argv[1:]); sys.exit(0 if abs(b-a)/a <= 0.01 else 1)' "$v32" "$v16"; then
        ok "bf16 learns like fp32: val loss $v16 vs $v32 (within 1%)"
    else
        fail "bf16 val loss $v16 is not within 1% of fp32's $v32"
    fi
fi

bf16=(--set train.precision=bf16)
if expect_exit 0 "bf16 reference run (world size 1)" -- "$BIN" "${base[@]}" "${bf16[@]}" \
        --set log.metrics="$tmp/ref.jsonl" --dump-params "$tmp/ref.bin" --dump-init-params "$tmp/init.bin" &&
    expect_exit 0 "its fp32 twin (world size 1)" -- "$BIN" "${base[@]}" \
        --set log.metrics="$tmp/twin.jsonl" --dump-params "$tmp/twin.bin"; then
    python3 test/tools/compare_runs.py --self-test "$tmp/ref.jsonl" "$tmp/ref.bin" --init "$tmp/init.bin" \
        --noise "$tmp/twin.jsonl" "$tmp/twin.bin"
    # np  settings
    while read -r np extra; do
        name="bf16 np=$np $extra"
        selected "$name" || continue
        # shellcheck disable=SC2086
        if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np "$np" "$BIN" "${base[@]}" "${bf16[@]}" \
            $extra --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin"; then
            check_against_reference "$name" "$tmp"
        fi
    done <<'RUNS'
2 --set parallel.zero_stage=0 --set parallel.grad_reduce_dtype=bf16
2 --set parallel.zero_stage=1
2 --set parallel.zero_stage=2 --set parallel.grad_reduce_dtype=bf16
2 --set parallel.zero_stage=3
2 --set parallel.tp=2
2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set train.recompute=full
2 --set parallel.pp=2 --set parallel.schedule=gpipe
4 --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved --set parallel.zero_stage=1
4 --set parallel.tp=2 --set parallel.pp=2 --set parallel.schedule=1f1b
4 --set parallel.tp=2 --set parallel.zero_stage=3 --set parallel.grad_reduce_dtype=bf16
8 --set parallel.tp=2 --set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 --set train.micro_batch=2 --set parallel.zero_stage=2 --set parallel.sequence_parallel=true
8 --set parallel.tp=2 --set parallel.pp=2 --set parallel.schedule=1f1b --set parallel.zero_stage=3 --set parallel.grad_reduce_dtype=bf16 --set train.recompute=full
2 --set parallel.cp=2 --set log.sample_tokens=0
4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set parallel.zero_stage=1 --set log.sample_tokens=0
4 --set parallel.cp=4 --set parallel.zero_stage=2 --set parallel.grad_reduce_dtype=bf16 --set log.sample_tokens=0
4 --set parallel.tp=2 --set parallel.pp=2 --set parallel.schedule=zbh1 --set parallel.sequence_parallel=true --set train.recompute=full
4 --set parallel.pp=2 --set parallel.schedule=zbv --set parallel.virtual_stages=2 --set parallel.zero_stage=2 --set parallel.grad_reduce_dtype=bf16
RUNS
fi
