/*
 * test_cuda_norm.c — the CUDA backend's LayerNorm, GELU and cross-entropy kernels (cuda/
 * norm.cu, gelu.cu, xent.cu) and those of Llama's blocks (RMSNorm in norm.cu, rope.cu,
 * swiglu.cu) against the CPU backend, the numerical reference, in fp32 and bf16 and in the
 * emulator's three warp orders (test/unit/cuda_test_util.h).
 *
 * Each case makes random inputs from a fixed seed, uploads the same bytes to both backends
 * (outputs an op accumulates into start from the same nonzero values on both), runs the slot on
 * each (be->iface->slot) and compares every output element: |got − want| <= atol + rtol·|want|,
 * NaN or Inf anywhere failing (the emulator poisons device memory with NaN, so an element a
 * kernel forgets to write shows). The shapes have tails: C = 67 and V = 131 are multiples of
 * neither the warp nor the 16-byte vector (the scalar paths), C = 256 and V = 520 take the vector
 * paths, n_valid = 123 / 515 leave padded columns and a vector tail, N = 300 spans several row
 * chunks of the dw/db/dbias partial sums with a short last one. The cross-entropy runs plain
 * (col_offset 0) and as one vocabulary shard (col_offset > 0, targets inside the shard, below it,
 * in its padding and past it). Every GPU output must also be bit-identical in the three warp
 * orders (the kernels reduce in a fixed order; a float atomic or a race would show). The forward
 * norms run with and without a residual (inp += residual first, fused): the stored sum is one
 * add of two stored values rounded once the same way on both sides, so it must be bit-identical,
 * and the norm's tolerances take that sum as their input.
 *
 * Tolerances. E = 2^-24 is fp32's unit roundoff (one rounding moves a value by at most E of it;
 * an ulp is at most 2E relative). A float sum computed as runs of L terms added in sequence, then
 * combined by a tree of depth d, is within (L + d)·E·Σ|terms| of the exact sum (first order); the
 * two backends sum in different orders (CPU: 16 lanes of C/16 terms and a 4-level tree, rows in
 * chunks of 64 then chunks in order; CUDA: 32 lanes of C/32 (+ a vector's width), 5 levels, or
 * 512 threads of V/512 and 9 levels; rows 8 per thread, 8 groups, then chunks, or for the norms'
 * weights up to 32 rows a warp, 8 warps, then chunks of 32), so their
 * difference is bounded by the sum of both (L + d) (the K and K_rows below, plus 2 for the
 * products fused into the sums on one side and not the other). The exponential: the CPU's
 * exp_f32 is about 1 ulp, CUDA's expf at most 2 ulp (CUDA C Programming Guide, "Mathematical
 * functions"; the emulator uses glibc's, within 1 ulp), so exponentials differ by at most 3 ulp =
 * 6E relative; logf is within 1 ulp on both. Per op the bounds are derived beside the check.
 * bf16 outputs: both backends compute the same fp32 value up to the fp32 bound D and round it
 * once to nearest even (at most 2^-8 relative each); when the two fp32 values straddle a rounding
 * boundary the stored values are one bf16 spacing apart, so the bf16 bound is
 * D·(1 + 2^-7) + 2^-7·(1 + 2^-7)·|want| (bf16_tol). fp32 statistics and gradients (mean, rstd,
 * dw, db, dbias, sumexp, losses) keep their fp32 bounds in bf16 mode: both sides widen the same
 * bf16 inputs and compute in fp32.
 *
 * Planted while writing this test, each seen to fail before trusting it: the block barrier before
 * keep_exp's writes removed from xent_sumexp (fails in the descending and random orders: the
 * target logit is read after its owner overwrote it); the barrier of the dw/db row-group
 * reduction removed (ascending and random read the NaN poison of shared memory; descending
 * happens to give the right values and is caught by the cross-order bit check); layernorm's row
 * sum dropping the columns past the last full warp (C = 67); layernorm_bwd overwriting dinp
 * instead of accumulating; GELU's vector tail dropped (n = 335), dbias's last row chunk skipped
 * (N = 300), bf16 stores truncated (the bit count above), the exponent clamped at 80 instead of
 * 88 (x = -12); xent_finish's one-hot ignoring col_offset, xent_sumexp adding it, xent_rowmax
 * reading the padding, xent_finish leaving the padding unzeroed; the fused residual sum taken
 * unrounded for the statistics (bf16 means off by ~1e-3).
 *
 * Run all:     ./test_cuda_norm
 * Run by name: ./test_cuda_norm test_xent       (a cmocka filter; wildcards allowed)
 * CUDA_TEST_VERBOSE=1 prints how much of each tolerance a check uses.
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

#include "core/model/rope.h"
#include "test/unit/cuda_test_util.h"

/* ---- inputs (random values: cuda_test_util.h) ------------------------------------------------ */

static double amax(const float *f, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(f[i]));
    return m;
}

/* ---- buffers on both backends (pbuf), checks in every warp order: cuda_test_util.h --------- */

/* Compares n elements of dtype dt of a pbuf; returns true when close. */
static bool check(const char *what, const pbuf *b, ct_dtype dt, int64_t n, double atol,
                  double rtol) {
    size_t bytes = (size_t)n * cuda_test_dsize(dt);
    void *want = cuda_test_download(P.cpu, b->p[0], bytes);
    void *got = cuda_test_download(P.gpu, b->p[1], bytes);
    char label[200];
    cuda_test_label(label, sizeof label, what);
    bool ok = cuda_test_close(label, got, want, dt, n, atol, rtol);
    /* bf16: the tolerance admits one bf16 spacing, which a straddle of a rounding midpoint needs;
     * a wrong rounding shows in the count of differing bits */
    if (dt == BF16) ok &= cuda_test_bf16_bits_close(label, got, want, n);
    ok &= cuda_test_same_in_every_order(label, got, bytes);
    free(want);
    free(got);
    return ok;
}

static const ct_dtype dtypes[2] = {F32, BF16};

/* ---- LayerNorm --------------------------------------------------------------------------------
 */

/* Row sums of C terms: CPU 16 lanes of ceil(C/16) and a 4-level tree; CUDA 32 lanes of at most
 * ceil(C/32) + 8 (a bf16 vector) and 5 levels; + 2 for a product fused into the sum on one side. */
static double ln_k(int64_t C) {
    return ceil(C / 16.0) + 4 + ceil(C / 32.0) + 8 + 5 + 2;
}

/* Column sums over N rows: CPU chunks of 64 rows, then ceil(N/64) chunks; CUDA 8 rows per thread,
 * 8 row groups, then the chunks; + 2 for a fused product. */
static double rows_k(int64_t N) {
    return (64 + ceil(N / 64.0) + 2) + (8 + 8 + ceil(N / 64.0) + 2) + 2;
}

/* The norms' weight (and bias) gradients: the CPU as rows_k; CUDA (cuda/norm.cu's fused
 * backward) chunks of 32 rows, each warp of a block adding up to 32 of them (32 with one warp),
 * up to 8 warps in order, then the chunks; + 2 for a fused product. */
static double norm_rows_k(int64_t N) {
    return (64 + ceil(N / 64.0) + 2) + (32 + 8 + ceil(N / 32.0) + 2) + 2;
}

/* Rows x = offset + U(-2, 2), a per-row offset in [-4, 4) (the two-pass variance must not cancel).
 */
static float *ln_input(int64_t N, int64_t C) {
    float *x = malloc((size_t)(N * C) * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
        float off = cuda_test_urand(-4.0f, 4.0f);
        for (int64_t j = 0; j < C; j++) x[i * C + j] = off + cuda_test_urand(-2.0f, 2.0f);
    }
    return x;
}

/* max |x - mean|·rstd over all rows */
static double ln_nmax(const float *x, const float *mean, const float *rstd, int64_t N, int64_t C) {
    double m = 0.0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < C; j++)
            m = fmax(m, fabs(((double)x[i * C + j] - mean[i]) * rstd[i]));
    return m;
}

/* The norms' residual add (add: a residual R = U(-2, 2) given): inp += R, stored rounded to dt,
 * then the norm of that sum. One add of two stored values, rounded once on each side the same
 * way: the sums must be bit-identical (tolerance 0). x becomes the sum as stored, the norm's
 * input for the tolerances below. */
static void *norm_residual(ct_dtype dt, float *x, int64_t n, bool add, pbuf *res) {
    if (!add) {
        res->p[0] = res->p[1] = NULL;
        return NULL;
    }
    float *r = cuda_test_fvec(n, -2.0f, 2.0f);
    void *hr = cuda_test_pack(dt, r, n);
    *res = pb_new(hr, (size_t)n * cuda_test_dsize(dt));
    for (int64_t i = 0; i < n; i++) x[i] += r[i];
    free(cuda_test_pack(dt, x, n)); /* x rounded as stored */
    free(r);
    return hr;
}

static bool check_sum(const char *op, ct_dtype dt, int64_t N, int64_t C, bool add,
                      const pbuf *inp) {
    if (!add) return true;
    char what[96];
    snprintf(what, sizeof what, "%s %s N=%lld C=%lld: inp + residual", op, ct_dtype_name(dt),
             (long long)N, (long long)C);
    return check(what, inp, dt, N * C, 0.0, 0.0);
}

static void pb_free_residual(pbuf *res, void *hr) {
    if (hr) pb_free(res);
    free(hr);
}

static bool ln_fwd_case(ct_dtype dt, int64_t N, int64_t C, bool add) {
    cuda_test_seed(1, (uint64_t)N, (uint64_t)C);
    float *x = ln_input(N, C), *w = cuda_test_fvec(C, -1.5f, 1.5f),
          *b = cuda_test_fvec(C, -1.0f, 1.0f);
    void *hx = cuda_test_pack(dt, x, N * C), *hw = cuda_test_pack(dt, w, C),
         *hb = cuda_test_pack(dt, b, C);
    size_t es = cuda_test_dsize(dt);
    pbuf inp = pb_new(hx, (size_t)(N * C) * es), pw = pb_new(hw, (size_t)C * es),
         pbb = pb_new(hb, (size_t)C * es), res;
    void *hr = norm_residual(dt, x, N * C, add, &res);
    pbuf out = pb_new(NULL, (size_t)(N * C) * es), mean = pb_new(NULL, (size_t)N * 4),
         rstd = pb_new(NULL, (size_t)N * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->layernorm_fwd(be->ctx, dt, out.p[s], mean.p[s], rstd.p[s], inp.p[s], res.p[s],
                                 pw.p[s], pbb.p[s], N, C);
    }
    /*
     * mean: the row sums differ by K·E·Σ|x| (K = ln_k), plus the division: (K + 2)·E·max|x|.
     * rstd = 1/sqrt(var + eps): the squared deviations are nonnegative, so their sums differ by
     * (K + 4)·E relative (the subtraction and the square add 2E per term on each side; the mean's
     * error enters only to second order, Σ(x − m) being ~0); the square root halves that, the
     * division by C, the eps add, the sqrt and the reciprocal add 4 roundings per side:
     * R = ((K + 4)/2 + 8)·E relative.
     * out = ((x − m)·s)·w + b: |Δm|·s·|w| + |n|·|w|·(R + 2E) for the normalised value n, plus the
     * roundings of the product and the add (2E per side) on |n·w| + |b|.
     */
    float *hmean = cuda_test_download(P.cpu, mean.p[0], (size_t)N * 4);
    float *hrstd = cuda_test_download(P.cpu, rstd.p[0], (size_t)N * 4);
    double K = ln_k(C), xmax = amax(x, N * C), wmax = amax(w, C), bmax = amax(b, C);
    double smax = amax(hrstd, N), nmax = ln_nmax(x, hmean, hrstd, N, C);
    double R = ((K + 4) / 2 + 8) * E32;
    double atol_mean = (K + 2) * E32 * xmax;
    double atol_out = (K + 2) * E32 * xmax * smax * wmax + (R + 2 * E32) * nmax * wmax +
                      4 * E32 * (nmax * wmax + bmax);
    double rtol_out = 0.0;
    bf16_tol(dt, &atol_out, &rtol_out);
    char what[3][96];
    const char *dn = ct_dtype_name(dt);
    snprintf(what[0], sizeof what[0], "layernorm_fwd %s N=%lld C=%lld out", dn, (long long)N,
             (long long)C);
    snprintf(what[1], sizeof what[1], "layernorm_fwd %s N=%lld C=%lld mean", dn, (long long)N,
             (long long)C);
    snprintf(what[2], sizeof what[2], "layernorm_fwd %s N=%lld C=%lld rstd", dn, (long long)N,
             (long long)C);
    bool ok = check_sum("layernorm_fwd", dt, N, C, add, &inp);
    ok &= check(what[0], &out, dt, N * C, atol_out, rtol_out);
    ok &= check(what[1], &mean, F32, N, atol_mean, 0.0);
    ok &= check(what[2], &rstd, F32, N, 0.0, R);
    pbuf *bufs[] = {&inp, &pw, &pbb, &out, &mean, &rstd};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) pb_free(bufs[i]);
    pb_free_residual(&res, hr);
    free(x), free(w), free(b), free(hx), free(hw), free(hb), free(hmean), free(hrstd);
    return ok;
}

static bool ln_bwd_case(ct_dtype dt, int64_t N, int64_t C) {
    cuda_test_seed(2, (uint64_t)N, (uint64_t)C);
    float *x = ln_input(N, C), *w = cuda_test_fvec(C, -1.5f, 1.5f),
          *d = cuda_test_fvec(N * C, -1.0f, 1.0f);
    float *di0 = cuda_test_fvec(N * C, -0.5f, 0.5f), *dw0 = cuda_test_fvec(C, -1.0f, 1.0f),
          *db0 = cuda_test_fvec(C, -1.0f, 1.0f);
    void *hx = cuda_test_pack(dt, x, N * C), *hw = cuda_test_pack(dt, w, C),
         *hd = cuda_test_pack(dt, d, N * C);
    void *hdi = cuda_test_pack(dt, di0, N * C);
    /* the statistics the forward would save (any consistent values will do: both get the same) */
    float *m = malloc((size_t)N * sizeof(float)), *r = malloc((size_t)N * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
        double s1 = 0.0, s2 = 0.0;
        for (int64_t j = 0; j < C; j++) s1 += x[i * C + j];
        s1 /= (double)C;
        for (int64_t j = 0; j < C; j++) s2 += (x[i * C + j] - s1) * (x[i * C + j] - s1);
        m[i] = (float)s1;
        r[i] = (float)(1.0 / sqrt(s2 / (double)C + 1e-5));
    }
    size_t es = cuda_test_dsize(dt);
    pbuf inp = pb_new(hx, (size_t)(N * C) * es), pw = pb_new(hw, (size_t)C * es),
         dout = pb_new(hd, (size_t)(N * C) * es), dinp = pb_new(hdi, (size_t)(N * C) * es),
         dw = pb_new(dw0, (size_t)C * 4), db = pb_new(db0, (size_t)C * 4),
         mean = pb_new(m, (size_t)N * 4), rstd = pb_new(r, (size_t)N * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->layernorm_bwd(be->ctx, dt, dinp.p[s], dw.p[s], db.p[s], dout.p[s], inp.p[s],
                                 pw.p[s], mean.p[s], rstd.p[s], N, C);
    }
    /*
     * With g = d·w (|g| <= G = max|d|·max|w|) and n = (x − m)·s (identical on both sides):
     * mean(g) differs by (K + 2)·E·G, mean(g·n) by (K + 3)·E·G·nmax; dinp += s·(g − mean(g) −
     * n·mean(g·n)) carries s times the first plus s·nmax times the second, and about 6 roundings
     * per side on terms bounded by s·G·(2 + nmax²) and |dinp|.
     * dw = Σ_rows d·n and db = Σ_rows d: K_rows·E·Σ_rows|term| per column (rows_k), plus the add
     * into the starting value (E per side on |start| + Σ|term|).
     */
    double K = ln_k(C), Kr = norm_rows_k(N);
    double smax = amax(r, N), nmax = ln_nmax(x, m, r, N, C), G = amax(d, N * C) * amax(w, C);
    double atol_di = smax * G * ((K + 2) + nmax * nmax * (K + 3)) * E32 +
                     12 * E32 * (smax * G * (2 + nmax * nmax) + amax(di0, N * C));
    double rtol_di = 0.0;
    bf16_tol(dt, &atol_di, &rtol_di);
    double sdn = 0.0, sd = 0.0;
    for (int64_t j = 0; j < C; j++) {
        double a = 0.0, c = 0.0;
        for (int64_t i = 0; i < N; i++) {
            int64_t k = i * C + j;
            a += fabs(d[k] * ((double)x[k] - m[i]) * r[i]);
            c += fabs(d[k]);
        }
        sdn = fmax(sdn, a), sd = fmax(sd, c);
    }
    double atol_dw = Kr * E32 * sdn + 2 * E32 * (amax(dw0, C) + sdn);
    double atol_db = Kr * E32 * sd + 2 * E32 * (amax(db0, C) + sd);
    char what[3][96];
    const char *dn = ct_dtype_name(dt);
    snprintf(what[0], sizeof what[0], "layernorm_bwd %s N=%lld C=%lld dinp", dn, (long long)N,
             (long long)C);
    snprintf(what[1], sizeof what[1], "layernorm_bwd %s N=%lld C=%lld dw", dn, (long long)N,
             (long long)C);
    snprintf(what[2], sizeof what[2], "layernorm_bwd %s N=%lld C=%lld db", dn, (long long)N,
             (long long)C);
    bool ok = check(what[0], &dinp, dt, N * C, atol_di, rtol_di);
    ok &= check(what[1], &dw, F32, C, atol_dw, 0.0);
    ok &= check(what[2], &db, F32, C, atol_db, 0.0);
    pbuf *bufs[] = {&inp, &pw, &dout, &dinp, &dw, &db, &mean, &rstd};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) pb_free(bufs[i]);
    free(x), free(w), free(d), free(di0), free(dw0), free(db0);
    free(hx), free(hw), free(hd), free(hdi), free(m), free(r);
    return ok;
}

/* (1300, 24): 41 chunks of 32 rows, so the column sums over chunk partials run a batch of loads;
 * (70, 1000): a backward block of 6 warps (its accumulators within 48 KiB), a partial last chunk;
 * (9, 6200): one warp, 49600 bytes of accumulators (above the default 48 KiB) */
static const int64_t ln_shapes[][2] = {{5, 67},    {32, 256},  {300, 40},
                                       {1300, 24}, {70, 1000}, {9, 6200}};
#define N_LN_SHAPES (sizeof ln_shapes / sizeof *ln_shapes)

static void test_layernorm(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int t = 0; t < 2; t++)
            for (size_t k = 0; k < N_LN_SHAPES; k++) {
                all_ok &= ln_fwd_case(dtypes[t], ln_shapes[k][0], ln_shapes[k][1], false);
                all_ok &= ln_fwd_case(dtypes[t], ln_shapes[k][0], ln_shapes[k][1], true);
                all_ok &= ln_bwd_case(dtypes[t], ln_shapes[k][0], ln_shapes[k][1]);
            }
    });
}

/* ---- GELU -------------------------------------------------------------------------------------
 */

/* U(-6, 6), with the edges planted: the clamped exponent (x < -10 and > 0 large), zero, a tiny
 * value and the derivative's zero near -0.75. */
static float *gelu_input(int64_t n) {
    float *x = cuda_test_fvec(n, -6.0f, 6.0f);
    const float edge[] = {-12.0f, 12.0f, 0.0f, -1e-20f, 1e-3f, -0.7518f, -10.5f, 30.0f};
    for (int64_t i = 0; i < n && i < 8 * 7; i += 7) x[i] = edge[i / 7];
    return x;
}

/* offset: elements by which every pointer is shifted (1: the unaligned scalar path) */
static bool gelu_fwd_case(ct_dtype dt, int64_t n, int64_t offset) {
    cuda_test_seed(3, (uint64_t)n, (uint64_t)offset);
    float *x = gelu_input(n + offset);
    void *hx = cuda_test_pack(dt, x, n + offset);
    size_t es = cuda_test_dsize(dt);
    pbuf inp = pb_new(hx, (size_t)(n + offset) * es), out = pb_new(NULL, (size_t)(n + offset) * es);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->gelu_fwd(be->ctx, dt, (char *)out.p[s] + offset * es,
                            (const char *)inp.p[s] + offset * es, n);
    }
    /* x/(1 + t): t differs by 6E relative (the exponent itself is computed identically), 1 + t
     * by as much (t/(1 + t) <= 1) plus a rounding per side, the division one per side: 10E,
     * rounded up to 12E. The clamp keeps every result normal (|gelu| >= 6e-38 where t = e^88), so
     * no absolute term is needed. */
    double atol = 0.0, rtol = 12 * E32;
    bf16_tol(dt, &atol, &rtol);
    char what[96];
    snprintf(what, sizeof what, "gelu_fwd %s n=%lld offset %lld", ct_dtype_name(dt), (long long)n,
             (long long)offset);
    /* compare from the offset on (the element before it is never written: NaN on the GPU) */
    pbuf shifted = {{(char *)out.p[0] + offset * es, (char *)out.p[1] + offset * es},
                    (size_t)n * es};
    bool ok = check(what, &shifted, dt, n, atol, rtol);
    pb_free(&inp), pb_free(&out);
    free(x), free(hx);
    return ok;
}

/* alias: dinp is dout (in place); with_dbias: dbias accumulated too */
static bool gelu_bwd_case(ct_dtype dt, int64_t N, int64_t C, bool alias, bool with_dbias) {
    cuda_test_seed(4, (uint64_t)(N * 4 + alias * 2 + with_dbias), (uint64_t)C);
    float *x = gelu_input(N * C), *d = cuda_test_fvec(N * C, -1.0f, 1.0f),
          *b0 = cuda_test_fvec(C, -1.0f, 1.0f);
    void *hx = cuda_test_pack(dt, x, N * C), *hd = cuda_test_pack(dt, d, N * C);
    size_t es = cuda_test_dsize(dt);
    pbuf inp = pb_new(hx, (size_t)(N * C) * es), dout = pb_new(hd, (size_t)(N * C) * es);
    pbuf dinp = alias ? dout : pb_new(NULL, (size_t)(N * C) * es);
    pbuf dbias = pb_new(b0, (size_t)C * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->gelu_bwd(be->ctx, dt, dinp.p[s], with_dbias ? dbias.p[s] : NULL, inp.p[s],
                            dout.p[s], N, C);
    }
    /*
     * gelu'(x) = s·(1 + p), s = 1/(1 + t), p = 2x·du·t·s, du computed identically on both sides.
     * t: 6E; s: 6E + a rounding per side = 8E; t·s: 6E + 8E + 2E = 16E, so p: 16E + 2E (the fma);
     * the product with s: 8E + 2E. |Δgelu'| <= 10E·|gelu'| + 18E·|s·p|, and s·p = gelu' − s, so
     * |s·p| <= |gelu'| + 1: |Δgelu'| <= 28E·|gelu'| + 18E. Times dout (a rounding per side):
     * rtol 30E, atol 18E·max|dout|.
     * dbias = start + Σ_rows dinp (fp32, before any bf16 rounding): the elementwise bounds summed
     * over a column (|gelu'| <= 1.13, so Σ|dinp| <= 1.13·Σ|dout|) plus the summation (K_rows) and
     * the add into the start.
     */
    double dmax = amax(d, N * C);
    double atol_di = 18 * E32 * dmax, rtol_di = 30 * E32;
    double sd = 0.0;
    for (int64_t j = 0; j < C; j++) {
        double c = 0.0;
        for (int64_t i = 0; i < N; i++) c += fabs(d[i * C + j]);
        sd = fmax(sd, c);
    }
    double atol_db =
        ((30 + rows_k(N)) * 1.13 + 18) * E32 * sd + 2 * E32 * (amax(b0, C) + 1.13 * sd);
    bf16_tol(dt, &atol_di, &rtol_di);
    char what[2][128];
    snprintf(what[0], sizeof what[0], "gelu_bwd %s N=%lld C=%lld%s%s dinp", ct_dtype_name(dt),
             (long long)N, (long long)C, alias ? " in place" : "", with_dbias ? " +dbias" : "");
    snprintf(what[1], sizeof what[1], "gelu_bwd %s N=%lld C=%lld%s dbias", ct_dtype_name(dt),
             (long long)N, (long long)C, alias ? " in place" : "");
    bool ok = check(what[0], &dinp, dt, N * C, atol_di, rtol_di);
    /* without dbias the accumulator must be untouched: compare it exactly */
    ok &= check(what[1], &dbias, F32, C, with_dbias ? atol_db : 0.0, 0.0);
    pb_free(&inp), pb_free(&dout), pb_free(&dbias);
    if (!alias) pb_free(&dinp);
    free(x), free(d), free(b0), free(hx), free(hd);
    return ok;
}

static void test_gelu(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int t = 0; t < 2; t++) {
            for (int off = 0; off < 2; off++) {
                all_ok &= gelu_fwd_case(dtypes[t], 5 * 67, off);
                all_ok &= gelu_fwd_case(dtypes[t], 32 * 256, off);
            }
            for (size_t k = 0; k < N_LN_SHAPES; k++)
                for (int v = 0; v < 4; v++)
                    all_ok &=
                        gelu_bwd_case(dtypes[t], ln_shapes[k][0], ln_shapes[k][1], v & 1, v & 2);
        }
    });
}

/* ---- cross-entropy ----------------------------------------------------------------------------
 */

typedef struct xent_shape {
    int64_t N, V, n_valid, col_offset;
} xent_shape;

/* Padded V = 131 (scalar path), V = 515 (scalar, no padding), V = 520 (vector path, a tail in
 * n_valid, padding); each plain and as a vocabulary shard at col_offset 700. */
static const xent_shape xent_shapes[] = {
    {5, 131, 123, 0},   {32, 515, 515, 0},   {32, 520, 515, 0},
    {5, 131, 123, 700}, {32, 515, 515, 700}, {32, 520, 515, 700},
};
enum { N_XENT_SHAPES = sizeof xent_shapes / sizeof *xent_shapes };

/* Targets: plain, all inside [0, n_valid); a shard: by row, inside, below the shard, in its
 * padding (or just past it) and far past it. */
static int32_t *xent_targets(const xent_shape *sh) {
    int32_t *t = malloc((size_t)sh->N * sizeof(int32_t));
    for (int64_t i = 0; i < sh->N; i++) {
        int64_t r = (int64_t)(cuda_test_rng_next() % (uint64_t)sh->n_valid), local;
        switch (sh->col_offset == 0 ? 0 : i % 4) {
        case 0: local = r; break;
        case 1: local = -1 - r; break;
        case 2:
            local =
                sh->n_valid + (int64_t)(cuda_test_rng_next() % (uint64_t)(sh->V - sh->n_valid + 1));
            break;
        default: local = sh->V + 1000 + r; break;
        }
        t[i] = (int32_t)(sh->col_offset + local);
    }
    return t;
}

/* Logits U(-4, 4) over the valid columns, one row with an outlier at 30; padding columns hold 50,
 * above every valid logit, so a kernel that reads them shows. */
static float *xent_logits(const xent_shape *sh) {
    float *x = cuda_test_fvec(sh->N * sh->V, -4.0f, 4.0f);
    for (int64_t i = 0; i < sh->N; i++)
        for (int64_t j = sh->n_valid; j < sh->V; j++) x[i * sh->V + j] = 50.0f;
    x[(sh->N / 2) * sh->V + sh->n_valid / 3] = 30.0f;
    return x;
}

static void xent_label(char *buf, size_t cap, const char *op, ct_dtype dt, const xent_shape *sh,
                       const char *extra, const char *out) {
    snprintf(buf, cap, "%s %s N=%lld V=%lld n_valid=%lld col_offset=%lld%s %s", op,
             ct_dtype_name(dt), (long long)sh->N, (long long)sh->V, (long long)sh->n_valid,
             (long long)sh->col_offset, extra, out);
}

/* sumexp's bound, relative: 6E for the exponentials, the two summation orders (CPU 16 lanes of
 * n/16 and 4 levels; CUDA 512 threads of n/512 (+ a vector's 8) and 9 levels) and 2 for a fused
 * add; all terms positive, so relative to the sum itself. */
static double xent_sum_rtol(int64_t n_valid) {
    return (6 + ceil(n_valid / 16.0) + 4 + ceil(n_valid / 512.0) + 8 + 9 + 2) * E32;
}

/* loss = (logf(se) + mx) − tl from identical inputs: logf within 1 ulp (2E·|log se|) on each
 * side, the two adds E each on a partial result of at most |log se| + |mx| + |tl|. */
static double xent_loss_atol(const float *mx, const float *se, const float *tl, int64_t N) {
    double a = 0.0;
    for (int64_t i = 0; i < N; i++) {
        double l = fabs(log(se[i]));
        a = fmax(a, 4 * l + 4 * (l + fabs(mx[i]) + fabs(tl[i])));
    }
    return a * E32;
}

/* Each pass alone, from identical inputs. */
static bool xent_pass_case(ct_dtype dt, const xent_shape *sh, bool keep_exp) {
    cuda_test_seed(5, (uint64_t)(sh->N * 1000 + sh->V), (uint64_t)(sh->col_offset * 2 + keep_exp));
    const int64_t N = sh->N, V = sh->V, nv = sh->n_valid;
    float *x = xent_logits(sh);
    int32_t *tg = xent_targets(sh);
    void *hx = cuda_test_pack(dt, x, N * V);
    size_t es = cuda_test_dsize(dt);
    char what[200];
    bool ok = true;

    /* rowmax: exact (a max rounds nothing) */
    pbuf logits = pb_new(hx, (size_t)(N * V) * es), rowmax = pb_new(NULL, (size_t)N * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->xent_rowmax(be->ctx, dt, rowmax.p[s], logits.p[s], N, V, nv);
    }
    xent_label(what, sizeof what, "xent_rowmax", dt, sh, "", "rowmax");
    ok &= check(what, &rowmax, F32, N, 0.0, 0.0);

    /* sumexp from the same rowmax (the CPU's, computed on the host) */
    float *mx = malloc((size_t)N * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
        mx[i] = -INFINITY;
        for (int64_t j = 0; j < nv; j++) mx[i] = fmaxf(mx[i], x[i * V + j]);
    }
    pbuf pmx = pb_new(mx, (size_t)N * 4), targets = pb_new(tg, (size_t)N * 4);
    pbuf sumexp = pb_new(NULL, (size_t)N * 4), tlogit = pb_new(NULL, (size_t)N * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->xent_sumexp(be->ctx, dt, sumexp.p[s], tlogit.p[s], logits.p[s], targets.p[s],
                               pmx.p[s], N, V, nv, sh->col_offset, keep_exp);
    }
    const char *ke = keep_exp ? " keep_exp" : "";
    xent_label(what, sizeof what, "xent_sumexp", dt, sh, ke, "sumexp");
    ok &= check(what, &sumexp, F32, N, 0.0, xent_sum_rtol(nv));
    xent_label(what, sizeof what, "xent_sumexp", dt, sh, ke, "target_logit");
    ok &= check(what, &tlogit, F32, N, 0.0, 0.0); /* a copy of one logit: exact */
    /* the logits: the kept exponentials (6E; bf16 rounded), the padding untouched */
    double atol_e = 0.0, rtol_e = keep_exp ? 6 * E32 : 0.0;
    bf16_tol(dt, &atol_e, &rtol_e);
    if (!keep_exp) rtol_e = 0.0;
    xent_label(what, sizeof what, "xent_sumexp", dt, sh, ke, "logits");
    ok &= check(what, &logits, dt, N * V, atol_e, rtol_e);

    /* finish from identical inputs: the kept exponentials, rowmax, sumexp and target logit as the
     * host computes them */
    float *e = malloc((size_t)(N * V) * sizeof(float)), *se = malloc((size_t)N * sizeof(float));
    float *tl = malloc((size_t)N * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
        double acc = 0.0;
        for (int64_t j = 0; j < V; j++) {
            float v = j < nv ? expf(x[i * V + j] - mx[i]) : x[i * V + j];
            e[i * V + j] = v;
            if (j < nv) acc += v;
        }
        se[i] = (float)acc;
        int64_t t = (int64_t)tg[i] - sh->col_offset;
        tl[i] = t >= 0 && t < nv ? x[i * V + t] : 0.0f;
    }
    void *he = cuda_test_pack(dt, e, N * V);
    const float dloss = 0.37f;
    for (int wg = 0; wg < 2; wg++) {
        pbuf grad = pb_new(he, (size_t)(N * V) * es), pse = pb_new(se, (size_t)N * 4),
             ptl = pb_new(tl, (size_t)N * 4), losses = pb_new(NULL, (size_t)N * 4);
        for (int s = 0; s < 2; s++) {
            ct_backend *be = side_be(s);
            be->iface->xent_finish(be->ctx, dt, losses.p[s], grad.p[s], targets.p[s], pmx.p[s],
                                   pse.p[s], ptl.p[s], N, V, nv, sh->col_offset, dloss, wg);
        }
        const char *wgs = wg ? " write_grad" : "";
        xent_label(what, sizeof what, "xent_finish", dt, sh, wgs, "losses");
        ok &= check(what, &losses, F32, N, xent_loss_atol(mx, se, tl, N), 0.0);
        /* the gradient e·(dloss/se) − dloss·onehot: dloss/se rounds identically; the product and
         * the subtraction may fuse on one side (E on |e·g| <= dloss, and the product's E); the
         * padding exactly 0. Without write_grad the logits must be untouched (exact). */
        double atol_g = wg ? 2 * E32 * dloss : 0.0, rtol_g = wg ? 2 * E32 : 0.0;
        if (wg) bf16_tol(dt, &atol_g, &rtol_g);
        xent_label(what, sizeof what, "xent_finish", dt, sh, wgs, "logits");
        ok &= check(what, &grad, dt, N * V, atol_g, rtol_g);
        pb_free(&grad), pb_free(&pse), pb_free(&ptl), pb_free(&losses);
    }
    pb_free(&logits), pb_free(&rowmax), pb_free(&pmx), pb_free(&targets), pb_free(&sumexp),
        pb_free(&tlogit);
    free(x), free(tg), free(hx), free(mx), free(e), free(se), free(tl), free(he);
    return ok;
}

/* The three passes chained on each backend (as the model runs them, keep_exp and write_grad). */
static bool xent_chain_case(ct_dtype dt, const xent_shape *sh) {
    cuda_test_seed(6, (uint64_t)(sh->N * 1000 + sh->V), (uint64_t)sh->col_offset);
    const int64_t N = sh->N, V = sh->V, nv = sh->n_valid;
    float *x = xent_logits(sh);
    int32_t *tg = xent_targets(sh);
    void *hx = cuda_test_pack(dt, x, N * V);
    size_t es = cuda_test_dsize(dt);
    pbuf logits = pb_new(hx, (size_t)(N * V) * es), targets = pb_new(tg, (size_t)N * 4);
    pbuf rowmax = pb_new(NULL, (size_t)N * 4), sumexp = pb_new(NULL, (size_t)N * 4),
         tlogit = pb_new(NULL, (size_t)N * 4), losses = pb_new(NULL, (size_t)N * 4);
    const float dloss = 1.0f / (float)N;
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->xent_rowmax(be->ctx, dt, rowmax.p[s], logits.p[s], N, V, nv);
        be->iface->xent_sumexp(be->ctx, dt, sumexp.p[s], tlogit.p[s], logits.p[s], targets.p[s],
                               rowmax.p[s], N, V, nv, sh->col_offset, true);
        be->iface->xent_finish(be->ctx, dt, losses.p[s], logits.p[s], targets.p[s], rowmax.p[s],
                               sumexp.p[s], tlogit.p[s], N, V, nv, sh->col_offset, dloss, true);
    }
    /*
     * losses: log(se) moves by sumexp's relative bound, plus the finish bound of the pass test.
     * gradient e·g (g = dloss/se): e 6E, g sumexp's bound + E, the product and a subtraction that
     * may fuse with it 2E + E; relative to |e·g|, which is |want| except at the target column,
     * where e·g <= dloss cancels against dloss: hence the atol of the relative bound times dloss.
     * bf16: the kept exponentials are rounded on each side first (one bf16 spacing apart at a
     * straddle: U7 more relative to e·g), then the gradient itself (bf16_tol).
     */
    float *hmx = cuda_test_download(P.cpu, rowmax.p[0], (size_t)N * 4);
    float *hse = cuda_test_download(P.cpu, sumexp.p[0], (size_t)N * 4);
    float *htl = cuda_test_download(P.cpu, tlogit.p[0], (size_t)N * 4);
    double rs = xent_sum_rtol(nv);
    double atol_l = rs + xent_loss_atol(hmx, hse, htl, N);
    double rtol_g = rs + 10 * E32, atol_g = rtol_g * dloss;
    if (dt == BF16) {
        rtol_g = (rtol_g + U7) * (1 + U7);
        atol_g = atol_g * (1 + U7) + rtol_g * dloss;
        bf16_tol(dt, &atol_g, &rtol_g);
    }
    free(hmx), free(hse), free(htl);
    char what[200];
    bool ok = true;
    xent_label(what, sizeof what, "xent chain", dt, sh, "", "losses");
    ok &= check(what, &losses, F32, N, atol_l, 0.0);
    xent_label(what, sizeof what, "xent chain", dt, sh, "", "gradient");
    ok &= check(what, &logits, dt, N * V, atol_g, rtol_g);
    pb_free(&logits), pb_free(&targets), pb_free(&rowmax), pb_free(&sumexp), pb_free(&tlogit),
        pb_free(&losses);
    free(x), free(tg), free(hx);
    return ok;
}

/* A shard made only of padding (n_valid = 0): rowmax -inf, sumexp 0, target logit 0. The
 * comparator refuses infinities, so these are checked by value. */
static bool xent_empty_shard_case(ct_dtype dt) {
    const int64_t N = 3, V = 16;
    float *x = cuda_test_fvec(N * V, -1.0f, 1.0f);
    int32_t tg[3] = {0, 5, 200};
    void *hx = cuda_test_pack(dt, x, N * V);
    pbuf logits = pb_new(hx, (size_t)(N * V) * cuda_test_dsize(dt)),
         targets = pb_new(tg, sizeof tg);
    pbuf rowmax = pb_new(NULL, (size_t)N * 4), sumexp = pb_new(NULL, (size_t)N * 4),
         tlogit = pb_new(NULL, (size_t)N * 4);
    ct_backend *be = P.gpu;
    be->iface->xent_rowmax(be->ctx, dt, rowmax.p[1], logits.p[1], N, V, 0);
    be->iface->xent_sumexp(be->ctx, dt, sumexp.p[1], tlogit.p[1], logits.p[1], targets.p[1],
                           rowmax.p[1], N, V, 0, 100, false);
    float *m = cuda_test_download(be, rowmax.p[1], (size_t)N * 4);
    float *se = cuda_test_download(be, sumexp.p[1], (size_t)N * 4);
    float *tl = cuda_test_download(be, tlogit.p[1], (size_t)N * 4);
    bool ok = true;
    for (int64_t i = 0; i < N; i++)
        if (!(isinf(m[i]) && m[i] < 0) || se[i] != 0.0f || tl[i] != 0.0f) {
            fprintf(stderr,
                    "xent on an all-padding shard (%s), row %lld: rowmax %g sumexp %g "
                    "target_logit %g; want -inf, 0, 0\n",
                    ct_dtype_name(dt), (long long)i, m[i], se[i], tl[i]);
            ok = false;
        }
    pb_free(&logits), pb_free(&targets), pb_free(&rowmax), pb_free(&sumexp), pb_free(&tlogit);
    free(x), free(hx), free(m), free(se), free(tl);
    return ok;
}

static void test_xent(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int t = 0; t < 2; t++) {
            for (int k = 0; k < N_XENT_SHAPES; k++) {
                all_ok &= xent_pass_case(dtypes[t], &xent_shapes[k], false);
                all_ok &= xent_pass_case(dtypes[t], &xent_shapes[k], true);
                all_ok &= xent_chain_case(dtypes[t], &xent_shapes[k]);
            }
            all_ok &= xent_empty_shard_case(dtypes[t]);
        }
    });
}

/* ---- RMSNorm ----------------------------------------------------------------------------------
 */

static bool rms_fwd_case(ct_dtype dt, int64_t N, int64_t C, bool add) {
    cuda_test_seed(7, (uint64_t)N, (uint64_t)C);
    float *x = ln_input(N, C), *w = cuda_test_fvec(C, -1.5f, 1.5f);
    void *hx = cuda_test_pack(dt, x, N * C), *hw = cuda_test_pack(dt, w, C);
    size_t es = cuda_test_dsize(dt);
    pbuf inp = pb_new(hx, (size_t)(N * C) * es), pw = pb_new(hw, (size_t)C * es), res;
    void *hr = norm_residual(dt, x, N * C, add, &res);
    pbuf out = pb_new(NULL, (size_t)(N * C) * es), rstd = pb_new(NULL, (size_t)N * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->rmsnorm_fwd(be->ctx, dt, out.p[s], rstd.p[s], inp.p[s], res.p[s], pw.p[s], N, C,
                               1e-5f);
    }
    /*
     * rstd = 1/sqrt(Σx²/C + eps): the squares are nonnegative, so the sums differ by (K + 2)·E
     * relative (K = ln_k; the square adds E a term per side); the square root halves that, the
     * division, the eps add, the sqrt and the reciprocal add 4 roundings per side:
     * R = ((K + 2)/2 + 8)·E relative. out = x·s·w: R plus two products per side, relative to
     * |out| (no sum, no cancellation).
     */
    double R = ((ln_k(C) + 2) / 2 + 8) * E32;
    double atol_out = 0.0, rtol_out = R + 4 * E32;
    bf16_tol(dt, &atol_out, &rtol_out);
    char what[2][96];
    const char *dn = ct_dtype_name(dt);
    snprintf(what[0], sizeof what[0], "rmsnorm_fwd %s N=%lld C=%lld out", dn, (long long)N,
             (long long)C);
    snprintf(what[1], sizeof what[1], "rmsnorm_fwd %s N=%lld C=%lld rstd", dn, (long long)N,
             (long long)C);
    bool ok = check_sum("rmsnorm_fwd", dt, N, C, add, &inp);
    ok &= check(what[0], &out, dt, N * C, atol_out, rtol_out);
    ok &= check(what[1], &rstd, F32, N, 0.0, R);
    pbuf *bufs[] = {&inp, &pw, &out, &rstd};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) pb_free(bufs[i]);
    pb_free_residual(&res, hr);
    free(x), free(w), free(hx), free(hw);
    return ok;
}

static bool rms_bwd_case(ct_dtype dt, int64_t N, int64_t C) {
    cuda_test_seed(8, (uint64_t)N, (uint64_t)C);
    float *x = ln_input(N, C), *w = cuda_test_fvec(C, -1.5f, 1.5f),
          *d = cuda_test_fvec(N * C, -1.0f, 1.0f);
    float *di0 = cuda_test_fvec(N * C, -0.5f, 0.5f), *dw0 = cuda_test_fvec(C, -1.0f, 1.0f);
    void *hx = cuda_test_pack(dt, x, N * C), *hw = cuda_test_pack(dt, w, C),
         *hd = cuda_test_pack(dt, d, N * C), *hdi = cuda_test_pack(dt, di0, N * C);
    float *r = malloc((size_t)N * sizeof(float)); /* the rstd forward would save */
    for (int64_t i = 0; i < N; i++) {
        double ms = 0.0;
        for (int64_t j = 0; j < C; j++) ms += (double)x[i * C + j] * x[i * C + j];
        r[i] = (float)(1.0 / sqrt(ms / (double)C + 1e-5));
    }
    size_t es = cuda_test_dsize(dt);
    pbuf inp = pb_new(hx, (size_t)(N * C) * es), pw = pb_new(hw, (size_t)C * es),
         dout = pb_new(hd, (size_t)(N * C) * es), dinp = pb_new(hdi, (size_t)(N * C) * es),
         dw = pb_new(dw0, (size_t)C * 4), rstd = pb_new(r, (size_t)N * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->rmsnorm_bwd(be->ctx, dt, dinp.p[s], dw.p[s], dout.p[s], inp.p[s], pw.p[s],
                               rstd.p[s], N, C);
    }
    /*
     * With g = d·w (|g| <= G) and s = rstd (the same input on both sides): Σ(g·x)/C differs by
     * (K + 3)·E·A with A = max over rows of Σ|g·x|/C (two products fused or not); dinp += s·g -
     * x·s³·Σ(g·x)/C carries |x|·s³ times that, and about 6 roundings per side on terms bounded by
     * s·G, xmax·s³·A and |dinp|. dw = Σ_rows d·x·s: K_rows·E·Σ_rows|term| per column (rows_k),
     * plus the add into the starting value.
     */
    double K = ln_k(C), Kr = norm_rows_k(N), smax = amax(r, N), xmax = amax(x, N * C);
    double G = amax(d, N * C) * amax(w, C), A = 0.0, sdx = 0.0;
    for (int64_t i = 0; i < N; i++) {
        double a = 0.0;
        for (int64_t j = 0; j < C; j++) a += fabs((double)d[i * C + j] * w[j] * x[i * C + j]);
        A = fmax(A, a / (double)C);
    }
    for (int64_t j = 0; j < C; j++) {
        double a = 0.0;
        for (int64_t i = 0; i < N; i++) a += fabs((double)d[i * C + j] * x[i * C + j] * r[i]);
        sdx = fmax(sdx, a);
    }
    double s3 = smax * smax * smax;
    double atol_di =
        xmax * s3 * A * (K + 3) * E32 + 12 * E32 * (smax * G + xmax * s3 * A + amax(di0, N * C));
    double rtol_di = 0.0;
    bf16_tol(dt, &atol_di, &rtol_di);
    double atol_dw = Kr * E32 * sdx + 2 * E32 * (amax(dw0, C) + sdx);
    char what[2][96];
    const char *dn = ct_dtype_name(dt);
    snprintf(what[0], sizeof what[0], "rmsnorm_bwd %s N=%lld C=%lld dinp", dn, (long long)N,
             (long long)C);
    snprintf(what[1], sizeof what[1], "rmsnorm_bwd %s N=%lld C=%lld dw", dn, (long long)N,
             (long long)C);
    bool ok = check(what[0], &dinp, dt, N * C, atol_di, rtol_di);
    ok &= check(what[1], &dw, F32, C, atol_dw, 0.0);
    pbuf *bufs[] = {&inp, &pw, &dout, &dinp, &dw, &rstd};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) pb_free(bufs[i]);
    free(x), free(w), free(d), free(di0), free(dw0), free(hx), free(hw), free(hd), free(hdi);
    free(r);
    return ok;
}

static void test_rmsnorm(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int t = 0; t < 2; t++)
            for (size_t k = 0; k < N_LN_SHAPES; k++) {
                all_ok &= rms_fwd_case(dtypes[t], ln_shapes[k][0], ln_shapes[k][1], false);
                all_ok &= rms_fwd_case(dtypes[t], ln_shapes[k][0], ln_shapes[k][1], true);
                all_ok &= rms_bwd_case(dtypes[t], ln_shapes[k][0], ln_shapes[k][1]);
            }
    });
}

/* ---- rotary position embedding -----------------------------------------------------------------
 */

/* A packed qkv (B, T, (H + 2·KV)·hd) rotated in place in its q and k heads, positions from pos,
 * forward and inverse, from the table ct_rope_table builds (the same bytes on both sides). Each
 * element is a·cos ∓ b·sin: two products and a sum, fused or not, 2 roundings a side on
 * |a| + |b| <= 2·xmax. The v heads must come back as they were (compared like the rest). */
static bool rope_case(ct_dtype dt, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                      int64_t pos, bool inverse) {
    cuda_test_seed(9, (uint64_t)(T * hd), (uint64_t)inverse);
    const int64_t ld = (H + 2 * KV) * hd, n = B * T * ld, max_pos = pos + T;
    float *x = cuda_test_fvec(n, -2.0f, 2.0f);
    float *table = malloc((size_t)(max_pos * hd) * sizeof(float));
    ct_rope_table(table, max_pos, hd, 10000.0, NULL);
    void *hx = cuda_test_pack(dt, x, n);
    size_t es = cuda_test_dsize(dt);
    pbuf px = pb_new(hx, (size_t)n * es), cs = pb_new(table, (size_t)(max_pos * hd) * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->rope(be->ctx, dt, px.p[s], cs.p[s], B, T, H + KV, hd, ld, pos, inverse);
    }
    double atol = 4 * E32 * 2 * amax(x, n), rtol = 0.0;
    bf16_tol(dt, &atol, &rtol);
    char what[96];
    snprintf(what, sizeof what, "rope %s T=%lld hd=%lld pos=%lld%s", ct_dtype_name(dt),
             (long long)T, (long long)hd, (long long)pos, inverse ? " inverse" : "");
    bool ok = check(what, &px, dt, n, atol, rtol);
    pb_free(&px), pb_free(&cs);
    free(x), free(table), free(hx);
    return ok;
}

static void test_rope(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int t = 0; t < 2; t++)
            for (int inv = 0; inv < 2; inv++) {
                all_ok &= rope_case(dtypes[t], 2, 7, 3, 1, 8, 5, inv);
                all_ok &= rope_case(dtypes[t], 1, 33, 2, 1, 64, 0, inv);
                /* an odd number of pairs a head: one pair a thread, element by element */
                all_ok &= rope_case(dtypes[t], 2, 5, 2, 1, 6, 3, inv);
            }
    });
}

/* ---- SwiGLU -----------------------------------------------------------------------------------
 */

/*
 * gate_up (N, 2H): gates in [-12, 12] (σ saturates both ways), ups in [-2, 2]; dgate_up written
 * whole by backward (the GPU's starts as the emulator's NaN poison). The exponentials differ by
 * 3 ulp = 6E (header); σ = 1/(1 + e^-a) adds 2 roundings a side and moves by at most (1 - σ)
 * times the exp's error, so out = a·σ·u and dup = dout·a·σ, products without sums, are within
 * 6E + 2·(2 + 2)·E = 14E relative: 16E. dgate = dout·u·σ·(1 + a(1 - σ)) may cancel inside the
 * bracket (near a = -1.28): absolute |d·u|·(σ(1 + |a|(1 - σ))·16E + |1 + a - 2aσ|·σ(1 - σ)·6E),
 * where σ(1 + |a|(1 - σ)) <= 1.3 and |1 + a - 2aσ|·σ(1 - σ) <= (1 + 12)/4 for |a| <= 12:
 * 40E·|d|·|u| at most, plus 16E relative.
 */
static bool swiglu_case(ct_dtype dt, int64_t N, int64_t H) {
    cuda_test_seed(10, (uint64_t)N, (uint64_t)H);
    float *gu = cuda_test_fvec(N * 2 * H, -2.0f, 2.0f), *d = cuda_test_fvec(N * H, -1.0f, 1.0f);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < H; j++) gu[i * 2 * H + j] *= 6.0f;
    void *hgu = cuda_test_pack(dt, gu, N * 2 * H), *hd = cuda_test_pack(dt, d, N * H);
    size_t es = cuda_test_dsize(dt);
    pbuf pgu = pb_new(hgu, (size_t)(N * 2 * H) * es), pd = pb_new(hd, (size_t)(N * H) * es);
    pbuf out = pb_new(NULL, (size_t)(N * H) * es), dgu = pb_new(NULL, (size_t)(N * 2 * H) * es);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        char *g = pgu.p[s], *dg = dgu.p[s];
        be->iface->swiglu_fwd(be->ctx, dt, out.p[s], g, g + H * es, N, H, 2 * H);
        be->iface->swiglu_bwd(be->ctx, dt, dg, dg + H * es, g, g + H * es, pd.p[s], N, H, 2 * H);
    }
    double atol_out = 0.0, rtol_out = 16 * E32;
    double atol_dgu = 40 * E32 * amax(d, N * H) * 2.0, rtol_dgu = 16 * E32;
    bf16_tol(dt, &atol_out, &rtol_out);
    bf16_tol(dt, &atol_dgu, &rtol_dgu);
    char what[2][96];
    const char *dn = ct_dtype_name(dt);
    snprintf(what[0], sizeof what[0], "swiglu_fwd %s N=%lld H=%lld", dn, (long long)N,
             (long long)H);
    snprintf(what[1], sizeof what[1], "swiglu_bwd %s N=%lld H=%lld dgate_up", dn, (long long)N,
             (long long)H);
    bool ok = check(what[0], &out, dt, N * H, atol_out, rtol_out);
    ok &= check(what[1], &dgu, dt, N * 2 * H, atol_dgu, rtol_dgu);
    pbuf *bufs[] = {&pgu, &pd, &out, &dgu};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) pb_free(bufs[i]);
    free(gu), free(d), free(hgu), free(hd);
    return ok;
}

static void test_swiglu(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int t = 0; t < 2; t++) {
            all_ok &= swiglu_case(dtypes[t], 33, 67);
            all_ok &= swiglu_case(dtypes[t], 8, 256);
            /* the row stride a multiple of 16 bytes but the width not: one element a thread */
            all_ok &= swiglu_case(dtypes[t], 5, 12);
        }
    });
}

/* ---- main -------------------------------------------------------------------------------------
 */

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm), cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_xent),      cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),      cmocka_unit_test(test_swiglu),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, cuda_test_setup, cuda_test_teardown);
}
