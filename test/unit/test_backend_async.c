/*
 * test_backend_async.c — the asynchronous stream (core/backend/backend_async.c) against the backend
 * it wraps. Four properties:
 *
 *  1. Bit-exactness. A forward-and-backward sequence of every kind of op, in f32 and in bf16,
 *     runs once on the CPU backend and once on the CPU backend behind the stream; every result
 *     must be the same bytes. Tolerance zero, because the stream runs the same slots on the same
 *     arguments in the same order: any difference is a lost, reordered, or misrouted argument.
 *  2. Laziness, the property the module exists for: queued ops touch memory only when the host
 *     waits, so a read without the wait sees the old value every time. The test reads tensor
 *     memory directly on the host — allowed here only because the CPU backend's memory is host
 *     memory, and precisely to see what a caller that skips a wait would see.
 *  3. Host structures (AdamW's hp and segments, copy_from_host's source) are copied when the
 *     slot is called: changing them afterwards changes nothing.
 *  4. A queue longer than the stream's capacity runs completely and in order.
 *  5. Every table is complete: the CPU backend's, the stream's and check mode's fill every
 *     required op of core/backend/backend_ops.h (ct_backend_missing_op, walked over the list
 * itself, so a new op is covered by its line there), a table lacking one is named, and the registry
 *     refuses to hand out such a backend.
 *
 * Run all:     ./test_backend_async
 * Run by name: ./test_backend_async test_laziness     (a cmocka filter; wildcards allowed)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/backend/backend.h"

#include "test_util.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static ct_backend *async_new(void) {
    return ct_backend_async_new(ct_backend_cpu_new(1));
}

/* A tensor of `dtype` with fp32 host values (rounded to bf16 for a bf16 tensor), or NULL data. */
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

/* The raw f32 value at t->data[i], read on the host without any wait (see the top). */
static float raw_f32(const ct_tensor *t, int64_t i) {
    return ((const float *)t->data)[i];
}

/* The first byte at which a and b differ, or -1: the comparator of the bit-exactness test. */
static int64_t first_difference(const void *a, const void *b, size_t bytes) {
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < bytes; i++)
        if (x[i] != y[i]) return (int64_t)i;
    return -1;
}

/* ---- 1. bit-exactness -------------------------------------------------------------------------
 */

enum { MAX_RESULTS = 64 };

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

static const void *kept(const run_results *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->name[i], name)) return r->bytes[i];
    fail_msg("no result named %s", name);
    return NULL;
}

static void results_release(run_results *r) {
    for (int i = 0; i < r->n; i++) free(r->bytes[i]);
    r->n = 0;
}

/*
 * A small GPT-2 block's worth of ops in precision `dt`, with inputs drawn from a fixed seed:
 * embedding and position, layernorm, QKV projection (bias_init + accumulating GEMM), attention,
 * GELU, the vocab projection and the three-step cross-entropy with its gradient, then the whole
 * backward, AdamW with segments and a parameter copy, the squared norms, a cast, and the memory
 * ops, then the ops of a Llama block (test_llama_ops). Nothing is read back until the end of the
 * GPT-2 part, so on the stream everything is queued first.
 */
static void run_sequence(ct_backend *be, ct_dtype dt, run_results *r) {
    enum { B = 2, T = 12, N = B * T, C = 32, NH = 4, C3 = 3 * C, V = 40, V_VALID = 37 };
    uint64_t rng = 0x5EEDA5C0FFEEull + (uint64_t)dt;
    const ct_dtype other = dt == CT_DTYPE_F32 ? CT_DTYPE_BF16 : CT_DTYPE_F32;

    int32_t tok_h[N], tgt_h[N];
    for (int i = 0; i < N; i++) {
        tok_h[i] = (int32_t)(test_rng_next(&rng) % V_VALID);
        tgt_h[i] = (int32_t)(test_rng_next(&rng) % V_VALID);
    }
    float *table_h = rand_floats(&rng, V * C, -1, 1),
          *wpe_h = rand_floats(&rng, T * C, -0.5f, 0.5f);
    float *lnw_h = rand_floats(&rng, C, 0.5f, 1.5f), *lnb_h = rand_floats(&rng, C, -0.2f, 0.2f);
    float *wqkv_h = rand_floats(&rng, C3 * C, -0.3f, 0.3f);
    float *bqkv_h = rand_floats(&rng, C3, -0.1f, 0.1f);
    float *wout_h = rand_floats(&rng, V * C, -0.3f, 0.3f);

    ct_tensor *tokens = tokens_1d(be, N, tok_h), *targets = tokens_1d(be, N, tgt_h);
    ct_tensor *table = tensor_2d(be, dt, V, C, table_h), *wpe = tensor_2d(be, dt, T, C, wpe_h);
    ct_tensor *lnw = tensor_1d(be, dt, C, lnw_h), *lnb = tensor_1d(be, dt, C, lnb_h);
    ct_tensor *wqkv = tensor_2d(be, dt, C3, C, wqkv_h), *bqkv = tensor_1d(be, dt, C3, bqkv_h);
    ct_tensor *wout = tensor_2d(be, dt, V, C, wout_h);

    /* forward */
    ct_tensor *x = tensor_2d(be, dt, N, C, NULL), *h = tensor_2d(be, dt, N, C, NULL);
    ct_tensor *mean = tensor_1d(be, CT_DTYPE_F32, N, NULL);
    ct_tensor *rstd = tensor_1d(be, CT_DTYPE_F32, N, NULL);
    ct_tensor *qkv = tensor_2d(be, dt, N, C3, NULL), *att = tensor_2d(be, dt, N, C, NULL);
    ct_tensor *lse = tensor_1d(be, CT_DTYPE_F32, B * NH * T, NULL);
    ct_tensor *g = tensor_2d(be, dt, N, C, NULL), *logits = tensor_2d(be, dt, N, V, NULL);
    ct_tensor *rowmax = tensor_1d(be, CT_DTYPE_F32, N, NULL);
    ct_tensor *sumexp = tensor_1d(be, CT_DTYPE_F32, N, NULL);
    ct_tensor *target_logit = tensor_1d(be, CT_DTYPE_F32, N, NULL);
    ct_tensor *losses = tensor_1d(be, CT_DTYPE_F32, N, NULL);
    ct_embedding_fwd(x, tokens, table, 0);
    ct_posemb_fwd(x, wpe, B, T, 0);
    ct_layernorm_fwd(h, mean, rstd, x, lnw, lnb);
    ct_bias_init(qkv, bqkv, NULL);
    ct_gemm(qkv, h, wqkv, false, true, 1.0f, 1.0f);
    ct_attention_fwd(att, lse, qkv, B, T, NH, NH);
    ct_gelu_fwd(g, att);
    ct_gemm(logits, g, wout, false, true, 1.0f, 0.0f);
    ct_xent_rowmax(rowmax, logits, V_VALID);
    ct_xent_sumexp(sumexp, target_logit, logits, targets, rowmax, V_VALID, 0, true);
    ct_xent_finish(losses, logits, targets, rowmax, sumexp, target_logit, V_VALID, 0, 1.0f / N,
                   true);

    /* backward (logits now hold dlogits) */
    ct_tensor *dwout = tensor_2d(be, CT_DTYPE_F32, V, C, NULL);
    ct_tensor *dg = tensor_2d(be, dt, N, C, NULL), *datt = tensor_2d(be, dt, N, C, NULL);
    ct_tensor *dbias_fc = tensor_1d(be, CT_DTYPE_F32, C, NULL);
    ct_tensor *dqkv = tensor_2d(be, dt, N, C3, NULL);
    ct_tensor *dbias_qkv = tensor_1d(be, CT_DTYPE_F32, C3, NULL);
    ct_tensor *dh = tensor_2d(be, dt, N, C, NULL), *dx = tensor_2d(be, dt, N, C, NULL);
    ct_tensor *dlnw = tensor_1d(be, CT_DTYPE_F32, C, NULL);
    ct_tensor *dlnb = tensor_1d(be, CT_DTYPE_F32, C, NULL);
    ct_tensor *dtable = tensor_2d(be, CT_DTYPE_F32, V, C, NULL);
    ct_tensor *dwpe = tensor_2d(be, CT_DTYPE_F32, T, C, NULL);
    ct_tensor_zero(dwout), ct_tensor_zero(dbias_fc), ct_tensor_zero(dbias_qkv);
    ct_tensor_zero(dx), ct_tensor_zero(dlnw), ct_tensor_zero(dlnb), ct_tensor_zero(dtable);
    ct_tensor_zero(dwpe);
    ct_gemm(dwout, logits, g, true, false, 1.0f, 1.0f);
    ct_gemm(dg, logits, wout, false, false, 1.0f, 0.0f);
    ct_gelu_bwd(datt, dbias_fc, att, dg);
    ct_attention_bwd(dqkv, dbias_qkv, datt, qkv, att, lse, B, T, NH, NH);
    ct_bias_grad(dbias_qkv, dqkv);
    ct_gemm(dh, dqkv, wqkv, false, false, 1.0f, 0.0f);
    ct_layernorm_bwd(dx, dlnw, dlnb, dh, x, lnw, mean, rstd);
    ct_embedding_bwd(dtable, dx, tokens, 0);
    ct_posemb_bwd(dwpe, dx, B, T, 0);

    /* optimizer on the vocab projection: two segments (one with decay), a gap left alone, and
     * the parameter copy in the model's dtype; hp and segments are reused at once */
    ct_tensor *master = tensor_2d(be, CT_DTYPE_F32, V, C, wout_h);
    ct_tensor *m = tensor_2d(be, CT_DTYPE_F32, V, C, NULL),
              *v = tensor_2d(be, CT_DTYPE_F32, V, C, NULL);
    ct_tensor_zero(m), ct_tensor_zero(v);
    ct_tensor *wout_master = ct_tensor_view_1d(master, 0, V * C);
    ct_tensor *dwout_flat = ct_tensor_view_1d(dwout, 0, V * C);
    ct_tensor *m_flat = ct_tensor_view_1d(m, 0, V * C), *v_flat = ct_tensor_view_1d(v, 0, V * C);
    ct_tensor *wout_flat = ct_tensor_view_1d(wout, 0, V * C);
    ct_adamw_segment seg[2] = {{.offset = 0, .count = 20 * C, .weight_decay = 0.1f},
                               {.offset = 24 * C, .count = 16 * C, .weight_decay = 0.0f}};
    ct_adamw_hparams hp = {
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 0.5f};
    for (int step = 1; step <= 2; step++) {
        hp.step = step;
        ct_adamw(wout_master, dwout_flat, m_flat, v_flat, seg, 2, &hp, wout_flat);
        seg[0].weight_decay = 0.2f; /* the second step decays more: a change the stream must see */
    }
    ct_tensor *sq = tensor_1d(be, CT_DTYPE_F32, 3, NULL);
    ct_tensor_zero(sq);
    ct_tensor *sq_of[2] = {dwout_flat, dtable}; /* one call, two ranges: out[1], out[2] */
    ct_sumsq(sq, 1, sq_of, 2);

    /* a cast, an axpy and a scale, and the memory ops; copy_from_host's source is overwritten
     * right after the call */
    ct_tensor *cast = tensor_2d(be, other, N, C, NULL);
    ct_cast(cast, g);
    ct_axpy(dx, dh, -0.5f);
    ct_scale(dx, 3.0f);
    ct_tensor *filled = tensor_2d(be, dt, 3, 7, NULL), *copied = tensor_2d(be, dt, N, C, NULL);
    ct_tensor_fill(filled, 1.25f);
    ct_tensor_copy(copied, g);
    float staged_h[16];
    for (int i = 0; i < 16; i++) staged_h[i] = (float)i + 0.5f;
    ct_tensor *staged = tensor_1d(be, CT_DTYPE_F32, 16, NULL);
    ct_tensor_from_host(staged, staged_h);
    for (int i = 0; i < 16; i++) staged_h[i] = -1.0f;

    keep(r, "embedding+posemb x", x), keep(r, "layernorm out", h), keep(r, "layernorm mean", mean);
    keep(r, "layernorm rstd", rstd), keep(r, "qkv", qkv), keep(r, "attention out", att);
    keep(r, "attention lse", lse), keep(r, "gelu out", g), keep(r, "xent rowmax", rowmax);
    keep(r, "xent sumexp", sumexp), keep(r, "xent target_logit", target_logit);
    keep(r, "xent losses", losses), keep(r, "dlogits", logits), keep(r, "dwout", dwout);
    keep(r, "dg", dg), keep(r, "gelu_bwd dinp", datt), keep(r, "gelu_bwd dbias", dbias_fc);
    keep(r, "attention dqkv", dqkv), keep(r, "dbias qkv", dbias_qkv), keep(r, "dh", dh);
    keep(r, "layernorm dinp", dx), keep(r, "layernorm dw", dlnw), keep(r, "layernorm db", dlnb);
    keep(r, "embedding dtable", dtable), keep(r, "posemb dwpe", dwpe);
    keep(r, "adamw master", master), keep(r, "adamw m", m), keep(r, "adamw v", v);
    keep(r, "adamw param copy", wout), keep(r, "sumsq", sq), keep(r, "cast", cast);
    keep(r, "fill", filled), keep(r, "copy", copied), keep(r, "copy_from_host", staged);

    ct_tensor *llama[TEST_LLAMA_OUTS]; /* RMSNorm, RoPE and SwiGLU (test_util.h) */
    test_llama_ops(be, dt, llama);
    for (int i = 0; i < TEST_LLAMA_OUTS; i++)
        keep(r, test_llama_out_names[i], llama[i]), ct_tensor_free(llama[i]);

    /* sanity of the sequence itself, so that the comparison is not between two empty runs */
    const float *loss = kept(r, "xent losses");
    for (int i = 0; i < N; i++) assert_true(isfinite(loss[i]) && loss[i] > 0.0f);
    assert_true(((const float *)kept(r, "copy_from_host"))[15] == 15.5f);

    ct_tensor *all[] = {tokens,     targets, table,  wpe,       lnw,      lnb,    wqkv,
                        bqkv,       wout,    x,      h,         mean,     rstd,   qkv,
                        att,        lse,     g,      logits,    rowmax,   sumexp, target_logit,
                        losses,     dwout,   dg,     datt,      dbias_fc, dqkv,   dbias_qkv,
                        dh,         dx,      dlnw,   dlnb,      dtable,   dwpe,   wout_master,
                        dwout_flat, m_flat,  v_flat, wout_flat, master,   m,      v,
                        sq,         cast,    filled, copied,    staged};
    /* views first: a view must not outlive its slab */
    for (size_t i = sizeof all / sizeof all[0]; i-- > 0;)
        if (!all[i]->owns_data) ct_tensor_free(all[i]), all[i] = NULL;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_free(all[i]);
    free(table_h), free(wpe_h), free(lnw_h), free(lnb_h), free(wqkv_h), free(bqkv_h), free(wout_h);
}

static void check_bit_exact(ct_dtype dt) {
    ct_backend *ref = ct_backend_cpu_new(1), *async = async_new();
    assert_string_equal(async->iface->name, "cpu-async");
    run_results want = {0}, got = {0};
    run_sequence(ref, dt, &want);
    run_sequence(async, dt, &got);
    assert_int_equal(want.n, got.n);
    for (int i = 0; i < want.n; i++) {
        assert_int_equal(want.size[i], got.size[i]);
        int64_t at = first_difference(want.bytes[i], got.bytes[i], want.size[i]);
        if (at >= 0)
            fail_msg("%s %s: the stream's result differs from the CPU backend's at byte %lld of "
                     "%zu",
                     ct_dtype_name(dt), want.name[i], (long long)at, want.size[i]);
    }
    /* the comparator can fail: one flipped bit in the last byte of a result is found there */
    unsigned char *b = got.bytes[0];
    b[got.size[0] - 1] ^= 0x01;
    assert_int_equal(first_difference(want.bytes[0], got.bytes[0], want.size[0]),
                     (int64_t)got.size[0] - 1);
    results_release(&want), results_release(&got);
    ct_backend_free(ref), ct_backend_free(async);
}

static void test_bit_exact_f32(void **state) {
    check_bit_exact(CT_DTYPE_F32);
}

static void test_bit_exact_bf16(void **state) {
    check_bit_exact(CT_DTYPE_BF16);
}

/* ---- 2. laziness ------------------------------------------------------------------------------
 */

static void test_laziness(void **state) {
    ct_backend *be = async_new();
    ct_tensor *t = tensor_1d(be, CT_DTYPE_F32, 8, NULL), *u = tensor_1d(be, CT_DTYPE_F32, 8, NULL);
    ct_tensor_fill(t, 1.0f), ct_tensor_fill(u, 1.0f);
    ct_backend_sync(be);
    assert_true(raw_f32(t, 0) == 1.0f && raw_f32(u, 7) == 1.0f);

    /* an op without a wait leaves memory as it was, every time; sync makes it visible */
    ct_tensor_fill(t, 3.0f);
    assert_true(raw_f32(t, 0) == 1.0f && raw_f32(t, 7) == 1.0f);
    ct_backend_sync(be);
    assert_true(raw_f32(t, 0) == 3.0f && raw_f32(t, 7) == 3.0f);

    /* event_wait runs up to the event, not past it: A before the record, B after */
    ct_tensor_fill(t, 5.0f);            /* A */
    ct_backend_event_record(be, 2);     /* */
    ct_scale(u, 7.0f);                  /* B */
    assert_true(raw_f32(t, 0) == 3.0f); /* nothing has run yet */
    ct_backend_event_wait(be, 2);
    assert_true(raw_f32(t, 0) == 5.0f && raw_f32(u, 0) == 1.0f);
    ct_backend_event_wait(be, 2); /* again: nothing more runs */
    assert_true(raw_f32(u, 0) == 1.0f);
    /* recording again moves the event to the current point */
    ct_backend_event_record(be, 2);
    ct_backend_event_wait(be, 2);
    assert_true(raw_f32(u, 0) == 7.0f);

    /* an event never recorded is waited for at once, and runs nothing */
    ct_tensor_fill(t, 9.0f);
    ct_backend_event_wait(be, 11);
    assert_true(raw_f32(t, 0) == 5.0f);
    /* copy_to_host waits for everything before it */
    float host[8];
    ct_tensor_to_host(host, t);
    assert_true(host[0] == 9.0f && raw_f32(t, 0) == 9.0f);

    /* freeing memory waits too (the ops before it may use it) */
    ct_tensor *w = tensor_1d(be, CT_DTYPE_F32, 8, NULL);
    ct_tensor_fill(t, 11.0f);
    ct_tensor_free(w);
    assert_true(raw_f32(t, 0) == 11.0f);

    /* copy_from_host is queued like any op: the new bytes arrive at the next wait */
    float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    ct_tensor_from_host(u, ones);
    assert_true(raw_f32(u, 0) == 7.0f);
    ct_backend_sync(be);
    assert_true(raw_f32(u, 0) == 1.0f);

    ct_tensor_free(t), ct_tensor_free(u);
    ct_backend_free(be);
}

/* ---- 3. host structures are copied ------------------------------------------------------------
 */

static void test_host_structs_copied(void **state) {
    enum { N = 300 };
    uint64_t rng = 0xADA3ull;
    float *p_h = rand_floats(&rng, N, -1, 1), *g_h = rand_floats(&rng, N, -1, 1);
    float want[N], got[N];
    for (int k = 0; k < 2; k++) {
        ct_backend *be = k == 0 ? ct_backend_cpu_new(1) : async_new();
        ct_tensor *p = tensor_1d(be, CT_DTYPE_F32, N, p_h),
                  *g = tensor_1d(be, CT_DTYPE_F32, N, g_h);
        ct_tensor *m = tensor_1d(be, CT_DTYPE_F32, N, NULL),
                  *v = tensor_1d(be, CT_DTYPE_F32, N, NULL);
        ct_tensor_zero(m), ct_tensor_zero(v);
        ct_adamw_segment seg[2] = {{.offset = 0, .count = 100, .weight_decay = 0.1f},
                                   {.offset = 150, .count = 150, .weight_decay = 0.0f}};
        ct_adamw_hparams hp = {.lr = 1e-2f,
                               .beta1 = 0.9f,
                               .beta2 = 0.95f,
                               .eps = 1e-8f,
                               .step = 3,
                               .grad_scale = 1.0f};
        ct_adamw(p, g, m, v, seg, 2, &hp, NULL);
        /* the caller reuses both at once; on the stream the update has not run yet */
        hp.lr = 100.0f, hp.step = 1, hp.grad_scale = 0.0f;
        seg[0].count = 0, seg[1].offset = 0, seg[1].weight_decay = 5.0f;
        ct_tensor_to_host(k == 0 ? want : got, p);
        ct_tensor_free(p), ct_tensor_free(g), ct_tensor_free(m), ct_tensor_free(v);
        ct_backend_free(be);
    }
    assert_int_equal(first_difference(want, got, sizeof want), -1);
    assert_true(want[0] != p_h[0] && want[120] == p_h[120]); /* updated inside, not in the gap */
    free(p_h), free(g_h);
}

/* ---- 4. a queue longer than the capacity -------------------------------------------------------
 */

static void test_long_queue(void **state) {
    enum { N = 64, OPS = 10000 };
    ct_backend *be = async_new();
    ct_tensor *acc = tensor_1d(be, CT_DTYPE_F32, N, NULL),
              *one = tensor_1d(be, CT_DTYPE_F32, N, NULL);
    ct_tensor_zero(acc), ct_tensor_fill(one, 1.0f);
    ct_backend_sync(be);
    /* integers below 2^24 add exactly, so the count is the value; order shows in the last op */
    for (int i = 0; i < OPS; i++) ct_axpy(acc, one, 1.0f);
    ct_scale(acc, 0.5f);
    /* a full queue ran (in order, as a whole), the rest still waits for the host */
    float raw = raw_f32(acc, 0);
    assert_true(raw > 0.0f && raw < (float)OPS && raw == floorf(raw));
    float host[N];
    ct_tensor_to_host(host, acc);
    for (int i = 0; i < N; i++) assert_true(host[i] == 0.5f * OPS);
    ct_tensor_free(acc), ct_tensor_free(one);
    ct_backend_free(be);
}

/* ---- 5. complete tables -----------------------------------------------------------------------
 */

/* The required ops of backend_ops.h, from the list itself: name and slot offset. */
typedef struct op_slot {
    const char *name;
    size_t offset;
    bool optional;
} op_slot;
#define IS_OPTIONAL_CT_OP_REQUIRED false
#define IS_OPTIONAL_CT_OP_OPTIONAL true
#define IS_OPTIONAL_CT_OP_FEATURE true
#define OP_SLOT_(name, need, queue, ...)                                                           \
    {#name, offsetof(struct ct_backend_i, name), IS_OPTIONAL_##need},
static const op_slot op_slots[] = {CT_BACKEND_OPS(OP_SLOT_)};
#undef OP_SLOT_

static void test_tables_complete(void **state) {
    char chosen[256];
    const char *names[] = {"cpu", "cpu-async"};
    for (int i = 0; i < 2; i++) {
        ct_backend *be = NULL;
        assert_int_equal(ct_backend_new(&be, names[i], 1, chosen, sizeof chosen), CT_OK);
        assert_null(ct_backend_missing_op(be->iface));
        ct_backend_free(be);
    }
    ct_backend *checked = ct_backend_check_new(ct_backend_cpu_new(1));
    assert_null(ct_backend_missing_op(checked->iface));
    ct_backend_free(checked);

    /* each required op, taken out of the CPU backend's table, is the one named; an optional one
     * (the CPU backend has no gemm_bias_gelu) is not missing */
    ct_backend *cpu = ct_backend_cpu_new(1);
    int n_required = 0;
    for (size_t i = 0; i < sizeof op_slots / sizeof op_slots[0]; i++) {
        struct ct_backend_i table = *cpu->iface;
        memset((char *)&table + op_slots[i].offset, 0, sizeof(void (*)(void)));
        const char *missing = ct_backend_missing_op(&table);
        if (op_slots[i].optional) {
            assert_null(missing);
            continue;
        }
        assert_non_null(missing);
        assert_string_equal(missing, op_slots[i].name);
        n_required++;
    }
    assert_true(n_required >= 24); /* GPT-2's ops at least: the list was walked */
    struct ct_backend_i no_free = *cpu->iface;
    no_free.free = NULL;
    assert_string_equal(ct_backend_missing_op(&no_free), "free");
    ct_backend_free(cpu);
}

/* A registered backend whose table lacks gemm: ct_backend_new must stop (a bug in the backend)
 * and name the slot. Runs in a child process, which aborts. */
static struct ct_backend_i gemmless;

static ct_backend *create_gemmless(int n_threads) {
    ct_backend *be = ct_backend_cpu_new(n_threads);
    gemmless = *be->iface;
    gemmless.name = "gemmless";
    gemmless.gemm = NULL;
    be->iface = &gemmless;
    return be;
}

/* The child: asks the registry for the gemmless backend (exits 0 only if it is handed out). */
static void make_gemmless(void *arg) {
    (void)arg;
    ct_backend_register(&(ct_backend_desc){.name = "gemmless", .create = create_gemmless});
    char chosen[256];
    ct_backend *be = NULL;
    ct_backend_new(&be, "gemmless", 1, chosen, sizeof chosen);
    _exit(0); /* not reached when the registry checks */
}

static void test_registry_refuses_incomplete(void **state) {
    char err[4096];
    int status = test_run_captured(make_gemmless, NULL, err, sizeof err);
    if (!(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0)))
        fail_msg("the registry made a backend without gemm; stderr:\n%s", err);
    if (!strstr(err, "gemmless") || !strstr(err, "'gemm'"))
        fail_msg("the report does not name the backend and the slot:\n%s", err);
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_exact_f32),
        cmocka_unit_test(test_bit_exact_bf16),
        cmocka_unit_test(test_laziness),
        cmocka_unit_test(test_host_structs_copied),
        cmocka_unit_test(test_long_queue),
        cmocka_unit_test(test_tables_complete),
        cmocka_unit_test(test_registry_refuses_incomplete),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
