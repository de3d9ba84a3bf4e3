#!/usr/bin/env bash
# Runs one MPI test program the way the suite does (test/tools/lib_cli.sh: one thread per rank, passive
# waiting, oversubscription allowed) and exits 1 if it printed a FAIL line or crashed:
#   bash test/mpi/run_mpi.sh NP PROGRAM      e.g. bash test/mpi/run_mpi.sh 4 build/test/mpi_test_pp
. "$(dirname "$0")/../tools/lib_cli.sh"
mpi_setup
out=$(run_mpi_program "$1" "$2")
printf '%s\n' "$out"
! printf '%s\n' "$out" | grep -q '^FAIL '
