#!/usr/bin/env bash
# Check mode through the registry and the CLI (core/backend/backend_check.c;
# core/backend/BACKENDS.md): with CT_CHECK_BACKEND=1 every backend but the plain CPU one is wrapped,
# every op is rerun on the CPU backend and compared, and a run exits 1 at the first op that
# disagrees. Here the backend under test is the CPU backend behind the asynchronous stream, which
# computes the CPU's bits: a short training run must agree op for op in fp32 and bf16, on one rank
# and on two (tensor parallel: the vocab-parallel embedding and cross-entropy), and the start-up
# lines must say the mode is on. test/unit/test_backend_check.c shows that broken kernels are caught.
. "$(dirname "$0")/../tools/lib_cli.sh"
export CT_CHECK_BACKEND=1
OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive # two OpenMP pools here: the stream's and the checker's
export OMP_NUM_THREADS OMP_WAIT_POLICY

ensure_test_data
run=(train --config configs/test-tiny.yaml --backend cpu-async --set train.threads=1
     --set train.steps=2 --set data.train="$TEST_DATA/train.bin")

if expect_exit 0 "check: fp32 training run on cpu-async agrees op for op" -- "$BIN" "${run[@]}"; then
    expect_text "backend: cpu-async, every op checked against the CPU backend (CT_CHECK_BACKEND=1)" \
        "check: the chosen backend says it is checked"
    expect_text "backend: cpu-async, checked: 1 thread" "check: the backend line says checked"
fi
expect_exit 0 "check: bf16 training run on cpu-async agrees op for op" -- \
    "$BIN" "${run[@]}" --set train.precision=bf16

# the plain CPU backend is the reference itself: not wrapped
if expect_exit 0 "check: a run on the plain cpu backend" -- "$BIN" "${run[@]/cpu-async/cpu}"; then
    if printf '%s' "$OUT_TEXT" | grep -q "checked"; then
        fail "check: the plain cpu backend was wrapped"
    else
        ok "check: the plain cpu backend is not wrapped"
    fi
fi

# two ranks, tensor parallel
mpi_setup
expect_exit 0 "check: tp=2 training run on cpu-async agrees op for op" -- \
    "${MPIRUN[@]}" -np 2 "$BIN" "${run[@]}" --set parallel.tp=2
