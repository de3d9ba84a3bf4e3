/*
 * test_cuda_attention.c — the CUDA backend's causal self-attention (cuda/attention.cu, the slots
 * attention_fwd and attention_bwd), ring attention's step (cuda/attention_part.cu, the slots
 * attention_part_fwd and attention_part_bwd; its own tolerances above test_attention_part) and
 * one decoding step against a key/value cache (cuda/attention.cu, the slot attention_decode; its
 * own cases and tolerances above test_attention_decode) against the CPU backend, the numerical
 * reference, in fp32 and bf16 and in the emulator's three warp orders
 * (test/unit/cuda_test_util.h).
 *
 * Each case makes random inputs from a fixed seed, uploads the same bytes to both backends, runs
 * the slot on each and compares every output element: |got − want| <= atol + rtol·|want|, NaN or
 * Inf anywhere failing. The backward runs on the CPU forward's out and lse on both sides, so it is
 * checked on its own. fp32 runs attention.cu's register-tiled kernels (64 query rows × 64 keys a
 * tile), bf16 the tensor-core kernels of attention_tc.cu (64-row tiles, key steps of 64, or 32 at
 * width 128), both compiling head widths 32, 64 and 128, and once more with
 * CT_CUDA_ATTENTION=wgmma, where the bf16 cases of width 64 run the Hopper kernels (wgmma); ring
 * attention's step runs the fp32 register tiles in both (bf16 widened). Shapes: T = 37 a partial
 * tile, T = 5 much less than a tile, T = 64 one whole tile only, T = 70 two tiles with a 6-row
 * tail, T = 150 three tiles with off-diagonal ones, T = 260 five (the wgmma kernels stream key
 * tiles through three slots), T = 100 at width 128 (four bf16 key steps), T =
 * 1; head_dim 8, 16 and 24 (width 32 partly empty), 18 (rows that are not whole 4-element vectors:
 * the scalar tile loads), 32, 64 (the 124M model's), 80 (width 128) and 128; multi-head (n_kv_head
 * = n_head) and grouped-query (2 or 3 query heads per kv head). Every input sits in a device buffer
 * followed by never-written memory, which the emulator fills with NaN: a read past row T − 1 of the
 * last batch element shows (and dqkv starts as NaN there: an element backward leaves unwritten
 * shows). Every GPU output must be bit-identical in the three warp orders (no atomics, fixed
 * summation order; a race would show).
 *
 * Tolerances. E = 2^-24 is fp32's unit roundoff. A float sum of n terms in any order is within
 * (n + 1)·E·Σ|terms| of the exact sum (first order), and the two backends sum in different orders
 * (CPU: OpenBLAS blocks; CUDA: sequential per lane, online rescaling), so each bound below adds
 * both sides' error, computed per element in double from the data and taken at its maximum over
 * the checked array (a bound for every element is a bound for the worst). K_hd = hd + 5 covers a
 * dot product over the head (hd terms, or lanes of hd/16 and hd/32 and a tree of 4 or 5 levels).
 * Exponentials: CUDA's expf is within 2 ulp, the CPU's exp_f32 about 1 ulp (the emulator uses
 * glibc's, < 1 ulp): 6E relative between them. With s = scale·q·k, a = scale·Σ|q_d k_d|:
 *   forward  each side's score is within K_hd·E·a; the weight exp(s − m) moves by that (an
 *            argument error is a relative weight error), the rounding of s − m (E·R per side,
 *            R = max over the row of m − s), the exp (6E), and on CUDA at most n_t rescales by
 *            exp(m_old − m_new) (each 2 ulp, its argument's rounding and a product: 6E + E·R):
 *            η = 2·K_hd·E·max a + 2E·R + 6E + n_t·(6E + E·R). Normalised weights move by 2η
 *            relative, and the sums Σ p·v and Σ p (T terms each, both sides) and the division add
 *            (4T + 8)E: |Δout| ≤ (2η + (4T + 8)E)·Σ_j p_j·|v_j|. lse = m + log(sum): the maximum
 *            score (2·K_hd·E·a ≤ η), the sum (η + 2TE relative, so as much absolutely in log),
 *            the log and the add (2E·|log sum| + 2E·|lse| per side): 2η + (2T + 4)E + 4E·(|lse|
 *            + log(i + 1)).
 *   backward p = exp(s − lse) from the same lse on both sides moves by η_p = 2·K_hd·E·a +
 *            2E·|s − lse| + 6E relative. dS = p·(dP − D), dP = dO·v and D = dO·O dot products of
 *            hd terms: |ΔdS| ≤ δS = p·(η_p·|dP − D| + 2·K_hd·E·(Σ|dO·v| + Σ|dO·O|) + 4E·|dP − D|).
 *            dQ = scale·Σ_j dS·k (T terms): scale·Σ_j (δS + 2(T + 3)E·|dS|)·|k|; dK and dV sum
 *            over the group's g heads too (g·T terms): scale·Σ (δS + 2(gT + 3)E·|dS|)·|q| and
 *            Σ (η_p·p + 2(gT + 3)E·p)·|dO|. dbias = db0 + Σ over the B·T rows of dqkv (fp32 on
 *            both sides, before any bf16 rounding): the rows' bounds added, plus 2(BT + 3)E·(Σ
 *            |dqkv| + |db0|) for the two sums.
 * Random fp32 data use at most ~1% of these bounds (CUDA_TEST_VERBOSE=1): they are worst cases
 * (every rounding in one direction, the row's largest term for every term) where the real errors
 * have random signs; a planted bug below moves results by 10^-2 to 10^2, or to NaN.
 * bf16: the inputs are bf16 on both sides (the reference values are those roundings), the
 * arithmetic fp32 (tensor-core products of bf16 operands are exact, their sums fp32), so the fp32
 * bound D holds before the outputs are rounded, plus what the tensor-core path rounds on the way:
 * it feeds the weights P (forward, dV) and dS (dQ, dK) to their second product as bf16, each
 * within U8 = 2^-8 relative, which adds U8·Σ p·|v| to out, U8·Σ p·|dO| to dV and U8·scale·Σ
 * |dS|·|k| (|q|) to dQ (dK), and through those rows to dbias. Each side then rounds its outputs
 * once to nearest even, and two values within D can straddle a rounding boundary: D·(1 + 2^-7) +
 * 2^-7·(1 + 2^-7)·|want| (bf16_tol). lse and dbias are fp32 in both modes and keep their bounds.
 * A wrong rounding of the bf16 outputs (toward zero) would hide inside that allowance; check_host
 * catches it by its bias (the signs of the differences, see there).
 *
 * The tensor-core path's planted bugs are in test/tools/mutants.txt (cuda-tc-*: fragment registers
 * swapped, ldmatrix.trans halves from the wrong lanes, the causal mask, a skipped query step, the
 * dbias row groups, truncated stores), each caught here; so are the fp32 kernels' (cuda-f32-*:
 * the register tiles' columns and k steps, the causal mask, the running sum's rescale, the dbias
 * row groups, rows read past T, the lse of the wrong row, the diagonal tile skipped, a missing
 * __syncwarp in dQ and before dK/dV's in-place dS, float4 loads of rows that are not whole).
 * Planted while writing this test against the earlier 32 × 32 fp32 kernels, each seen to fail:
 * the forward's
 * __syncthreads between loading a K/V tile and the scores removed (fails in all three orders:
 * the first tile reads the NaN poison of shared memory); backward's __syncthreads before
 * reloading the Q/dO tile removed (all orders: a warp still reading the previous tile sees the
 * next); the __syncwarp between writing P (forward) or dS (dQ) and reading it removed (all
 * orders); the causal mask off by one in the forward (j < i, j <= i + 1), in dQ (j <= i + 1) and in
 * dK/dV (j < i); the last partial tile dropped (T/32 tiles: the tail rows stay NaN); the GQA head
 * mapping h % n_kv_head instead of h / group in the forward and in dQ (only the H = 4, KV = 2
 * shape fails: with one kv head both mappings agree); the dK/dV loop over query tiles starting
 * one tile late; the tile loader's guard on rows past T removed (the NaN after the buffers
 * shows); bf16 stores rounded toward zero (the bf16 bit count). Removing dK/dV's `i < T` from the
 * mask is not caught and cannot be: rows past T are loaded as zeros, so their dS is exactly 0.
 *
 * Run all:     ./test_cuda_attention
 * Run by name: ./test_cuda_attention test_attention_bwd   (a cmocka filter; wildcards allowed)
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

#include "test/unit/cuda_test_util.h"

#define U8 (1.0 / 256.0) /* one bf16 rounding, 2^-8 */
#define TILE 32          /* half the kernels' 64-row tile: the bounds count rescales generously */
#define PAD 4096         /* never-written (NaN on the emulated device) bytes after every buffer */

/* True while checking bf16 outputs of the tensor-core path (cuda/attention_tc.cu), whose weights P
 * and dS enter their second product rounded to bf16: each within U8 relative. */
static bool tc_weights;

/* ---- inputs (random values: cuda_test_util.h) ------------------------------------------------ */

static double *dzero(int64_t n) {
    double *d = calloc((size_t)(n ? n : 1), sizeof(double));
    if (!d) abort();
    return d;
}

/* n values of dtype dt as floats (malloc'd) */
static float *unpack(ct_dtype dt, const void *p, int64_t n) {
    float *f = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = cuda_test_get(p, dt, i);
    return f;
}

static double dmax(const double *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, x[i]);
    return m;
}

/* ---- buffers on both backends (pbuf, PAD bytes after each), checks in every warp order:
 * cuda_test_util.h -------------------------------------------------------------------------- */

/* Compares n host elements of dtype dt (got: the GPU's, want: the CPU's); true when close. */
static bool check_host(const char *what, const void *got, const void *want, ct_dtype dt, int64_t n,
                       double atol, double rtol) {
    char label[200];
    cuda_test_label(label, sizeof label, what);
    bf16_tol(dt, &atol, &rtol);
    bool ok = cuda_test_close(label, got, want, dt, n, atol, rtol);
    /* bf16: the fp32 values agree to ~1e-6 relative and a bf16 spacing is 2^-7, so a straddle of
     * a rounding midpoint is rare; more than 1 + n/64 differing elements mean a wrong rounding.
     * The tensor-core path's outputs differ from the CPU's by up to 2^-8 relative before their
     * rounding (the bf16 weights), so many bits differ; there a wrong rounding shows as a bias:
     * round-to-nearest-even leaves the GPU's magnitude above the CPU's as often as below (a
     * binomial count with p = 1/2), toward zero (truncation) almost never above. The imbalance
     * may be at most 4 standard deviations, 4·sqrt(differ)/2·2, plus 2. */
    if (dt == BF16 && tc_weights) {
        int64_t above = 0, below = 0;
        for (int64_t i = 0; i < n; i++) {
            const float g = fabsf(cuda_test_get(got, dt, i)), w = fabsf(cuda_test_get(want, dt, i));
            above += g > w, below += g < w;
        }
        if ((double)llabs(above - below) > 4.0 * sqrt((double)(above + below)) + 2) {
            fprintf(stderr,
                    "%s: of the bf16 elements that differ, %lld are larger in magnitude "
                    "and %lld smaller than the CPU's: a biased rounding\n",
                    label, (long long)above, (long long)below);
            ok = false;
        }
    } else if (dt == BF16) {
        ok &= cuda_test_bf16_bits_close(label, got, want, n);
    }
    ok &= cuda_test_same_in_every_order(label, got, (size_t)n * cuda_test_dsize(dt));
    return ok;
}

static const ct_dtype dtypes[2] = {F32, BF16};

/* ---- shapes ---------------------------------------------------------------------------------- */

typedef struct att_shape {
    int64_t B, T, H, KV, hd;
} att_shape;

static const att_shape shapes[] = {
    {2, 37, 4, 4, 16},   /* multi-head; a whole tile and a 5-row tail */
    {2, 37, 4, 2, 16},   /* GQA, 2 query heads per kv head */
    {1, 5, 3, 1, 24},    /* less than a tile; 3 heads per kv head; width 32 a quarter empty */
    {1, 64, 2, 2, 32},   /* whole tiles only */
    {1, 70, 2, 1, 64},   /* the 124M model's head; 3 tiles, a 6-row tail; GQA */
    {1, 33, 2, 1, 80},   /* width 128 with 48 empty columns; a 1-row tail */
    {2, 1, 2, 1, 8},     /* one token per sequence */
    {1, 150, 2, 1, 64},  /* bf16: three 64-row tiles, a 22-row tail, off-diagonal tiles */
    {1, 260, 1, 1, 64},  /* five tiles: the wgmma kernels' three-slot ring of key tiles wraps */
    {1, 100, 4, 2, 128}, /* bf16: width 128 (32-key steps), GQA across two tiles */
    {1, 70, 2, 1, 18},   /* fp32: rows not whole float4s (the scalar tile loads) */
};
enum { N_SHAPES = sizeof shapes / sizeof *shapes };

static void shape_name(char *buf, size_t n, const char *op, ct_dtype dt, const att_shape *s,
                       const char *what) {
    snprintf(buf, n, "%s %s B=%lld T=%lld H=%lld KV=%lld hd=%lld %s", op, ct_dtype_name(dt),
             (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->KV, (long long)s->hd,
             what);
}

/* qkv (B, T, (H + 2·KV)·hd): q and k in [-2, 2) (scores of a few units, peaked softmax rows),
 * v in [-1, 1). */
static float *make_qkv(const att_shape *s) {
    const int64_t cq = s->H * s->hd, ckv = s->KV * s->hd, lq = cq + 2 * ckv;
    float *x = malloc((size_t)(s->B * s->T * lq) * sizeof(float));
    for (int64_t r = 0; r < s->B * s->T; r++)
        for (int64_t c = 0; c < lq; c++)
            x[r * lq + c] = c < cq + ckv ? cuda_test_urand(-2, 2) : cuda_test_urand(-1, 1);
    return x;
}

/* ---- the exact quantities (double) of one (b, h) ------------------------------------------- */

typedef struct head_ref {
    int64_t T, hd;
    const float *q, *k, *v; /* row stride lq */
    int64_t lq;
    double scale;
    double *s, *a; /* (T, T) scores and scale·Σ|q k|, j <= i */
    double *p;     /* (T, T) softmax, 0 past the diagonal */
    double *lse, *m, *R;
} head_ref;

static void head_ref_compute(head_ref *r, const att_shape *sh, const float *qkv, int64_t b,
                             int64_t h) {
    const int64_t T = sh->T, hd = sh->hd, cq = sh->H * hd, ckv = sh->KV * hd;
    const int64_t group = sh->H / sh->KV;
    r->T = T, r->hd = hd, r->lq = cq + 2 * ckv;
    r->q = qkv + b * T * r->lq + h * hd;
    r->k = qkv + b * T * r->lq + cq + h / group * hd;
    r->v = r->k + ckv;
    r->scale = 1.0 / sqrt((double)hd);
    r->s = dzero(T * T), r->a = dzero(T * T), r->p = dzero(T * T);
    r->lse = dzero(T), r->m = dzero(T), r->R = dzero(T);
    for (int64_t i = 0; i < T; i++) {
        double mx = -INFINITY, mn = INFINITY, sum = 0.0;
        for (int64_t j = 0; j <= i; j++) {
            double s = 0.0, a = 0.0;
            for (int64_t d = 0; d < hd; d++) {
                double x = (double)r->q[i * r->lq + d] * r->k[j * r->lq + d];
                s += x, a += fabs(x);
            }
            r->s[i * T + j] = s * r->scale, r->a[i * T + j] = a * r->scale;
            mx = fmax(mx, s * r->scale), mn = fmin(mn, s * r->scale);
        }
        for (int64_t j = 0; j <= i; j++) sum += exp(r->s[i * T + j] - mx);
        for (int64_t j = 0; j <= i; j++) r->p[i * T + j] = exp(r->s[i * T + j] - mx) / sum;
        r->m[i] = mx, r->R[i] = mx - mn, r->lse[i] = mx + log(sum);
    }
}

static void head_ref_free(head_ref *r) {
    free(r->s), free(r->a), free(r->p), free(r->lse), free(r->m), free(r->R);
}

/* ---- forward --------------------------------------------------------------------------------- */

/* The forward bounds of the header: the largest over all outputs of out and of lse. */
static void fwd_bounds(const att_shape *sh, const float *qkv, double pr, double *tol_out,
                       double *tol_lse) {
    const int64_t T = sh->T, hd = sh->hd, n_t = (T + TILE - 1) / TILE;
    const double K = (double)hd + 5;
    *tol_out = *tol_lse = 0.0;
    for (int64_t b = 0; b < sh->B; b++)
        for (int64_t h = 0; h < sh->H; h++) {
            head_ref r;
            head_ref_compute(&r, sh, qkv, b, h);
            for (int64_t i = 0; i < T; i++) {
                double amax = 0.0;
                for (int64_t j = 0; j <= i; j++) amax = fmax(amax, r.a[i * T + j]);
                double eta = 2 * K * E32 * amax + 2 * E32 * r.R[i] + 6 * E32 +
                             (double)n_t * (6 * E32 + E32 * r.R[i]);
                for (int64_t d = 0; d < hd; d++) {
                    double pv = 0.0;
                    for (int64_t j = 0; j <= i; j++) pv += r.p[i * T + j] * fabs(r.v[j * r.lq + d]);
                    *tol_out = fmax(*tol_out, (2 * eta + (4.0 * (double)T + 8) * E32 + pr) * pv);
                }
                double tl = 2 * eta + (2.0 * (double)T + 4) * E32 +
                            4 * E32 * (fabs(r.lse[i]) + log((double)i + 1));
                *tol_lse = fmax(*tol_lse, tl);
            }
            head_ref_free(&r);
        }
}

static bool fwd_case(ct_dtype dt, const att_shape *sh) {
    const int64_t B = sh->B, T = sh->T, H = sh->H, hd = sh->hd;
    const int64_t lq = (H + 2 * sh->KV) * hd, n_out = B * T * H * hd, n_lse = B * H * T;
    cuda_test_seed(1, (uint64_t)(T * 131 + H * 7 + sh->KV), (uint64_t)hd);
    float *x = make_qkv(sh);
    void *hx = cuda_test_pack(dt, x, B * T * lq);
    size_t es = cuda_test_dsize(dt);
    pbuf qkv = pb_new(hx, (size_t)(B * T * lq) * es);
    pbuf out = pb_new(NULL, (size_t)n_out * es), lse = pb_new(NULL, (size_t)n_lse * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = s ? P.gpu : P.cpu;
        be->iface->attention_fwd(be->ctx, dt, out.p[s], lse.p[s], qkv.p[s], B, T, H, sh->KV, hd);
    }
    double tol_out, tol_lse;
    fwd_bounds(sh, x, dt == BF16 ? U8 : 0.0, &tol_out, &tol_lse);
    void *wo = cuda_test_download(P.cpu, out.p[0], (size_t)n_out * es);
    void *go = cuda_test_download(P.gpu, out.p[1], (size_t)n_out * es);
    void *wl = cuda_test_download(P.cpu, lse.p[0], (size_t)n_lse * 4);
    void *gl = cuda_test_download(P.gpu, lse.p[1], (size_t)n_lse * 4);
    char what[2][160];
    shape_name(what[0], sizeof what[0], "attention_fwd", dt, sh, "out");
    shape_name(what[1], sizeof what[1], "attention_fwd", dt, sh, "lse");
    tc_weights = dt == BF16;
    bool ok = check_host(what[0], go, wo, dt, n_out, tol_out, 0.0);
    tc_weights = false;
    ok &= check_host(what[1], gl, wl, F32, n_lse, tol_lse, 0.0);
    pb_free(&qkv), pb_free(&out), pb_free(&lse);
    free(x), free(hx), free(wo), free(go), free(wl), free(gl);
    return ok;
}

static void test_attention_fwd(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int t = 0; t < 2; t++)
            for (int k = 0; k < N_SHAPES; k++) all_ok &= fwd_case(dtypes[t], &shapes[k]);
    });
}

/* ---- backward -------------------------------------------------------------------------------- */

/* The backward bounds of the header, per element of dqkv (B, T, lq) and of dbias (lq), given the
 * inputs as stored (qkv, dout, the saved out) and dbias's starting values db0. */
static void bwd_bounds(const att_shape *sh, const float *qkv, const float *dout, const float *out,
                       const float *db0, double pr, double *e_dqkv, double *e_db) {
    const int64_t B = sh->B, T = sh->T, hd = sh->hd, cq = sh->H * hd, ckv = sh->KV * hd;
    const int64_t lq = cq + 2 * ckv, g = sh->H / sh->KV;
    const double K = (double)hd + 5;
    double *dexact = dzero(B * T * lq); /* the exact dqkv, for the dbias bound's magnitudes */
    double *dS = dzero(T * T), *dSe = dzero(T * T), *eta = dzero(T * T);
    memset(e_dqkv, 0, (size_t)(B * T * lq) * sizeof *e_dqkv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < sh->H; h++) {
            head_ref r;
            head_ref_compute(&r, sh, qkv, b, h);
            const float *dO = dout + b * T * cq + h * hd, *O = out + b * T * cq + h * hd;
            const int64_t qo = b * T * lq + h * hd, ko = b * T * lq + cq + h / g * hd,
                          vo = ko + ckv;
            for (int64_t i = 0; i < T; i++) {
                double D = 0.0, aD = 0.0;
                for (int64_t d = 0; d < hd; d++) {
                    D += (double)dO[i * cq + d] * O[i * cq + d];
                    aD += fabs((double)dO[i * cq + d] * O[i * cq + d]);
                }
                for (int64_t j = 0; j <= i; j++) {
                    double dP = 0.0, aP = 0.0;
                    for (int64_t d = 0; d < hd; d++) {
                        double x = (double)dO[i * cq + d] * r.v[j * lq + d];
                        dP += x, aP += fabs(x);
                    }
                    double p = r.p[i * T + j], x = dP - D;
                    double ep = 2 * K * E32 * r.a[i * T + j] +
                                2 * E32 * fabs(r.s[i * T + j] - r.lse[i]) + 6 * E32;
                    eta[i * T + j] = ep;
                    dS[i * T + j] = p * x;
                    dSe[i * T + j] =
                        p * (ep * fabs(x) + 2 * K * E32 * (aP + aD) + 4 * E32 * fabs(x));
                }
            }
            const double cQ = 2.0 * ((double)T + 3) * E32, cKV = 2.0 * ((double)(g * T) + 3) * E32;
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j <= i; j++) {
                    const double ds = dS[i * T + j], p = r.p[i * T + j];
                    const double eq = dSe[i * T + j] + (cQ + pr) * fabs(ds);
                    const double ek = dSe[i * T + j] + (cKV + pr) * fabs(ds);
                    const double ev = eta[i * T + j] * p + (cKV + pr) * p;
                    for (int64_t d = 0; d < hd; d++) {
                        const double qd = r.q[i * lq + d], kd = r.k[j * lq + d];
                        const double od = dO[i * cq + d];
                        e_dqkv[qo + i * lq + d] += r.scale * eq * fabs(kd);
                        e_dqkv[ko + j * lq + d] += r.scale * ek * fabs(qd);
                        e_dqkv[vo + j * lq + d] += ev * fabs(od);
                        dexact[qo + i * lq + d] += r.scale * ds * kd;
                        dexact[ko + j * lq + d] += r.scale * ds * qd;
                        dexact[vo + j * lq + d] += p * od;
                    }
                }
            head_ref_free(&r);
        }
    for (int64_t c = 0; c < lq; c++) {
        double e = 0.0, mag = fabs(db0[c]);
        for (int64_t row = 0; row < B * T; row++)
            e += e_dqkv[row * lq + c], mag += fabs(dexact[row * lq + c]);
        e_db[c] = e + 2.0 * ((double)(B * T) + 3) * E32 * mag;
    }
    free(dexact), free(dS), free(dSe), free(eta);
}

/* Columns [c0, c0 + w) of the (rows, lq) array x of dtype dt, gathered (malloc'd). */
static void *gather(const void *x, ct_dtype dt, int64_t rows, int64_t lq, int64_t c0, int64_t w) {
    size_t es = cuda_test_dsize(dt);
    char *g = malloc((size_t)(rows * w) * es + 1);
    for (int64_t r = 0; r < rows; r++)
        memcpy(g + (size_t)(r * w) * es, (const char *)x + (size_t)(r * lq + c0) * es,
               (size_t)w * es);
    return g;
}

static double gather_max(const double *e, int64_t rows, int64_t lq, int64_t c0, int64_t w) {
    double m = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = c0; c < c0 + w; c++) m = fmax(m, e[r * lq + c]);
    return m;
}

static bool bwd_case(ct_dtype dt, const att_shape *sh, bool with_dbias) {
    const int64_t B = sh->B, T = sh->T, H = sh->H, KV = sh->KV, hd = sh->hd;
    const int64_t cq = H * hd, ckv = KV * hd, lq = cq + 2 * ckv;
    const int64_t n_qkv = B * T * lq, n_out = B * T * cq, n_lse = B * H * T;
    cuda_test_seed(2, (uint64_t)(T * 131 + H * 7 + KV), (uint64_t)hd);
    float *x = make_qkv(sh), *d = cuda_test_fvec(n_out, -1, 1), *db0 = cuda_test_fvec(lq, -1, 1);
    void *hx = cuda_test_pack(dt, x, n_qkv), *hd_ = cuda_test_pack(dt, d, n_out);
    size_t es = cuda_test_dsize(dt);
    /* the CPU forward's out and lse, the saved activations of both backwards */
    pbuf qkv = pb_new(hx, (size_t)n_qkv * es);
    pbuf out = pb_new(NULL, (size_t)n_out * es), lse = pb_new(NULL, (size_t)n_lse * 4);
    P.cpu->iface->attention_fwd(P.cpu->ctx, dt, out.p[0], lse.p[0], qkv.p[0], B, T, H, KV, hd);
    void *ho = cuda_test_download(P.cpu, out.p[0], (size_t)n_out * es);
    void *hl = cuda_test_download(P.cpu, lse.p[0], (size_t)n_lse * 4);
    P.gpu->iface->copy_from_host(P.gpu->ctx, out.p[1], ho, (size_t)n_out * es);
    P.gpu->iface->copy_from_host(P.gpu->ctx, lse.p[1], hl, (size_t)n_lse * 4);
    pbuf dout = pb_new(hd_, (size_t)n_out * es), dqkv = pb_new(NULL, (size_t)n_qkv * es);
    pbuf db = pb_new(db0, (size_t)lq * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = s ? P.gpu : P.cpu;
        be->iface->attention_bwd(be->ctx, dt, dqkv.p[s], with_dbias ? db.p[s] : NULL, dout.p[s],
                                 qkv.p[s], out.p[s], lse.p[s], B, T, H, KV, hd);
    }
    float *fo = unpack(dt, ho, n_out);
    double *e_dqkv = dzero(n_qkv), *e_db = dzero(lq);
    bwd_bounds(sh, x, d, fo, db0, dt == BF16 ? U8 : 0.0, e_dqkv, e_db);
    void *want = cuda_test_download(P.cpu, dqkv.p[0], (size_t)n_qkv * es);
    void *got = cuda_test_download(P.gpu, dqkv.p[1], (size_t)n_qkv * es);
    const char *names[3] = {"dq", "dk", "dv"};
    const int64_t c0[3] = {0, cq, cq + ckv}, w[3] = {cq, ckv, ckv};
    bool ok = true;
    for (int part = 0; part < 3; part++) {
        char what[160], tag[32];
        snprintf(tag, sizeof tag, "%s%s", names[part], with_dbias ? "" : " (no dbias)");
        shape_name(what, sizeof what, "attention_bwd", dt, sh, tag);
        void *gw = gather(want, dt, B * T, lq, c0[part], w[part]);
        void *gg = gather(got, dt, B * T, lq, c0[part], w[part]);
        tc_weights = dt == BF16;
        ok &= check_host(what, gg, gw, dt, B * T * w[part],
                         gather_max(e_dqkv, B * T, lq, c0[part], w[part]), 0.0);
        tc_weights = false;
        free(gw), free(gg);
    }
    if (with_dbias) {
        char what[160];
        shape_name(what, sizeof what, "attention_bwd", dt, sh, "dbias");
        void *wd = cuda_test_download(P.cpu, db.p[0], (size_t)lq * 4);
        void *gd = cuda_test_download(P.gpu, db.p[1], (size_t)lq * 4);
        ok &= check_host(what, gd, wd, F32, lq, dmax(e_db, lq), 0.0);
        free(wd), free(gd);
    }
    pbuf *bufs[] = {&qkv, &out, &lse, &dout, &dqkv, &db};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) pb_free(bufs[i]);
    free(x), free(d), free(db0), free(hx), free(hd_), free(ho), free(hl), free(fo);
    free(e_dqkv), free(e_db), free(want), free(got);
    return ok;
}

static void test_attention_bwd(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int t = 0; t < 2; t++)
            for (int k = 0; k < N_SHAPES; k++) {
                all_ok &= bwd_case(dtypes[t], &shapes[k], true);
                if (k == 0 || k == 4) all_ok &= bwd_case(dtypes[t], &shapes[k], false);
            }
    });
}

/* ---- one step of ring attention (cuda/attention_part.cu) ------------------------------------ */

/*
 * attention_part_fwd and _bwd against the CPU's part ops. The local rows (T = 2·ch) are two chunks
 * at global chunk indices (q0, q1), the block two chunks at (k0, k1); the three chunk sets below
 * meet every pair kind: full (an earlier key chunk), causal (the same chunk) and skipped (a later
 * one), and a query chunk that sees nothing at all (its accumulators must stay as they were).
 * Inputs q, k, v, dO in [-1, 1); the accumulators start from random values (o_acc, dq_acc,
 * dkv_acc in [-1, 1); lse_acc in [0, 3), or −inf on every third row: the first merge), so the
 * merge and the accumulation are checked, not just the block. Backward gets the CPU forward's
 * lse and out (out in the model's dtype) of a run from empty accumulators, so its P rows sum to 1.
 * Outputs are fp32 on both sides in both dtypes (bf16 inputs are widened, the arithmetic fp32):
 * no bf16 rounding allowance.
 *
 * Tolerances (E = 2^-24), from maxima over the case, in the header's terms: a score's error on
 * each side K_hd·E·scale·hd (|q_d k_d| ≤ 1), scores within R = 2·scale·hd of each other, n_t key
 * tiles of a chunk:
 *   forward  a block as the full forward: η = 2·K_hd·E·scale·hd + 2E·R + 6E + n_t·(6E + E·R),
 *            δO = (2η + (4ch + 8)E) (|v| < 1), δL = 2η + (2ch + 4)E + 4E·(Lmax + log ch). Each
 *            merge computes L' = max + log1p(exp(−|L − Lb|)) (the exp and log1p 2 ulp on the GPU,
 *            1 on the CPU, the adds): δL' = δL + 8E·(1 + Lmax); its weights exp(L − L') and
 *            exp(Lb − L') move by δw = δL + δL' + 6E relative, so O' by δO + 2δw + 8E (|O|,
 *            |Ob| ≤ 1). Two merges a row: twice each.
 *   backward p = exp(s − lse) within η_p = 2·K_hd·E·scale·hd + 2E·R + 6E relative; with |dO|,
 *            |O|, |v| < 1, dP and D are dot products below hd: dS within p·(η_p·2hd + 2·K_hd·E·2hd
 *            + 8E·hd). dQ sums 2·ch keys: within scale·rs·(η_p·2hd + 4·K_hd·E·hd + 8E·hd +
 *            2(2ch + 3)E·2hd), rs the largest row sum of P (1 here); dK and dV sum g·2·ch rows:
 *            within scale·cs·(the same with g·2ch) and cs·(η_p + 2(2g·ch + 3)E), cs the largest
 *            column sum of P over the group's heads (computed in double). Adding to the prior
 *            accumulator: 2E·(1 + |result|).
 * These are worst cases (every rounding one way); random data use well under 1%, and a planted
 * bug (a mask off by one, a lost merge weight, the dK scale) moves results by 10^-2 or more.
 */
typedef struct part_shape {
    int64_t B, ch, H, KV, hd;
} part_shape;

static const part_shape part_shapes[] = {
    {2, 37, 4, 2, 16}, /* one partial 64-row tile per chunk; GQA */
    {1, 5, 3, 1, 24},  /* chunks much shorter than a tile; 3 heads per kv head */
    {1, 70, 2, 2, 64}, /* 2 tiles a chunk, a 6-row tail; width 64 */
    {1, 33, 2, 1, 80}, /* width 128 with 48 empty columns */
    {1, 70, 2, 1, 18}, /* rows that are not whole 4-element vectors (scalar tile loads) */
};
enum { N_PART_SHAPES = sizeof part_shapes / sizeof *part_shapes };

/* (q0, q1, k0, k1): rank 1 of 2 under zigzag meeting rank 0 (full + skipped pairs), itself
 * (causal, skipped and full), and rank 0 of 2 meeting rank 1 (chunk 0 sees nothing). */
static const int part_chunks[3][4] = {{1, 2, 0, 3}, {1, 2, 1, 2}, {0, 3, 1, 2}};

/* The largest row and column sums of P = exp(scale·q·k − lse) over the pairs a chunk set
 * attends (columns summed over the GQA group's heads), in double. */
static void part_psums(const part_shape *sh, const int *chunks, const float *qkv, const float *kv,
                       const float *lse, double *rs_max, double *cs_max) {
    const int64_t ch = sh->ch, T = 2 * ch, hd = sh->hd, cq = sh->H * hd, ckv = sh->KV * hd;
    const int64_t lq = cq + 2 * ckv, lkv = 2 * ckv, g = sh->H / sh->KV;
    const double scale = 1.0 / sqrt((double)hd);
    double *cs = dzero(sh->B * sh->KV * T);
    *rs_max = *cs_max = 0.0;
    for (int64_t b = 0; b < sh->B; b++)
        for (int64_t h = 0; h < sh->H; h++)
            for (int qa = 0; qa < 2; qa++)
                for (int64_t i = 0; i < ch; i++) {
                    double rs = 0.0;
                    for (int ka = 0; ka < 2; ka++) {
                        const int qc = chunks[qa], kc = chunks[2 + ka];
                        if (kc > qc) continue;
                        for (int64_t j = 0; j < (kc == qc ? i + 1 : ch); j++) {
                            double s = 0.0;
                            for (int64_t d = 0; d < hd; d++)
                                s += (double)qkv[(b * T + qa * ch + i) * lq + h * hd + d] *
                                     kv[(b * T + ka * ch + j) * lkv + h / g * hd + d];
                            double p = exp(s * scale - lse[(b * sh->H + h) * T + qa * ch + i]);
                            rs += p;
                            cs[(b * sh->KV + h / g) * T + ka * ch + j] += p;
                        }
                    }
                    *rs_max = fmax(*rs_max, rs);
                }
    *cs_max = dmax(cs, sh->B * sh->KV * T);
    free(cs);
}

static bool part_case(ct_dtype dt, const part_shape *sh, const int *chunks) {
    const int64_t B = sh->B, ch = sh->ch, T = 2 * ch, H = sh->H, KV = sh->KV, hd = sh->hd;
    const int64_t cq = H * hd, ckv = KV * hd, lq = cq + 2 * ckv, lkv = 2 * ckv, g = H / KV;
    const int64_t n_qkv = B * T * lq, n_kv = B * T * lkv, n_o = B * T * cq, n_l = B * H * T;
    const int64_t packed = CT_ATT_CHUNKS(chunks[0], chunks[1], chunks[2], chunks[3]);
    const size_t es = cuda_test_dsize(dt);
    cuda_test_seed(3, (uint64_t)(ch * 131 + H * 7 + KV),
                   (uint64_t)(hd * 16 + chunks[0] * 4 + chunks[2]));
    float *x = cuda_test_fvec(n_qkv, -1, 1), *k = cuda_test_fvec(n_kv, -1, 1);
    float *o0 = cuda_test_fvec(n_o, -1, 1), *l0 = cuda_test_fvec(n_l, 0, 3);
    for (int64_t r = 0; r < n_l; r += 3) l0[r] = -INFINITY;
    float *dout = cuda_test_fvec(n_o, -1, 1), *dq0 = cuda_test_fvec(n_o, -1, 1);
    float *dkv0 = cuda_test_fvec(n_kv, -1, 1);
    void *hx = cuda_test_pack(dt, x, n_qkv), *hk = cuda_test_pack(dt, k, n_kv);
    void *hdo = cuda_test_pack(dt, dout, n_o);
    pbuf qkv = pb_new(hx, (size_t)n_qkv * es), kv = pb_new(hk, (size_t)n_kv * es);
    pbuf o = pb_new(o0, (size_t)n_o * 4), l = pb_new(l0, (size_t)n_l * 4);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = s ? P.gpu : P.cpu;
        be->iface->attention_part_fwd(be->ctx, dt, o.p[s], l.p[s], qkv.p[s], kv.p[s], B, T, H, KV,
                                      hd, packed);
    }
    /* the backward's saved activations: the CPU's part forward from empty accumulators */
    float *fresh_l = malloc((size_t)n_l * sizeof(float));
    for (int64_t r = 0; r < n_l; r++) fresh_l[r] = -INFINITY;
    float *zeros = calloc((size_t)n_o, sizeof(float));
    pbuf fo = pb_new(zeros, (size_t)n_o * 4), fl = pb_new(fresh_l, (size_t)n_l * 4);
    P.cpu->iface->attention_part_fwd(P.cpu->ctx, dt, fo.p[0], fl.p[0], qkv.p[0], kv.p[0], B, T, H,
                                     KV, hd, packed);
    float *out_f = cuda_test_download(P.cpu, fo.p[0], (size_t)n_o * 4);
    float *lse_f = cuda_test_download(P.cpu, fl.p[0], (size_t)n_l * 4);
    /* rows that attend nothing keep lse −inf and out 0: P is 0 there on both sides */
    void *hout = cuda_test_pack(dt, out_f, n_o);
    pbuf out = pb_new(hout, (size_t)n_o * es), lse = pb_new(lse_f, (size_t)n_l * 4);
    pbuf dq = pb_new(dq0, (size_t)n_o * 4), dkv = pb_new(dkv0, (size_t)n_kv * 4);
    pbuf d = pb_new(hdo, (size_t)n_o * es);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = s ? P.gpu : P.cpu;
        be->iface->attention_part_bwd(be->ctx, dt, dq.p[s], dkv.p[s], d.p[s], qkv.p[s], out.p[s],
                                      lse.p[s], kv.p[s], B, T, H, KV, hd, packed);
    }

    /* the bounds of the comment above */
    const double scale = 1.0 / sqrt((double)hd), K = (double)hd + 5, R = 2 * scale * (double)hd;
    const double n_t = (double)((ch + TILE - 1) / TILE), Lmax = 3 + log((double)(2 * ch)) + R;
    const double eta =
        2 * K * E32 * scale * (double)hd + 2 * E32 * R + 6 * E32 + n_t * (6 * E32 + E32 * R);
    const double dO = 2 * eta + (4.0 * (double)ch + 8) * E32;
    const double dL = 2 * eta + (2.0 * (double)ch + 4) * E32 + 4 * E32 * (Lmax + log((double)ch));
    const double dL2 = dL + 8 * E32 * (1 + Lmax), dw = dL + dL2 + 6 * E32;
    const double tol_o = 2 * (dO + 2 * dw + 8 * E32), tol_l = 2 * dL2;
    double rs, cs;
    part_psums(sh, chunks, x, k, lse_f, &rs, &cs);
    const double eta_p = 2 * K * E32 * scale * (double)hd + 2 * E32 * R + 6 * E32;
    const double hd_ = (double)hd, nq = 2.0 * (double)ch, nk = 2.0 * (double)(g * ch);
    const double ds = eta_p * 2 * hd_ + 4 * K * E32 * hd_ + 8 * E32 * hd_;
    const double tol_dq = scale * rs * (ds + 2 * (nq + 3) * E32 * 2 * hd_) + 2 * E32 * (2 + hd_);
    const double tol_dk = scale * cs * (ds + 2 * (nk + 3) * E32 * 2 * hd_) + 2 * E32 * (2 + hd_);
    const double tol_dv = cs * (eta_p + 2 * (nk + 3) * E32) + 2 * E32 * (2 + cs);

    char what[160], tag[64];
    bool ok = true;
    const struct {
        const char *name;
        pbuf *b;
        int64_t n, c0, w, ld;
        double tol;
    } outs[] = {
        {"o_acc", &o, n_o, 0, cq, cq, tol_o},          {"lse_acc", &l, n_l, 0, n_l, n_l, tol_l},
        {"dq_acc", &dq, n_o, 0, cq, cq, tol_dq},       {"dk_acc", &dkv, n_kv, 0, ckv, lkv, tol_dk},
        {"dv_acc", &dkv, n_kv, ckv, ckv, lkv, tol_dv},
    };
    for (size_t i = 0; i < sizeof outs / sizeof *outs; i++) {
        void *want = cuda_test_download(P.cpu, outs[i].b->p[0], (size_t)outs[i].n * 4);
        void *got = cuda_test_download(P.gpu, outs[i].b->p[1], (size_t)outs[i].n * 4);
        const int64_t rows = outs[i].n / outs[i].ld;
        void *gw = gather(want, F32, rows, outs[i].ld, outs[i].c0, outs[i].w);
        void *gg = gather(got, F32, rows, outs[i].ld, outs[i].c0, outs[i].w);
        /* an lse still −inf (a row that has seen no key yet) must be exactly that on both sides;
         * the comparator then sees 0 there (it fails on any infinity) */
        for (int64_t e = 0; e < rows * outs[i].w; e++) {
            float *fw = (float *)gw + e, *fg = (float *)gg + e;
            if (*fw == -INFINITY && *fg == -INFINITY) *fw = *fg = 0.0f;
        }
        snprintf(tag, sizeof tag, "%s chunks %d,%d|%d,%d", outs[i].name, chunks[0], chunks[1],
                 chunks[2], chunks[3]);
        att_shape as = {B, T, H, KV, hd};
        shape_name(what, sizeof what, "attention_part", dt, &as, tag);
        ok &= check_host(what, gg, gw, F32, rows * outs[i].w, outs[i].tol, 0.0);
        free(want), free(got), free(gw), free(gg);
    }
    pbuf *bufs[] = {&qkv, &kv, &o, &l, &fo, &fl, &out, &lse, &dq, &dkv, &d};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) pb_free(bufs[i]);
    free(x), free(k), free(o0), free(l0), free(dout), free(dq0), free(dkv0), free(hx), free(hk);
    free(hdo), free(fresh_l), free(zeros), free(out_f), free(lse_f), free(hout);
    return ok;
}

static void test_attention_part(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int t = 0; t < 2; t++)
            for (int k = 0; k < N_PART_SHAPES; k++)
                for (int c = 0; c < 3; c++)
                    all_ok &= part_case(dtypes[t], &part_shapes[k], part_chunks[c]);
    });
}

/* ---- one decoding step against the cache (attention_decode, cuda/attention.cu) --------------- */

/*
 * attention_decode against the CPU's: qkv (B, 1, lq) one position of each sequence (q and k in
 * [-2, 2), v in [-1, 1)), the cache (B, T_max, 2·KV·hd) random the same way in rows 0..pos (row
 * pos too: the op must overwrite it) and NaN past pos, so a key read past pos shows as NaN in out.
 * Each shape runs at pos 0 (one key: the query's own), a middle pos and T_max − 1.
 *   cache: bit for bit the bytes it started with, but row pos of each sequence, which must be the
 *          bytes of that sequence's key and value heads (the NaN rows past pos included: rows
 *          other than pos are untouched), on both backends;
 *   out:   the forward's bound of the header for the one row i = pos and its n = pos + 1 keys:
 *          |Δout_d| ≤ (2η + (4n + 8)E)·Σ_j p_j·|v_jd|, η = 2·K_hd·E·max_j a_j + 2E·R + 6E +
 *          n_t·(6E + E·R). The CPU sums a score's hd products in order, the GPU per lane and
 *          then over a 5-level butterfly (both within K_hd = hd + 5 terms' error); both sum the n
 *          weights and the n products w·v (the CPU in order, the GPU per lane or thread group,
 *          then over the lanes or groups): the (4n + 8)E; the GPU rescales its running sum and
 *          accumulators once per 64-key tile (n_t counted per TILE = 32 keys, generously); expf
 *          is 2 ulp on a GPU. The weights are fp32 on both sides in both dtypes, so bf16 adds
 *          only its output rounding (bf16_tol) and check_host's bit count. Taken at its maximum
 *          over (b, h, d).
 * Random data use ~1% of the bound; a wrong kv head (test/tools/mutants.txt,
 * cuda-decode-kv-head-modulo), a missing or extra key, or a key row of the wrong sequence moves out
 * by 10^-2 or more (or to NaN).
 */
typedef struct dec_shape {
    int64_t B, T_max, H, KV, hd;
} dec_shape;

static const dec_shape dec_shapes[] = {
    {1, 37, 4, 2, 16},  /* GQA, 2 query heads per kv head; half the lanes of a score idle */
    {2, 37, 4, 4, 16},  /* multi-head, two sequences */
    {2, 70, 4, 2, 64},  /* GQA at the 124M model's width; pos 69 needs a second 64-key tile */
    {1, 150, 2, 2, 64}, /* multi-head, three key tiles: the running max rescaled */
    {1, 20, 2, 1, 80},  /* three thread groups for w·v (240 of 256 threads), 3 lanes of 32 */
    {1, 9, 2, 1, 256},  /* the widest head: 8 query elements a lane, one thread group */
};
enum { N_DEC_SHAPES = sizeof dec_shapes / sizeof *dec_shapes };

static bool dec_case(ct_dtype dt, const dec_shape *sh, int64_t pos) {
    const int64_t B = sh->B, Tm = sh->T_max, H = sh->H, KV = sh->KV, hd = sh->hd;
    const int64_t cq = H * hd, ckv = KV * hd, lq = cq + 2 * ckv, lkv = 2 * ckv, g = H / KV;
    const int64_t n = pos + 1, n_kv = B * Tm * lkv;
    const size_t es = cuda_test_dsize(dt);
    cuda_test_seed(4, (uint64_t)(Tm * 131 + H * 7 + KV), (uint64_t)(hd * 65536 + pos));
    const att_shape as = {B, 1, H, KV, hd};
    float *x = make_qkv(&as), *c = malloc((size_t)n_kv * sizeof(float));
    for (int64_t r = 0; r < B * Tm; r++)
        for (int64_t e = 0; e < lkv; e++)
            c[r * lkv + e] = r % Tm > pos ? NAN
                             : e < ckv    ? cuda_test_urand(-2, 2)
                                          : cuda_test_urand(-1, 1);
    void *hx = cuda_test_pack(dt, x, B * lq), *hc = cuda_test_pack(dt, c, n_kv);
    /* the cache as it must end: row pos of sequence b holds b's key and value heads */
    char *want_kv = malloc((size_t)n_kv * es);
    memcpy(want_kv, hc, (size_t)n_kv * es);
    for (int64_t b = 0; b < B; b++) {
        memcpy(want_kv + (size_t)((b * Tm + pos) * lkv) * es,
               (char *)hx + (size_t)(b * lq + cq) * es, (size_t)lkv * es);
        memcpy(c + (b * Tm + pos) * lkv, x + b * lq + cq, (size_t)lkv * sizeof(float));
    }
    pbuf qkv = pb_new(hx, (size_t)(B * lq) * es), kv = pb_new(hc, (size_t)n_kv * es);
    pbuf out = pb_new(NULL, (size_t)(B * cq) * es);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        be->iface->attention_decode(be->ctx, dt, out.p[s], kv.p[s], qkv.p[s], B, Tm, pos, H, KV,
                                    hd);
    }

    /* the bound of the comment above, in double from the values as stored */
    const double scale = 1.0 / sqrt((double)hd), K = (double)hd + 5;
    const double n_t = (double)((n + TILE - 1) / TILE);
    double tol = 0.0, *sj = dzero(n), *pj = dzero(n);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const float *q = x + b * lq + h * hd, *k0 = c + b * Tm * lkv + h / g * hd;
            double mx = -INFINITY, mn = INFINITY, amax = 0.0, sum = 0.0;
            for (int64_t j = 0; j < n; j++) {
                double dot = 0.0, a = 0.0;
                for (int64_t d = 0; d < hd; d++) {
                    const double t = (double)q[d] * k0[j * lkv + d];
                    dot += t, a += fabs(t);
                }
                sj[j] = dot * scale, amax = fmax(amax, a * scale);
                mx = fmax(mx, sj[j]), mn = fmin(mn, sj[j]);
            }
            for (int64_t j = 0; j < n; j++) sum += pj[j] = exp(sj[j] - mx);
            const double R = mx - mn;
            const double eta =
                2 * K * E32 * amax + 2 * E32 * R + 6 * E32 + n_t * (6 * E32 + E32 * R);
            for (int64_t d = 0; d < hd; d++) {
                double pv = 0.0;
                for (int64_t j = 0; j < n; j++) pv += pj[j] / sum * fabs(k0[j * lkv + ckv + d]);
                tol = fmax(tol, (2 * eta + (4.0 * (double)n + 8) * E32) * pv);
            }
        }

    char what[160], tag[48];
    snprintf(tag, sizeof tag, "T_max=%lld pos=%lld", (long long)Tm, (long long)pos);
    const att_shape ns = {B, 1, H, KV, hd};
    void *wo = cuda_test_download(P.cpu, out.p[0], (size_t)(B * cq) * es);
    void *go = cuda_test_download(P.gpu, out.p[1], (size_t)(B * cq) * es);
    shape_name(what, sizeof what, "attention_decode", dt, &ns, tag);
    bool ok = check_host(what, go, wo, dt, B * cq, tol, 0.0);
    for (int side = 0; side < 2; side++) {
        char *got_kv = cuda_test_download(side_be(side), kv.p[side], (size_t)n_kv * es);
        for (int64_t r = 0; r < B * Tm; r++)
            if (memcmp(got_kv + (size_t)(r * lkv) * es, want_kv + (size_t)(r * lkv) * es,
                       (size_t)lkv * es)) {
                char label[200];
                cuda_test_label(label, sizeof label, what);
                fprintf(stderr, "%s: the %s cache's row %lld of sequence %lld is not %s\n", label,
                        side ? "GPU" : "CPU", (long long)(r % Tm), (long long)(r / Tm),
                        r % Tm == pos ? "the sequence's key and value heads" : "as it was");
                ok = false;
                break;
            }
        free(got_kv);
    }
    pb_free(&qkv), pb_free(&kv), pb_free(&out);
    free(x), free(c), free(hx), free(hc), free(want_kv), free(wo), free(go), free(sj), free(pj);
    return ok;
}

/* pos 0, T_max / 2 and T_max − 1 of every shape (no commas inside FOR_EACH_ORDER's body). */
static bool dec_shape_cases(ct_dtype dt, const dec_shape *sh) {
    const int64_t at[3] = {0, sh->T_max / 2, sh->T_max - 1};
    bool ok = true;
    for (int i = 0; i < 3; i++) ok &= dec_case(dt, sh, at[i]);
    return ok;
}

static void test_attention_decode(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int t = 0; t < 2; t++)
            for (int k = 0; k < N_DEC_SHAPES; k++)
                all_ok &= dec_shape_cases(dtypes[t], &dec_shapes[k]);
    });
}

/* ---- main ------------------------------------------------------------------------------------ */

/* P for the binary, every buffer followed by PAD never-written bytes. */
static int setup(void **state) {
    cuda_test_pad = PAD;
    return cuda_test_setup(state);
}

/* The forward and backward cases again with CT_CUDA_ATTENTION=wgmma: at head width 64 the bf16
 * cases run attention_tc.cu's wgmma kernels (the emulated device is an sm_90), with the same
 * tolerances (the same roundings: P and dS to bf16 before their second product); every other case
 * runs the kernels above once more. */
static void test_attention_fwd_wgmma(void **state) {
    setenv("CT_CUDA_ATTENTION", "wgmma", 1);
    test_attention_fwd(state);
    unsetenv("CT_CUDA_ATTENTION");
}

static void test_attention_bwd_wgmma(void **state) {
    setenv("CT_CUDA_ATTENTION", "wgmma", 1);
    test_attention_bwd(state);
    unsetenv("CT_CUDA_ATTENTION");
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_fwd),       cmocka_unit_test(test_attention_bwd),
        cmocka_unit_test(test_attention_part),      cmocka_unit_test(test_attention_fwd_wgmma),
        cmocka_unit_test(test_attention_bwd_wgmma), cmocka_unit_test(test_attention_decode),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, setup, cuda_test_teardown);
}
