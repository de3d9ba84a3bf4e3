#!/usr/bin/env bash
# The ordering proof (core/backend/backend.h, core/comm/comm.h; core/backend/BACKENDS.md): the
# op, model and optimizer tests and the multi-rank equivalence suites again, with every backend the
# registry makes put behind the asynchronous stream (COOKTRAIN_ASYNC=1). That stream runs queued ops
# on its worker thread only when the host waits for them, so a collective, a host copy or a test
# that reaches tensor memory without the wait the ordering rules require reads stale values and
# fails here, every time. (`make mutants` deletes the comm layer's wait and checks this script
# catches it.) Everything is expected to pass exactly as in the synchronous run: the stream computes
# bit-identical results.
. "$(dirname "$0")/../tools/lib_cli.sh"
export COOKTRAIN_ASYNC=1
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=passive
export OMP_NUM_THREADS OMP_WAIT_POLICY

# The backend says where it runs, so the mode is known to be on.
ensure_test_data
if expect_exit 0 "async: one training run" -- "$BIN" train --config configs/test-tiny.yaml \
    --set train.threads=1 --set data.train="$TEST_DATA/train.bin" --set train.steps=2 --set train.warmup_steps=1; then
    expect_text "behind the asynchronous stream (COOKTRAIN_ASYNC=1)" "async: the run names the asynchronous stream"
fi

for t in test_ops test_bf16_ops test_model test_optim test_units test_backend_async; do
    if "$BUILD/test/$t" >"$BUILD/test-logs/async_$t.log" 2>&1; then
        ok "async $t ($(grep -oE '^\[  PASSED  \] [0-9]+' "$BUILD/test-logs/async_$t.log" | awk '{print $4}') cases)"
    else
        fail "async $t: see $BUILD/test-logs/async_$t.log"
    fi
done

# The equivalence suites: their own ok/FAIL lines, prefixed.
# A suite that is not there fails (it would otherwise pass without running).
for s in cli_mpi_dp cli_mpi_tp cli_mpi_pp cli_mpi_cp; do
    if [ ! -f "test/mpi/$s.sh" ]; then
        fail "async: test/mpi/$s.sh is missing"
        continue
    fi
    bash "test/mpi/$s.sh" 2>&1 | sed -e 's/^ok /ok async: /' -e 's/^FAIL /FAIL async: /' -e 's/^skip /skip async: /'
done
