/*
 * elementwise.cuh — fill, bias and residual adds, axpy, scale and dtype casts on the CUDA backend
 * (the slots fill, bias_add, bias_init, bias_grad, axpy, scale, cast and cast_cols of
 * core/backend/backend.h).
 * The element-wise ops are one grid-stride kernel each; bias_grad sums rows in fixed-size row
 * chunks whose partials a second kernel adds in chunk order (deterministic, ct_cuda_ctx.h).
 */
#ifndef CT_CUDA_ELEMENTWISE_CUH
#define CT_CUDA_ELEMENTWISE_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void ct_cuda_fill(ct_cuda_ctx *cx, void *dst, ct_dtype dtype, int64_t n, float value);
void ct_cuda_bias_add(ct_cuda_ctx *cx, ct_dtype dt, void *out, const void *bias, int64_t N,
                      int64_t C);
void ct_cuda_bias_init(ct_cuda_ctx *cx, ct_dtype dt, void *out, const void *bias,
                       const void *residual, int64_t N, int64_t C);
void ct_cuda_bias_grad(ct_cuda_ctx *cx, ct_dtype dt, float *dbias, const void *dout, int64_t N,
                       int64_t C);
/* dst[j] += Σ over rows r < n, in order, of partial[r·stride + j] (j < C): the column sums of
 * per-chunk partials that bias_grad, the norms' weight gradients, GELU's and attention's bias
 * gradients finish with (deterministic: one order, fixed by n). */
void ct_cuda_colsum_add(ct_cuda_ctx *cx, float *dst, const float *partial, int64_t n, int64_t C,
                        int64_t stride);
void ct_cuda_axpy(ct_cuda_ctx *cx, ct_dtype dt, void *dst, const void *src, float alpha, int64_t n);
void ct_cuda_scale(ct_cuda_ctx *cx, ct_dtype dt, void *x, float s, int64_t n);
/* C(M rows of N bf16 at row stride ldc) = bf16(prod + beta·C), prod (M, N) packed fp32: the
 * single rounding that finishes an accumulating GEMM into bf16 (cuda_gemm in backend_cuda.c). */
void ct_cuda_accumulate_rounded(ct_cuda_ctx *cx, void *C, int64_t ldc, const float *prod,
                                float beta, int64_t M, int64_t N);
void ct_cuda_cast(ct_cuda_ctx *cx, void *dst, ct_dtype dst_dtype, const void *src,
                  ct_dtype src_dtype, int64_t n);
/* Columns of rows: dst (rows, ·; row stride ld_dst) = src (row stride ld_src), cols elements a
 * row, converted as by ct_cuda_cast (the slot cast_cols). */
void ct_cuda_cast_cols(ct_cuda_ctx *cx, void *dst, ct_dtype dst_dtype, int64_t ld_dst,
                       const void *src, ct_dtype src_dtype, int64_t ld_src, int64_t rows,
                       int64_t cols);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_ELEMENTWISE_CUH */
