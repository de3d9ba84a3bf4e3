/*
 * gemm_onednn.h — row-major GEMMs on the CPU through oneDNN's matmul primitive: bf16 inputs with
 * fp32 accumulation (the path that uses AMX / AVX512-BF16 where the CPU has them), and fp32. Also
 * the check for native bf16 multiply support, so a caller can decide whether bf16 is worth it.
 *
 * Semantics are cblas_sgemm's, row-major: C(M,N) = alpha·op(A)·op(B) + beta·C, op(X) = X^T when
 * trans_x; lda/ldb/ldc are row strides, in elements, of the matrices as stored (a transposed
 * operand is described to oneDNN by swapped strides: nothing is copied).
 *
 * Invariants:
 *   - Accumulation is fp32 whatever the input and output types. bf16 values are uint16_t holding
 *     the upper half of the fp32 bit pattern (common.h); a bf16 output is rounded to nearest even.
 *   - beta == 0 never reads C (it may hold NaN); alpha == 0 or K == 0 never reads A or B.
 *   - Primitives are created once per distinct (transposes, M, N, K, lda, ldb, ldc, dtypes,
 *     alpha, beta, thread count) and cached: creation costs far more than a small execution.
 *     alpha and beta are part of the key because oneDNN 2.x fixes output scales and the sum
 *     post-op at creation; the thread count because oneDNN blocks the work for the thread count
 *     it sees at creation. Each call binds the caller's pointers to cached memory objects.
 *   - Not thread-safe (ct_cpu_gemm_serial is): one caller thread at a time (the cache and the
 *     stream are global). The work itself runs on the OpenMP pool (libgomp, the one our loops and
 *     OpenBLAS use) with omp_get_max_threads() threads: the caller sets the count with
 *     omp_set_num_threads().
 *   - A oneDNN failure after initialisation (an unsupported combination, out of memory inside
 *     oneDNN) is treated as a bug: it prints the call and oneDNN's status, then aborts.
 *     ONEDNN_VERBOSE=1 in the environment makes oneDNN print every creation and execution.
 */
#ifndef CT_CPU_GEMM_ONEDNN_H
#define CT_CPU_GEMM_ONEDNN_H

#include "core/common.h"

/* Creates the oneDNN CPU engine and stream unless they exist. Returns false (and records a
 * ct_error with a hint) when oneDNN cannot create them. The other functions call it lazily;
 * calling it first only moves the cost (and the failure) to a moment of the caller's choosing. */
bool ct_cpu_gemm_init(void);

/* Frees every cached primitive and memory object, the stream and the engine. Safe to call when
 * never initialised, and more than once; a later GEMM initialises again. */
void ct_cpu_gemm_release(void);

/*
 * C(M,N) = alpha·op(A)·op(B) + beta·C, row-major (see the top of this file). op(A) is (M, K):
 * A is stored (M, K) with lda >= K, or (K, M) with lda >= M when trans_a. op(B) is (K, N): B is
 * stored (K, N) with ldb >= N, or (N, K) with ldb >= K when trans_b. ldc >= N.
 * ab_dtype is CT_DTYPE_F32 or CT_DTYPE_BF16 (A and B share it); c_dtype is CT_DTYPE_F32, or
 * CT_DTYPE_BF16 with bf16 inputs only. M, N, K >= 0 (M or N == 0 does nothing). Aborts on a
 * broken precondition and on a oneDNN failure.
 */
void ct_cpu_gemm_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C,
                        int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype);

/*
 * The same (the same dtypes), run on the calling thread alone, for a caller that runs several at
 * once from its own OpenMP parallel region (the CPU backend's GEMM tiles). Unlike
 * ct_cpu_gemm_onednn it is thread-safe: the cache is looked up under a lock, each call makes its
 * own stream and memory objects, and each thread number has its own scratchpad. The primitive is
 * created for one thread whatever the caller's count, so its blocking, and the order of every
 * element's sum, follow from the shape alone. Needs ct_cpu_gemm_init() first (it is not
 * thread-safe), and a caller outside any parallel region or in the outermost one (a thread
 * number names a scratchpad); M, N, K > 0 and alpha != 0 (the caller handles BLAS's empties).
 */
void ct_cpu_gemm_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C,
                        int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype);
/*
 * The name of the oneDNN implementation that runs this shape with dense operands (lda, ldb, ldc
 * the row widths), alpha 1, beta 0 and fp32 output at the current thread count, e.g.
 * "brg:avx512_core_bf16" or "gemm:jit"; for reports. Creates and caches that primitive if it is
 * not cached. The string lives until ct_cpu_gemm_release(). Returns "unavailable" when oneDNN
 * cannot be initialised or the shape is empty.
 */
const char *ct_cpu_gemm_impl(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                             ct_dtype ab_dtype);

/* Number of primitives in the cache (for tests and reports: a repeated shape must not add one). */
int ct_cpu_gemm_cache_size(void);

/*
 * True when the CPU multiplies bf16 natively and the OS lets us use it: AMX-BF16 (CPUID.7.0:EDX
 * bit 22, with the AMX tile state enabled in XCR0) or AVX512_BF16 (CPUID.7.1:EAX bit 5), with the
 * AVX-512 state enabled in XCR0 (bits 1, 2, 5, 6, 7). Without native support oneDNN still
 * computes bf16 GEMMs, but by emulation, slower than fp32.
 * The environment overrides the detection: COOKTRAIN_CPU_BF16=0 forces false, =1 forces true;
 * other values are ignored. Writes a short explanation into what (cap bytes, may be NULL/0),
 * e.g. "avx512_bf16", "amx_bf16 + avx512_bf16", "no native bf16 (avx512_bf16/amx_bf16 absent)",
 * "forced off by COOKTRAIN_CPU_BF16=0".
 */
bool ct_cpu_has_native_bf16(char *what, size_t cap);

#endif /* CT_CPU_GEMM_ONEDNN_H */
