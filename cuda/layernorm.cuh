/*
 * layernorm.cuh — LayerNorm forward and backward on the CUDA backend (the slots layernorm_fwd and
 * layernorm_bwd of core/backend/backend.h): one warp or block per row, statistics in fp32; dw and
 * db (accumulated) from per-block partials summed in block order.
 */
#ifndef CT_CUDA_LAYERNORM_CUH
#define CT_CUDA_LAYERNORM_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void ct_cuda_layernorm_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, float *mean, float *rstd,
                           const void *inp, const void *w, const void *b, int64_t N, int64_t C);
void ct_cuda_layernorm_bwd(ct_cuda_ctx *cx, ct_dtype dt, void *dinp, float *dw, float *db,
                           const void *dout, const void *inp, const void *w, const float *mean,
                           const float *rstd, int64_t N, int64_t C);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_LAYERNORM_CUH */
