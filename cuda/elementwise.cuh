/*
 * elementwise.cuh — what elementwise.cu gives the other kernel files and backend_cuda.c besides
 * its slots (whose launchers ct_cuda_ctx.h declares): the column sums that finish every gradient
 * summed across rows, and the single rounding of an accumulating bf16 GEMM. Both deterministic
 * (ct_cuda_ctx.h): one order, fixed by the shapes.
 */
#ifndef CT_CUDA_ELEMENTWISE_CUH
#define CT_CUDA_ELEMENTWISE_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[j] += Σ over rows r < n, in order, of partial[r·stride + j] (j < C): the column sums of
 * per-chunk partials that bias_grad, the norms' weight gradients, GELU's and attention's bias
 * gradients finish with (deterministic: one order, fixed by n). */
void ct_cuda_colsum_add(ct_cuda_ctx *cx, float *dst, const float *partial, int64_t n, int64_t C,
                        int64_t stride);
/* C(M rows of N bf16 at row stride ldc) = bf16(prod + beta·C), prod (M, N) packed fp32: the
 * single rounding that finishes an accumulating GEMM into bf16 (ct_cuda_gemm in backend_cuda.c). */
void ct_cuda_accumulate_rounded(ct_cuda_ctx *cx, void *C, int64_t ldc, const float *prod,
                                float beta, int64_t M, int64_t N);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_ELEMENTWISE_CUH */
