#!/usr/bin/env bash
# Collective bandwidth benchmark: allreduce, reduce_scatter and allgather at 2, 4 and 8 ranks and
# 1, 4, 16, 64 MiB, through the comm layer (ct_comm_*) and through raw MPI, with busbw set
# against single-thread memcpy bandwidth measured in the same run (scripts/bench_comm.c explains
# the columns), and at the end the non-blocking allreduce with Open MPI's default algorithm
# choice. About two minutes on two cores.
#
#   scripts/bench_comm.sh [--ranks "2 4 8"] [--sizes "1 4 16 64"] [--no-make] [--quick]
#
# --no-make uses the libraries already in $BUILD (when someone else's file does not compile);
# --quick leaves out the comparison with libnbc's default algorithm (make test's smoke run).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ranks="2 4 8"
sizes="1 4 16 64"
do_make=1
quick=0
while [ $# -gt 0 ]; do
    case $1 in
        --ranks) ranks=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --no-make) do_make=0; shift ;;
        --quick) quick=1; shift ;;
        *) echo "bench_comm: unknown option $1" >&2; echo "hint: see the comment at the top of $0" >&2; exit 2 ;;
    esac
done

if [ "$do_make" = 1 ]; then make --no-print-directory -s "$BUILD/libctpar.a" "$BUILD/libctcore.a" >/dev/null; fi
exe=$BUILD/bench_comm
# shellcheck disable=SC2046
mpicc -std=gnu11 -O2 -g -Wall -Wextra -I. scripts/bench_comm.c "$BUILD/libctpar.a" "$BUILD/libctcore.a" \
    $(make --no-print-directory -s print-ldlibs) -fopenmp -o "$exe"

# Ranks outnumber cores at 4 and 8: waiting ranks must yield, or the timings measure spinning.
export OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
echo "== collectives on $(getconf _NPROCESSORS_ONLN) cores, f32, Open MPI $(mpirun --version | sed -n 's/.*Open MPI) //p');" \
     "time = slowest rank, median of 7-21 runs after a warm-up; mpi_yield_when_idle=1"
for np in $ranks; do
    echo
    # shellcheck disable=SC2086
    timeout 600 mpirun --allow-run-as-root --oversubscribe -np "$np" "$exe" $sizes
done

[ "$quick" = 1 ] && exit 0

# ct_mpi_init asks Open MPI's libnbc for Rabenseifner's allreduce (parallel/context.c says why);
# this is what the library's own choice (a binomial tree for in-place calls) would give.
echo
echo "== for comparison: non-blocking allreduce with libnbc's default algorithm choice"
for np in 2 8; do
    echo
    OMPI_MCA_coll_libnbc_iallreduce_algorithm=0 timeout 600 mpirun --allow-run-as-root \
        --oversubscribe -np "$np" "$exe" 1 16 | grep -E '^(ranks|op |allreduce)'
done
