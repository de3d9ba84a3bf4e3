/*
 * layernorm.cuh — the norms on the CUDA backend: LayerNorm (the slots layernorm_fwd and
 * layernorm_bwd of core/backend/backend.h) and RMSNorm (rmsnorm_fwd, rmsnorm_bwd), which share
 * their kernels' shape: one warp per row, statistics in fp32; the weight gradients (accumulated)
 * from per-chunk partials summed in chunk order.
 */
#ifndef CT_CUDA_LAYERNORM_CUH
#define CT_CUDA_LAYERNORM_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* residual (may be NULL): inp += residual first, rounded to dt and stored (backend.h,
 * ct_layernorm_add_fwd); the same for ct_cuda_rmsnorm_fwd */
void ct_cuda_layernorm_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, float *mean, float *rstd,
                           void *inp, const void *residual, const void *w, const void *b, int64_t N,
                           int64_t C);
void ct_cuda_layernorm_bwd(ct_cuda_ctx *cx, ct_dtype dt, void *dinp, float *dw, float *db,
                           const void *dout, const void *inp, const void *w, const float *mean,
                           const float *rstd, int64_t N, int64_t C);
void ct_cuda_rmsnorm_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, float *rstd, void *inp,
                         const void *residual, const void *w, int64_t N, int64_t C, float eps);
void ct_cuda_rmsnorm_bwd(ct_cuda_ctx *cx, ct_dtype dt, void *dinp, float *dw, const void *dout,
                         const void *inp, const void *w, const float *rstd, int64_t N, int64_t C);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_LAYERNORM_CUH */
