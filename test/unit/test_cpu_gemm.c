/*
 * test_cpu_gemm.c — the oneDNN GEMM (core/backend/cpu/gemm_onednn.h) against a naive float64 GEMM
 * on the same inputs, for fp32 and bf16 inputs, fp32 and bf16 outputs, every transpose combination,
 * odd and model-like shapes, padded leading dimensions, alpha and beta; plus the primitive cache
 * and the native-bf16 detection with its environment override.
 *
 * ct_cpu_gemm_serial, the one-thread form the CPU backend runs on each thread's tiles, is held to
 * the same reference, and run from a parallel region: each tile bit-identical to the same call
 * alone.
 *
 * Run all:      ./test_cpu_gemm
 * Run by name:  ./test_cpu_gemm test_cache      (a cmocka filter; wildcards allowed: "*bf16*")
 * TEST_CPU_GEMM_VERBOSE=1 prints the oneDNN implementations and how much of each tolerance a case
 * uses.
 *
 * Tolerance. The reference works on exactly the values the GEMM sees (bf16 inputs are rounded
 * first and the reference reads them back as floats), so the only differences are rounding inside
 * the GEMM. With u = 2^-24 (fp32 unit roundoff), an fp32 sum of K products, each rounded once
 * (bf16 products are exact in fp32), then scaled by alpha and added to beta·C, is off by at most
 *     e_acc = (K + 2)·u·(|alpha|·Σ_k |a_ik·b_kj| + |beta·c_ij|)
 * whatever the summation order (the standard bound γ_{K+2} for recursive summation; blocked sums
 * are tighter). A bf16 output is then rounded to nearest, which adds at most 2^-8 of the value:
 *     tol = 2·e_acc + (bf16 C ? 2^-8·|ref| : 0).
 * The factor 2 covers the second-order terms and the rounding of the error itself. The bound is
 * rigorous, not statistical: bf16-output cases use 75-99% of it (rounding alone can take the whole
 * 2^-8 term, for values just above a power of two), fp32 ones a few percent. A wrong stride, a
 * dropped transpose or an ignored alpha/beta gives errors of the order of the values (~1 here),
 * thousands of times the tolerance. NaN or Inf anywhere fails.
 *
 * Every unused element (the padding of a leading dimension) of A and B holds NaN, so a wrong
 * stride reading padding shows up as NaN; C's padding must come back bit-identical.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/cpu/gemm_onednn.h"

#include "test_util.h"

static bool verbose;

/* ---- helpers -------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

/* uniform in [-1, 1) */
static float urand(void) {
    return test_urand(&rng_state, -1.0f, 1.0f);
}

/* A stored matrix: rows × cols with row stride ld, in dtype, plus its values as floats (what the
 * GEMM sees: bf16-rounded for bf16). Padding columns hold NaN in both. */
typedef struct mat {
    int64_t rows, cols, ld;
    ct_dtype dtype;
    void *data;
    float *val;
} mat;

static mat mat_new(int64_t rows, int64_t cols, int64_t ld, ct_dtype dtype, bool nan_fill) {
    mat m = {rows, cols, ld, dtype, NULL, NULL};
    size_t n = (size_t)(rows * ld);
    m.data = malloc((n ? n : 1) * ct_dtype_size(dtype));
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
    return m;
}

static void mat_free(mat *m) {
    free(m->data), free(m->val);
}

static float mat_get(const mat *m, size_t at) {
    return m->dtype == CT_DTYPE_BF16 ? ct_bf16_to_f32(((const uint16_t *)m->data)[at])
                                     : ((const float *)m->data)[at];
}

/* One GEMM case. pad_* are added to the row widths to make the leading dimensions. */
typedef struct gemm_case {
    bool ta, tb;
    int64_t M, N, K;
    int64_t pad_a, pad_b, pad_c;
    float alpha, beta;
    ct_dtype ab, c;
} gemm_case;

/* Runs the case through ct_cpu_gemm_onednn, or ct_cpu_gemm_serial (fp32 only) when serial, and
 * compares with the float64 reference (tolerance at the top of the file). Returns the worst
 * error / tolerance ratio; fails on any violation. */
static double run_case_in(const gemm_case *g, bool serial) {
    const int64_t M = g->M, N = g->N, K = g->K;
    int64_t a_rows = g->ta ? K : M, a_cols = g->ta ? M : K;
    int64_t b_rows = g->tb ? N : K, b_cols = g->tb ? K : N;
    mat A = mat_new(a_rows, a_cols, a_cols + g->pad_a, g->ab, false);
    mat B = mat_new(b_rows, b_cols, b_cols + g->pad_b, g->ab, false);
    /* beta == 0 must not read C: it starts as NaN. */
    mat C = mat_new(M, N, N + g->pad_c, g->c, g->beta == 0.0f);
    size_t c_bytes = (size_t)(M * C.ld) * ct_dtype_size(g->c);
    void *c_before = malloc(c_bytes ? c_bytes : 1);
    memcpy(c_before, C.data, c_bytes);

    if (serial) {
        assert_true(ct_cpu_gemm_init());
        ct_cpu_gemm_serial(g->ta, g->tb, M, N, K, g->alpha, A.data, A.ld, B.data, B.ld, g->beta,
                           C.data, C.ld, g->ab, g->c);
    } else {
        ct_cpu_gemm_onednn(g->ta, g->tb, M, N, K, g->alpha, A.data, A.ld, B.data, B.ld, g->beta,
                           C.data, C.ld, g->ab, g->c);
    }

    const double u = ldexp(1.0, -24), u_bf16 = ldexp(1.0, -8);
    double worst = 0.0;
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double sum = 0.0, abs_sum = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double a = g->ta ? A.val[k * A.ld + i] : A.val[i * A.ld + k];
                double b = g->tb ? B.val[j * B.ld + k] : B.val[k * B.ld + j];
                sum += a * b;
                abs_sum += fabs(a * b);
            }
            double c0 = g->beta == 0.0f ? 0.0 : (double)C.val[i * C.ld + j];
            double ref = (double)g->alpha * sum + (double)g->beta * c0;
            double e_acc = (double)(K + 2) * u *
                           (fabs((double)g->alpha) * abs_sum + fabs((double)g->beta * c0));
            double tol = 2.0 * e_acc + (g->c == CT_DTYPE_BF16 ? u_bf16 * fabs(ref) : 0.0);
            double got = mat_get(&C, (size_t)(i * C.ld + j));
            double err = fabs(got - ref);
            if (!isfinite(got) || !(err <= tol))
                fail_msg("ta=%d tb=%d M=%lld N=%lld K=%lld %s->%s alpha=%g beta=%g: C[%lld][%lld] "
                         "= %.9g, want %.9g (error %.3g, tolerance %.3g)",
                         g->ta, g->tb, (long long)M, (long long)N, (long long)K,
                         ct_dtype_name(g->ab), ct_dtype_name(g->c), (double)g->alpha,
                         (double)g->beta, (long long)i, (long long)j, got, ref, err, tol);
            if (tol > 0 && err / tol > worst) worst = err / tol;
        }
        size_t es = ct_dtype_size(g->c);
        for (int64_t j = N; j < C.ld; j++) {
            size_t at = (size_t)(i * C.ld + j) * es;
            if (memcmp((char *)C.data + at, (char *)c_before + at, es) != 0)
                fail_msg("ta=%d tb=%d M=%lld N=%lld K=%lld: wrote C[%lld][%lld], past N (ldc %lld)",
                         g->ta, g->tb, (long long)M, (long long)N, (long long)K, (long long)i,
                         (long long)j, (long long)C.ld);
        }
    }
    if (verbose)
        printf("  ta=%d tb=%d %lldx%lldx%lld lds +%lld/+%lld/+%lld %s->%s alpha=%g beta=%g: "
               "%.1f%% of tolerance\n",
               g->ta, g->tb, (long long)M, (long long)N, (long long)K, (long long)g->pad_a,
               (long long)g->pad_b, (long long)g->pad_c, ct_dtype_name(g->ab), ct_dtype_name(g->c),
               (double)g->alpha, (double)g->beta, 100.0 * worst);
    free(c_before);
    mat_free(&A), mat_free(&B), mat_free(&C);
    return worst;
}

static double run_case(const gemm_case *g) {
    return run_case_in(g, false);
}

/* The three (A/B, C) dtype pairs the module supports. */
static const ct_dtype type_pairs[3][2] = {
    {CT_DTYPE_F32, CT_DTYPE_F32},
    {CT_DTYPE_BF16, CT_DTYPE_F32},
    {CT_DTYPE_BF16, CT_DTYPE_BF16},
};

/* ---- tests ---------------------------------------------------------------------------------- */

/* Odd shape, all four transposes, padded leading dimensions, every dtype pair; beta 0 on a NaN C.
 */
static void test_transposes_odd(void **state) {
    (void)state;
    for (int t = 0; t < 3; t++)
        for (int combo = 0; combo < 4; combo++) {
            gemm_case g = {combo & 1,        combo & 2,       7, 13, 33, 3, 5, 2, 1.0f, 0.0f,
                           type_pairs[t][0], type_pairs[t][1]};
            run_case(&g);
        }
}

/* Model-like shapes: the linear layer forward X·W^T, input gradient dY·W, weight gradient dY^T·X,
 * dense (256×192×64) and with a long K (64×96×768) where accumulation error is largest. */
static void test_model_shapes(void **state) {
    (void)state;
    const int64_t shapes[2][3] = {{256, 192, 64}, {64, 96, 768}};
    const bool trans[3][2] = {{false, true}, {false, false}, {true, false}};
    for (int s = 0; s < 2; s++)
        for (int p = 0; p < 3; p++)
            for (int t = 0; t < 3; t++) {
                gemm_case g = {
                    trans[p][0], trans[p][1], shapes[s][0], shapes[s][1],     shapes[s][2],    0, 0,
                    0,           1.0f,        0.0f,         type_pairs[t][0], type_pairs[t][1]};
                run_case(&g);
            }
}

/* alpha ≠ 1 and beta ≠ 0 (accumulate, scaled accumulate, negative), all transposes, padded lds. */
static void test_alpha_beta(void **state) {
    (void)state;
    const float ab[4][2] = {{1.0f, 1.0f}, {0.5f, 1.0f}, {-1.25f, 0.0f}, {0.75f, -0.5f}};
    for (int v = 0; v < 4; v++)
        for (int t = 0; t < 3; t++)
            for (int combo = 0; combo < 4; combo++) {
                gemm_case g = {
                    combo & 1,        combo & 2,       19, 24, 40, 1, 4, 3, ab[v][0], ab[v][1],
                    type_pairs[t][0], type_pairs[t][1]};
                run_case(&g);
            }
}

/* More than one thread (the suite runs with OMP_NUM_THREADS=1), on a shape big enough to split. */
static void test_two_threads(void **state) {
    (void)state;
    int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    for (int t = 0; t < 3; t++) {
        gemm_case g = {false,           true, 128, 160, 96, 0, 8, 0, 1.0f, 1.0f, type_pairs[t][0],
                       type_pairs[t][1]};
        run_case(&g);
        g.ta = true, g.tb = false;
        run_case(&g);
    }
    omp_set_num_threads(saved);
}

/* beta 0 on a C full of NaN stays finite; K == 0 and alpha == 0 give beta·C without touching
 * A or B (NaN here), as BLAS defines them. */
static void test_beta_zero_and_empty(void **state) {
    (void)state;
    for (int t = 0; t < 3; t++) {
        ct_dtype ab = type_pairs[t][0], c = type_pairs[t][1];
        gemm_case g = {false, false, 16, 16, 16, 0, 0, 0, 2.0f, 0.0f, ab, c};
        run_case(&g); /* C starts NaN */

        mat A = mat_new(4, 5, 5, ab, true), B = mat_new(5, 6, 6, ab, true);
        mat C = mat_new(4, 6, 7, c, false);
        ct_cpu_gemm_onednn(false, false, 4, 6, 0, 1.0f, A.data, 5, B.data, 6, 0.5f, C.data, 7, ab,
                           c);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 6; j++)
                assert_true(mat_get(&C, (size_t)(i * 7 + j)) == 0.5f * C.val[i * 7 + j]);
        mat_free(&C);
        C = mat_new(4, 6, 7, c, true); /* NaN: beta 0 must not read it, even with alpha 0 */
        ct_cpu_gemm_onednn(false, false, 4, 6, 5, 0.0f, A.data, 5, B.data, 6, 0.0f, C.data, 7, ab,
                           c);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 6; j++) assert_true(mat_get(&C, (size_t)(i * 7 + j)) == 0.0f);
        ct_cpu_gemm_onednn(false, false, 0, 6, 5, 1.0f, A.data, 5, B.data, 6, 0.0f, NULL, 7, ab, c);
        mat_free(&A), mat_free(&B), mat_free(&C);
    }
}

/* A repeated shape reuses its primitive and binds the new pointers; anything in the key (alpha,
 * beta, ld, dtype, thread count) makes a new one; release empties the cache and a later call
 * starts again. */
static void test_cache(void **state) {
    (void)state;
    ct_cpu_gemm_release();
    assert_int_equal(ct_cpu_gemm_cache_size(), 0);
    gemm_case g = {false, true, 33, 20, 17, 0, 0, 0, 1.0f, 0.0f, CT_DTYPE_BF16, CT_DTYPE_F32};
    run_case(&g);
    assert_int_equal(ct_cpu_gemm_cache_size(), 1);
    run_case(&g); /* fresh buffers at other addresses: must be bound, not the first call's */
    run_case(&g);
    assert_int_equal(ct_cpu_gemm_cache_size(), 1);
    g.beta = 1.0f;
    run_case(&g);
    assert_int_equal(ct_cpu_gemm_cache_size(), 2);
    g.alpha = 0.5f;
    run_case(&g);
    assert_int_equal(ct_cpu_gemm_cache_size(), 3);
    g.pad_c = 1;
    run_case(&g);
    assert_int_equal(ct_cpu_gemm_cache_size(), 4);
    g.ab = g.c = CT_DTYPE_BF16;
    run_case(&g);
    assert_int_equal(ct_cpu_gemm_cache_size(), 5);
    int saved = omp_get_max_threads();
    omp_set_num_threads(saved + 1);
    run_case(&g);
    assert_int_equal(ct_cpu_gemm_cache_size(), 6);
    omp_set_num_threads(saved);
    run_case(&g);
    assert_int_equal(ct_cpu_gemm_cache_size(), 6);
    ct_cpu_gemm_release();
    ct_cpu_gemm_release(); /* twice is fine */
    assert_int_equal(ct_cpu_gemm_cache_size(), 0);
    run_case(&g);
    assert_int_equal(ct_cpu_gemm_cache_size(), 1);
}

/* The implementation names are reported, and asking for one caches its primitive once. */
static void test_impl_name(void **state) {
    (void)state;
    ct_cpu_gemm_release();
    const char *f32 = ct_cpu_gemm_impl(false, true, 64, 96, 128, CT_DTYPE_F32);
    const char *bf16 = ct_cpu_gemm_impl(false, true, 64, 96, 128, CT_DTYPE_BF16);
    const char *again = ct_cpu_gemm_impl(false, true, 64, 96, 128, CT_DTYPE_BF16);
    assert_true(strlen(f32) > 0 && strcmp(f32, "unavailable") != 0);
    assert_true(strlen(bf16) > 0 && strcmp(bf16, "unavailable") != 0);
    assert_ptr_equal(bf16, again);
    assert_int_equal(ct_cpu_gemm_cache_size(), 2);
    assert_string_equal(ct_cpu_gemm_impl(false, false, 0, 4, 4, CT_DTYPE_F32), "unavailable");
    if (verbose) printf("  oneDNN implementations: fp32 %s, bf16 %s\n", f32, bf16);
}

/* Detection agrees with the kernel's view (/proc/cpuinfo lists avx512_bf16 / amx_bf16 only when
 * it enabled their state), and COOKTRAIN_CPU_BF16=0/1 override it; other values are ignored. */
static void test_native_bf16(void **state) {
    (void)state;
    char what[160];
    const char *env = getenv("COOKTRAIN_CPU_BF16");
    char *saved = env ? strdup(env) : NULL;

    unsetenv("COOKTRAIN_CPU_BF16");
    bool native = ct_cpu_has_native_bf16(what, sizeof what);
    if (verbose) printf("  native bf16: %s (%s)\n", native ? "yes" : "no", what);
    assert_true(strlen(what) > 0);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[8192];
        bool listed = false;
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "flags", 5)) {
                listed = strstr(line, " avx512_bf16") || strstr(line, " amx_bf16");
                break;
            }
        fclose(f);
        if (native != listed)
            fail_msg("detection says %s (%s), /proc/cpuinfo %s avx512_bf16/amx_bf16",
                     native ? "native" : "not native", what, listed ? "lists" : "does not list");
    }

    setenv("COOKTRAIN_CPU_BF16", "0", 1);
    assert_false(ct_cpu_has_native_bf16(what, sizeof what));
    assert_string_equal(what, "forced off by COOKTRAIN_CPU_BF16=0");
    setenv("COOKTRAIN_CPU_BF16", "1", 1);
    assert_true(ct_cpu_has_native_bf16(what, sizeof what));
    assert_non_null(strstr(what, "forced on by COOKTRAIN_CPU_BF16=1"));
    setenv("COOKTRAIN_CPU_BF16", "yes", 1);
    assert_true(ct_cpu_has_native_bf16(NULL, 0) == native);
    setenv("COOKTRAIN_CPU_BF16", "", 1);
    assert_true(ct_cpu_has_native_bf16(what, 8) == native); /* short buffer: truncated, no crash */
    assert_true(strlen(what) < 8);

    if (saved)
        setenv("COOKTRAIN_CPU_BF16", saved, 1);
    else
        unsetenv("COOKTRAIN_CPU_BF16");
    free(saved);
}

/* ct_cpu_gemm_serial: every transpose and dtype pair, padded leading dimensions, alpha and beta,
 * odd and model-like shapes (a long K, a transposed A: both need a scratchpad) against the
 * reference; then 12 tiles of one shape from a region of 3 threads at once, each into its own C,
 * each bit-identical to the same call on one thread (a scratchpad or memory object shared between
 * threads, or a primitive blocked for the caller's thread count, would show here); serial
 * primitives are cached apart from the multi-threaded ones. */
static void test_serial(void **state) {
    (void)state;
    const float ab[3][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {0.75f, -0.5f}};
    for (int v = 0; v < 3; v++)
        for (int t = 0; t < 3; t++)
            for (int combo = 0; combo < 4; combo++) {
                gemm_case g = {
                    combo & 1,        combo & 2,       19, 24, 40, 1, 4, 3, ab[v][0], ab[v][1],
                    type_pairs[t][0], type_pairs[t][1]};
                run_case_in(&g, true);
                gemm_case m = {
                    combo & 1,        combo & 2,       128, 64, 700, 0, 0, 0, ab[v][0], ab[v][1],
                    type_pairs[t][0], type_pairs[t][1]};
                run_case_in(&m, true);
            }

    ct_cpu_gemm_release();
    /* Each tile its own A (stored (K, M): transposed, so oneDNN packs it into the scratchpad) and
     * its own B: a tile computed from another's packed operands comes out wrong. */
    const int64_t M = 128, N = 96, K = 1000, tiles = 12, mn = M * N;
    float *A = malloc((size_t)(tiles * K * M) * sizeof *A);
    float *B = malloc((size_t)(tiles * K * N) * sizeof *B);
    float *alone = malloc((size_t)(tiles * mn) * sizeof *alone);
    float *beside = malloc((size_t)(tiles * mn) * sizeof *beside);
    for (int64_t i = 0; i < tiles * K * M; i++) A[i] = urand();
    for (int64_t i = 0; i < tiles * K * N; i++) B[i] = urand();
    for (int64_t i = 0; i < tiles * mn; i++) alone[i] = beside[i] = urand();
    assert_true(ct_cpu_gemm_init());
    for (int64_t t = 0; t < tiles; t++)
        ct_cpu_gemm_serial(true, false, M, N, K, 1.0f, A + t * K * M, M, B + t * K * N, N, 1.0f,
                           alone + t * mn, N, CT_DTYPE_F32, CT_DTYPE_F32);
    assert_int_equal(ct_cpu_gemm_cache_size(), 1);
    int saved = omp_get_max_threads();
    omp_set_num_threads(3);
#pragma omp parallel for schedule(static, 1)
    for (int64_t t = 0; t < tiles; t++)
        ct_cpu_gemm_serial(true, false, M, N, K, 1.0f, A + t * K * M, M, B + t * K * N, N, 1.0f,
                           beside + t * mn, N, CT_DTYPE_F32, CT_DTYPE_F32);
    assert_int_equal(omp_get_max_threads(), 3); /* the region's count is left as it was */
    omp_set_num_threads(saved);
    assert_int_equal(ct_cpu_gemm_cache_size(), 1);
    for (int64_t t = 0; t < tiles; t++)
        if (memcmp(beside + t * mn, alone + t * mn, (size_t)mn * sizeof(float)) != 0)
            fail_msg("tile %lld of 12, run beside the others, differs from the same GEMM alone",
                     (long long)t);
    gemm_case g = {true, false, M, N, K, 0, 0, 0, 1.0f, 1.0f, CT_DTYPE_F32, CT_DTYPE_F32};
    run_case(&g); /* the same shape, multi-threaded: an entry of its own */
    assert_int_equal(ct_cpu_gemm_cache_size(), 2);
    free(A), free(B), free(alone), free(beside);
}

/* ---- main ----------------------------------------------------------------------------------- */

static int teardown(void **state) {
    (void)state;
    ct_cpu_gemm_release();
    return 0;
}

int main(int argc, char **argv) {
    const char *v = getenv("TEST_CPU_GEMM_VERBOSE");
    verbose = v && *v && strcmp(v, "0") != 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transposes_odd),
        cmocka_unit_test(test_model_shapes),
        cmocka_unit_test(test_alpha_beta),
        cmocka_unit_test(test_two_threads),
        cmocka_unit_test(test_beta_zero_and_empty),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_impl_name),
        cmocka_unit_test(test_native_bf16),
        cmocka_unit_test(test_serial),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, teardown);
}
