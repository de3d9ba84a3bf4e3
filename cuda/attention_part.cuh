/*
 * attention_part.cuh — one step of ring attention on the CUDA backend (the slots
 * attention_part_fwd and attention_part_bwd of core/backend/backend.h, context parallelism): the
 * local queries, as two chunks of T/2 rows, against one key/value block that came round the ring,
 * merged into fp32 accumulators by log-sum-exp (forward) or added into fp32 gradient accumulators
 * (backward), from the fp32 tiles of cuda/attention_tile.cuh.
 */
#ifndef CT_CUDA_ATTENTION_PART_CUH
#define CT_CUDA_ATTENTION_PART_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void ct_cuda_attention_part_fwd(ct_cuda_ctx *cx, ct_dtype dt, float *o_acc, float *lse_acc,
                                const void *qkv, const void *kv, int64_t B, int64_t T,
                                int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                int64_t chunks);
void ct_cuda_attention_part_bwd(ct_cuda_ctx *cx, ct_dtype dt, float *dq_acc, float *dkv_acc,
                                const void *dout, const void *qkv, const void *out,
                                const float *lse, const void *kv, int64_t B, int64_t T,
                                int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                int64_t chunks);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_ATTENTION_PART_CUH */
