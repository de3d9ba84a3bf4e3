/*
 * gemm_bench.h — the backend's GEMM rate, measured on the spot: the denominator of the GEMM
 * efficiency the trainer reports (beside MFU against the hardware peak) and of
 * scripts/bench_cpu.sh. Works on any backend: tensors on the backend, timed with a sync after
 * each call, the best of several runs (more of them for a small GEMM: 50 ms at least), operands
 * in cache.
 */
#ifndef CT_CORE_GEMM_BENCH_H
#define CT_CORE_GEMM_BENCH_H

#include "core/backend/backend.h"

/* Measures the backend's GEMM rate (FLOP/s) at shape M×N×K with operands of `dtype` (f32, or
 * bf16 into bf16), called as a linear layer's forward with its bias (ct_gemm_bias, y = x·Wᵀ + b,
 * M rows of K in, N out): the best of at least `reps` runs. */
double ct_gemm_bench_rate(ct_backend *be, int64_t M, int64_t N, int64_t K, ct_dtype dtype,
                          int reps);

/* How a timed GEMM is called: C = op(A)·op(B) overwriting C (beta 0) or accumulating onto it
 * (beta 1), or a linear layer's forward with its bias, C = A·Bᵀ + b (ct_gemm_bias: on the CPU the
 * bias, then a GEMM accumulating onto it; on the GPU the bias in the epilogue). */
typedef enum ct_gemm_call { CT_GEMM_OVERWRITE, CT_GEMM_ACCUMULATE, CT_GEMM_BIAS } ct_gemm_call;

/* A linear layer y = x·Wᵀ (W: out × in) as a model runs it: `count` times a step, its forward
 * called as `fwd`. */
typedef struct ct_gemm_linear {
    int64_t out, in;
    double count;
    ct_gemm_call fwd;
} ct_gemm_linear;

/*
 * The backend's GEMM rate over a model's linear layers: each one's forward (x·Wᵀ, as its `fwd`
 * says), input-gradient (dy·W, overwriting) and weight-gradient (dyᵀ·x, accumulating into f32)
 * GEMM on `rows` rows, operands and activations of `dt`, timed (best of `reps` or more, operands in
 * cache) and weighted by `count`. Returns FLOP/s. The model names its layers (model.h,
 * ct_model_gemm_rate); this only times them.
 */
double ct_gemm_bench_linears(ct_backend *be, int64_t rows, const ct_gemm_linear *linears, int n,
                             ct_dtype dt, int reps);

#endif /* CT_CORE_GEMM_BENCH_H */
