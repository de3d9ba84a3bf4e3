/*
 * gemm_bench.h — the backend's GEMM rate, measured on the spot: the denominator of the GEMM
 * efficiency the trainer reports (beside MFU against the hardware peak) and of
 * scripts/bench_cpu.sh. Works on any backend: tensors on the backend, timed with a sync after
 * each call, median of a few runs, operands in cache.
 */
#ifndef CT_CORE_GEMM_BENCH_H
#define CT_CORE_GEMM_BENCH_H

#include "core/backend/backend.h"
#include "core/config/config.h"

/* Measures the backend's GEMM rate (FLOP/s) at shape M×N×K with operands of `dtype` (f32, or
 * bf16 into bf16), called as a linear layer's forward with its bias (ct_gemm_bias, y = x·Wᵀ + b,
 * M rows of K in, N out): the median of a few runs. */
double ct_gemm_bench_rate(ct_backend *be, int64_t M, int64_t N, int64_t K, ct_dtype dtype,
                          int reps);

/*
 * The backend's GEMM rate at the model's own shapes: every linear layer's forward (x·Wᵀ),
 * input-gradient (dy·W) and weight-gradient (dyᵀ·x) GEMM for a microbatch of B sequences, each
 * called as the model calls it (transposes, and beta: accumulate or overwrite), timed (median of
 * `reps`, operands in cache) and weighted by how often a step runs it, in the dtypes of
 * cfg->derived.precision (bf16: weight gradients into f32). Returns FLOP/s; this is the GEMM
 * efficiency denominator of scripts/bench_cpu.sh.
 */
double ct_gemm_bench_model_rate(const ct_config *cfg, ct_backend *be, int reps);

/* The rate of a Mixture-of-Experts layer's expert GEMMs (0 without MoE): one expert's up and
 * down projections, forward, input and weight gradient, at the rows an expert receives from a
 * microbatch under uniform routing (micro_batch · seq_len · moe_top_k / moe_experts). */
double ct_gemm_bench_expert_rate(const ct_config *cfg, ct_backend *be, int reps);

#endif /* CT_CORE_GEMM_BENCH_H */
