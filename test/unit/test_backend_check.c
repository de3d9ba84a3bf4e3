/*
 * test_backend_check.c — check mode (core/backend/backend_check.c): a backend that reruns every op
 * on the CPU backend and stops the process at the first op whose result differs. Four properties:
 *
 *  1. No false alarms, no interference. A sequence that calls every op slot (every variant the
 *     model uses: transposed and accumulating GEMMs, GQA attention, vocab-parallel embedding and
 *     cross-entropy, GELU backward in place, AdamW with and without a parameter copy, two steps
 *     of ring attention with the strided casts that pack its blocks, ...) runs
 *     on the CPU backend and on the CPU backend in check mode, in f32 and bf16: check mode must
 *     not report, and every result must be the same bytes (it runs inner's slots on inner's
 *     memory and only reads it).
 *  2. It catches broken kernels: an inner backend whose table is the CPU backend's with one slot
 *     replaced by a broken version (an element off by 1e-3, an accumulating op that overwrites, a
 *     wrong AdamW step, a NaN, a kernel writing into its input, ...) runs the same sequence in a
 *     child process, which must exit with status 1 and name that op, the buffer and the element on
 *     stderr. A perturbation inside the tolerance (one ulp of an elementwise result, one bf16 ulp
 *     of a bf16 one) must pass, and one ulp in an exact op (a cast) must not.
 *  3. The registry: CT_CHECK_BACKEND=1 wraps "cpu-async" (the chosen text and describe say so)
 *     but not the plain "cpu".
 *
 * The backends run on one thread, as the suite's other op tests do.
 *
 * Run all:     ./test_backend_check
 * Run by name: ./test_backend_check test_broken_adamw     (a cmocka filter; wildcards allowed)
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
#include <sys/wait.h>
#include <unistd.h>

#include "core/backend/backend.h"

#include "test_util.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static ct_tensor *tensor_2d(ct_backend *be, ct_dtype dtype, int64_t rows, int64_t cols,
                            const float *host) {
    ct_tensor *t = ct_tensor_new_2d(be, dtype, rows, cols, CT_MEM_ACTS);
    assert_non_null(t);
    if (host) ct_tensor_from_host_f32(t, host);
    return t;
}

static ct_tensor *tensor_1d(ct_backend *be, ct_dtype dtype, int64_t n, const float *host) {
    return tensor_2d(be, dtype, 1, n, host);
}

static ct_tensor *tokens_1d(ct_backend *be, int64_t n, const int32_t *host) {
    ct_tensor *t = ct_tensor_new_1d(be, CT_DTYPE_I32, n, CT_MEM_ACTS);
    assert_non_null(t);
    ct_tensor_from_host(t, host);
    return t;
}

static float *rand_floats(uint64_t *rng, int64_t n, float lo, float hi) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = test_urand(rng, lo, hi);
    return x;
}

enum { MAX_RESULTS = 80, MAX_TENSORS = 128 };

/* What one run of the sequence leaves on the host: each kept tensor's bytes, by name. */
typedef struct run_results {
    int n;
    const char *name[MAX_RESULTS];
    void *bytes[MAX_RESULTS];
    size_t size[MAX_RESULTS];
} run_results;

static void keep(run_results *r, const char *name, const ct_tensor *t) {
    assert_true(r->n < MAX_RESULTS);
    size_t size = ct_tensor_bytes(t);
    r->name[r->n] = name;
    r->bytes[r->n] = malloc(size ? size : 1);
    r->size[r->n] = size;
    ct_tensor_to_host(r->bytes[r->n], t);
    r->n++;
}

static void results_release(run_results *r) {
    for (int i = 0; i < r->n; i++) free(r->bytes[i]);
    r->n = 0;
}

/* The tensors of one run, freed together at its end (views first). */
typedef struct pool {
    int n;
    ct_tensor *t[MAX_TENSORS];
} pool;

static ct_tensor *own(pool *p, ct_tensor *t) {
    assert_true(p->n < MAX_TENSORS);
    p->t[p->n++] = t;
    return t;
}

static void pool_release(pool *p) {
    for (int i = p->n; i-- > 0;)
        if (!p->t[i]->owns_data) ct_tensor_free(p->t[i]), p->t[i] = NULL;
    for (int i = 0; i < p->n; i++) ct_tensor_free(p->t[i]);
    p->n = 0;
}

/* ---- the sequence -----------------------------------------------------------------------------
 */

/*
 * A small GPT-2 block's worth of ops in precision `dt`, with inputs from a fixed seed, that calls
 * every op slot: forward (embedding, position at an offset, layernorm, QKV projection as bias_init
 * + accumulating GEMM, GQA attention, GELU, bias_add, the vocab projection, the three-step
 * cross-entropy with its gradient), the whole backward, a vocab-parallel shard (embedding rows and
 * logit columns at an offset, sumexp without keep_exp, finish without the gradient), GELU backward
 * in place, attention backward without dbias, AdamW with and without a parameter copy, squared
 * norms, casts both ways, axpy, scale, fills of three dtypes and a copy; then the ops of a Llama
 * block (test_llama_ops: RMSNorm, RoPE and its inverse, SwiGLU, forward and backward).
 */
static void run_sequence(ct_backend *be, ct_dtype dt, run_results *r) {
    enum { B = 2, T = 12, N = B * T, C = 32, NH = 4, NKV = 2, HD = C / NH };
    enum { CQKV = (NH + 2 * NKV) * HD, V = 40, V_VALID = 37, POS = 4, SHARD0 = 10, SHARD = 20 };
    uint64_t rng = 0xC4EC4ull + (uint64_t)dt;
    const ct_dtype other = dt == CT_DTYPE_F32 ? CT_DTYPE_BF16 : CT_DTYPE_F32;
    pool p = {0};
#define NEW2(dtype, rows, cols, host) own(&p, tensor_2d(be, dtype, rows, cols, host))
#define NEW1(dtype, n, host) own(&p, tensor_1d(be, dtype, n, host))

    int32_t tok_h[N], tgt_h[N];
    for (int i = 0; i < N; i++) {
        tok_h[i] = (int32_t)(test_rng_next(&rng) % V_VALID);
        tgt_h[i] = (int32_t)(test_rng_next(&rng) % V_VALID);
    }
    float *table_h = rand_floats(&rng, V * C, -1, 1);
    float *wpe_h = rand_floats(&rng, (POS + T) * C, -0.5f, 0.5f);
    float *lnw_h = rand_floats(&rng, C, 0.5f, 1.5f), *lnb_h = rand_floats(&rng, C, -0.2f, 0.2f);
    float *wqkv_h = rand_floats(&rng, CQKV * C, -0.3f, 0.3f);
    float *bqkv_h = rand_floats(&rng, CQKV, -0.1f, 0.1f);
    float *bfc_h = rand_floats(&rng, C, -0.1f, 0.1f);
    float *wout_h = rand_floats(&rng, V * C, -0.3f, 0.3f);

    ct_tensor *tokens = own(&p, tokens_1d(be, N, tok_h)),
              *targets = own(&p, tokens_1d(be, N, tgt_h));
    ct_tensor *table = NEW2(dt, V, C, table_h), *wpe = NEW2(dt, POS + T, C, wpe_h);
    ct_tensor *lnw = NEW1(dt, C, lnw_h), *lnb = NEW1(dt, C, lnb_h);
    ct_tensor *wqkv = NEW2(dt, CQKV, C, wqkv_h), *bqkv = NEW1(dt, CQKV, bqkv_h);
    ct_tensor *bfc = NEW1(dt, C, bfc_h), *wout = NEW2(dt, V, C, wout_h);

    /* forward */
    ct_tensor *x = NEW2(dt, N, C, NULL), *h = NEW2(dt, N, C, NULL);
    ct_tensor *mean = NEW1(CT_DTYPE_F32, N, NULL), *rstd = NEW1(CT_DTYPE_F32, N, NULL);
    ct_tensor *qkv = NEW2(dt, N, CQKV, NULL), *att = NEW2(dt, N, C, NULL);
    ct_tensor *lse = NEW1(CT_DTYPE_F32, B * NH * T, NULL);
    ct_tensor *g = NEW2(dt, N, C, NULL), *logits = NEW2(dt, N, V, NULL);
    ct_tensor *rowmax = NEW1(CT_DTYPE_F32, N, NULL), *sumexp = NEW1(CT_DTYPE_F32, N, NULL);
    ct_tensor *target_logit = NEW1(CT_DTYPE_F32, N, NULL), *losses = NEW1(CT_DTYPE_F32, N, NULL);
    ct_embedding_fwd(x, tokens, table, 0);
    ct_posemb_fwd(x, wpe, B, T, POS);
    ct_layernorm_fwd(h, mean, rstd, x, lnw, lnb);
    ct_bias_init(qkv, bqkv, NULL);
    ct_gemm(qkv, h, wqkv, false, true, 1.0f, 1.0f);
    ct_attention_fwd(att, lse, qkv, B, T, NH, NKV);
    ct_gelu_fwd(g, att);
    ct_bias_add(g, bfc);
    ct_gemm(logits, g, wout, false, true, 1.0f, 0.0f);
    ct_tensor *logits2 = NEW2(dt, N, V, NULL); /* the shard's copy, before keep_exp */
    ct_tensor_copy(logits2, logits);
    ct_xent_rowmax(rowmax, logits, V_VALID);
    ct_xent_sumexp(sumexp, target_logit, logits, targets, rowmax, V_VALID, 0, true);
    ct_xent_finish(losses, logits, targets, rowmax, sumexp, target_logit, V_VALID, 0, 1.0f / N,
                   true);

    /* a vocab-parallel shard: columns [5, 5 + 30) of the logits, rows [10, 30) of the table */
    ct_tensor *cols = own(&p, ct_tensor_view_2d(logits2, 0, N, V));
    ct_tensor *rowmax2 = NEW1(CT_DTYPE_F32, N, NULL), *sumexp2 = NEW1(CT_DTYPE_F32, N, NULL);
    ct_tensor *target_logit2 = NEW1(CT_DTYPE_F32, N, NULL);
    ct_tensor *losses2 = NEW1(CT_DTYPE_F32, N, NULL);
    ct_xent_rowmax(rowmax2, cols, 30);
    ct_xent_sumexp(sumexp2, target_logit2, cols, targets, rowmax2, 30, 5, false);
    ct_xent_finish(losses2, cols, targets, rowmax2, sumexp2, target_logit2, 30, 5, 1.0f, false);
    ct_tensor *table_shard = own(&p, ct_tensor_view_2d(table, SHARD0 * C, SHARD, C));
    ct_tensor *x_shard = NEW2(dt, N, C, NULL);
    ct_embedding_fwd(x_shard, tokens, table_shard, SHARD0);

    /* backward (logits now hold dlogits) */
    ct_tensor *dwout = NEW2(CT_DTYPE_F32, V, C, NULL);
    ct_tensor *dg = NEW2(dt, N, C, NULL), *datt = NEW2(dt, N, C, NULL);
    ct_tensor *dbias_fc = NEW1(CT_DTYPE_F32, C, NULL);
    ct_tensor *dqkv = NEW2(dt, N, CQKV, NULL), *dqkv2 = NEW2(dt, N, CQKV, NULL);
    ct_tensor *dbias_qkv = NEW1(CT_DTYPE_F32, CQKV, NULL);
    ct_tensor *dh = NEW2(dt, N, C, NULL), *dx = NEW2(dt, N, C, NULL);
    ct_tensor *dlnw = NEW1(CT_DTYPE_F32, C, NULL), *dlnb = NEW1(CT_DTYPE_F32, C, NULL);
    ct_tensor *dtable = NEW2(CT_DTYPE_F32, V, C, NULL);
    ct_tensor *dwpe = NEW2(CT_DTYPE_F32, POS + T, C, NULL);
    ct_tensor_zero(dwout), ct_tensor_zero(dbias_fc), ct_tensor_zero(dbias_qkv);
    ct_tensor_zero(dx), ct_tensor_zero(dlnw), ct_tensor_zero(dlnb), ct_tensor_zero(dtable);
    ct_tensor_zero(dwpe);
    ct_gemm(dwout, logits, g, true, false, 1.0f, 1.0f);
    ct_gemm(dg, logits, wout, false, false, 1.0f, 0.0f);
    ct_tensor *dg_inplace = NEW2(dt, N, C, NULL);
    ct_tensor_copy(dg_inplace, dg);
    ct_gelu_bwd(dg_inplace, NULL, att, dg_inplace); /* dinp aliases dout */
    ct_gelu_bwd(datt, dbias_fc, att, dg);
    ct_attention_bwd(dqkv, dbias_qkv, datt, qkv, att, lse, B, T, NH, NKV);
    ct_attention_bwd(dqkv2, NULL, datt, qkv, att, lse, B, T, NH, NKV);
    ct_bias_grad(dbias_qkv, dqkv);
    ct_gemm(dh, dqkv, wqkv, false, false, 1.0f, 0.0f);
    ct_layernorm_bwd(dx, dlnw, dlnb, dh, x, lnw, mean, rstd);
    ct_embedding_bwd(dtable, dx, tokens, 0);
    ct_tensor *dtable_shard = own(&p, ct_tensor_view_2d(dtable, SHARD0 * C, SHARD, C));
    ct_embedding_bwd(dtable_shard, dx, tokens, SHARD0);
    ct_posemb_bwd(dwpe, dx, B, T, POS);

    /* optimizer on the vocab projection: two segments with a gap, twice with the parameter copy
     * in the model's dtype, once without */
    ct_tensor *master = NEW2(CT_DTYPE_F32, V, C, wout_h);
    ct_tensor *m = NEW2(CT_DTYPE_F32, V, C, NULL), *v = NEW2(CT_DTYPE_F32, V, C, NULL);
    ct_tensor_zero(m), ct_tensor_zero(v);
    ct_tensor *master_flat = own(&p, ct_tensor_view_1d(master, 0, V * C));
    ct_tensor *dwout_flat = own(&p, ct_tensor_view_1d(dwout, 0, V * C));
    ct_tensor *m_flat = own(&p, ct_tensor_view_1d(m, 0, V * C));
    ct_tensor *v_flat = own(&p, ct_tensor_view_1d(v, 0, V * C));
    ct_tensor *wout_flat = own(&p, ct_tensor_view_1d(wout, 0, V * C));
    ct_adamw_segment seg[2] = {{.offset = 0, .count = 20 * C, .weight_decay = 0.1f},
                               {.offset = 24 * C, .count = 16 * C, .weight_decay = 0.0f}};
    ct_adamw_hparams hp = {
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 0.5f};
    for (int step = 1; step <= 3; step++) {
        hp.step = step;
        ct_adamw(master_flat, dwout_flat, m_flat, v_flat, seg, 2, &hp, step < 3 ? wout_flat : NULL);
    }
    ct_tensor *sq = NEW1(CT_DTYPE_F32, 3, NULL);
    ct_tensor_zero(sq);
    ct_tensor *sq_of[2] = {dwout_flat, dtable}; /* one call, two ranges: out[1], out[2] */
    ct_sumsq(sq, 1, sq_of, 2);

    /* casts both ways, axpy, scale, fills, a copy */
    ct_tensor *cast = NEW2(other, N, C, NULL), *cast_back = NEW2(dt, N, C, NULL);
    ct_cast(cast, g);
    ct_cast(cast_back, cast);
    ct_axpy(dx, dh, -0.5f);
    ct_scale(dx, 3.0f);
    ct_tensor *filled = NEW2(dt, 3, 7, NULL), *filled_i = NEW1(CT_DTYPE_I32, 5, NULL);
    ct_tensor *filled_o = NEW1(other, 9, NULL), *copied = NEW2(dt, N, C, NULL);
    ct_tensor_fill(filled, 1.25f), ct_tensor_fill(filled_i, 7.0f), ct_tensor_fill(filled_o, -3.5f);
    ct_tensor_copy(copied, g);

    keep(r, "embedding+posemb x", x), keep(r, "layernorm out", h), keep(r, "layernorm mean", mean);
    keep(r, "layernorm rstd", rstd), keep(r, "qkv", qkv), keep(r, "attention out", att);
    keep(r, "attention lse", lse), keep(r, "gelu out + bias", g), keep(r, "xent rowmax", rowmax);
    keep(r, "xent sumexp", sumexp), keep(r, "xent target_logit", target_logit);
    keep(r, "xent losses", losses), keep(r, "dlogits", logits), keep(r, "shard rowmax", rowmax2);
    keep(r, "shard sumexp", sumexp2), keep(r, "shard target_logit", target_logit2);
    keep(r, "shard losses", losses2), keep(r, "shard logits", logits2);
    keep(r, "shard embedding", x_shard), keep(r, "dwout", dwout), keep(r, "dg", dg);
    keep(r, "gelu_bwd in place", dg_inplace), keep(r, "gelu_bwd dinp", datt);
    keep(r, "gelu_bwd dbias", dbias_fc), keep(r, "attention dqkv", dqkv);
    keep(r, "attention dqkv without dbias", dqkv2), keep(r, "dbias qkv", dbias_qkv);
    keep(r, "dh", dh), keep(r, "layernorm dinp", dx), keep(r, "layernorm dw", dlnw);
    keep(r, "layernorm db", dlnb), keep(r, "embedding dtable", dtable), keep(r, "dwpe", dwpe);
    keep(r, "adamw master", master), keep(r, "adamw m", m), keep(r, "adamw v", v);
    keep(r, "adamw param copy", wout), keep(r, "sumsq", sq), keep(r, "cast", cast);
    keep(r, "cast back", cast_back), keep(r, "fill", filled), keep(r, "fill i32", filled_i);
    keep(r, "fill other dtype", filled_o), keep(r, "copy", copied);

    /* two steps of ring attention (context parallelism) on qkv's rows as two chunks of T/2: its
     * own key/value block (causal, skipped and full pairs), then an earlier rank's (full and
     * skipped), forward from empty accumulators, backward from the result */
    const int64_t steps[2] = {CT_ATT_CHUNKS(1, 2, 1, 2), CT_ATT_CHUNKS(1, 2, 0, 3)};
    ct_tensor *kvb = NEW2(dt, N, 2 * NKV * HD, NULL);
    ct_cast_cols(kvb, 0, qkv, C, 2 * NKV * HD);
    ct_tensor *o_acc = NEW2(CT_DTYPE_F32, N, C, NULL),
              *lse_acc = NEW1(CT_DTYPE_F32, B * NH * T, NULL);
    ct_tensor_zero(o_acc), ct_tensor_fill(lse_acc, -INFINITY);
    for (int s = 0; s < 2; s++)
        ct_attention_part_fwd(o_acc, lse_acc, qkv, kvb, B, T, NH, NKV, steps[s]);
    ct_tensor *o_part = NEW2(dt, N, C, NULL);
    ct_cast(o_part, o_acc);
    ct_tensor *dq_acc = NEW2(CT_DTYPE_F32, N, C, NULL);
    ct_tensor *dkv_acc = NEW2(CT_DTYPE_F32, N, 2 * NKV * HD, NULL);
    ct_tensor_zero(dq_acc), ct_tensor_zero(dkv_acc);
    for (int s = 0; s < 2; s++)
        ct_attention_part_bwd(dq_acc, dkv_acc, datt, qkv, o_part, lse_acc, kvb, B, T, NH, NKV,
                              steps[s]);
    ct_tensor *dqkv_part = NEW2(dt, N, CQKV, NULL);
    ct_cast_cols(dqkv_part, 0, dq_acc, 0, C);
    ct_cast_cols(dqkv_part, C, dkv_acc, 0, 2 * NKV * HD);
    keep(r, "ring kv block", kvb), keep(r, "ring o_acc", o_acc), keep(r, "ring lse_acc", lse_acc);
    keep(r, "ring dq_acc", dq_acc), keep(r, "ring dkv_acc", dkv_acc),
        keep(r, "ring dqkv", dqkv_part);

    ct_tensor *llama[TEST_LLAMA_OUTS]; /* RMSNorm, RoPE and SwiGLU (test_util.h) */
    test_llama_ops(be, dt, llama);
    for (int i = 0; i < TEST_LLAMA_OUTS; i++)
        keep(r, test_llama_out_names[i], llama[i]), ct_tensor_free(llama[i]);

    /* sanity of the sequence itself, so that the comparison is not between two empty runs */
    float loss_h[N];
    ct_tensor_to_host(loss_h, losses);
    for (int i = 0; i < N; i++) assert_true(isfinite(loss_h[i]) && loss_h[i] > 0.0f);

    pool_release(&p);
    free(table_h), free(wpe_h), free(lnw_h), free(lnb_h), free(wqkv_h), free(bqkv_h);
    free(bfc_h), free(wout_h);
#undef NEW1
#undef NEW2
}

/* ---- 1. no false alarms, no interference ------------------------------------------------------
 */

static int64_t first_difference(const void *a, const void *b, size_t bytes) {
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < bytes; i++)
        if (x[i] != y[i]) return (int64_t)i;
    return -1;
}

static void check_passes_bit_exact(ct_dtype dt) {
    ct_backend *ref = ct_backend_cpu_new(1), *checked = ct_backend_check_new(ct_backend_cpu_new(1));
    char what[160];
    ct_backend_describe(checked, what, sizeof what);
    assert_string_equal(what, "cpu, checked: 1 thread");
    run_results want = {0}, got = {0};
    run_sequence(ref, dt, &want);
    run_sequence(checked, dt, &got); /* a report would end the process here with status 1 */
    assert_int_equal(want.n, got.n);
    for (int i = 0; i < want.n; i++) {
        assert_int_equal(want.size[i], got.size[i]);
        int64_t at = first_difference(want.bytes[i], got.bytes[i], want.size[i]);
        if (at >= 0)
            fail_msg("%s %s: check mode changed the result at byte %lld of %zu", ct_dtype_name(dt),
                     want.name[i], (long long)at, want.size[i]);
    }
    results_release(&want), results_release(&got);
    ct_backend_free(ref), ct_backend_free(checked);
}

static void test_passes_bit_exact_f32(void **state) {
    check_passes_bit_exact(CT_DTYPE_F32);
}

static void test_passes_bit_exact_bf16(void **state) {
    check_passes_bit_exact(CT_DTYPE_BF16);
}

/* ---- 2. broken inner backends ------------------------------------------------------------------
 *
 * A broken backend is the CPU backend with one slot replaced; the replacement calls the real slot
 * (kept in `real`) and then spoils its result, writing host memory directly — allowed here because
 * the CPU backend's memory is host memory. Each runs in a child process: this binary again, as
 * `test_backend_check --child NAME DTYPE` (a fresh process: no cmocka state, no OpenMP pool
 * carried over a fork).
 */

static const struct ct_backend_i *real;

/* x[i] += delta for an f32 or bf16 buffer (bf16: widened, added, rounded). */
static void nudge(void *x, ct_dtype dt, int64_t i, float delta) {
    if (dt == CT_DTYPE_F32)
        ((float *)x)[i] += delta;
    else
        ((uint16_t *)x)[i] = ct_f32_to_bf16(ct_bf16_to_f32(((uint16_t *)x)[i]) + delta);
}

/* out element 5 off by 1e-3 (f32) or 3e-2 (bf16: 4 ulps at 1; 1e-3 would round away): a plain
 * wrong value */
static void layernorm_fwd_off(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd,
                              void *inp, const void *res, const void *w, const void *b, int64_t N,
                              int64_t C) {
    real->layernorm_fwd(ctx, dt, out, mean, rstd, inp, res, w, b, N, C);
    nudge(out, dt, 5, dt == CT_DTYPE_F32 ? 1e-3f : 3e-2f);
}

/* out element 5 one ulp up: inside the few-ulps tolerance of an elementwise result */
static void layernorm_fwd_ulp(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd,
                              void *inp, const void *res, const void *w, const void *b, int64_t N,
                              int64_t C) {
    real->layernorm_fwd(ctx, dt, out, mean, rstd, inp, res, w, b, N, C);
    float *o = out;
    o[5] = nextafterf(o[5], INFINITY);
}

/* out element 5 one bf16 ulp up: what a legitimate difference in the last fp32 bit can become
 * after both sides round to bf16 (the one-ulp allowance) */
static void layernorm_fwd_bf16_ulp(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd,
                                   void *inp, const void *res, const void *w, const void *b,
                                   int64_t N, int64_t C) {
    real->layernorm_fwd(ctx, dt, out, mean, rstd, inp, res, w, b, N, C);
    ((uint16_t *)out)[5] += 1; /* the next bf16 value away from zero */
}

/* the same ulp in an exact op */
static void cast_ulp(void *ctx, void *dst, ct_dtype dst_dtype, const void *src, ct_dtype src_dtype,
                     int64_t n) {
    real->cast(ctx, dst, dst_dtype, src, src_dtype, n);
    if (dst_dtype == CT_DTYPE_F32) ((float *)dst)[3] = nextafterf(((float *)dst)[3], INFINITY);
}

/* an accumulating op that overwrites */
static void bias_grad_overwrites(void *ctx, ct_dtype dt, float *dbias, const void *dout, int64_t N,
                                 int64_t C) {
    memset(dbias, 0, (size_t)C * sizeof *dbias);
    real->bias_grad(ctx, dt, dbias, dout, N, C);
}

/* an accumulating GEMM that ignores beta */
static void gemm_ignores_beta(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N,
                              int64_t K, float alpha, const void *A, int64_t lda, const void *B,
                              int64_t ldb, float beta, void *C, int64_t ldc, ct_dtype ab_dtype,
                              ct_dtype c_dtype) {
    real->gemm(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc, ab_dtype,
               c_dtype);
}

/* AdamW with the bias correction of the next step */
static void adamw_wrong_step(void *ctx, float *param, const float *grad, float *m, float *v,
                             const ct_adamw_segment *segments, int n_segments,
                             const ct_adamw_hparams *hp, void *param_copy, ct_dtype copy_dtype) {
    ct_adamw_hparams next = *hp;
    next.step++;
    real->adamw(ctx, param, grad, m, v, segments, n_segments, &next, param_copy, copy_dtype);
}

/* attention's lse of row 7 off by 1e-3 */
static void attention_fwd_off(void *ctx, ct_dtype dt, void *out, float *lse, const void *qkv,
                              int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                              int64_t head_dim) {
    real->attention_fwd(ctx, dt, out, lse, qkv, B, T, n_head, n_kv_head, head_dim);
    lse[7] += 1e-3f;
}

/* a NaN where the CPU has a finite value */
static void bias_add_nan(void *ctx, ct_dtype dt, void *out, const void *bias, int64_t N,
                         int64_t C) {
    real->bias_add(ctx, dt, out, bias, N, C);
    nudge(out, dt, 4, NAN);
}

/* a kernel that uses its input as scratch */
static void gelu_fwd_scribbles(void *ctx, ct_dtype dt, void *out, const void *inp, int64_t n) {
    real->gelu_fwd(ctx, dt, out, inp, n);
    nudge((void *)inp, dt, 2, 1.0f);
}

/* keep_exp leaves the padding columns' logits alone; this one writes 0 over the last valid one */
static void xent_sumexp_short(void *ctx, ct_dtype dt, float *sumexp, float *target_logit,
                              void *logits, const int32_t *targets, const float *rowmax, int64_t N,
                              int64_t V, int64_t n_valid, int64_t col_offset, bool keep_exp) {
    real->xent_sumexp(ctx, dt, sumexp, target_logit, logits, targets, rowmax, N, V, n_valid - 1,
                      col_offset, keep_exp);
}

/* Llama's ops: RMSNorm's dw overwritten instead of accumulated, RoPE rotating the wrong way,
 * SwiGLU's up gradient element 3 off by 1e-2 */
static void rmsnorm_bwd_overwrites(void *ctx, ct_dtype dt, void *dinp, float *dw, const void *dout,
                                   const void *inp, const void *w, const float *rstd, int64_t N,
                                   int64_t C) {
    memset(dw, 0, (size_t)C * sizeof *dw);
    real->rmsnorm_bwd(ctx, dt, dinp, dw, dout, inp, w, rstd, N, C);
}

static void rope_wrong_way(void *ctx, ct_dtype dt, void *x, const float *cos_sin, int64_t B,
                           int64_t T, int64_t n_rot_head, int64_t head_dim, int64_t ld,
                           int64_t pos_offset, bool inverse) {
    real->rope(ctx, dt, x, cos_sin, B, T, n_rot_head, head_dim, ld, pos_offset, !inverse);
}

static void swiglu_bwd_off(void *ctx, ct_dtype dt, void *dgate, void *dup, const void *gate,
                           const void *up, const void *dout, int64_t N, int64_t H, int64_t ld) {
    real->swiglu_bwd(ctx, dt, dgate, dup, gate, up, dout, N, H, ld);
    nudge(dup, dt, 3, 1e-2f);
}

/* ring attention: a step's merged lse of row 7 off by 1e-3; a backward step that overwrites its
 * dK/dV accumulator; a strided cast one ulp off (an exact op) */
static void attention_part_fwd_off(void *ctx, ct_dtype dt, float *o_acc, float *lse_acc,
                                   const void *qkv, const void *kv, int64_t B, int64_t T,
                                   int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                   int64_t chunks) {
    real->attention_part_fwd(ctx, dt, o_acc, lse_acc, qkv, kv, B, T, n_head, n_kv_head, head_dim,
                             chunks);
    lse_acc[7] += 1e-3f;
}

static void attention_part_bwd_overwrites(void *ctx, ct_dtype dt, float *dq_acc, float *dkv_acc,
                                          const void *dout, const void *qkv, const void *out,
                                          const float *lse, const void *kv, int64_t B, int64_t T,
                                          int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                          int64_t chunks) {
    memset(dkv_acc, 0, (size_t)(B * T * 2 * n_kv_head * head_dim) * sizeof *dkv_acc);
    real->attention_part_bwd(ctx, dt, dq_acc, dkv_acc, dout, qkv, out, lse, kv, B, T, n_head,
                             n_kv_head, head_dim, chunks);
}

static void cast_cols_ulp(void *ctx, void *dst, ct_dtype dst_dtype, int64_t ld_dst, const void *src,
                          ct_dtype src_dtype, int64_t ld_src, int64_t rows, int64_t cols) {
    real->cast_cols(ctx, dst, dst_dtype, ld_dst, src, src_dtype, ld_src, rows, cols);
    if (dst_dtype == CT_DTYPE_F32)
        ((float *)dst)[1] = nextafterf(((float *)dst)[1], INFINITY);
    else
        ((uint16_t *)dst)[1] += 1;
}

/* The breakages, by name: which slot each replaces. */
typedef struct breakage {
    const char *name;
    size_t slot; /* offsetof(struct ct_backend_i, slot) */
    void (*fn)(void);
} breakage;
#define BREAK(slot, fn)                                                                            \
    { #fn, offsetof(struct ct_backend_i, slot), (void (*)(void))fn }
static const breakage breakages[] = {
    BREAK(layernorm_fwd, layernorm_fwd_off),
    BREAK(layernorm_fwd, layernorm_fwd_ulp),
    BREAK(layernorm_fwd, layernorm_fwd_bf16_ulp),
    BREAK(cast, cast_ulp),
    BREAK(bias_grad, bias_grad_overwrites),
    BREAK(gemm, gemm_ignores_beta),
    BREAK(adamw, adamw_wrong_step),
    BREAK(attention_fwd, attention_fwd_off),
    BREAK(bias_add, bias_add_nan),
    BREAK(gelu_fwd, gelu_fwd_scribbles),
    BREAK(xent_sumexp, xent_sumexp_short),
    BREAK(rmsnorm_bwd, rmsnorm_bwd_overwrites),
    BREAK(rope, rope_wrong_way),
    BREAK(swiglu_bwd, swiglu_bwd_off),
    BREAK(attention_part_fwd, attention_part_fwd_off),
    BREAK(attention_part_bwd, attention_part_bwd_overwrites),
    BREAK(cast_cols, cast_cols_ulp),
};

/* The child: the sequence on check mode over the CPU backend with breakage `name`; exits 0 when
 * the whole sequence ran (check mode exits 1 at the first op that differs). */
static int child_main(const char *name, const char *dtype) {
    const breakage *b = NULL;
    for (size_t i = 0; i < sizeof breakages / sizeof breakages[0]; i++)
        if (!strcmp(breakages[i].name, name)) b = &breakages[i];
    if (!b) {
        fprintf(stderr, "no breakage named %s\n", name);
        return 2;
    }
    ct_backend *inner = ct_backend_cpu_new(1);
    static struct ct_backend_i broken;
    real = inner->iface;
    broken = *real;
    memcpy((char *)&broken + b->slot, &b->fn, sizeof b->fn);
    inner->iface = &broken;
    ct_backend *be = ct_backend_check_new(inner);
    run_results r = {0};
    run_sequence(be, strcmp(dtype, "bf16") ? CT_DTYPE_F32 : CT_DTYPE_BF16, &r);
    results_release(&r);
    ct_backend_free(be);
    return 0;
}

/* Runs the child with breakage `name` in precision `dt`; returns its exit status (-1: killed by a
 * signal) and its stderr in `err`. */
static void exec_child(void *arg) {
    execv("/proc/self/exe", (char **)arg);
    _exit(127);
}

static int run_child(const char *name, ct_dtype dt, char *err, size_t cap) {
    char *argv[] = {"test_backend_check", "--child", (char *)name,
                    dt == CT_DTYPE_BF16 ? "bf16" : "f32", NULL};
    int status = test_run_captured(exec_child, argv, err, cap);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void expect_in(const char *text, const char *want) {
    if (!strstr(text, want)) fail_msg("the report lacks '%s'; it says:\n%s", want, text);
}

/* The child must stop at the broken op with status 1 and a report naming `op` and each of
 * `lines` (NULL-terminated). */
static void expect_report(const char *breakage, ct_dtype dt, const char *op,
                          const char *const *lines) {
    char err[8192];
    int status = run_child(breakage, dt, err, sizeof err);
    if (status != 1) fail_msg("%s: the child exited %d, not 1; stderr:\n%s", op, status, err);
    char want[96];
    snprintf(want, sizeof want, "check backend: op '%s' on cpu differs", op);
    expect_in(err, want);
    expect_in(err, "ops before it agreed");
    expect_in(err, "arguments: ");
    expect_in(err, "hint: ");
    for (int i = 0; lines[i]; i++) expect_in(err, lines[i]);
}

static void test_broken_layernorm(void **state) {
    expect_report("layernorm_fwd_off", CT_DTYPE_F32, "layernorm_fwd",
                  (const char *const[]){"output 'out' (f32, 768 elements): worst element 5:",
                                        "1 of 768 elements beyond tolerance", "dt=f32 N=24 C=32",
                                        "the 2 ops before it agreed", NULL});
    expect_report(
        "layernorm_fwd_off", CT_DTYPE_BF16, "layernorm_fwd",
        (const char *const[]){"output 'out' (bf16, 768 elements): worst element 5:", NULL});
}

static void test_broken_bias_grad_overwrites(void **state) {
    expect_report("bias_grad_overwrites", CT_DTYPE_F32, "bias_grad",
                  (const char *const[]){"output 'dbias' (f32, 64 elements)", NULL});
}

static void test_broken_gemm_ignores_beta(void **state) {
    expect_report("gemm_ignores_beta", CT_DTYPE_BF16, "gemm",
                  (const char *const[]){"output 'C' (bf16, 1536 elements)", "beta=1",
                                        "the 4 ops before it agreed", NULL});
}

static void test_broken_adamw(void **state) {
    expect_report("adamw_wrong_step", CT_DTYPE_F32, "adamw",
                  (const char *const[]){"output 'param' (f32, 1280 elements)", "step=1", NULL});
}

static void test_broken_attention_bf16(void **state) {
    expect_report("attention_fwd_off", CT_DTYPE_BF16, "attention_fwd",
                  (const char *const[]){"output 'lse' (f32, 96 elements): worst element 7:",
                                        "n_head=4 n_kv_head=2 head_dim=8", NULL});
}

/* The checkers of Llama's ops (check_ops.c) see what they are for. */
static void test_broken_llama_ops(void **state) {
    expect_report(
        "rmsnorm_bwd_overwrites", CT_DTYPE_F32, "rmsnorm_bwd",
        (const char *const[]){"output 'dw' (f32, 24 elements)", "dt=f32 N=12 C=24", NULL});
    expect_report("rope_wrong_way", CT_DTYPE_BF16, "rope",
                  (const char *const[]){"output 'x' (bf16,", "n_rot_head=6 head_dim=6",
                                        "pos_offset=3 forward", NULL});
    expect_report("swiglu_bwd_off", CT_DTYPE_F32, "swiglu_bwd",
                  (const char *const[]){"N=12 H=40 ld=80", "1 of", NULL});
}

/* The checkers of ring attention's ops (check_ops.c) see what they are for. */
static void test_broken_ring_ops(void **state) {
    expect_report("attention_part_fwd_off", CT_DTYPE_F32, "attention_part_fwd",
                  (const char *const[]){"output 'lse_acc' (f32, 96 elements): worst element 7:",
                                        "chunks=1,2|1,2", NULL});
    expect_report(
        "attention_part_bwd_overwrites", CT_DTYPE_BF16, "attention_part_bwd",
        (const char *const[]){"output 'dkv_acc' (f32, 768 elements)", "chunks=1,2|0,3", NULL});
    expect_report("cast_cols_ulp", CT_DTYPE_BF16, "cast_cols",
                  (const char *const[]){"output 'dst' (bf16,", "rows=24 cols=32", NULL});
}

static void test_broken_nan(void **state) {
    expect_report(
        "bias_add_nan", CT_DTYPE_BF16, "bias_add",
        (const char *const[]){"output 'out' (bf16, 768 elements): worst element 4: got nan",
                              "not comparable (NaN or Inf on one side only)", NULL});
}

static void test_broken_writes_input(void **state) {
    expect_report("gelu_fwd_scribbles", CT_DTYPE_F32, "gelu_fwd",
                  (const char *const[]){"input 'inp' (f32, 768 elements) was changed by the op: "
                                        "element 2",
                                        NULL});
}

static void test_broken_xent_short_row(void **state) {
    expect_report("xent_sumexp_short", CT_DTYPE_F32, "xent_sumexp",
                  (const char *const[]){"output 'sumexp'", NULL});
}

/* The child must run the whole sequence without a report. */
static void expect_pass(const char *breakage, ct_dtype dt) {
    char err[8192];
    int status = run_child(breakage, dt, err, sizeof err);
    if (status != 0) fail_msg("%s was reported (exit %d):\n%s", breakage, status, err);
}

/* The tolerance is not zero where it should not be (one fp32 ulp of an elementwise result; one
 * bf16 ulp of a bf16 one), and zero where it should be (an exact op). */
static void test_tolerance_ulp(void **state) {
    expect_pass("layernorm_fwd_ulp", CT_DTYPE_F32);
    expect_pass("layernorm_fwd_bf16_ulp", CT_DTYPE_BF16);
    expect_report("cast_ulp", CT_DTYPE_BF16, "cast",
                  (const char *const[]){"output 'dst' (f32, 768 elements): worst element 3:",
                                        "must be equal (an exact op)", NULL});
}

/* ---- 3. the registry ------------------------------------------------------------------------- */

static void test_registry(void **state) {
    setenv("CT_CHECK_BACKEND", "1", 1);
    char chosen[256], what[160];
    ct_backend *be = NULL;
    assert_int_equal(ct_backend_new(&be, "cpu-async", 1, chosen, sizeof chosen), CT_OK);
    expect_in(chosen, "cpu-async, every op checked against the CPU backend (CT_CHECK_BACKEND=1)");
    ct_backend_describe(be, what, sizeof what);
    assert_string_equal(what, "cpu-async, checked: 1 thread");
    /* it works through the registry too: the sequence agrees and gives the CPU's bytes */
    run_results want = {0}, got = {0};
    ct_backend *ref = ct_backend_cpu_new(1);
    run_sequence(ref, CT_DTYPE_F32, &want);
    run_sequence(be, CT_DTYPE_F32, &got);
    for (int i = 0; i < want.n; i++)
        assert_int_equal(first_difference(want.bytes[i], got.bytes[i], want.size[i]), -1);
    results_release(&want), results_release(&got);
    ct_backend_free(ref), ct_backend_free(be);

    assert_int_equal(ct_backend_new(&be, "cpu", 1, chosen, sizeof chosen), CT_OK);
    assert_string_equal(chosen, "cpu");
    ct_backend_describe(be, what, sizeof what);
    assert_null(strstr(what, "checked"));
    ct_backend_free(be);
    unsetenv("CT_CHECK_BACKEND");
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_passes_bit_exact_f32),
        cmocka_unit_test(test_passes_bit_exact_bf16),
        cmocka_unit_test(test_broken_layernorm),
        cmocka_unit_test(test_broken_bias_grad_overwrites),
        cmocka_unit_test(test_broken_gemm_ignores_beta),
        cmocka_unit_test(test_broken_adamw),
        cmocka_unit_test(test_broken_attention_bf16),
        cmocka_unit_test(test_broken_llama_ops),
        cmocka_unit_test(test_broken_ring_ops),
        cmocka_unit_test(test_broken_nan),
        cmocka_unit_test(test_broken_writes_input),
        cmocka_unit_test(test_broken_xent_short_row),
        cmocka_unit_test(test_tolerance_ulp),
        cmocka_unit_test(test_registry),
    };
    if (argc == 4 && !strcmp(argv[1], "--child")) return child_main(argv[2], argv[3]);
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
