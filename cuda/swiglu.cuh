/*
 * swiglu.cuh — SwiGLU, Llama's MLP activation, on the CUDA backend (the slots swiglu_fwd and
 * swiglu_bwd of core/backend/backend.h).
 */
#ifndef CT_CUDA_SWIGLU_CUH
#define CT_CUDA_SWIGLU_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void ct_cuda_swiglu_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, const void *gate, const void *up,
                        int64_t N, int64_t H, int64_t ld);
void ct_cuda_swiglu_bwd(ct_cuda_ctx *cx, ct_dtype dt, void *dgate, void *dup, const void *gate,
                        const void *up, const void *dout, int64_t N, int64_t H, int64_t ld);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_SWIGLU_CUH */
