/*
 * adamw.cuh — the fused AdamW update over a flat range with weight-decay segments, and the
 * squared-norm partial sum of the gradient-norm computation, on the CUDA backend (the slots
 * adamw and sumsq of core/backend/backend.h).
 */
#ifndef CT_CUDA_ADAMW_CUH
#define CT_CUDA_ADAMW_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void ct_cuda_adamw(ct_cuda_ctx *cx, float *param, const float *grad, float *m, float *v,
                   const ct_adamw_segment *segments, int n_segments, const ct_adamw_hparams *hp,
                   void *param_copy, ct_dtype copy_dtype);
void ct_cuda_sumsq(ct_cuda_ctx *cx, float *out, const float *const *x, const int64_t *n, int count);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_ADAMW_CUH */
