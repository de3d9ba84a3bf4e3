#!/usr/bin/env bash
# Context parallelism (parallel/README.md, Context parallelism) under mpirun: ring attention
# (core/model/ring_attention.h) at cp 1, 2, 4 and 8 against one rank's attention on the whole
# sequence — out, lse, dq, dk, dv and the qkv bias gradient of each rank's rows, zigzag and
# contiguous, MHA and GQA, fp32 and bf16 — the bytes each ring sends, bit-identical reruns, and
# the causal work per rank (test/mpi_test_cp.c states the tolerances).
. "$(dirname "$0")/lib_cli.sh"
mpi_setup

for np in 1 2 4 8; do run_mpi_program "$np" "$BUILD/test/mpi_test_cp"; done
