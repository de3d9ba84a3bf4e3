/*
 * gemm.c — the CPU backend's GEMM slot (cpu.h): C in fixed tiles, each one single-threaded GEMM
 * in oneDNN (gemm_onednn.h) or, for fp32 with COOKTRAIN_CPU_SGEMM=openblas, OpenBLAS.
 */
#include "core/backend/cpu/cpu.h"
#include "core/backend/cpu/gemm_onednn.h"
#include <cblas.h>

/* How ct_cpu_gemm tiles an M x N x K product: blocks of GEMM_ROW_BLOCK rows, and when there are
 * fewer than GEMM_MIN_TILES of them (the weight gradient of a layer whose output is the model
 * width: one block at d = 256 ran on one of two threads, at half the rate), each split into
 * n_col column pieces of `cols` (a multiple of 16 floats), so that there are at least
 * GEMM_MIN_TILES tiles and a multiple of 4 (even over 1, 2 and 4 threads), each at least
 * GEMM_MIN_COLS wide. A product under GEMM_SPLIT_MIN_MACS multiply-adds is not worth the split.
 * A function of the shape alone: never of the thread count. */
gemm_tiling ct_cpu_gemm_tiles(int64_t M, int64_t N, int64_t K) {
    gemm_tiling t = {.n_row = (M + GEMM_ROW_BLOCK - 1) / GEMM_ROW_BLOCK, .n_col = 1, .cols = N};
    if (t.n_row >= GEMM_MIN_TILES || (double)M * (double)N * (double)K < GEMM_SPLIT_MIN_MACS)
        return t;
    const int64_t most = CT_MAX(1, N / GEMM_MIN_COLS);
    while (t.n_col < most && (t.n_row * t.n_col < GEMM_MIN_TILES || t.n_row * t.n_col % 4 != 0))
        t.n_col++;
    t.cols = round_up((N + t.n_col - 1) / t.n_col, 16);
    t.n_col = (N + t.cols - 1) / t.cols;
    return t;
}

void ct_cpu_gemm(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                 void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    cpu_ctx *c = ctx;
    if (M == 0 || N == 0) return;
    const bool openblas = !c->sgemm_onednn && ab_dtype == CT_DTYPE_F32 && c_dtype == CT_DTYPE_F32;
    CT_ASSERTF(!openblas || (M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX &&
                             lda <= INT32_MAX && ldb <= INT32_MAX && ldc <= INT32_MAX),
               "cpu gemm: %lld x %lld x %lld exceeds the 32-bit BLAS interface", (long long)M,
               (long long)N, (long long)K);
    if (K == 0 || alpha == 0.0f) {
        /* op(A)·op(B) is empty or not asked for: C = beta·C, with beta = 0 meaning "overwrite"
         * as in BLAS. ct_cpu_gemm_onednn does that itself, reading neither A nor B nor oneDNN. */
        ct_cpu_gemm_onednn(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_dtype,
                           c_dtype);
        return;
    }
    /* C in fixed tiles, each one single-threaded GEMM, the tiles spread over the threads: oneDNN's
     * matmul (ct_cpu_gemm_serial, created for one thread) or, for fp32 with
     * COOKTRAIN_CPU_SGEMM=openblas, cblas_sgemm (OpenBLAS runs single-threaded inside our parallel
     * region). A library's own threading splits the work by the thread count: OpenBLAS splits C,
     * and its kernels treat the edge rows and columns of a piece with other micro-kernels whose
     * sums run in another order (measured on an EPYC where it picks its Haswell kernels, 1 and 3
     * threads disagreed in 10% of the elements of a 333x517x200 product); oneDNN splits K when C
     * is small (bf16 64x64x16384 on the EPYC: 68% of the elements differed between 1 and 2
     * threads). With tiles fixed by the shape alone, every element's sum is the same for any
     * thread count (the top of this file). Each tile re-packs its rows of op(A) and its columns
     * of op(B), ~1/GEMM_ROW_BLOCK + 1/cols of its arithmetic. */
    const gemm_tiling t = ct_cpu_gemm_tiles(M, N, K);
    const int64_t n_tiles = t.n_row * t.n_col;
    const size_t ab_size = ct_dtype_size(ab_dtype), c_size = ct_dtype_size(c_dtype);
    CT_PRAGMA(omp parallel for schedule(static) num_threads(CT_MIN(c->n_threads, n_tiles)))
    for (int64_t tile = 0; tile < n_tiles; tile++) {
        const int64_t i0 = tile / t.n_col * GEMM_ROW_BLOCK, j0 = tile % t.n_col * t.cols;
        const int64_t rows = CT_MIN(GEMM_ROW_BLOCK, M - i0), cols = CT_MIN(t.cols, N - j0);
        /* row i of op(A) is row i of A, or column i of A when transposed; column j of op(B) is
         * column j of B, or row j of B when transposed */
        const char *a = (const char *)A + (size_t)(trans_a ? i0 : i0 * lda) * ab_size;
        const char *b = (const char *)B + (size_t)(trans_b ? j0 * ldb : j0) * ab_size;
        char *ct = (char *)C + (size_t)(i0 * ldc + j0) * c_size;
        if (openblas)
            cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                        trans_b ? CblasTrans : CblasNoTrans, (int)rows, (int)cols, (int)K, alpha,
                        (const float *)a, (int)lda, (const float *)b, (int)ldb, beta, (float *)ct,
                        (int)ldc);
        else
            ct_cpu_gemm_serial(trans_a, trans_b, rows, cols, K, alpha, a, lda, b, ldb, beta, ct,
                               ldc, ab_dtype, c_dtype);
    }
}
