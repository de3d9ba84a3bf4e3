/*
 * moe_dispatch.c — the dispatch/combine permutation of a Mixture-of-Experts layer over an
 * expert-parallel group (moe_dispatch.h): a counting sort of the assignments by expert, one
 * count exchange, the rows by all_to_all_v, and the regrouping between source-major (as the rows
 * arrive) and expert-major (as the experts read them) — every row movement a gather on the
 * backend (ct_gather_rows) by index arrays the plan computes on the host, so the rows stay in the
 * backend's memory and travel by the ep group's all_to_all_v (NCCL send/receive on CUDA).
 */
#include "core/model/moe_dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"

static uint64_t plans_made; /* a plan's id: which plan a scratch's indices belong to */

struct ct_moe_plan {
    uint64_t id;
    ct_comm *ep;
    int P, rank, E, per; /* per = E / P experts a rank */
    int k;
    int64_t N, A;        /* A = N·k assignments */
    int64_t *sent_to;    /* E: this rank's assignments to each expert */
    int64_t *pos;        /* A: assignment i·k + j → its send position */
    int64_t *from;       /* P·per: rows from source s for local expert l, at [s·per + l] */
    int64_t *send_rows;  /* P: rows to each rank */
    int64_t *recv_rows;  /* P: rows from each rank */
    int64_t *expert_off; /* per + 1: local expert l's first expert-major row; [per] = rows */
};

ct_moe_plan *ct_moe_plan_new(ct_comm *ep, const int32_t *ids, int64_t N, int k, int E) {
    CT_ASSERTF(ep->size > 0 && E > 0 && E % ep->size == 0 && k >= 1 && k <= E && N >= 0,
               "moe plan: E %d over %d ranks, k %d, N %lld", E, ep->size, k, (long long)N);
    ct_moe_plan *p = ct_xcalloc(1, sizeof *p);
    p->id = ++plans_made;
    p->ep = ep;
    p->P = ep->size;
    p->rank = ep->rank;
    p->E = E;
    p->per = E / ep->size;
    p->k = k;
    p->N = N;
    p->A = N * k;
    p->sent_to = ct_xcalloc((size_t)E, sizeof *p->sent_to);
    p->pos = ct_xmalloc((size_t)(p->A > 0 ? p->A : 1) * sizeof *p->pos);
    p->from = ct_xcalloc((size_t)E, sizeof *p->from);
    p->send_rows = ct_xcalloc((size_t)p->P, sizeof *p->send_rows);
    p->recv_rows = ct_xcalloc((size_t)p->P, sizeof *p->recv_rows);
    p->expert_off = ct_xcalloc((size_t)p->per + 1, sizeof *p->expert_off);

    /* the counting sort: by expert, and within an expert by assignment index (token, then slot) */
    for (int64_t a = 0; a < p->A; a++) {
        CT_ASSERTF(ids[a] >= 0 && ids[a] < E,
                   "moe plan: token %lld slot %lld routed to expert %d of %d", (long long)(a / k),
                   (long long)(a % k), (int)ids[a], E);
        p->sent_to[ids[a]]++;
    }
    int64_t *next = ct_xmalloc((size_t)E * sizeof *next);
    for (int e = 0, at = 0; e < E; at += (int)p->sent_to[e], e++) next[e] = at;
    for (int64_t a = 0; a < p->A; a++) p->pos[a] = next[ids[a]]++;
    free(next);

    /* the counts every rank agrees on: block q of sent_to is for rank q's experts (host
     * memory: a one-rank group, bound to a device backend, would copy through the device) */
    if (p->P > 1)
        ct_comm_all_to_all(ep, p->sent_to, p->from, E, CT_DTYPE_I64);
    else
        memcpy(p->from, p->sent_to, (size_t)E * sizeof *p->from);
    for (int q = 0; q < p->P; q++)
        for (int l = 0; l < p->per; l++) {
            p->send_rows[q] += p->sent_to[q * p->per + l];
            p->recv_rows[q] += p->from[q * p->per + l];
        }
    for (int l = 0; l < p->per; l++) {
        int64_t n = 0;
        for (int s = 0; s < p->P; s++) n += p->from[s * p->per + l];
        p->expert_off[l + 1] = p->expert_off[l] + n;
    }
    return p;
}

void ct_moe_plan_free(ct_moe_plan *p) {
    if (!p) return;
    free(p->sent_to);
    free(p->pos);
    free(p->from);
    free(p->send_rows);
    free(p->recv_rows);
    free(p->expert_off);
    free(p);
}

int64_t ct_moe_plan_rows(const ct_moe_plan *p) {
    return p->expert_off[p->per];
}

int64_t ct_moe_plan_expert_rows(const ct_moe_plan *p, int l) {
    CT_ASSERTF(l >= 0 && l < p->per, "local expert %d of %d", l, p->per);
    return p->expert_off[l + 1] - p->expert_off[l];
}

int64_t ct_moe_plan_expert_offset(const ct_moe_plan *p, int l) {
    CT_ASSERTF(l >= 0 && l <= p->per, "local expert %d of %d", l, p->per);
    return p->expert_off[l];
}

int64_t ct_moe_plan_sent_to(const ct_moe_plan *p, int e) {
    CT_ASSERTF(e >= 0 && e < p->E, "expert %d of %d", e, p->E);
    return p->sent_to[e];
}

/* ---- the rows, on a backend ------------------------------------------------------------------ */

struct ct_moe_scratch {
    ct_backend *be;
    uint64_t plan; /* the id of the plan whose indices idx holds (0: none) */
    /* idx: pos (A), send_token (A), send_assign (A), assign_token (A), to_em (rows),
     * from_em (rows); then the rows in flight: send (A, C), arrived (rows, C), gates in send
     * order (A) */
    ct_tensor *idx, *send, *arrived, *gsend;
    int64_t A, rows;
};

ct_moe_scratch *ct_moe_scratch_new(ct_backend *be) {
    ct_moe_scratch *s = ct_xcalloc(1, sizeof *s);
    s->be = be;
    return s;
}

void ct_moe_scratch_free(ct_moe_scratch *s) {
    if (!s) return;
    ct_tensor_free(s->idx), ct_tensor_free(s->send), ct_tensor_free(s->arrived);
    ct_tensor_free(s->gsend);
    free(s);
}

/* *t grown to at least n elements of dt. */
static void grow(ct_backend *be, ct_tensor **t, ct_dtype dt, int64_t n) {
    n = CT_MAX(n, 1);
    if (*t && (*t)->numel >= n && (*t)->dtype == dt) return;
    ct_tensor_free(*t);
    *t = ct_tensor_new_1d(be, dt, n, CT_MEM_ACTS);
    CT_ASSERTF(*t, "out of memory for %lld elements of the MoE dispatch", (long long)n);
}

/* The plan's index arrays on s's backend (once per plan). */
static void upload(const ct_moe_plan *p, ct_moe_scratch *s) {
    if (s->plan == p->id) return;
    const int64_t A = p->A, rows = ct_moe_plan_rows(p), n = 4 * A + 2 * rows;
    int32_t *h = ct_xmalloc((size_t)CT_MAX(n, 1) * sizeof *h);
    int32_t *pos = h, *send_token = h + A, *send_assign = h + 2 * A, *assign_token = h + 3 * A;
    int32_t *to_em = h + 4 * A, *from_em = to_em + rows;
    for (int64_t a = 0; a < A; a++) {
        pos[a] = (int32_t)p->pos[a];
        send_token[p->pos[a]] = (int32_t)(a / p->k);
        send_assign[p->pos[a]] = (int32_t)a;
        assign_token[a] = (int32_t)(a / p->k);
    }
    /* arrived (source-major: source s's rows for local experts 0, 1, ...) against expert-major
     * (local expert l's rows from sources 0, 1, ...) */
    int64_t arrived = 0, *seen = ct_xcalloc((size_t)p->per, sizeof *seen);
    for (int src = 0; src < p->P; src++)
        for (int l = 0; l < p->per; l++)
            for (int64_t r = 0; r < p->from[src * p->per + l]; r++, arrived++) {
                const int64_t em = p->expert_off[l] + seen[l]++;
                to_em[em] = (int32_t)arrived;
                from_em[arrived] = (int32_t)em;
            }
    free(seen);
    grow(s->be, &s->idx, CT_DTYPE_I32, n);
    if (n > 0) {
        ct_tensor *v = ct_tensor_view_1d(s->idx, 0, n);
        ct_tensor_from_host(v, h);
        ct_tensor_free(v);
    }
    free(h);
    s->plan = p->id;
    s->A = A;
    s->rows = rows;
}

/* Index array `which` (0 pos, 1 send_token, 2 send_assign, 3 assign_token: A entries; 4 to_em,
 * 5 from_em: rows entries) as a view. */
static ct_tensor *indices(const ct_moe_scratch *s, int which) {
    const int64_t at = which < 4 ? which * s->A : 4 * s->A + (which - 4) * s->rows;
    return ct_tensor_view_1d(s->idx, at, which < 4 ? s->A : s->rows);
}

/* out (n, C) from `in` by index array `which` (k terms a row, weights w or 1); nothing for n 0. */
static void gather(const ct_moe_scratch *s, ct_tensor *out, const ct_tensor *in, int which,
                   const ct_tensor *w, int64_t k) {
    if (ct_tensor_rows(out) == 0) return;
    ct_tensor *ix = indices(s, which);
    ct_gather_rows(out, in, ix, w, k);
    ct_tensor_free(ix);
}

/* A (rows, C) view of a grown scratch buffer. */
static ct_tensor *rows_of(ct_moe_scratch *s, ct_tensor **buf, ct_dtype dt, int64_t rows,
                          int64_t C) {
    grow(s->be, buf, dt, rows * C);
    return ct_tensor_view_2d(*buf, 0, rows, C);
}

/* Rows in send order (A) to the experts' side (source-major), or back. */
static void exchange(const ct_moe_plan *p, const ct_tensor *send, ct_tensor *recv,
                     bool to_experts) {
    const int64_t C = ct_tensor_cols(send);
    int64_t *sc = ct_xmalloc((size_t)p->P * sizeof *sc),
            *rc = ct_xmalloc((size_t)p->P * sizeof *rc);
    for (int q = 0; q < p->P; q++) {
        sc[q] = (to_experts ? p->send_rows[q] : p->recv_rows[q]) * C;
        rc[q] = (to_experts ? p->recv_rows[q] : p->send_rows[q]) * C;
    }
    ct_comm_all_to_all_v(p->ep, send->data, sc, recv->data, rc, send->dtype);
    free(sc);
    free(rc);
}

void ct_moe_dispatch(ct_moe_plan *p, ct_moe_scratch *s, const ct_tensor *x, ct_tensor *xe) {
    const int64_t C = ct_tensor_cols(x), rows = ct_moe_plan_rows(p);
    CT_ASSERT(ct_tensor_rows(x) == p->N && ct_tensor_rows(xe) == rows);
    upload(p, s);
    ct_tensor *send = rows_of(s, &s->send, x->dtype, p->A, C);
    ct_tensor *arrived = rows_of(s, &s->arrived, x->dtype, rows, C);
    gather(s, send, x, 1, NULL, 1);
    exchange(p, send, arrived, true);
    gather(s, xe, arrived, 4, NULL, 1);
    ct_tensor_free(send), ct_tensor_free(arrived);
}

void ct_moe_combine(ct_moe_plan *p, ct_moe_scratch *s, const ct_tensor *ye, const ct_tensor *gates,
                    ct_tensor *ys, ct_tensor *y) {
    const int64_t C = ct_tensor_cols(ye), rows = ct_moe_plan_rows(p);
    CT_ASSERT(ct_tensor_rows(ye) == rows && ct_tensor_rows(ys) == p->A &&
              ct_tensor_rows(y) == p->N && gates->numel == p->A);
    upload(p, s);
    ct_tensor *leaving = rows_of(s, &s->arrived, ye->dtype, rows, C);
    gather(s, leaving, ye, 5, NULL, 1);
    exchange(p, leaving, ys, false);
    gather(s, y, ys, 0, gates, p->k);
    ct_tensor_free(leaving);
}

void ct_moe_combine_bwd(ct_moe_plan *p, ct_moe_scratch *s, const ct_tensor *dy, const ct_tensor *ys,
                        const ct_tensor *gates, ct_tensor *dgates, ct_tensor *dye) {
    const int64_t C = ct_tensor_cols(dy), rows = ct_moe_plan_rows(p);
    CT_ASSERT(ct_tensor_rows(dy) == p->N && ct_tensor_rows(ys) == p->A && dgates->numel == p->A &&
              ct_tensor_rows(dye) == rows);
    upload(p, s);
    if (p->A > 0) { /* dgates[a] = dy[token of a] · ys[pos[a]] */
        ct_tensor *ia = indices(s, 3), *ib = indices(s, 0);
        ct_gather_dot(dgates, dy, ia, ys, ib);
        ct_tensor_free(ia), ct_tensor_free(ib);
    }
    /* send[slot] = gate · dy[token], the gates first put in send order */
    ct_tensor *g1 = ct_tensor_view_2d(gates, 0, p->A, 1);
    ct_tensor *gs = rows_of(s, &s->gsend, CT_DTYPE_F32, p->A, 1);
    gather(s, gs, g1, 2, NULL, 1);
    ct_tensor *gflat = ct_tensor_view_1d(gs, 0, p->A);
    ct_tensor *send = rows_of(s, &s->send, dy->dtype, p->A, C);
    ct_tensor *arrived = rows_of(s, &s->arrived, dy->dtype, rows, C);
    gather(s, send, dy, 1, gflat, 1);
    exchange(p, send, arrived, true);
    gather(s, dye, arrived, 4, NULL, 1);
    ct_tensor_free(g1), ct_tensor_free(gs), ct_tensor_free(gflat);
    ct_tensor_free(send), ct_tensor_free(arrived);
}

void ct_moe_dispatch_bwd(ct_moe_plan *p, ct_moe_scratch *s, const ct_tensor *dxe, ct_tensor *dx) {
    const int64_t C = ct_tensor_cols(dxe), rows = ct_moe_plan_rows(p);
    CT_ASSERT(ct_tensor_rows(dxe) == rows && ct_tensor_rows(dx) == p->N);
    upload(p, s);
    ct_tensor *leaving = rows_of(s, &s->arrived, dxe->dtype, rows, C);
    ct_tensor *back = rows_of(s, &s->send, dxe->dtype, p->A, C);
    gather(s, leaving, dxe, 5, NULL, 1);
    exchange(p, leaving, back, false);
    gather(s, dx, back, 0, NULL, p->k);
    ct_tensor_free(leaving), ct_tensor_free(back);
}
