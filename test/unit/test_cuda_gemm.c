/*
 * test_cuda_gemm.c — the CUDA backend's GEMM (cuda/gemm.h) against a naive row-major float64 GEMM
 * on the same inputs: fp32 and bf16 inputs, fp32 and bf16 outputs, every transpose combination,
 * odd shapes (M, N, K not multiples of 8 or 16), leading dimensions above the minimum, alpha and
 * beta (beta 0 on a NaN C), K == 0 and alpha == 0, the descriptor cache, and the cublasGemmEx
 * fallback taken for a leading dimension or a pointer that is not 16-byte aligned; the
 * bias-GELU epilogue (ct_cublas_gemm_bias_gelu: pre-activation and GELU output, its refusals); and
 * the grouped call (ct_cublas_gemm_grouped) behind the backend wrapper ct_gemm_grouped, in Mixture
 * of Experts' three shapes, against the same GEMMs one by one and the CPU backend.
 *
 * Built twice from this one file (cuda/cublas.mk):
 *   $(BUILD)/test/test_cuda_gemm        emulated (-DCT_CUDA_EMU): cuda/gemm.c linked with the
 *                                       cuBLAS(Lt) stand-ins (cuda/emu/cublas_emu.cc) and the
 *                                       emulator (cuda/emu/); part of `make test`. It also tests
 *                                       the stand-ins' own contract (test_emu_*): epilogues,
 *                                       batches, ld < rows, host pointers, heuristic alignment.
 *   $(BUILD)/cuda-real/test_cuda_gemm   real: the same code against libcublasLt/libcublas/
 *                                       libcudart. On a GPU it runs the GEMM cases for real; on a
 *                                       machine without one it exits 1 at the first CUDA call with
 *                                       CT_CUDA_CHECK's message (the link check of the real build).
 *
 * Run by name:  ./test_cuda_gemm test_fallback_ld   (a cmocka filter; wildcards allowed)
 * TEST_CUDA_GEMM_VERBOSE=1 prints how much of the tolerance each case uses.
 *
 * Tolerance. The reference works on exactly the values the GEMM sees (bf16 inputs are rounded
 * first and read back as floats), so only the GEMM's own rounding remains. With u = 2^-24, an fp32
 * sum of K products (each exact in fp32 for bf16 inputs, rounded once for fp32 ones), scaled by
 * alpha and added to beta·C, is off by at most
 *     e_acc = (K + 2)·u·(|alpha|·Σ_k |a_ik·b_kj| + |beta·c_ij|)
 * in any summation order (γ_{K+2} for recursive summation; blocked or split-K sums are tighter).
 * A bf16 output is then rounded to nearest, which adds at most 2^-9 of the value; we allow 2^-8:
 *     tol = 2·e_acc + (bf16 C ? 2^-8·|ref| : 0),
 * the factor 2 covering second-order terms. TF32 (a 10-bit mantissa, u = 2^-11) would break the
 * fp32 bound by orders of magnitude, which is how a TF32 compute type is caught; a wrong operand
 * order, stride or transpose gives errors of the order of the values (~1). NaN or Inf anywhere
 * fails. Every padding element of A and B holds NaN, so reading padding shows up as NaN; C's
 * padding must come back bit-identical.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "core/backend/backend.h"
#include "core/common.h"
#include "cuda/ct_cuda_check.h"
#include "cuda/gemm.h"
#include "test/unit/cuda_test_util.h"

#ifdef CT_CUDA_EMU
#include <cublasLt.h>
#include <cublas_v2.h>
#endif

static bool verbose;
static cudaStream_t stream;
static ct_cublas_gemm_ctx *gemm;

/* ---- helpers -------------------------------------------------------------------------------- */

/* uniform in [-1, 1): cuda_test_util.h's splitmix64, from the state setup() gives it */
static float urand(void) {
    return cuda_test_urand(-1.0f, 1.0f);
}

/* A stored row-major matrix: rows × cols with row stride ld, in dtype, on the host (data) and on
 * the device (dev, `offset` elements into its allocation: an offset makes the pointer
 * misaligned), plus its values as floats (what the GEMM sees). Padding holds NaN. */
typedef struct mat {
    int64_t rows, cols, ld;
    ct_dtype dtype;
    void *data, *dev_base, *dev;
    float *val;
} mat;

static size_t mat_bytes(const mat *m) {
    return (size_t)(m->rows * m->ld) * ct_dtype_size(m->dtype);
}

static mat mat_new(int64_t rows, int64_t cols, int64_t ld, ct_dtype dtype, bool nan_fill,
                   int64_t offset) {
    mat m = {rows, cols, ld, dtype, NULL, NULL, NULL, NULL};
    size_t n = (size_t)(rows * ld), es = ct_dtype_size(dtype);
    m.data = malloc((n ? n : 1) * es);
    m.val = malloc((n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < ld; j++) {
            float v = (j < cols && !nan_fill) ? urand() : NAN;
            size_t at = (size_t)(i * ld + j);
            if (dtype == CT_DTYPE_BF16) {
                uint16_t h = ct_f32_to_bf16(v);
                ((uint16_t *)m.data)[at] = h;
                m.val[at] = ct_bf16_to_f32(h);
            } else {
                ((float *)m.data)[at] = v;
                m.val[at] = v;
            }
        }
    CT_CUDA_CHECK(cudaMalloc(&m.dev_base, (n + (size_t)offset) * es + 1));
    m.dev = (char *)m.dev_base + (size_t)offset * es;
    CT_CUDA_CHECK(cudaMemcpyAsync(m.dev, m.data, mat_bytes(&m), cudaMemcpyHostToDevice, stream));
    CT_CUDA_CHECK(cudaStreamSynchronize(stream));
    return m;
}

static void mat_free(mat *m) {
    CT_CUDA_CHECK(cudaFree(m->dev_base));
    free(m->data), free(m->val);
}

/* Copies the device matrix back into m->data, after the stream's work. */
static void mat_download(mat *m) {
    CT_CUDA_CHECK(cudaMemcpyAsync(m->data, m->dev, mat_bytes(m), cudaMemcpyDeviceToHost, stream));
    CT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

static float mat_get(const mat *m, size_t at) {
    return m->dtype == CT_DTYPE_BF16 ? ct_bf16_to_f32(((const uint16_t *)m->data)[at])
                                     : ((const float *)m->data)[at];
}

static int64_t round_up(int64_t v, int64_t to) {
    return (v + to - 1) / to * to;
}

/* Whether the fallback counter is checked. The stand-in's heuristic refuses exactly the
 * misalignments below; the real one may find an algorithm for some of them, so on a GPU only
 * the results are checked. */
#ifdef CT_CUDA_EMU
#define CHECK_FALLBACKS 1
#else
#define CHECK_FALLBACKS 0
#endif

/* Which route a case must take. */
typedef enum route { ROUTE_LT, ROUTE_FALLBACK, ROUTE_ANY } route;

/* One GEMM case. pad_* are added to the row widths to make the leading dimensions; with
 * align16, each leading dimension is then rounded up to a multiple of 16 bytes (the cuBLASLt
 * route). off_* shift the device pointers by whole elements. */
typedef struct gemm_case {
    bool ta, tb;
    int64_t M, N, K;
    int64_t pad_a, pad_b, pad_c;
    float alpha, beta;
    ct_dtype ab, c;
    bool align16;
    int64_t off_a, off_b, off_c;
    route expect;
} gemm_case;

static const char *route_name(route r) {
    return r == ROUTE_LT ? "cuBLASLt" : r == ROUTE_FALLBACK ? "cublasGemmEx" : "any";
}

/* Runs the case through ct_cublas_gemm and compares with the float64 reference (tolerance at the
 * top of the file). Returns the worst error / tolerance ratio; fails on any violation. */
static double run_case(const gemm_case *g) {
    const int64_t M = g->M, N = g->N, K = g->K;
    int64_t a_rows = g->ta ? K : M, a_cols = g->ta ? M : K;
    int64_t b_rows = g->tb ? N : K, b_cols = g->tb ? K : N;
    int64_t lda = a_cols + g->pad_a, ldb = b_cols + g->pad_b, ldc = N + g->pad_c;
    if (g->align16) {
        lda = round_up(lda, 16 / (int64_t)ct_dtype_size(g->ab));
        ldb = round_up(ldb, 16 / (int64_t)ct_dtype_size(g->ab));
        ldc = round_up(ldc, 16 / (int64_t)ct_dtype_size(g->c));
    }
    mat A = mat_new(a_rows, a_cols, lda, g->ab, false, g->off_a);
    mat B = mat_new(b_rows, b_cols, ldb, g->ab, false, g->off_b);
    /* beta == 0 must not read C: it starts as NaN. */
    mat C = mat_new(M, N, ldc, g->c, g->beta == 0.0f, g->off_c);
    void *c_before = malloc(mat_bytes(&C) + 1);
    memcpy(c_before, C.data, mat_bytes(&C));

    int64_t fallbacks = ct_cublas_gemm_fallbacks(gemm);
    ct_cublas_gemm(gemm, g->ta, g->tb, M, N, K, g->alpha, A.dev, lda, B.dev, ldb, g->beta, C.dev,
                   ldc, g->ab, g->c);
    mat_download(&C);
    int64_t took = ct_cublas_gemm_fallbacks(gemm) - fallbacks;
    if (CHECK_FALLBACKS && g->expect != ROUTE_ANY && took != (g->expect == ROUTE_FALLBACK ? 1 : 0))
        fail_msg("ta=%d tb=%d M=%lld N=%lld K=%lld %s->%s lda=%lld ldb=%lld ldc=%lld offsets "
                 "%lld/%lld/%lld: expected the %s route, fallback counter moved by %lld",
                 g->ta, g->tb, (long long)M, (long long)N, (long long)K, ct_dtype_name(g->ab),
                 ct_dtype_name(g->c), (long long)lda, (long long)ldb, (long long)ldc,
                 (long long)g->off_a, (long long)g->off_b, (long long)g->off_c,
                 route_name(g->expect), (long long)took);

    const double u = ldexp(1.0, -24), u_bf16 = ldexp(1.0, -8);
    double worst = 0.0;
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double sum = 0.0, abs_sum = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double a = g->ta ? A.val[k * lda + i] : A.val[i * lda + k];
                double b = g->tb ? B.val[j * ldb + k] : B.val[k * ldb + j];
                sum += a * b;
                abs_sum += fabs(a * b);
            }
            double c0 = g->beta == 0.0f ? 0.0 : (double)C.val[i * ldc + j];
            double ref = (double)g->alpha * sum + (double)g->beta * c0;
            double e_acc = (double)(K + 2) * u *
                           (fabs((double)g->alpha) * abs_sum + fabs((double)g->beta * c0));
            double tol = 2.0 * e_acc + (g->c == CT_DTYPE_BF16 ? u_bf16 * fabs(ref) : 0.0);
            double got = mat_get(&C, (size_t)(i * ldc + j));
            double err = fabs(got - ref);
            if (!isfinite(got) || !(err <= tol))
                fail_msg("ta=%d tb=%d M=%lld N=%lld K=%lld %s->%s alpha=%g beta=%g lda=%lld "
                         "ldb=%lld ldc=%lld (%s route): C[%lld][%lld] = %.9g, want %.9g (error "
                         "%.3g, tolerance %.3g)",
                         g->ta, g->tb, (long long)M, (long long)N, (long long)K,
                         ct_dtype_name(g->ab), ct_dtype_name(g->c), (double)g->alpha,
                         (double)g->beta, (long long)lda, (long long)ldb, (long long)ldc,
                         took ? "fallback" : "cuBLASLt", (long long)i, (long long)j, got, ref, err,
                         tol);
            if (tol > 0 && err / tol > worst) worst = err / tol;
        }
        size_t es = ct_dtype_size(g->c);
        for (int64_t j = N; j < ldc; j++) {
            size_t at = (size_t)(i * ldc + j) * es;
            if (memcmp((char *)C.data + at, (char *)c_before + at, es) != 0)
                fail_msg("ta=%d tb=%d M=%lld N=%lld K=%lld: wrote C[%lld][%lld], past N (ldc %lld)",
                         g->ta, g->tb, (long long)M, (long long)N, (long long)K, (long long)i,
                         (long long)j, (long long)ldc);
        }
    }
    if (verbose)
        printf("  ta=%d tb=%d %lldx%lldx%lld lds %lld/%lld/%lld %s->%s alpha=%g beta=%g %s: "
               "%.1f%% of tolerance\n",
               g->ta, g->tb, (long long)M, (long long)N, (long long)K, (long long)lda,
               (long long)ldb, (long long)ldc, ct_dtype_name(g->ab), ct_dtype_name(g->c),
               (double)g->alpha, (double)g->beta, took ? "fallback" : "cuBLASLt", 100.0 * worst);
    free(c_before);
    mat_free(&A), mat_free(&B), mat_free(&C);
    return worst;
}

/* The three (A/B, C) dtype pairs the backend uses. */
static const ct_dtype type_pairs[3][2] = {
    {CT_DTYPE_F32, CT_DTYPE_F32},
    {CT_DTYPE_BF16, CT_DTYPE_F32},
    {CT_DTYPE_BF16, CT_DTYPE_BF16},
};

static gemm_case lt_case(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                         int t) {
    gemm_case g = {.ta = ta,
                   .tb = tb,
                   .M = M,
                   .N = N,
                   .K = K,
                   .pad_a = 3,
                   .pad_b = 5,
                   .pad_c = 2,
                   .alpha = alpha,
                   .beta = beta,
                   .ab = type_pairs[t][0],
                   .c = type_pairs[t][1],
                   .align16 = true,
                   .expect = ROUTE_LT};
    return g;
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* Odd shape, all four transposes, leading dimensions above the minimum (16-byte multiples: the
 * cuBLASLt route), every dtype pair; beta 0 on a NaN C. */
static void test_transposes_odd(void **state) {
    (void)state;
    for (int t = 0; t < 3; t++)
        for (int combo = 0; combo < 4; combo++) {
            gemm_case g = lt_case(combo & 1, combo & 2, 7, 13, 33, 1.0f, 0.0f, t);
            run_case(&g);
        }
}

/* More odd shapes, including 1-wide ones and dense lds (pad 0, rounded to 16 bytes). */
static void test_odd_shapes(void **state) {
    (void)state;
    const int64_t shapes[5][3] = {{1, 1, 1}, {1, 17, 9}, {23, 1, 31}, {5, 3, 1}, {31, 29, 47}};
    for (int s = 0; s < 5; s++)
        for (int t = 0; t < 3; t++)
            for (int combo = 0; combo < 4; combo++) {
                gemm_case g = lt_case(combo & 1, combo & 2, shapes[s][0], shapes[s][1],
                                      shapes[s][2], 1.0f, 0.0f, t);
                g.pad_a = g.pad_b = g.pad_c = 0;
                run_case(&g);
            }
}

/* Model-like shapes: the linear layer forward X·W^T, input gradient dY·W, weight gradient dY^T·X,
 * dense (128×96×64) and with a long K (32×48×768) where accumulation error is largest. */
static void test_model_shapes(void **state) {
    (void)state;
    const int64_t shapes[2][3] = {{128, 96, 64}, {32, 48, 768}};
    const bool trans[3][2] = {{false, true}, {false, false}, {true, false}};
    for (int s = 0; s < 2; s++)
        for (int p = 0; p < 3; p++)
            for (int t = 0; t < 3; t++) {
                gemm_case g = lt_case(trans[p][0], trans[p][1], shapes[s][0], shapes[s][1],
                                      shapes[s][2], 1.0f, 0.0f, t);
                g.pad_a = g.pad_b = g.pad_c = 0;
                run_case(&g);
            }
}

/* alpha ≠ 1 and beta ≠ 0 (accumulate, scaled accumulate, negative), all transposes. */
static void test_alpha_beta(void **state) {
    (void)state;
    const float ab[4][2] = {{1.0f, 1.0f}, {0.5f, 1.0f}, {-1.25f, 0.0f}, {0.75f, -0.5f}};
    for (int v = 0; v < 4; v++)
        for (int t = 0; t < 3; t++)
            for (int combo = 0; combo < 4; combo++) {
                gemm_case g = lt_case(combo & 1, combo & 2, 19, 24, 40, ab[v][0], ab[v][1], t);
                run_case(&g);
            }
}

/* A leading dimension whose byte size is not a multiple of 16 (fp32 lda = K + 1; bf16 + 1):
 * cuBLASLt has no algorithm, cublasGemmEx computes the same result. Each operand in turn, every
 * transpose, every dtype pair, beta 0 (NaN C) and beta ≠ 0. */
static void test_fallback_ld(void **state) {
    (void)state;
    for (int which = 0; which < 3; which++)
        for (int t = 0; t < 3; t++)
            for (int combo = 0; combo < 4; combo++) {
                gemm_case g =
                    lt_case(combo & 1, combo & 2, 9, 14, 21, 1.5f, which == 2 ? 0.5f : 0.0f, t);
                g.align16 = false;
                /* pads chosen so the other two stay 16-byte multiples and this one does not */
                int64_t a_cols = g.ta ? g.M : g.K, b_cols = g.tb ? g.K : g.N;
                int64_t ea = 16 / (int64_t)ct_dtype_size(g.ab),
                        ec = 16 / (int64_t)ct_dtype_size(g.c);
                g.pad_a = round_up(a_cols + 1, ea) - a_cols + (which == 0);
                g.pad_b = round_up(b_cols + 1, ea) - b_cols + (which == 1);
                g.pad_c = round_up(g.N + 1, ec) - g.N + (which == 2);
                g.expect = ROUTE_FALLBACK;
                run_case(&g);
            }
}

/* A pointer that is not 16-byte aligned (one element into the allocation), leading dimensions
 * aligned: the heuristic, told the real alignment, has no algorithm; the fallback is right. */
static void test_fallback_pointer(void **state) {
    (void)state;
    for (int which = 0; which < 3; which++)
        for (int t = 0; t < 3; t++) {
            gemm_case g =
                lt_case(which == 1, which == 0, 12, 10, 27, 1.0f, which == 2 ? 1.0f : 0.0f, t);
            g.off_a = which == 0, g.off_b = which == 1, g.off_c = which == 2;
            g.expect = ROUTE_FALLBACK;
            run_case(&g);
        }
    /* 16-byte aligned but not 256: still cuBLASLt (8 bf16 or 4 fp32 elements in). */
    for (int t = 0; t < 3; t++) {
        gemm_case g = lt_case(false, true, 12, 10, 27, 1.0f, 0.0f, t);
        g.off_a = 16 / (int64_t)ct_dtype_size(g.ab);
        g.off_c = 16 / (int64_t)ct_dtype_size(g.c);
        run_case(&g);
    }
}

/* K == 0 and alpha == 0 give beta·C without touching A or B (NaN here), as BLAS defines them;
 * beta 0 on a NaN C gives zeros; M == 0 or N == 0 does nothing. */
static void test_k_zero_alpha_zero(void **state) {
    (void)state;
    for (int t = 0; t < 3; t++) {
        ct_dtype ab = type_pairs[t][0], c = type_pairs[t][1];
        int64_t ldc = 16 / (int64_t)ct_dtype_size(c) * 2;
        mat A = mat_new(4, 5, 8, ab, true, 0), B = mat_new(5, 6, 8, ab, true, 0);
        mat C = mat_new(4, 6, ldc, c, false, 0);
        ct_cublas_gemm(gemm, false, false, 4, 6, 0, 1.0f, A.dev, 8, B.dev, 8, 0.5f, C.dev, ldc, ab,
                       c);
        float *before = malloc((size_t)(4 * ldc) * sizeof(float));
        memcpy(before, C.val, (size_t)(4 * ldc) * sizeof(float));
        mat_download(&C);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 6; j++) {
                float want = 0.5f * before[i * ldc + j];
                if (c == CT_DTYPE_BF16) want = ct_bf16_to_f32(ct_f32_to_bf16(want));
                assert_true(mat_get(&C, (size_t)(i * ldc + j)) == want);
            }
        /* transposed with ld = 0 for the K-wide operands: legal when K == 0 */
        ct_cublas_gemm(gemm, true, true, 4, 6, 0, 1.0f, A.dev, 4, B.dev, 0, 0.0f, C.dev, ldc, ab,
                       c);
        mat_download(&C);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 6; j++) assert_true(mat_get(&C, (size_t)(i * ldc + j)) == 0.0f);
        free(before);
        mat_free(&C);

        C = mat_new(4, 6, ldc, c, true, 0); /* NaN: beta 0 must not read it, even with alpha 0 */
        ct_cublas_gemm(gemm, false, false, 4, 6, 5, 0.0f, A.dev, 8, B.dev, 8, 0.0f, C.dev, ldc, ab,
                       c);
        mat_download(&C);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 6; j++) assert_true(mat_get(&C, (size_t)(i * ldc + j)) == 0.0f);
        ct_cublas_gemm(gemm, false, false, 0, 6, 5, 1.0f, A.dev, 8, B.dev, 8, 0.0f, NULL, ldc, ab,
                       c);
        ct_cublas_gemm(gemm, false, false, 4, 0, 5, 1.0f, A.dev, 8, B.dev, 8, 0.0f, NULL, ldc, ab,
                       c);
        mat_free(&A), mat_free(&B), mat_free(&C);
    }
}

/* A repeated configuration reuses its cached plan (fresh buffers at other addresses are bound,
 * not the first call's); anything in the key (ld, dtype, transposes, pointer alignment) adds one;
 * alpha and beta do not. The fallback counter counts calls, not configurations. */
static void test_cache(void **state) {
    (void)state;
    ct_cublas_gemm_free(gemm);
    gemm = ct_cublas_gemm_new(stream);
    assert_int_equal(ct_cublas_gemm_cache_size(gemm), 0);
    gemm_case g = lt_case(false, true, 33, 20, 17, 1.0f, 0.0f, 1);
    run_case(&g);
    assert_int_equal(ct_cublas_gemm_cache_size(gemm), 1);
    run_case(&g);
    run_case(&g);
    assert_int_equal(ct_cublas_gemm_cache_size(gemm), 1);
    g.beta = 1.0f, g.alpha = 0.5f;
    run_case(&g);
    assert_int_equal(ct_cublas_gemm_cache_size(gemm), 1);
    g.pad_c = 20;
    run_case(&g);
    assert_int_equal(ct_cublas_gemm_cache_size(gemm), 2);
    g.c = CT_DTYPE_BF16;
    run_case(&g);
    assert_int_equal(ct_cublas_gemm_cache_size(gemm), 3);
    g.ta = true;
    run_case(&g);
    assert_int_equal(ct_cublas_gemm_cache_size(gemm), 4);
    /* Each pointer's alignment is in the key: one element off is another plan (the fallback). */
    int64_t before = ct_cublas_gemm_fallbacks(gemm);
    for (int which = 0; which < 3; which++) {
        g.off_a = which == 0, g.off_b = which == 1, g.off_c = which == 2;
        g.expect = ROUTE_FALLBACK;
        run_case(&g);
        run_case(&g);
        assert_int_equal(ct_cublas_gemm_cache_size(gemm), 5 + which);
    }
    if (CHECK_FALLBACKS) assert_int_equal(ct_cublas_gemm_fallbacks(gemm) - before, 6);
    /* and back to aligned pointers: the cached cuBLASLt plan again */
    g.off_a = g.off_b = g.off_c = 0, g.expect = ROUTE_LT;
    run_case(&g);
    assert_int_equal(ct_cublas_gemm_cache_size(gemm), 7);
}

/* ---- the bias-GELU epilogue (ct_cublas_gemm_bias_gelu) ----------------------------------------
 */

/* GELU, tanh form, and its derivative, in double. |gelu'(x)| <= 1.13 everywhere (max ~1.129
 * near x = 2.4), so an error e in pre moves out by at most 1.13·e. */
static double gelu_d(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* One case of pre(M,N) = A(M,K)·B(N,K)ᵀ + bias(N), out = GELU(pre), all in dt, against float64.
 * Tolerances (u = 2^-24), from the top of the file:
 *   pre: 2·(K + 2)·u·(Σ|a·b| + |bias|)  (+ 2^-8·|pre| for bf16: one rounding to the output type);
 *        |bias| counts because the fallback adds it as beta·C.
 *   out: 1.13·tol_pre (pre's error through gelu', which also covers GELU computed from the
 *        rounded bf16 pre instead of the fp32 one) + 10·u·(|pre| + |out|) (GELU's own fp32
 *        evaluation: a few ulps of tanh, and 1 + tanh cancels for negative pre, where the error
 *        is relative to |pre| rather than to the small |out|) + 2^-8·|out| for bf16.
 * expect_lt: the cuBLASLt route must be taken (true) or refused (false, counted as a fallback,
 * nothing written). Padding of pre and out must come back unchanged; A's and B's is NaN. */
static void run_bias_gelu(int64_t M, int64_t N, int64_t K, ct_dtype dt, int64_t pad_pre,
                          int64_t off_bias, bool expect_lt) {
    int64_t e16 = 16 / (int64_t)ct_dtype_size(dt);
    int64_t lda = round_up(K + 3, e16), ldb = round_up(K + 1, e16);
    int64_t ldpre = round_up(N, 8) + pad_pre, ldout = round_up(N + 2, e16);
    mat A = mat_new(M, K, lda, dt, false, 0), B = mat_new(N, K, ldb, dt, false, 0);
    mat bias = mat_new(1, N, N, dt, false, off_bias);
    mat pre = mat_new(M, N, ldpre, dt, true, 0), out = mat_new(M, N, ldout, dt, true, 0);
    void *pre_before = malloc(mat_bytes(&pre)), *out_before = malloc(mat_bytes(&out));
    memcpy(pre_before, pre.data, mat_bytes(&pre));
    memcpy(out_before, out.data, mat_bytes(&out));

    int64_t fallbacks = ct_cublas_gemm_fallbacks(gemm);
    bool queued = ct_cublas_gemm_bias_gelu(gemm, M, N, K, A.dev, lda, B.dev, ldb, bias.dev, pre.dev,
                                           ldpre, out.dev, ldout, dt);
    mat_download(&pre), mat_download(&out);
    int64_t took = ct_cublas_gemm_fallbacks(gemm) - fallbacks;
    if (CHECK_FALLBACKS && (queued != expect_lt || took != (expect_lt ? 0 : 1)))
        fail_msg("bias_gelu M=%lld N=%lld K=%lld %s ldpre=%lld bias offset %lld: returned %d, "
                 "fallback counter moved by %lld; expected the %s route",
                 (long long)M, (long long)N, (long long)K, ct_dtype_name(dt), (long long)ldpre,
                 (long long)off_bias, queued, (long long)took, expect_lt ? "cuBLASLt" : "fallback");
    if (!queued) {
        /* refused: nothing may have been written (the caller runs the separate ops) */
        assert_memory_equal(pre.data, pre_before, mat_bytes(&pre));
        assert_memory_equal(out.data, out_before, mat_bytes(&out));
    } else {
        const double u = ldexp(1.0, -24), u_bf16 = ldexp(1.0, -8);
        const bool bf = dt == CT_DTYPE_BF16;
        double worst_pre = 0.0, worst_out = 0.0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double sum = 0.0, abs_sum = 0.0;
                for (int64_t k = 0; k < K; k++) {
                    double p = (double)A.val[i * lda + k] * (double)B.val[j * ldb + k];
                    sum += p, abs_sum += fabs(p);
                }
                double b = bias.val[j], ref_pre = sum + b, ref_out = gelu_d(ref_pre);
                double tol_pre = 2.0 * (double)(K + 2) * u * (abs_sum + fabs(b)) +
                                 (bf ? u_bf16 * fabs(ref_pre) : 0.0);
                double tol_out = 1.13 * tol_pre + 10.0 * u * (fabs(ref_pre) + fabs(ref_out)) +
                                 (bf ? u_bf16 * fabs(ref_out) : 0.0);
                double got_pre = mat_get(&pre, (size_t)(i * ldpre + j));
                double got_out = mat_get(&out, (size_t)(i * ldout + j));
                double e_pre = fabs(got_pre - ref_pre), e_out = fabs(got_out - ref_out);
                if (!isfinite(got_pre) || !(e_pre <= tol_pre))
                    fail_msg("bias_gelu M=%lld N=%lld K=%lld %s: pre[%lld][%lld] = %.9g, want "
                             "%.9g (error %.3g, tolerance %.3g)",
                             (long long)M, (long long)N, (long long)K, ct_dtype_name(dt),
                             (long long)i, (long long)j, got_pre, ref_pre, e_pre, tol_pre);
                if (!isfinite(got_out) || !(e_out <= tol_out))
                    fail_msg("bias_gelu M=%lld N=%lld K=%lld %s: out[%lld][%lld] = %.9g, want "
                             "%.9g (error %.3g, tolerance %.3g)",
                             (long long)M, (long long)N, (long long)K, ct_dtype_name(dt),
                             (long long)i, (long long)j, got_out, ref_out, e_out, tol_out);
                if (tol_pre > 0 && e_pre / tol_pre > worst_pre) worst_pre = e_pre / tol_pre;
                if (tol_out > 0 && e_out / tol_out > worst_out) worst_out = e_out / tol_out;
            }
        /* the gaps past N in each row are not the op's */
        size_t es = ct_dtype_size(dt);
        for (int64_t i = 0; i < M; i++) {
            for (int64_t j = N; j < ldpre; j++)
                if (memcmp((char *)pre.data + (size_t)(i * ldpre + j) * es,
                           (char *)pre_before + (size_t)(i * ldpre + j) * es, es) != 0)
                    fail_msg("bias_gelu wrote pre[%lld][%lld], past N = %lld", (long long)i,
                             (long long)j, (long long)N);
            for (int64_t j = N; j < ldout; j++)
                if (memcmp((char *)out.data + (size_t)(i * ldout + j) * es,
                           (char *)out_before + (size_t)(i * ldout + j) * es, es) != 0)
                    fail_msg("bias_gelu wrote out[%lld][%lld], past N = %lld", (long long)i,
                             (long long)j, (long long)N);
        }
        if (verbose)
            printf("  bias_gelu %lldx%lldx%lld %s ldpre %lld: pre %.1f%%, out %.1f%% of "
                   "tolerance\n",
                   (long long)M, (long long)N, (long long)K, ct_dtype_name(dt), (long long)ldpre,
                   100.0 * worst_pre, 100.0 * worst_out);
    }
    free(pre_before), free(out_before);
    mat_free(&A), mat_free(&B), mat_free(&bias), mat_free(&pre), mat_free(&out);
}

/* The fused epilogue in fp32 and bf16: odd M, N, K (pre's ld rounded to 8 elements, as cuBLASLt
 * wants), the model's shape, a padded pre; then the refusals that send the backend to its
 * separate ops: pre's ld not a multiple of 8, a bias pointer not 16-byte aligned. */
static void test_bias_gelu(void **state) {
    (void)state;
    const int64_t shapes[4][3] = {{7, 13, 33}, {1, 1, 1}, {31, 29, 47}, {64, 128, 32}};
    const ct_dtype dts[2] = {CT_DTYPE_F32, CT_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        for (int s = 0; s < 4; s++)
            run_bias_gelu(shapes[s][0], shapes[s][1], shapes[s][2], dts[t], 0, 0, true);
        run_bias_gelu(9, 16, 21, dts[t], 8, 0, true);  /* pre padded to 24 */
        run_bias_gelu(9, 16, 21, dts[t], 1, 0, false); /* ldpre 17: not a multiple of 8 */
        run_bias_gelu(9, 16, 21, dts[t], 0, 1, false); /* bias one element off 16 bytes */
        run_bias_gelu(9, 16, 21, dts[t], 0, 16, true); /* ... 16 elements off: aligned */
    }
    /* K == 0: refused without counting (the caller's path writes pre = bias) */
    int64_t before = ct_cublas_gemm_fallbacks(gemm);
    assert_false(ct_cublas_gemm_bias_gelu(gemm, 4, 8, 0, NULL, 0, NULL, 0, NULL, NULL, 8, NULL, 8,
                                          CT_DTYPE_F32));
    assert_true(ct_cublas_gemm_bias_gelu(gemm, 0, 8, 4, NULL, 4, NULL, 4, NULL, NULL, 8, NULL, 8,
                                         CT_DTYPE_F32));
    assert_int_equal(ct_cublas_gemm_fallbacks(gemm), before);
}

/* ---- the grouped call through the backend's wrapper ----------------------------------------- *
 *
 * ct_gemm_grouped (core/backend/backend_ops.c) on a backend whose gemm slot is ct_cublas_gemm and
 * whose gemm_grouped slot is ct_cublas_gemm_grouped (GEMM by GEMM through ct_cublas_gemm where it
 * refuses, as backend_cuda.c's slot does), on the emulated device. This test binary links gemm.c
 * and not the kernels (cuda/cublas.mk), so the backend is this small one rather than
 * ct_cuda_backend_new's, whose slot adds one route of its own: a bf16 C with beta != 0 goes GEMM
 * by GEMM through its single-rounding path (backend_cuda.c, cuda_gemm).
 *
 * Mixture of Experts' three shapes, 4 experts with 5, 0, 17 and 33 tokens, out 21 × in 14 weights
 * (N and K not multiples of 8 or 16): the forward C = X·Wᵀ (trans_b, beta 0), the input gradient
 * dX = dY·W (beta 0), the weight gradient dW += dYᵀ·X (trans_a, beta 1, tokens are K). The expert
 * without tokens is an empty C in the first two (the wrapper skips it) and K = 0 with beta 1 in
 * the third (the wrapper sends it to ct_gemm: C unchanged). Each operand kind is one slab with
 * the experts' operands as views at 16-byte-aligned offsets and gaps between them: NaN in A and
 * B (a read past an operand shows as NaN), a pattern in C (a write past one must leave it).
 *
 * Three comparisons. (1) Against the same GEMMs one by one (ct_gemm on the same backend): bit
 * for bit under the emulator, whose grouped call computes each problem with the very code of its
 * single GEMM (cublas_emu.cc, Gemm::run: the same FMA order over k), so any difference is a wrong
 * operand, stride, transpose, scalar or group; on a GPU the grouped kernels may sum in another
 * order, so there within 2·tol. (2) Against the CPU backend's ct_gemm on the same values: each
 * within the file's bound tol of the exact product (the top of the file), so within 2·tol of each
 * other; NaN or Inf fails. (3) The route: f32 and bf16 -> bf16 as one grouped call, bf16 -> f32
 * and misaligned bf16 refused (GEMM by GEMM). All calls are queued before anything is read back,
 * more grouped calls than gemm.c has staging slots, so a staging slot rewritten before its copy
 * ran gives wrong pointers. */

enum { GROUPS = 4, GAP = 3 };
static const int64_t moe_tokens[GROUPS] = {5, 0, 17, 33};
enum { MOE_OUT = 21, MOE_IN = 14 };

typedef enum moe_shape { MOE_FWD, MOE_DX, MOE_DW } moe_shape;

static struct { int64_t grouped, refused; } hb_routes;

static void *hb_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

static void hb_free(void *ctx, void *p) {
    (void)ctx;
    if (p) CT_CUDA_CHECK(cudaFree(p));
}

static void hb_copy_from_host(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    CT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    CT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

static void hb_copy_to_host(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    CT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    CT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

static void hb_gemm(void *ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C,
                    int64_t ldc, ct_dtype ab, ct_dtype c) {
    (void)ctx;
    ct_cublas_gemm(gemm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab, c);
}

static void hb_gemm_grouped(void *ctx, int count, bool ta, bool tb, const int64_t *mnk, float alpha,
                            void *const *ptrs, float beta, ct_dtype ab, ct_dtype c) {
    (void)ctx;
    if (ct_cublas_gemm_grouped(gemm, count, ta, tb, mnk, alpha, ptrs, beta, ab, c)) {
        hb_routes.grouped++;
        return;
    }
    hb_routes.refused++;
    for (int i = 0; i < count; i++) {
        int64_t M = mnk[3 * i], N = mnk[3 * i + 1], K = mnk[3 * i + 2];
        ct_cublas_gemm(gemm, ta, tb, M, N, K, alpha, ptrs[3 * i], ta ? M : K, ptrs[3 * i + 1],
                       tb ? K : N, beta, ptrs[3 * i + 2], N, ab, c);
    }
}

static void hb_sync(void *ctx) {
    (void)ctx;
    CT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

static const struct ct_backend_i hb_iface = {
    .name = "cuda-gemm",
    .alloc = hb_alloc,
    .free = hb_free,
    .copy_from_host = hb_copy_from_host,
    .copy_to_host = hb_copy_to_host,
    .gemm = hb_gemm,
    .gemm_grouped = hb_gemm_grouped,
    .sync = hb_sync,
};

/* One operand kind of a case: the experts' (rows, cols) operands as views into one slab. */
typedef struct moe_slab {
    ct_dtype dtype;
    int64_t rows[GROUPS], cols[GROUPS], off[GROUPS], numel;
    float *val; /* the slab's values as the GEMM sees them (bf16-rounded) */
    ct_tensor *slab, *view[GROUPS];
} moe_slab;

/* Values: random for inputs and an accumulated C, NaN for a C that beta 0 must not read; the
 * gaps NaN (gap_nan) or a pattern. skew moves every view one element off its 16-byte-aligned
 * offset. */
static moe_slab moe_slab_new(ct_backend *be, ct_dtype dtype, const int64_t *rows,
                             const int64_t *cols, bool nan_values, bool gap_nan, bool skew) {
    moe_slab s = {.dtype = dtype};
    int64_t at = GAP;
    for (int g = 0; g < GROUPS; g++) {
        s.rows[g] = rows[g], s.cols[g] = cols[g];
        s.off[g] = round_up(at, 32) + (skew ? 1 : 0); /* 32 elements: 64 or 128 bytes */
        at = s.off[g] + rows[g] * cols[g] + GAP;
    }
    s.numel = round_up(at, 32);
    s.val = malloc((size_t)s.numel * sizeof(float));
    for (int64_t i = 0; i < s.numel; i++) s.val[i] = gap_nan ? NAN : -7.0f;
    for (int g = 0; g < GROUPS; g++)
        for (int64_t i = 0; i < rows[g] * cols[g]; i++) {
            float v = nan_values ? NAN : urand();
            s.val[s.off[g] + i] = dtype == CT_DTYPE_BF16 ? ct_bf16_to_f32(ct_f32_to_bf16(v)) : v;
        }
    s.slab = ct_tensor_new_1d(be, dtype, s.numel, CT_MEM_ACTS);
    assert_non_null(s.slab);
    ct_tensor_from_host_f32(s.slab, s.val);
    for (int g = 0; g < GROUPS; g++)
        s.view[g] = ct_tensor_view_2d(s.slab, s.off[g], rows[g], cols[g]);
    return s;
}

static void moe_slab_free(moe_slab *s) {
    for (int g = 0; g < GROUPS; g++) ct_tensor_free(s->view[g]);
    ct_tensor_free(s->slab);
    free(s->val);
}

typedef struct moe_case {
    moe_shape shape;
    ct_dtype ab, c;
    float alpha, beta;
    bool skew;
    bool ta, tb;
    moe_slab A, B, C, C_loop; /* C_loop: the same C for the GEMMs one by one */
} moe_case;

static const char *const moe_shape_names[3] = {"forward X·Wᵀ", "input grad dY·W",
                                               "weight grad dYᵀ·X"};

static moe_case moe_case_new(ct_backend *be, moe_shape shape, int t, float alpha, float beta,
                             bool skew) {
    moe_case mc = {.shape = shape,
                   .ab = type_pairs[t][0],
                   .c = type_pairs[t][1],
                   .alpha = alpha,
                   .beta = beta,
                   .skew = skew,
                   .ta = shape == MOE_DW,
                   .tb = shape == MOE_FWD};
    int64_t ar[GROUPS], ac[GROUPS], br[GROUPS], bc[GROUPS], cr[GROUPS], cc[GROUPS];
    for (int g = 0; g < GROUPS; g++) {
        int64_t T = moe_tokens[g];
        switch (shape) {
        case MOE_FWD: /* h(T, out) = x(T, in) · W(out, in)ᵀ */
            ar[g] = T, ac[g] = MOE_IN, br[g] = MOE_OUT, bc[g] = MOE_IN, cr[g] = T, cc[g] = MOE_OUT;
            break;
        case MOE_DX: /* dx(T, in) = dh(T, out) · W(out, in) */
            ar[g] = T, ac[g] = MOE_OUT, br[g] = MOE_OUT, bc[g] = MOE_IN, cr[g] = T, cc[g] = MOE_IN;
            break;
        case MOE_DW: /* dW(out, in) += dh(T, out)ᵀ · x(T, in) */
            ar[g] = T, ac[g] = MOE_OUT, br[g] = T, bc[g] = MOE_IN, cr[g] = MOE_OUT, cc[g] = MOE_IN;
            break;
        }
    }
    mc.A = moe_slab_new(be, mc.ab, ar, ac, false, true, skew);
    mc.B = moe_slab_new(be, mc.ab, br, bc, false, true, skew);
    /* beta 0 must not read C: it starts as NaN */
    uint64_t seed = cuda_test_rng_state;
    mc.C = moe_slab_new(be, mc.c, cr, cc, beta == 0.0f, false, skew);
    cuda_test_rng_state = seed;
    mc.C_loop = moe_slab_new(be, mc.c, cr, cc, beta == 0.0f, false, skew);
    return mc;
}

static void moe_case_free(moe_case *mc) {
    moe_slab_free(&mc->A), moe_slab_free(&mc->B);
    moe_slab_free(&mc->C), moe_slab_free(&mc->C_loop);
}

/* The case's host bytes of a slab, downloaded. */
static void *moe_download(const moe_slab *s) {
    void *h = malloc(ct_tensor_bytes(s->slab));
    ct_tensor_to_host(h, s->slab);
    return h;
}

static float moe_get(const void *bytes, ct_dtype dt, int64_t i) {
    return dt == CT_DTYPE_BF16 ? ct_bf16_to_f32(((const uint16_t *)bytes)[i])
                               : ((const float *)bytes)[i];
}

/* Checks one case after its grouped call and its loop ran (see the block comment above). */
static void moe_case_check(const moe_case *mc, ct_backend *cpu) {
    const char *what = moe_shape_names[mc->shape];
    void *got = moe_download(&mc->C), *loop = moe_download(&mc->C_loop);
    const double u = ldexp(1.0, -24), u_bf16 = ldexp(1.0, -8);
#ifdef CT_CUDA_EMU
    const size_t es = ct_dtype_size(mc->c);
    /* (1) bit for bit, gaps and untouched C's included */
    if (memcmp(got, loop, (size_t)mc->C.numel * es) != 0)
        for (int64_t i = 0; i < mc->C.numel; i++)
            if (memcmp((char *)got + i * es, (char *)loop + i * es, es) != 0)
                fail_msg("%s %s->%s: grouped C slab element %lld = %.9g, GEMM by GEMM %.9g (the "
                         "emulator computes both with the same code: they must be identical)",
                         what, ct_dtype_name(mc->ab), ct_dtype_name(mc->c), (long long)i,
                         moe_get(got, mc->c, i), moe_get(loop, mc->c, i));
#endif
    /* gaps: never written */
    for (int64_t i = 0; i < mc->C.numel; i++) {
        bool inside = false;
        for (int g = 0; g < GROUPS; g++)
            inside =
                inside || (i >= mc->C.off[g] && i < mc->C.off[g] + mc->C.rows[g] * mc->C.cols[g]);
        if (!inside && moe_get(got, mc->c, i) != -7.0f)
            fail_msg("%s %s->%s: wrote C slab element %lld, outside every expert's C", what,
                     ct_dtype_name(mc->ab), ct_dtype_name(mc->c), (long long)i);
    }
    for (int g = 0; g < GROUPS; g++) {
        const moe_slab *A = &mc->A, *B = &mc->B, *C = &mc->C;
        int64_t M = C->rows[g], N = C->cols[g];
        int64_t K = mc->ta ? A->rows[g] : A->cols[g];
        if (M * N == 0) continue;
        const float *a = A->val + A->off[g], *b = B->val + B->off[g], *c0 = C->val + C->off[g];
        if (K == 0) { /* C = beta·C with beta 1: unchanged, bit for bit */
            for (int64_t i = 0; i < M * N; i++)
                if (memcmp(&(float){moe_get(got, mc->c, C->off[g] + i)}, &c0[i], 4) != 0)
                    fail_msg("%s %s->%s: expert %d has K = 0 and beta 1, but C[%lld] changed "
                             "from %.9g to %.9g",
                             what, ct_dtype_name(mc->ab), ct_dtype_name(mc->c), g, (long long)i,
                             c0[i], moe_get(got, mc->c, C->off[g] + i));
            continue;
        }
        /* (2) the CPU backend's ct_gemm on the same values */
        ct_tensor *ca = ct_tensor_new_2d(cpu, mc->ab, A->rows[g], A->cols[g], CT_MEM_ACTS);
        ct_tensor *cb = ct_tensor_new_2d(cpu, mc->ab, B->rows[g], B->cols[g], CT_MEM_ACTS);
        ct_tensor *cc = ct_tensor_new_2d(cpu, mc->c, M, N, CT_MEM_ACTS);
        ct_tensor_from_host_f32(ca, a), ct_tensor_from_host_f32(cb, b);
        ct_tensor_from_host_f32(cc, c0);
        ct_gemm(cc, ca, cb, mc->ta, mc->tb, mc->alpha, mc->beta);
        float *want = malloc((size_t)(M * N) * sizeof(float));
        ct_tensor_to_host_f32(want, cc);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double sum = 0.0, abs_sum = 0.0;
                for (int64_t k = 0; k < K; k++) {
                    double x = mc->ta ? a[k * M + i] : a[i * K + k];
                    double y = mc->tb ? b[j * K + k] : b[k * N + j];
                    sum += x * y, abs_sum += fabs(x * y);
                }
                double cij = mc->beta == 0.0f ? 0.0 : (double)c0[i * N + j];
                double ref = (double)mc->alpha * sum + (double)mc->beta * cij;
                double e_acc = (double)(K + 2) * u *
                               (fabs((double)mc->alpha) * abs_sum + fabs((double)mc->beta * cij));
                double tol = 2.0 * e_acc + (mc->c == CT_DTYPE_BF16 ? u_bf16 * fabs(ref) : 0.0);
                double g_ij = moe_get(got, mc->c, C->off[g] + i * N + j);
                double l_ij = moe_get(loop, mc->c, C->off[g] + i * N + j);
                double w_ij = want[i * N + j];
                if (!isfinite(g_ij) || !isfinite(w_ij) || !(fabs(g_ij - w_ij) <= 2.0 * tol) ||
                    !isfinite(l_ij) || !(fabs(g_ij - l_ij) <= 2.0 * tol))
                    fail_msg("%s %s->%s alpha %g beta %g, expert %d (M %lld N %lld K %lld): "
                             "C[%lld][%lld] grouped %.9g, GEMM by GEMM %.9g, CPU %.9g (allowed "
                             "%.3g)",
                             what, ct_dtype_name(mc->ab), ct_dtype_name(mc->c), (double)mc->alpha,
                             (double)mc->beta, g, (long long)M, (long long)N, (long long)K,
                             (long long)i, (long long)j, g_ij, l_ij, w_ij, 2.0 * tol);
            }
        free(want);
        ct_tensor_free(ca), ct_tensor_free(cb), ct_tensor_free(cc);
    }
    free(got), free(loop);
}

/* The GEMMs of a case in one ct_gemm_grouped call (C), then one ct_gemm each (C_loop). */
static void moe_case_grouped(moe_case *mc) {
    ct_gemm_grouped(GROUPS, mc->C.view, (const ct_tensor *const *)mc->A.view,
                    (const ct_tensor *const *)mc->B.view, mc->ta, mc->tb, mc->alpha, mc->beta);
}

static void moe_case_loop(moe_case *mc) {
    for (int g = 0; g < GROUPS; g++)
        if (mc->C_loop.rows[g] * mc->C_loop.cols[g] > 0)
            ct_gemm(mc->C_loop.view[g], mc->A.view[g], mc->B.view[g], mc->ta, mc->tb, mc->alpha,
                    mc->beta);
}

static void test_grouped_moe(void **state) {
    (void)state;
    ct_backend *be = ct_xcalloc(1, sizeof *be);
    be->iface = &hb_iface;
    be->fail_category = -1;
    ct_backend *cpu = ct_backend_cpu_new(1);
    enum { N_MOE = 9, N_CASES = N_MOE + 3 };
    static const float moe_ab[3][2] = {{1.0f, 0.0f}, {1.0f, 0.0f}, {1.0f, 1.0f}};
    moe_case cases[N_CASES];
    int n = 0;
    for (int p = 0; p < 3; p++)
        for (int t = 0; t < 3; t++)
            cases[n++] = moe_case_new(be, (moe_shape)p, t, moe_ab[p][0], moe_ab[p][1], false);
    /* alpha and beta other than the model's; bf16 views one element off 16 bytes, refused (the
     * forward's K = 14 is 28 bytes, a multiple of 4: the library wants 4-byte-aligned pointers,
     * and the emulator's grouped call faults on these) */
    cases[n++] = moe_case_new(be, MOE_FWD, 0, -0.75f, 0.5f, false);
    cases[n++] = moe_case_new(be, MOE_FWD, 2, 1.0f, 0.0f, true);
    cases[n++] = moe_case_new(be, MOE_DW, 2, 0.5f, 1.0f, true);

    /* Every grouped call queued before anything is read back (7 grouped, more than the slots). */
    hb_routes.grouped = hb_routes.refused = 0;
    for (int i = 0; i < n; i++) {
        int64_t grouped = hb_routes.grouped, refused = hb_routes.refused;
        moe_case_grouped(&cases[i]);
        bool want_grouped =
            !cases[i].skew && !(cases[i].ab == CT_DTYPE_BF16 && cases[i].c == CT_DTYPE_F32);
        if (hb_routes.grouped - grouped != (want_grouped ? 1 : 0) ||
            hb_routes.refused - refused != (want_grouped ? 0 : 1))
            fail_msg("%s %s->%s%s: %lld grouped calls and %lld refused, want %s",
                     moe_shape_names[cases[i].shape], ct_dtype_name(cases[i].ab),
                     ct_dtype_name(cases[i].c), cases[i].skew ? " (misaligned)" : "",
                     (long long)(hb_routes.grouped - grouped),
                     (long long)(hb_routes.refused - refused),
                     want_grouped ? "one grouped call" : "a refusal (GEMM by GEMM)");
    }
    for (int i = 0; i < n; i++) moe_case_loop(&cases[i]);
    for (int i = 0; i < n; i++) moe_case_check(&cases[i], cpu);
    for (int i = 0; i < n; i++) moe_case_free(&cases[i]);
    ct_backend_free(cpu);
    free(be);
}

/* The caller's host arrays may be reused the moment ct_cublas_gemm_grouped returns: overwritten
 * (NULL pointers, zero sizes) before anything ran, the queued GEMMs still compute what the call
 * asked. Two GEMMs of 8 × 8 × 8 in fp32, C = A·B, checked against a float64 product. */
static void test_grouped_host_arrays(void **state) {
    (void)state;
    mat A[2], B[2], C[2];
    int64_t mnk[6];
    void *ptrs[6];
    for (int i = 0; i < 2; i++) {
        A[i] = mat_new(8, 8, 8, CT_DTYPE_F32, false, 0);
        B[i] = mat_new(8, 8, 8, CT_DTYPE_F32, false, 0);
        C[i] = mat_new(8, 8, 8, CT_DTYPE_F32, true, 0);
        mnk[3 * i] = mnk[3 * i + 1] = mnk[3 * i + 2] = 8;
        ptrs[3 * i] = A[i].dev, ptrs[3 * i + 1] = B[i].dev, ptrs[3 * i + 2] = C[i].dev;
    }
    assert_true(ct_cublas_gemm_grouped(gemm, 2, false, false, mnk, 1.0f, ptrs, 0.0f, CT_DTYPE_F32,
                                       CT_DTYPE_F32));
    memset(mnk, 0, sizeof mnk);
    memset(ptrs, 0, sizeof ptrs);
    for (int i = 0; i < 2; i++) {
        mat_download(&C[i]);
        for (int64_t r = 0; r < 8; r++)
            for (int64_t c = 0; c < 8; c++) {
                double s = 0.0, abs_s = 0.0;
                for (int64_t k = 0; k < 8; k++) {
                    double x = A[i].val[r * 8 + k], y = B[i].val[k * 8 + c];
                    s += x * y, abs_s += fabs(x * y);
                }
                double got = mat_get(&C[i], (size_t)(r * 8 + c));
                if (!isfinite(got) || !(fabs(got - s) <= 2.0 * 10 * ldexp(1.0, -24) * abs_s))
                    fail_msg("GEMM %d C[%lld][%lld] = %.9g, want %.9g", i, (long long)r,
                             (long long)c, got, s);
            }
        mat_free(&A[i]), mat_free(&B[i]), mat_free(&C[i]);
    }
}

#ifdef CT_CUDA_EMU
/* ---- the stand-ins' own contract (emulated build only) -------------------------------------- */

static float gelu_ref(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

static void set_i32(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, int32_t v) {
    assert_int_equal(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof v), CUBLAS_STATUS_SUCCESS);
}

/* Column-major fp32 GEMMs through cuBLASLt directly: every epilogue the stand-in models, a
 * strided batch of 3 with a per-batch bias, against a float64 reference. */
static void test_emu_epilogues_batch(void **state) {
    (void)state;
    const int m = 12, n = 8, k = 20, batch = 3, lda = 16, ldb = 24, ldd = 16;
    const int64_t sa = (int64_t)lda * k + 4, sb = (int64_t)ldb * k, sd = (int64_t)ldd * n + 8;
    const uint32_t epis[4] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                              CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS};
    size_t na = (size_t)(sa * batch), nb = (size_t)(sb * batch), nd = (size_t)(sd * batch);
    float *a = malloc(na * 4), *b = malloc(nb * 4), *bias = malloc((size_t)m * batch * 4);
    float *d = malloc(nd * 4);
    for (size_t i = 0; i < na; i++) a[i] = urand();
    for (size_t i = 0; i < nb; i++) b[i] = urand();
    for (int i = 0; i < m * batch; i++) bias[i] = urand();
    void *da, *db, *dd, *dbias, *ws;
    CT_CUDA_CHECK(cudaMalloc(&da, na * 4));
    CT_CUDA_CHECK(cudaMalloc(&db, nb * 4));
    CT_CUDA_CHECK(cudaMalloc(&dd, nd * 4));
    CT_CUDA_CHECK(cudaMalloc(&dbias, (size_t)m * batch * 4));
    CT_CUDA_CHECK(cudaMalloc(&ws, 1 << 20));
    CT_CUDA_CHECK(cudaMemcpyAsync(da, a, na * 4, cudaMemcpyHostToDevice, stream));
    CT_CUDA_CHECK(cudaMemcpyAsync(db, b, nb * 4, cudaMemcpyHostToDevice, stream));
    CT_CUDA_CHECK(
        cudaMemcpyAsync(dbias, bias, (size_t)m * batch * 4, cudaMemcpyHostToDevice, stream));

    cublasLtHandle_t lt;
    assert_int_equal(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    for (int e = 0; e < 4; e++) {
        cublasLtMatmulDesc_t desc;
        cublasLtMatrixLayout_t la, lb, ld;
        assert_int_equal(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
        set_i32(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_T); /* B stored n × k */
        uint32_t epi = epis[e];
        assert_int_equal(
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
            0);
        assert_int_equal(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &dbias, sizeof dbias),
                         0);
        int64_t bstride = m;
        assert_int_equal(cublasLtMatmulDescSetAttribute(desc,
                                                        CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                                        &bstride, sizeof bstride),
                         0);
        assert_int_equal(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, lda), 0);
        assert_int_equal(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, n, k, ldb), 0);
        assert_int_equal(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, ldd), 0);
        cublasLtMatrixLayout_t lays[3] = {la, lb, ld};
        const int64_t strides[3] = {sa, sb, sd};
        for (int i = 0; i < 3; i++) {
            int32_t bc = batch;
            assert_int_equal(cublasLtMatrixLayoutSetAttribute(
                                 lays[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc),
                             0);
            assert_int_equal(cublasLtMatrixLayoutSetAttribute(
                                 lays[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                 sizeof strides[i]),
                             0);
        }
        float alpha = 0.75f, beta = 0.0f;
        /* NaN: beta 0 must not read D as C */
        CT_CUDA_CHECK(cudaMemsetAsync(dd, 0xff, nd * 4, stream));
        assert_int_equal(cublasLtMatmul(lt, desc, &alpha, da, la, db, lb, &beta, dd, ld, dd, ld,
                                        NULL, ws, 1 << 20, stream),
                         0);
        CT_CUDA_CHECK(cudaStreamSynchronize(stream));
        CT_CUDA_CHECK(cudaMemcpy(d, dd, nd * 4, cudaMemcpyDeviceToHost));
        for (int bt = 0; bt < batch; bt++)
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    double s = 0, abs_s = 0;
                    for (int p = 0; p < k; p++) {
                        double x = a[bt * sa + i + (int64_t)p * lda];
                        double y = b[bt * sb + j + (int64_t)p * ldb];
                        s += x * y, abs_s += fabs(x * y);
                    }
                    double v = alpha * s;
                    if (epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_BIAS)
                        v += bias[bt * m + i];
                    if (epi == CUBLASLT_EPILOGUE_GELU || epi == CUBLASLT_EPILOGUE_GELU_BIAS)
                        v = gelu_ref((float)v);
                    double got = d[bt * sd + i + (int64_t)j * ldd];
                    /* accumulation bound as above, plus GELU's fp32 evaluation (a few ulps) */
                    double tol = 2.0 * (k + 4) * ldexp(1.0, -24) * (abs_s + 1.0) + 1e-6;
                    if (!isfinite(got) || !(fabs(got - v) <= tol))
                        fail_msg("epilogue %u batch %d D[%d][%d] = %.9g, want %.9g", epi, bt, i, j,
                                 got, v);
                }
        cublasLtMatrixLayoutDestroy(ld), cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatmulDescDestroy(desc);
    }
    cublasLtDestroy(lt);
    cudaFree(da), cudaFree(db), cudaFree(dd), cudaFree(dbias), cudaFree(ws);
    free(a), free(b), free(d), free(bias);
}

/* The checks the real libraries make and the stand-ins copy: ld < rows, wrong attribute sizes,
 * zero heuristic results for unaligned ld or pointers, host pointers, destroyed descriptors. */
static void test_emu_contract(void **state) {
    (void)state;
    void *dev;
    CT_CUDA_CHECK(cudaMalloc(&dev, 4096));
    float host[64] = {0}, one = 1.0f, zero = 0.0f;
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasSetStream(h, stream), CUBLAS_STATUS_SUCCESS);
    /* lda < m (column-major, no transpose) */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 4, 4, &one, dev, CUDA_R_32F, 7,
                                  dev, CUDA_R_32F, 4, &zero, dev, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* a host operand */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, host, CUDA_R_32F, 4,
                                  dev, CUDA_R_32F, 4, &zero, dev, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* fp32 inputs into a bf16 C: not a supported combination */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dev, CUDA_R_32F, 4,
                                  dev, CUDA_R_32F, 4, &zero, dev, CUDA_R_16BF, 4,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    assert_int_equal(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);

    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    assert_int_equal(cublasLtCreate(&lt), 0);
    assert_int_equal(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), 0);
    int64_t wide = CUBLAS_OP_T; /* the attribute is int32_t */
    assert_int_equal(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide),
        CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasLtMatmulPreferenceCreate(&pref), 0);
    uint32_t ws32 = 1 << 20; /* the attribute is uint64_t */
    assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                         pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws32, sizeof ws32),
                     CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatmulHeuristicResult_t res;
    int count = -1;
    /* ld < rows: accepted by the layout, refused by the heuristic */
    assert_int_equal(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 8, 4, 4), 0);
    assert_int_equal(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 4, 4, 4), 0);
    assert_int_equal(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, 8, 4, 8), 0);
    assert_int_equal(
        cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &count),
        CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatrixLayoutDestroy(la);
    /* aligned: one algorithm */
    assert_int_equal(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 8, 4, 8), 0);
    assert_int_equal(
        cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &count), 0);
    assert_int_equal(count, 1);
    /* the algorithm refuses a pointer less aligned than it needs */
    assert_int_equal(cublasLtMatmul(lt, desc, &one, (char *)dev + 4, la, dev, lb, &zero, dev, lc,
                                    dev, lc, &res.algo, NULL, 0, stream),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* ... and a host operand */
    assert_int_equal(cublasLtMatmul(lt, desc, &one, host, la, dev, lb, &zero, dev, lc, dev, lc,
                                    &res.algo, NULL, 0, stream),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* a promised alignment below 16 bytes: zero results */
    uint32_t four = 4;
    assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                         pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &four, sizeof four),
                     0);
    assert_int_equal(
        cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &count), 0);
    assert_int_equal(count, 0);
    uint32_t full = 256;
    assert_int_equal(cublasLtMatmulPreferenceSetAttribute(
                         pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &full, sizeof full),
                     0);
    /* an ld of 9 floats (36 bytes): zero results */
    cublasLtMatrixLayoutDestroy(la);
    assert_int_equal(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 8, 4, 9), 0);
    assert_int_equal(
        cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &count), 0);
    assert_int_equal(count, 0);
    /* a destroyed layout */
    cublasLtMatrixLayoutDestroy(la);
    assert_int_equal(
        cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &count),
        CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulPreferenceDestroy(pref), cublasLtMatmulDescDestroy(desc);
    assert_int_equal(cublasLtDestroy(lt), 0);
    CT_CUDA_CHECK(cudaFree(dev));
}
#endif /* CT_CUDA_EMU */

#ifdef CT_CUDA_EMU
/* The grouped call's contract as the stand-in keeps it: the pointer arrays must be device memory
 * (the library's kernels read them), no bf16 -> fp32 in its type table, the per-group argument
 * checks, and zero groups doing nothing. */
static void test_emu_grouped_contract(void **state) {
    (void)state;
    void *dev, *arrays;
    CT_CUDA_CHECK(cudaMalloc(&dev, 4096));
    CT_CUDA_CHECK(cudaMalloc(&arrays, 3 * sizeof(void *)));
    void *host_arrays[3] = {dev, dev, dev};
    CT_CUDA_CHECK(cudaMemcpy(arrays, host_arrays, sizeof host_arrays, cudaMemcpyHostToDevice));
    const void *const *da = (const void *const *)arrays;
    void *const *dc = (void *const *)arrays + 2;
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasSetStream(h, stream), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t op[1] = {CUBLAS_OP_N};
    const int four[1] = {4}, one[1] = {1}, three[1] = {3};
    const float alpha[1] = {1.0f}, beta[1] = {0.0f};
    /* device pointer arrays, fp32: accepted */
    assert_int_equal(cublasGemmGroupedBatchedEx(h, op, op, four, four, four, alpha, da, CUDA_R_32F,
                                                four, da + 1, CUDA_R_32F, four, beta, dc,
                                                CUDA_R_32F, four, 1, one, CUBLAS_COMPUTE_32F),
                     CUBLAS_STATUS_SUCCESS);
    /* host pointer arrays */
    assert_int_equal(cublasGemmGroupedBatchedEx(
                         h, op, op, four, four, four, alpha, (const void *const *)host_arrays,
                         CUDA_R_32F, four, (const void *const *)host_arrays + 1, CUDA_R_32F, four,
                         beta, host_arrays + 2, CUDA_R_32F, four, 1, one, CUBLAS_COMPUTE_32F),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* bf16 inputs into an fp32 C: not in its table (cublasGemmEx has it) */
    assert_int_equal(cublasGemmGroupedBatchedEx(h, op, op, four, four, four, alpha, da, CUDA_R_16BF,
                                                four, da + 1, CUDA_R_16BF, four, beta, dc,
                                                CUDA_R_32F, four, 1, one, CUBLAS_COMPUTE_32F),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    /* lda < m */
    assert_int_equal(cublasGemmGroupedBatchedEx(h, op, op, four, four, four, alpha, da, CUDA_R_32F,
                                                three, da + 1, CUDA_R_32F, four, beta, dc,
                                                CUDA_R_32F, four, 1, one, CUBLAS_COMPUTE_32F),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* no groups: nothing to do */
    assert_int_equal(cublasGemmGroupedBatchedEx(h, op, op, four, four, four, alpha, NULL,
                                                CUDA_R_32F, four, NULL, CUDA_R_32F, four, beta,
                                                NULL, CUDA_R_32F, four, 0, one, CUBLAS_COMPUTE_32F),
                     CUBLAS_STATUS_SUCCESS);
    CT_CUDA_CHECK(cudaStreamSynchronize(stream));
    assert_int_equal(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
    CT_CUDA_CHECK(cudaFree(arrays));
    CT_CUDA_CHECK(cudaFree(dev));
}
#endif /* CT_CUDA_EMU */

static int setup(void **state) {
    (void)state;
    /* Non-blocking: work issued on another stream (the legacy default one, say) is not ordered
     * before this stream's copies, so a GEMM on the wrong stream gives a wrong result. */
    CT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    gemm = ct_cublas_gemm_new(stream);
    cuda_test_rng_state = 0x9E3779B97F4A7C15ull;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ct_cublas_gemm_free(gemm);
    CT_CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

int main(int argc, char **argv) {
    verbose = getenv("TEST_CUDA_GEMM_VERBOSE") != NULL;
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transposes_odd),
        cmocka_unit_test(test_odd_shapes),
        cmocka_unit_test(test_model_shapes),
        cmocka_unit_test(test_alpha_beta),
        cmocka_unit_test(test_fallback_ld),
        cmocka_unit_test(test_fallback_pointer),
        cmocka_unit_test(test_k_zero_alpha_zero),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_bias_gelu),
        cmocka_unit_test(test_grouped_moe),
        cmocka_unit_test(test_grouped_host_arrays),
#ifdef CT_CUDA_EMU
        cmocka_unit_test(test_emu_epilogues_batch),
        cmocka_unit_test(test_emu_contract),
        cmocka_unit_test(test_emu_grouped_contract),
#endif
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
