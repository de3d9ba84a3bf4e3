/*
 * model_gemms.c — the model's linear layers as GEMM shapes, timed on a backend
 * (backend/gemm_bench.h): the GEMM efficiency's denominator. See model.h.
 */
#include "model.h"

#include "core/backend/gemm_bench.h"
#include "model_arch.h"

double ct_model_gemm_rate(const ct_config *cfg, ct_backend *be, int reps) {
    const int64_t rows = cfg->train.micro_batch * cfg->model.seq_len, C = cfg->model.d_model;
    const int64_t qdim = cfg->model.n_head * cfg->derived.head_dim;
    const int64_t kvdim = cfg->derived.n_kv_head * cfg->derived.head_dim;
    const int64_t F = cfg->derived.d_ff, Vp = cfg->derived.vocab_padded;
    const double L = (double)cfg->model.n_layer;
    /* q, k and v as one fused projection; the block's layers with their bias (ct_gemm_bias) where
     * the architecture has them (GPT-2), else overwriting (Llama), as is the LM head (the tied
     * embedding). Each GEMM is timed as the model calls it: overwriting costs a BLAS an extra
     * pass over C, an accumulating bf16 GEMM the GPU an fp32 product. */
    const ct_model_arch *arch = ct_model_arch_of(cfg->model.arch);
    const ct_gemm_call lin = arch->linear_bias ? CT_GEMM_BIAS : CT_GEMM_OVERWRITE;
    const ct_gemm_linear linears[] = {
        {qdim + 2 * kvdim, C, L, lin},
        {C, qdim, L, lin},
        {arch->act.hidden * F, C, L, lin}, /* Llama: gate|up as one */
        {C, F, L, lin},
        {Vp, C, 1, CT_GEMM_OVERWRITE},
    };
    return ct_gemm_bench_linears(be, rows, linears, (int)CT_ARRAY_LEN(linears),
                                 ct_precision_dtype(cfg->derived.precision), reps);
}

double ct_model_expert_gemm_rate(const ct_config *cfg, ct_backend *be, int reps) {
    const int64_t E = cfg->model.moe_experts;
    if (!E) return 0.0;
    /* an expert's rows under uniform routing, its up and down projections as moe.c runs them:
     * forward with the bias in (beta 1) */
    const int64_t rows =
        CT_MAX(1, cfg->train.micro_batch * cfg->model.seq_len * cfg->model.moe_top_k / E);
    const int64_t C = cfg->model.d_model, F = cfg->derived.moe_d_ff / cfg->parallel.tp;
    const int64_t up = ct_model_arch_of(cfg->model.arch)->act.hidden * F; /* Llama: gate|up */
    const ct_gemm_linear linears[] = {
        {up, C, 1, CT_GEMM_ACCUMULATE},
        {C, F, 1, CT_GEMM_ACCUMULATE},
    };
    return ct_gemm_bench_linears(be, rows, linears, (int)CT_ARRAY_LEN(linears),
                                 ct_precision_dtype(cfg->derived.precision), reps);
}
