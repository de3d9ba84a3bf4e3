#!/usr/bin/env bash
# Tensor parallelism (parallel/README.md, Tensor parallel) under mpirun:
#   - every TP layer type, the vocab-parallel loss and the MoE balancing loss's value and gradient
#     against the unsplit model, tp 2 and 4, with and without sequence parallelism
#     (test/mpi/mpi_test_tp.c);
#   - training equivalence against world size 1 on configs/test-tiny.yaml: tp 2, 4, 8 with and
#     without sequence parallelism, and combined with dp and every ZeRO stage; memory and dp/tp
#     traffic against their formulas (test/tools/compare_runs.py --accounting);
#   - invalid tp: exit 2 with the numbers on every rank, no hang.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup

for np in 2 4; do run_mpi_program "$np" "$BUILD/test/mpi_test_tp"; done

equivalence_setup

if reference_run "$tmp"; then
    # tp  dp  zero  sequence_parallel  micro_batch  extra
    while read -r tp dp zero sp micro extra; do
        name="tp=$tp dp=$dp zero=$zero sp=$sp micro_batch=$micro $extra"
        selected "$name" || continue
        # shellcheck disable=SC2086
        if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np $((tp * dp)) "$BIN" "${base[@]}" \
            --set parallel.tp="$tp" --set parallel.zero_stage="$zero" \
            --set parallel.sequence_parallel="$sp" --set train.micro_batch="$micro" $extra \
            --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin"; then
            expect_text "all bit-identical" "$name: every replica holds the same bytes"
            check_against_reference "$name" "$tmp"
        fi
    done <<'RUNS'
2 1 0 false 2
2 1 0 true 4
4 1 0 false 16
4 1 0 true 2
8 1 0 false 2
8 1 0 true 4
2 2 1 false 2
2 2 1 true 4
2 4 3 false 2
2 4 3 true 1
4 2 2 false 2
4 2 2 true 8
2 2 3 true 2 --set parallel.bucket_mb=100
RUNS
fi

expect_exit 2 "tp that does not divide n_head" -- "${MPIRUN[@]}" -np 3 "$BIN" "${base[@]}" --set parallel.tp=3
expect_text "parallel.tp=3" "invalid tp is quoted"
expect_text "hint:" "invalid tp has a hint listing valid values"
n=$(printf '%s\n' "$OUT_TEXT" | grep -c '^cooktrain:')
if [ "$n" = 1 ]; then ok "invalid tp printed once (rank 0)"; else fail "invalid tp printed $n times"; fi
expect_exit 2 "sequence parallelism with seq_len not divisible by tp" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" \
    --set parallel.tp=4 --set parallel.sequence_parallel=true --set model.seq_len=30
expect_text "seq_len" "the message names seq_len"
