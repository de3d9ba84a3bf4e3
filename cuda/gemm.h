/*
 * gemm.h — the CUDA backend's GEMM (the `gemm` slot of core/backend/backend.h): cuBLASLt first,
 * cuBLAS's cublasGemmEx where cuBLASLt has no algorithm; and the `gemm_grouped` slot's many GEMMs
 * in one cublasGemmGroupedBatchedEx call (ct_cublas_gemm_grouped). Host code, C; the same file
 * links against the real libraries (-lcublasLt -lcublas -lcudart) and against the CPU stand-ins of
 * the emulated build (cuda/emu/cublas_emu.cc, cuda/emu/), which follow the libraries' documented
 * semantics. Its functions are ct_cublas_gemm*; the slots themselves (ct_cuda_gemm and the two
 * optional GEMM slots, backend_cuda.c) call them.
 *
 * Semantics are the CPU backend's (core/backend/cpu/gemm_onednn.h), row-major:
 *     C(M,N) = alpha·op(A)·op(B) + beta·C,   op(X) = X^T when trans_x,
 * lda/ldb/ldc are row strides in elements of the matrices as stored. A and B hold ab_dtype
 * (CT_DTYPE_F32 or CT_DTYPE_BF16), C holds c_dtype: f32/f32, bf16/f32 or bf16/bf16.
 *
 * Invariants:
 *   - Products accumulate in fp32 (CUBLAS_COMPUTE_32F). fp32 inputs stay fp32: TF32 is never
 *     allowed (CUBLAS_COMPUTE_32F, not _FAST_TF32; the cuBLAS handle in CUBLAS_DEFAULT_MATH), so
 *     fp32 training compares with the CPU backend to accumulation-order rounding. Split-K
 *     partial sums are reduced in fp32, never in a bf16 output (reduction-scheme mask for
 *     cuBLASLt, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION for cuBLAS).
 *   - beta == 0 never reads C (it may hold NaN). K == 0 or alpha == 0 never reads A or B: C becomes
 *     beta·C (zero when beta == 0).
 *   - All pointers are device memory; the work is queued on the context's stream and is ordered
 *     like any kernel on it (the call returns before the result exists).
 *   - cuBLASLt descriptors, layouts and the heuristic's algorithm are made once per distinct
 *     (transposes, M, N, K, lda, ldb, ldc, dtypes, alignment of each pointer up to 256 bytes) and
 *     cached in the context: creating them costs far more than a small GEMM. alpha and beta are
 *     host scalars passed at each call, not part of the key.
 *   - When the heuristic offers no algorithm (in practice: a pointer or a leading dimension in
 *     bytes that is not a multiple of 16) the GEMM runs through cublasGemmEx, with the same
 *     semantics; ct_cublas_gemm_fallbacks() counts those calls.
 *   - Every CUDA, cuBLAS and cuBLASLt call is checked: a failure prints the call and the
 *     library's error and ends the process with exit code 1 (cuda/ct_cuda_check.h). A broken
 *     precondition (bad dtype pair, ld too small) is a bug: CT_ASSERT.
 *   - Not thread-safe: one caller thread per context (the cache is unlocked).
 */
#ifndef CT_CUDA_GEMM_H
#define CT_CUDA_GEMM_H

#include <cuda_runtime_api.h>

#include "core/common.h"

typedef struct ct_cublas_gemm_ctx ct_cublas_gemm_ctx;

/* Creates the cuBLASLt handle, a cuBLAS handle bound to `stream` for the fallback, and a 32 MiB
 * device workspace (cuBLASLt's split-K and stream-K algorithms need one). Every GEMM of this
 * context runs on `stream`. Exits through CT_CUDA_CHECK when there is no usable device. */
ct_cublas_gemm_ctx *ct_cublas_gemm_new(cudaStream_t stream);

/* Destroys the cached descriptors, the handles and the workspace. Accepts NULL. The caller makes
 * sure no GEMM of this context is still running (the workspace is freed). */
void ct_cublas_gemm_free(ct_cublas_gemm_ctx *g);

/*
 * C(M,N) = alpha·op(A)·op(B) + beta·C on the context's stream (see the top of this file). op(A)
 * is (M, K): A is stored (M, K) with lda >= K, or (K, M) with lda >= M when trans_a. op(B) is
 * (K, N): B is stored (K, N) with ldb >= N, or (N, K) with ldb >= K when trans_b. ldc >= N.
 * M, N, K >= 0; M or N == 0 does nothing.
 */
void ct_cublas_gemm(ct_cublas_gemm_ctx *g, bool trans_a, bool trans_b, int64_t M, int64_t N,
                    int64_t K, float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                    float beta, void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype);

/*
 * The forward of a linear layer followed by GELU, in one cuBLASLt call with the epilogue
 * CUBLASLT_EPILOGUE_GELU_AUX_BIAS (row-major, as everything here):
 *     pre(M,N) = A(M,K)·B(N,K)ᵀ + bias(N)     (the pre-activation, which GELU's backward reads)
 *     out(M,N) = GELU(pre)                     (tanh form, from pre's fp32 value before rounding)
 * A, B, bias, pre and out all hold dt (f32 or bf16); products accumulate in fp32 (no TF32).
 * lda, ldb >= K, ldpre, ldout >= N, row strides in elements; the library also wants ldpre a
 * multiple of 8 and 16-byte-aligned bias and pre.
 * Returns true when the work is queued (or M or N == 0: nothing to do). Returns false, having
 * queued nothing, when cuBLASLt offers no algorithm for the epilogue (alignment, or a GPU or
 * type without it) — counted in ct_cublas_gemm_fallbacks — or when K == 0 (not counted): the
 * caller then computes the same thing with bias init, ct_cublas_gemm (beta = 1) and its GELU
 * kernel. The plan is cached like a plain GEMM's (the key adds ldpre and the alignments of bias
 * and pre); the bias and pre pointers are bound at each call.
 */
bool ct_cublas_gemm_bias_gelu(ct_cublas_gemm_ctx *g, int64_t M, int64_t N, int64_t K, const void *A,
                              int64_t lda, const void *B, int64_t ldb, const void *bias, void *pre,
                              int64_t ldpre, void *out, int64_t ldout, ct_dtype dt);

/* The same without GELU (the epilogue CUBLASLT_EPILOGUE_BIAS): out(M,N) = A(M,K)·B(N,K)ᵀ + bias(N),
 * the bias added to the fp32 product before the one rounding to dt: a linear layer's forward
 * without the second pass an accumulating (beta = 1) bf16 GEMM costs (backend_cuda.c). Same
 * return values; the caller's fallback is bias init and ct_cublas_gemm with beta = 1. */
bool ct_cublas_gemm_bias(ct_cublas_gemm_ctx *g, int64_t M, int64_t N, int64_t K, const void *A,
                         int64_t lda, const void *B, int64_t ldb, const void *bias, void *out,
                         int64_t ldout, ct_dtype dt);

/*
 * count independent GEMMs in one cublasGemmGroupedBatchedEx call (cuBLAS 12.5+), one group each
 * (group_size 1), with ct_cublas_gemm's semantics (fp32 accumulation, CUBLAS_COMPUTE_32F, no TF32,
 * the same row-major to column-major mapping as its cublasGemmEx fallback). GEMM i: M = mnk[3i],
 * N = mnk[3i+1], K = mnk[3i+2], all > 0; A = ptrs[3i], B = ptrs[3i+1], C = ptrs[3i+2], device
 * pointers to contiguous row-major operands: lda = trans_a ? M : K, ldb = trans_b ? K : N,
 * ldc = N. C = alpha·op(A)·op(B) + beta·C, beta == 0 never reads C. Every dimension and leading
 * dimension must fit an int (asserted). mnk and ptrs are the caller's host arrays, read before
 * the call returns: it may free or reuse them at once.
 * The call reads its A/B/C pointer arrays from device memory when it runs: they are staged in a
 * pinned host buffer of the context (a few slots, reused in turn) and copied with
 * cudaMemcpyAsync on the stream into a device buffer of the context (both grown as needed); a
 * slot is rewritten only after the copy that last read it has run (gemm.c says why).
 * Returns true when the work is queued. Returns false, having queued nothing, where the grouped
 * call is not the right tool and the caller runs the GEMMs one by one (ct_cublas_gemm) instead:
 * bf16 A and B into an fp32 C (cublasGemmGroupedBatchedEx documents CUBLAS_COMPUTE_32F only for
 * f32 -> f32 and bf16 -> bf16), and bf16 operands any of which is not 16-byte aligned (its
 * documented alignment rule for 16-bit types; ct_cublas_gemm has its own fallback for those).
 */
bool ct_cublas_gemm_grouped(ct_cublas_gemm_ctx *g, int count, bool trans_a, bool trans_b,
                            const int64_t *mnk, float alpha, void *const *ptrs, float beta,
                            ct_dtype ab_dtype, ct_dtype c_dtype);

/* How many GEMMs ran through the cublasGemmEx fallback (cuBLASLt offered no algorithm), plus
 * the ct_cublas_gemm_bias_gelu and ct_cublas_gemm_bias calls that returned false for that reason.
 */
int64_t ct_cublas_gemm_fallbacks(const ct_cublas_gemm_ctx *g);

/* How many distinct GEMM configurations are cached (a repeated call must not add one). */
int ct_cublas_gemm_cache_size(const ct_cublas_gemm_ctx *g);

#endif /* CT_CUDA_GEMM_H */
