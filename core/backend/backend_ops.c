/*
 * backend_ops.c — the ct_* op wrappers of backend.h, one per op of backend_ops.h, and --profile's
 * timing around them. Every wrapper checks dtypes and shapes with CT_ASSERTF (a mismatch is a bug
 * in the caller, and the message quotes the shapes involved), then hands raw pointers and sizes
 * to the backend's slot. Ops that are 2-D treat an N-D tensor as (rows = product of leading dims,
 * cols = last dim). Nothing here touches tensor memory: that is the slot's job.
 */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SH(t) ct_tensor_shape_str(t)

/* ---- op wrappers -------------------------------------------------------------------------- */

#define ROWS(t) ct_tensor_rows(t)
#define COLS(t) ct_tensor_cols(t)
#define F32(t) ((float *)(t)->data)
#define DATA(t) ((t)->data)
#define DT(t) ((t)->dtype)
#define I32(t) ((const int32_t *)(t)->data)
#define IFACE(t) ((t)->backend->iface)

/* Op timing for --profile: wall time around the slot. Exact on the CPU backend, whose ops are
 * synchronous; an asynchronous backend is synced first while profiling. And the device-idle
 * audit's marks around the slot (backend.h, ct_backend_idle). By op: __func__ of the wrapper,
 * "ct_" dropped, one static string per function (ct_prof_op_add finds it by its address). */
static const char *op_name(const char *fn) {
    return strncmp(fn, "ct_", 3) == 0 ? fn + 3 : fn;
}

static double prof_start(const ct_tensor *t, const char *fn) {
    ct_backend_idle_begin(t->backend, op_name(fn));
    return t->backend->profiling ? ct_now() : 0.0;
}

static void prof_record(const ct_tensor *t, ct_prof_category category, double t0, const char *fn) {
    ct_backend *be = t->backend;
    const char *name = op_name(fn);
    ct_backend_idle_end(be);
    if (!be->profiling) return;
    if (be->iface->sync) be->iface->sync(be->ctx);
    const double dt = ct_now() - t0;
    be->prof_seconds[category] += dt;
    ct_prof_op_add(be->prof_ops, &be->n_prof_ops, name, dt);
}
#define CTX(t) ((t)->backend->ctx)

/* A GEMM's shape, for the device-idle audit's by-shape lines (ct_backend_idle_gemm). */
typedef struct gemm_shape {
    int64_t M, N, K;
    bool trans_a, trans_b, accumulate;
    ct_dtype ab, c;
} gemm_shape;

/* The end of every wrapper, one function per op of the list (backend_ops.h): the slot of the
 * anchor tensor's backend called with the op's arguments, inside the profile's and the device-idle
 * audit's brackets, its time counted under `category` and the calling wrapper's name (fn, its
 * __func__). A GEMM also gives its shape to the audit (shape; NULL for other ops). */
#define OP_CALL_(name, need, queue, ...)                                                           \
    static inline void op_call_##name(const ct_tensor *anchor, ct_prof_category category,          \
                                      const char *fn, const gemm_shape *shape,                     \
                                      CT_OP_PARAMS(__VA_ARGS__)) {                                 \
        const double t0 = prof_start(anchor, fn);                                                  \
        if (shape)                                                                                 \
            ct_backend_idle_gemm(anchor->backend, shape->M, shape->N, shape->K, shape->trans_a,    \
                                 shape->trans_b, shape->accumulate, shape->ab, shape->c);          \
        IFACE(anchor)->name(CTX(anchor), CT_OP_NAMES(__VA_ARGS__));                                \
        prof_record(anchor, category, t0, fn);                                                     \
    }
CT_BACKEND_OPS(OP_CALL_)
#undef OP_CALL_

/* A wrapper's last line: OP_CALL(op, anchor, category, the slot's arguments after ctx); a GEMM's
 * GEMM_CALL(op, anchor, &shape, ...), timed as CT_PROF_GEMM. */
#define OP_CALL(name, anchor, category, ...)                                                       \
    op_call_##name((anchor), (category), __func__, NULL, __VA_ARGS__)
#define GEMM_CALL(name, anchor, shape, ...)                                                        \
    op_call_##name((anchor), CT_PROF_GEMM, __func__, (shape), __VA_ARGS__)

static void check_f32(const ct_tensor *t, const char *what) {
    CT_ASSERTF(t != NULL, "%s is NULL", what);
    CT_ASSERTF(t->dtype == CT_DTYPE_F32, "%s must be f32, got %s", what, SH(t));
}

/* An activation or parameter operand: f32 or bf16. */
static void check_float(const ct_tensor *t, const char *what) {
    CT_ASSERTF(t != NULL, "%s is NULL", what);
    CT_ASSERTF(t->dtype == CT_DTYPE_F32 || t->dtype == CT_DTYPE_BF16,
               "%s must be f32 or bf16, got %s", what, SH(t));
}

/* Another activation or parameter operand of the same op: same dtype as `ref`. */
static void check_like(const ct_tensor *t, const ct_tensor *ref, const char *what) {
    CT_ASSERTF(t != NULL, "%s is NULL", what);
    CT_ASSERTF(t->dtype == ref->dtype, "%s must be %s like the op's other operands, got %s", what,
               ct_dtype_name(ref->dtype), SH(t));
}

static void check_i32(const ct_tensor *t, const char *what) {
    CT_ASSERTF(t != NULL, "%s is NULL", what);
    CT_ASSERTF(t->dtype == CT_DTYPE_I32, "%s must be i32, got %s", what, SH(t));
}

static void check_same_backend(const ct_tensor *a, const ct_tensor *b) {
    CT_ASSERTF(a->backend == b->backend, "tensors %s and %s live on different backends", SH(a),
               SH(b));
}

void ct_gemm(ct_tensor *C, const ct_tensor *A, const ct_tensor *B, bool trans_a, bool trans_b,
             float alpha, float beta) {
    check_float(A, "gemm A");
    check_like(B, A, "gemm B");
    check_float(C, "gemm C");
    CT_ASSERTF(C->dtype == CT_DTYPE_F32 || A->dtype == CT_DTYPE_BF16,
               "gemm: a bf16 C needs bf16 A and B, got A %s, C %s", SH(A), SH(C));
    check_same_backend(C, A);
    check_same_backend(C, B);
    int64_t M = ROWS(C), N = COLS(C);
    int64_t a_rows = ROWS(A), a_cols = COLS(A), b_rows = ROWS(B), b_cols = COLS(B);
    int64_t K = trans_a ? a_rows : a_cols;
    CT_ASSERTF((trans_a ? a_cols : a_rows) == M && (trans_b ? b_cols : b_rows) == K &&
                   (trans_b ? b_rows : b_cols) == N,
               "gemm shapes: C %s = op(A %s)%s · op(B %s)%s", SH(C), SH(A), trans_a ? "^T" : "",
               SH(B), trans_b ? "^T" : "");
    const gemm_shape shape = {M, N, K, trans_a, trans_b, beta != 0.0f, DT(A), DT(C)};
    GEMM_CALL(gemm, C, &shape, trans_a, trans_b, M, N, K, alpha, DATA(A), a_cols, DATA(B), b_cols,
              beta, DATA(C), N, DT(A), DT(C));
}

void ct_gemm_grouped(int count, ct_tensor *const *C, const ct_tensor *const *A,
                     const ct_tensor *const *B, bool trans_a, bool trans_b, float alpha,
                     float beta) {
    if (count <= 0) return;
    ct_tensor *C0 = C[0];
    if (!IFACE(C0)->gemm_grouped || count == 1) {
        for (int i = 0; i < count; i++)
            if (ct_tensor_rows(C[i]) * ct_tensor_cols(C[i]) > 0)
                ct_gemm(C[i], A[i], B[i], trans_a, trans_b, alpha, beta);
        return;
    }
    int64_t *mnk = ct_xmalloc((size_t)count * 3 * sizeof *mnk);
    void **ptrs = ct_xmalloc((size_t)count * 3 * sizeof *ptrs);
    int n = 0;
    for (int i = 0; i < count; i++) {
        check_float(A[i], "gemm_grouped A");
        check_like(B[i], A[0], "gemm_grouped B");
        check_like(A[i], A[0], "gemm_grouped A");
        check_like(C[i], C0, "gemm_grouped C");
        check_same_backend(C0, A[i]);
        check_same_backend(C0, B[i]);
        check_same_backend(C0, C[i]);
        const int64_t M = ROWS(C[i]), N = COLS(C[i]);
        const int64_t K = trans_a ? ROWS(A[i]) : COLS(A[i]);
        CT_ASSERTF((trans_a ? COLS(A[i]) : ROWS(A[i])) == M &&
                       (trans_b ? COLS(B[i]) : ROWS(B[i])) == K &&
                       (trans_b ? ROWS(B[i]) : COLS(B[i])) == N,
                   "gemm_grouped shapes (GEMM %d): C %s = op(A %s)%s · op(B %s)%s", i, SH(C[i]),
                   SH(A[i]), trans_a ? "^T" : "", SH(B[i]), trans_b ? "^T" : "");
        if (M * N == 0) continue;
        if (K == 0) { /* C = beta·C: the plain op says what that means */
            ct_gemm(C[i], A[i], B[i], trans_a, trans_b, alpha, beta);
            continue;
        }
        mnk[3 * n] = M, mnk[3 * n + 1] = N, mnk[3 * n + 2] = K;
        ptrs[3 * n] = DATA(A[i]), ptrs[3 * n + 1] = DATA(B[i]), ptrs[3 * n + 2] = DATA(C[i]);
        n++;
    }
    if (n > 0) {
        CT_ASSERTF(C0->dtype == CT_DTYPE_F32 || A[0]->dtype == CT_DTYPE_BF16,
                   "gemm_grouped: a bf16 C needs bf16 A and B, got A %s, C %s", SH(A[0]), SH(C0));
        OP_CALL(gemm_grouped, C0, CT_PROF_GEMM, n, trans_a, trans_b, mnk, alpha, ptrs, beta,
                DT(A[0]), DT(C0));
    }
    free(mnk);
    free(ptrs);
}

void ct_gemm_bias_gelu(ct_tensor *pre, ct_tensor *out, const ct_tensor *x, const ct_tensor *w,
                       const ct_tensor *b) {
    check_float(x, "gemm_bias_gelu x");
    check_like(w, x, "gemm_bias_gelu w");
    check_like(b, x, "gemm_bias_gelu b");
    check_like(pre, x, "gemm_bias_gelu pre");
    check_like(out, x, "gemm_bias_gelu out");
    check_same_backend(pre, x);
    check_same_backend(pre, w);
    check_same_backend(pre, b);
    check_same_backend(pre, out);
    int64_t M = ROWS(pre), N = COLS(pre), K = COLS(x);
    CT_ASSERTF(ROWS(x) == M && ROWS(w) == N && COLS(w) == K && b->numel == N && ROWS(out) == M &&
                   COLS(out) == N,
               "gemm_bias_gelu shapes: pre %s, out %s = GELU(x %s · w %s^T + b %s)", SH(pre),
               SH(out), SH(x), SH(w), SH(b));
    if (!IFACE(pre)->gemm_bias_gelu) {
        ct_bias_init(pre, b, NULL);
        ct_gemm(pre, x, w, false, true, 1.0f, 1.0f);
        ct_gelu_fwd(out, pre);
        return;
    }
    const gemm_shape shape = {M, N, K, false, true, false, DT(x), DT(pre)};
    GEMM_CALL(gemm_bias_gelu, pre, &shape, M, N, K, DATA(x), K, DATA(w), K, DATA(b), DATA(pre), N,
              DATA(out), N, DT(pre));
}

void ct_gemm_bias(ct_tensor *out, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b) {
    check_float(x, "gemm_bias x");
    check_like(w, x, "gemm_bias w");
    check_like(b, x, "gemm_bias b");
    check_like(out, x, "gemm_bias out");
    check_same_backend(out, x);
    check_same_backend(out, w);
    check_same_backend(out, b);
    int64_t M = ROWS(out), N = COLS(out), K = COLS(x);
    CT_ASSERTF(ROWS(x) == M && ROWS(w) == N && COLS(w) == K && b->numel == N,
               "gemm_bias shapes: out %s = x %s · w %s^T + b %s", SH(out), SH(x), SH(w), SH(b));
    if (!IFACE(out)->gemm_bias_gelu) {
        ct_bias_init(out, b, NULL);
        ct_gemm(out, x, w, false, true, 1.0f, 1.0f);
        return;
    }
    const gemm_shape shape = {M, N, K, false, true, false, DT(x), DT(out)};
    GEMM_CALL(gemm_bias_gelu, out, &shape, M, N, K, DATA(x), K, DATA(w), K, DATA(b), DATA(out), N,
              NULL, N, DT(out));
}

void ct_bias_add(ct_tensor *out, const ct_tensor *bias) {
    check_float(out, "bias_add out");
    check_like(bias, out, "bias_add bias");
    check_same_backend(out, bias);
    CT_ASSERTF(bias->numel == COLS(out), "bias_add: bias %s does not match out %s", SH(bias),
               SH(out));
    OP_CALL(bias_add, out, CT_PROF_ELEMENTWISE, DT(out), DATA(out), DATA(bias), ROWS(out),
            COLS(out));
}

void ct_bias_init(ct_tensor *out, const ct_tensor *bias, const ct_tensor *residual) {
    check_float(out, "bias_init out");
    check_like(bias, out, "bias_init bias");
    check_same_backend(out, bias);
    CT_ASSERTF(bias->numel == COLS(out), "bias_init: bias %s does not match out %s", SH(bias),
               SH(out));
    if (residual) {
        check_like(residual, out, "bias_init residual");
        check_same_backend(out, residual);
        CT_ASSERTF(residual->numel == out->numel, "bias_init: residual %s does not match out %s",
                   SH(residual), SH(out));
    }
    OP_CALL(bias_init, out, CT_PROF_ELEMENTWISE, DT(out), DATA(out), DATA(bias),
            residual ? DATA(residual) : NULL, ROWS(out), COLS(out));
}

void ct_bias_grad(ct_tensor *dbias, const ct_tensor *dout) {
    check_f32(dbias, "bias_grad dbias");
    check_float(dout, "bias_grad dout");
    check_same_backend(dbias, dout);
    CT_ASSERTF(dbias->numel == COLS(dout), "bias_grad: dbias %s does not match dout %s", SH(dbias),
               SH(dout));
    OP_CALL(bias_grad, dout, CT_PROF_ELEMENTWISE, DT(dout), F32(dbias), DATA(dout), ROWS(dout),
            COLS(dout));
}

void ct_axpy(ct_tensor *dst, const ct_tensor *src, float alpha) {
    check_float(dst, "axpy dst");
    check_like(src, dst, "axpy src");
    check_same_backend(dst, src);
    CT_ASSERTF(dst->numel == src->numel, "axpy: dst %s and src %s differ in size", SH(dst),
               SH(src));
    OP_CALL(axpy, dst, CT_PROF_ELEMENTWISE, DT(dst), DATA(dst), DATA(src), alpha, dst->numel);
}

void ct_scale(ct_tensor *x, float s) {
    check_float(x, "scale x");
    OP_CALL(scale, x, CT_PROF_ELEMENTWISE, DT(x), DATA(x), s, x->numel);
}

void ct_gather_rows(ct_tensor *out, const ct_tensor *in, const ct_tensor *idx, const ct_tensor *w,
                    int64_t k) {
    check_float(out, "gather_rows out");
    check_like(in, out, "gather_rows in");
    check_i32(idx, "gather_rows idx");
    check_same_backend(out, in);
    check_same_backend(out, idx);
    CT_ASSERTF(k >= 1 && idx->numel == ROWS(out) * k && COLS(in) == COLS(out),
               "gather_rows: out %s, in %s, idx %s, k %lld (idx must hold k per row of out)",
               SH(out), SH(in), SH(idx), (long long)k);
    if (w) {
        check_f32(w, "gather_rows w");
        check_same_backend(out, w);
        CT_ASSERTF(w->numel == idx->numel, "gather_rows: w %s, idx %s", SH(w), SH(idx));
    }
    OP_CALL(gather_rows, out, CT_PROF_ELEMENTWISE, DT(out), DATA(out), DATA(in), I32(idx),
            w ? F32(w) : NULL, ROWS(out), k, COLS(out), ROWS(in));
}

void ct_gather_dot(ct_tensor *out, const ct_tensor *a, const ct_tensor *ia, const ct_tensor *b,
                   const ct_tensor *ib) {
    check_f32(out, "gather_dot out");
    check_float(a, "gather_dot a");
    check_like(b, a, "gather_dot b");
    check_i32(ia, "gather_dot ia");
    check_i32(ib, "gather_dot ib");
    check_same_backend(out, a);
    check_same_backend(out, b);
    check_same_backend(out, ia);
    check_same_backend(out, ib);
    CT_ASSERTF(ia->numel == out->numel && ib->numel == out->numel && COLS(a) == COLS(b),
               "gather_dot: out %s, a %s, ia %s, b %s, ib %s", SH(out), SH(a), SH(ia), SH(b),
               SH(ib));
    OP_CALL(gather_dot, out, CT_PROF_ELEMENTWISE, DT(a), F32(out), DATA(a), I32(ia), DATA(b),
            I32(ib), out->numel, COLS(a), ROWS(a), ROWS(b));
}

void ct_embedding_fwd(ct_tensor *out, const ct_tensor *tokens, const ct_tensor *table,
                      int64_t row_offset) {
    check_float(out, "embedding_fwd out");
    check_i32(tokens, "embedding_fwd tokens");
    check_like(table, out, "embedding_fwd table");
    check_same_backend(out, tokens);
    check_same_backend(out, table);
    CT_ASSERTF(ROWS(out) == tokens->numel && COLS(out) == COLS(table),
               "embedding_fwd: out %s, tokens %s, table %s (out must be (tokens, table cols))",
               SH(out), SH(tokens), SH(table));
    CT_ASSERTF(row_offset >= 0, "embedding_fwd: row_offset %lld < 0", (long long)row_offset);
    OP_CALL(embedding_fwd, out, CT_PROF_EMBEDDING, DT(out), DATA(out), I32(tokens), DATA(table),
            ROWS(out), COLS(out), ROWS(table), row_offset);
}

void ct_embedding_bwd(ct_tensor *dtable, const ct_tensor *dout, const ct_tensor *tokens,
                      int64_t row_offset) {
    check_f32(dtable, "embedding_bwd dtable");
    check_float(dout, "embedding_bwd dout");
    check_i32(tokens, "embedding_bwd tokens");
    check_same_backend(dtable, dout);
    check_same_backend(dtable, tokens);
    CT_ASSERTF(ROWS(dout) == tokens->numel && COLS(dout) == COLS(dtable),
               "embedding_bwd: dout %s, tokens %s, dtable %s", SH(dout), SH(tokens), SH(dtable));
    CT_ASSERTF(row_offset >= 0, "embedding_bwd: row_offset %lld < 0", (long long)row_offset);
    OP_CALL(embedding_bwd, dout, CT_PROF_EMBEDDING, DT(dout), F32(dtable), DATA(dout), I32(tokens),
            ROWS(dout), COLS(dout), ROWS(dtable), row_offset);
}

void ct_posemb_fwd(ct_tensor *out, const ct_tensor *wpe, int64_t B, int64_t T, int64_t pos_offset) {
    check_float(out, "posemb_fwd out");
    check_like(wpe, out, "posemb_fwd wpe");
    check_same_backend(out, wpe);
    int64_t C = COLS(out);
    CT_ASSERTF(B >= 0 && T >= 0 && out->numel == B * T * C && COLS(wpe) == C,
               "posemb_fwd: out %s is not (B=%lld, T=%lld, C) or wpe %s has another C", SH(out),
               (long long)B, (long long)T, SH(wpe));
    CT_ASSERTF(pos_offset >= 0 && pos_offset + T <= ROWS(wpe),
               "posemb_fwd: positions [%lld, %lld) outside wpe %s", (long long)pos_offset,
               (long long)(pos_offset + T), SH(wpe));
    OP_CALL(posemb_fwd, out, CT_PROF_EMBEDDING, DT(out), DATA(out), DATA(wpe), B, T, C, pos_offset);
}

void ct_posemb_bwd(ct_tensor *dwpe, const ct_tensor *dout, int64_t B, int64_t T,
                   int64_t pos_offset) {
    check_f32(dwpe, "posemb_bwd dwpe");
    check_float(dout, "posemb_bwd dout");
    check_same_backend(dwpe, dout);
    int64_t C = COLS(dout);
    CT_ASSERTF(B >= 0 && T >= 0 && dout->numel == B * T * C && COLS(dwpe) == C,
               "posemb_bwd: dout %s is not (B=%lld, T=%lld, C) or dwpe %s has another C", SH(dout),
               (long long)B, (long long)T, SH(dwpe));
    CT_ASSERTF(pos_offset >= 0 && pos_offset + T <= ROWS(dwpe),
               "posemb_bwd: positions [%lld, %lld) outside dwpe %s", (long long)pos_offset,
               (long long)(pos_offset + T), SH(dwpe));
    OP_CALL(posemb_bwd, dout, CT_PROF_EMBEDDING, DT(dout), F32(dwpe), DATA(dout), B, T, C,
            pos_offset);
}

/* The residual, when given, is added to inp in place before the norm: same shape and dtype. */
static void check_residual(const ct_tensor *residual, const ct_tensor *inp, const char *what) {
    if (!residual) return;
    check_like(residual, inp, what);
    check_same_backend(residual, inp);
    CT_ASSERTF(residual->numel == inp->numel && COLS(residual) == COLS(inp), "%s %s, inp %s", what,
               SH(residual), SH(inp));
}

/* The slot's wrapper, with or without the residual; named after the slot (the profile's name). */
static void layernorm_fwd(ct_tensor *out, ct_tensor *mean, ct_tensor *rstd, ct_tensor *inp,
                          const ct_tensor *residual, const ct_tensor *w, const ct_tensor *b) {
    check_float(inp, "layernorm_fwd inp");
    check_like(out, inp, "layernorm_fwd out");
    check_f32(mean, "layernorm_fwd mean");
    check_f32(rstd, "layernorm_fwd rstd");
    check_like(w, inp, "layernorm_fwd w");
    check_like(b, inp, "layernorm_fwd b");
    check_same_backend(out, inp);
    check_residual(residual, inp, "layernorm_fwd residual");
    int64_t N = ROWS(inp), C = COLS(inp);
    CT_ASSERTF(ROWS(out) == N && COLS(out) == C && mean->numel == N && rstd->numel == N &&
                   w->numel == C && b->numel == C,
               "layernorm_fwd: out %s, mean %s, rstd %s, inp %s, w %s, b %s", SH(out), SH(mean),
               SH(rstd), SH(inp), SH(w), SH(b));
    OP_CALL(layernorm_fwd, inp, CT_PROF_NORM, DT(inp), DATA(out), F32(mean), F32(rstd), DATA(inp),
            residual ? DATA(residual) : NULL, DATA(w), DATA(b), N, C);
}

void ct_layernorm_fwd(ct_tensor *out, ct_tensor *mean, ct_tensor *rstd, const ct_tensor *inp,
                      const ct_tensor *w, const ct_tensor *b) {
    layernorm_fwd(out, mean, rstd, (ct_tensor *)inp, NULL, w, b); /* no residual: inp only read */
}

void ct_layernorm_add_fwd(ct_tensor *out, ct_tensor *mean, ct_tensor *rstd, ct_tensor *inp,
                          const ct_tensor *residual, const ct_tensor *w, const ct_tensor *b) {
    layernorm_fwd(out, mean, rstd, inp, residual, w, b);
}

void ct_layernorm_bwd(ct_tensor *dinp, ct_tensor *dw, ct_tensor *db, const ct_tensor *dout,
                      const ct_tensor *inp, const ct_tensor *w, const ct_tensor *mean,
                      const ct_tensor *rstd) {
    check_float(inp, "layernorm_bwd inp");
    check_like(dinp, inp, "layernorm_bwd dinp");
    check_f32(dw, "layernorm_bwd dw");
    check_f32(db, "layernorm_bwd db");
    check_like(dout, inp, "layernorm_bwd dout");
    check_like(w, inp, "layernorm_bwd w");
    check_f32(mean, "layernorm_bwd mean");
    check_f32(rstd, "layernorm_bwd rstd");
    check_same_backend(dinp, inp);
    int64_t N = ROWS(inp), C = COLS(inp);
    CT_ASSERTF(ROWS(dinp) == N && COLS(dinp) == C && ROWS(dout) == N && COLS(dout) == C &&
                   dw->numel == C && db->numel == C && w->numel == C && mean->numel == N &&
                   rstd->numel == N,
               "layernorm_bwd: dinp %s, dw %s, db %s, dout %s, inp %s, w %s, mean %s, rstd %s",
               SH(dinp), SH(dw), SH(db), SH(dout), SH(inp), SH(w), SH(mean), SH(rstd));
    OP_CALL(layernorm_bwd, inp, CT_PROF_NORM, DT(inp), DATA(dinp), F32(dw), F32(db), DATA(dout),
            DATA(inp), DATA(w), F32(mean), F32(rstd), N, C);
}

void ct_gelu_fwd(ct_tensor *out, const ct_tensor *inp) {
    check_float(inp, "gelu_fwd inp");
    check_like(out, inp, "gelu_fwd out");
    check_same_backend(out, inp);
    CT_ASSERTF(out->numel == inp->numel, "gelu_fwd: out %s, inp %s", SH(out), SH(inp));
    OP_CALL(gelu_fwd, inp, CT_PROF_ELEMENTWISE, DT(inp), DATA(out), DATA(inp), inp->numel);
}

void ct_gelu_bwd(ct_tensor *dinp, ct_tensor *dbias, const ct_tensor *inp, const ct_tensor *dout) {
    check_float(inp, "gelu_bwd inp");
    check_like(dinp, inp, "gelu_bwd dinp");
    check_like(dout, inp, "gelu_bwd dout");
    check_same_backend(dinp, inp);
    CT_ASSERTF(dinp->numel == inp->numel && dout->numel == inp->numel,
               "gelu_bwd: dinp %s, inp %s, dout %s", SH(dinp), SH(inp), SH(dout));
    int64_t N = inp->numel, C = 1;
    if (dbias) {
        check_f32(dbias, "gelu_bwd dbias");
        check_same_backend(dbias, inp);
        CT_ASSERTF(dbias->numel == COLS(inp), "gelu_bwd: dbias %s does not match inp %s", SH(dbias),
                   SH(inp));
        N = ROWS(inp), C = COLS(inp);
    }
    OP_CALL(gelu_bwd, inp, CT_PROF_ELEMENTWISE, DT(inp), DATA(dinp), dbias ? F32(dbias) : NULL,
            DATA(inp), DATA(dout), N, C);
}

static void rmsnorm_fwd(ct_tensor *out, ct_tensor *rstd, ct_tensor *inp, const ct_tensor *residual,
                        const ct_tensor *w, float eps) {
    check_float(inp, "rmsnorm_fwd inp");
    check_like(out, inp, "rmsnorm_fwd out");
    check_f32(rstd, "rmsnorm_fwd rstd");
    check_like(w, inp, "rmsnorm_fwd w");
    check_same_backend(out, inp);
    check_residual(residual, inp, "rmsnorm_fwd residual");
    int64_t N = ROWS(inp), C = COLS(inp);
    CT_ASSERTF(ROWS(out) == N && COLS(out) == C && rstd->numel == N && w->numel == C && eps >= 0.0f,
               "rmsnorm_fwd: out %s, rstd %s, inp %s, w %s, eps %g", SH(out), SH(rstd), SH(inp),
               SH(w), (double)eps);
    OP_CALL(rmsnorm_fwd, inp, CT_PROF_NORM, DT(inp), DATA(out), F32(rstd), DATA(inp),
            residual ? DATA(residual) : NULL, DATA(w), N, C, eps);
}

void ct_rmsnorm_fwd(ct_tensor *out, ct_tensor *rstd, const ct_tensor *inp, const ct_tensor *w,
                    float eps) {
    rmsnorm_fwd(out, rstd, (ct_tensor *)inp, NULL, w, eps);
}

void ct_rmsnorm_add_fwd(ct_tensor *out, ct_tensor *rstd, ct_tensor *inp, const ct_tensor *residual,
                        const ct_tensor *w, float eps) {
    rmsnorm_fwd(out, rstd, inp, residual, w, eps);
}

void ct_rmsnorm_bwd(ct_tensor *dinp, ct_tensor *dw, const ct_tensor *dout, const ct_tensor *inp,
                    const ct_tensor *w, const ct_tensor *rstd) {
    check_float(inp, "rmsnorm_bwd inp");
    check_like(dinp, inp, "rmsnorm_bwd dinp");
    check_f32(dw, "rmsnorm_bwd dw");
    check_like(dout, inp, "rmsnorm_bwd dout");
    check_like(w, inp, "rmsnorm_bwd w");
    check_f32(rstd, "rmsnorm_bwd rstd");
    check_same_backend(dinp, inp);
    int64_t N = ROWS(inp), C = COLS(inp);
    CT_ASSERTF(ROWS(dinp) == N && COLS(dinp) == C && ROWS(dout) == N && COLS(dout) == C &&
                   dw->numel == C && w->numel == C && rstd->numel == N,
               "rmsnorm_bwd: dinp %s, dw %s, dout %s, inp %s, w %s, rstd %s", SH(dinp), SH(dw),
               SH(dout), SH(inp), SH(w), SH(rstd));
    OP_CALL(rmsnorm_bwd, inp, CT_PROF_NORM, DT(inp), DATA(dinp), F32(dw), DATA(dout), DATA(inp),
            DATA(w), F32(rstd), N, C);
}

void ct_rope(ct_tensor *x, const ct_tensor *cos_sin, int64_t B, int64_t T, int64_t n_rot_head,
             int64_t head_dim, int64_t pos_offset, bool inverse) {
    check_float(x, "rope x");
    check_f32(cos_sin, "rope cos_sin");
    check_same_backend(x, cos_sin);
    CT_ASSERTF(B >= 0 && T >= 0 && ROWS(x) == B * T && n_rot_head >= 0 && head_dim > 0 &&
                   head_dim % 2 == 0 && n_rot_head * head_dim <= COLS(x),
               "rope: x %s is not (B=%lld x T=%lld, >= %lld heads x even head_dim %lld)", SH(x),
               (long long)B, (long long)T, (long long)n_rot_head, (long long)head_dim);
    CT_ASSERTF(pos_offset >= 0 && (pos_offset + T) * head_dim <= cos_sin->numel,
               "rope: positions [%lld, %lld) outside the table %s of head_dim %lld",
               (long long)pos_offset, (long long)(pos_offset + T), SH(cos_sin),
               (long long)head_dim);
    OP_CALL(rope, x, CT_PROF_ELEMENTWISE, DT(x), DATA(x), F32(cos_sin), B, T, n_rot_head, head_dim,
            COLS(x), pos_offset, inverse);
}

/* The up half of a (N, 2H) gate_up tensor: H elements into each row. */
static void *up_half(const ct_tensor *gate_up) {
    return (char *)DATA(gate_up) + COLS(gate_up) / 2 * (int64_t)ct_dtype_size(DT(gate_up));
}

void ct_swiglu_fwd(ct_tensor *out, const ct_tensor *gate_up) {
    check_float(gate_up, "swiglu_fwd gate_up");
    check_like(out, gate_up, "swiglu_fwd out");
    check_same_backend(out, gate_up);
    int64_t N = ROWS(gate_up), H = COLS(gate_up) / 2;
    CT_ASSERTF(COLS(gate_up) == 2 * H && ROWS(out) == N && COLS(out) == H,
               "swiglu_fwd: out %s is not (N, H) of gate_up %s (N, 2H)", SH(out), SH(gate_up));
    OP_CALL(swiglu_fwd, gate_up, CT_PROF_ELEMENTWISE, DT(gate_up), DATA(out), DATA(gate_up),
            up_half(gate_up), N, H, 2 * H);
}

void ct_swiglu_bwd(ct_tensor *dgate_up, const ct_tensor *gate_up, const ct_tensor *dout) {
    check_float(gate_up, "swiglu_bwd gate_up");
    check_like(dgate_up, gate_up, "swiglu_bwd dgate_up");
    check_like(dout, gate_up, "swiglu_bwd dout");
    check_same_backend(dgate_up, gate_up);
    int64_t N = ROWS(gate_up), H = COLS(gate_up) / 2;
    CT_ASSERTF(COLS(gate_up) == 2 * H && ROWS(dgate_up) == N && COLS(dgate_up) == 2 * H &&
                   ROWS(dout) == N && COLS(dout) == H,
               "swiglu_bwd: dgate_up %s, gate_up %s (N, 2H), dout %s (N, H)", SH(dgate_up),
               SH(gate_up), SH(dout));
    OP_CALL(swiglu_bwd, gate_up, CT_PROF_ELEMENTWISE, DT(gate_up), DATA(dgate_up),
            up_half(dgate_up), DATA(gate_up), up_half(gate_up), DATA(dout), N, H, 2 * H);
}

/* Checks attention's shapes — qkv (B, T, (n_head + 2·n_kv_head)·hd), out (B, T, n_head·hd),
 * lse (B, n_head, T) — and returns head_dim. */
static int64_t attention_head_dim(const char *op, const ct_tensor *qkv, const ct_tensor *out,
                                  const ct_tensor *lse, int64_t B, int64_t T, int64_t n_head,
                                  int64_t n_kv_head) {
    CT_ASSERTF(B > 0 && T > 0 && n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0,
               "%s: B=%lld T=%lld n_head=%lld n_kv_head=%lld (n_kv_head must divide n_head)", op,
               (long long)B, (long long)T, (long long)n_head, (long long)n_kv_head);
    int64_t cq = COLS(out);
    CT_ASSERTF(cq > 0 && cq % n_head == 0 && ROWS(out) == B * T,
               "%s: out %s is not (B=%lld, T=%lld, n_head=%lld x head_dim)", op, SH(out),
               (long long)B, (long long)T, (long long)n_head);
    int64_t hd = cq / n_head;
    CT_ASSERTF(ROWS(qkv) == B * T && COLS(qkv) == (n_head + 2 * n_kv_head) * hd,
               "%s: qkv %s must be (B=%lld, T=%lld, (n_head + 2 n_kv_head)=%lld x head_dim=%lld)",
               op, SH(qkv), (long long)B, (long long)T, (long long)(n_head + 2 * n_kv_head),
               (long long)hd);
    CT_ASSERTF(lse->numel == B * n_head * T, "%s: lse %s must be (B, n_head, T)", op, SH(lse));
    return hd;
}

void ct_attention_fwd(ct_tensor *out, ct_tensor *lse, const ct_tensor *qkv, int64_t B, int64_t T,
                      int64_t n_head, int64_t n_kv_head) {
    check_float(qkv, "attention_fwd qkv");
    check_like(out, qkv, "attention_fwd out");
    check_f32(lse, "attention_fwd lse");
    check_same_backend(out, qkv);
    int64_t hd = attention_head_dim("attention_fwd", qkv, out, lse, B, T, n_head, n_kv_head);
    OP_CALL(attention_fwd, qkv, CT_PROF_ATTENTION, DT(qkv), DATA(out), F32(lse), DATA(qkv), B, T,
            n_head, n_kv_head, hd);
}

void ct_attention_decode(ct_tensor *out, ct_tensor *kv, const ct_tensor *qkv, int64_t pos,
                         int64_t n_head, int64_t n_kv_head) {
    check_float(qkv, "attention_decode qkv");
    check_like(out, qkv, "attention_decode out");
    check_like(kv, qkv, "attention_decode kv");
    check_same_backend(out, qkv);
    check_same_backend(kv, qkv);
    CT_ASSERTF(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0,
               "attention_decode: n_head=%lld n_kv_head=%lld (n_kv_head must divide n_head)",
               (long long)n_head, (long long)n_kv_head);
    const int64_t B = ROWS(qkv), cq = COLS(out), hd = cq / n_head;
    CT_ASSERTF(cq > 0 && cq % n_head == 0 && ROWS(out) == B &&
                   COLS(qkv) == (n_head + 2 * n_kv_head) * hd,
               "attention_decode: qkv %s must be (B, (n_head + 2 n_kv_head)=%lld x head_dim), "
               "out %s (B, n_head=%lld x head_dim)",
               SH(qkv), (long long)(n_head + 2 * n_kv_head), SH(out), (long long)n_head);
    const int64_t T_max = kv->numel / (B * 2 * n_kv_head * hd);
    CT_ASSERTF(T_max * B * 2 * n_kv_head * hd == kv->numel && pos >= 0 && pos < T_max,
               "attention_decode: kv %s must be (B=%lld, T_max, 2 n_kv_head x head_dim=%lld) "
               "with pos %lld < T_max",
               SH(kv), (long long)B, (long long)(2 * n_kv_head * hd), (long long)pos);
    OP_CALL(attention_decode, qkv, CT_PROF_ATTENTION, DT(qkv), DATA(out), DATA(kv), DATA(qkv), B,
            T_max, pos, n_head, n_kv_head, hd);
}

void ct_attention_bwd(ct_tensor *dqkv, ct_tensor *dbias, const ct_tensor *dout,
                      const ct_tensor *qkv, const ct_tensor *out, const ct_tensor *lse, int64_t B,
                      int64_t T, int64_t n_head, int64_t n_kv_head) {
    check_float(qkv, "attention_bwd qkv");
    check_like(dqkv, qkv, "attention_bwd dqkv");
    check_like(dout, qkv, "attention_bwd dout");
    check_like(out, qkv, "attention_bwd out");
    check_f32(lse, "attention_bwd lse");
    check_same_backend(dqkv, qkv);
    int64_t hd = attention_head_dim("attention_bwd", qkv, out, lse, B, T, n_head, n_kv_head);
    CT_ASSERTF(dqkv->numel == qkv->numel && dout->numel == out->numel,
               "attention_bwd: dqkv %s must match qkv %s, dout %s must match out %s", SH(dqkv),
               SH(qkv), SH(dout), SH(out));
    if (dbias) {
        check_f32(dbias, "attention_bwd dbias");
        check_same_backend(dbias, qkv);
        CT_ASSERTF(dbias->numel == COLS(qkv), "attention_bwd: dbias %s does not match qkv %s",
                   SH(dbias), SH(qkv));
    }
    OP_CALL(attention_bwd, qkv, CT_PROF_ATTENTION, DT(qkv), DATA(dqkv), dbias ? F32(dbias) : NULL,
            DATA(dout), DATA(qkv), DATA(out), F32(lse), B, T, n_head, n_kv_head, hd);
}

/* The shapes of a context-parallel part: qkv (B, T, (n_head + 2·n_kv_head)·hd) with T even, kv
 * (B, T, 2·n_kv_head·hd), lse (B, n_head, T); chunk indices in [0, 2^15). Returns head_dim. */
static int64_t part_head_dim(const char *op, const ct_tensor *qkv, const ct_tensor *kv,
                             const ct_tensor *lse, int64_t B, int64_t T, int64_t n_head,
                             int64_t n_kv_head, int64_t chunks) {
    CT_ASSERTF(B > 0 && T > 0 && T % 2 == 0 && n_head > 0 && n_kv_head > 0 &&
                   n_head % n_kv_head == 0 && chunks >= 0,
               "%s: B=%lld T=%lld (even: two chunks) n_head=%lld n_kv_head=%lld chunks=%llx", op,
               (long long)B, (long long)T, (long long)n_head, (long long)n_kv_head,
               (long long)chunks);
    int64_t lqkv = COLS(qkv), heads = n_head + 2 * n_kv_head;
    CT_ASSERTF(ROWS(qkv) == B * T && lqkv % heads == 0,
               "%s: qkv %s is not (B=%lld, T=%lld, (n_head + 2 n_kv_head)=%lld x head_dim)", op,
               SH(qkv), (long long)B, (long long)T, (long long)heads);
    int64_t hd = lqkv / heads;
    CT_ASSERTF(ROWS(kv) == B * T && COLS(kv) == 2 * n_kv_head * hd,
               "%s: kv %s must be (B, T, 2 n_kv_head x head_dim=%lld)", op, SH(kv), (long long)hd);
    CT_ASSERTF(lse->numel == B * n_head * T, "%s: lse %s must be (B, n_head, T)", op, SH(lse));
    return hd;
}

void ct_attention_part_fwd(ct_tensor *o_acc, ct_tensor *lse_acc, const ct_tensor *qkv,
                           const ct_tensor *kv, int64_t B, int64_t T, int64_t n_head,
                           int64_t n_kv_head, int64_t chunks) {
    check_float(qkv, "attention_part_fwd qkv");
    check_like(kv, qkv, "attention_part_fwd kv");
    check_f32(o_acc, "attention_part_fwd o_acc");
    check_f32(lse_acc, "attention_part_fwd lse_acc");
    check_same_backend(o_acc, qkv);
    int64_t hd =
        part_head_dim("attention_part_fwd", qkv, kv, lse_acc, B, T, n_head, n_kv_head, chunks);
    CT_ASSERTF(o_acc->numel == B * T * n_head * hd, "attention_part_fwd: o_acc %s", SH(o_acc));
    CT_ASSERTF(IFACE(qkv)->attention_part_fwd, "backend %s has no context parallelism",
               IFACE(qkv)->name);
    OP_CALL(attention_part_fwd, qkv, CT_PROF_ATTENTION, DT(qkv), F32(o_acc), F32(lse_acc),
            DATA(qkv), DATA(kv), B, T, n_head, n_kv_head, hd, chunks);
}

void ct_attention_part_bwd(ct_tensor *dq_acc, ct_tensor *dkv_acc, const ct_tensor *dout,
                           const ct_tensor *qkv, const ct_tensor *out, const ct_tensor *lse,
                           const ct_tensor *kv, int64_t B, int64_t T, int64_t n_head,
                           int64_t n_kv_head, int64_t chunks) {
    check_float(qkv, "attention_part_bwd qkv");
    check_like(kv, qkv, "attention_part_bwd kv");
    check_like(out, qkv, "attention_part_bwd out");
    check_like(dout, qkv, "attention_part_bwd dout");
    check_f32(dq_acc, "attention_part_bwd dq_acc");
    check_f32(dkv_acc, "attention_part_bwd dkv_acc");
    check_f32(lse, "attention_part_bwd lse");
    check_same_backend(dq_acc, qkv);
    int64_t hd = part_head_dim("attention_part_bwd", qkv, kv, lse, B, T, n_head, n_kv_head, chunks);
    CT_ASSERTF(dq_acc->numel == B * T * n_head * hd && out->numel == dq_acc->numel &&
                   dout->numel == dq_acc->numel && dkv_acc->numel == kv->numel,
               "attention_part_bwd: dq_acc %s, out %s, dout %s (B, T, n_head x hd), dkv_acc %s "
               "(like kv %s)",
               SH(dq_acc), SH(out), SH(dout), SH(dkv_acc), SH(kv));
    CT_ASSERTF(IFACE(qkv)->attention_part_bwd, "backend %s has no context parallelism",
               IFACE(qkv)->name);
    OP_CALL(attention_part_bwd, qkv, CT_PROF_ATTENTION, DT(qkv), F32(dq_acc), F32(dkv_acc),
            DATA(dout), DATA(qkv), DATA(out), F32(lse), DATA(kv), B, T, n_head, n_kv_head, hd,
            chunks);
}

void ct_cast_cols(ct_tensor *dst, int64_t dst_col, const ct_tensor *src, int64_t src_col,
                  int64_t cols) {
    CT_ASSERT(dst != NULL && src != NULL);
    check_same_backend(dst, src);
    CT_ASSERTF((dst->dtype == CT_DTYPE_F32 || dst->dtype == CT_DTYPE_BF16) &&
                   (src->dtype == CT_DTYPE_F32 || src->dtype == CT_DTYPE_BF16),
               "cast_cols: only f32 <-> bf16, got %s -> %s", SH(src), SH(dst));
    CT_ASSERTF(ROWS(dst) == ROWS(src) && dst_col >= 0 && src_col >= 0 && cols >= 0 &&
                   dst_col + cols <= COLS(dst) && src_col + cols <= COLS(src),
               "cast_cols: columns [%lld, +%lld) of %s from [%lld, +%lld) of %s",
               (long long)dst_col, (long long)cols, SH(dst), (long long)src_col, (long long)cols,
               SH(src));
    CT_ASSERTF(IFACE(src)->cast_cols, "backend %s has no cast_cols", IFACE(src)->name);
    const size_t dsz = ct_dtype_size(dst->dtype), ssz = ct_dtype_size(src->dtype);
    OP_CALL(cast_cols, src, CT_PROF_ELEMENTWISE, (char *)dst->data + (size_t)dst_col * dsz,
            dst->dtype, COLS(dst), (const char *)src->data + (size_t)src_col * ssz, src->dtype,
            COLS(src), ROWS(src), cols);
}

bool ct_backend_has_context_parallel(const ct_backend *be) {
    return be->iface->cast_cols && be->iface->attention_part_fwd && be->iface->attention_part_bwd;
}

static void check_xent_cols(const char *op, const ct_tensor *logits, int64_t n_valid) {
    CT_ASSERTF(n_valid >= 0 && n_valid <= COLS(logits),
               "%s: n_valid %lld outside [0, %lld] of logits %s", op, (long long)n_valid,
               (long long)COLS(logits), SH(logits));
}

void ct_xent_rowmax(ct_tensor *rowmax, const ct_tensor *logits, int64_t n_valid) {
    check_f32(rowmax, "xent_rowmax rowmax");
    check_float(logits, "xent_rowmax logits");
    check_same_backend(rowmax, logits);
    check_xent_cols("xent_rowmax", logits, n_valid);
    CT_ASSERTF(rowmax->numel == ROWS(logits), "xent_rowmax: rowmax %s vs logits %s", SH(rowmax),
               SH(logits));
    OP_CALL(xent_rowmax, logits, CT_PROF_LOSS, DT(logits), F32(rowmax), DATA(logits), ROWS(logits),
            COLS(logits), n_valid);
}

void ct_xent_sumexp(ct_tensor *sumexp, ct_tensor *target_logit, ct_tensor *logits,
                    const ct_tensor *targets, const ct_tensor *rowmax, int64_t n_valid,
                    int64_t col_offset, bool keep_exp) {
    check_f32(sumexp, "xent_sumexp sumexp");
    check_f32(target_logit, "xent_sumexp target_logit");
    check_float(logits, "xent_sumexp logits");
    check_i32(targets, "xent_sumexp targets");
    check_f32(rowmax, "xent_sumexp rowmax");
    check_same_backend(sumexp, logits);
    check_xent_cols("xent_sumexp", logits, n_valid);
    int64_t N = ROWS(logits);
    CT_ASSERTF(sumexp->numel == N && target_logit->numel == N && targets->numel == N &&
                   rowmax->numel == N,
               "xent_sumexp: sumexp %s, target_logit %s, targets %s, rowmax %s vs logits %s",
               SH(sumexp), SH(target_logit), SH(targets), SH(rowmax), SH(logits));
    OP_CALL(xent_sumexp, logits, CT_PROF_LOSS, DT(logits), F32(sumexp), F32(target_logit),
            DATA(logits), I32(targets), F32(rowmax), N, COLS(logits), n_valid, col_offset,
            keep_exp);
}

void ct_xent_finish(ct_tensor *losses, ct_tensor *logits, const ct_tensor *targets,
                    const ct_tensor *rowmax, const ct_tensor *sumexp, const ct_tensor *target_logit,
                    int64_t n_valid, int64_t col_offset, float dloss, bool write_grad) {
    check_f32(losses, "xent_finish losses");
    check_float(logits, "xent_finish logits");
    check_i32(targets, "xent_finish targets");
    check_f32(rowmax, "xent_finish rowmax");
    check_f32(sumexp, "xent_finish sumexp");
    check_f32(target_logit, "xent_finish target_logit");
    check_same_backend(losses, logits);
    check_xent_cols("xent_finish", logits, n_valid);
    int64_t N = ROWS(logits);
    CT_ASSERTF(losses->numel == N && targets->numel == N && rowmax->numel == N &&
                   sumexp->numel == N && target_logit->numel == N,
               "xent_finish: losses %s, targets %s, rowmax %s, sumexp %s, target_logit %s vs "
               "logits %s",
               SH(losses), SH(targets), SH(rowmax), SH(sumexp), SH(target_logit), SH(logits));
    OP_CALL(xent_finish, logits, CT_PROF_LOSS, DT(logits), F32(losses), DATA(logits), I32(targets),
            F32(rowmax), F32(sumexp), F32(target_logit), N, COLS(logits), n_valid, col_offset,
            dloss, write_grad);
}

void ct_adamw(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v,
              const ct_adamw_segment *segments, int n_segments, const ct_adamw_hparams *hp,
              ct_tensor *param_copy) {
    check_f32(param, "adamw param");
    check_f32(grad, "adamw grad");
    check_f32(m, "adamw m");
    check_f32(v, "adamw v");
    check_same_backend(param, grad);
    check_same_backend(param, m);
    check_same_backend(param, v);
    int64_t n = param->numel;
    CT_ASSERTF(grad->numel == n && m->numel == n && v->numel == n,
               "adamw: param %s, grad %s, m %s, v %s must have equal length", SH(param), SH(grad),
               SH(m), SH(v));
    if (param_copy) {
        check_float(param_copy, "adamw param_copy");
        check_same_backend(param, param_copy);
        CT_ASSERTF(param_copy->numel == n, "adamw: param_copy %s vs param %s", SH(param_copy),
                   SH(param));
    }
    CT_ASSERTF(hp != NULL && hp->step >= 1, "adamw: step must be >= 1 (1-based)");
    CT_ASSERTF(n_segments >= 0 && (n_segments == 0 || segments != NULL), "adamw: %d segments",
               n_segments);
    for (int s = 0; s < n_segments; s++)
        CT_ASSERTF(segments[s].offset >= 0 && segments[s].count >= 0 &&
                       segments[s].offset + segments[s].count <= n,
                   "adamw: segment %d [%lld, +%lld) outside the %lld-element range", s,
                   (long long)segments[s].offset, (long long)segments[s].count, (long long)n);
    OP_CALL(adamw, param, CT_PROF_OPTIMIZER, F32(param), F32(grad), F32(m), F32(v), segments,
            n_segments, hp, param_copy ? DATA(param_copy) : NULL,
            param_copy ? DT(param_copy) : CT_DTYPE_F32);
}

void ct_sumsq(ct_tensor *out, int64_t index, ct_tensor *const *xs, int count) {
    check_f32(out, "sumsq out");
    CT_ASSERTF(count >= 0 && index >= 0 && index + count <= out->numel,
               "sumsq: indices [%lld, +%d) outside out %s", (long long)index, count, SH(out));
    if (count == 0) return;
    const float **x = ct_xmalloc((size_t)count * sizeof *x);
    int64_t *n = ct_xmalloc((size_t)count * sizeof *n);
    for (int i = 0; i < count; i++) {
        check_f32(xs[i], "sumsq x");
        check_same_backend(out, xs[i]);
        x[i] = F32(xs[i]);
        n[i] = xs[i]->numel;
    }
    OP_CALL(sumsq, out, CT_PROF_OPTIMIZER, F32(out) + index, x, n, count);
    free(x);
    free(n);
}

void ct_cast(ct_tensor *dst, const ct_tensor *src) {
    CT_ASSERT(dst != NULL && src != NULL);
    check_same_backend(dst, src);
    CT_ASSERTF(dst->numel == src->numel, "cast: dst %s and src %s differ in size", SH(dst),
               SH(src));
    CT_ASSERTF((dst->dtype == CT_DTYPE_F32 || dst->dtype == CT_DTYPE_BF16) &&
                   (src->dtype == CT_DTYPE_F32 || src->dtype == CT_DTYPE_BF16),
               "cast: only f32 <-> bf16, got %s -> %s", SH(src), SH(dst));
    OP_CALL(cast, src, CT_PROF_ELEMENTWISE, dst->data, dst->dtype, src->data, src->dtype,
            src->numel);
}
