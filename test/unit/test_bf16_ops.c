/*
 * test_bf16_ops.c — every op of backend.h that touches activations, run in bf16 and checked
 * against the fp32 reference (backend.h, "Precision"; core/backend/cpu/cpu.h, "bf16: the slots").
 * Two checks per op:
 *
 *  1. The contract (tight). The op runs once on bf16 tensors and once on f32 tensors holding
 *     exactly the same, bf16-representable, values; an output it accumulates into starts from the
 *     same bf16-representable values in both runs, and an fp32 accumulator (dbias, dw, ...) from
 *     the same arbitrary fp32 values, which the bf16 path must not round. The bf16 path promises
 *     fp32 arithmetic on the widened inputs and one rounding to nearest even per stored element,
 *     so every bf16 output must be ct_f32_to_bf16 of the f32 output bit for bit, and every f32
 *     output (gradients, statistics) must be bit-identical. GEMMs are the exception: bf16 GEMMs run
 *     oneDNN's bf16 kernels, fp32 ones its fp32 kernels (or OpenBLAS's), which sum in different
 *     orders (bound in test_gemm).
 *  2. Against fp32 on unrounded inputs (what a user sees). Random fp32 inputs, not
 *     bf16-representable: the fp32 op on them against the bf16 op on their rounding (the upload,
 *     ct_tensor_from_host_f32, rounds). Each op derives, per element and from the data, how far
 *     its result can move when every bf16 input moves by its rounding, adds the final rounding of
 *     a bf16 output and a small allowance for the fp32 arithmetic of the two runs.
 *
 * Units. u = 2^-8 is bf16's unit roundoff: 8 significant bits, and rounding to nearest moves a
 * value by at most half a spacing, 2^-8 of it (1 + 2^-8 is the tie between 1 and 1 + 2^-7), so a
 * rounded input is x̂ = x(1 + δ), |δ| ≤ u. e = 2^-24 is the same for fp32. A bf16 output z is
 * stored as ẑ with |ẑ − z| ≤ u|z|; when z lies within `pre` of the reference y that is at most
 * u·(|y| + pre), so a stored output gets the tolerance pre + u·(|y| + pre) (out_tol). The fp32
 * allowance ("slack") treats each fp32 kernel as exact arithmetic on inputs perturbed by k·e
 * relative, k the longest sum it takes plus a few for the elementwise steps (the backward-error
 * bound of a dot product), and counts it twice (the fp32 run and the bf16 run). It is ~10^-3 of the
 * bf16 terms (3·10^-3 at most): the checks measure bf16 error, not fp32 noise.
 *
 * The bounds are worst cases (sums of absolute values; perturbations that enter an exp or a
 * normalisation are carried through it exactly, not to first order). Where the output rounding
 * dominates (copies, sums of two terms, GELU, the kept exps, the cross-entropy gradient) random
 * data use 60-96% of them; where many rounded inputs meet (GEMM, layernorm, attention) 15-40%, and
 * sums over rows of those (dw, dbias) 5-25%, their errors having random signs. The contract
 * checks catch any deviation at all (planted while writing this test: truncating or
 * rounding ties away from zero, an input read unwidened, an accumulation or a stored output
 * dropped, two operands in one staging buffer, a short widening, rstd stored rounded). The second
 * check catches on its own an unwidened input, a dropped accumulation or store, and truncation
 * where the output rounding dominates its bound. NaN or Inf anywhere fails.
 *
 * Llama's ops (RMSNorm, RoPE, SwiGLU) have both checks too (test_llama_contract,
 * test_llama_vs_fp32). The norms' residual add (test_norm_residual) promises the rounding of
 * ct_axpy followed by the plain norm, and is held to exactly that, bit for bit.
 *
 * Run all:     ./test_bf16_ops
 * Run by name: ./test_bf16_ops test_layernorm     (a cmocka filter; wildcards allowed: "*xent*")
 * TEST_BF16_VERBOSE=1 prints how much of each tolerance a check uses.
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

#include "test_util.h"

#define U16 (1.0 / 256.0)      /* bf16 unit roundoff, 2^-8 */
#define U32 (1.0 / 16777216.0) /* fp32 unit roundoff, 2^-24 */
#define F32 CT_DTYPE_F32
#define BF16 CT_DTYPE_BF16

static ct_backend *be; /* 2 threads */
static bool verbose;

/* ---- helpers -------------------------------------------------------------------------------- */

static uint64_t rng_state = 0xB7E151628AED2A6Bull;

static uint64_t rng_next(void) {
    return test_rng_next(&rng_state);
}

/* uniform in [lo, hi) */
static float urand(float lo, float hi) {
    return test_urand(&rng_state, lo, hi);
}

static float bf16_round(float x) {
    return ct_bf16_to_f32(ct_f32_to_bf16(x));
}

/* Random fp32 values (almost never bf16-representable): the inputs of check 2. */
static float *rand_f32(int64_t n, float lo, float hi) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = urand(lo, hi);
    return x;
}

/* Random bf16-representable values: the inputs of check 1. */
static float *rand_bf16(int64_t n, float lo, float hi) {
    float *x = rand_f32(n, lo, hi);
    for (int64_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
    return x;
}

/* Pass 0 is the contract (bf16-representable inputs), pass 1 the unrounded comparison. */
typedef float *(*gen_fn)(int64_t n, float lo, float hi);
static gen_fn gen_for(int pass) {
    return pass == 0 ? rand_bf16 : rand_f32;
}

static double *dalloc(int64_t n) {
    return calloc((size_t)(n ? n : 1), sizeof(double));
}

static ct_tensor *tens(ct_dtype dt, int ndim, const int64_t *shape, const float *host) {
    ct_tensor *t = ct_tensor_new(be, dt, ndim, shape, CT_MEM_ACTS);
    assert_non_null(t);
    if (host) ct_tensor_from_host_f32(t, host); /* bf16: rounds to nearest even */
    return t;
}

static ct_tensor *mat(ct_dtype dt, int64_t rows, int64_t cols, const float *host) {
    int64_t s[2] = {rows, cols};
    return tens(dt, 2, s, host);
}

static ct_tensor *vec(ct_dtype dt, int64_t n, const float *host) {
    return tens(dt, 1, &n, host);
}

static ct_tensor *ivec(int64_t n, const int32_t *host) {
    ct_tensor *t = ct_tensor_new(be, CT_DTYPE_I32, 1, &n, CT_MEM_ACTS);
    assert_non_null(t);
    ct_tensor_from_host(t, host);
    return t;
}

/* A malloc'd copy of a tensor's values as floats (bf16 widened, exactly). */
static float *peek(const ct_tensor *t) {
    float *h = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *h);
    ct_tensor_to_host_f32(h, t);
    return h;
}

/* peek, then free the tensor. */
static float *take(ct_tensor *t) {
    float *h = peek(t);
    ct_tensor_free(t);
    return h;
}

static const char *dt_name(ct_dtype dt) {
    return dt == BF16 ? "bf16" : "f32";
}

/* The stored bf16 rounding of pre + the value: pre + u·(|y| + pre) (top of the file). */
static double out_tol(double y, double pre) {
    return pre + U16 * (fabs(y) + pre);
}

/* ---- comparators ---------------------------------------------------------------------------- */

static void report_use(const char *what, double used) {
    if (verbose) print_message("  %-66s uses %.3f of its tolerance\n", what, used);
}

/* Contract, bf16 output: got (a bf16 tensor's values) must be want (the f32 run's output) rounded
 * to nearest even, bit for bit; want must be finite. */
static void check_rounded(const char *what, const float *got, const float *want, int64_t n) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        float r = bf16_round(want[i]);
        if (!isfinite(want[i]) || memcmp(&got[i], &r, sizeof r) != 0) {
            if (first < 0) first = i;
            bad++;
        }
    }
    if (bad)
        fail_msg("%s: %lld of %lld bf16 elements are not the fp32 result rounded to nearest even; "
                 "first [%lld]: got %.9g (0x%04X), fp32 %.9g rounds to %.9g (0x%04X)",
                 what, (long long)bad, (long long)n, (long long)first, (double)got[first],
                 ct_f32_to_bf16(got[first]), (double)want[first], (double)bf16_round(want[first]),
                 ct_f32_to_bf16(want[first]));
    report_use(what, 0.0);
}

/* Contract, f32 output: bit-identical and finite. */
static void check_identical(const char *what, const float *got, const float *want, int64_t n) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(want[i]) || memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            if (first < 0) first = i;
            bad++;
        }
    if (bad)
        fail_msg("%s: %lld of %lld elements differ from the fp32 run; first [%lld]: got %.9g, "
                 "fp32 %.9g",
                 what, (long long)bad, (long long)n, (long long)first, (double)got[first],
                 (double)want[first]);
    report_use(what, 0.0);
}

/* |got - want| <= tol[i] everywhere, both finite. */
static void check_within(const char *what, const float *got, const float *want, const double *tol,
                         int64_t n) {
    int64_t bad = 0, worst = -1;
    double worst_ratio = 0.0, used = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        bool ok = isfinite(got[i]) && isfinite(want[i]) && err <= tol[i];
        double ratio = err == 0.0 ? 0.0 : (isfinite(err) ? err / tol[i] : INFINITY);
        if (!ok) {
            bad++;
            if (worst < 0 || ratio > worst_ratio) worst = i, worst_ratio = ratio;
        }
        if (ratio > used) used = ratio;
    }
    if (bad)
        fail_msg("%s: %lld of %lld elements outside their tolerance; worst [%lld]: got %.9g, "
                 "fp32 %.9g (error %.3g, tolerance %.3g)",
                 what, (long long)bad, (long long)n, (long long)worst, (double)got[worst],
                 (double)want[worst], fabs((double)got[worst] - (double)want[worst]), tol[worst]);
    report_use(what, used);
}

/* x as a float no larger (dir < 0) or no smaller (dir > 0) than the double x. */
static float float_toward(double x, int dir) {
    float f = (float)x;
    if (dir < 0 && (double)f > x) f = nextafterf(f, -INFINITY);
    if (dir > 0 && (double)f < x) f = nextafterf(f, INFINITY);
    return f;
}

/* Contract for a bf16 GEMM output: the value before rounding lies within pre[i] of want (the fp32
 * result), and rounding to nearest is monotone, so got must lie in [rne(want - pre), rne(want +
 * pre)] — one bf16 spacing of the larger end plus pre at most. */
static void check_rounded_within(const char *what, const float *got, const float *want,
                                 const double *pre, int64_t n) {
    int64_t bad = 0, first = -1, not_rne = 0;
    for (int64_t i = 0; i < n; i++) {
        float lo = bf16_round(float_toward((double)want[i] - pre[i], -1));
        float hi = bf16_round(float_toward((double)want[i] + pre[i], 1));
        if (!isfinite(want[i]) || !(got[i] >= lo && got[i] <= hi)) {
            if (first < 0) first = i;
            bad++;
        }
        not_rne += got[i] != bf16_round(want[i]);
    }
    if (bad) {
        float lo = bf16_round(float_toward((double)want[first] - pre[first], -1));
        float hi = bf16_round(float_toward((double)want[first] + pre[first], 1));
        fail_msg("%s: %lld of %lld elements outside [rne(fp32 - pre), rne(fp32 + pre)]; first "
                 "[%lld]: got %.9g, fp32 %.9g, allowed [%.9g, %.9g]",
                 what, (long long)bad, (long long)n, (long long)first, (double)got[first],
                 (double)want[first], (double)lo, (double)hi);
    }
    if (verbose)
        print_message("  %-66s %lld of %lld differ from rne(fp32), all in bounds\n", what,
                      (long long)not_rne, (long long)n);
}

/* Σ over rows of |x(N, C)|, per column. */
static double *col_abs_sums(const float *x, int64_t N, int64_t C) {
    double *s = dalloc(C);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < C; j++) s[j] += fabs((double)x[i * C + j]);
    return s;
}

/* ---- GEMM ----------------------------------------------------------------------------------- */

/* alpha·op(A)·op(B) + beta·C0 through ct_gemm, A and B of dtype ab, C of dtype cd. beta = 0 with
 * bf16 operands starts C as NaN: the bf16 path (oneDNN) must not read it. */
static float *run_gemm(ct_dtype ab, ct_dtype cd, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                       float alpha, float beta, const float *A, const float *B, const float *C0) {
    ct_tensor *a = ta ? mat(ab, K, M, A) : mat(ab, M, K, A);
    ct_tensor *b = tb ? mat(ab, N, K, B) : mat(ab, K, N, B);
    ct_tensor *c = mat(cd, M, N, C0);
    if (beta == 0.0f && ab == BF16) ct_tensor_fill(c, NAN);
    ct_gemm(c, a, b, ta, tb, alpha, beta);
    ct_tensor_free(a), ct_tensor_free(b);
    return take(c);
}

/* Σ_k |op(A)_ik · op(B)_kj| for every (i, j). */
static double *gemm_abs(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A,
                        const float *B) {
    double *s = dalloc(M * N);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? A[k * M + i] : A[i * K + k], b = tb ? B[j * K + k] : B[k * N + j];
                s[i * N + j] += fabs(a * b);
            }
    return s;
}

/*
 * All four transpose combinations × beta 0 and 1 × an f32 and a bf16 C, alpha 0.75, (24, 40) =
 * (24, 48)·(48, 40). With S = Σ_k |a_ik·b_kj| and c = |beta·C0|:
 *  1. Contract: bf16 products are exact in fp32, so both libraries sum the same exact products in
 *     different orders; each sum (K products, then alpha and beta·C0) is within (K+2)·e·(|alpha|·S
 *     + c) of the exact value (γ_{K+2}, any order), so they differ by pre = 2(K+2)·e·(|alpha|·S +
 *     c). f32 C: |got − fp32| ≤ pre. bf16 C: got = rne(z) with |z − fp32| ≤ pre, and rounding is
 *     monotone: rne(fp32 − pre) ≤ got ≤ rne(fp32 + pre) (check_rounded_within).
 *  2. Unrounded: a rounded product is ab(1 + δa)(1 + δb), off by (2u + u²)|ab|, so the sum moves by
 *     |alpha|·(2u + u²)·S, plus u·c when the bf16 C0 was rounded; slack 2(K+2)·e·(|alpha|·S(1+u)²
 *     + c(1+u)); a bf16 C adds its rounding (out_tol).
 */
static void test_gemm(void **state) {
    (void)state;
    const int64_t M = 24, N = 40, K = 48;
    const float alpha = 0.75f;
    for (int combo = 0; combo < 16; combo++) {
        bool ta = combo & 1, tb = combo & 2, bf16_c = combo & 8;
        float beta = combo & 4 ? 1.0f : 0.0f;
        ct_dtype cd = bf16_c ? BF16 : F32;
        for (int pass = 0; pass < 2; pass++) {
            gen_fn gen = gen_for(pass);
            float *A = gen(M * K, -2, 2), *B = gen(K * N, -2, 2), *C0 = gen(M * N, -2, 2);
            float *ref = run_gemm(F32, F32, ta, tb, M, N, K, alpha, beta, A, B, C0);
            float *got = run_gemm(BF16, cd, ta, tb, M, N, K, alpha, beta, A, B, C0);
            double *S = gemm_abs(ta, tb, M, N, K, A, B), *tol = dalloc(M * N);
            for (int64_t i = 0; i < M * N; i++) {
                double c = fabs((double)beta * C0[i]), as = fabs(alpha) * S[i];
                if (pass == 0) {
                    tol[i] = 2.0 * (double)(K + 2) * U32 * (as + c);
                } else {
                    double prop = as * (2 * U16 + U16 * U16) + (bf16_c ? U16 * c : 0.0);
                    double slack =
                        2.0 * (double)(K + 2) * U32 * (as * (1 + U16) * (1 + U16) + c * (1 + U16));
                    tol[i] = bf16_c ? out_tol(ref[i], prop + slack) : prop + slack;
                }
            }
            char what[128];
            snprintf(what, sizeof what, "gemm ta=%d tb=%d beta=%g C %s: %s", ta, tb, (double)beta,
                     dt_name(cd), pass == 0 ? "contract" : "vs fp32, unrounded");
            if (pass == 0 && bf16_c)
                check_rounded_within(what, got, ref, tol, M * N);
            else
                check_within(what, got, ref, tol, M * N);
            free(A), free(B), free(C0), free(ref), free(got), free(S), free(tol);
        }
    }
}

/* ---- bias, axpy, scale ----------------------------------------------------------------------- */

static float *run_bias_add(ct_dtype dt, int64_t N, int64_t C, const float *x, const float *b) {
    ct_tensor *o = mat(dt, N, C, x), *bb = vec(dt, C, b);
    ct_bias_add(o, bb);
    ct_tensor_free(bb);
    return take(o);
}

/* out starts as NaN: bias_init overwrites it. */
static float *run_bias_init(ct_dtype dt, int64_t N, int64_t C, const float *b, const float *res) {
    ct_tensor *o = mat(dt, N, C, NULL), *bb = vec(dt, C, b), *r = res ? mat(dt, N, C, res) : NULL;
    ct_tensor_fill(o, NAN);
    ct_bias_init(o, bb, r);
    ct_tensor_free(bb), ct_tensor_free(r);
    return take(o);
}

static float *run_bias_grad(ct_dtype dt, int64_t N, int64_t C, const float *dout,
                            const float *db0) {
    ct_tensor *d = mat(dt, N, C, dout), *db = vec(F32, C, db0);
    ct_bias_grad(db, d);
    ct_tensor_free(d);
    return take(db);
}

/*
 * N = 24 rows of C = 40. bias_add and bias_init with a residual: y = x + b, inputs rounded by
 * ≤ u·(|x| + |b|), one fp32 addition (slack 2e(1+u)(|x| + |b|)), then the output rounding.
 * bias_init without a residual copies the bias: y = b̂, tolerance u·|b|. bias_grad: dbias (f32,
 * starting from the same fp32 values) += Σ_rows dout; the rounded dout moves it by u·Σ|dout|, the
 * fp32 sums (N + 1 additions) by (N+1)·e·(Σ|dout| + |dbias0|) per run.
 */
static void test_bias(void **state) {
    (void)state;
    const int64_t N = 24, C = 40;
    for (int pass = 0; pass < 2; pass++) {
        gen_fn gen = gen_for(pass);
        float *x = gen(N * C, -2, 2), *b = gen(C, -1, 1), *res = gen(N * C, -2, 2);
        float *db0 = rand_f32(C, -1, 1); /* an fp32 accumulator: arbitrary fp32 in both passes */
        double *tol = dalloc(N * C);
        const char *how = pass == 0 ? "contract" : "vs fp32, unrounded";
        char what[128];

        float *add32 = run_bias_add(F32, N, C, x, b), *add16 = run_bias_add(BF16, N, C, x, b);
        float *init32 = run_bias_init(F32, N, C, b, NULL),
              *init16 = run_bias_init(BF16, N, C, b, NULL);
        float *ires32 = run_bias_init(F32, N, C, b, res),
              *ires16 = run_bias_init(BF16, N, C, b, res);
        float *g32 = run_bias_grad(F32, N, C, x, db0), *g16 = run_bias_grad(BF16, N, C, x, db0);
        if (pass == 0) {
            check_rounded("bias_add: contract", add16, add32, N * C);
            check_rounded("bias_init: contract", init16, init32, N * C);
            check_rounded("bias_init + residual: contract", ires16, ires32, N * C);
            check_identical("bias_grad: contract", g16, g32, C);
        } else {
            for (int64_t i = 0; i < N * C; i++) {
                double m = fabs(x[i]) + fabs(b[i % C]);
                tol[i] = out_tol(add32[i], U16 * m + 2 * U32 * (1 + U16) * m);
            }
            snprintf(what, sizeof what, "bias_add: %s", how);
            check_within(what, add16, add32, tol, N * C);
            for (int64_t i = 0; i < N * C; i++) tol[i] = out_tol(init32[i], 0.0);
            snprintf(what, sizeof what, "bias_init: %s", how);
            check_within(what, init16, init32, tol, N * C);
            for (int64_t i = 0; i < N * C; i++) {
                double m = fabs(res[i]) + fabs(b[i % C]);
                tol[i] = out_tol(ires32[i], U16 * m + 2 * U32 * (1 + U16) * m);
            }
            snprintf(what, sizeof what, "bias_init + residual: %s", how);
            check_within(what, ires16, ires32, tol, N * C);
            double *sd = col_abs_sums(x, N, C);
            for (int64_t j = 0; j < C; j++)
                tol[j] =
                    U16 * sd[j] + 2.0 * (double)(N + 1) * U32 * (sd[j] * (1 + U16) + fabs(db0[j]));
            snprintf(what, sizeof what, "bias_grad: %s", how);
            check_within(what, g16, g32, tol, C);
            free(sd);
        }
        free(x), free(b), free(res), free(db0), free(tol), free(add32), free(add16), free(init32);
        free(init16), free(ires32), free(ires16), free(g32), free(g16);
    }
}

static float *run_axpy(ct_dtype dt, int64_t n, const float *dst, const float *src, float alpha) {
    ct_tensor *d = vec(dt, n, dst), *s = vec(dt, n, src);
    ct_axpy(d, s, alpha);
    ct_tensor_free(s);
    return take(d);
}

static float *run_scale(ct_dtype dt, int64_t n, const float *x, float s) {
    ct_tensor *t = vec(dt, n, x);
    ct_scale(t, s);
    return take(t);
}

/*
 * n = 20001 (above the backend's parallel threshold, odd: the staging passes run on both threads
 * with a ragged end). axpy: y = d + alpha·s, inputs rounded by ≤ u·(|d| + |alpha·s|), two fp32
 * roundings per run (slack 4e(1+u)(|d| + |alpha·s|)), then the output rounding. scale: y = s·x,
 * ≤ u·|s·x| from the input, one fp32 rounding per run, then the output rounding. alpha = -0.3 and
 * s = 0.3 are not powers of two, so the products really round.
 */
static void test_axpy_scale(void **state) {
    (void)state;
    const int64_t n = 20001;
    const float alpha = -0.3f, s = 0.3f;
    for (int pass = 0; pass < 2; pass++) {
        gen_fn gen = gen_for(pass);
        float *d = gen(n, -2, 2), *x = gen(n, -2, 2);
        float *a32 = run_axpy(F32, n, d, x, alpha), *a16 = run_axpy(BF16, n, d, x, alpha);
        float *s32 = run_scale(F32, n, x, s), *s16 = run_scale(BF16, n, x, s);
        if (pass == 0) {
            check_rounded("axpy: contract", a16, a32, n);
            check_rounded("scale: contract", s16, s32, n);
        } else {
            double *tol = dalloc(n);
            for (int64_t i = 0; i < n; i++) {
                double m = fabs(d[i]) + fabs((double)alpha * x[i]);
                tol[i] = out_tol(a32[i], U16 * m + 4 * U32 * (1 + U16) * m);
            }
            check_within("axpy: vs fp32, unrounded", a16, a32, tol, n);
            for (int64_t i = 0; i < n; i++) {
                double m = fabs((double)s * x[i]);
                tol[i] = out_tol(s32[i], U16 * m + 2 * U32 * (1 + U16) * m);
            }
            check_within("scale: vs fp32, unrounded", s16, s32, tol, n);
            free(tol);
        }
        free(d), free(x), free(a32), free(a16), free(s32), free(s16);
    }
}

/* ---- embeddings ------------------------------------------------------------------------------ */

/* out starts at 99: rows of other shards' tokens must become 0. */
static float *run_emb_fwd(ct_dtype dt, int64_t N, int64_t C, const int32_t *tok, const float *table,
                          int64_t rows, int64_t off) {
    ct_tensor *o = mat(dt, N, C, NULL), *t = ivec(N, tok), *tab = mat(dt, rows, C, table);
    ct_tensor_fill(o, 99.0f);
    ct_embedding_fwd(o, t, tab, off);
    ct_tensor_free(t), ct_tensor_free(tab);
    return take(o);
}

static float *run_emb_bwd(ct_dtype dt, int64_t N, int64_t C, const int32_t *tok, const float *dout,
                          const float *dt0, int64_t rows, int64_t off) {
    ct_tensor *d = mat(dt, N, C, dout), *t = ivec(N, tok), *dtab = mat(F32, rows, C, dt0);
    ct_embedding_bwd(dtab, d, t, off);
    ct_tensor_free(d), ct_tensor_free(t);
    return take(dtab);
}

/*
 * The vocab-parallel slice: rows [20, 50) of a 60-token vocabulary, N = 24 tokens (edges 19, 20,
 * 49, 50 and repeats included), C = 40. Forward is a row copy: y = t̂, tolerance u·|t| (0 for other
 * shards' tokens, whose rows must be exactly 0). Backward: dtable (f32) += the dout rows of the
 * row's tokens; the rounded dout moves a row by u·Σ|dout|, the fp32 sums (one addition per token)
 * by cnt·e·(Σ|dout| + |dtable0|) per run; rows without tokens must not change at all.
 */
static void test_embedding(void **state) {
    (void)state;
    const int64_t N = 24, C = 40, rows = 30, off = 20;
    int32_t tok[24];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rng_next() % 60);
    tok[0] = 19, tok[1] = 20, tok[2] = 49, tok[3] = 50, tok[4] = 33, tok[5] = 33, tok[6] = 33;
    for (int pass = 0; pass < 2; pass++) {
        gen_fn gen = gen_for(pass);
        float *tab = gen(rows * C, -2, 2), *dout = gen(N * C, -2, 2);
        float *dt0 = rand_f32(rows * C, -1, 1);
        float *f32 = run_emb_fwd(F32, N, C, tok, tab, rows, off);
        float *f16 = run_emb_fwd(BF16, N, C, tok, tab, rows, off);
        float *b32 = run_emb_bwd(F32, N, C, tok, dout, dt0, rows, off);
        float *b16 = run_emb_bwd(BF16, N, C, tok, dout, dt0, rows, off);
        if (pass == 0) {
            check_rounded("embedding_fwd: contract", f16, f32, N * C);
            check_identical("embedding_bwd: contract", b16, b32, rows * C);
        } else {
            double *tol = dalloc(rows * C);
            for (int64_t i = 0; i < N * C; i++) tol[i] = out_tol(f32[i], 0.0);
            check_within("embedding_fwd: vs fp32, unrounded", f16, f32, tol, N * C);
            double *sd = dalloc(rows * C), *cnt = dalloc(rows);
            for (int64_t i = 0; i < N; i++) {
                int64_t r = tok[i] - off;
                if (r < 0 || r >= rows) continue;
                cnt[r] += 1;
                for (int64_t j = 0; j < C; j++) sd[r * C + j] += fabs(dout[i * C + j]);
            }
            for (int64_t i = 0; i < rows * C; i++)
                tol[i] = U16 * sd[i] + 2.0 * cnt[i / C] * U32 * (sd[i] * (1 + U16) + fabs(dt0[i]));
            check_within("embedding_bwd: vs fp32, unrounded", b16, b32, tol, rows * C);
            free(tol), free(sd), free(cnt);
        }
        for (int64_t i = 0; i < N; i++) {
            int64_t r = tok[i] - off;
            if (r >= 0 && r < rows) continue;
            for (int64_t j = 0; j < C; j++)
                if (f16[i * C + j] != 0.0f)
                    fail_msg("embedding_fwd bf16: token %d (another shard's) gave %g, not 0",
                             tok[i], (double)f16[i * C + j]);
        }
        free(tab), free(dout), free(dt0), free(f32), free(f16), free(b32), free(b16);
    }
}

static float *run_pos_fwd(ct_dtype dt, int64_t B, int64_t T, int64_t C, int64_t P, const float *x,
                          const float *wpe, int64_t off) {
    int64_t s[3] = {B, T, C};
    ct_tensor *o = tens(dt, 3, s, x), *w = mat(dt, P, C, wpe);
    ct_posemb_fwd(o, w, B, T, off);
    ct_tensor_free(w);
    return take(o);
}

static float *run_pos_bwd(ct_dtype dt, int64_t B, int64_t T, int64_t C, int64_t P,
                          const float *dout, const float *dw0, int64_t off) {
    int64_t s[3] = {B, T, C};
    ct_tensor *d = tens(dt, 3, s, dout), *dw = mat(F32, P, C, dw0);
    ct_posemb_bwd(dw, d, B, T, off);
    ct_tensor_free(d);
    return take(dw);
}

/*
 * B = 2, T = 12, C = 40, positions [5, 17) of a 20-row table. Forward: out += wpe[5 + t], as
 * bias_add (u·(|x| + |w|) from the inputs, one fp32 addition, the output rounding). Backward: dwpe
 * (f32) += Σ_b dout: u·Σ_b|dout| from the inputs, B additions per run; rows outside the window
 * must not change at all.
 */
static void test_posemb(void **state) {
    (void)state;
    const int64_t B = 2, T = 12, C = 40, P = 20, off = 5, n = B * T * C;
    for (int pass = 0; pass < 2; pass++) {
        gen_fn gen = gen_for(pass);
        float *x = gen(n, -2, 2), *w = gen(P * C, -1, 1), *d = gen(n, -2, 2);
        float *dw0 = rand_f32(P * C, -1, 1);
        float *f32 = run_pos_fwd(F32, B, T, C, P, x, w, off);
        float *f16 = run_pos_fwd(BF16, B, T, C, P, x, w, off);
        float *b32 = run_pos_bwd(F32, B, T, C, P, d, dw0, off);
        float *b16 = run_pos_bwd(BF16, B, T, C, P, d, dw0, off);
        if (pass == 0) {
            check_rounded("posemb_fwd: contract", f16, f32, n);
            check_identical("posemb_bwd: contract", b16, b32, P * C);
        } else {
            double *tol = dalloc(n > P * C ? n : P * C);
            for (int64_t i = 0; i < n; i++) {
                int64_t t = i / C % T, j = i % C;
                double m = fabs(x[i]) + fabs(w[(off + t) * C + j]);
                tol[i] = out_tol(f32[i], U16 * m + 2 * U32 * (1 + U16) * m);
            }
            check_within("posemb_fwd: vs fp32, unrounded", f16, f32, tol, n);
            for (int64_t p = 0; p < P; p++)
                for (int64_t j = 0; j < C; j++) {
                    int64_t t = p - off;
                    double sd = 0.0;
                    if (t >= 0 && t < T)
                        for (int64_t b = 0; b < B; b++) sd += fabs(d[(b * T + t) * C + j]);
                    double adds = t >= 0 && t < T ? (double)B : 0.0;
                    tol[p * C + j] =
                        U16 * sd + 2.0 * adds * U32 * (sd * (1 + U16) + fabs(dw0[p * C + j]));
                }
            check_within("posemb_bwd: vs fp32, unrounded", b16, b32, tol, P * C);
            free(tol);
        }
        free(x), free(w), free(d), free(dw0), free(f32), free(f16), free(b32), free(b16);
    }
}

/* ---- layernorm ------------------------------------------------------------------------------- */

typedef struct {
    float *out, *mean, *rstd;
} ln_fwd_res;

static void run_ln_fwd(ct_dtype dt, int64_t N, int64_t C, const float *x, const float *w,
                       const float *b, ln_fwd_res *r) {
    ct_tensor *in = mat(dt, N, C, x), *tw = vec(dt, C, w), *tb = vec(dt, C, b);
    ct_tensor *o = mat(dt, N, C, NULL), *m = vec(F32, N, NULL), *s = vec(F32, N, NULL);
    ct_layernorm_fwd(o, m, s, in, tw, tb);
    r->out = take(o), r->mean = take(m), r->rstd = take(s);
    ct_tensor_free(in), ct_tensor_free(tw), ct_tensor_free(tb);
}

typedef struct {
    float *dinp, *dw, *db;
} ln_bwd_res;

static void run_ln_bwd(ct_dtype dt, int64_t N, int64_t C, const float *dx0, const float *dw0,
                       const float *db0, const float *dout, const float *x, const float *w,
                       const float *mean, const float *rstd, ln_bwd_res *r) {
    ct_tensor *dx = mat(dt, N, C, dx0), *dw = vec(F32, C, dw0), *db = vec(F32, C, db0);
    ct_tensor *d = mat(dt, N, C, dout), *in = mat(dt, N, C, x), *tw = vec(dt, C, w);
    ct_tensor *m = vec(F32, N, mean), *s = vec(F32, N, rstd);
    ct_layernorm_bwd(dx, dw, db, d, in, tw, m, s);
    r->dinp = take(dx), r->dw = take(dw), r->db = take(db);
    ct_tensor_free(d), ct_tensor_free(in), ct_tensor_free(tw), ct_tensor_free(m), ct_tensor_free(s);
}

/* Bounds on how far layernorm's results move (before any output rounding; dinp, dw and db without
 * their starting values) when inp moves by ≤ rx·|x_j| + rm·|mean|, w and b by ≤ rp relative and
 * dout by ≤ rd relative — backward on the perturbed forward's mean and rstd (a chain). */
typedef struct {
    double *out, *mean, *rstd, *dinp, *dw, *db;
    double *dn_abs; /* Σ_rows |dout·n| per column: the magnitude of dw's sum */
} ln_err;

static void ln_bounds(int64_t N, int64_t C, const float *x, const float *w, const float *b,
                      const float *dout, double rx, double rm, double rp, double rd, ln_err *e) {
    e->out = dalloc(N * C), e->mean = dalloc(N), e->rstd = dalloc(N);
    e->dinp = dalloc(N * C), e->dw = dalloc(C), e->db = dalloc(C), e->dn_abs = dalloc(C);
    double *a = dalloc(C), *n = dalloc(C), *dn = dalloc(C), *g = dalloc(C), *dg = dalloc(C);
    for (int64_t i = 0; i < N; i++) {
        const float *xi = x + i * C, *di = dout + i * C;
        double m = 0.0, v = 0.0, abar = 0.0;
        for (int64_t j = 0; j < C; j++) m += xi[j];
        m /= (double)C;
        for (int64_t j = 0; j < C; j++) v += (xi[j] - m) * (xi[j] - m);
        v /= (double)C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int64_t j = 0; j < C; j++) {
            a[j] = rx * fabs(xi[j]) + rm * fabs(m);
            abar += a[j] / (double)C;
            n[j] = (xi[j] - m) * s;
        }
        /* v̂ − v = (2/C)Σ(x−m)Δx + mean((Δx − Δm)²): |.| ≤ dv; ŝ = (v + eps ± dv)^-1/2 is then
         * within ds of s (the exact worst case, not a linearisation) */
        double dv = 0.0;
        for (int64_t j = 0; j < C; j++)
            dv += (2.0 * fabs(xi[j] - m) * a[j] + (a[j] + abar) * (a[j] + abar)) / (double)C;
        double ds = s * s * dv < 1.0 ? s * (1.0 / sqrt(1.0 - s * s * dv) - 1.0) : INFINITY;
        e->mean[i] = abar;
        e->rstd[i] = ds;
        double gbar = 0.0, dgbar = 0.0, gam = 0.0, dgam = 0.0;
        for (int64_t j = 0; j < C; j++) {
            /* n̂ − n = (Δx − Δm)·ŝ + (x − m)(ŝ − s) */
            dn[j] = (a[j] + abar) * (s + ds) + fabs(xi[j] - m) * ds;
            double aw = fabs(w[j]);
            e->out[i * C + j] = dn[j] * aw * (1 + rp) + fabs(n[j]) * rp * aw + rp * fabs(b[j]);
            g[j] = (double)di[j] * w[j];
            dg[j] = rd * fabs(di[j]) * aw * (1 + rp) + fabs(di[j]) * rp * aw;
            gbar += g[j] / (double)C, dgbar += dg[j] / (double)C;
            gam += g[j] * n[j] / (double)C;
        }
        for (int64_t j = 0; j < C; j++)
            dgam += (dg[j] * (fabs(n[j]) + dn[j]) + fabs(g[j]) * dn[j]) / (double)C;
        for (int64_t j = 0; j < C; j++) {
            double h = g[j] - gbar - n[j] * gam;
            double dh = dg[j] + dgbar + dn[j] * (fabs(gam) + dgam) + fabs(n[j]) * dgam;
            e->dinp[i * C + j] = ds * (fabs(h) + dh) + s * dh;
            e->dw[j] += rd * fabs(di[j]) * (fabs(n[j]) + dn[j]) + fabs(di[j]) * dn[j];
            e->db[j] += rd * fabs(di[j]);
            e->dn_abs[j] += fabs(di[j] * n[j]);
        }
    }
    free(a), free(n), free(dn), free(g), free(dg);
}

static void ln_err_free(ln_err *e) {
    free(e->out), free(e->mean), free(e->rstd), free(e->dinp), free(e->dw), free(e->db);
    free(e->dn_abs);
}

/*
 * N = 24 rows of C = 40; x in [-2, 2], row 3 offset by +3 (the normalisation amplifies the
 * inputs' rounding by rstd·|x|: a few times more there) and row 7 scaled by 3e-3 (variance ~1e-5,
 * where eps matters and rstd ≈ 200). Forward, then backward accumulating into dinp (bf16) and dw,
 * db (f32). Check 2 runs the chain forward → backward in each precision, so the bf16 backward
 * uses the bf16 forward's mean and rstd. Per row, with x̂_j = x_j(1 + δ_j), a_j = u|x_j|,
 * ā = mean(a), n = (x − m)·s:
 *   mean moves by ≤ ā;
 *   the variance by ≤ dv = (2/C)·Σ|x − m|·a + mean((a + ā)²),
 *     so rstd by ≤ ds = s·((1 − s²·dv)^-1/2 − 1) (≈ s²·mean(|n|·a): rstd amplifies the rounding);
 *   n_j by ≤ dn_j = (a_j + ā)(s + ds) + |x_j − m|·ds;
 *   out_j = n_j·w_j + b_j by ≤ dn_j·|w_j|(1+u) + u|n_j·w_j| + u|b_j|, then the output rounding.
 * Backward, each product's bound carried as Δ(ab) ≤ Δa(|b| + Δb) + |a|Δb:
 *   g = dout·w by ≤ u(2+u)|g|; h = g − mean(g) − n·mean(g·n) by Δh from those of g and n;
 *   dinp_j = s·h_j by ≤ ds(|h| + Δh) + s·Δh, plus u|dinp0| (the rounded starting value), then the
 *     output rounding;
 *   dw_j = Σ dout·n by ≤ Σ(u|dout|(|n| + dn) + |dout|·dn); db_j by ≤ u·Σ|dout|.
 * The fp32 slack is the same propagation with every input perturbed by (C+8)·e (and x by
 * (C+8)·e·|mean| more: the fp32 mean's error), twice, plus (N+1)·e of the row sums for dw and db.
 */
static void test_layernorm(void **state) {
    (void)state;
    const int64_t N = 24, C = 40;
    for (int pass = 0; pass < 2; pass++) {
        gen_fn gen = gen_for(pass);
        float *x = gen(N * C, -2, 2), *w = gen(C, 0.5f, 1.5f), *b = gen(C, -0.5f, 0.5f);
        for (int64_t j = 0; j < C; j++) {
            x[3 * C + j] += 3.0f, x[7 * C + j] *= 3e-3f;
            if (pass == 0)
                x[3 * C + j] = bf16_round(x[3 * C + j]), x[7 * C + j] = bf16_round(x[7 * C + j]);
        }
        float *dout = gen(N * C, -1, 1), *dx0 = gen(N * C, -1, 1);
        float *dw0 = rand_f32(C, -1, 1), *db0 = rand_f32(C, -1, 1);
        ln_fwd_res f32, f16;
        run_ln_fwd(F32, N, C, x, w, b, &f32);
        run_ln_fwd(BF16, N, C, x, w, b, &f16);
        ln_bwd_res b32, b16;
        if (pass == 0) {
            check_rounded("layernorm_fwd out: contract", f16.out, f32.out, N * C);
            check_identical("layernorm_fwd mean: contract", f16.mean, f32.mean, N);
            check_identical("layernorm_fwd rstd: contract", f16.rstd, f32.rstd, N);
            /* backward on the same inputs, statistics included */
            run_ln_bwd(F32, N, C, dx0, dw0, db0, dout, x, w, f32.mean, f32.rstd, &b32);
            run_ln_bwd(BF16, N, C, dx0, dw0, db0, dout, x, w, f32.mean, f32.rstd, &b16);
            check_rounded("layernorm_bwd dinp: contract", b16.dinp, b32.dinp, N * C);
            check_identical("layernorm_bwd dw: contract", b16.dw, b32.dw, C);
            check_identical("layernorm_bwd db: contract", b16.db, b32.db, C);
        } else {
            run_ln_bwd(F32, N, C, dx0, dw0, db0, dout, x, w, f32.mean, f32.rstd, &b32);
            run_ln_bwd(BF16, N, C, dx0, dw0, db0, dout, x, w, f16.mean, f16.rstd, &b16);
            const double r32 = (double)(C + 8) * U32;
            ln_err eu, e32;
            ln_bounds(N, C, x, w, b, dout, U16, 0.0, U16, U16, &eu);
            ln_bounds(N, C, x, w, b, dout, r32, r32, r32, r32, &e32);
            double *tol = dalloc(N * C);
            for (int64_t i = 0; i < N * C; i++)
                tol[i] = out_tol(f32.out[i], eu.out[i] + 2 * e32.out[i]);
            check_within("layernorm_fwd out: vs fp32, unrounded", f16.out, f32.out, tol, N * C);
            for (int64_t i = 0; i < N; i++) tol[i] = eu.mean[i] + 2 * e32.mean[i];
            check_within("layernorm_fwd mean: vs fp32, unrounded", f16.mean, f32.mean, tol, N);
            for (int64_t i = 0; i < N; i++) tol[i] = eu.rstd[i] + 2 * e32.rstd[i];
            check_within("layernorm_fwd rstd: vs fp32, unrounded", f16.rstd, f32.rstd, tol, N);
            for (int64_t i = 0; i < N * C; i++)
                tol[i] = out_tol(b32.dinp[i], eu.dinp[i] + U16 * fabs(dx0[i]) +
                                                  2 * (e32.dinp[i] + U32 * fabs(b32.dinp[i])));
            check_within("layernorm_bwd dinp: vs fp32, unrounded", b16.dinp, b32.dinp, tol, N * C);
            double *sd = col_abs_sums(dout, N, C);
            for (int64_t j = 0; j < C; j++)
                tol[j] = eu.dw[j] + 2 * e32.dw[j] +
                         2.0 * (double)(N + 1) * U32 * (eu.dn_abs[j] * (1 + U16) + fabs(dw0[j]));
            check_within("layernorm_bwd dw: vs fp32, unrounded", b16.dw, b32.dw, tol, C);
            for (int64_t j = 0; j < C; j++)
                tol[j] = eu.db[j] + 2 * e32.db[j] +
                         2.0 * (double)(N + 1) * U32 * (sd[j] * (1 + U16) + fabs(db0[j]));
            check_within("layernorm_bwd db: vs fp32, unrounded", b16.db, b32.db, tol, C);
            free(tol), free(sd);
            ln_err_free(&eu), ln_err_free(&e32);
        }
        free(x), free(w), free(b), free(dout), free(dx0), free(dw0), free(db0);
        free(f32.out), free(f32.mean), free(f32.rstd), free(f16.out), free(f16.mean),
            free(f16.rstd);
        free(b32.dinp), free(b32.dw), free(b32.db), free(b16.dinp), free(b16.dw), free(b16.db);
    }
}

/* ---- the norms' residual add ----------------------------------------------------------------- */

/* One norm (LayerNorm, or RMSNorm when rms) on x + r, fused (the residual given to the norm) or
 * composed (ct_axpy, then the norm without one); res[0] the sum left in x, res[1..3] out, rstd
 * and (LayerNorm) mean. */
static void run_norm_residual(ct_dtype dt, bool rms, bool fused, int64_t N, int64_t C,
                              const float *x, const float *r, const float *w, const float *b,
                              float *res[4]) {
    ct_tensor *in = mat(dt, N, C, x), *tr = mat(dt, N, C, r), *tw = vec(dt, C, w);
    ct_tensor *tb = vec(dt, C, b), *o = mat(dt, N, C, NULL), *m = vec(F32, N, NULL);
    ct_tensor *s = vec(F32, N, NULL);
    if (!fused) ct_axpy(in, tr, 1.0f);
    const ct_tensor *add = fused ? tr : NULL;
    if (rms)
        ct_rmsnorm_add_fwd(o, s, in, add, tw, 1e-5f);
    else
        ct_layernorm_add_fwd(o, m, s, in, add, tw, tb);
    res[0] = take(in), res[1] = take(o), res[2] = take(s), res[3] = take(m);
    ct_tensor_free(tr), ct_tensor_free(tw), ct_tensor_free(tb);
}

/*
 * The residual add fused into the norm that reads it (ct_layernorm_add_fwd, ct_rmsnorm_add_fwd):
 * x (37, 67) += r, stored in x's dtype, then the norm of the stored sum. In both dtypes the sum
 * must be the host's x + r rounded once (bf16: to nearest even) bit for bit, and every output
 * (the sum, out, rstd, mean) bit-identical to ct_axpy followed by the plain norm: the fused op
 * promises exactly that composition's rounding.
 */
static void test_norm_residual(void **state) {
    (void)state;
    const int64_t N = 37, C = 67;
    for (int d = 0; d < 2; d++) {
        const ct_dtype dt = d ? BF16 : F32;
        float *x = rand_f32(N * C, -3, 3), *r = rand_f32(N * C, -3, 3);
        float *w = rand_f32(C, 0.5f, 1.5f), *b = rand_f32(C, -0.5f, 0.5f);
        float *sum = malloc((size_t)(N * C) * sizeof *sum);
        for (int64_t i = 0; i < N * C; i++)
            sum[i] = dt == BF16 ? bf16_round(bf16_round(x[i]) + bf16_round(r[i])) : x[i] + r[i];
        for (int rms = 0; rms < 2; rms++) {
            float *fused[4], *composed[4];
            run_norm_residual(dt, rms, true, N, C, x, r, w, b, fused);
            run_norm_residual(dt, rms, false, N, C, x, r, w, b, composed);
            const char *names[4] = {"inp + residual", "out", "rstd", "mean"};
            const int64_t n[4] = {N * C, N * C, N, N};
            char what[96];
            snprintf(what, sizeof what, "%s_add_fwd %s: inp + residual vs the host's",
                     rms ? "rmsnorm" : "layernorm", dt_name(dt));
            check_identical(what, fused[0], sum, N * C);
            for (int k = 0; k < (rms ? 3 : 4); k++) {
                snprintf(what, sizeof what, "%s_add_fwd %s: %s vs axpy + the norm",
                         rms ? "rmsnorm" : "layernorm", dt_name(dt), names[k]);
                check_identical(what, fused[k], composed[k], n[k]);
            }
            for (int k = 0; k < 4; k++) free(fused[k]), free(composed[k]);
        }
        free(x), free(r), free(w), free(b), free(sum);
    }
}

/* ---- GELU ------------------------------------------------------------------------------------ */

/* GELU's tanh form x·σ(2U), U = k(x + a x³), and its first two derivatives, in double;
 * *sig1 = |σ| + |2x·σ(1−σ)·U'|, the magnitude of the two terms of g' (for its fp32 error). */
static void gelu_derivs(double x, double *g, double *g1, double *g2, double *U, double *sig1) {
    const double k = 0.7978845608028654, a = 0.044715;
    double u = k * (x + a * x * x * x), u1 = k * (1 + 3 * a * x * x), u2 = 6 * k * a * x;
    double S = 1.0 / (1.0 + exp(-2 * u)), S1 = 2 * S * (1 - S) * u1;
    double S2 = 2 * ((1 - 2 * S) * S1 * u1 + S * (1 - S) * u2);
    *g = x * S, *g1 = S + x * S1, *g2 = 2 * S1 + x * S2, *U = u;
    *sig1 = fabs(S) + fabs(x * S1);
}

/* Bounds on |gelu''| and |gelu'''| over the reals, for the second-order terms of the bounds below:
 * the tanh form peaks at 0.798 (x = 0) and 0.777 (|x| = 0.79), measured on a 1e-4 grid over
 * [-20, 20] while writing this test (gelu_derivs agreed with finite differences to 1e-9). */
#define GELU_G2_MAX 1.0
#define GELU_G3_MAX 1.0

static float *run_gelu_fwd(ct_dtype dt, int64_t n, const float *x) {
    ct_tensor *in = vec(dt, n, x), *o = vec(dt, n, NULL);
    ct_gelu_fwd(o, in);
    ct_tensor_free(in);
    return take(o);
}

/* dinp (and dbias when db0 is not NULL) over (N, C); alias: dinp is dout's tensor. */
static float *run_gelu_bwd(ct_dtype dt, int64_t N, int64_t C, const float *x, const float *dout,
                           const float *db0, bool alias, float **dbias_out) {
    ct_tensor *in = mat(dt, N, C, x), *d = mat(dt, N, C, dout);
    ct_tensor *dx = alias ? d : mat(dt, N, C, NULL), *db = db0 ? vec(F32, C, db0) : NULL;
    if (!alias) ct_tensor_fill(dx, NAN);
    ct_gelu_bwd(dx, db, in, d);
    if (dbias_out) *dbias_out = db ? take(db) : NULL;
    float *r = peek(dx);
    ct_tensor_free(in), ct_tensor_free(d);
    if (!alias) ct_tensor_free(dx);
    return r;
}

/*
 * Forward on n = 20001 values in [-5, 5] (the staging passes on both threads); backward on the
 * same values as (N, C) = (70, 40) rows (two 64-row chunks of the dbias sum) without dbias, with
 * dbias, and with dinp aliasing dout (with dbias; it must give the non-aliased bits). With
 * x̂ = x(1 + δ), g = gelu, U = k(x + a·x³) its tanh argument:
 *   forward: y = g(x) moves by ≤ |g'(x)|·u|x| + ½·max|g''|·(u|x|)², then the output rounding;
 *     slack: the kernel's relative error (8 + 16|U|)·e·|y| per run (exp(−2U) carries U's
 *     rounding; test_ops measures 5e-7·(1 + 2|U|));
 *   backward: dinp = g'(x)·dout moves by ≤ (|g''(x)|·u|x| + ½·max|g'''|·(u|x|)²)·|dout|(1+u)
 *     + |g'(x)|·u|dout|, then the output rounding; slack (8 + 16|U|)·e·(|σ| + |2xσ(1−σ)U'|)·|dout|
 *     (g' adds two terms that cancel near its zero) + e·|dinp| per run;
 *   dbias (f32) += Σ_rows of the unrounded dinp: the sum of those bounds, plus
 *     (N+1)·e·(Σ|dinp| + |dbias0|) per run.
 * Summing the unrounded dinp is what the contract pins (bf16 dbias = f32 dbias on the same
 * inputs), so in bf16 the fused dbias is not bit-identical to ct_bias_grad of the stored bf16
 * dinp, which backend.h promises (true in fp32).
 */
static void test_gelu(void **state) {
    (void)state;
    const int64_t n = 20001, N = 70, C = 40;
    for (int pass = 0; pass < 2; pass++) {
        gen_fn gen = gen_for(pass);
        float *x = gen(n, -5, 5), *d = gen(n, -2, 2), *db0 = rand_f32(C, -1, 1);
        float *f32 = run_gelu_fwd(F32, n, x), *f16 = run_gelu_fwd(BF16, n, x);
        float *db32, *db16, *dba16, *ignored;
        float *g32 = run_gelu_bwd(F32, N, C, x, d, NULL, false, &ignored);
        float *g16 = run_gelu_bwd(BF16, N, C, x, d, NULL, false, &ignored);
        float *gb32 = run_gelu_bwd(F32, N, C, x, d, db0, false, &db32);
        float *gb16 = run_gelu_bwd(BF16, N, C, x, d, db0, false, &db16);
        float *ga16 = run_gelu_bwd(BF16, N, C, x, d, db0, true, &dba16);
        check_identical("gelu_bwd bf16: with dbias vs without", gb16, g16, N * C);
        check_identical("gelu_bwd bf16: dinp aliasing dout vs not", ga16, gb16, N * C);
        check_identical("gelu_bwd bf16: dbias, dinp aliasing dout vs not", dba16, db16, C);
        if (pass == 0) {
            check_rounded("gelu_fwd: contract", f16, f32, n);
            check_rounded("gelu_bwd dinp: contract", g16, g32, N * C);
            check_rounded("gelu_bwd dinp with dbias: contract", gb16, gb32, N * C);
            check_identical("gelu_bwd dbias: contract", db16, db32, C);
            float *ga32 = run_gelu_bwd(F32, N, C, x, d, db0, true, &ignored);
            check_rounded("gelu_bwd dinp aliasing dout: contract", ga16, ga32, N * C);
            free(ga32), free(ignored);
        } else {
            double *tol = dalloc(n), *bnd = dalloc(N * C), *slk = dalloc(N * C);
            double g, g1, g2, U, sig1;
            for (int64_t i = 0; i < n; i++) {
                gelu_derivs(x[i], &g, &g1, &g2, &U, &sig1);
                double dx = U16 * fabs(x[i]);
                double prop = fabs(g1) * dx + 0.5 * GELU_G2_MAX * dx * dx;
                double slack = 2.0 * (8 + 16 * fabs(U)) * U32 * (fabs(g) + prop);
                tol[i] = out_tol(f32[i], prop + slack);
            }
            check_within("gelu_fwd: vs fp32, unrounded", f16, f32, tol, n);
            for (int64_t i = 0; i < N * C; i++) {
                gelu_derivs(x[i], &g, &g1, &g2, &U, &sig1);
                double dx = U16 * fabs(x[i]), ad = fabs(d[i]);
                bnd[i] = (fabs(g2) * dx + 0.5 * GELU_G3_MAX * dx * dx) * ad * (1 + U16) +
                         fabs(g1) * U16 * ad;
                slk[i] = 2.0 *
                         ((8 + 16 * fabs(U)) * U32 * sig1 * ad * (1 + U16) + U32 * fabs(g1 * d[i]));
                tol[i] = out_tol(g32[i], bnd[i] + slk[i]);
            }
            check_within("gelu_bwd dinp: vs fp32, unrounded", g16, g32, tol, N * C);
            check_within("gelu_bwd dinp with dbias: vs fp32, unrounded", gb16, gb32, tol, N * C);
            check_within("gelu_bwd dinp aliasing dout: vs fp32, unrounded", ga16, gb32, tol, N * C);
            double *sg = col_abs_sums(gb32, N, C);
            for (int64_t j = 0; j < C; j++) {
                double s = 0.0;
                for (int64_t i = 0; i < N; i++) s += bnd[i * C + j] + slk[i * C + j];
                tol[j] = s + 2.0 * (double)(N + 1) * U32 * (sg[j] * (1 + U16) + fabs(db0[j]));
            }
            check_within("gelu_bwd dbias: vs fp32, unrounded", db16, db32, tol, C);
            free(tol), free(bnd), free(slk), free(sg);
        }
        free(x), free(d), free(db0), free(f32), free(f16), free(g32), free(g16), free(gb32);
        free(gb16), free(ga16), free(db32), free(db16), free(dba16);
    }
}

/* ---- attention ------------------------------------------------------------------------------- */

typedef struct {
    int64_t B, T, H, KV, hd;
} attn_dims;

static void run_attn_fwd(ct_dtype dt, const attn_dims *a, const float *qkv, float **out,
                         float **lse) {
    int64_t cq = a->H * a->hd, lq = (a->H + 2 * a->KV) * a->hd;
    int64_t sq[3] = {a->B, a->T, cq}, sqkv[3] = {a->B, a->T, lq}, sl[3] = {a->B, a->H, a->T};
    ct_tensor *t = tens(dt, 3, sqkv, qkv), *o = tens(dt, 3, sq, NULL), *l = tens(F32, 3, sl, NULL);
    ct_tensor_fill(o, NAN);
    ct_attention_fwd(o, l, t, a->B, a->T, a->H, a->KV);
    *out = take(o), *lse = take(l);
    ct_tensor_free(t);
}

/* dqkv starts as NaN (backward overwrites all of it); dbias (f32) from db0 unless NULL. */
static float *run_attn_bwd(ct_dtype dt, const attn_dims *a, const float *qkv, const float *out,
                           const float *lse, const float *dout, const float *db0, float **dbias) {
    int64_t cq = a->H * a->hd, lq = (a->H + 2 * a->KV) * a->hd;
    int64_t sq[3] = {a->B, a->T, cq}, sqkv[3] = {a->B, a->T, lq}, sl[3] = {a->B, a->H, a->T};
    ct_tensor *t = tens(dt, 3, sqkv, qkv), *o = tens(dt, 3, sq, out), *l = tens(F32, 3, sl, lse);
    ct_tensor *d = tens(dt, 3, sq, dout), *dq = tens(dt, 3, sqkv, NULL);
    ct_tensor *db = db0 ? vec(F32, lq, db0) : NULL;
    ct_tensor_fill(dq, NAN);
    ct_attention_bwd(dq, db, d, t, o, l, a->B, a->T, a->H, a->KV);
    if (dbias) *dbias = db ? take(db) : NULL;
    ct_tensor_free(t), ct_tensor_free(o), ct_tensor_free(l), ct_tensor_free(d);
    return take(dq);
}

/* Bounds on how far attention's results move (before any output rounding) when q, k and v move by
 * ≤ r relative, dout by ≤ rd relative, and the saved lse by lse_extra more than the scores imply;
 * backward reads the saved out moved by its own bound plus, when out_rounded, its bf16 rounding.
 * e_out (B,T,H·hd), e_lse (B,H,T), e_dqkv (B,T,lq): see test_attention for the derivation. */
static void attn_bounds(const attn_dims *a, const float *qkv, const float *dout, double r,
                        double rd, double lse_extra, bool out_rounded, double *e_out, double *e_lse,
                        double *e_dqkv) {
    const int64_t T = a->T, hd = a->hd, cq = a->H * hd, ckv = a->KV * hd, lq = cq + 2 * ckv;
    const int64_t group = a->H / a->KV;
    const double scale = 1.0 / sqrt((double)hd);
    double *S = dalloc(T * T), *P = dalloc(T * T), *sig = dalloc(T * T), *dP = dalloc(T * T);
    double *O = dalloc(T * hd), *eO = dalloc(T * hd), *lam = dalloc(T);
    memset(e_dqkv, 0, (size_t)(a->B * T * lq) * sizeof *e_dqkv);
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->H; h++) {
            const float *q = qkv + b * T * lq + h * hd;
            const float *k = qkv + b * T * lq + cq + h / group * hd, *v = k + ckv;
            const float *dO = dout + b * T * cq + h * hd;
            double *eq = e_dqkv + b * T * lq + h * hd;
            double *ek = e_dqkv + b * T * lq + cq + h / group * hd, *ev = ek + ckv;
#define Q(i, d) ((double)q[(i)*lq + (d)])
#define KK(j, d) ((double)k[(j)*lq + (d)])
#define VV(j, d) ((double)v[(j)*lq + (d)])
#define DO(i, d) ((double)dO[(i)*cq + (d)])
            for (int64_t i = 0; i < T; i++) {
                /* scores and their movement: Δ(q·k) ≤ Σ r|q|(1+r)|k| + |q|r|k| */
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    double s = 0.0, sa = 0.0;
                    for (int64_t d = 0; d < hd; d++)
                        s += Q(i, d) * KK(j, d), sa += fabs(Q(i, d) * KK(j, d));
                    S[i * T + j] = s * scale;
                    sig[i * T + j] = scale * r * (2 + r) * sa;
                    mx = fmax(mx, S[i * T + j]);
                }
                for (int64_t j = 0; j <= i; j++) sum += exp(S[i * T + j] - mx);
                double lse = mx + log(sum), ls = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    P[i * T + j] = exp(S[i * T + j] - lse);
                    ls += P[i * T + j] * exp(sig[i * T + j]);
                }
                /* lse moves by ≤ log Σ_j P_ij·e^{σ_ij} (either way, by Jensen) */
                lam[i] = log(ls) + lse_extra;
                e_lse[(b * a->H + h) * T + i] = lam[i];
                for (int64_t j = 0; j <= i; j++)
                    dP[i * T + j] = P[i * T + j] * expm1(sig[i * T + j] + lam[i]);
                for (int64_t d = 0; d < hd; d++) {
                    double o = 0.0, eo = 0.0;
                    for (int64_t j = 0; j <= i; j++) {
                        o += P[i * T + j] * VV(j, d);
                        eo += dP[i * T + j] * (1 + r) * fabs(VV(j, d)) +
                              P[i * T + j] * r * fabs(VV(j, d));
                    }
                    O[i * hd + d] = o, eO[i * hd + d] = eo;
                    e_out[(b * T + i) * cq + h * hd + d] = eo;
                }
            }
            for (int64_t i = 0; i < T; i++) {
                /* D_i = dO_i·O_i read from the saved (possibly rounded) out */
                double D = 0.0, eD = 0.0;
                for (int64_t d = 0; d < hd; d++) {
                    double eo = eO[i * hd + d] +
                                (out_rounded ? U16 * (fabs(O[i * hd + d]) + eO[i * hd + d]) : 0.0);
                    D += DO(i, d) * O[i * hd + d];
                    eD += rd * fabs(DO(i, d)) * (fabs(O[i * hd + d]) + eo) + fabs(DO(i, d)) * eo;
                }
                for (int64_t j = 0; j <= i; j++) {
                    double p = P[i * T + j], ep = dP[i * T + j], dp = 0.0, edp = 0.0;
                    for (int64_t d = 0; d < hd; d++) {
                        dp += DO(i, d) * VV(j, d);
                        edp += (rd * (1 + r) + r) * fabs(DO(i, d) * VV(j, d));
                    }
                    /* dS = P(dP − D) */
                    double ds = p * (dp - D);
                    double eds = ep * (fabs(dp - D) + edp + eD) + p * (edp + eD);
                    for (int64_t d = 0; d < hd; d++) {
                        eq[i * lq + d] += scale * (eds * (1 + r) * fabs(KK(j, d)) +
                                                   fabs(ds) * r * fabs(KK(j, d)));
                        ek[j * lq + d] +=
                            scale * (eds * (1 + r) * fabs(Q(i, d)) + fabs(ds) * r * fabs(Q(i, d)));
                        ev[j * lq + d] += ep * (1 + rd) * fabs(DO(i, d)) + p * rd * fabs(DO(i, d));
                    }
                }
            }
#undef Q
#undef KK
#undef VV
#undef DO
        }
    free(S), free(P), free(sig), free(dP), free(O), free(eO), free(lam);
}

/*
 * Causal attention forward and backward (dbias from arbitrary fp32 values), packed qkv in [-1, 1]
 * (dout in [-1, 1]). Check 2 runs the chain forward → backward in each precision: the bf16
 * backward reads the bf16 forward's rounded out and its lse. Per (batch, head), with the rounded
 * q, k, v, dout (each ≤ u relative):
 *   scores s_ij = scale·q_i·k_j move by ≤ σ_ij = scale·u(2+u)·Σ_d|q_id·k_jd|;
 *   lse_i = log Σ_j e^{s_ij} by ≤ Λ_i = log Σ_j P_ij·e^{σ_ij} (rigorous both ways, Jensen);
 *   P_ij = e^{s_ij − lse_i} by ≤ P_ij·expm1(σ_ij + Λ_i);
 *   out_i = Σ_j P_ij v_j by ≤ Σ_j (ΔP_ij(1+u)|v_j| + P_ij·u|v_j|), then the output rounding;
 *   backward: dP_ij = dO_i·v_j, D_i = dO_i·out_i (out as saved: its bound + its rounding),
 *   dS = P(dP − D), dq = scale·dS·K, dk = scale·dSᵀ·Q, dv = Pᵀ·dO (dk, dv summed over the query
 *   heads of a kv head), each product's bound carried as Δ(ab) ≤ Δa(|b| + Δb) + |a|Δb; then the
 *   output rounding. dbias (f32) += the column sums of the unrounded dqkv: the sum of the bounds,
 *   plus (B·T+1)·e·(Σ|dqkv| + |dbias0|) per run.
 * The fp32 slack is the same propagation with every input perturbed by (hd + T + 8)·e (the longest
 * fp32 sums: hd in scores, T in softmax and the P GEMMs) and lse by (T + 8)·e more, counted twice.
 * Contract: forward on the same qkv; backward on the same qkv, dout, out (the bf16 forward's, so
 * bf16-representable) and lse; and without dbias the same dqkv bits as with it.
 */
static void attn_check(const attn_dims *a) {
    const int64_t T = a->T, cq = a->H * a->hd, lq = (a->H + 2 * a->KV) * a->hd;
    const int64_t nqkv = a->B * T * lq, nout = a->B * T * cq, nlse = a->B * a->H * T;
    char what[128], tag[64];
    snprintf(tag, sizeof tag, "B=%lld T=%lld H=%lld KV=%lld hd=%lld", (long long)a->B, (long long)T,
             (long long)a->H, (long long)a->KV, (long long)a->hd);
    for (int pass = 0; pass < 2; pass++) {
        gen_fn gen = gen_for(pass);
        float *qkv = gen(nqkv, -1, 1), *dout = gen(nout, -1, 1), *db0 = rand_f32(lq, -1, 1);
        float *o32, *l32, *o16, *l16, *dbias32, *dbias16, *none;
        run_attn_fwd(F32, a, qkv, &o32, &l32);
        run_attn_fwd(BF16, a, qkv, &o16, &l16);
        float *dq32, *dq16;
        if (pass == 0) {
            snprintf(what, sizeof what, "attention_fwd out %s: contract", tag);
            check_rounded(what, o16, o32, nout);
            snprintf(what, sizeof what, "attention_fwd lse %s: contract", tag);
            check_identical(what, l16, l32, nlse);
            dq32 = run_attn_bwd(F32, a, qkv, o16, l32, dout, db0, &dbias32);
            dq16 = run_attn_bwd(BF16, a, qkv, o16, l32, dout, db0, &dbias16);
            snprintf(what, sizeof what, "attention_bwd dqkv %s: contract", tag);
            check_rounded(what, dq16, dq32, nqkv);
            snprintf(what, sizeof what, "attention_bwd dbias %s: contract", tag);
            check_identical(what, dbias16, dbias32, lq);
            float *dqn = run_attn_bwd(BF16, a, qkv, o16, l32, dout, NULL, &none);
            snprintf(what, sizeof what, "attention_bwd bf16 %s: dqkv without dbias vs with", tag);
            check_identical(what, dqn, dq16, nqkv);
            free(dqn);
        } else {
            dq32 = run_attn_bwd(F32, a, qkv, o32, l32, dout, db0, &dbias32);
            dq16 = run_attn_bwd(BF16, a, qkv, o16, l16, dout, db0, &dbias16);
            double *eo = dalloc(nout), *el = dalloc(nlse), *ed = dalloc(nqkv);
            double *eo32 = dalloc(nout), *el32 = dalloc(nlse), *ed32 = dalloc(nqkv);
            double r32 = (double)(a->hd + T + 8) * U32;
            attn_bounds(a, qkv, dout, U16, U16, 0.0, true, eo, el, ed);
            attn_bounds(a, qkv, dout, r32, r32, (double)(T + 8) * U32, false, eo32, el32, ed32);
            double *tol = dalloc(nqkv);
            for (int64_t i = 0; i < nout; i++) tol[i] = out_tol(o32[i], eo[i] + 2 * eo32[i]);
            snprintf(what, sizeof what, "attention_fwd out %s: vs fp32, unrounded", tag);
            check_within(what, o16, o32, tol, nout);
            for (int64_t i = 0; i < nlse; i++) tol[i] = el[i] + 2 * (el32[i] + U32 * fabs(l32[i]));
            snprintf(what, sizeof what, "attention_fwd lse %s: vs fp32, unrounded", tag);
            check_within(what, l16, l32, tol, nlse);
            for (int64_t i = 0; i < nqkv; i++) tol[i] = out_tol(dq32[i], ed[i] + 2 * ed32[i]);
            snprintf(what, sizeof what, "attention_bwd dqkv %s: vs fp32, unrounded", tag);
            check_within(what, dq16, dq32, tol, nqkv);
            double *sd = col_abs_sums(dq32, a->B * T, lq);
            for (int64_t c = 0; c < lq; c++) {
                double s = 0.0;
                for (int64_t row = 0; row < a->B * T; row++)
                    s += ed[row * lq + c] + 2 * ed32[row * lq + c];
                tol[c] =
                    s + 2.0 * (double)(a->B * T + 1) * U32 * (sd[c] * (1 + U16) + fabs(db0[c]));
            }
            snprintf(what, sizeof what, "attention_bwd dbias %s: vs fp32, unrounded", tag);
            check_within(what, dbias16, dbias32, tol, lq);
            free(eo), free(el), free(ed), free(eo32), free(el32), free(ed32), free(tol), free(sd);
        }
        free(qkv), free(dout), free(db0), free(o32), free(l32), free(o16), free(l16);
        free(dq32), free(dq16), free(dbias32), free(dbias16);
    }
}

/* Grouped-query attention, n_head 4 over n_kv_head 2 (dk, dv summed over a group's heads). */
static void test_attention_gqa(void **state) {
    (void)state;
    attn_dims a = {2, 12, 4, 2, 8};
    attn_check(&a);
}

/* Multi-head (GPT-2 shape), T = 19: a full 16-row causal block and a ragged one. */
static void test_attention_mha(void **state) {
    (void)state;
    attn_dims a = {1, 19, 3, 3, 8};
    attn_check(&a);
}

/*
 * One decoding step against a key/value cache (ct_attention_decode) at pos = T/2 and T − 1: the
 * step's qkv (B, 1, lq) is row pos of a packed qkv (B, T, lq) in [-1, 1), and the cache (B, T + 2,
 * 2·KV·hd) holds the key and value heads of its rows 0..pos−1 (the rows from pos on random in
 * [-1, 1): the op writes row pos and reads no further). Its out is then row pos of the forward on
 * that qkv, so attn_bounds above (test_attention's derivation) bounds it.
 * Contract: out is the f32 run's rounded to nearest even, bit for bit (the same fp32 arithmetic
 * on the same values); the caches hold the same values (row pos: the step's key and value heads).
 * Unrounded: out within out_tol(fp32, e + 2·e32) of the fp32 run's (e: attn_bounds with every
 * input moved by u; e32 the fp32 slack, inputs moved by (hd + T + 8)·e, as in attn_check); the
 * bf16 cache is the fp32 cache rounded to nearest even, element for element.
 */
static void run_attn_decode(ct_dtype dt, const attn_dims *a, int64_t Tm, int64_t pos,
                            const float *step, const float *cache, float **out, float **kv) {
    const int64_t cq = a->H * a->hd, lq = (a->H + 2 * a->KV) * a->hd, lkv = 2 * a->KV * a->hd;
    int64_t s1[3] = {a->B, 1, lq}, so[3] = {a->B, 1, cq}, skv[3] = {a->B, Tm, lkv};
    ct_tensor *t = tens(dt, 3, s1, step), *o = tens(dt, 3, so, NULL), *c = tens(dt, 3, skv, cache);
    ct_tensor_fill(o, NAN);
    ct_attention_decode(o, c, t, pos, a->H, a->KV);
    *out = take(o), *kv = take(c);
    ct_tensor_free(t);
}

static void decode_check(const attn_dims *a) {
    const int64_t B = a->B, T = a->T, Tm = T + 2, cq = a->H * a->hd, ckv = a->KV * a->hd;
    const int64_t lq = cq + 2 * ckv, lkv = 2 * ckv, nkv = B * Tm * lkv, nqkv = B * T * lq;
    char what[160], tag[96];
    for (int pass = 0; pass < 2; pass++) {
        gen_fn gen = gen_for(pass);
        float *qkv = gen(nqkv, -1, 1), *cache = gen(nkv, -1, 1);
        float *step = malloc((size_t)(B * lq) * sizeof *step);
        const int64_t at[2] = {T / 2, T - 1};
        for (int i = 0; i < 2; i++) {
            const int64_t pos = at[i];
            for (int64_t b = 0; b < B; b++) {
                for (int64_t j = 0; j < pos; j++)
                    memcpy(cache + (b * Tm + j) * lkv, qkv + (b * T + j) * lq + cq,
                           (size_t)lkv * sizeof *cache);
                memcpy(step + b * lq, qkv + (b * T + pos) * lq, (size_t)lq * sizeof *step);
            }
            float *o32, *o16, *kv32, *kv16;
            run_attn_decode(F32, a, Tm, pos, step, cache, &o32, &kv32);
            run_attn_decode(BF16, a, Tm, pos, step, cache, &o16, &kv16);
            snprintf(tag, sizeof tag, "B=%lld T_max=%lld H=%lld KV=%lld hd=%lld pos=%lld",
                     (long long)B, (long long)Tm, (long long)a->H, (long long)a->KV,
                     (long long)a->hd, (long long)pos);
            if (pass == 0) {
                snprintf(what, sizeof what, "attention_decode out %s: contract", tag);
                check_rounded(what, o16, o32, B * cq);
                snprintf(what, sizeof what, "attention_decode cache %s: contract", tag);
                check_identical(what, kv16, kv32, nkv);
            } else {
                double *eo = dalloc(B * T * cq), *el = dalloc(B * a->H * T), *ed = dalloc(nqkv);
                double *eo32 = dalloc(B * T * cq), *tol = dalloc(B * cq);
                float *zeros = calloc((size_t)(B * T * cq), sizeof(float));
                const double r32 = (double)(a->hd + T + 8) * U32;
                attn_bounds(a, qkv, zeros, U16, U16, 0.0, false, eo, el, ed);
                attn_bounds(a, qkv, zeros, r32, r32, (double)(T + 8) * U32, false, eo32, el, ed);
                for (int64_t b = 0; b < B; b++)
                    for (int64_t c = 0; c < cq; c++) {
                        const int64_t e = (b * T + pos) * cq + c;
                        tol[b * cq + c] = out_tol(o32[b * cq + c], eo[e] + 2 * eo32[e]);
                    }
                snprintf(what, sizeof what, "attention_decode out %s: vs fp32, unrounded", tag);
                check_within(what, o16, o32, tol, B * cq);
                snprintf(what, sizeof what, "attention_decode cache %s: vs fp32, unrounded", tag);
                check_rounded(what, kv16, kv32, nkv);
                free(eo), free(el), free(ed), free(eo32), free(tol), free(zeros);
            }
            free(o32), free(o16), free(kv32), free(kv16);
        }
        free(qkv), free(cache), free(step);
    }
}

/* Grouped-query (n_head 4 over n_kv_head 2, two sequences) and multi-head. */
static void test_attention_decode(void **state) {
    (void)state;
    attn_dims g = {2, 12, 4, 2, 8}, m = {1, 19, 3, 3, 8};
    decode_check(&g);
    decode_check(&m);
}

/* ---- cross-entropy --------------------------------------------------------------------------- */

static float *run_xent_rowmax(ct_dtype dt, int64_t N, int64_t V, int64_t nv, const float *logits) {
    ct_tensor *L = mat(dt, N, V, logits), *mx = vec(F32, N, NULL);
    ct_xent_rowmax(mx, L, nv);
    ct_tensor_free(L);
    return take(mx);
}

/* Returns the logits after the call (exps with keep_exp). */
static float *run_xent_sumexp(ct_dtype dt, int64_t N, int64_t V, int64_t nv, int64_t off,
                              const float *logits, const int32_t *tg, const float *rowmax,
                              bool keep, float **sumexp, float **tlogit) {
    ct_tensor *L = mat(dt, N, V, logits), *t = ivec(N, tg), *mx = vec(F32, N, rowmax);
    ct_tensor *se = vec(F32, N, NULL), *tl = vec(F32, N, NULL);
    ct_xent_sumexp(se, tl, L, t, mx, nv, off, keep);
    *sumexp = take(se), *tlogit = take(tl);
    ct_tensor_free(t), ct_tensor_free(mx);
    return take(L);
}

/* Returns the logits after the call (the gradient with write_grad). */
static float *run_xent_finish(ct_dtype dt, int64_t N, int64_t V, int64_t nv, int64_t off,
                              const float *logits, const int32_t *tg, const float *rowmax,
                              const float *sumexp, const float *tlogit, float dloss, bool write,
                              float **losses) {
    ct_tensor *L = mat(dt, N, V, logits), *t = ivec(N, tg), *mx = vec(F32, N, rowmax);
    ct_tensor *se = vec(F32, N, sumexp), *tl = vec(F32, N, tlogit), *loss = vec(F32, N, NULL);
    ct_xent_finish(loss, L, t, mx, se, tl, nv, off, dloss, write);
    *losses = take(loss);
    ct_tensor_free(t), ct_tensor_free(mx), ct_tensor_free(se), ct_tensor_free(tl);
    return take(L);
}

/* The three steps in one precision (keep_exp, write_grad), as training runs them. */
typedef struct {
    float *rowmax, *sumexp, *tlogit, *exps, *loss, *grad;
} xent_chain;

static void run_xent_chain(ct_dtype dt, int64_t N, int64_t V, int64_t nv, int64_t off,
                           const float *logits, const int32_t *tg, float dloss, xent_chain *c) {
    c->rowmax = run_xent_rowmax(dt, N, V, nv, logits);
    c->exps =
        run_xent_sumexp(dt, N, V, nv, off, logits, tg, c->rowmax, true, &c->sumexp, &c->tlogit);
    c->grad = run_xent_finish(dt, N, V, nv, off, c->exps, tg, c->rowmax, c->sumexp, c->tlogit,
                              dloss, true, &c->loss);
}

static void xent_chain_free(xent_chain *c) {
    free(c->rowmax), free(c->sumexp), free(c->tlogit), free(c->exps), free(c->loss), free(c->grad);
}

static void check_unchanged(const char *what, const float *got, const float *orig, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &orig[i], sizeof(float)) != 0)
            fail_msg("%s: element %lld changed from %.9g to %.9g", what, (long long)i,
                     (double)orig[i], (double)got[i]);
}

/*
 * The vocab-parallel shard: N = 24 rows, V = 100 columns of which n_valid = 90 (columns 90-99 are
 * padding holding 1e4, which must be ignored), col_offset 30: targets are global ids, those in
 * [30, 120) fall in this shard (edges 29, 30, 119 and 120 — column 90, a padded one — included).
 * Logits in [-4, 4], dloss = 1/24. Check 2 runs the chain rowmax → sumexp (keep_exp) → finish
 * (write_grad) in each precision. With l̂ = l(1 + δ) and e_j = exp(l_j − max), p_j = e_j / Σe:
 *   rowmax: rounding is monotone, so the bf16 max is the fp32 max rounded — exactly;
 *   target_logit: the target's logit rounded — exactly;
 *   exps (keep_exp): l − max moves by ≤ δ_j = u(|l_j| + |max|), e_j by ≤ e_j·expm1(δ_j), then the
 *   output rounding; padding columns keep their (rounded) values; slack e_j·e·(|l_j| + |max| + 4);
 *   sumexp (f32, sums the unrounded exps) by ≤ Σ_j e_j·expm1(δ_j) =: ρ·Σe; slack + (n_valid+1)·e;
 *   loss = log Σ e^{l_j} − l_t (max cancels exactly) by ≤ log Σ_j p_j e^{u|l_j|} + u|l_t|;
 *   grad = dloss·(ê_j / sumexp) − dloss·[j = t], with ê_j the stored, rounded exp: p_j moves by
 *   ≤ p_j·((1 + expm1(δ_j))(1 + u)/(1 − ρ) − 1), then the output rounding; padding exactly 0.
 * Also: keep_exp = false and write_grad = false leave the logits untouched and give the same
 * statistics and losses (both precisions, both checks).
 */
static void test_xent(void **state) {
    (void)state;
    const int64_t N = 24, V = 100, nv = 90, off = 30;
    const float dloss = 1.0f / 24.0f;
    int32_t tg[24];
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(rng_next() % 150);
    tg[0] = 29, tg[1] = 30, tg[2] = 119, tg[3] = 120, tg[4] = 0, tg[5] = 60;
    for (int pass = 0; pass < 2; pass++) {
        gen_fn gen = gen_for(pass);
        float *L = gen(N * V, -4, 4);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = nv; j < V; j++) L[i * V + j] = pass == 0 ? bf16_round(1e4f) : 1e4f;
        float *orig16 = malloc((size_t)(N * V) * sizeof *orig16);
        for (int64_t i = 0; i < N * V; i++) orig16[i] = bf16_round(L[i]);
        xent_chain c32, c16;
        float *se, *tl, *loss, *kept;
        if (pass == 0) {
            /* step by step on identical inputs: each step's inputs are the f32 run's outputs, or
             * the bf16 run's where those are bf16 (the stored exps) */
            c32.rowmax = run_xent_rowmax(F32, N, V, nv, L);
            c16.rowmax = run_xent_rowmax(BF16, N, V, nv, L);
            check_identical("xent_rowmax: contract", c16.rowmax, c32.rowmax, N);
            c32.exps = run_xent_sumexp(F32, N, V, nv, off, L, tg, c32.rowmax, true, &c32.sumexp,
                                       &c32.tlogit);
            c16.exps = run_xent_sumexp(BF16, N, V, nv, off, L, tg, c32.rowmax, true, &c16.sumexp,
                                       &c16.tlogit);
            check_identical("xent_sumexp sumexp: contract", c16.sumexp, c32.sumexp, N);
            check_identical("xent_sumexp target_logit: contract", c16.tlogit, c32.tlogit, N);
            check_rounded("xent_sumexp kept exps: contract", c16.exps, c32.exps, N * V);
            c32.grad = run_xent_finish(F32, N, V, nv, off, c16.exps, tg, c32.rowmax, c32.sumexp,
                                       c32.tlogit, dloss, true, &c32.loss);
            c16.grad = run_xent_finish(BF16, N, V, nv, off, c16.exps, tg, c32.rowmax, c32.sumexp,
                                       c32.tlogit, dloss, true, &c16.loss);
            check_identical("xent_finish losses: contract", c16.loss, c32.loss, N);
            check_rounded("xent_finish grad: contract", c16.grad, c32.grad, N * V);
        } else {
            run_xent_chain(F32, N, V, nv, off, L, tg, dloss, &c32);
            run_xent_chain(BF16, N, V, nv, off, L, tg, dloss, &c16);
            check_rounded("xent_rowmax: vs fp32, unrounded (exactly the rounded max)", c16.rowmax,
                          c32.rowmax, N);
            check_rounded("xent_sumexp target_logit: vs fp32, unrounded (exactly rounded)",
                          c16.tlogit, c32.tlogit, N);
            double *te = dalloc(N * V), *tg_ = dalloc(N * V), *tse = dalloc(N), *tls = dalloc(N);
            for (int64_t i = 0; i < N; i++) {
                const float *l = L + i * V;
                double mx = -INFINITY, sum = 0.0, de = 0.0, s32 = 0.0, lp = 0.0;
                for (int64_t j = 0; j < nv; j++) mx = fmax(mx, l[j]);
                for (int64_t j = 0; j < nv; j++) sum += exp(l[j] - mx);
                for (int64_t j = 0; j < nv; j++) {
                    double e = exp(l[j] - mx), dl = U16 * (fabs(l[j]) + fabs(mx));
                    double sl = 2.0 * e * U32 * (fabs(l[j]) + fabs(mx) + 4);
                    de += e * expm1(dl), s32 += sl;
                    lp += e / sum * exp(U16 * fabs(l[j]));
                    te[i * V + j] = out_tol(c32.exps[i * V + j], e * expm1(dl) + sl);
                }
                for (int64_t j = nv; j < V; j++) te[i * V + j] = out_tol(c32.exps[i * V + j], 0.0);
                s32 += 2.0 * (double)(nv + 1) * U32 * sum;
                double rho = de / sum, rho32 = s32 / sum;
                tse[i] = de + s32;
                int64_t t = tg[i] - off;
                bool in = t >= 0 && t < nv;
                double lt = in ? fabs(l[t]) : 0.0;
                tls[i] = log(lp) + U16 * lt +
                         2.0 * (1.01 * rho32 + 3 * U32 * (fabs(log(sum)) + fabs(mx) + lt));
                for (int64_t j = 0; j < nv; j++) {
                    double e = exp(l[j] - mx), p = e / sum, dl = U16 * (fabs(l[j]) + fabs(mx));
                    double dp = p * ((1 + expm1(dl)) * (1 + U16) / (1 - rho) - 1);
                    double slack =
                        2.0 * (fabs(dloss) * p * (U32 * (fabs(l[j]) + fabs(mx) + 7) + rho32) +
                               U32 * fabs(c32.grad[i * V + j]));
                    tg_[i * V + j] = out_tol(c32.grad[i * V + j], fabs(dloss) * dp + slack);
                }
                for (int64_t j = nv; j < V; j++) tg_[i * V + j] = 0.0;
            }
            check_within("xent_sumexp kept exps: vs fp32, unrounded", c16.exps, c32.exps, te,
                         N * V);
            check_within("xent_sumexp sumexp: vs fp32, unrounded", c16.sumexp, c32.sumexp, tse, N);
            check_within("xent_finish losses: vs fp32, unrounded", c16.loss, c32.loss, tls, N);
            check_within("xent_finish grad: vs fp32, unrounded", c16.grad, c32.grad, tg_, N * V);
            free(te), free(tg_), free(tse), free(tls);
        }
        /* keep_exp = false, write_grad = false: logits untouched, same statistics and losses */
        for (int k = 0; k < 2; k++) {
            ct_dtype dt = k ? BF16 : F32;
            xent_chain *c = k ? &c16 : &c32;
            char what[96];
            kept = run_xent_sumexp(dt, N, V, nv, off, L, tg, c->rowmax, false, &se, &tl);
            snprintf(what, sizeof what, "xent_sumexp %s keep_exp=false: logits", dt_name(dt));
            check_unchanged(what, kept, k ? orig16 : L, N * V);
            snprintf(what, sizeof what, "xent_sumexp %s keep_exp=false: sumexp", dt_name(dt));
            check_identical(what, se, c->sumexp, N);
            free(kept), free(se), free(tl);
            kept = run_xent_finish(dt, N, V, nv, off, L, tg, c->rowmax, c->sumexp, c->tlogit, dloss,
                                   false, &loss);
            snprintf(what, sizeof what, "xent_finish %s write_grad=false: logits", dt_name(dt));
            check_unchanged(what, kept, k ? orig16 : L, N * V);
            snprintf(what, sizeof what, "xent_finish %s write_grad=false: losses", dt_name(dt));
            check_identical(what, loss, c->loss, N);
            free(kept), free(loss);
        }
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = nv; j < V; j++)
                if (c16.grad[i * V + j] != 0.0f)
                    fail_msg("xent bf16: padded column %lld has a gradient", (long long)j);
        xent_chain_free(&c32), xent_chain_free(&c16);
        free(L), free(orig16);
    }
}

/* ---- AdamW ----------------------------------------------------------------------------------- */

typedef struct {
    float *p, *m, *v, *copy;
} adamw_res;

/* One step on fresh copies of the fp32 state; copy_dt F32/BF16 makes a param_copy prefilled with
 * 7 (the elements outside the segments must keep it), CT_DTYPE_I32 means none. */
static void run_adamw(ct_dtype copy_dt, int64_t n, const float *p, const float *g, const float *m,
                      const float *v, const ct_adamw_segment *seg, int nseg,
                      const ct_adamw_hparams *hp, adamw_res *r) {
    ct_tensor *tp = vec(F32, n, p), *tg = vec(F32, n, g), *tm = vec(F32, n, m),
              *tv = vec(F32, n, v);
    ct_tensor *c = copy_dt == CT_DTYPE_I32 ? NULL : vec(copy_dt, n, NULL);
    if (c) ct_tensor_fill(c, 7.0f);
    ct_adamw(tp, tg, tm, tv, seg, nseg, hp, c);
    r->p = take(tp), r->m = take(tm), r->v = take(tv), r->copy = c ? take(c) : NULL;
    ct_tensor_free(tg);
}

/*
 * AdamW has no bf16 inputs: master weights, gradients and moments are fp32 in both modes; bf16
 * mode only stores a bf16 copy of the updated weights. So the contract is the whole story: with a
 * bf16 param_copy, with an f32 one and with none, param, m and v are bit-identical; the bf16 copy
 * is the updated fp32 param rounded to nearest even (and the f32 copy equals it), on the segments
 * only — [0, 100) decayed and [120, 300) not; the gap [100, 120) keeps its 7. Check 2 (the bf16
 * weights the model computes with against the fp32 weights) is then one rounding: u·|param|.
 */
static void test_adamw(void **state) {
    (void)state;
    const int64_t n = 300;
    float *p = rand_f32(n, -1, 1), *g = rand_f32(n, -1, 1), *m = rand_f32(n, -0.1f, 0.1f);
    float *v = rand_f32(n, 0, 0.01f);
    ct_adamw_segment seg[2] = {{0, 100, 0.1f}, {120, 180, 0.0f}};
    ct_adamw_hparams hp = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 3, .grad_scale = 0.5f};
    adamw_res none, c16, c32;
    run_adamw(CT_DTYPE_I32, n, p, g, m, v, seg, 2, &hp, &none);
    run_adamw(BF16, n, p, g, m, v, seg, 2, &hp, &c16);
    run_adamw(F32, n, p, g, m, v, seg, 2, &hp, &c32);
    check_identical("adamw param, bf16 copy vs none: contract", c16.p, none.p, n);
    check_identical("adamw m, bf16 copy vs none: contract", c16.m, none.m, n);
    check_identical("adamw v, bf16 copy vs none: contract", c16.v, none.v, n);
    check_identical("adamw param, f32 copy vs none: contract", c32.p, none.p, n);
    check_identical("adamw m, f32 copy vs none: contract", c32.m, none.m, n);
    check_identical("adamw v, f32 copy vs none: contract", c32.v, none.v, n);
    for (int s = 0; s < 2; s++) {
        int64_t o = seg[s].offset, k = seg[s].count;
        check_rounded("adamw bf16 param_copy: contract", c16.copy + o, none.p + o, k);
        check_identical("adamw f32 param_copy: contract", c32.copy + o, none.p + o, k);
        double *tol = dalloc(k);
        for (int64_t i = 0; i < k; i++) tol[i] = out_tol(none.p[o + i], 0.0);
        check_within("adamw bf16 param_copy: vs fp32 param", c16.copy + o, none.p + o, tol, k);
        free(tol);
    }
    for (int64_t i = 100; i < 120; i++)
        if (c16.copy[i] != 7.0f || c32.copy[i] != 7.0f || none.p[i] != p[i])
            fail_msg("adamw touched element %lld outside the segments", (long long)i);
    free(p), free(g), free(m), free(v);
    adamw_res *rs[3] = {&none, &c16, &c32};
    for (int i = 0; i < 3; i++) free(rs[i]->p), free(rs[i]->m), free(rs[i]->v), free(rs[i]->copy);
}

/* ---- main ------------------------------------------------------------------------------------ */

/* ---- Llama's ops: RMSNorm, RoPE, SwiGLU (the contract) ----------------------------------------
 */

typedef struct {
    float *out, *rstd, *dinp, *dw, *rope, *rope_inv, *sw, *dgu;
} llama_res;

/* RMSNorm forward and backward (on the f32 run's rstd, so both backwards see the same input),
 * RoPE forward and inverse on a packed (N, 40) qkv whose first 24 columns (4 heads of 6) rotate,
 * SwiGLU forward and backward on a (N, 2H) gate_up, all in dtype dt. */
static void run_llama(ct_dtype dt, int64_t N, int64_t C, int64_t H, const float *x, const float *w,
                      const float *dout, const float *dx0, const float *dw0, const float *rstd_in,
                      const float *qkv, const float *table, const float *gu, const float *dsw,
                      llama_res *r) {
    ct_tensor *in = mat(dt, N, C, x), *tw = vec(dt, C, w), *o = mat(dt, N, C, NULL);
    ct_tensor *s = vec(F32, N, NULL), *d = mat(dt, N, C, dout), *dx = mat(dt, N, C, dx0);
    ct_tensor *dw = vec(F32, C, dw0), *s_in = vec(F32, N, rstd_in);
    ct_rmsnorm_fwd(o, s, in, tw, 1e-5f);
    if (!rstd_in) ct_tensor_copy(s_in, s);
    ct_rmsnorm_bwd(dx, dw, d, in, tw, s_in);
    r->out = take(o), r->rstd = take(s), r->dinp = take(dx), r->dw = take(dw);
    ct_tensor_free(in), ct_tensor_free(tw), ct_tensor_free(d), ct_tensor_free(s_in);

    ct_tensor *q = mat(dt, N, 40, qkv), *q2 = mat(dt, N, 40, qkv);
    ct_tensor *cs = vec(F32, (N / 2 + 2) * 6, table); /* positions 2 .. N/2 + 1 */
    ct_rope(q, cs, 2, N / 2, 4, 6, 2, false);
    ct_rope(q2, cs, 2, N / 2, 4, 6, 2, true);
    r->rope = take(q), r->rope_inv = take(q2);
    ct_tensor_free(cs);

    ct_tensor *g = mat(dt, N, 2 * H, gu), *sw = mat(dt, N, H, NULL), *ds = mat(dt, N, H, dsw);
    ct_tensor *dg = mat(dt, N, 2 * H, NULL);
    ct_swiglu_fwd(sw, g);
    ct_swiglu_bwd(dg, g, ds);
    r->sw = take(sw), r->dgu = take(dg);
    ct_tensor_free(g), ct_tensor_free(ds);
}

static void llama_res_free(llama_res *r) {
    free(r->out), free(r->rstd), free(r->dinp), free(r->dw), free(r->rope), free(r->rope_inv);
    free(r->sw), free(r->dgu);
}

/* The contract on bf16-representable inputs: every bf16 output the f32 run's rounded to nearest
 * even, rstd and dw (fp32) bit-identical; RoPE's unrotated columns (the v heads) keep their bytes,
 * and SwiGLU's interleaved dgate and dup (one (N, 2H) buffer, staged apart) are both stored. */
static void test_llama_contract(void **state) {
    (void)state;
    const int64_t N = 8, C = 40, H = 36;
    float *x = rand_bf16(N * C, -2, 2), *w = rand_bf16(C, 0.5f, 1.5f);
    float *dout = rand_bf16(N * C, -1, 1), *dx0 = rand_bf16(N * C, -1, 1);
    float *dw0 = rand_f32(C, -1, 1), *qkv = rand_bf16(N * 40, -2, 2);
    float *gu = rand_bf16(N * 2 * H, -6, 6), *dsw = rand_bf16(N * H, -1, 1);
    float table[8 * 6];
    ct_rope_table(table, 8, 6, 10000.0, NULL);
    llama_res r32, r16;
    run_llama(F32, N, C, H, x, w, dout, dx0, dw0, NULL, qkv, table, gu, dsw, &r32);
    run_llama(BF16, N, C, H, x, w, dout, dx0, dw0, r32.rstd, qkv, table, gu, dsw, &r16);
    check_rounded("rmsnorm_fwd out: contract", r16.out, r32.out, N * C);
    check_identical("rmsnorm_fwd rstd: contract", r16.rstd, r32.rstd, N);
    check_rounded("rmsnorm_bwd dinp: contract", r16.dinp, r32.dinp, N * C);
    check_identical("rmsnorm_bwd dw: contract", r16.dw, r32.dw, C);
    check_rounded("rope: contract", r16.rope, r32.rope, N * 40);
    check_rounded("rope inverse: contract", r16.rope_inv, r32.rope_inv, N * 40);
    for (int64_t i = 0; i < N; i++)
        check_identical("rope leaves the v heads", r16.rope + i * 40 + 24, qkv + i * 40 + 24, 16);
    check_rounded("swiglu_fwd: contract", r16.sw, r32.sw, N * H);
    check_rounded("swiglu_bwd dgate_up: contract", r16.dgu, r32.dgu, N * 2 * H);
    llama_res_free(&r32), llama_res_free(&r16);
    free(x), free(w), free(dout), free(dx0), free(dw0), free(qkv), free(gu), free(dsw);
}

/* silu(t) = t·σ(t) and its derivatives: |silu'| <= 1.1, |silu''| <= 0.5 (at 0), |silu'''| <= 0.31
 * (0.30818 by a scan of [-40, 40] in steps of 1e-5; beyond, every derivative decays). */
#define SILU_D2_MAX 0.5
#define SILU_D3_MAX 0.31
static void silu_derivs(double t, double *f, double *f1, double *f2) {
    double sg = 1.0 / (1.0 + exp(-t)), sp = sg * (1.0 - sg);
    *f = t * sg;
    *f1 = sg * (1.0 + t * (1.0 - sg));
    *f2 = sp * (2.0 + t * (1.0 - 2.0 * sg));
}

/* Check 2 for Llama's ops: random fp32 inputs against the bf16 ops on their rounding. Bounds,
 * per element, with u = 2^-8 (each input moves by at most u of itself) and the stored output's
 * rounding added by out_tol:
 *   RMSNorm y = x·w·r, r = 1/sqrt(mean x² + eps): x and w move by u, mean x² by at most
 *     (1 ± u)² of itself, so r by a factor in [1/(1+u), 1/(1-u)]: |Δy| <= |y|((1+u)²/(1-u) - 1);
 *     r (fp32) by r(1/(1-u) - 1).
 *   RMSNorm backward on one rstd (the f32 run's): dx = dx0 + r·w·dy - x·r³·S/C with
 *     S = Σ w·dy·x; the second term moves by (1+u)² - 1 of itself, S by ΔS = Σ|w dy x|((1+u)³ - 1),
 *     the last term by r³/C·|x|(u(|S| + ΔS) + ΔS), dx0 by u|dx0|; dw += Σ_rows dy·x·r moves by
 *     Σ|dy x r|((1+u)² - 1).
 *   RoPE y0 = x0 c ∓ x1 s, y1 = ±x0 s + x1 c (one table for both runs): |Δy| <= u(|x0 c| + |x1 s|)
 *     (c and s swapped for y1); the unrotated heads are copies: only their rounding.
 *   SwiGLU out = silu(g)·v: silu moves by Δs = |silu'(g)|·u|g| + (SILU_D2_MAX/2)(u g)², so
 *     |Δout| <= Δs·|v|(1+u) + |silu(g)|·u|v|; dup = dy·silu(g) by Δs|dy|(1+u) + |silu(g)|u|dy|;
 *     dgate = dy·v·silu'(g) by |dy v|(((1+u)² - 1)(|silu'(g)| + Δs') + Δs'), with
 *     Δs' = |silu''(g)|·u|g| + (SILU_D3_MAX/2)(u g)².
 * fp32 slack: each run's sums and products perturb by k·e of the absolute terms, k the longest
 * sum plus a few steps (top of the file), counted twice. */
static void test_llama_vs_fp32(void **state) {
    (void)state;
    const int64_t N = 64, C = 40, H = 36, T = N / 2;
    float *x = rand_f32(N * C, -2, 2), *w = rand_f32(C, 0.5f, 1.5f);
    float *dout = rand_f32(N * C, -1, 1), *dx0 = rand_f32(N * C, -1, 1);
    float *dw0 = rand_f32(C, -1, 1), *qkv = rand_f32(N * 40, -2, 2);
    float *gu = rand_f32(N * 2 * H, -6, 6), *dsw = rand_f32(N * H, -1, 1);
    float *table = malloc((size_t)(T + 2) * 6 * sizeof(float));
    ct_rope_table(table, T + 2, 6, 10000.0, NULL);
    llama_res r32, r16;
    run_llama(F32, N, C, H, x, w, dout, dx0, dw0, NULL, qkv, table, gu, dsw, &r32);
    run_llama(BF16, N, C, H, x, w, dout, dx0, dw0, r32.rstd, qkv, table, gu, dsw, &r16);
    const double u = U16, e = U32;
    double *tol = dalloc(N * 2 * H), *rtol = dalloc(N), *dwtol = dalloc(C);
    for (int64_t i = 0; i < N; i++) {
        double r = r32.rstd[i];
        rtol[i] = r * (1.0 / (1.0 - u) - 1.0) + 2.0 * (C + 8) * e * r;
        for (int64_t j = 0; j < C; j++) {
            double y = (double)x[i * C + j] * w[j] * r;
            double pre = fabs(y) * ((1 + u) * (1 + u) / (1 - u) - 1) + 2.0 * (C + 8) * e * fabs(y);
            tol[i * C + j] = out_tol(r32.out[i * C + j], pre);
        }
    }
    check_within("rmsnorm_fwd out: vs fp32, unrounded", r16.out, r32.out, tol, N * C);
    check_within("rmsnorm_fwd rstd: vs fp32, unrounded", r16.rstd, r32.rstd, rtol, N);
    for (int64_t i = 0; i < N; i++) {
        const float *xi = x + i * C, *di = dout + i * C;
        double r = r32.rstd[i], S = 0, Sabs = 0;
        for (int64_t j = 0; j < C; j++) {
            double t = (double)w[j] * di[j] * xi[j];
            S += t, Sabs += fabs(t);
        }
        double dS = Sabs * (pow(1 + u, 3) - 1), r3 = r * r * r / (double)C;
        for (int64_t j = 0; j < C; j++) {
            double a = fabs(r * w[j] * di[j]), b = r3 * fabs(xi[j]), d0 = fabs(dx0[i * C + j]);
            double pre = a * ((1 + u) * (1 + u) - 1) + b * (u * (fabs(S) + dS) + dS) + u * d0 +
                         2.0 * (C + 10) * e * (a + b * Sabs + d0);
            tol[i * C + j] = out_tol(r32.dinp[i * C + j], pre);
            double t = fabs((double)di[j] * xi[j] * r);
            dwtol[j] += t * ((1 + u) * (1 + u) - 1) + 2.0 * (N + 3) * e * t;
        }
    }
    for (int64_t j = 0; j < C; j++) dwtol[j] += 2.0 * (N + 3) * e * fabs(dw0[j]);
    check_within("rmsnorm_bwd dinp: vs fp32, unrounded", r16.dinp, r32.dinp, tol, N * C);
    check_within("rmsnorm_bwd dw: vs fp32, unrounded", r16.dw, r32.dw, dwtol, C);
    for (int pass = 0; pass < 2; pass++) { /* forward, then the inverse */
        const float *got = pass ? r16.rope_inv : r16.rope, *want = pass ? r32.rope_inv : r32.rope;
        for (int64_t i = 0; i < N; i++)
            for (int64_t k = 0; k < 40; k++) {
                const float *q = qkv + i * 40;
                double pre = 0;
                if (k < 24) { /* 4 rotated heads of 6: pair p of head k / 6 */
                    int64_t pos = i % T + 2, p = k % 6 / 2, k0 = k - k % 2;
                    double c = table[(pos * 3 + p) * 2], sn = table[(pos * 3 + p) * 2 + 1];
                    double a = fabs(q[k0] * (k % 2 ? sn : c));
                    double b = fabs(q[k0 + 1] * (k % 2 ? c : sn));
                    pre = u * (a + b) + 2.0 * 3 * e * (a + b);
                }
                tol[i * 40 + k] = out_tol(want[i * 40 + k], pre);
            }
        check_within(pass ? "rope inverse: vs fp32, unrounded" : "rope: vs fp32, unrounded", got,
                     want, tol, N * 40);
    }
    double *tol_g = dalloc(N * 2 * H);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < H; j++) {
            double g = gu[i * 2 * H + j], v = gu[i * 2 * H + H + j], dy = dsw[i * H + j];
            double f, f1, f2;
            silu_derivs(g, &f, &f1, &f2);
            double dg = u * fabs(g), ds = fabs(f1) * dg + 0.5 * SILU_D2_MAX * dg * dg;
            double ds1 = fabs(f2) * dg + 0.5 * SILU_D3_MAX * dg * dg;
            double slack = 2.0 * 16 * e * (fabs(g) + 1.0);
            tol[i * H + j] =
                out_tol(r32.sw[i * H + j],
                        ds * fabs(v) * (1 + u) + fabs(f) * u * fabs(v) + slack * fabs(v));
            tol_g[i * 2 * H + j] =
                out_tol(r32.dgu[i * 2 * H + j],
                        fabs(dy * v) * (((1 + u) * (1 + u) - 1) * (fabs(f1) + ds1) + ds1) +
                            slack * fabs(dy * v));
            tol_g[i * 2 * H + H + j] =
                out_tol(r32.dgu[i * 2 * H + H + j],
                        ds * fabs(dy) * (1 + u) + fabs(f) * u * fabs(dy) + slack * fabs(dy));
        }
    check_within("swiglu_fwd: vs fp32, unrounded", r16.sw, r32.sw, tol, N * H);
    check_within("swiglu_bwd dgate_up: vs fp32, unrounded", r16.dgu, r32.dgu, tol_g, N * 2 * H);
    llama_res_free(&r32), llama_res_free(&r16);
    free(tol), free(rtol), free(dwtol), free(tol_g), free(table);
    free(x), free(w), free(dout), free(dx0), free(dw0), free(qkv), free(gu), free(dsw);
}

static int setup(void **state) {
    (void)state;
    verbose = getenv("TEST_BF16_VERBOSE") != NULL;
    be = test_backend_new(2);
    return be ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ct_backend_free(be);
    return 0;
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_bias),
        cmocka_unit_test(test_axpy_scale),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_posemb),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_norm_residual),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_mha),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_xent),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_llama_contract),
        cmocka_unit_test(test_llama_vs_fp32),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, setup, teardown);
}
