#!/usr/bin/env bash
# The smoke run of `make test-quick` (also part of `make test`): one process trains
# configs/test-tiny.yaml for a few steps with metrics and a checkpoint that `inspect` verifies,
# `plan` prices a config, and 2 data-parallel ranks with ZeRO-1 train what one process trains
# (test/tools/compare_runs.py: every step's loss and gradient norm and every final parameter
# within the fp32 tolerance, memory and traffic equal to their formulas). Seconds, not minutes:
# the first check after a change; the whole suite is `make test`.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup

if expect_exit 0 "train test-tiny, one process, 3 steps" -- "$BIN" "${base[@]}" --set train.steps=3 \
    --set train.warmup_steps=1 --set log.metrics="$tmp/m.jsonl" --set checkpoint.dir="$tmp/ck" \
    --set checkpoint.interval=3; then
    if python3 -c 'import json,math,sys; r=[json.loads(l) for l in open(sys.argv[1]) if "\"loss\"" in l]; sys.exit(not (len(r)==3 and all(math.isfinite(x["loss"]) for x in r)))' "$tmp/m.jsonl"; then
        ok "three finite losses in the metrics"
    else
        fail "the metrics lack three finite losses"
    fi
    expect_exit 0 "inspect the checkpoint (every checksum)" -- "$BIN" inspect "$tmp/ck/step-00000003"
fi
expect_exit 0 "plan gpt2-124m at tp 2 x dp 2" -- "$BIN" plan --config configs/gpt2-124m.yaml \
    --set parallel.tp=2 --set parallel.dp=2 --set train.micro_batch=2
base+=(--set train.steps=2 --set train.warmup_steps=1)
if reference_run "$tmp"; then
    expect_exit 0 "train dp 2, ZeRO-1 (2 ranks)" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" \
        --set parallel.zero_stage=1 --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin" &&
        check_against_reference "dp 2, ZeRO-1" "$tmp"
fi
