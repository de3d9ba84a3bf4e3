#!/usr/bin/env bash
# GEMM benchmark: OpenBLAS cblas_sgemm against oneDNN fp32 and oneDNN bf16 (bf16 A and B, f32 C,
# fp32 accumulation) through core/backend/cpu/gemm_onednn.c, at the GPT-2 124M model's GEMM shapes for
# B·T = 1024 tokens: every linear layer's forward (x·W^T), input gradient (dy·W) and weight
# gradient (dy^T·x, trans_a), with beta as the model uses it (1 where the output accumulates:
# forward with a bias, weight gradients).
#
# Columns: GFLOP/s (2·M·N·K / median time) per library; f32/OB and bf16/OB are oneDNN's rate over
# OpenBLAS's; "diff" is ||C - C_OpenBLAS|| / ||C_OpenBLAS|| after the warm-up call (fp32 ~1e-7:
# summation order only; bf16 ~1e-3: the inputs' rounding); then oneDNN's implementation names.
# geomean is over the shapes; "step" weighs them as one training step does (12 layers, the
# lm-head once): total FLOP over total time, so its ratios are the speed-up of a step's GEMMs.
# Then microseconds per call at small shapes (n = 1 is pure call overhead), the cost of per-call
# memory objects, and the first, primitive-creating call of a new shape.
#
#   scripts/bench_gemm.sh [rounds]          (default 5 timed rounds after one warm-up)
#   OMP_NUM_THREADS=4 scripts/bench_gemm.sh (default 2 threads)
#
# Needs OpenBLAS (pkg-config openblas) and oneDNN (libdnnl-dev): bash scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
rounds=${1:-5}

if ! pkg-config --exists openblas || [ ! -f /usr/include/oneapi/dnnl/dnnl.h ]; then
    echo "bench_gemm: OpenBLAS (pkg-config openblas) or oneDNN (oneapi/dnnl/dnnl.h) missing" >&2
    echo "hint: run bash scripts/setup.sh (libopenblas-openmp-dev, libdnnl-dev)" >&2
    exit 2
fi
mkdir -p "$BUILD"
exe=$BUILD/bench_gemm
# shellcheck disable=SC2046
cc -std=gnu11 -O3 -march=native -fopenmp -g -Wall -Wextra -Wno-unused-parameter -I. \
    $(pkg-config --cflags openblas) scripts/bench_gemm_main.c core/backend/cpu/gemm_onednn.c \
    core/common.c \
    -o "$exe" $(pkg-config --libs openblas) -ldnnl -lm
"$exe" "$rounds"
