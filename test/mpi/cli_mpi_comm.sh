#!/usr/bin/env bash
# The MPI comm layer and rank grid under mpirun: build/test/mpi_test_comm at 1, 2, 4 and 8 ranks
# (its "ok"/"FAIL" lines are relayed as they are; they include every collective split into pieces
# under small chunk limits), MoE dispatch and combine on top of all_to_all_v (mpi_test_moe at the
# same sizes), then real counts above INT_MAX at 2 ranks (mpi_test_comm big, 4 GiB
# per rank), then the collective watchdog: a job in which one rank skips a collective (or never
# sends a message another rank waits for) must end with a non-zero exit and the watchdog's report
# within seconds, not hang; the same with operations split into pieces; and a point-to-point tag
# outside [0, MPI_TAG_UB] must end the job in its CT_ASSERT.
#
# Ranks outnumber the cores here, so nobody may spin: Open MPI yields when idle, OpenMP threads
# sleep, one thread per rank; and limits are generous (test/README.md, MPI tests). No check depends
# on timing except "did not hang", whose bound is an order of magnitude above the 2 s watchdog
# limit.
# long: the counts above INT_MAX for real (4 GiB a rank; the split logic is checked at every size
# long: under small chunk limits in make test)
. "$(dirname "$0")/../tools/lib_cli.sh"
exe=$BUILD/test/mpi_test_comm
export OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# mpirun refuses root and more ranks than cores unless told; both are normal in containers.
mpirun_args=(--allow-run-as-root --oversubscribe)

if [ ! -x "$exe" ]; then
    fail "mpi_test_comm is built ($exe missing; run make)"
    exit 1
fi

now_ms() { date +%s%3N; }

# run_program LABEL NP [MODE]: mpi_test_comm at NP ranks, its own lines relayed, and one check
# that it exits 0 (with the time it took).
run_program() {
    local label=$1 np=$2 t0 t1 out rc
    shift 2
    t0=$(now_ms)
    out=$(timeout 300 mpirun "${mpirun_args[@]}" -np "$np" "$exe" "$@" 2>&1)
    rc=$?
    t1=$(now_ms)
    # The program's own lines ("ok npN ...", "FAIL npN ...", and indented details).
    printf '%s\n' "$out" | grep -E '^(ok |FAIL |skip |    rank |mpi_test_comm big )'
    if [ "$rc" = 0 ]; then
        ok "$label at $np ranks exits 0 ($(( (t1 - t0) / 1000 )).$(( (t1 - t0) % 1000 / 100 )) s)"
    else
        fail "$label at $np ranks exits 0 (exit $rc$([ "$rc" = 124 ] && echo ', timed out'))"
        printf '%s\n' "$out" | grep -vE '^(ok |FAIL )' | tail -15 | sed 's/^/    /'
    fi
}

for np in 1 2 4 8; do run_program mpi_test_comm "$np"; done
# MoE dispatch and combine over an expert-parallel group of 1, 2, 4 and 8 ranks (mpi_test_moe.c)
mpi_setup
for np in 1 2 4 8; do run_mpi_program "$np" "$BUILD/test/mpi_test_moe"; done

# Counts above INT_MAX for real, with the default chunk limit: 2 ranks only (the buffers are
# 4 GiB per rank; more ranks would only multiply the memory). The program skips, with a "skip ..."
# line, where the machine cannot hold them.
long_part "mpi_test_comm big (> INT_MAX elements)" && run_program "mpi_test_comm big (> INT_MAX elements)" 2 big

# watchdog_run NP MODE WANT...   (every WANT must appear in the output)
watchdog_run() {
    local np=$1 mode=$2
    shift 2
    local t0 t1 rc elapsed
    t0=$(now_ms)
    OUT_TEXT=$(timeout 60 mpirun "${mpirun_args[@]}" -np "$np" "$exe" "$mode" 2>&1)
    rc=$?
    t1=$(now_ms)
    elapsed=$(( (t1 - t0) / 1000 ))
    if [ "$rc" != 0 ] && [ "$rc" != 124 ]; then
        ok "$mode at $np ranks: job aborts (exit $rc)"
    else
        fail "$mode at $np ranks: job aborts (exit $rc$([ "$rc" = 124 ] && echo ', hung until timeout'))"
        printf '%s\n' "$OUT_TEXT" | tail -10 | sed 's/^/    /'
    fi
    if [ "$elapsed" -lt 30 ]; then
        ok "$mode at $np ranks: did not hang (${elapsed} s with a 2 s limit)"
    else
        fail "$mode at $np ranks: did not hang (${elapsed} s with a 2 s limit)"
    fi
    for want in "$@"; do expect_text "$want" "$mode at $np ranks: report names '$want'"; done
}

watchdog_run 2 watchdog "collective timed out on rank 0" "group world (rank 0 of 2)" \
    "op allreduce (f32 sum)" "4096 bytes" "sequence #2" "hint:" "parallel.timeout_s"
watchdog_run 4 watchdog "collective timed out" "group world" "sequence #2" "hint:"
watchdog_run 2 watchdog_recv "point-to-point operation timed out on rank 0" \
    "op recv from group rank 1 (tag 42, f32)" "sequence #1" "hint:"
# Split into pieces (chunk limit 100): still one sequence number per operation, and the report
# says how many pieces there were.
watchdog_run 2 watchdog_chunked "collective timed out on rank 0" "op allreduce (f32 sum)" \
    "4096 bytes in 11 pieces" "sequence #2 (the 2nd collective"
watchdog_run 2 watchdog_recv_chunked "point-to-point operation timed out on rank 0" \
    "op recv from group rank 1 (tag 42, f32)" "1024 bytes in 3 pieces" "sequence #1 (the 1st"

# assert_run NP MODE WANT...   a caller's bug: the job must abort with the CT_ASSERT's message
assert_run() {
    local np=$1 mode=$2
    shift 2
    OUT_TEXT=$(timeout 60 mpirun "${mpirun_args[@]}" -np "$np" "$exe" "$mode" 2>&1)
    local rc=$?
    if [ "$rc" != 0 ] && [ "$rc" != 124 ]; then
        ok "$mode at $np ranks: job aborts (exit $rc)"
    else
        fail "$mode at $np ranks: job aborts (exit $rc$([ "$rc" = 124 ] && echo ', hung until timeout'))"
        printf '%s\n' "$OUT_TEXT" | tail -10 | sed 's/^/    /'
    fi
    for want in "$@"; do expect_text "$want" "$mode at $np ranks: message names '$want'"; done
}

assert_run 2 bad_tag "internal error on rank 0" "send tag -7 on group world is outside [0, " \
    "MPI_TAG_UB"
assert_run 2 bad_tag_recv "internal error on rank 0" "recv tag " "on group world is outside [0, "

# The collective benchmark still builds against the libraries and runs every path (a smoke run:
# no timing is checked; scripts/bench_comm.sh prints the ratios).
out=$(BUILD=$BUILD bash scripts/bench_comm.sh --ranks 2 --sizes 64k --quick --no-make 2>&1)
if printf '%s\n' "$out" | grep -qE '^allgather +64 KiB mpi_nb'; then
    ok "scripts/bench_comm.sh builds and runs every op and path"
else
    fail "scripts/bench_comm.sh builds and runs every op and path"
    printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
fi
