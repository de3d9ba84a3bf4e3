/*
 * test_cuda_gemm.c — the CUDA backend's GEMM (cuda/gemm.h) against a naive row-major float64 GEMM
 * on the same inputs: fp32 and bf16 inputs, fp32 and bf16 outputs, every transpose combination,
 * odd shapes (M, N, K not multiples of 8 or 16), leading dimensions above the minimum, alpha and
 * beta (beta 0 on a NaN C), K == 0 and alpha == 0, the descriptor cache, and the cublasGemmEx
 * fallback taken for a leading dimension or a pointer that is not 16-byte aligned; and the
 * bias-GELU epilogue (ct_cuda_gemm_bias_gelu: pre-activation and GELU output, its refusals).
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

#include "core/common.h"
#include "cuda/ct_cuda_check.h"
#include "cuda/gemm.h"

#ifdef CT_CUDA_EMU
#include <cublasLt.h>
#include <cublas_v2.h>
#endif

static bool verbose;
static cudaStream_t stream;
static ct_cuda_gemm_ctx *gemm;

/* ---- helpers -------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* uniform in [-1, 1): splitmix64 */
static float urand(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return -1.0f + 2.0f * (float)((double)(z >> 11) / 9007199254740992.0);
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

/* Runs the case through ct_cuda_gemm and compares with the float64 reference (tolerance at the
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

    int64_t fallbacks = ct_cuda_gemm_fallbacks(gemm);
    ct_cuda_gemm(gemm, g->ta, g->tb, M, N, K, g->alpha, A.dev, lda, B.dev, ldb, g->beta, C.dev, ldc,
                 g->ab, g->c);
    mat_download(&C);
    int64_t took = ct_cuda_gemm_fallbacks(gemm) - fallbacks;
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
        ct_cuda_gemm(gemm, false, false, 4, 6, 0, 1.0f, A.dev, 8, B.dev, 8, 0.5f, C.dev, ldc, ab,
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
        ct_cuda_gemm(gemm, true, true, 4, 6, 0, 1.0f, A.dev, 4, B.dev, 0, 0.0f, C.dev, ldc, ab, c);
        mat_download(&C);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 6; j++) assert_true(mat_get(&C, (size_t)(i * ldc + j)) == 0.0f);
        free(before);
        mat_free(&C);

        C = mat_new(4, 6, ldc, c, true, 0); /* NaN: beta 0 must not read it, even with alpha 0 */
        ct_cuda_gemm(gemm, false, false, 4, 6, 5, 0.0f, A.dev, 8, B.dev, 8, 0.0f, C.dev, ldc, ab,
                     c);
        mat_download(&C);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 6; j++) assert_true(mat_get(&C, (size_t)(i * ldc + j)) == 0.0f);
        ct_cuda_gemm(gemm, false, false, 0, 6, 5, 1.0f, A.dev, 8, B.dev, 8, 0.0f, NULL, ldc, ab, c);
        ct_cuda_gemm(gemm, false, false, 4, 0, 5, 1.0f, A.dev, 8, B.dev, 8, 0.0f, NULL, ldc, ab, c);
        mat_free(&A), mat_free(&B), mat_free(&C);
    }
}

/* A repeated configuration reuses its cached plan (fresh buffers at other addresses are bound,
 * not the first call's); anything in the key (ld, dtype, transposes, pointer alignment) adds one;
 * alpha and beta do not. The fallback counter counts calls, not configurations. */
static void test_cache(void **state) {
    (void)state;
    ct_cuda_gemm_free(gemm);
    gemm = ct_cuda_gemm_new(stream);
    assert_int_equal(ct_cuda_gemm_cache_size(gemm), 0);
    gemm_case g = lt_case(false, true, 33, 20, 17, 1.0f, 0.0f, 1);
    run_case(&g);
    assert_int_equal(ct_cuda_gemm_cache_size(gemm), 1);
    run_case(&g);
    run_case(&g);
    assert_int_equal(ct_cuda_gemm_cache_size(gemm), 1);
    g.beta = 1.0f, g.alpha = 0.5f;
    run_case(&g);
    assert_int_equal(ct_cuda_gemm_cache_size(gemm), 1);
    g.pad_c = 20;
    run_case(&g);
    assert_int_equal(ct_cuda_gemm_cache_size(gemm), 2);
    g.c = CT_DTYPE_BF16;
    run_case(&g);
    assert_int_equal(ct_cuda_gemm_cache_size(gemm), 3);
    g.ta = true;
    run_case(&g);
    assert_int_equal(ct_cuda_gemm_cache_size(gemm), 4);
    /* Each pointer's alignment is in the key: one element off is another plan (the fallback). */
    int64_t before = ct_cuda_gemm_fallbacks(gemm);
    for (int which = 0; which < 3; which++) {
        g.off_a = which == 0, g.off_b = which == 1, g.off_c = which == 2;
        g.expect = ROUTE_FALLBACK;
        run_case(&g);
        run_case(&g);
        assert_int_equal(ct_cuda_gemm_cache_size(gemm), 5 + which);
    }
    if (CHECK_FALLBACKS) assert_int_equal(ct_cuda_gemm_fallbacks(gemm) - before, 6);
    /* and back to aligned pointers: the cached cuBLASLt plan again */
    g.off_a = g.off_b = g.off_c = 0, g.expect = ROUTE_LT;
    run_case(&g);
    assert_int_equal(ct_cuda_gemm_cache_size(gemm), 7);
}

/* ---- the bias-GELU epilogue (ct_cuda_gemm_bias_gelu) ---------------------------------------- */

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

    int64_t fallbacks = ct_cuda_gemm_fallbacks(gemm);
    bool queued = ct_cuda_gemm_bias_gelu(gemm, M, N, K, A.dev, lda, B.dev, ldb, bias.dev, pre.dev,
                                         ldpre, out.dev, ldout, dt);
    mat_download(&pre), mat_download(&out);
    int64_t took = ct_cuda_gemm_fallbacks(gemm) - fallbacks;
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
    int64_t before = ct_cuda_gemm_fallbacks(gemm);
    assert_false(ct_cuda_gemm_bias_gelu(gemm, 4, 8, 0, NULL, 0, NULL, 0, NULL, NULL, 8, NULL, 8,
                                        CT_DTYPE_F32));
    assert_true(ct_cuda_gemm_bias_gelu(gemm, 0, 8, 4, NULL, 4, NULL, 4, NULL, NULL, 8, NULL, 8,
                                       CT_DTYPE_F32));
    assert_int_equal(ct_cuda_gemm_fallbacks(gemm), before);
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

static int setup(void **state) {
    (void)state;
    /* Non-blocking: work issued on another stream (the legacy default one, say) is not ordered
     * before this stream's copies, so a GEMM on the wrong stream gives a wrong result. */
    CT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    gemm = ct_cuda_gemm_new(stream);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ct_cuda_gemm_free(gemm);
    CT_CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

int main(int argc, char **argv) {
    verbose = getenv("TEST_CUDA_GEMM_VERBOSE") != NULL;
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transposes_odd),      cmocka_unit_test(test_odd_shapes),
        cmocka_unit_test(test_model_shapes),        cmocka_unit_test(test_alpha_beta),
        cmocka_unit_test(test_fallback_ld),         cmocka_unit_test(test_fallback_pointer),
        cmocka_unit_test(test_k_zero_alpha_zero),   cmocka_unit_test(test_cache),
        cmocka_unit_test(test_bias_gelu),
#ifdef CT_CUDA_EMU
        cmocka_unit_test(test_emu_epilogues_batch), cmocka_unit_test(test_emu_contract),
#endif
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
