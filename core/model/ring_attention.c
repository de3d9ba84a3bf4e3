/*
 * ring_attention.c — ring attention from the part ops and the cp group's sends
 * (ring_attention.h).
 */
#include "ring_attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

void ct_cp_chunks(int cp, int r, bool zigzag, int64_t *c0, int64_t *c1) {
    CT_ASSERTF(cp >= 1 && r >= 0 && r < cp, "cp chunks: rank %d of %d", r, cp);
    *c0 = zigzag ? r : 2 * r;
    *c1 = zigzag ? 2 * cp - 1 - r : 2 * r + 1;
}

int64_t ct_cp_position(int cp, int r, bool zigzag, int64_t T_local, int64_t t) {
    if (cp == 1) return t; /* the whole sequence in order, whatever its length (1, odd) */
    int64_t c0, c1, half = T_local / 2;
    ct_cp_chunks(cp, r, zigzag, &c0, &c1);
    return (t < half ? c0 : c1) * half + t % half;
}

void ct_cp_owner(int cp, bool zigzag, int64_t T_local, int64_t p, int *r, int64_t *row) {
    if (cp == 1) { /* as ct_cp_position: no chunks to halve (T_local may be 1, or odd) */
        CT_ASSERTF(p >= 0 && p < T_local, "cp owner of position %lld of %lld", (long long)p,
                   (long long)T_local);
        *r = 0;
        *row = p;
        return;
    }
    const int64_t half = T_local / 2, chunk = p / half;
    CT_ASSERTF(p >= 0 && chunk < 2 * cp, "cp owner of position %lld of %lld", (long long)p,
               (long long)(cp * T_local));
    const bool first = zigzag ? chunk < cp : chunk % 2 == 0; /* the rank's first chunk */
    *r = (int)(zigzag ? (first ? chunk : 2 * cp - 1 - chunk) : chunk / 2);
    *row = (first ? 0 : half) + p % half;
}

void ct_cp_cut(int cp, int r, bool zigzag, int64_t T_local, const int32_t *seq, int32_t *local) {
    for (int64_t t = 0; t < T_local; t++) local[t] = seq[ct_cp_position(cp, r, zigzag, T_local, t)];
}

int64_t ct_cp_score_elements(int cp, int r, bool zigzag, int64_t T) {
    const int64_t c = T / (2 * cp);
    int64_t q[2], total = 0;
    ct_cp_chunks(cp, r, zigzag, &q[0], &q[1]);
    for (int src = 0; src < cp; src++) {
        int64_t k[2];
        ct_cp_chunks(cp, src, zigzag, &k[0], &k[1]);
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++)
                total += k[b] < q[a] ? c * c : k[b] == q[a] ? c * (c + 1) / 2 : 0;
    }
    return total;
}

enum { WS_KV0, WS_KV1, WS_MINE0, WS_MINE1, WS_GOT, WS_DQ, WS_O, WS_SLOTS };

struct ct_ring_ws {
    ct_tensor *buf[WS_SLOTS];
};

ct_ring_ws *ct_ring_ws_new(void) {
    return ct_xcalloc(1, sizeof(ct_ring_ws));
}

void ct_ring_ws_free(ct_ring_ws *ws) {
    if (!ws) return;
    for (int i = 0; i < WS_SLOTS; i++) ct_tensor_free(ws->buf[i]);
    free(ws);
}

/* A (rows, cols) view of buffer i in dtype dt on like's backend, the buffer made again when it
 * is too small (or of another dtype); the caller frees the view (the buffer stays). */
static ct_tensor *ws_view(ct_ring_ws *ws, int i, const ct_tensor *like, ct_dtype dt, int64_t rows,
                          int64_t cols) {
    ct_tensor *b = ws->buf[i];
    if (!b || b->dtype != dt || b->numel < rows * cols || b->backend != like->backend) {
        ct_tensor_free(b);
        b = ws->buf[i] = ct_tensor_new_1d(like->backend, dt, rows * cols, CT_MEM_WORKSPACE);
        CT_ASSERTF(b != NULL, "ring attention: out of memory for a (%lld, %lld) %s buffer",
                   (long long)rows, (long long)cols, ct_dtype_name(dt));
    }
    return ct_tensor_view_2d(b, 0, rows, cols);
}

static int64_t head_dim(const ct_tensor *qkv, int64_t n_head, int64_t n_kv_head) {
    return ct_tensor_cols(qkv) / (n_head + 2 * n_kv_head);
}

/* The chunks of step s: this rank's queries against the block of rank (rank − s) mod cp. */
static int64_t chunks_at(ct_comm *cp, bool zigzag, int s) {
    int64_t q0, q1, k0, k1;
    ct_cp_chunks(cp->size, cp->rank, zigzag, &q0, &q1);
    ct_cp_chunks(cp->size, (cp->rank - s + cp->size) % cp->size, zigzag, &k0, &k1);
    return CT_ATT_CHUNKS(q0, q1, k0, k1);
}

/* The two kv blocks of a ring (rows of ckv elements in qkv's dtype), the first holding this
 * rank's own key and value heads, columns [cq, cq + ckv) of qkv. */
static void kv_blocks(ct_ring_ws *ws, const ct_tensor *qkv, int64_t rows, int64_t cq, int64_t ckv,
                      ct_tensor *kv[2]) {
    for (int i = 0; i < 2; i++) kv[i] = ws_view(ws, WS_KV0 + i, qkv, qkv->dtype, rows, ckv);
    ct_cast_cols(kv[0], 0, qkv, cq, ckv);
}

/* ---- the trace's spans ---------------------------------------------------------------------- */

typedef struct ring_span {
    char name[40];
    int tid; /* 2: a block's computation, 3: a hop */
    double start, end;
} ring_span;

static struct {
    bool on;
    ring_span *spans;
    int n, cap;
    int calls[2]; /* forward and backward calls since the last ct_ring_trace */
} rec;

void ct_ring_log_events(bool on) {
    rec.on = on;
}

static void record(int tid, double start, double end, const char *fmt, int call, int step) {
    if (!rec.on) return;
    if (rec.n == rec.cap) {
        rec.cap = rec.cap ? 2 * rec.cap : 256;
        rec.spans = realloc(rec.spans, (size_t)rec.cap * sizeof *rec.spans);
        CT_ASSERTF(rec.spans != NULL, "ring trace: out of memory for %d spans", rec.cap);
    }
    ring_span *sp = &rec.spans[rec.n++];
    snprintf(sp->name, sizeof sp->name, fmt, call, step);
    sp->tid = tid, sp->start = start, sp->end = end;
}

void ct_ring_trace(ct_trace *trace) {
    ct_trace_thread(trace, 2, "cp attention");
    ct_trace_thread(trace, 3, "cp ring");
    for (int i = 0; i < rec.n; i++)
        ct_trace_span(trace, rec.spans[i].tid, rec.spans[i].name, rec.spans[i].start,
                      rec.spans[i].end, -1);
    free(rec.spans);
    rec.spans = NULL;
    rec.n = rec.cap = rec.calls[0] = rec.calls[1] = 0;
}

/* A hop whose requests req[0..1] may have completed during a block: now if a test says so, else 0
 * (its wait's return then ends its span). */
static double hop_seen(ct_comm *cp, ct_comm_request **req) {
    if (!rec.on || !req[0]) return 0.0;
    return ct_comm_test(cp, req[0]) && ct_comm_test(cp, req[1]) ? ct_now() : 0.0;
}

/* ---- the ring ------------------------------------------------------------------------------- */

/* One ring hop of `t` to rank + 1 and of `into` from rank − 1, started. */
static void hop(ct_comm *cp, const ct_tensor *t, ct_tensor *into, int tag, ct_comm_request **req) {
    int next = (cp->rank + 1) % cp->size, prev = (cp->rank + cp->size - 1) % cp->size;
    req[0] = ct_comm_isend(cp, t->data, t->numel, t->dtype, next, tag);
    req[1] = ct_comm_irecv(cp, into->data, into->numel, into->dtype, prev, tag);
}

/* Completes a hop; returns when (ct_now, for the trace). */
static double hop_wait(ct_comm *cp, ct_comm_request **req) {
    ct_comm_wait(cp, req[0]);
    ct_comm_wait(cp, req[1]);
    return rec.on ? ct_now() : 0.0;
}

void ct_ring_attention_fwd(ct_comm *cp, bool zigzag, ct_ring_ws *ws, ct_tensor *out, ct_tensor *lse,
                           const ct_tensor *qkv, int64_t B, int64_t T, int64_t n_head,
                           int64_t n_kv_head) {
    const int n = cp->size;
    const int64_t hd = head_dim(qkv, n_head, n_kv_head), cq = n_head * hd, ckv = 2 * n_kv_head * hd;
    ct_tensor *kv[2];
    kv_blocks(ws, qkv, B * T, cq, ckv, kv);
    /* fp32 output accumulates in place; bf16 in an fp32 buffer, rounded once at the end */
    ct_tensor *o_acc =
        qkv->dtype == CT_DTYPE_F32 ? out : ws_view(ws, WS_O, qkv, CT_DTYPE_F32, B * T, cq);
    ct_tensor_zero(o_acc);
    ct_tensor_fill(lse, -INFINITY);
    const int call = rec.calls[0]++;
    for (int s = 0; s < n; s++) {
        ct_comm_request *req[2] = {NULL, NULL};
        if (s + 1 < n) hop(cp, kv[s & 1], kv[(s + 1) & 1], s, req);
        const double th = rec.on ? ct_now() : 0.0; /* the hop is on its way */
        const double t0 = rec.on ? ct_now() : 0.0;
        ct_attention_part_fwd(o_acc, lse, qkv, kv[s & 1], B, T, n_head, n_kv_head,
                              chunks_at(cp, zigzag, s));
        const double t1 = rec.on ? ct_now() : 0.0, seen = hop_seen(cp, req);
        record(2, t0, t1, "fwd %d block %d", call, s);
        if (s + 1 < n) {
            const double waited = hop_wait(cp, req);
            record(3, th, seen > 0.0 ? seen : waited, "fwd %d kv hop %d", call, s);
        }
    }
    if (o_acc != out) {
        ct_cast(out, o_acc);
        ct_tensor_free(o_acc);
    }
    ct_tensor_free(kv[0]);
    ct_tensor_free(kv[1]);
}

void ct_ring_attention_bwd(ct_comm *cp, bool zigzag, ct_ring_ws *ws, ct_tensor *dqkv,
                           ct_tensor *dbias, const ct_tensor *dout, const ct_tensor *qkv,
                           const ct_tensor *out, const ct_tensor *lse, int64_t B, int64_t T,
                           int64_t n_head, int64_t n_kv_head) {
    const int n = cp->size;
    const int64_t hd = head_dim(qkv, n_head, n_kv_head), cq = n_head * hd, ckv = 2 * n_kv_head * hd;
    ct_tensor *kv[2];
    kv_blocks(ws, qkv, B * T, cq, ckv, kv);
    /* mine[s & 1]: the partial dK/dV of the block held at step s, sent on after the step (two, so
     * one can be in flight while the next is computed); got: the partial arriving from r − 1 */
    ct_tensor *mine[2] = {ws_view(ws, WS_MINE0, qkv, CT_DTYPE_F32, B * T, ckv),
                          ws_view(ws, WS_MINE1, qkv, CT_DTYPE_F32, B * T, ckv)};
    ct_tensor *got = ws_view(ws, WS_GOT, qkv, CT_DTYPE_F32, B * T, ckv);
    ct_tensor *dq = ws_view(ws, WS_DQ, qkv, CT_DTYPE_F32, B * T, cq);
    ct_tensor_zero(dq);
    ct_comm_request *sent[2] = {NULL, NULL}, *arriving = NULL;
    const int call = rec.calls[1]++;
    double tp = 0.0; /* when the partial now arriving was sent on */
    for (int s = 0; s < n; s++) {
        ct_comm_request *req[2] = {NULL, NULL};
        if (s + 1 < n) hop(cp, kv[s & 1], kv[(s + 1) & 1], s, req);
        const double th = rec.on ? ct_now() : 0.0; /* the hop is on its way */
        ct_tensor *acc = mine[s & 1];
        ct_comm_wait(cp, sent[s & 1]); /* the send of two steps ago read this buffer */
        sent[s & 1] = NULL;
        ct_tensor_zero(acc);
        const double t0 = rec.on ? ct_now() : 0.0;
        ct_attention_part_bwd(dq, acc, dout, qkv, out, lse, kv[s & 1], B, T, n_head, n_kv_head,
                              chunks_at(cp, zigzag, s));
        const double t1 = rec.on ? ct_now() : 0.0, seen = hop_seen(cp, req);
        record(2, t0, t1, "bwd %d block %d", call, s);
        if (arriving) { /* the partial of this block from the ranks before it, added to ours */
            ct_comm_wait(cp, arriving);
            record(3, tp, rec.on ? ct_now() : 0.0, "bwd %d dkv hop %d", call, s - 1);
            ct_axpy(acc, got, 1.0f);
        }
        if (n > 1) { /* on to the next holder; after the last step, back to the owner */
            ct_comm_request *partial[2];
            hop(cp, acc, got, n + s, partial);
            sent[s & 1] = partial[0], arriving = partial[1];
            tp = rec.on ? ct_now() : 0.0;
        }
        if (s + 1 < n) {
            const double waited = hop_wait(cp, req);
            record(3, th, seen > 0.0 ? seen : waited, "bwd %d kv hop %d", call, s);
        }
    }
    /* the last hop brought this rank's own block back, complete (one rank: it never left) */
    ct_tensor *dkv = n > 1 ? got : mine[0];
    ct_comm_wait(cp, arriving);
    if (n > 1) record(3, tp, rec.on ? ct_now() : 0.0, "bwd %d dkv hop %d", call, n - 1);
    ct_comm_wait(cp, sent[0]);
    ct_comm_wait(cp, sent[1]);
    ct_cast_cols(dqkv, 0, dq, 0, cq);
    ct_cast_cols(dqkv, cq, dkv, 0, ckv);
    if (dbias) {
        ct_tensor *dbq = ct_tensor_view_1d(dbias, 0, cq), *dbkv = ct_tensor_view_1d(dbias, cq, ckv);
        ct_bias_grad(dbq, dq);
        ct_bias_grad(dbkv, dkv);
        ct_tensor_free(dbq);
        ct_tensor_free(dbkv);
    }
    for (int i = 0; i < 2; i++) {
        ct_tensor_free(kv[i]);
        ct_tensor_free(mine[i]);
    }
    ct_tensor_free(got);
    ct_tensor_free(dq);
}
