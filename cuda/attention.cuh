/*
 * attention.cuh — causal self-attention forward and backward on the CUDA backend (the slots
 * attention_fwd and attention_bwd of core/backend/backend.h) as tiled online-softmax kernels in the
 * FlashAttention-2 manner: the T×T scores are never materialised, fully masked tiles are skipped,
 * the backward recomputes the probabilities from q, k and the saved log-sum-exp, and query heads
 * share key/value heads in groups (GQA).
 */
#ifndef CT_CUDA_ATTENTION_CUH
#define CT_CUDA_ATTENTION_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void ct_cuda_attention_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, float *lse, const void *qkv,
                           int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                           int64_t head_dim);
void ct_cuda_attention_bwd(ct_cuda_ctx *cx, ct_dtype dt, void *dqkv, float *dbias, const void *dout,
                           const void *qkv, const void *out, const float *lse, int64_t B, int64_t T,
                           int64_t n_head, int64_t n_kv_head, int64_t head_dim);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_ATTENTION_CUH */
