/*
 * attention_tc.cuh — inside the attention op (attention.cuh is its interface): the bf16 path on
 * tensor cores (attention_tc.cu) and the helper of attention.cu it shares. C++ only.
 */
#ifndef CT_CUDA_ATTENTION_TC_CUH
#define CT_CUDA_ATTENTION_TC_CUH

#include "cuda/ct_cuda_ctx.h"

/* ct_cuda_attention_fwd / _bwd for dt = bf16 (same arguments, attention.cuh); head_dim <= 128 and
 * the other bounds checked by the caller. */
void ct_cuda_attention_fwd_tc(ct_cuda_ctx *cx, void *out, float *lse, const void *qkv, int64_t B,
                              int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd);
void ct_cuda_attention_bwd_tc(ct_cuda_ctx *cx, void *dqkv, float *dbias, const void *dout,
                              const void *qkv, const void *out, const float *lse, int64_t B,
                              int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd);

/* D[(b·n_head + h)·T + i] = dO_i · O_i (fp32) for every row of dout and out (B, T, n_head·hd). */
void ct_cuda_attention_rowdot(ct_cuda_ctx *cx, ct_dtype dt, float *D, const void *dout,
                              const void *out, int64_t B, int64_t T, int64_t n_head, int64_t hd);

#endif /* CT_CUDA_ATTENTION_TC_CUH */
