/*
 * test_cuda_elementwise.c — the CUDA backend's element-wise, bias, embedding, AdamW, sum-of-
 * squares and Mixture-of-Experts row kernels (cuda/elementwise.cu, embedding.cu, adamw.cu,
 * moe_rows.cu) against the CPU backend, the numerical reference, in fp32 and bf16 and in the
 * emulator's three warp orders (test/unit/cuda_test_util.h).
 *
 * Each case makes random inputs from a fixed seed, uploads the same bytes to both backends
 * (outputs an op accumulates into, and the bytes around an output it must not touch, start from
 * the same nonzero values on both), runs the slot on each (be->iface->slot) and compares the whole
 * output buffer. Shapes have tails: C = 67 and n = 13 are multiples of neither the warp nor any
 * vector width (the scalar paths), C = 256 takes the 16-byte vector paths, N = 300 spans several
 * 64-row chunks of bias_grad with a short last one, embedding_bwd's rows repeated from once to
 * hundreds of times (buckets longer than its 8-row load batches, with short tails), flat ops also
 * run one element past an aligned address (the VEC = 1 kernels).
 *
 * Tolerance: none, but for gather_rows with weights and gather_dot (their cases state and derive
 * theirs: the op's contract leaves FMA contraction and gather_dot's summation order free, and
 * check_tol compares with a per-element tolerance, failing on NaN/Inf). Every other kernel
 * computes, per output element, the same fp32 (or, for sumsq, double) operations as the CPU
 * reference in the same order, so the results must be bit-identical, and check() compares bytes
 * (after cuda_test_close with a zero tolerance, which fails on NaN/Inf and reports the worst
 * element):
 *   - element-wise (bias_add, bias_init, posemb_fwd, scale, cast): one fp32 operation per
 *     element, correctly rounded on both sides (IEEE add and multiply) — there is no freedom;
 *   - axpy: dst + alpha·src with a single rounding, the kernel's explicit fmaf; the CPU build
 *     (gnu11, -O3 -march=native: -ffp-contract=fast on an FMA machine) contracts the CPU's
 *     dst += alpha·src into the same FMA. (Built without FMA the CPU would round the product first:
 *     a difference of at most 2^-24·|alpha·src| + one ulp of the result; this test then fails,
 *     and says so, rather than hiding a tolerance.)
 *   - embedding_fwd: a copy (zeros outside the vocab slice);
 *   - sums (bias_grad, embedding_bwd, posemb_bwd): the kernels add the same terms in the CPU's
 *     order (rows in order inside 64-row chunks from the chunk's first row, chunk partials in
 *     chunk order; tokens in order per table row; the batch in order per position), so every
 *     partial sum is the same float;
 *   - adamw: the CPU's sequence of float operations with explicit fmaf, IEEE division and sqrt,
 *     the same host-side bias corrections; bf16 copy = the same fp32 value rounded to nearest even;
 *   - sumsq: double sums with the CPU's chunks (4096), 16 lanes and lane tree, chunk partials in
 *     order; squares of floats are exact in double, so FMA contraction cannot differ either.
 *   - gather_rows without weights: a row copy (one slot) or plain sums of rows in slot order.
 * bf16 mode: inputs are bf16, widened exactly on both sides, and each stored output is the same
 * fp32 value rounded to nearest even once, so bf16 outputs are bit-identical too; fp32 gradients
 * (dbias, dtable, dwpe) are sums of the same widened values.
 * Since every GPU result equals the CPU's bits in each order (within its tolerance, for the two
 * MoE ops), the three warp orders also agree.
 *
 * Planted while writing this test, each seen to fail in all three orders before trusting it: a
 * fill's last (scalar tail) element dropped; the last row of bias_add skipped; bias_init ignoring
 * its residual; bias_grad adding each chunk's first row twice, and dropping the last chunk's
 * partial; axpy rounding the product before the add (no FMA: a one-ulp difference in a few
 * elements); scale's tail dropped; bf16 stores rounding toward zero; embedding_fwd's slice bound
 * off by one (r <= rows) and its row_offset ignored; embedding_bwd summing its buckets in the
 * atomics' order instead of token order (caught in the descending and random orders), its rank
 * counting equal indices, its scan counting one row of each thread's run, and a batch's last row
 * loaded twice; posemb_fwd ignoring pos_offset; posemb_bwd dropping the last batch element; adamw's
 * segment-tail index off by one, the last segment of each 32-segment batch dropped, and the halves
 * of the bf16 copy swapped; sumsq's scalar tail short by one and its first chunk partial skipped;
 * gather_rows dropping slot 0's weight, reading slot j - 1's row for slot j, and not storing its
 * last output row; gather_dot accumulating in float (caught by the cancelling rows only: random
 * rows lose far less than the tolerance), its butterfly starting at 8 lanes, and a row's last
 * column dropped.
 * (gather_rows rounding each product before its add, instead of fmaf, passes, as it should: that
 * is the freedom the tolerance is for; it used 21% of it.)
 *
 * Run all:     ./test_cuda_elementwise
 * Run by name: ./test_cuda_elementwise test_adamw   (a cmocka filter; wildcards allowed)
 * CUDA_TEST_VERBOSE=1 prints each check.
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

/* ---- inputs (random values: cuda_test_util.h) ------------------------------------------------ */

/* n random values in [lo, hi) as dtype dt (malloc'd). */
static void *rvec(ct_dtype dt, int64_t n, float lo, float hi) {
    float *f = cuda_test_fvec(n, lo, hi);
    void *p = cuda_test_pack(dt, f, n);
    free(f);
    return p;
}

/* ---- buffers on both backends (pbuf: cuda_test_util.h) ----------------------------------------
 */

/* Element `off` of side s of b, for elements of `es` bytes. */
static void *at(const pbuf *b, int s, int64_t off, size_t es) {
    return (char *)b->p[s] + (size_t)off * es;
}

/* The whole of b must be bit-identical on both sides. dt F32 or BF16 also runs cuda_test_close
 * with a zero tolerance over the buffer (NaN/Inf fail, the worst element is printed); other
 * dtypes are compared as bytes only. */
static bool check(const char *what, const pbuf *b, ct_dtype dt) {
    void *want = cuda_test_download(P.cpu, b->p[0], b->bytes);
    void *got = cuda_test_download(P.gpu, b->p[1], b->bytes);
    char label[256];
    cuda_test_label(label, sizeof label, what);
    bool ok = true;
    if (dt == F32 || dt == BF16)
        ok = cuda_test_close(label, got, want, dt, (int64_t)(b->bytes / cuda_test_dsize(dt)), 0.0,
                             0.0);
    if (memcmp(got, want, b->bytes) != 0) {
        size_t i = 0;
        while (((const uint8_t *)got)[i] == ((const uint8_t *)want)[i]) i++;
        fprintf(stderr, "%s: not bit-identical to the CPU (first difference at byte %zu of %zu)\n",
                label, i, b->bytes);
        ok = false;
    } else if (getenv("CUDA_TEST_VERBOSE")) {
        fprintf(stderr, "%s: bit-identical (%zu bytes)\n", label, b->bytes);
    }
    free(want);
    free(got);
    return ok;
}

/* Each test runs its cases in every warp order (FOR_EACH_ORDER, cuda_test_util.h). */
static const ct_dtype dtypes[2] = {F32, BF16};

/* ---- fill ------------------------------------------------------------------------------------ */

/* n elements from element `off` of a buffer of n + 2 (the others must keep their bytes). */
static bool fill_case(ct_dtype dt, int64_t n, int64_t off, float value) {
    cuda_test_seed(1, (uint64_t)n, (uint64_t)dt);
    const size_t es = cuda_test_dsize(dt), bytes = (size_t)(n + 2) * es;
    uint8_t *h = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        h[i] = (uint8_t)(cuda_test_rng_next() & 0x3f); /* no NaN patterns */
    pbuf b = pb_new(h, bytes);
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->fill(side_be(s)->ctx, at(&b, s, off, es), dt, n, value);
    char what[128];
    snprintf(what, sizeof what, "fill %s n=%lld off=%lld value=%g", ct_dtype_name(dt), (long long)n,
             (long long)off, value);
    bool ok = check(what, &b, dt);
    pb_free(&b);
    free(h);
    return ok;
}

static void test_fill(void **state) {
    (void)state;
    const ct_dtype all[] = {F32, BF16, CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8, CT_DTYPE_F64};
    /* 3.14159 is not a bf16 value (rounding checked); -2.75 truncates to -2 (and 254 as u8) */
    const float values[] = {3.14159f, -2.75f, 0.0f};
    FOR_EACH_ORDER({
        for (int d = 0; d < 6; d++)
            for (int v = 0; v < 3; v++) {
                all_ok &= fill_case(all[d], 13, 0, values[v]);
                all_ok &= fill_case(all[d], 1027, 1, values[v]);
                all_ok &= fill_case(all[d], 1027, 0, values[v]);
            }
    });
}

/* ---- bias_add, bias_init --------------------------------------------------------------------- */

enum { BIAS_ADD, BIAS_INIT, BIAS_INIT_RESIDUAL };

static bool bias_case(ct_dtype dt, int mode, int64_t N, int64_t C) {
    cuda_test_seed(2, (uint64_t)(N * 1000 + C), (uint64_t)(mode * 2 + dt));
    const size_t es = cuda_test_dsize(dt);
    void *hb = rvec(dt, C, -1.0f, 1.0f), *hr = rvec(dt, N * C, -3.0f, 3.0f);
    void *ho = rvec(dt, N * C, -3.0f, 3.0f);
    pbuf bias = pb_new(hb, (size_t)C * es), res = pb_new(hr, (size_t)(N * C) * es),
         out = pb_new(ho, (size_t)(N * C) * es);
    for (int s = 0; s < 2; s++) {
        ct_backend *be = side_be(s);
        if (mode == BIAS_ADD)
            be->iface->bias_add(be->ctx, dt, out.p[s], bias.p[s], N, C);
        else
            be->iface->bias_init(be->ctx, dt, out.p[s], bias.p[s],
                                 mode == BIAS_INIT_RESIDUAL ? res.p[s] : NULL, N, C);
    }
    static const char *names[] = {"bias_add", "bias_init", "bias_init+residual"};
    char what[128];
    snprintf(what, sizeof what, "%s %s N=%lld C=%lld", names[mode], ct_dtype_name(dt), (long long)N,
             (long long)C);
    bool ok = check(what, &out, dt);
    pb_free(&bias), pb_free(&res), pb_free(&out);
    free(hb), free(hr), free(ho);
    return ok;
}

static void test_bias(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int d = 0; d < 2; d++)
            for (int mode = 0; mode < 3; mode++) {
                all_ok &= bias_case(dtypes[d], mode, 13, 67);
                all_ok &= bias_case(dtypes[d], mode, 64, 256);
                all_ok &= bias_case(dtypes[d], mode, 5, 8); /* one vector per row in bf16 */
            }
    });
}

/* ---- bias_grad ------------------------------------------------------------------------------- */

static bool bias_grad_case(ct_dtype dt, int64_t N, int64_t C) {
    cuda_test_seed(3, (uint64_t)N, (uint64_t)(C * 2 + dt));
    void *hd = rvec(dt, N * C, -1.0f, 1.0f);
    float *db0 = cuda_test_fvec(C, -2.0f, 2.0f); /* the starting value it accumulates into */
    pbuf dout = pb_new(hd, (size_t)(N * C) * cuda_test_dsize(dt)), db = pb_new(db0, (size_t)C * 4);
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->bias_grad(side_be(s)->ctx, dt, db.p[s], dout.p[s], N, C);
    char what[128];
    snprintf(what, sizeof what, "bias_grad %s N=%lld C=%lld dbias", ct_dtype_name(dt), (long long)N,
             (long long)C);
    bool ok = check(what, &db, F32);
    pb_free(&dout), pb_free(&db);
    free(hd), free(db0);
    return ok;
}

static void test_bias_grad(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int d = 0; d < 2; d++) {
            all_ok &= bias_grad_case(dtypes[d], 13, 67);   /* one chunk: straight into dbias */
            all_ok &= bias_grad_case(dtypes[d], 64, 256);  /* exactly one full chunk */
            all_ok &= bias_grad_case(dtypes[d], 300, 67);  /* 5 chunks, the last of 44 rows */
            all_ok &= bias_grad_case(dtypes[d], 300, 256); /* the same, vector path */
            all_ok &= bias_grad_case(dtypes[d], 1300, 20); /* 21 chunks: partials in batches */
            /* 517 chunks: partials staged 256 rows at a time (two whole stages and a row), 70
             * columns over three blocks of 32, the last one short */
            all_ok &= bias_grad_case(dtypes[d], 516 * 64 + 7, 70);
        }
    });
}

/* ---- axpy, scale ----------------------------------------------------------------------------- */

/* n elements from element `off` of buffers of n + 1. */
static bool axpy_case(ct_dtype dt, int64_t n, int64_t off, float alpha) {
    cuda_test_seed(4, (uint64_t)n, (uint64_t)(off * 2 + dt));
    const size_t es = cuda_test_dsize(dt);
    void *hd = rvec(dt, n + 1, -2.0f, 2.0f), *hs = rvec(dt, n + 1, -2.0f, 2.0f);
    pbuf dst = pb_new(hd, (size_t)(n + 1) * es), src = pb_new(hs, (size_t)(n + 1) * es);
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->axpy(side_be(s)->ctx, dt, at(&dst, s, off, es), at(&src, s, off, es),
                                alpha, n);
    char what[128];
    snprintf(what, sizeof what, "axpy %s n=%lld off=%lld alpha=%g", ct_dtype_name(dt), (long long)n,
             (long long)off, alpha);
    bool ok = check(what, &dst, dt);
    pb_free(&dst), pb_free(&src);
    free(hd), free(hs);
    return ok;
}

static bool scale_case(ct_dtype dt, int64_t n, int64_t off, float sc) {
    cuda_test_seed(5, (uint64_t)n, (uint64_t)(off * 2 + dt));
    const size_t es = cuda_test_dsize(dt);
    void *hx = rvec(dt, n + 1, -2.0f, 2.0f);
    pbuf x = pb_new(hx, (size_t)(n + 1) * es);
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->scale(side_be(s)->ctx, dt, at(&x, s, off, es), sc, n);
    char what[128];
    snprintf(what, sizeof what, "scale %s n=%lld off=%lld s=%g", ct_dtype_name(dt), (long long)n,
             (long long)off, sc);
    bool ok = check(what, &x, dt);
    pb_free(&x);
    free(hx);
    return ok;
}

static void test_axpy_scale(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int d = 0; d < 2; d++)
            for (int off = 0; off < 2; off++) {
                all_ok &= axpy_case(dtypes[d], 13, off, -0.37f);
                all_ok &= axpy_case(dtypes[d], 4099, off, 1.3f);
                all_ok &= scale_case(dtypes[d], 13, off, 0.7f);
                all_ok &= scale_case(dtypes[d], 4099, off, -1.9f);
            }
    });
}

/* ---- cast ------------------------------------------------------------------------------------ */

static bool cast_case(ct_dtype dst_dt, ct_dtype src_dt, int64_t n, int64_t off) {
    cuda_test_seed(6, (uint64_t)n, (uint64_t)(off * 16 + dst_dt * 4 + src_dt));
    float *f = cuda_test_fvec(n + 1, -3.0f, 3.0f);
    /* ties of f32 -> bf16 (round to even: down, then up) and values near them */
    const float ties[] = {1.00390625f, 1.01171875f, -1.00390625f, 1.0039063f, 1.0039062f};
    for (int k = 0; k < 5 && k < n; k++) f[1 + k] = ties[k];
    void *hs = cuda_test_pack(src_dt, f, n + 1), *hd = rvec(dst_dt, n + 1, -1.0f, 1.0f);
    pbuf src = pb_new(hs, (size_t)(n + 1) * cuda_test_dsize(src_dt)),
         dst = pb_new(hd, (size_t)(n + 1) * cuda_test_dsize(dst_dt));
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->cast(side_be(s)->ctx, at(&dst, s, off, cuda_test_dsize(dst_dt)), dst_dt,
                                at(&src, s, off, cuda_test_dsize(src_dt)), src_dt, n);
    char what[128];
    snprintf(what, sizeof what, "cast %s -> %s n=%lld off=%lld", ct_dtype_name(src_dt),
             ct_dtype_name(dst_dt), (long long)n, (long long)off);
    bool ok = check(what, &dst, dst_dt);
    pb_free(&src), pb_free(&dst);
    free(f), free(hs), free(hd);
    return ok;
}

static void test_cast(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++)
                for (int off = 0; off < 2; off++) {
                    all_ok &= cast_case(dtypes[a], dtypes[b], 13, off);
                    all_ok &= cast_case(dtypes[a], dtypes[b], 1027, off);
                }
    });
}

/* ---- embeddings ------------------------------------------------------------------------------ */

/* N tokens in [0, vocab) and a few outside any table (-1, vocab + 3): with row_offset > 0 some
 * fall below the slice, some above it. */
static int32_t *tokens_new(int64_t N, int vocab) {
    int32_t *t = malloc((size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++) t[i] = (int32_t)(cuda_test_rng_next() % (uint64_t)vocab);
    if (N > 3) t[1] = -1, t[N - 2] = vocab + 3;
    return t;
}

static bool emb_fwd_case(ct_dtype dt, int64_t N, int64_t C, int64_t rows, int64_t row_offset,
                         int vocab) {
    cuda_test_seed(7, (uint64_t)(N * 1000 + C), (uint64_t)(row_offset * 2 + dt));
    const size_t es = cuda_test_dsize(dt);
    int32_t *tok = tokens_new(N, vocab);
    void *ht = rvec(dt, rows * C, -1.0f, 1.0f), *ho = rvec(dt, N * C, -5.0f, 5.0f);
    pbuf tokens = pb_new(tok, (size_t)N * 4), table = pb_new(ht, (size_t)(rows * C) * es),
         out = pb_new(ho, (size_t)(N * C) * es);
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->embedding_fwd(side_be(s)->ctx, dt, out.p[s], tokens.p[s], table.p[s], N,
                                         C, rows, row_offset);
    char what[160];
    snprintf(what, sizeof what, "embedding_fwd %s N=%lld C=%lld rows=%lld row_offset=%lld",
             ct_dtype_name(dt), (long long)N, (long long)C, (long long)rows, (long long)row_offset);
    bool ok = check(what, &out, dt);
    pb_free(&tokens), pb_free(&table), pb_free(&out);
    free(tok), free(ht), free(ho);
    return ok;
}

static bool emb_bwd_case(ct_dtype dt, int64_t N, int64_t C, int64_t rows, int64_t row_offset,
                         int vocab) {
    cuda_test_seed(8, (uint64_t)(N * 1000 + C), (uint64_t)(row_offset * 2 + dt));
    int32_t *tok = tokens_new(N, vocab);
    void *hd = rvec(dt, N * C, -1.0f, 1.0f);
    float *dt0 = cuda_test_fvec(rows * C, -2.0f, 2.0f); /* the starting value it accumulates into */
    pbuf tokens = pb_new(tok, (size_t)N * 4),
         dout = pb_new(hd, (size_t)(N * C) * cuda_test_dsize(dt)),
         dtable = pb_new(dt0, (size_t)(rows * C) * 4);
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->embedding_bwd(side_be(s)->ctx, dt, dtable.p[s], dout.p[s], tokens.p[s],
                                         N, C, rows, row_offset);
    char what[160];
    snprintf(what, sizeof what, "embedding_bwd %s N=%lld C=%lld rows=%lld row_offset=%lld dtable",
             ct_dtype_name(dt), (long long)N, (long long)C, (long long)rows, (long long)row_offset);
    bool ok = check(what, &dtable, F32);
    pb_free(&tokens), pb_free(&dout), pb_free(&dtable);
    free(tok), free(hd), free(dt0);
    return ok;
}

static void test_embedding(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int d = 0; d < 2; d++) {
            /* a whole table, and a vocab shard [5, 21) of ids [0, 24) */
            all_ok &= emb_fwd_case(dtypes[d], 13, 67, 24, 0, 24);
            all_ok &= emb_fwd_case(dtypes[d], 13, 67, 16, 5, 24);
            all_ok &= emb_fwd_case(dtypes[d], 64, 256, 16, 5, 24);
            /* few ids, so rows repeat many times */
            all_ok &= emb_bwd_case(dtypes[d], 13, 67, 24, 0, 24);
            all_ok &= emb_bwd_case(dtypes[d], 13, 67, 16, 5, 24);
            all_ok &= emb_bwd_case(dtypes[d], 64, 256, 16, 5, 24);
            all_ok &= emb_bwd_case(dtypes[d], 300, 67, 7, 3, 12);
            all_ok &= emb_bwd_case(dtypes[d], 300, 256, 40, 2, 50);
            /* three ids over 1100 tokens, one of them outside the slice: buckets of ~370 */
            all_ok &= emb_bwd_case(dtypes[d], 1100, 12, 2, 1, 3);
            /* more rows than emb_scan_kernel's 1024 threads: runs of 3 rows a thread */
            all_ok &= emb_bwd_case(dtypes[d], 700, 8, 2500, 50, 2600);
        }
    });
}

static bool posemb_fwd_case(ct_dtype dt, int64_t B, int64_t T, int64_t C, int64_t pos_offset) {
    cuda_test_seed(9, (uint64_t)(B * 100 + T), (uint64_t)(C * 2 + dt));
    const size_t es = cuda_test_dsize(dt);
    const int64_t max_t = pos_offset + T + 3;
    void *hw = rvec(dt, max_t * C, -1.0f, 1.0f), *ho = rvec(dt, B * T * C, -3.0f, 3.0f);
    pbuf wpe = pb_new(hw, (size_t)(max_t * C) * es), out = pb_new(ho, (size_t)(B * T * C) * es);
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->posemb_fwd(side_be(s)->ctx, dt, out.p[s], wpe.p[s], B, T, C, pos_offset);
    char what[160];
    snprintf(what, sizeof what, "posemb_fwd %s B=%lld T=%lld C=%lld pos_offset=%lld",
             ct_dtype_name(dt), (long long)B, (long long)T, (long long)C, (long long)pos_offset);
    bool ok = check(what, &out, dt);
    pb_free(&wpe), pb_free(&out);
    free(hw), free(ho);
    return ok;
}

/* dwpe has rows outside [pos_offset, pos_offset + T), which must keep their values. */
static bool posemb_bwd_case(ct_dtype dt, int64_t B, int64_t T, int64_t C, int64_t pos_offset) {
    cuda_test_seed(10, (uint64_t)(B * 100 + T), (uint64_t)(C * 2 + dt));
    const int64_t max_t = pos_offset + T + 3;
    void *hd = rvec(dt, B * T * C, -1.0f, 1.0f);
    float *w0 = cuda_test_fvec(max_t * C, -2.0f, 2.0f);
    pbuf dout = pb_new(hd, (size_t)(B * T * C) * cuda_test_dsize(dt)),
         dwpe = pb_new(w0, (size_t)(max_t * C) * 4);
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->posemb_bwd(side_be(s)->ctx, dt, dwpe.p[s], dout.p[s], B, T, C,
                                      pos_offset);
    char what[160];
    snprintf(what, sizeof what, "posemb_bwd %s B=%lld T=%lld C=%lld pos_offset=%lld dwpe",
             ct_dtype_name(dt), (long long)B, (long long)T, (long long)C, (long long)pos_offset);
    bool ok = check(what, &dwpe, F32);
    pb_free(&dout), pb_free(&dwpe);
    free(hd), free(w0);
    return ok;
}

static void test_posemb(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int d = 0; d < 2; d++) {
            all_ok &= posemb_fwd_case(dtypes[d], 1, 13, 67, 0);
            all_ok &= posemb_fwd_case(dtypes[d], 3, 13, 67, 2);
            all_ok &= posemb_fwd_case(dtypes[d], 4, 16, 256, 5);
            all_ok &= posemb_bwd_case(dtypes[d], 1, 13, 67, 0);
            all_ok &= posemb_bwd_case(dtypes[d], 3, 13, 67, 2);
            all_ok &= posemb_bwd_case(dtypes[d], 4, 16, 256, 5);
        }
    });
}

/* ---- adamw ----------------------------------------------------------------------------------- */

/* n_seg segments of random lengths (one empty) with gaps between them, inside n elements from
 * element `off` of buffers of n + 1; elements outside every segment must not change. copy_dt:
 * F32, BF16, or -1 for no param_copy. */
static bool adamw_case(int copy_dt, int64_t n, int n_seg, int64_t off) {
    cuda_test_seed(11, (uint64_t)(n * 100 + n_seg), (uint64_t)(off * 4 + copy_dt + 1));
    ct_adamw_segment *seg = calloc((size_t)n_seg, sizeof *seg);
    int64_t at_el = 0;
    int used = 0;
    for (int s = 0; s < n_seg; s++) {
        const uint64_t max_cnt = n < 200 ? 4 : 97;
        int64_t gap = (int64_t)(cuda_test_rng_next() % 5);
        int64_t cnt = s == 3 ? 0 : 1 + (int64_t)(cuda_test_rng_next() % max_cnt);
        if (at_el + gap + cnt > n) break;
        seg[used++] = (ct_adamw_segment){at_el + gap, cnt, s % 3 == 0 ? 0.0f : 0.1f};
        at_el += gap + cnt;
    }
    float *p = cuda_test_fvec(n + 1, -1.0f, 1.0f), *g = cuda_test_fvec(n + 1, -0.5f, 0.5f);
    float *m = cuda_test_fvec(n + 1, -0.1f, 0.1f), *v = cuda_test_fvec(n + 1, 0.0f, 0.01f);
    const ct_dtype cdt = copy_dt < 0 ? F32 : (ct_dtype)copy_dt;
    void *hc = rvec(cdt, n + 1, -1.0f, 1.0f);
    pbuf pp = pb_new(p, (size_t)(n + 1) * 4), pg = pb_new(g, (size_t)(n + 1) * 4),
         pm = pb_new(m, (size_t)(n + 1) * 4), pv = pb_new(v, (size_t)(n + 1) * 4),
         pc = pb_new(hc, (size_t)(n + 1) * cuda_test_dsize(cdt));
    ct_adamw_hparams hp = {
        .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 7, .grad_scale = 0.7f};
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->adamw(side_be(s)->ctx, at(&pp, s, off, 4), at(&pg, s, off, 4),
                                 at(&pm, s, off, 4), at(&pv, s, off, 4), seg, used, &hp,
                                 copy_dt < 0 ? NULL : at(&pc, s, off, cuda_test_dsize(cdt)), cdt);
    char what[4][160];
    const char *names[4] = {"param", "m", "v", "param_copy"};
    for (int k = 0; k < 4; k++)
        snprintf(what[k], sizeof what[k], "adamw n=%lld segments=%d off=%lld copy=%s %s",
                 (long long)n, used, (long long)off, copy_dt < 0 ? "none" : ct_dtype_name(cdt),
                 names[k]);
    bool ok = check(what[0], &pp, F32);
    ok &= check(what[1], &pm, F32);
    ok &= check(what[2], &pv, F32);
    ok &= check(what[3], &pc, cdt);
    pbuf *bufs[] = {&pp, &pg, &pm, &pv, &pc};
    for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++) pb_free(bufs[k]);
    free(seg), free(p), free(g), free(m), free(v), free(hc);
    return ok;
}

static void test_adamw(void **state) {
    (void)state;
    const int copies[3] = {-1, F32, BF16};
    FOR_EACH_ORDER({
        for (int c = 0; c < 3; c++)
            for (int off = 0; off < 2; off++) {
                all_ok &= adamw_case(copies[c], 13, 2, off);
                /* 40 segments: two launches of the kernel's 32-segment batches */
                all_ok &= adamw_case(copies[c], 4000, 40, off);
            }
    });
}

/* ---- sumsq ----------------------------------------------------------------------------------- */

/* out[1] = Σ x² over n elements from element `off`; out[0] and out[2] must keep their values. */
static bool sumsq_case(int64_t n, int64_t off) {
    cuda_test_seed(12, (uint64_t)n, (uint64_t)off);
    float *x = cuda_test_fvec(n + 1, -2.0f, 2.0f);
    float o0[3] = {7.0f, 7.0f, 7.0f};
    pbuf px = pb_new(x, (size_t)(n + 1) * 4), out = pb_new(o0, sizeof o0);
    for (int s = 0; s < 2; s++) {
        const float *xs = at(&px, s, off, 4);
        side_be(s)->iface->sumsq(side_be(s)->ctx, at(&out, s, 1, 4), &xs, &n, 1);
    }
    char what[96];
    snprintf(what, sizeof what, "sumsq n=%lld off=%lld", (long long)n, (long long)off);
    bool ok = check(what, &out, F32);
    pb_free(&px), pb_free(&out);
    free(x);
    return ok;
}

/* Many ranges in one call: out[1 + i] = Σ x_i² for N_RANGES ranges of one buffer (lengths from 0
 * to a few chunks, starts aligned and not), more than one launch batch (64) of the kernel;
 * out[0] and out[N_RANGES + 1] must keep their values. */
static bool sumsq_multi_case(void) {
    enum { N_RANGES = 70 };
    int64_t start[N_RANGES], len[N_RANGES], total = 0;
    for (int i = 0; i < N_RANGES; i++) {
        start[i] = total + i % 3; /* every third range 16-byte aligned at most */
        len[i] = i % 7 == 0 ? 0 : i % 5 == 0 ? 2 * 4096 + 17 * i : 13 * i + 5;
        total = start[i] + len[i];
    }
    cuda_test_seed(13, (uint64_t)total, N_RANGES);
    float *x = cuda_test_fvec(total + 1, -2.0f, 2.0f);
    float o0[N_RANGES + 2];
    for (int i = 0; i < N_RANGES + 2; i++) o0[i] = 7.0f;
    pbuf px = pb_new(x, (size_t)(total + 1) * 4), out = pb_new(o0, sizeof o0);
    for (int s = 0; s < 2; s++) {
        const float *xs[N_RANGES];
        for (int i = 0; i < N_RANGES; i++) xs[i] = at(&px, s, start[i], 4);
        side_be(s)->iface->sumsq(side_be(s)->ctx, at(&out, s, 1, 4), xs, len, N_RANGES);
    }
    bool ok = check("sumsq of 70 ranges in one call", &out, F32);
    pb_free(&px), pb_free(&out);
    free(x);
    return ok;
}

static void test_sumsq(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int off = 0; off < 2; off++) {
            all_ok &= sumsq_case(0, off);
            all_ok &= sumsq_case(13, off);
            all_ok &= sumsq_case(4096, off);
            all_ok &= sumsq_case(3 * 4096 + 123, off); /* 4 chunks, a short last one */
            /* 18 chunks: the unrolled loads of both kernels, and a last chunk (1000) that
             * ends inside an unrolled round */
            all_ok &= sumsq_case(17 * 4096 + 1000, off);
        }
        /* 2050 chunks: the totals kernel stages 2048 partials at a time, so a second, short
         * stage */
        all_ok &= sumsq_case(2049 * 4096 + 5, 0);
        all_ok &= sumsq_multi_case();
    });
}

/* ---- gather_rows, gather_dot (Mixture of Experts' row movements) ----------------------------- */

/* One bf16 ulp at magnitude m (8 significant bits: 2^(e - 7) for m in [2^e, 2^(e+1))). */
static double bf16_ulp(double m) {
    return m > 0.0 ? ldexp(1.0, ilogb(m) - 7) : 0.0;
}

/* Element i of b (dt F32 or BF16) must agree on both sides within tol[i]: tol[i] == 0 asks for
 * the same bits, tol[i] > 0 for |got − want| <= tol[i] (+ one bf16 ulp of the larger of the two
 * when bf16_ulp_too). NaN or Inf on either side fails. Prints the worst element; with
 * CUDA_TEST_VERBOSE=1 the fraction of the tolerance used. */
static bool check_tol(const char *what, const pbuf *b, ct_dtype dt, const double *tol,
                      bool bf16_ulp_too) {
    void *want = cuda_test_download(P.cpu, b->p[0], b->bytes);
    void *got = cuda_test_download(P.gpu, b->p[1], b->bytes);
    const size_t es = cuda_test_dsize(dt);
    const int64_t n = (int64_t)(b->bytes / es);
    int64_t bad = 0, worst = -1;
    double worst_ratio = 0.0, worst_tol = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double g = cuda_test_get(got, dt, i), w = cuda_test_get(want, dt, i);
        double allowed = tol[i], ratio;
        if (allowed > 0.0 && bf16_ulp_too) allowed += bf16_ulp(fmax(fabs(g), fabs(w)));
        if (!isfinite(g) || !isfinite(w))
            ratio = INFINITY;
        else if (allowed == 0.0)
            ratio = memcmp((const char *)got + i * es, (const char *)want + i * es, es) ? INFINITY
                                                                                        : 0.0;
        else
            ratio = fabs(g - w) / allowed;
        if (!(ratio <= 1.0)) bad++;
        if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i, worst_tol = allowed;
    }
    char label[256];
    cuda_test_label(label, sizeof label, what);
    if (bad) {
        const double g = cuda_test_get(got, dt, worst), w = cuda_test_get(want, dt, worst);
        fprintf(stderr,
                "%s: %lld of %lld elements differ; worst [%lld] got %.9g want %.9g (|diff| %.3g, "
                "tolerance %.3g%s)\n",
                label, (long long)bad, (long long)n, (long long)worst, g, w, fabs(g - w), worst_tol,
                worst_tol == 0.0 ? ": the same bits wanted" : "");
    } else if (getenv("CUDA_TEST_VERBOSE")) {
        fprintf(stderr, "%s: ok, %.0f%% of the tolerance used\n", label, 100.0 * worst_ratio);
    }
    free(want);
    free(got);
    return bad == 0;
}

/* N·slots indices into in_rows (odd) rows: even rows only, so every odd row is unused and, with
 * N·slots > in_rows / 2, rows repeat; the first two entries name the same row (inside one output
 * row when slots >= 2, across rows 0 and 1 otherwise) and the last names the last row. */
static int32_t *gather_idx_new(int64_t n, int64_t in_rows) {
    int32_t *ix = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    const uint64_t even = (uint64_t)(in_rows + 1) / 2;
    for (int64_t i = 0; i < n; i++) ix[i] = (int32_t)(2 * (cuda_test_rng_next() % even));
    if (n >= 2) ix[1] = ix[0];
    if (n >= 1) ix[n - 1] = (int32_t)(in_rows - 1);
    return ix;
}

/*
 * out (N, C) from element `off` of a buffer of N·C + 3 (the elements around it must keep their
 * bytes). Tolerance, per element of out:
 *   - no weights: the same bits. Slot 0 is 1·r0 = r0 and each further slot one IEEE add of the
 *     next row, in slot order, on both sides (the kernel's fmaf(1, r, o) is o + r rounded once);
 *     one slot is a row copy (bf16: widened and rounded back, exact).
 *   - weights: both sides compute w0·r0, then o + wj·rj in slot order in fp32; the CPU build may
 *     contract the multiply-add into an FMA or round the product first, the kernel uses fmaf. Each
 *     of the k products and k - 1 adds rounds with a relative error of at most 2^-24 on either
 *     side, every partial sum bounded by Σ|w·r|, so the two results differ by at most about
 *     2k·2^-24·Σ|w·r|: allowed (2(k+1) + 4)·2^-24·Σ_j |w_j·r_j| (the margin a few ulps), plus
 *     one bf16 ulp for bf16 outputs (two fp32 values that close may round to neighbouring bf16).
 * On this build both sides use one FMA a term in the same order, so they agree to the bit; the
 * tolerance is what the contract allows.
 */
static bool gather_rows_case(ct_dtype dt, int64_t N, int64_t slots, int64_t C, int64_t in_rows,
                             bool weighted, int64_t off) {
    cuda_test_seed(14, (uint64_t)(N * 1000 + C),
                   (uint64_t)((slots * 4 + off * 2 + weighted) * 2 + dt));
    const size_t es = cuda_test_dsize(dt);
    const int64_t n_out = N * C + 3, n_idx = N * slots;
    float *fin = cuda_test_fvec(in_rows * C, -2.0f, 2.0f);
    void *hin = cuda_test_pack(dt, fin, in_rows * C); /* fin now holds the stored values */
    void *hout = rvec(dt, n_out, -5.0f, 5.0f);
    int32_t *ix = gather_idx_new(n_idx, in_rows);
    float *w = cuda_test_fvec(n_idx, -1.5f, 1.5f);
    pbuf in = pb_new(hin, (size_t)(in_rows * C) * es), out = pb_new(hout, (size_t)n_out * es),
         idx = pb_new(ix, (size_t)(n_idx ? n_idx : 1) * 4),
         pw = pb_new(w, (size_t)(n_idx ? n_idx : 1) * 4);
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->gather_rows(side_be(s)->ctx, dt, at(&out, s, off, es), in.p[s], idx.p[s],
                                       weighted ? pw.p[s] : NULL, N, slots, C, in_rows);
    double *tol = calloc((size_t)n_out, sizeof(double));
    const double rel = (2.0 * (double)(slots + 1) + 4.0) * ldexp(1.0, -24);
    for (int64_t i = 0; weighted && i < N; i++)
        for (int64_t c = 0; c < C; c++) {
            double mag = 0.0;
            for (int64_t j = 0; j < slots; j++)
                mag += fabs((double)w[i * slots + j] * fin[(int64_t)ix[i * slots + j] * C + c]);
            tol[off + i * C + c] = rel * mag;
        }
    char what[160];
    snprintf(what, sizeof what,
             "gather_rows %s N=%lld slots=%lld C=%lld in_rows=%lld w=%s off=%lld",
             ct_dtype_name(dt), (long long)N, (long long)slots, (long long)C, (long long)in_rows,
             weighted ? "yes" : "NULL", (long long)off);
    bool ok = check_tol(what, &out, dt, tol, dt == BF16);
    pb_free(&in), pb_free(&out), pb_free(&idx), pb_free(&pw);
    free(fin), free(hin), free(hout), free(ix), free(w), free(tol);
    return ok;
}

static void test_gather_rows(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int d = 0; d < 2; d++) {
            const ct_dtype dt = dtypes[d];
            /* one slot, no weights: a row gather, exact (scalar path, vector path, and the
             * vector width with out one element off its alignment) */
            all_ok &= gather_rows_case(dt, 13, 1, 67, 21, false, 0);
            all_ok &= gather_rows_case(dt, 16, 1, 256, 21, false, 0);
            all_ok &= gather_rows_case(dt, 16, 1, 256, 21, false, 1);
            /* three weighted slots (C = 67: neither the warp, the block nor a vector; C = 300:
             * more columns than a block's 256 threads in bf16) */
            all_ok &= gather_rows_case(dt, 13, 3, 67, 21, true, 0);
            all_ok &= gather_rows_case(dt, 16, 3, 256, 21, true, 0);
            all_ok &= gather_rows_case(dt, 5, 3, 300, 9, true, 1);
            /* two slots without weights: plain sums */
            all_ok &= gather_rows_case(dt, 13, 2, 67, 21, false, 0);
            all_ok &= gather_rows_case(dt, 16, 2, 256, 21, false, 0);
            /* no rows: nothing written */
            all_ok &= gather_rows_case(dt, 0, 2, 67, 21, true, 0);
            all_ok &= gather_rows_case(dt, 0, 1, 67, 21, false, 0);
        }
    });
}

/*
 * out[r] = Σ_c a[ia[r], c]·b[ib[r], c] for r < R, in out[1 .. R] of a buffer of R + 2 (out[0]
 * and out[R + 1] must keep their bytes). Tolerance 4·2^-24·Σ_c |a·b| per element: each product
 * of two floats is exact in double, and both sides sum them in double (the CPU in column order,
 * the kernel in lanes and a butterfly), so the two double sums differ by about C·2^-53·Σ|a·b|,
 * far below fp32's spacing; each is then rounded once to f32 (half an ulp, at most 2^-24·Σ|a·b|
 * each), so they differ by at most an ulp or so of Σ|a·b|: 4·2^-24 leaves a margin of two.
 * cancel: rows built so that a float accumulator cannot pass (see gather_dot_cancel_rows).
 */
static bool gather_dot_case(ct_dtype dt, int64_t R, int64_t C, int64_t a_rows, int64_t b_rows,
                            bool cancel) {
    cuda_test_seed(15, (uint64_t)(R * 1000 + C), (uint64_t)(cancel * 2 + dt));
    const size_t es = cuda_test_dsize(dt);
    float *fa = cuda_test_fvec(a_rows * C, -2.0f, 2.0f),
          *fb = cuda_test_fvec(b_rows * C, -2.0f, 2.0f);
    if (cancel) {
        /* every lane l of the kernel's warp takes columns l, l + 32, ...: in each row of a,
         * the lane's first column is 1, its last -1, the ones between 3·2^-26 (b all 1). The sum
         * is (C - 64)·3·2^-26; a float accumulator rounds 1 + 3·2^-26 back to 1 (under half an
         * ulp), loses every small term and returns 0, while Σ|a·b| ≈ 64 allows 256·2^-24 and
         * the lost terms are (C - 64)·0.75·2^-24 (912·2^-24 at C = 1280). */
        for (int64_t r = 0; r < a_rows; r++)
            for (int64_t c = 0; c < C; c++)
                fa[r * C + c] = c < 32 ? 1.0f : c >= C - 32 ? -1.0f : ldexpf(3.0f, -26);
        for (int64_t i = 0; i < b_rows * C; i++) fb[i] = 1.0f;
    }
    void *ha = cuda_test_pack(dt, fa, a_rows * C), *hb = cuda_test_pack(dt, fb, b_rows * C);
    int32_t *ia = malloc((size_t)(R ? R : 1) * 4), *ib = malloc((size_t)(R ? R : 1) * 4);
    for (int64_t r = 0; r < R; r++) {
        ia[r] = (int32_t)(cuda_test_rng_next() % (uint64_t)a_rows);
        ib[r] = (int32_t)(cuda_test_rng_next() % (uint64_t)b_rows);
    }
    if (R >= 2) ia[1] = ia[0], ib[1] = ib[0]; /* the same pair twice */
    float *o0 = cuda_test_fvec(R + 2, -5.0f, 5.0f);
    pbuf a = pb_new(ha, (size_t)(a_rows * C) * es), b = pb_new(hb, (size_t)(b_rows * C) * es),
         pia = pb_new(ia, (size_t)(R ? R : 1) * 4), pib = pb_new(ib, (size_t)(R ? R : 1) * 4),
         out = pb_new(o0, (size_t)(R + 2) * 4);
    for (int s = 0; s < 2; s++)
        side_be(s)->iface->gather_dot(side_be(s)->ctx, dt, at(&out, s, 1, 4), a.p[s], pia.p[s],
                                      b.p[s], pib.p[s], R, C, a_rows, b_rows);
    double *tol = calloc((size_t)(R + 2), sizeof(double));
    for (int64_t r = 0; r < R; r++) {
        double mag = 0.0;
        for (int64_t c = 0; c < C; c++)
            mag += fabs((double)fa[(int64_t)ia[r] * C + c] * fb[(int64_t)ib[r] * C + c]);
        tol[1 + r] = 4.0 * ldexp(1.0, -24) * mag;
    }
    char what[160];
    snprintf(what, sizeof what, "gather_dot %s R=%lld C=%lld a_rows=%lld b_rows=%lld%s",
             ct_dtype_name(dt), (long long)R, (long long)C, (long long)a_rows, (long long)b_rows,
             cancel ? " cancelling" : "");
    bool ok = check_tol(what, &out, F32, tol, false);
    pb_free(&a), pb_free(&b), pb_free(&pia), pb_free(&pib), pb_free(&out);
    free(fa), free(fb), free(ha), free(hb), free(ia), free(ib), free(o0), free(tol);
    return ok;
}

static void test_gather_dot(void **state) {
    (void)state;
    FOR_EACH_ORDER({
        for (int d = 0; d < 2; d++) {
            /* 37 rows over 5 blocks of 8 warps; 11 and 13 source rows, so pairs repeat. C = 67:
             * the lanes' tails only; C = 300: two rounds of 4 loads a lane, then a tail that
             * only lanes 0-11 reach twice */
            all_ok &= gather_dot_case(dtypes[d], 37, 67, 11, 13, false);
            all_ok &= gather_dot_case(dtypes[d], 37, 300, 11, 13, false);
            all_ok &= gather_dot_case(dtypes[d], 0, 67, 11, 13, false);
            all_ok &= gather_dot_case(dtypes[d], 5, 1280, 3, 2, true);
        }
    });
}

/* ---- the table ------------------------------------------------------------------------------ */

/* Every required op of core/backend/backend_ops.h has its slot (the registry asserts it too, but
 * these tests make the backend directly); the CUDA backend also fuses gemm_bias_gelu. */
static void test_table_complete(void **state) {
    (void)state;
    const char *missing = ct_backend_missing_op(P.gpu->iface);
    if (missing) fail_msg("the CUDA backend's table lacks '%s'", missing);
    assert_non_null(P.gpu->iface->gemm_bias_gelu);
}

/* ---- graphs (train.cuda_graph) --------------------------------------------------------------- */

/* A capture records the ops without running them; each launch runs them again on the memory as
 * it is then; a device free after the capture makes the launch refuse (an address in the graph
 * may dangle). The values are small multiples of 1/2, so every sum and product is exact. */
static void test_graph(void **state) {
    (void)state;
    ct_backend *be = P.gpu;
    assert_true(ct_backend_can_capture(be));
    assert_false(ct_backend_can_capture(P.cpu));
    enum { N = 37 };
    float hx[N], hy[N], out[N], want[N];
    for (int i = 0; i < N; i++) hx[i] = 0.5f * (float)i - 3.0f, hy[i] = 1.0f + (float)i;
    ct_tensor *x = ct_tensor_new_1d(be, CT_DTYPE_F32, N, CT_MEM_ACTS);
    ct_tensor *y = ct_tensor_new_1d(be, CT_DTYPE_F32, N, CT_MEM_ACTS);
    ct_tensor_from_host(x, hx);
    ct_tensor_from_host(y, hy);

    ct_backend_capture_begin(be);
    ct_axpy(y, x, 1.0f);
    ct_scale(y, 2.0f);
    int64_t ops = -1;
    ct_backend_graph *g = ct_backend_capture_end(be, &ops);
    assert_int_equal(ops, 2);
    ct_tensor_to_host(out, y);
    assert_memory_equal(out, hy, sizeof out); /* recorded, not run */

    for (int i = 0; i < N; i++) want[i] = 2.0f * (hy[i] + hx[i]);
    assert_true(ct_backend_graph_launch(be, g));
    ct_tensor_to_host(out, y);
    assert_memory_equal(out, want, sizeof out);

    for (int i = 0; i < N; i++) hx[i] = -0.5f * (float)i, want[i] = 2.0f * (want[i] + hx[i]);
    ct_tensor_from_host(x, hx); /* the next launch reads x as it is now */
    assert_true(ct_backend_graph_launch(be, g));
    ct_tensor_to_host(out, y);
    assert_memory_equal(out, want, sizeof out);

    ct_tensor_free(ct_tensor_new_1d(be, CT_DTYPE_F32, N, CT_MEM_ACTS));
    assert_false(ct_backend_graph_launch(be, g)); /* memory freed since the capture */
    ct_tensor_to_host(out, y);
    assert_memory_equal(out, want, sizeof out); /* and nothing ran */
    ct_backend_graph_free(be, g);
    ct_tensor_free(x);
    ct_tensor_free(y);
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_complete), cmocka_unit_test(test_fill),
        cmocka_unit_test(test_bias),           cmocka_unit_test(test_bias_grad),
        cmocka_unit_test(test_axpy_scale),     cmocka_unit_test(test_cast),
        cmocka_unit_test(test_embedding),      cmocka_unit_test(test_posemb),
        cmocka_unit_test(test_adamw),          cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_gather_rows),    cmocka_unit_test(test_gather_dot),
        cmocka_unit_test(test_graph),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, cuda_test_setup, cuda_test_teardown);
}
