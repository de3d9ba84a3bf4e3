/*
 * gelu.cuh — GELU (tanh form) forward and backward on the CUDA backend (the slots gelu_fwd and
 * gelu_bwd of core/backend/backend.h); the backward also sums the bias gradient of the layer before
 * it when dbias is not NULL.
 */
#ifndef CT_CUDA_GELU_CUH
#define CT_CUDA_GELU_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void ct_cuda_gelu_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, const void *inp, int64_t n);
void ct_cuda_gelu_bwd(ct_cuda_ctx *cx, ct_dtype dt, void *dinp, float *dbias, const void *inp,
                      const void *dout, int64_t N, int64_t C);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_GELU_CUH */
