/*
 * test_ops.c — op tests for the CPU backend (test/README.md): every op of backend.h against a
 * naive, single-threaded float64 reference written here, every backward against central finite
 * differences of L = sum(out ⊙ R) taken in float64 on that reference, and a thread-count
 * determinism test (1 vs 3 threads must give bit-identical results for every reducing op).
 *
 * Run all:      ./test_ops
 * Run by name:  ./test_ops test_attention_gqa      (a cmocka filter; wildcards allowed: "*xent*")
 * TEST_OPS_VERBOSE=1 prints how much of each tolerance a run uses.
 *
 * Tolerances. The backend computes in float32 (unit roundoff u = 6e-8); a sum of K terms carries
 * an error of about sqrt(K)·u·|terms| for random signs and at most K·u·sum|terms|. The references
 * are float64, and the finite differences use h = 1e-5 on float64 (truncation ~h² ≈ 1e-10,
 * cancellation ~1e-16/h ≈ 1e-11), so the reference side is exact at the float32 scale and every
 * tolerance below is a float32 accumulation bound with some margin. A wrong formula gives errors of
 * the order of the values themselves (≥ 1e-2 here), far outside every tolerance.
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

#include "core/backend/backend.h"
#include "core/backend/cpu/cpu.h"
#include "core/model/rope.h"

#include "test_util.h"

static ct_backend *be;  /* 2 threads: the backend under test */
static ct_backend *be1; /* 1 thread  } for the determinism test */
static ct_backend *be3; /* 3 threads } */

/* ---- helpers -------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) {
    return test_rng_next(&rng_state);
}

/* uniform in [lo, hi) */
static float urand(float lo, float hi) {
    return test_urand(&rng_state, lo, hi);
}

static float *rand_floats(int64_t n, float lo, float hi) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = urand(lo, hi);
    return x;
}

static double *to_double(const float *x, int64_t n) {
    double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static ct_tensor *tensor(ct_backend *b, ct_dtype dtype, int ndim, const int64_t *shape,
                         const void *host) {
    ct_tensor *t = ct_tensor_new(b, dtype, ndim, shape, CT_MEM_ACTS);
    assert_non_null(t);
    if (host) ct_tensor_from_host(t, host);
    return t;
}

static ct_tensor *t1(ct_backend *b, int64_t n, const float *host) {
    int64_t s[1] = {n};
    return tensor(b, CT_DTYPE_F32, 1, s, host);
}

static ct_tensor *t2(ct_backend *b, int64_t rows, int64_t cols, const float *host) {
    int64_t s[2] = {rows, cols};
    return tensor(b, CT_DTYPE_F32, 2, s, host);
}

static ct_tensor *ti32(ct_backend *b, int64_t n, const int32_t *host) {
    int64_t s[1] = {n};
    return tensor(b, CT_DTYPE_I32, 1, s, host);
}

/* A malloc'd host copy of a tensor's contents. */
static float *host_of(const ct_tensor *t) {
    float *h = malloc(ct_tensor_bytes(t) ? ct_tensor_bytes(t) : 1);
    ct_tensor_to_host(h, t);
    return h;
}

/* Fails unless |got - want| <= atol + rtol·|want| everywhere (NaN fails). */
static void check_close(const char *what, const float *got, const double *want, int64_t n,
                        double atol, double rtol) {
    int64_t bad = 0, worst = -1;
    double worst_ratio = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]), tol = atol + rtol * fabs(want[i]);
        if (!(err <= tol)) {
            bad++;
            double ratio = isfinite(err) ? err / tol : INFINITY;
            if (worst < 0 || ratio > worst_ratio) worst = i, worst_ratio = ratio;
        }
    }
    if (getenv("TEST_OPS_VERBOSE")) { /* how much of each tolerance is used */
        double used = 0.0;
        for (int64_t i = 0; i < n; i++) {
            double err = fabs((double)got[i] - want[i]), tol = atol + rtol * fabs(want[i]);
            double r = err == 0.0 ? 0.0 : err / tol;
            if (r > used || !(r == r)) used = r;
        }
        print_message("  %-50s uses %.3f of its tolerance\n", what, used);
    }
    if (bad)
        fail_msg("%s: %lld of %lld elements outside atol %g + rtol %g; worst [%lld]: got %.9g, "
                 "want %.9g",
                 what, (long long)bad, (long long)n, atol, rtol, (long long)worst,
                 (double)got[worst], want[worst]);
}

static void check_bits_equal(const char *what, const void *a, const void *b, size_t bytes) {
    if (memcmp(a, b, bytes) != 0) {
        const unsigned char *x = a, *y = b;
        size_t i = 0;
        while (x[i] == y[i]) i++;
        fail_msg("%s: results differ between thread counts (first byte %zu of %zu)", what, i,
                 bytes);
    }
}

/* Central finite differences of loss() with respect to x[0..n): grad[i] = dL/dx[i]. */
typedef double (*loss_fn)(void *ctx);
static void fd_grad(loss_fn loss, void *ctx, double *x, int64_t n, double *grad) {
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + h;
        double lp = loss(ctx);
        x[i] = saved - h;
        double lm = loss(ctx);
        x[i] = saved;
        grad[i] = (lp - lm) / (2.0 * h);
    }
}

static double dot(const double *a, const double *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- GEMM ----------------------------------------------------------------------------------- */

/* out(M,N) = alpha·op(A)·op(B) + beta·C0, one dot product per element, float64. */
static void gemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, double beta,
                     const float *C0, int64_t ldc, double *out) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? A[k * lda + i] : A[i * lda + k];
                double b = tb ? B[j * ldb + k] : B[k * ldb + j];
                s += a * b;
            }
            out[i * N + j] = alpha * s + beta * C0[i * ldc + j];
        }
}

/*
 * The slot with row strides larger than the rows (lda > cols of op-input, ldc > N) for all four
 * transpose combinations, non-square, beta ≠ 0. Elements of C outside the N columns must stay
 * untouched. Two shapes: one sgemm, and one the CPU backend runs as 2 x 4 tiles (two row blocks,
 * each in four column pieces, the last 85 wide), so each tile's offsets into A, B and C are
 * checked in every transpose. Tolerance: K = 53 products of values in [-1, 1]: worst-case
 * float32 error K·u·sum|ab| ≈ 53·6e-8·13 ≈ 4e-5, typical sqrt(K)·u·|C| ≈ 1e-6; 5e-5 absolute.
 */
static void gemm_strided_case(ct_backend *be, int64_t M, int64_t N, int64_t K) {
    for (int combo = 0; combo < 4; combo++) {
        bool ta = combo & 1, tb = combo & 2;
        int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + 7;
        int64_t b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + 3;
        int64_t ldc = N + 5;
        ct_tensor *A = t1(be, a_rows * lda, NULL), *B = t1(be, b_rows * ldb, NULL);
        ct_tensor *C = t1(be, M * ldc, NULL);
        float *ha = rand_floats(a_rows * lda, -1, 1), *hb = rand_floats(b_rows * ldb, -1, 1);
        float *hc = rand_floats(M * ldc, -1, 1);
        ct_tensor_from_host(A, ha);
        ct_tensor_from_host(B, hb);
        ct_tensor_from_host(C, hc);
        be->iface->gemm(be->ctx, ta, tb, M, N, K, 0.75f, A->data, lda, B->data, ldb, -0.5f, C->data,
                        ldc, CT_DTYPE_F32, CT_DTYPE_F32);
        float *got = host_of(C);
        double *want = malloc((size_t)(M * N) * sizeof *want);
        gemm_ref(ta, tb, M, N, K, 0.75, ha, lda, hb, ldb, -0.5, hc, ldc, want);
        float *dense = malloc((size_t)(M * N) * sizeof *dense);
        for (int64_t i = 0; i < M; i++) {
            memcpy(dense + i * N, got + i * ldc, (size_t)N * sizeof(float));
            for (int64_t j = N; j < ldc; j++)
                if (memcmp(&got[i * ldc + j], &hc[i * ldc + j], sizeof(float)) != 0)
                    fail_msg("gemm combo %d wrote C[%lld][%lld] past N", combo, (long long)i,
                             (long long)j);
        }
        char what[64];
        snprintf(what, sizeof what, "gemm slot %lldx%lldx%lld trans_a=%d trans_b=%d", (long long)M,
                 (long long)N, (long long)K, ta, tb);
        check_close(what, dense, want, M * N, 5e-5, 1e-5);
        free(ha), free(hb), free(hc), free(got), free(want), free(dense);
        ct_tensor_free(A), ct_tensor_free(B), ct_tensor_free(C);
    }
}

static void test_gemm_strided_slot(void **state) {
    (void)state;
    gemm_strided_case(be, 37, 29, 53);
    gemm_tiling t = ct_cpu_gemm_tiles(300, 517, 53);
    assert_true(t.n_row == 2 && t.n_col == 4 && t.cols == 144);
    gemm_strided_case(be, 300, 517, 53);
}

/* COOKTRAIN_CPU_SGEMM=openblas: the same tiles through cblas_sgemm, held to the same reference
 * (test_gemm_strided_slot), bit-identical on 1 and 3 threads (as test_determinism_threads holds
 * oneDNN's), and within twice that reference's tolerance of oneDNN's (each is within 4e-5 of the
 * exact product). */
static void test_gemm_openblas(void **state) {
    (void)state;
    setenv("COOKTRAIN_CPU_SGEMM", "openblas", 1);
    ct_backend *ob[2] = {ct_backend_cpu_new(1), ct_backend_cpu_new(3)};
    unsetenv("COOKTRAIN_CPU_SGEMM");
    gemm_strided_case(ob[1], 37, 29, 53);
    gemm_strided_case(ob[1], 300, 517, 53);
    const int64_t M = 300, N = 517, K = 53;
    float *ha = rand_floats(M * K, -1, 1), *hb = rand_floats(N * K, -1, 1);
    float *got[3];
    ct_backend *bs[3] = {ob[0], ob[1], be};
    for (int k = 0; k < 3; k++) {
        ct_tensor *A = t2(bs[k], M, K, ha), *B = t2(bs[k], N, K, hb), *C = t2(bs[k], M, N, NULL);
        ct_gemm(C, A, B, false, true, 1.0f, 0.0f);
        got[k] = host_of(C);
        ct_tensor_free(A), ct_tensor_free(B), ct_tensor_free(C);
    }
    if (memcmp(got[0], got[1], (size_t)(M * N) * sizeof(float)) != 0)
        fail_msg("OpenBLAS tiles: 1 and 3 threads differ");
    double *want = malloc((size_t)(M * N) * sizeof *want);
    for (int64_t i = 0; i < M * N; i++) want[i] = got[2][i];
    check_close("OpenBLAS against oneDNN", got[0], want, M * N, 8e-5, 1e-5);
    for (int k = 0; k < 3; k++) free(got[k]);
    free(ha), free(hb), free(want);
    ct_backend_free(ob[0]), ct_backend_free(ob[1]);
}

/* bf16 GEMMs run in the same fixed tiles: bit-identical on 1, 2 and 3 threads, bf16 and fp32 C, at
 * shapes where oneDNN left to its own threads splits K, which differ between machines: a small
 * layer's weight gradient over many tokens, 64x64x16384, on AVX512-BF16 (on an EPYC 68% of the
 * elements differed between 1 and 2 threads), and 128x128x8192 and 256x64x4096 with AMX (a Xeon:
 * 64x64x16384 stayed identical there, the two others differed). */
static void test_gemm_bf16_threads(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{64, 64, 16384}, {128, 128, 8192}, {256, 64, 4096}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *fa = rand_floats(K * M, -1, 1), *fb = rand_floats(K * N, -1, 1);
        uint16_t *ha = malloc((size_t)(K * M) * 2), *hb = malloc((size_t)(K * N) * 2);
        for (int64_t i = 0; i < K * M; i++) ha[i] = ct_f32_to_bf16(fa[i]);
        for (int64_t i = 0; i < K * N; i++) hb[i] = ct_f32_to_bf16(fb[i]);
        int64_t sa[2] = {K, M}, sb[2] = {K, N}, sc[2] = {M, N};
        for (int out = 0; out < 2; out++) {
            ct_dtype cd = out ? CT_DTYPE_BF16 : CT_DTYPE_F32;
            void *got[3];
            ct_backend *bs[3] = {be1, be, be3};
            for (int k = 0; k < 3; k++) {
                ct_tensor *A = tensor(bs[k], CT_DTYPE_BF16, 2, sa, ha);
                ct_tensor *B = tensor(bs[k], CT_DTYPE_BF16, 2, sb, hb);
                ct_tensor *C = tensor(bs[k], cd, 2, sc, NULL);
                ct_gemm(C, A, B, true, false, 1.0f, 0.0f); /* dW = dY^T X */
                got[k] = malloc(ct_tensor_bytes(C));
                ct_tensor_to_host(got[k], C);
                ct_tensor_free(A), ct_tensor_free(B), ct_tensor_free(C);
            }
            for (int k = 1; k < 3; k++)
                if (memcmp(got[0], got[k], (size_t)(M * N) * ct_dtype_size(cd)) != 0)
                    fail_msg("bf16 GEMM %lldx%lldx%lld into %s: 1 and %d threads differ",
                             (long long)M, (long long)N, (long long)K, ct_dtype_name(cd),
                             k == 1 ? 2 : 3);
            free(got[0]), free(got[1]), free(got[2]);
        }
        free(fa), free(fb), free(ha), free(hb);
    }
}

/* The CPU GEMM's tiles: they cover C exactly, there are at least GEMM_MIN_TILES and a multiple
 * of 4 of them unless the columns run out first, and a width-256 layer's weight gradient (one
 * row block) is split six ways instead of running on one thread. */
static void test_gemm_tiles(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{256, 768, 2048}, {256, 256, 2048},  {768, 768, 8192},
                                 {2048, 256, 256}, {4096, 256, 2048}, {300, 517, 53},
                                 {37, 29, 53},     {1, 100000, 64},   {2304, 768, 8192}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        gemm_tiling t = ct_cpu_gemm_tiles(M, N, K);
        assert_int_equal(t.n_row, (M + GEMM_ROW_BLOCK - 1) / GEMM_ROW_BLOCK);
        assert_true(t.cols >= 1 && t.n_col * t.cols >= N && (t.n_col - 1) * t.cols < N);
        if (t.n_col > 1) {
            assert_true(t.cols % 16 == 0 && t.cols >= GEMM_MIN_COLS);
            int64_t n = t.n_row * t.n_col;
            assert_true((n >= GEMM_MIN_TILES && n % 4 == 0) || t.n_col >= N / GEMM_MIN_COLS);
        } else {
            assert_int_equal(t.cols, N);
        }
    }
    gemm_tiling w = ct_cpu_gemm_tiles(256, 768, 2048);
    assert_true(w.n_row == 1 && w.n_col == 6 && w.cols == 128);
    w = ct_cpu_gemm_tiles(768, 768, 8192); /* GPT-2 124M's attention projection, 3 row blocks */
    assert_true(w.n_row == 3 && w.n_col == 4 && w.cols == 192);
    w = ct_cpu_gemm_tiles(2048, 256, 256); /* 8 row blocks: no split */
    assert_true(w.n_row == 8 && w.n_col == 1 && w.cols == 256);
    w = ct_cpu_gemm_tiles(37, 29, 53); /* too small to split */
    assert_true(w.n_col == 1 && w.cols == 29);
}

/* The wrapper on 2-D tensors (four transpose combos) and on an N-D tensor treated as
 * (rows, last dim). Same tolerance argument as above with K ≤ 70. */
static void test_gemm_wrapper(void **state) {
    (void)state;
    const int64_t M = 33, N = 20, K = 70;
    for (int combo = 0; combo < 4; combo++) {
        bool ta = combo & 1, tb = combo & 2;
        int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
        float *ha = rand_floats(a_rows * a_cols, -1, 1), *hb = rand_floats(b_rows * b_cols, -1, 1);
        float *hc = rand_floats(M * N, -1, 1);
        ct_tensor *A = t2(be, a_rows, a_cols, ha), *B = t2(be, b_rows, b_cols, hb);
        ct_tensor *C = t2(be, M, N, hc);
        ct_gemm(C, A, B, ta, tb, 1.25f, 0.5f);
        float *got = host_of(C);
        double *want = malloc((size_t)(M * N) * sizeof *want);
        gemm_ref(ta, tb, M, N, K, 1.25, ha, a_cols, hb, b_cols, 0.5, hc, N, want);
        check_close("gemm wrapper", got, want, M * N, 8e-5, 1e-5);
        free(ha), free(hb), free(hc), free(got), free(want);
        ct_tensor_free(A), ct_tensor_free(B), ct_tensor_free(C);
    }
    /* (2,3,K) · W(5,K)^T → (2,3,5), the shape of a linear layer on (B,T,C) activations */
    int64_t xs[3] = {2, 3, 16}, ys[3] = {2, 3, 5};
    float *hx = rand_floats(96, -1, 1), *hw = rand_floats(80, -1, 1);
    ct_tensor *X = tensor(be, CT_DTYPE_F32, 3, xs, hx), *W = t2(be, 5, 16, hw);
    ct_tensor *Y = tensor(be, CT_DTYPE_F32, 3, ys, NULL);
    ct_gemm(Y, X, W, false, true, 1.0f, 0.0f);
    float *got = host_of(Y);
    double want[30];
    float zeros[30] = {0};
    gemm_ref(false, true, 6, 5, 16, 1.0, hx, 16, hw, 16, 0.0, zeros, 5, want);
    check_close("gemm N-D", got, want, 30, 2e-5, 1e-5);
    free(hx), free(hw), free(got);
    ct_tensor_free(X), ct_tensor_free(W), ct_tensor_free(Y);
}

/* ---- bias, axpy, scale ----------------------------------------------------------------------- */

typedef struct {
    int64_t N, C;
    double *x, *bias, *R;
} bias_case;

static double bias_loss(void *ctx) {
    bias_case *c = ctx;
    double L = 0.0;
    for (int64_t i = 0; i < c->N; i++)
        for (int64_t j = 0; j < c->C; j++)
            L += (c->x[i * c->C + j] + c->bias[j]) * c->R[i * c->C + j];
    return L;
}

/* bias_add against x + bias (one rounding: 1 ulp); bias_grad accumulates on a non-zero dbias and
 * matches the finite-difference gradient of L = sum((x + bias) ⊙ R). N = 300 rows (not a multiple
 * of the 64-row chunk) of values in [-1, 1]: partial sums stay below ~10, so each addition rounds
 * by ≤ u·10 ≈ 6e-7 and 300 of them with random signs give ~sqrt(300)·6e-7 ≈ 1e-5: 2e-5 absolute. */
static void test_bias(void **state) {
    (void)state;
    const int64_t N = 300, C = 70;
    float *hx = rand_floats(N * C, -1, 1), *hb = rand_floats(C, -1, 1),
          *hr = rand_floats(N * C, -1, 1);
    float *hdb0 = rand_floats(C, -1, 1);
    ct_tensor *x = t2(be, N, C, hx), *b = t1(be, C, hb), *R = t2(be, N, C, hr),
              *db = t1(be, C, hdb0);
    ct_bias_add(x, b);
    float *got = host_of(x);
    double *want = malloc((size_t)(N * C) * sizeof *want);
    for (int64_t i = 0; i < N * C; i++) want[i] = (double)hx[i] + (double)hb[i % C];
    check_close("bias_add", got, want, N * C, 0, 1.2e-7);

    /* bias_init: a copy of the bias on every row (exact), or residual + bias (one rounding) */
    ct_tensor *y = t2(be, N, C, hr);
    ct_bias_init(y, b, NULL);
    float *got_init = host_of(y);
    for (int64_t i = 0; i < N * C; i++) want[i] = hb[i % C];
    check_close("bias_init", got_init, want, N * C, 0, 0);
    free(got_init);
    ct_tensor *res = t2(be, N, C, hx);
    ct_bias_init(y, b, res);
    got_init = host_of(y);
    for (int64_t i = 0; i < N * C; i++) want[i] = (double)hx[i] + (double)hb[i % C];
    check_close("bias_init + residual", got_init, want, N * C, 0, 1.2e-7);
    free(got_init);
    ct_tensor_free(y), ct_tensor_free(res);

    ct_bias_grad(db, R);
    float *gdb = host_of(db);
    bias_case bc = {N, C, to_double(hx, N * C), to_double(hb, C), to_double(hr, N * C)};
    double *fd = malloc((size_t)C * sizeof *fd);
    fd_grad(bias_loss, &bc, bc.bias, C, fd);
    for (int64_t j = 0; j < C; j++) fd[j] += hdb0[j]; /* accumulates */
    check_close("bias_grad vs finite differences", gdb, fd, C, 2e-5, 1e-6);
    free(hx), free(hb), free(hr), free(hdb0), free(got), free(want), free(gdb), free(fd);
    free(bc.x), free(bc.bias), free(bc.R);
    ct_tensor_free(x), ct_tensor_free(b), ct_tensor_free(R), ct_tensor_free(db);
}

/* axpy and scale are one or two roundings per element (fma or mul+add): 2 ulp (2·2^-24) relative
 * plus a tiny absolute term for cancellation in dst + alpha·src. */
static void test_axpy_scale(void **state) {
    (void)state;
    const int64_t n = 50001; /* above the parallel threshold, odd */
    float *hd = rand_floats(n, -1, 1), *hs = rand_floats(n, -1, 1);
    ct_tensor *d = t1(be, n, hd), *s = t1(be, n, hs);
    ct_axpy(d, s, -0.3f);
    float *got = host_of(d);
    double *want = malloc((size_t)n * sizeof *want);
    for (int64_t i = 0; i < n; i++) want[i] = (double)hd[i] + (double)-0.3f * (double)hs[i];
    check_close("axpy", got, want, n, 1e-7, 2.4e-7);
    ct_scale(s, 3.5f);
    float *gs = host_of(s);
    for (int64_t i = 0; i < n; i++) want[i] = 3.5 * (double)hs[i];
    check_close("scale", gs, want, n, 0, 1.2e-7);
    free(hd), free(hs), free(got), free(want), free(gs);
    ct_tensor_free(d), ct_tensor_free(s);
}

/* ---- embeddings ------------------------------------------------------------------------------ */

typedef struct {
    int64_t N, C, rows, row_offset;
    const int32_t *tok;
    double *table, *R;
} emb_case;

static double emb_loss(void *ctx) {
    emb_case *c = ctx;
    double L = 0.0;
    for (int64_t i = 0; i < c->N; i++) {
        int64_t r = c->tok[i] - c->row_offset;
        if (r < 0 || r >= c->rows) continue;
        L += dot(c->table + r * c->C, c->R + i * c->C, c->C);
    }
    return L;
}

/* The vocab-parallel slice: table rows [5, 15) of a 20-token vocabulary; tokens outside the slice
 * give zero rows in forward and nothing in backward; repeated tokens accumulate. Forward is a
 * copy (exact); backward sums at most a handful of rows (2e-6). */
static void test_embedding(void **state) {
    (void)state;
    const int64_t N = 40, C = 33, rows = 10, off = 5;
    int32_t tok[40];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rng_next() % 20);
    tok[0] = 4, tok[1] = 5, tok[2] = 14, tok[3] = 15, tok[4] = 7, tok[5] = 7; /* edges, repeats */
    float *htab = rand_floats(rows * C, -1, 1), *hr = rand_floats(N * C, -1, 1);
    float *hdt0 = rand_floats(rows * C, -1, 1);
    ct_tensor *tokens = ti32(be, N, tok), *table = t2(be, rows, C, htab);
    ct_tensor *out = t2(be, N, C, NULL), *R = t2(be, N, C, hr), *dtab = t2(be, rows, C, hdt0);
    ct_tensor_fill(out, 99.0f);
    ct_embedding_fwd(out, tokens, table, off);
    float *got = host_of(out);
    double *want = malloc((size_t)(N * C) * sizeof *want);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < C; j++) {
            int64_t r = tok[i] - off;
            want[i * C + j] = (r >= 0 && r < rows) ? htab[r * C + j] : 0.0;
        }
    check_close("embedding_fwd", got, want, N * C, 0, 0);

    ct_embedding_bwd(dtab, R, tokens, off);
    float *gdt = host_of(dtab);
    emb_case ec = {N, C, rows, off, tok, to_double(htab, rows * C), to_double(hr, N * C)};
    double *fd = malloc((size_t)(rows * C) * sizeof *fd);
    fd_grad(emb_loss, &ec, ec.table, rows * C, fd);
    for (int64_t i = 0; i < rows * C; i++) fd[i] += hdt0[i];
    check_close("embedding_bwd vs finite differences", gdt, fd, rows * C, 2e-6, 1e-6);
    free(htab), free(hr), free(hdt0), free(got), free(want), free(gdt), free(fd);
    free(ec.table), free(ec.R);
    ct_tensor_free(tokens), ct_tensor_free(table), ct_tensor_free(out), ct_tensor_free(R);
    ct_tensor_free(dtab);
}

/* Mixture of Experts' row movements against float64 loops: a plain gather (bitwise), weighted
 * sums of k rows (k products and k - 1 adds in fp32: within 2(k + 1)·u·Σ|w·r|, u = 2^-24; the
 * values here are below 1, so rtol 2e-6 on Σ|w·r| ≤ k is a bound with margin when given as atol
 * k·1e-6), an unweighted sum, and dot products in double (one rounding: rtol 1.2e-7). Repeated
 * and unused rows. */
static void test_gather_rows(void **state) {
    (void)state;
    const int64_t N = 13, C = 37, rows = 9;
    float *hin = rand_floats(rows * C, -1, 1), *hw = rand_floats(N * 3, -1, 1);
    int32_t idx[39];
    for (int i = 0; i < 39; i++) idx[i] = (int32_t)(rng_next() % 7); /* rows 7, 8 unused */
    idx[0] = idx[1] = 6;                                             /* repeats */
    ct_tensor *in = t2(be, rows, C, hin), *ix = ti32(be, N * 3, idx), *w = t1(be, N * 3, hw);
    ct_tensor *out = t2(be, N, C, NULL);
    for (int64_t k = 1; k <= 3; k++)
        for (int weighted = 0; weighted < 2; weighted++) {
            ct_tensor *ik = ct_tensor_view_1d(ix, 0, N * k), *wk = ct_tensor_view_1d(w, 0, N * k);
            ct_tensor_fill(out, 99.0f);
            ct_gather_rows(out, in, ik, weighted ? wk : NULL, k);
            float *got = host_of(out);
            double *want = calloc((size_t)(N * C), sizeof *want);
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < k; j++)
                    for (int64_t c = 0; c < C; c++)
                        want[i * C + c] +=
                            (weighted ? hw[i * k + j] : 1.0) * (double)hin[idx[i * k + j] * C + c];
            char what[64];
            snprintf(what, sizeof what, "gather_rows k=%lld%s", (long long)k,
                     weighted ? " weighted" : "");
            check_close(what, got, want, N * C, k == 1 && !weighted ? 0.0 : (double)k * 1e-6, 0.0);
            free(got), free(want);
            ct_tensor_free(ik), ct_tensor_free(wk);
        }
    /* dots: a (rows, C) by ia against b (N, C) by ib */
    float *hb = rand_floats(N * C, -1, 1);
    int32_t ib[13];
    for (int i = 0; i < N; i++) ib[i] = (int32_t)(N - 1 - i);
    ct_tensor *b = t2(be, N, C, hb), *ibt = ti32(be, N, ib), *ia = ct_tensor_view_1d(ix, 0, N);
    ct_tensor *dots = t1(be, N, NULL);
    ct_gather_dot(dots, in, ia, b, ibt);
    float *got = host_of(dots);
    double want[13];
    for (int64_t r = 0; r < N; r++) {
        want[r] = 0.0;
        for (int64_t c = 0; c < C; c++) want[r] += (double)hin[idx[r] * C + c] * hb[ib[r] * C + c];
    }
    check_close("gather_dot", got, want, N, 0.0, 1.2e-7);
    free(got), free(hin), free(hw), free(hb);
    ct_tensor_free(in), ct_tensor_free(ix), ct_tensor_free(w), ct_tensor_free(out);
    ct_tensor_free(b), ct_tensor_free(ibt), ct_tensor_free(ia), ct_tensor_free(dots);
}

typedef struct {
    int64_t B, T, C, off;
    double *wpe, *R;
} pos_case;

static double pos_loss(void *ctx) {
    pos_case *c = ctx;
    double L = 0.0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->T; t++)
            L += dot(c->wpe + (c->off + t) * c->C, c->R + (b * c->T + t) * c->C, c->C);
    return L;
}

/* Positions [4, 9) of a 12-row table; rows outside that window must not change in backward. */
static void test_posemb(void **state) {
    (void)state;
    const int64_t B = 3, T = 5, C = 24, P = 12, off = 4;
    float *hx = rand_floats(B * T * C, -1, 1), *hw = rand_floats(P * C, -1, 1);
    float *hr = rand_floats(B * T * C, -1, 1), *hdw0 = rand_floats(P * C, -1, 1);
    int64_t shape[3] = {B, T, C};
    ct_tensor *x = tensor(be, CT_DTYPE_F32, 3, shape, hx), *wpe = t2(be, P, C, hw);
    ct_tensor *R = tensor(be, CT_DTYPE_F32, 3, shape, hr), *dwpe = t2(be, P, C, hdw0);
    ct_posemb_fwd(x, wpe, B, T, off);
    float *got = host_of(x);
    double *want = malloc((size_t)(B * T * C) * sizeof *want);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < C; j++)
                want[(b * T + t) * C + j] =
                    (double)hx[(b * T + t) * C + j] + (double)hw[(off + t) * C + j];
    check_close("posemb_fwd", got, want, B * T * C, 0, 1.2e-7);

    ct_posemb_bwd(dwpe, R, B, T, off);
    float *gdw = host_of(dwpe);
    pos_case pc = {B, T, C, off, to_double(hw, P * C), to_double(hr, B * T * C)};
    double *fd = malloc((size_t)(P * C) * sizeof *fd);
    fd_grad(pos_loss, &pc, pc.wpe, P * C, fd);
    for (int64_t i = 0; i < P * C; i++) fd[i] += hdw0[i];
    check_close("posemb_bwd vs finite differences", gdw, fd, P * C, 2e-6, 1e-6);
    free(hx), free(hw), free(hr), free(hdw0), free(got), free(want), free(gdw), free(fd);
    free(pc.wpe), free(pc.R);
    ct_tensor_free(x), ct_tensor_free(wpe), ct_tensor_free(R), ct_tensor_free(dwpe);
}

/* ---- layernorm ------------------------------------------------------------------------------- */

typedef struct {
    int64_t N, C;
    double *inp, *w, *b, *R;
} ln_case;

static void ln_ref(const ln_case *c, double *out, double *mean, double *rstd) {
    for (int64_t i = 0; i < c->N; i++) {
        const double *x = c->inp + i * c->C;
        double m = 0.0, v = 0.0;
        for (int64_t j = 0; j < c->C; j++) m += x[j];
        m /= (double)c->C;
        for (int64_t j = 0; j < c->C; j++) v += (x[j] - m) * (x[j] - m);
        v /= (double)c->C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int64_t j = 0; j < c->C; j++) out[i * c->C + j] = (x[j] - m) * s * c->w[j] + c->b[j];
        if (mean) mean[i] = m, rstd[i] = s;
    }
}

static double ln_loss(void *ctx) {
    ln_case *c = ctx;
    double *out = malloc((size_t)(c->N * c->C) * sizeof *out);
    ln_ref(c, out, NULL, NULL);
    double L = dot(out, c->R, c->N * c->C);
    free(out);
    return L;
}

/*
 * N = 37 rows (not a multiple of the 64-row chunk) of C = 67 channels (not a multiple of 16 lanes);
 * a few rows carry a large common offset (+100), where a one-pass variance would cancel, and one
 * row has a variance of ~3e-6, where eps = 1e-5 dominates rstd (a wrong eps shows there). Forward:
 * normalised values are O(1), float32 row sums of 67 terms give ~1e-6 (with the +100 offset the
 * input itself is only known to u·100 ≈ 6e-6 relative to its spread of 1, hence 5e-5 absolute).
 * Backward against finite differences, accumulating into non-zero dinp/dw/db: gradients are O(1)
 * to O(10) (rstd ≈ 1.7), sums of ≤ 67 terms: 5e-5 absolute + 1e-4 relative.
 */
static void test_layernorm(void **state) {
    (void)state;
    const int64_t N = 37, C = 67;
    float *hx = rand_floats(N * C, -1, 1), *hw = rand_floats(C, 0.5f, 1.5f);
    float *hb = rand_floats(C, -0.5f, 0.5f), *hr = rand_floats(N * C, -1, 1);
    for (int64_t j = 0; j < C; j++) hx[3 * C + j] += 100.0f, hx[20 * C + j] -= 100.0f;
    for (int64_t j = 0; j < C; j++) hx[7 * C + j] *= 3e-3f; /* variance ~3e-6: eps matters */
    float *hdx0 = rand_floats(N * C, -1, 1), *hdw0 = rand_floats(C, -1, 1),
          *hdb0 = rand_floats(C, -1, 1);
    ct_tensor *inp = t2(be, N, C, hx), *w = t1(be, C, hw), *b = t1(be, C, hb);
    ct_tensor *out = t2(be, N, C, NULL), *mean = t1(be, N, NULL), *rstd = t1(be, N, NULL);
    ct_tensor *R = t2(be, N, C, hr), *dx = t2(be, N, C, hdx0), *dw = t1(be, C, hdw0);
    ct_tensor *db = t1(be, C, hdb0);
    ct_layernorm_fwd(out, mean, rstd, inp, w, b);

    ln_case lc = {
        N, C, to_double(hx, N * C), to_double(hw, C), to_double(hb, C), to_double(hr, N * C)};
    double *want = malloc((size_t)(N * C) * sizeof *want), wm[37], wr[37];
    ln_ref(&lc, want, wm, wr);
    float *got = host_of(out), *gm = host_of(mean), *gr = host_of(rstd);
    check_close("layernorm_fwd out", got, want, N * C, 5e-5, 1e-5);
    check_close("layernorm_fwd mean", gm, wm, N, 1e-6, 1e-6);
    check_close("layernorm_fwd rstd", gr, wr, N, 0, 2e-5);

    ct_layernorm_bwd(dx, dw, db, R, inp, w, mean, rstd);
    float *gdx = host_of(dx), *gdw = host_of(dw), *gdb = host_of(db);
    double *fdx = malloc((size_t)(N * C) * sizeof *fdx), fdw[67], fdb[67];
    fd_grad(ln_loss, &lc, lc.inp, N * C, fdx);
    fd_grad(ln_loss, &lc, lc.w, C, fdw);
    fd_grad(ln_loss, &lc, lc.b, C, fdb);
    for (int64_t i = 0; i < N * C; i++) fdx[i] += hdx0[i];
    for (int64_t j = 0; j < C; j++) fdw[j] += hdw0[j], fdb[j] += hdb0[j];
    check_close("layernorm_bwd dinp vs finite differences", gdx, fdx, N * C, 5e-5, 1e-4);
    check_close("layernorm_bwd dw vs finite differences", gdw, fdw, C, 5e-5, 1e-4);
    check_close("layernorm_bwd db vs finite differences", gdb, fdb, C, 5e-5, 1e-4);

    free(hx), free(hw), free(hb), free(hr), free(hdx0), free(hdw0), free(hdb0), free(want);
    free(got), free(gm), free(gr), free(gdx), free(gdw), free(gdb), free(fdx);
    free(lc.inp), free(lc.w), free(lc.b), free(lc.R);
    ct_tensor_free(inp), ct_tensor_free(w), ct_tensor_free(b), ct_tensor_free(out);
    ct_tensor_free(mean), ct_tensor_free(rstd), ct_tensor_free(R), ct_tensor_free(dx);
    ct_tensor_free(dw), ct_tensor_free(db);
}

/* ---- RMSNorm --------------------------------------------------------------------------------- */

typedef struct {
    int64_t N, C;
    double eps;
    double *inp, *w, *R;
} rms_case;

static void rms_ref(const rms_case *c, double *out, double *rstd) {
    for (int64_t i = 0; i < c->N; i++) {
        const double *x = c->inp + i * c->C;
        double ms = 0.0;
        for (int64_t j = 0; j < c->C; j++) ms += x[j] * x[j];
        double s = 1.0 / sqrt(ms / (double)c->C + c->eps);
        for (int64_t j = 0; j < c->C; j++) out[i * c->C + j] = x[j] * s * c->w[j];
        if (rstd) rstd[i] = s;
    }
}

static double rms_loss(void *ctx) {
    rms_case *c = ctx;
    double *out = malloc((size_t)(c->N * c->C) * sizeof *out);
    rms_ref(c, out, NULL);
    double L = dot(out, c->R, c->N * c->C);
    free(out);
    return L;
}

/*
 * N = 70 rows (two 64-row chunks, the second ragged) of C = 67 channels (not a multiple of 16
 * lanes); row 5 is scaled to mean square ~3e-7, where eps = 1e-5 dominates rstd (a wrong or
 * missing eps shows there), row 9 by 100 (rstd ~ 0.017). Forward: a sum of 67 squares, a square
 * root and three products: relative 1e-5 with 1e-6 absolute for the small values. Backward
 * against finite differences of the float64 reference, accumulating into non-zero dinp and dw:
 * gradients up to O(50) (rstd up to ~170 on row 5 times |w|·|R|), sums of <= 70 terms: 5e-5
 * absolute + 2e-4 relative. dw must also be bit-identical at 1 and 3 threads (chunked sums).
 */
static void test_rmsnorm(void **state) {
    (void)state;
    const int64_t N = 70, C = 67;
    const float eps = 1e-5f;
    float *hx = rand_floats(N * C, -1, 1), *hw = rand_floats(C, 0.5f, 1.5f);
    float *hr = rand_floats(N * C, -1, 1);
    for (int64_t j = 0; j < C; j++) hx[5 * C + j] *= 1e-3f, hx[9 * C + j] *= 100.0f;
    float *hdx0 = rand_floats(N * C, -1, 1), *hdw0 = rand_floats(C, -1, 1);
    ct_tensor *inp = t2(be, N, C, hx), *w = t1(be, C, hw), *out = t2(be, N, C, NULL);
    ct_tensor *rstd = t1(be, N, NULL), *R = t2(be, N, C, hr), *dx = t2(be, N, C, hdx0);
    ct_tensor *dw = t1(be, C, hdw0);
    ct_rmsnorm_fwd(out, rstd, inp, w, eps);

    rms_case rc = {N, C, eps, to_double(hx, N * C), to_double(hw, C), to_double(hr, N * C)};
    double *want = malloc((size_t)(N * C) * sizeof *want), wr[70];
    rms_ref(&rc, want, wr);
    float *got = host_of(out), *gr = host_of(rstd);
    check_close("rmsnorm_fwd out", got, want, N * C, 1e-6, 1e-5);
    check_close("rmsnorm_fwd rstd", gr, wr, N, 0, 1e-5);

    ct_rmsnorm_bwd(dx, dw, R, inp, w, rstd);
    float *gdx = host_of(dx), *gdw = host_of(dw);
    double *fdx = malloc((size_t)(N * C) * sizeof *fdx), fdw[67];
    fd_grad(rms_loss, &rc, rc.inp, N * C, fdx);
    fd_grad(rms_loss, &rc, rc.w, C, fdw);
    for (int64_t i = 0; i < N * C; i++) fdx[i] += hdx0[i];
    for (int64_t j = 0; j < C; j++) fdw[j] += hdw0[j];
    check_close("rmsnorm_bwd dinp vs finite differences", gdx, fdx, N * C, 5e-5, 2e-4);
    check_close("rmsnorm_bwd dw vs finite differences", gdw, fdw, C, 5e-5, 2e-4);

    ct_backend *bs[2] = {be1, be3};
    float *dws[2];
    for (int k = 0; k < 2; k++) {
        ct_tensor *i2 = t2(bs[k], N, C, hx), *w2 = t1(bs[k], C, hw), *r2 = t2(bs[k], N, C, hr);
        ct_tensor *o2 = t2(bs[k], N, C, NULL), *s2 = t1(bs[k], N, NULL);
        ct_tensor *dx2 = t2(bs[k], N, C, hdx0), *dw2 = t1(bs[k], C, hdw0);
        ct_rmsnorm_fwd(o2, s2, i2, w2, eps);
        ct_rmsnorm_bwd(dx2, dw2, r2, i2, w2, s2);
        dws[k] = host_of(dw2);
        ct_tensor_free(i2), ct_tensor_free(w2), ct_tensor_free(r2), ct_tensor_free(o2);
        ct_tensor_free(s2), ct_tensor_free(dx2), ct_tensor_free(dw2);
    }
    check_bits_equal("rmsnorm_bwd dw", dws[0], dws[1], (size_t)C * sizeof(float));

    free(hx), free(hw), free(hr), free(hdx0), free(hdw0), free(want), free(got), free(gr);
    free(gdx), free(gdw), free(fdx), free(rc.inp), free(rc.w), free(rc.R), free(dws[0]);
    free(dws[1]);
    ct_tensor_free(inp), ct_tensor_free(w), ct_tensor_free(out), ct_tensor_free(rstd);
    ct_tensor_free(R), ct_tensor_free(dx), ct_tensor_free(dw);
}

/* ---- rotary position embedding ----------------------------------------------------------------
 */

/* RoPE on row r of a (B·T, ld) buffer, in float64 from the angles themselves (not the table):
 * dims (2i, 2i+1) of each of the first n_rot heads rotate by (pos_offset + r % T)·theta^(-2i/hd),
 * by minus that when inverse. */
static void rope_ref(double *x, int64_t rows, int64_t T, int64_t n_rot, int64_t hd, int64_t ld,
                     int64_t pos_offset, double theta, bool inverse) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < n_rot; h++)
            for (int64_t i = 0; i < hd / 2; i++) {
                double ang = (double)(pos_offset + r % T) * pow(theta, -2.0 * (double)i / hd);
                double c = cos(ang), s = inverse ? -sin(ang) : sin(ang);
                double *v = x + r * ld + h * hd + 2 * i;
                double a = v[0], b = v[1];
                v[0] = a * c - b * s, v[1] = a * s + b * c;
            }
}

typedef struct {
    int64_t rows, T, n_rot, hd, ld, pos;
    double *x, *R;
} rope_case;

static double rope_loss(void *ctx) {
    rope_case *c = ctx;
    int64_t n = c->rows * c->ld;
    double *y = malloc((size_t)n * sizeof *y);
    memcpy(y, c->x, (size_t)n * sizeof *y);
    rope_ref(y, c->rows, c->T, c->n_rot, c->hd, c->ld, c->pos, 10000.0, false);
    double L = dot(y, c->R, n);
    free(y);
    return L;
}

/*
 * A packed qkv of B = 2, T = 5, 3 query heads and 1 kv head of hd = 8 (ld = 40; q and k rotate,
 * v does not), positions from 3, theta 10000. Forward against the float64 angles: the table's
 * fp32 cos and sin (relative 6e-8) and two products and a sum on values in [-1, 1]: 1e-6. The v
 * columns must come back bit for bit. Backward is the inverse rotation of the gradient: it must
 * match finite differences of sum(rope(x)⊙R) (1e-6), and rope then inverse must give x back
 * (rotations are orthogonal: 1e-6). The relative-position property: <R_m q, R_n k> depends only
 * on m - n, so scores at offsets 3 and 9 agree (64-term dot products of O(1) values: 1e-5).
 */
static void test_rope(void **state) {
    (void)state;
    const int64_t B = 2, T = 5, H = 3, KV = 1, hd = 8, ld = (H + 2 * KV) * hd, rows = B * T;
    const int64_t n_rot = H + KV, pos = 3, max_pos = 16;
    float *table = malloc((size_t)(max_pos * hd) * sizeof *table);
    ct_rope_table(table, max_pos, hd, 10000.0, NULL);
    ct_tensor *cs = t1(be, max_pos * hd, table);
    float *hx = rand_floats(rows * ld, -1, 1), *hr = rand_floats(rows * ld, -1, 1);
    ct_tensor *x = t2(be, rows, ld, hx);
    ct_rope(x, cs, B, T, n_rot, hd, pos, false);
    float *got = host_of(x);
    double *want = to_double(hx, rows * ld);
    rope_ref(want, rows, T, n_rot, hd, ld, pos, 10000.0, false);
    check_close("rope forward", got, want, rows * ld, 1e-6, 0);
    for (int64_t r = 0; r < rows; r++)
        check_bits_equal("rope leaves v alone", got + r * ld + n_rot * hd, hx + r * ld + n_rot * hd,
                         (size_t)(ld - n_rot * hd) * sizeof(float));
    ct_rope(x, cs, B, T, n_rot, hd, pos, true);
    float *back = host_of(x);
    double *orig = to_double(hx, rows * ld);
    check_close("rope then inverse", back, orig, rows * ld, 1e-6, 0);

    ct_tensor *g = t2(be, rows, ld, hr);
    ct_rope(g, cs, B, T, n_rot, hd, pos, true);
    float *gg = host_of(g);
    rope_case rc = {
        rows, T, n_rot, hd, ld, pos, to_double(hx, rows * ld), to_double(hr, rows * ld)};
    double *fd = malloc((size_t)(rows * ld) * sizeof *fd);
    fd_grad(rope_loss, &rc, rc.x, rows * ld, fd);
    check_close("rope inverse = backward, vs finite differences", gg, fd, rows * ld, 1e-6, 0);

    /* relative position: q at row 0 (position p), k at row 3 (p + 3), for p = 3 and 9 */
    double score[2];
    for (int k = 0; k < 2; k++) {
        ct_tensor *y = t2(be, rows, ld, hx);
        ct_rope(y, cs, B, T, n_rot, hd, k == 0 ? 3 : 9, false);
        float *hy = host_of(y);
        score[k] = 0.0;
        for (int64_t j = 0; j < hd; j++) score[k] += (double)hy[j] * hy[3 * ld + H * hd + j];
        free(hy), ct_tensor_free(y);
    }
    double want_score = score[0];
    check_close("rope scores depend on relative position only", (float[]){(float)score[1]},
                &want_score, 1, 1e-5, 0);

    free(table), free(hx), free(hr), free(got), free(want), free(back), free(orig), free(gg);
    free(rc.x), free(rc.R), free(fd);
    ct_tensor_free(cs), ct_tensor_free(x), ct_tensor_free(g);
}

/* Llama's arithmetic on the host (core/model/rope.h): the MLP width rule on the published shapes,
 * the table against double angles, and Llama 3.1's frequency scaling at its three regimes. */
static void test_llama_host_arithmetic(void **state) {
    (void)state;
    assert_int_equal(ct_llama_ffn_dim(4096, 0.0, 256), 11008);   /* Llama 2 7B */
    assert_int_equal(ct_llama_ffn_dim(4096, 1.3, 1024), 14336);  /* Llama 3 8B */
    assert_int_equal(ct_llama_ffn_dim(8192, 1.3, 4096), 28672);  /* Llama 2/3 70B */
    assert_int_equal(ct_llama_ffn_dim(16384, 1.2, 4096), 53248); /* Llama 3 405B */
    assert_int_equal(ct_llama_ffn_dim(256, 0.0, 256), 768);

    /* the table: cos and sin of pos·theta^(-2i/hd), rounded once to fp32 */
    float table[20 * 16];
    ct_rope_table(table, 20, 16, 10000.0, NULL);
    for (int64_t p = 0; p < 20; p++)
        for (int64_t i = 0; i < 8; i++) {
            double a = (double)p * pow(10000.0, -2.0 * (double)i / 16.0);
            assert_true(table[(p * 8 + i) * 2] == (float)cos(a));
            assert_true(table[(p * 8 + i) * 2 + 1] == (float)sin(a));
        }

    /* Llama 3.1 scaling (theta 500000, hd 128, factor 8, low 1, high 4, original 8192):
     * wavelengths under 8192/4 keep their frequency, over 8192/1 are slowed 8x, and those between
     * are blended strictly between the two, continuous at both ends */
    const ct_rope_scaling sc = {8.0, 1.0, 4.0, 8192};
    double plain[64], scaled[64];
    ct_rope_inv_freq(plain, 128, 500000.0, NULL);
    ct_rope_inv_freq(scaled, 128, 500000.0, &sc);
    int kept = 0, slowed = 0, blended = 0;
    for (int i = 0; i < 64; i++) {
        double wavelen = 2.0 * M_PI / plain[i];
        if (wavelen < 2048.0) {
            assert_true(scaled[i] == plain[i]), kept++;
        } else if (wavelen > 8192.0) {
            assert_true(fabs(scaled[i] - plain[i] / 8.0) <= 1e-15 * plain[i]), slowed++;
        } else {
            assert_true(scaled[i] > plain[i] / 8.0 && scaled[i] < plain[i]), blended++;
            double smooth = (8192.0 / wavelen - 1.0) / 3.0;
            assert_true(fabs(scaled[i] - ((1 - smooth) * plain[i] / 8 + smooth * plain[i])) <=
                        1e-15 * plain[i]);
        }
    }
    assert_true(kept > 0 && slowed > 0 && blended > 0);
}

/* ---- SwiGLU ---------------------------------------------------------------------------------- */

typedef struct {
    int64_t N, H;
    double *gu, *R; /* gate_up (N, 2H), R (N, H) */
} swiglu_case;

static double silu_ref(double a) {
    return a / (1.0 + exp(-a));
}

static double swiglu_loss(void *ctx) {
    swiglu_case *c = ctx;
    double L = 0.0;
    for (int64_t i = 0; i < c->N; i++)
        for (int64_t j = 0; j < c->H; j++)
            L += silu_ref(c->gu[i * 2 * c->H + j]) * c->gu[i * 2 * c->H + c->H + j] *
                 c->R[i * c->H + j];
    return L;
}

/*
 * N = 9 rows of H = 21 (not a multiple of 16), gate in [-12, 12] (σ saturates at both ends, where
 * e^-a overflows or vanishes), up in [-2, 2]. Forward against float64: a few roundings and exp's
 * ~1 ulp on values up to ~24: 1e-6 absolute + 1e-6 relative. Backward overwrites dgate_up (filled
 * with NaN first) and must match finite differences of sum(out⊙R): 1e-6 + 1e-5 relative.
 */
static void test_swiglu(void **state) {
    (void)state;
    const int64_t N = 9, H = 21;
    float *hgu = rand_floats(N * 2 * H, -2, 2), *hr = rand_floats(N * H, -1, 1);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < H; j++) hgu[i * 2 * H + j] *= 6.0f; /* the gates */
    float *nan = malloc((size_t)(N * 2 * H) * sizeof *nan);
    for (int64_t i = 0; i < N * 2 * H; i++) nan[i] = NAN;
    ct_tensor *gu = t2(be, N, 2 * H, hgu), *out = t2(be, N, H, NULL);
    ct_tensor *R = t2(be, N, H, hr), *dgu = t2(be, N, 2 * H, nan);
    ct_swiglu_fwd(out, gu);
    swiglu_case sc = {N, H, to_double(hgu, N * 2 * H), to_double(hr, N * H)};
    double *want = malloc((size_t)(N * H) * sizeof *want);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < H; j++)
            want[i * H + j] = silu_ref(sc.gu[i * 2 * H + j]) * sc.gu[i * 2 * H + H + j];
    float *got = host_of(out);
    check_close("swiglu_fwd", got, want, N * H, 1e-6, 1e-6);

    ct_swiglu_bwd(dgu, gu, R);
    float *gd = host_of(dgu);
    double *fd = malloc((size_t)(N * 2 * H) * sizeof *fd);
    fd_grad(swiglu_loss, &sc, sc.gu, N * 2 * H, fd);
    check_close("swiglu_bwd vs finite differences", gd, fd, N * 2 * H, 1e-6, 1e-5);

    free(hgu), free(hr), free(nan), free(want), free(got), free(gd), free(fd), free(sc.gu);
    free(sc.R);
    ct_tensor_free(gu), ct_tensor_free(out), ct_tensor_free(R), ct_tensor_free(dgu);
}

/* ---- GELU ------------------------------------------------------------------------------------ */

/* 0.5x(1 + tanh u) written as x/(1 + exp(-2u)) (the same function: 1 + tanh u = 2/(1 + e^{-2u})),
 * because 1 + tanh u cancels for negative u even in float64 (values below ~1e-16 would be lost). */
static double gelu_ref(double x) {
    const double k = sqrt(2.0 / M_PI);
    double u = k * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}

/*
 * Inputs over [-12, 12] plus 0, ±1e-4 and ±30 (saturated). Forward: a handful of float32 roundings
 * per element, relative (the logistic form has no cancellation for negative x, where gelu is
 * tiny) — except that exp(-2|u|) multiplies the relative rounding error of u by 2|u| (conditioning
 * of the function, not an error of the code), so the relative tolerance is 5e-7·(1 + 2|u|), plus
 * 1e-30 absolute for results that underflow (|gelu| < 1e-37).
 * Backward (elementwise, so the finite difference per element is the exact derivative up to
 * ~1e-10) times a random dout: 1e-7 absolute + 1e-5 relative.
 */
static void test_gelu(void **state) {
    (void)state;
    const int64_t n = 20003;
    float *hx = rand_floats(n, -12, 12), *hd = rand_floats(n, -1, 1);
    hx[0] = 0.0f, hx[1] = 30.0f, hx[2] = -30.0f, hx[3] = 1e-4f, hx[4] = -1e-4f;
    ct_tensor *x = t1(be, n, hx), *y = t1(be, n, NULL), *d = t1(be, n, hd), *dx = t1(be, n, NULL);
    ct_gelu_fwd(y, x);
    float *got = host_of(y);
    double *want = malloc((size_t)n * sizeof *want);
    for (int64_t i = 0; i < n; i++) {
        double x = hx[i], u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
        double w = gelu_ref(x), tol = 1e-30 + 5e-7 * (1.0 + 2.0 * fabs(u)) * fabs(w);
        if (!(fabs(got[i] - w) <= tol))
            fail_msg("gelu_fwd(%.9g) = %.9g, want %.9g (tolerance %g)", x, (double)got[i], w, tol);
        want[i] = w;
    }

    ct_gelu_bwd(dx, NULL, x, d);
    float *gdx = host_of(dx);
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++)
        want[i] = (gelu_ref((double)hx[i] + h) - gelu_ref((double)hx[i] - h)) / (2 * h) * hd[i];
    check_close("gelu_bwd vs finite differences", gdx, want, n, 1e-7, 1e-5);

    /* dinp may alias dout */
    ct_gelu_bwd(d, NULL, x, d);
    float *gal = host_of(d);
    check_bits_equal("gelu_bwd in place", gal, gdx, (size_t)n * sizeof(float));

    /* with dbias, as (N, C) = (150, 70) rows (not a multiple of the 64-row chunk): the same dinp,
     * and dbias bit-identical to bias_grad of that dinp on the same starting dbias */
    const int64_t N = 150, C = 70;
    float *hb0 = rand_floats(C, -1, 1);
    ct_tensor *x2 = t2(be, N, C, hx), *d2 = t2(be, N, C, hd), *dx2 = t2(be, N, C, NULL);
    ct_tensor *db_fused = t1(be, C, hb0), *db_apart = t1(be, C, hb0);
    ct_gelu_bwd(dx2, db_fused, x2, d2);
    float *gdx2 = host_of(dx2);
    check_bits_equal("gelu_bwd with dbias: dinp", gdx2, gdx, (size_t)(N * C) * sizeof(float));
    ct_bias_grad(db_apart, dx2);
    float *gf = host_of(db_fused), *ga = host_of(db_apart);
    check_bits_equal("gelu_bwd dbias vs bias_grad", gf, ga, (size_t)C * sizeof(float));
    free(hb0), free(gdx2), free(gf), free(ga);
    ct_tensor_free(x2), ct_tensor_free(d2), ct_tensor_free(dx2), ct_tensor_free(db_fused);
    ct_tensor_free(db_apart);
    free(hx), free(hd), free(got), free(want), free(gdx), free(gal);
    ct_tensor_free(x), ct_tensor_free(y), ct_tensor_free(d), ct_tensor_free(dx);
}

/* ---- attention ------------------------------------------------------------------------------- */

typedef struct {
    int64_t B, T, H, KV, hd;
    double *q, *k, *v, *R;
} attn_case;

/* Naive causal attention: the full (T, T) score matrix per (b, h), masked, softmax, times V. */
static void attn_ref(const attn_case *c, double *out, double *lse) {
    int64_t T = c->T, hd = c->hd, cq = c->H * hd, ckv = c->KV * hd, group = c->H / c->KV;
    double scale = 1.0 / sqrt((double)hd);
    double *S = malloc((size_t)(T * T) * sizeof *S);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++) {
            int64_t kvh = h / group;
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j < T; j++) {
                    if (j > i) {
                        S[i * T + j] = -INFINITY;
                        continue;
                    }
                    double s = 0.0;
                    for (int64_t d = 0; d < hd; d++)
                        s += c->q[(b * T + i) * cq + h * hd + d] *
                             c->k[(b * T + j) * ckv + kvh * hd + d];
                    S[i * T + j] = s * scale;
                }
            for (int64_t i = 0; i < T; i++) {
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < T; j++) mx = fmax(mx, S[i * T + j]);
                for (int64_t j = 0; j < T; j++) sum += exp(S[i * T + j] - mx);
                if (lse) lse[(b * c->H + h) * T + i] = mx + log(sum);
                for (int64_t d = 0; d < hd; d++) {
                    double o = 0.0;
                    for (int64_t j = 0; j < T; j++)
                        o += exp(S[i * T + j] - mx) / sum * c->v[(b * T + j) * ckv + kvh * hd + d];
                    out[(b * T + i) * cq + h * hd + d] = o;
                }
            }
        }
    free(S);
}

static double attn_loss(void *ctx) {
    attn_case *c = ctx;
    int64_t n = c->B * c->T * c->H * c->hd;
    double *out = malloc((size_t)n * sizeof *out);
    attn_ref(c, out, NULL);
    double L = dot(out, c->R, n);
    free(out);
    return L;
}

typedef struct {
    float *q, *k, *v, *dout;         /* inputs */
    float *out, *lse, *dq, *dk, *dv; /* outputs (malloc'd by attn_run) */
    float *dbias;                    /* 0.25 + column sums of dqkv, in the packed order */
} attn_io;

/* Moves rows between separate q (rows of cq), k, v (rows of ckv) and the packed q | k | v rows of
 * attention's qkv. */
static void qkv_pack(float *qkv, float *q, float *k, float *v, int64_t rows, int64_t cq,
                     int64_t ckv, bool to_packed) {
    int64_t ld = cq + 2 * ckv;
    for (int64_t r = 0; r < rows; r++) {
        float *row = qkv + r * ld;
        float *parts[3] = {q + r * cq, k + r * ckv, v + r * ckv};
        int64_t offs[3] = {0, cq, cq + ckv}, lens[3] = {cq, ckv, ckv};
        for (int i = 0; i < 3; i++) {
            if (to_packed)
                memcpy(row + offs[i], parts[i], (size_t)lens[i] * sizeof(float));
            else
                memcpy(parts[i], row + offs[i], (size_t)lens[i] * sizeof(float));
        }
    }
}

/* Runs forward and backward on backend b; dqkv is pre-filled with NaN to prove that backward
 * overwrites all of it. The bias gradient starts at 0.25 (it accumulates) and must equal that
 * plus the column sums of dqkv: at most 300 rows of values below ~10 round to ~1e-6, so 2e-5
 * absolute + 1e-5 relative. */
static void attn_run(ct_backend *b, const attn_case *c, attn_io *io) {
    int64_t rows = c->B * c->T, cq = c->H * c->hd, ckv = c->KV * c->hd;
    int64_t sq[3] = {c->B, c->T, cq}, sqkv[3] = {c->B, c->T, cq + 2 * ckv};
    float *packed = malloc((size_t)(rows * (cq + 2 * ckv)) * sizeof *packed);
    qkv_pack(packed, io->q, io->k, io->v, rows, cq, ckv, true);
    ct_tensor *qkv = tensor(b, CT_DTYPE_F32, 3, sqkv, packed);
    ct_tensor *out = tensor(b, CT_DTYPE_F32, 3, sq, NULL);
    int64_t sl[3] = {c->B, c->H, c->T};
    ct_tensor *lse = tensor(b, CT_DTYPE_F32, 3, sl, NULL);
    ct_tensor *dout = tensor(b, CT_DTYPE_F32, 3, sq, io->dout);
    ct_tensor *dqkv = tensor(b, CT_DTYPE_F32, 3, sqkv, NULL);
    ct_tensor *dbias = tensor(b, CT_DTYPE_F32, 1, &sqkv[2], NULL);
    ct_tensor_fill(dqkv, NAN);
    ct_tensor_fill(dbias, 0.25f);
    ct_attention_fwd(out, lse, qkv, c->B, c->T, c->H, c->KV);
    ct_attention_bwd(dqkv, dbias, dout, qkv, out, lse, c->B, c->T, c->H, c->KV);
    io->out = host_of(out), io->lse = host_of(lse), io->dbias = host_of(dbias);
    float *dpacked = host_of(dqkv);
    int64_t lqkv = cq + 2 * ckv;
    double *want_db = malloc((size_t)lqkv * sizeof *want_db);
    for (int64_t j = 0; j < lqkv; j++) {
        want_db[j] = 0.25;
        for (int64_t r = 0; r < rows; r++) want_db[j] += dpacked[r * lqkv + j];
    }
    check_close("attention_bwd dbias vs column sums of dqkv", io->dbias, want_db, lqkv, 2e-5, 1e-5);
    free(want_db);
    io->dq = malloc((size_t)(rows * cq) * sizeof(float));
    io->dk = malloc((size_t)(rows * ckv) * sizeof(float));
    io->dv = malloc((size_t)(rows * ckv) * sizeof(float));
    qkv_pack(dpacked, io->dq, io->dk, io->dv, rows, cq, ckv, false);
    free(packed), free(dpacked);
    ct_tensor_free(qkv), ct_tensor_free(out), ct_tensor_free(lse), ct_tensor_free(dout);
    ct_tensor_free(dqkv), ct_tensor_free(dbias);
}

static void attn_io_free(attn_io *io) {
    free(io->out), free(io->lse), free(io->dq), free(io->dk), free(io->dv), free(io->dbias);
}

/* q, k, v in [-1, 1] (scores |s| ≲ sqrt(hd)); one case end to end: forward (out and lse) against
 * the naive reference, backward against finite differences of the naive reference. Forward: out is
 * a convex combination of v rows computed from sums of hd products (~u·sqrt(hd)) and a softmax over
 * ≤ T terms (~u·sqrt(T)): ~1e-7 observed; 1e-6 absolute + 1e-5 relative. Backward: gradients O(1),
 * each a chain of two GEMMs over ≤ T·hd terms and a softmax, ~1e-7 observed; 5e-6 absolute + 1e-5
 * relative. */
static void attn_check(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
    attn_case c = {B, T, H, KV, hd, NULL, NULL, NULL, NULL};
    int64_t nq = B * T * H * hd, nkv = B * T * KV * hd;
    attn_io io = {.q = rand_floats(nq, -1, 1),
                  .k = rand_floats(nkv, -1, 1),
                  .v = rand_floats(nkv, -1, 1),
                  .dout = rand_floats(nq, -1, 1)};
    attn_run(be, &c, &io);
    c.q = to_double(io.q, nq), c.k = to_double(io.k, nkv), c.v = to_double(io.v, nkv);
    c.R = to_double(io.dout, nq);
    double *want = malloc((size_t)nq * sizeof *want),
           *wlse = malloc((size_t)(B * H * T) * sizeof *wlse);
    attn_ref(&c, want, wlse);
    char what[128];
    snprintf(what, sizeof what, "attention_fwd out B=%lld T=%lld H=%lld KV=%lld hd=%lld",
             (long long)B, (long long)T, (long long)H, (long long)KV, (long long)hd);
    check_close(what, io.out, want, nq, 1e-6, 1e-5);
    check_close("attention_fwd lse", io.lse, wlse, B * H * T, 1e-6, 1e-6);

    double *fq = malloc((size_t)nq * sizeof *fq), *fk = malloc((size_t)nkv * sizeof *fk);
    double *fv = malloc((size_t)nkv * sizeof *fv);
    fd_grad(attn_loss, &c, c.q, nq, fq);
    fd_grad(attn_loss, &c, c.k, nkv, fk);
    fd_grad(attn_loss, &c, c.v, nkv, fv);
    snprintf(what, sizeof what, "attention_bwd dq (T=%lld, H=%lld, KV=%lld)", (long long)T,
             (long long)H, (long long)KV);
    check_close(what, io.dq, fq, nq, 5e-6, 1e-5);
    snprintf(what, sizeof what, "attention_bwd dk (T=%lld, H=%lld, KV=%lld)", (long long)T,
             (long long)H, (long long)KV);
    check_close(what, io.dk, fk, nkv, 5e-6, 1e-5);
    snprintf(what, sizeof what, "attention_bwd dv (T=%lld, H=%lld, KV=%lld)", (long long)T,
             (long long)H, (long long)KV);
    check_close(what, io.dv, fv, nkv, 5e-6, 1e-5);
    free(want), free(wlse), free(fq), free(fk), free(fv);
    free(c.q), free(c.k), free(c.v), free(c.R);
    free(io.q), free(io.k), free(io.v), free(io.dout);
    attn_io_free(&io);
}

/* Multi-head (GPT-2 shape), T = 19: a full 16-row causal block and a ragged one. */
static void test_attention_mha(void **state) {
    (void)state;
    attn_check(2, 19, 3, 3, 8);
}

/* Grouped-query attention, n_head 4 over n_kv_head 2: dk/dv sum over the two query heads of a
 * group. T = 13: inside one causal block. */
static void test_attention_gqa(void **state) {
    (void)state;
    attn_check(2, 13, 4, 2, 8);
}

/* T = 70 is not a multiple of the 16-row causal block (nor of 16 lanes): exercises many blocks'
 * triangles, the ragged last block and the tails, with GQA. */
static void test_attention_long(void **state) {
    (void)state;
    attn_check(1, 70, 4, 2, 4);
}

/*
 * One decoding step against a key/value cache (ct_attention_decode). A random qkv (B, T, lq) in
 * [-1, 1) is run through ct_attention_fwd, and its rows are fed one position at a time (pos =
 * 0..T-1, each step's qkv (B, 1, lq) holding row pos of every sequence) into a zeroed cache
 * (B, T + 3, 2·KV·hd). Each step's out must be row pos of the forward's out and of the float64
 * reference (attn_ref); at the end the cache must hold every row's key and value heads bit for
 * bit, and its last 3 rows (never a pos) must still be 0.
 * Tolerances, derived per (b, h, pos) from the data and taken at their maximum over the run
 * (u = 2^-24, n = pos + 1 keys, s_j = scale·q·k_j, a_j = scale·Σ_d |q_d k_jd|, R = max s − min s):
 *   a score is within K·u·a_j of the exact one, K = hd + 5 (hd products summed in any order, the
 *   scale); a weight exp(s_j − max) within η = K·u·max a + u·R + 4u relative (the score, the
 *   rounding of s_j − max, the exp: glibc's expf within 1 ulp, the forward's exp_f32 within 2);
 *   out_d = Σ w_j v_jd / Σ w_j within (2η + (2n + 4)u)·Σ_j p_j·|v_jd| (the normalised weights 2η
 *   relative, two sums of n terms, the division).
 * Against float64 that bound, against attention_fwd twice it (both sides' errors). Random data
 * use a few percent of it (TEST_OPS_VERBOSE=1); a key missed or read from the wrong head moves
 * out by 10^-2 or more.
 */
static void decode_check(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
    const int64_t cq = H * hd, ckv = KV * hd, lq = cq + 2 * ckv, lkv = 2 * ckv, Tm = T + 3;
    const int64_t nq = B * T * cq, nkv = B * T * ckv, group = H / KV;
    float *x = rand_floats(B * T * lq, -1, 1);
    int64_t sqkv[3] = {B, T, lq}, sq[3] = {B, T, cq}, sl[3] = {B, H, T};
    ct_tensor *qkv = tensor(be, CT_DTYPE_F32, 3, sqkv, x);
    ct_tensor *out = tensor(be, CT_DTYPE_F32, 3, sq, NULL),
              *lse = tensor(be, CT_DTYPE_F32, 3, sl, NULL);
    ct_attention_fwd(out, lse, qkv, B, T, H, KV);
    float *fwd = host_of(out);

    int64_t skv[3] = {B, Tm, lkv}, s1[3] = {B, 1, lq}, so[3] = {B, 1, cq};
    ct_tensor *kv = tensor(be, CT_DTYPE_F32, 3, skv, NULL);
    ct_tensor *step = tensor(be, CT_DTYPE_F32, 3, s1, NULL),
              *dec = tensor(be, CT_DTYPE_F32, 3, so, NULL);
    ct_tensor_fill(kv, 0.0f);
    float *row = malloc((size_t)(B * lq) * sizeof *row), *got = malloc((size_t)nq * sizeof *got);
    float *o = malloc((size_t)(B * cq) * sizeof *o);
    for (int64_t pos = 0; pos < T; pos++) {
        for (int64_t b = 0; b < B; b++)
            memcpy(row + b * lq, x + (b * T + pos) * lq, (size_t)lq * sizeof *row);
        ct_tensor_from_host(step, row);
        ct_tensor_fill(dec, NAN); /* decode must write all of out */
        ct_attention_decode(dec, kv, step, pos, H, KV);
        ct_tensor_to_host(o, dec);
        for (int64_t b = 0; b < B; b++)
            memcpy(got + (b * T + pos) * cq, o + b * cq, (size_t)cq * sizeof *got);
    }

    /* the float64 reference and the bound of the comment above */
    float *q = malloc((size_t)nq * sizeof *q), *k = malloc((size_t)nkv * sizeof *k),
          *v = malloc((size_t)nkv * sizeof *v);
    qkv_pack(x, q, k, v, B * T, cq, ckv, false);
    attn_case c = {B, T, H, KV, hd, to_double(q, nq), to_double(k, nkv), to_double(v, nkv), NULL};
    double *want = malloc((size_t)nq * sizeof *want), *wfwd = to_double(fwd, nq);
    attn_ref(&c, want, NULL);
    const double u = 1.0 / 16777216.0, scale = 1.0 / sqrt((double)hd), K = (double)hd + 5;
    double *sj = malloc((size_t)T * sizeof *sj), bound = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                const double *qi = c.q + (b * T + i) * cq + h * hd;
                const double *k0 = c.k + b * T * ckv + h / group * hd,
                             *v0 = c.v + b * T * ckv + h / group * hd;
                double mx = -INFINITY, mn = INFINITY, amax = 0.0, sum = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    double dot = 0.0, a = 0.0;
                    for (int64_t d = 0; d < hd; d++)
                        dot += qi[d] * k0[j * ckv + d], a += fabs(qi[d] * k0[j * ckv + d]);
                    sj[j] = dot * scale, amax = fmax(amax, a * scale);
                    mx = fmax(mx, sj[j]), mn = fmin(mn, sj[j]);
                }
                for (int64_t j = 0; j <= i; j++) sum += exp(sj[j] - mx);
                const double eta = K * u * amax + u * (mx - mn) + 4 * u;
                for (int64_t d = 0; d < hd; d++) {
                    double pv = 0.0;
                    for (int64_t j = 0; j <= i; j++)
                        pv += exp(sj[j] - mx) / sum * fabs(v0[j * ckv + d]);
                    bound = fmax(bound, (2 * eta + (2.0 * (double)(i + 1) + 4) * u) * pv);
                }
            }
    char what[128];
    snprintf(what, sizeof what, "attention_decode vs float64 B=%lld T=%lld H=%lld KV=%lld hd=%lld",
             (long long)B, (long long)T, (long long)H, (long long)KV, (long long)hd);
    check_close(what, got, want, nq, bound, 0.0);
    snprintf(what, sizeof what, "attention_decode vs attention_fwd (H=%lld, KV=%lld)", (long long)H,
             (long long)KV);
    check_close(what, got, wfwd, nq, 2 * bound, 0.0);

    /* the cache: every row's key and value heads, bit for bit; rows T.. untouched (0) */
    float *hkv = host_of(kv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < Tm; j++) {
            const float *r = hkv + (b * Tm + j) * lkv;
            if (j < T) {
                if (memcmp(r, x + (b * T + j) * lq + cq, (size_t)lkv * sizeof *r))
                    fail_msg("attention_decode: cache row %lld of sequence %lld is not that "
                             "position's key and value heads",
                             (long long)j, (long long)b);
            } else {
                for (int64_t e = 0; e < lkv; e++)
                    if (r[e] != 0.0f)
                        fail_msg("attention_decode: cache row %lld of sequence %lld (never a pos) "
                                 "was written: [%lld] = %g",
                                 (long long)j, (long long)b, (long long)e, (double)r[e]);
            }
        }
    free(x), free(fwd), free(row), free(got), free(o), free(q), free(k), free(v), free(want),
        free(wfwd);
    free(sj), free(hkv), free(c.q), free(c.k), free(c.v);
    ct_tensor_free(qkv), ct_tensor_free(out), ct_tensor_free(lse), ct_tensor_free(kv);
    ct_tensor_free(step), ct_tensor_free(dec);
}

/* Grouped-query (4 query heads over 2 kv heads) with two sequences, and multi-head at hd 16 past
 * 16 positions (the forward's causal blocks). */
static void test_attention_decode(void **state) {
    (void)state;
    decode_check(2, 13, 4, 2, 8);
    decode_check(1, 37, 3, 3, 16);
}

/* ---- cross-entropy --------------------------------------------------------------------------- */

typedef struct {
    int64_t N, V, n_valid;
    const int32_t *targets;
    double *logits;
    double dloss;
} xent_case;

/* loss_i = log sum_{j < n_valid} exp(l_ij) - l_i,target (float64, no shift needed at this scale) */
static double xent_loss_ref(const xent_case *c, int64_t i) {
    double s = 0.0;
    for (int64_t j = 0; j < c->n_valid; j++) s += exp(c->logits[i * c->V + j]);
    return log(s) - c->logits[i * c->V + c->targets[i]];
}

static double xent_total(void *ctx) {
    xent_case *c = ctx;
    double L = 0.0;
    for (int64_t i = 0; i < c->N; i++) L += c->dloss * xent_loss_ref(c, i);
    return L;
}

typedef struct {
    float *rowmax, *sumexp, *tlogit, *loss, *grad;
} xent_out;

/* The three steps on one backend and one column range [col_offset, col_offset + V) of the logits;
 * when rowmax_in/sumexp_in/tlogit_in are given they replace this shard's values (as the tp
 * allreduces would). */
static void xent_steps(ct_backend *b, int64_t N, int64_t V, int64_t n_valid, int64_t col_offset,
                       const float *logits, const int32_t *targets, float dloss,
                       const float *rowmax_in, const float *sumexp_in, const float *tlogit_in,
                       xent_out *o) {
    ct_tensor *L = t2(b, N, V, logits), *tg = ti32(b, N, targets);
    ct_tensor *mx = t1(b, N, NULL), *se = t1(b, N, NULL), *tl = t1(b, N, NULL),
              *loss = t1(b, N, NULL);
    ct_xent_rowmax(mx, L, n_valid);
    o->rowmax = host_of(mx);
    if (rowmax_in) ct_tensor_from_host(mx, rowmax_in);
    ct_xent_sumexp(se, tl, L, tg, mx, n_valid, col_offset, true);
    o->sumexp = host_of(se), o->tlogit = host_of(tl);
    if (sumexp_in) ct_tensor_from_host(se, sumexp_in);
    if (tlogit_in) ct_tensor_from_host(tl, tlogit_in);
    ct_xent_finish(loss, L, tg, mx, se, tl, n_valid, col_offset, dloss, true);
    o->loss = host_of(loss), o->grad = host_of(L);
    ct_tensor_free(L), ct_tensor_free(tg), ct_tensor_free(mx), ct_tensor_free(se);
    ct_tensor_free(tl), ct_tensor_free(loss);
}

static void xent_out_free(xent_out *o) {
    free(o->rowmax), free(o->sumexp), free(o->tlogit), free(o->loss), free(o->grad);
}

/*
 * V = 40 columns of which n_valid = 37 (3 padded columns filled with huge values that must be
 * ignored), logits in [-4, 4]. Whole: losses against float64 (sum of 37 exps, log: 2e-6), gradient
 * against finite differences of dloss·sum_i loss_i (probabilities ≤ 1: 2e-7 absolute + 1e-5
 * relative), padded columns exactly 0. write_grad = false leaves the logits alone.
 * Split: the same rows on two column shards [0, 20) and [20, 40) (n_valid 20 and 17, col_offset 0
 * and 20), with max and sums combined by hand, give the whole run's losses and gradients (the
 * split changes only the summation order of sumexp: 1e-6 relative).
 */
static void test_xent(void **state) {
    (void)state;
    const int64_t N = 9, V = 40, nv = 37;
    const float dloss = 0.125f;
    float *hl = rand_floats(N * V, -4, 4);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = nv; j < V; j++) hl[i * V + j] = 1e4f; /* padding: must not count */
    int32_t tg[9];
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(rng_next() % nv);
    tg[0] = 0, tg[1] = 19, tg[2] = 20, tg[3] = 36; /* both sides of the shard boundary, the end */
    xent_out whole;
    xent_steps(be, N, V, nv, 0, hl, tg, dloss, NULL, NULL, NULL, &whole);

    xent_case xc = {N, V, nv, tg, to_double(hl, N * V), dloss};
    double wl[9], wmx[9], wtl[9];
    for (int64_t i = 0; i < N; i++) {
        wl[i] = xent_loss_ref(&xc, i);
        wmx[i] = -INFINITY;
        for (int64_t j = 0; j < nv; j++) wmx[i] = fmax(wmx[i], hl[i * V + j]);
        wtl[i] = hl[i * V + tg[i]];
    }
    check_close("xent rowmax", whole.rowmax, wmx, N, 0, 0);
    check_close("xent target_logit", whole.tlogit, wtl, N, 0, 0);
    check_close("xent loss", whole.loss, wl, N, 2e-6, 1e-6);
    double *fd = malloc((size_t)(N * V) * sizeof *fd);
    fd_grad(xent_total, &xc, xc.logits, N * V, fd);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = nv; j < V; j++) fd[i * V + j] = 0.0; /* padding: exactly 0 */
    check_close("xent grad vs finite differences", whole.grad, fd, N * V, 2e-7, 1e-5);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = nv; j < V; j++)
            if (whole.grad[i * V + j] != 0.0f)
                fail_msg("xent: padded column %lld has a gradient", (long long)j);

    /* keep_exp = false and write_grad = false leave the logits untouched (evaluation, sampling)
     * and give the same sums and losses as the training path */
    {
        ct_tensor *L = t2(be, N, V, hl), *t = ti32(be, N, tg), *mx = t1(be, N, whole.rowmax);
        ct_tensor *se = t1(be, N, NULL), *tl = t1(be, N, NULL), *loss = t1(be, N, NULL);
        ct_xent_sumexp(se, tl, L, t, mx, nv, 0, false);
        ct_xent_finish(loss, L, t, mx, se, tl, nv, 0, dloss, false);
        float *gl = host_of(L), *gloss = host_of(loss), *gse = host_of(se);
        check_bits_equal("xent without grad keeps logits", gl, hl, (size_t)(N * V) * sizeof(float));
        check_bits_equal("xent sumexp with/without keep_exp", gse, whole.sumexp,
                         (size_t)N * sizeof(float));
        check_bits_equal("xent finish loss with/without grad", gloss, whole.loss,
                         (size_t)N * sizeof(float));
        free(gl), free(gloss), free(gse);
        ct_tensor_free(L), ct_tensor_free(t), ct_tensor_free(mx), ct_tensor_free(se);
        ct_tensor_free(tl), ct_tensor_free(loss);
    }

    /* two column shards */
    const int64_t V0 = 20, V1 = V - V0;
    float *l0 = malloc((size_t)(N * V0) * sizeof *l0), *l1 = malloc((size_t)(N * V1) * sizeof *l1);
    for (int64_t i = 0; i < N; i++) {
        memcpy(l0 + i * V0, hl + i * V, (size_t)V0 * sizeof(float));
        memcpy(l1 + i * V1, hl + i * V + V0, (size_t)V1 * sizeof(float));
    }
    xent_out s0, s1, f0, f1;
    xent_steps(be, N, V0, V0, 0, l0, tg, dloss, NULL, NULL, NULL, &s0);
    xent_steps(be, N, V1, nv - V0, V0, l1, tg, dloss, NULL, NULL, NULL, &s1);
    float mx[9], se[9], tl[9];
    for (int64_t i = 0; i < N; i++) mx[i] = fmaxf(s0.rowmax[i], s1.rowmax[i]); /* allreduce MAX */
    /* the shard-local sumexp used the local max; redo step 2 with the global max (as the real
     * sequence does: MAX allreduce before sumexp) */
    xent_out_free(&s0), xent_out_free(&s1);
    xent_steps(be, N, V0, V0, 0, l0, tg, dloss, mx, NULL, NULL, &s0);
    xent_steps(be, N, V1, nv - V0, V0, l1, tg, dloss, mx, NULL, NULL, &s1);
    for (int64_t i = 0; i < N; i++) {
        se[i] = s0.sumexp[i] + s1.sumexp[i]; /* allreduce SUM */
        tl[i] = s0.tlogit[i] + s1.tlogit[i];
        /* the target is in exactly one shard; the other reports 0 */
        int64_t t = tg[i];
        float other = t < V0 ? s1.tlogit[i] : s0.tlogit[i];
        if (other != 0.0f)
            fail_msg("xent: target_logit %g from the shard without the target", (double)other);
    }
    xent_steps(be, N, V0, V0, 0, l0, tg, dloss, mx, se, tl, &f0);
    xent_steps(be, N, V1, nv - V0, V0, l1, tg, dloss, mx, se, tl, &f1);
    double dl[9];
    for (int64_t i = 0; i < N; i++) dl[i] = whole.loss[i];
    check_close("xent split loss shard 0", f0.loss, dl, N, 0, 1e-6);
    check_close("xent split loss shard 1", f1.loss, dl, N, 0, 1e-6);
    double *g0 = malloc((size_t)(N * V0) * sizeof *g0), *g1 = malloc((size_t)(N * V1) * sizeof *g1);
    float *cat0 = malloc((size_t)(N * V0) * sizeof *cat0),
          *cat1 = malloc((size_t)(N * V1) * sizeof *cat1);
    for (int64_t i = 0; i < N; i++) {
        for (int64_t j = 0; j < V0; j++) g0[i * V0 + j] = whole.grad[i * V + j];
        for (int64_t j = 0; j < V1; j++) g1[i * V1 + j] = whole.grad[i * V + V0 + j];
        memcpy(cat0 + i * V0, f0.grad + i * V0, (size_t)V0 * sizeof(float));
        memcpy(cat1 + i * V1, f1.grad + i * V1, (size_t)V1 * sizeof(float));
    }
    check_close("xent split grad shard 0", cat0, g0, N * V0, 1e-9, 1e-6);
    check_close("xent split grad shard 1", cat1, g1, N * V1, 1e-9, 1e-6);

    free(hl), free(xc.logits), free(fd), free(l0), free(l1), free(g0), free(g1), free(cat0),
        free(cat1);
    xent_out_free(&whole), xent_out_free(&s0), xent_out_free(&s1), xent_out_free(&f0),
        xent_out_free(&f1);
}

/* ---- AdamW ----------------------------------------------------------------------------------- */

/*
 * Hand-computed values. With a constant gradient g the bias-corrected moments are exactly g and g²
 * after every step, so each step moves the parameter by lr·(g/(|g| + eps) + wd·param):
 *   grad 0.5 × grad_scale 2 = g = 1, lr 0.1, beta1 0.9, beta2 0.999, eps 1e-8
 *   wd 0:   1 → 1 - 0.1·0.99999999 = 0.900000001 → 0.800000002
 *   wd 0.1: 1 → 1 - 0.1·(0.99999999 + 0.1) = 0.890000001 → 0.890000001 - 0.1·(0.99999999 +
 * 0.0890000001) = 0.781100002 m after two steps: (1 - b1)(1 + b1)·g = 1 - b1², v: 1 - b2², with the
 * betas as the float32 values the optimizer really uses (0.9f = 0.899999976, 0.999f = 0.999000013):
 * 0.190000043 and 0.001998974 (with exact decimals they would be 0.19 and 0.001999, off by 1.3e-5
 * relative). Layout: [0, 3) decayed, [3, 5) a padding gap, [5, 9) not decayed, [9] outside every
 * segment; the gap and the tail must keep their bytes. Float32 rounding: 1e-6 absolute on O(1)
 * values.
 */
static void test_adamw_hand(void **state) {
    (void)state;
    const int64_t n = 10;
    float hp[10], hg[10], hm[10], hv[10];
    for (int i = 0; i < n; i++) hp[i] = 1.0f, hg[i] = 0.5f, hm[i] = 0.0f, hv[i] = 0.0f;
    hp[3] = 7.0f, hp[4] = -7.0f, hp[9] = 3.0f, hm[3] = 0.25f, hv[4] = 0.5f; /* sentinels */
    ct_tensor *p = t1(be, n, hp), *g = t1(be, n, hg), *m = t1(be, n, hm), *v = t1(be, n, hv);
    ct_adamw_segment seg[2] = {{0, 3, 0.1f}, {5, 4, 0.0f}};
    ct_adamw_hparams hpar = {
        .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 1, .grad_scale = 2.0f};
    ct_adamw(p, g, m, v, seg, 2, &hpar, NULL);
    float *p1 = host_of(p);
    double w1[10] = {0.890000001, 0.890000001, 0.890000001, 7,           -7,
                     0.900000001, 0.900000001, 0.900000001, 0.900000001, 3};
    check_close("adamw step 1", p1, w1, n, 1e-6, 0);
    hpar.step = 2;
    ct_adamw(p, g, m, v, seg, 2, &hpar, NULL);
    float *p2 = host_of(p), *m2 = host_of(m), *v2 = host_of(v);
    double w2[10] = {0.781100002, 0.781100002, 0.781100002, 7,           -7,
                     0.800000002, 0.800000002, 0.800000002, 0.800000002, 3};
    check_close("adamw step 2", p2, w2, n, 1e-6, 0);
    const double m2w = 1.0 - (double)0.9f * (double)0.9f,
                 v2w = 1.0 - (double)0.999f * (double)0.999f;
    double wm[10] = {m2w, m2w, m2w, 0.25, 0, m2w, m2w, m2w, m2w, 0};
    double wv[10] = {v2w, v2w, v2w, 0, 0.5, v2w, v2w, v2w, v2w, 0};
    check_close("adamw m", m2, wm, n, 1e-7, 1e-6);
    check_close("adamw v", v2, wv, n, 1e-9, 1e-5);
    int gap[3] = {3, 4, 9};
    for (int i = 0; i < 3; i++) {
        int j = gap[i];
        if (memcmp(&p2[j], &hp[j], 4) || memcmp(&m2[j], &hm[j], 4) || memcmp(&v2[j], &hv[j], 4))
            fail_msg("adamw touched element %d outside the segments", j);
    }
    free(p1), free(p2), free(m2), free(v2);
    ct_tensor_free(p), ct_tensor_free(g), ct_tensor_free(m), ct_tensor_free(v);
}

/* Random values, two steps, against the textbook update in float64 (decoupled decay; bias
 * correction 1 - beta^t) with the hyperparameters as the float32 values passed in. Parameters:
 * the float32 chain has ~10 roundings per element; 1e-6 absolute + 1e-5 relative on O(1) values
 * (updates are ≤ lr·(1 + wd·|p|) ≈ 3e-3). m = b1·m + (1-b1)·g can cancel to a value much smaller
 * than its terms (~0.1): its error is u·|terms| ≈ 1e-8 absolute, hence 3e-8 absolute there. */
static void test_adamw_random(void **state) {
    (void)state;
    const int64_t n = 40000;
    float *hp = rand_floats(n, -1, 1), *hg = rand_floats(n, -1, 1), *hg2 = rand_floats(n, -1, 1);
    float *hm = rand_floats(n, -0.1f, 0.1f), *hv = rand_floats(n, 0, 0.01f);
    ct_tensor *p = t1(be, n, hp), *g = t1(be, n, hg), *m = t1(be, n, hm), *v = t1(be, n, hv);
    ct_adamw_segment seg[2] = {{0, 25000, 0.05f}, {25100, 14000, 0.0f}};
    ct_adamw_hparams hpar = {
        .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 5, .grad_scale = 0.8f};
    double *rp = to_double(hp, n), *rm = to_double(hm, n), *rv = to_double(hv, n);
    for (int s = 0; s < 2; s++) {
        if (s == 1) ct_tensor_from_host(g, hg2);
        const float *gr = s ? hg2 : hg;
        for (int k = 0; k < 2; k++)
            for (int64_t i = seg[k].offset; i < seg[k].offset + seg[k].count; i++) {
                double gg = (double)gr[i] * (double)hpar.grad_scale;
                double b1 = hpar.beta1, b2 = hpar.beta2;
                rm[i] = b1 * rm[i] + (1 - b1) * gg;
                rv[i] = b2 * rv[i] + (1 - b2) * gg * gg;
                double mh = rm[i] / (1 - pow(b1, (double)hpar.step));
                double vh = rv[i] / (1 - pow(b2, (double)hpar.step));
                rp[i] -= (double)hpar.lr *
                         (mh / (sqrt(vh) + (double)hpar.eps) + (double)seg[k].weight_decay * rp[i]);
            }
        ct_adamw(p, g, m, v, seg, 2, &hpar, NULL);
        hpar.step++;
    }
    float *gp = host_of(p), *gm = host_of(m), *gv = host_of(v);
    check_close("adamw param", gp, rp, n, 1e-6, 1e-5);
    check_close("adamw m", gm, rm, n, 3e-8, 1e-5);
    check_close("adamw v", gv, rv, n, 1e-10, 1e-5);
    for (int64_t i = 25000; i < 25100; i++)
        if (gp[i] != hp[i]) fail_msg("adamw changed gap element %lld", (long long)i);
    free(hp), free(hg), free(hg2), free(hm), free(hv), free(rp), free(rm), free(rv);
    free(gp), free(gm), free(gv);
    ct_tensor_free(p), ct_tensor_free(g), ct_tensor_free(m), ct_tensor_free(v);
}

/* ---- sumsq ----------------------------------------------------------------------------------- */

/* Sum of squares in double, rounded once to float: within 1 ulp of the float64 sum (1.2e-7
 * relative). n spans several 4096-element chunks plus a ragged tail; the result lands at index 2
 * and the other elements of out are left alone. */
static void test_sumsq(void **state) {
    (void)state;
    const int64_t n = 3 * 4096 + 123;
    float *hx = rand_floats(n, -3, 3);
    ct_tensor *x = t1(be, n, hx), *out = t1(be, 4, NULL);
    ct_tensor_fill(out, -1.0f);
    ct_sumsq(out, 2, &x, 1);
    float *got = host_of(out);
    double want[4] = {-1, -1, 0, -1};
    for (int64_t i = 0; i < n; i++) want[2] += (double)hx[i] * hx[i];
    check_close("sumsq", got, want, 4, 0, 1.2e-7);
    /* A constant input: float32 accumulation would drift by ~lanes·n·u/2 relative (each of the
     * thousands of additions rounds the same way), which only double accumulation avoids. */
    for (int64_t i = 0; i < n; i++) hx[i] = 0.3f;
    ct_tensor_from_host(x, hx);
    ct_sumsq(out, 0, &x, 1);
    free(got);
    got = host_of(out);
    want[0] = (double)n * (double)0.3f * (double)0.3f;
    check_close("sumsq constant", got, want, 4, 0, 1.2e-7);
    free(hx), free(got);
    ct_tensor_free(x), ct_tensor_free(out);
}

/* ---- cast ------------------------------------------------------------------------------------ */

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 -> bf16 on known bit patterns (ties go to even, carries into the exponent, overflow to inf,
 * NaN stays NaN even when only low mantissa bits are set), and bf16 -> f32 -> bf16 is the identity
 * on all 65536 patterns (NaNs stay NaNs). */
static void test_cast(void **state) {
    (void)state;
    struct {
        uint32_t in;
        uint16_t out;
    } known[] = {
        {0x3F800000u, 0x3F80}, /* 1.0 */
        {0x3F808000u, 0x3F80}, /* 1 + 2^-8: tie, even stays */
        {0x3F818000u, 0x3F82}, /* tie, odd rounds up to even */
        {0x3F808001u, 0x3F81}, /* just above the tie */
        {0x3F807FFFu, 0x3F80}, /* just below the tie */
        {0xBF80C000u, 0xBF81}, /* negative rounds by magnitude */
        {0x3FFFFFFFu, 0x4000}, /* carry into the exponent */
        {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX rounds to +inf */
        {0x7F800000u, 0x7F80}, /* +inf */
        {0xFF800000u, 0xFF80}, /* -inf */
        {0x80000000u, 0x8000}, /* -0 */
        {0x00000001u, 0x0000}, /* tiny denormal rounds to 0 */
    };
    const int nk = (int)(sizeof known / sizeof known[0]);
    float in[16];
    for (int i = 0; i < nk; i++) in[i] = f32_from_bits(known[i].in);
    in[nk] = f32_from_bits(0x7FC00000u);     /* quiet NaN */
    in[nk + 1] = f32_from_bits(0x7F800001u); /* NaN with only the lowest bit set */
    in[nk + 2] = f32_from_bits(0xFFFF0000u); /* negative NaN */
    int n = nk + 3;
    int64_t s1[1] = {n};
    ct_tensor *f = tensor(be, CT_DTYPE_F32, 1, s1, in), *h = tensor(be, CT_DTYPE_BF16, 1, s1, NULL);
    ct_cast(h, f);
    uint16_t got[16];
    ct_tensor_to_host(got, h);
    for (int i = 0; i < nk; i++)
        if (got[i] != known[i].out)
            fail_msg("cast f32 0x%08X -> bf16 0x%04X, want 0x%04X", known[i].in, got[i],
                     known[i].out);
    for (int i = nk; i < n; i++)
        if ((got[i] & 0x7F80) != 0x7F80 || (got[i] & 0x007F) == 0)
            fail_msg("cast: NaN input %d became 0x%04X (not a NaN)", i, got[i]);

    int64_t s2[1] = {65536};
    uint16_t *all = malloc(65536 * sizeof *all), *back = malloc(65536 * sizeof *back);
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    ct_tensor *b16 = tensor(be, CT_DTYPE_BF16, 1, s2, all),
              *f32 = tensor(be, CT_DTYPE_F32, 1, s2, NULL);
    ct_tensor *b16b = tensor(be, CT_DTYPE_BF16, 1, s2, NULL);
    ct_cast(f32, b16);
    ct_cast(b16b, f32);
    float *fv = host_of(f32);
    ct_tensor_to_host(back, b16b);
    for (int i = 0; i < 65536; i++) {
        uint32_t fb;
        memcpy(&fb, &fv[i], 4);
        if (fb != (uint32_t)i << 16) fail_msg("cast bf16 0x%04X -> f32 0x%08X", i, fb);
        bool nan = (i & 0x7F80) == 0x7F80 && (i & 0x7F) != 0;
        if (nan ? !((back[i] & 0x7F80) == 0x7F80 && (back[i] & 0x7F) != 0) : back[i] != i)
            fail_msg("cast round trip 0x%04X -> 0x%04X", i, back[i]);
    }
    /* fill on bf16 writes the rounded pattern */
    ct_tensor_fill(h, 1.5f);
    ct_tensor_to_host(got, h);
    for (int i = 0; i < n; i++)
        if (got[i] != 0x3FC0) fail_msg("bf16 fill 1.5 gave 0x%04X", got[i]);
    free(all), free(back), free(fv);
    ct_tensor_free(f), ct_tensor_free(h), ct_tensor_free(b16), ct_tensor_free(f32),
        ct_tensor_free(b16b);
}

/* ---- tensors and memory accounting ----------------------------------------------------------- */

static void test_tensors_and_accounting(void **state) {
    (void)state;
    ct_backend *b = ct_backend_cpu_new(1); /* the CPU backend itself: its describe slot */
    char what[64];
    ct_backend_describe(b, what, sizeof what);
    assert_string_equal(what, "cpu, 1 thread");
    assert_int_equal(ct_backend_mem_total(b), 0);
    int64_t shape[3] = {2, 3, 5};
    ct_tensor *t = ct_tensor_new(b, CT_DTYPE_F32, 3, shape, CT_MEM_PARAMS);
    assert_non_null(t);
    assert_int_equal(ct_tensor_rows(t), 6);
    assert_int_equal(ct_tensor_cols(t), 5);
    assert_int_equal(ct_tensor_bytes(t), 120);
    assert_true((uintptr_t)t->data % 64 == 0);
    ct_tensor *g = ct_tensor_new_2d(b, CT_DTYPE_BF16, 4, 8, CT_MEM_GRADS);
    assert_int_equal(ct_backend_mem(b, CT_MEM_PARAMS), 120);
    assert_int_equal(ct_backend_mem(b, CT_MEM_GRADS), 64);
    assert_int_equal(ct_backend_mem_total(b), 184);

    /* views: no new memory, right offset, category of the parent */
    ct_tensor *v = ct_tensor_view_2d(t, 10, 4, 5);
    assert_int_equal(ct_backend_mem_total(b), 184);
    assert_ptr_equal(v->data, (float *)t->data + 10);
    assert_int_equal(v->category, CT_MEM_PARAMS);
    assert_false(v->owns_data);
    float host[30];
    for (int i = 0; i < 30; i++) host[i] = (float)i;
    ct_tensor_from_host(t, host);
    ct_tensor_fill(v, -2.0f);
    float back[30];
    ct_tensor_to_host(back, t);
    for (int i = 0; i < 30; i++) assert_true(back[i] == (i >= 10 ? -2.0f : (float)i));
    ct_tensor *c = ct_tensor_new_1d(b, CT_DTYPE_F32, 30, CT_MEM_ACTS);
    ct_tensor_copy(c, t);
    ct_tensor_zero(v);
    ct_tensor_to_host(back, c);
    assert_true(back[12] == -2.0f && back[3] == 3.0f);
    ct_tensor_free(v);
    assert_int_equal(ct_backend_mem_total(b), 304);

    /* peak survives a free */
    ct_tensor_free(c);
    ct_tensor_free(g);
    assert_int_equal(ct_backend_mem(b, CT_MEM_GRADS), 0);
    assert_int_equal(b->peak_bytes[CT_MEM_GRADS], 64);
    assert_int_equal(b->peak_bytes[CT_MEM_ACTS], 120);
    assert_string_equal(ct_mem_category_name(CT_MEM_OPTIM), "optim");

    /* out of memory: NULL, a runtime error naming bytes and category, a hint, nothing counted */
    ct_error_clear();
    ct_tensor *huge = ct_tensor_new_1d(b, CT_DTYPE_F32, (int64_t)1 << 60, CT_MEM_WORKSPACE);
    assert_null(huge);
    assert_non_null(strstr(ct_error_message(), "workspace"));
    assert_non_null(strstr(ct_error_message(), "4611686018427387904 bytes"));
    assert_true(strlen(ct_error_hint()) > 0);
    assert_int_equal(ct_backend_mem(b, CT_MEM_WORKSPACE), 0);
    ct_error_clear();

    /* integer fill */
    ct_tensor *ti = ct_tensor_new_1d(b, CT_DTYPE_I32, 5, CT_MEM_ACTS);
    ct_tensor_fill(ti, 7.0f);
    int32_t ib[5];
    ct_tensor_to_host(ib, ti);
    for (int i = 0; i < 5; i++) assert_int_equal(ib[i], 7);
    ct_tensor_free(ti);
    ct_tensor_free(t);
    ct_tensor_free(NULL);
    assert_int_equal(ct_backend_mem_total(b), 0);
    ct_backend_free(b);
}

/* ---- determinism across thread counts -------------------------------------------------------- */

/* Every reducing op, on shapes large enough to take the multithreaded paths, on a 1-thread and a
 * 3-thread backend: results must be bit-identical (core/README.md, Determinism: bit-exact resume
 * survives a change of threads per rank). */
static void test_determinism_threads(void **state) {
    (void)state;
    ct_backend *bes[2] = {be1, be3};
    float *res[2][24] = {{0}};
    size_t res_bytes[24] = {0};
    int nres = 0;

    /* shared inputs */
    const int64_t N = 1000, C = 200, Pn = 300;
    float *x = rand_floats(N * C, -1, 1), *d = rand_floats(N * C, -1, 1);
    float *w = rand_floats(C, 0.5f, 1.5f), *bb = rand_floats(C, -1, 1);
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int64_t i = 0; i < N; i++) tok[i] = (int32_t)(rng_next() % 60); /* many repeats */
    const int64_t sq_n = 300001;
    float *sq = rand_floats(sq_n, -2, 2);
    const int64_t XN = 64, XV = 1000, XVALID = 990;
    float *xl = rand_floats(XN * XV, -5, 5);
    int32_t xt[64];
    for (int i = 0; i < XN; i++) xt[i] = (int32_t)(rng_next() % XVALID);
    float *gA = rand_floats(333 * 200, -1, 1), *gB = rand_floats(200 * 517, -1, 1);
    float *gC = rand_floats(333 * 517, -1, 1);
    attn_case ac = {2, 150, 4, 2, 16, NULL, NULL, NULL, NULL};
    int64_t nq = 2 * 150 * 4 * 16, nkv = 2 * 150 * 2 * 16;
    attn_io aio_in = {.q = rand_floats(nq, -1, 1),
                      .k = rand_floats(nkv, -1, 1),
                      .v = rand_floats(nkv, -1, 1),
                      .dout = rand_floats(nq, -1, 1)};

    for (int k = 0; k < 2; k++) {
        ct_backend *b = bes[k];
        int r = 0;
        /* bias_grad */
        ct_tensor *td = t2(b, N, C, d), *db = t1(b, C, bb);
        ct_bias_grad(db, td);
        res[k][r] = host_of(db), res_bytes[r++] = (size_t)C * 4;
        /* gelu_bwd with its bias gradient */
        ct_tensor *gx = t2(b, N, C, x), *gdx = t2(b, N, C, NULL), *gdb = t1(b, C, bb);
        ct_gelu_bwd(gdx, gdb, gx, td);
        res[k][r] = host_of(gdx), res_bytes[r++] = (size_t)(N * C) * 4;
        res[k][r] = host_of(gdb), res_bytes[r++] = (size_t)C * 4;
        ct_tensor_free(gx), ct_tensor_free(gdx), ct_tensor_free(gdb);
        /* layernorm fwd + bwd */
        ct_tensor *tx = t2(b, N, C, x), *tw = t1(b, C, w), *tb = t1(b, C, bb),
                  *to = t2(b, N, C, NULL);
        ct_tensor *tm = t1(b, N, NULL), *ts = t1(b, N, NULL), *tdx = t2(b, N, C, d);
        ct_tensor *tdw = t1(b, C, w), *tdb = t1(b, C, bb);
        ct_layernorm_fwd(to, tm, ts, tx, tw, tb);
        ct_layernorm_bwd(tdx, tdw, tdb, td, tx, tw, tm, ts);
        res[k][r] = host_of(to), res_bytes[r++] = (size_t)(N * C) * 4;
        res[k][r] = host_of(tdx), res_bytes[r++] = (size_t)(N * C) * 4;
        res[k][r] = host_of(tdw), res_bytes[r++] = (size_t)C * 4;
        res[k][r] = host_of(tdb), res_bytes[r++] = (size_t)C * 4;
        /* posemb_bwd: (B=4, T=250, C) into a 300-row table at offset 20 */
        ct_tensor *wpe = t2(b, Pn, C, NULL);
        ct_tensor_fill(wpe, 0.5f);
        ct_posemb_bwd(wpe, td, 4, 250, 20);
        res[k][r] = host_of(wpe), res_bytes[r++] = (size_t)(Pn * C) * 4;
        /* embedding_bwd: 60-token vocabulary, rows [10, 60) on this shard */
        ct_tensor *tt = ti32(b, N, tok), *dtab = t2(b, 50, C, NULL);
        ct_tensor_zero(dtab);
        ct_embedding_bwd(dtab, td, tt, 10);
        res[k][r] = host_of(dtab), res_bytes[r++] = (size_t)(50 * C) * 4;
        /* sumsq */
        ct_tensor *tsq = t1(b, sq_n, sq), *out = t1(b, 1, NULL);
        ct_sumsq(out, 0, &tsq, 1);
        res[k][r] = host_of(out), res_bytes[r++] = 4;
        /* cross-entropy, three steps */
        xent_out xo;
        xent_steps(b, XN, XV, XVALID, 0, xl, xt, 1.0f / 64, NULL, NULL, NULL, &xo);
        res[k][r] = xo.sumexp, res_bytes[r++] = XN * 4;
        res[k][r] = xo.loss, res_bytes[r++] = XN * 4;
        res[k][r] = xo.grad, res_bytes[r++] = (size_t)(XN * XV) * 4;
        free(xo.rowmax), free(xo.tlogit);
        /* GEMM (2 x 4 tiles of C fixed by the shape, over the threads) */
        for (int combo = 0; combo < 4; combo++) {
            bool ta = combo & 1, tb = combo & 2;
            ct_tensor *A = ta ? t2(b, 200, 333, gA) : t2(b, 333, 200, gA);
            ct_tensor *Bm = tb ? t2(b, 517, 200, gB) : t2(b, 200, 517, gB);
            ct_tensor *Cm = t2(b, 333, 517, gC);
            ct_gemm(Cm, A, Bm, ta, tb, 1.0f, 0.5f);
            res[k][r] = host_of(Cm), res_bytes[r++] = (size_t)(333 * 517) * 4;
            ct_tensor_free(A), ct_tensor_free(Bm), ct_tensor_free(Cm);
        }
        /* attention fwd + bwd (GQA, T = 150: causal blocks of 16 rows, the last ragged) */
        attn_io aio = aio_in;
        attn_run(b, &ac, &aio);
        res[k][r] = aio.out, res_bytes[r++] = (size_t)nq * 4;
        res[k][r] = aio.lse, res_bytes[r++] = 2 * 4 * 150 * 4;
        res[k][r] = aio.dq, res_bytes[r++] = (size_t)nq * 4;
        res[k][r] = aio.dk, res_bytes[r++] = (size_t)nkv * 4;
        res[k][r] = aio.dv, res_bytes[r++] = (size_t)nkv * 4;
        res[k][r] = aio.dbias, res_bytes[r++] = (size_t)(4 + 2 * 2) * 16 * 4;
        nres = r;
        ct_tensor_free(td), ct_tensor_free(db), ct_tensor_free(tx), ct_tensor_free(tw);
        ct_tensor_free(tb), ct_tensor_free(to), ct_tensor_free(tm), ct_tensor_free(ts);
        ct_tensor_free(tdx), ct_tensor_free(tdw), ct_tensor_free(tdb), ct_tensor_free(wpe);
        ct_tensor_free(tt), ct_tensor_free(dtab), ct_tensor_free(tsq), ct_tensor_free(out);
    }
    const char *names[24] = {"bias_grad",
                             "gelu_bwd dinp",
                             "gelu_bwd dbias",
                             "layernorm_fwd out",
                             "layernorm_bwd dinp",
                             "layernorm_bwd dw",
                             "layernorm_bwd db",
                             "posemb_bwd",
                             "embedding_bwd",
                             "sumsq",
                             "xent sumexp",
                             "xent loss",
                             "xent grad",
                             "gemm NN",
                             "gemm TN",
                             "gemm NT",
                             "gemm TT",
                             "attention out",
                             "attention lse",
                             "attention dq",
                             "attention dk",
                             "attention dv",
                             "attention dbias"};
    for (int r = 0; r < nres; r++) check_bits_equal(names[r], res[0][r], res[1][r], res_bytes[r]);
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < nres; r++) free(res[k][r]);
    free(x), free(d), free(w), free(bb), free(tok), free(sq), free(xl), free(gA), free(gB),
        free(gC);
    free(aio_in.q), free(aio_in.k), free(aio_in.v), free(aio_in.dout);
}

/* ---- main ------------------------------------------------------------------------------------ */

static int setup(void **state) {
    (void)state;
    be1 = test_backend_new(1);
    be3 = test_backend_new(3);
    be = test_backend_new(2);
    return be && be1 && be3 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ct_backend_free(be), ct_backend_free(be1), ct_backend_free(be3);
    return 0;
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_strided_slot),
        cmocka_unit_test(test_gemm_tiles),
        cmocka_unit_test(test_gemm_openblas),
        cmocka_unit_test(test_gemm_bf16_threads),
        cmocka_unit_test(test_gemm_wrapper),
        cmocka_unit_test(test_bias),
        cmocka_unit_test(test_axpy_scale),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_gather_rows),
        cmocka_unit_test(test_posemb),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_llama_host_arithmetic),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_attention_mha),
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_long),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_xent),
        cmocka_unit_test(test_adamw_hand),
        cmocka_unit_test(test_adamw_random),
        cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_cast),
        cmocka_unit_test(test_tensors_and_accounting),
        cmocka_unit_test(test_determinism_threads),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, setup, teardown);
}
