/*
 * moe_dispatch.c — the dispatch/combine permutation of a Mixture-of-Experts layer over an
 * expert-parallel group (moe_dispatch.h): a counting sort of the assignments by expert, one
 * count exchange, the rows by all_to_all_v, and the regrouping between source-major (as the rows
 * arrive) and expert-major (as the experts read them).
 */
#include "core/model/moe_dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"

struct ct_moe_plan {
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

    /* the counts every rank agrees on: block q of sent_to is for rank q's experts */
    ct_comm_all_to_all(ep, p->sent_to, p->from, E, CT_DTYPE_I64);
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

/* Rows as they arrive (source-major: source s's rows for local experts 0, 1, ...) to
 * expert-major (local expert l's rows from sources 0, 1, ...), or back. */
static void regroup(const ct_moe_plan *p, const float *src, float *dst, int64_t C,
                    bool to_expert_major) {
    int64_t arrived = 0;                                      /* source-major row */
    int64_t *seen = ct_xcalloc((size_t)p->per, sizeof *seen); /* rows of expert l placed so far */
    for (int s = 0; s < p->P; s++)
        for (int l = 0; l < p->per; l++) {
            int64_t n = p->from[s * p->per + l], em = p->expert_off[l] + seen[l];
            size_t bytes = (size_t)(n * C) * sizeof(float);
            if (to_expert_major)
                memcpy(dst + em * C, src + arrived * C, bytes);
            else
                memcpy(dst + arrived * C, src + em * C, bytes);
            seen[l] += n;
            arrived += n;
        }
    free(seen);
}

/* Rows in send order (A) to the experts' side (source-major), or back. */
static void exchange(const ct_moe_plan *p, const float *send, float *recv, int64_t C,
                     bool to_experts) {
    int64_t *sc = ct_xmalloc((size_t)p->P * sizeof *sc),
            *rc = ct_xmalloc((size_t)p->P * sizeof *rc);
    for (int q = 0; q < p->P; q++) {
        sc[q] = (to_experts ? p->send_rows[q] : p->recv_rows[q]) * C;
        rc[q] = (to_experts ? p->recv_rows[q] : p->send_rows[q]) * C;
    }
    ct_comm_all_to_all_v(p->ep, send, sc, recv, rc, CT_DTYPE_F32);
    free(sc);
    free(rc);
}

static float *rows_new(int64_t rows, int64_t C) {
    return ct_xmalloc((size_t)(rows > 0 ? rows * C : 1) * sizeof(float));
}

/* out[i] = Σ_j w_j · rows[pos(i, j)], slot order from slot 0's term, w_j = gates[i·k + j] or 1
 * (gates NULL: 1 · r and 1 · r + y round as r and y + r do, so that is the plain sum). */
static void slot_sum(const ct_moe_plan *p, const float *rows, const float *gates, int64_t C,
                     float *out) {
    for (int64_t i = 0; i < p->N; i++) {
        float *o = out + i * C;
        for (int j = 0; j < p->k; j++) {
            const float *r = rows + p->pos[i * p->k + j] * C;
            const float w = gates ? gates[i * p->k + j] : 1.0f;
            for (int64_t c = 0; c < C; c++) o[c] = j == 0 ? w * r[c] : o[c] + w * r[c];
        }
    }
}

void ct_moe_dispatch(ct_moe_plan *p, const float *x, int64_t C, float *xe) {
    float *send = rows_new(p->A, C), *arrived = rows_new(ct_moe_plan_rows(p), C);
    for (int64_t a = 0; a < p->A; a++)
        memcpy(send + p->pos[a] * C, x + (a / p->k) * C, (size_t)C * sizeof(float));
    exchange(p, send, arrived, C, true);
    regroup(p, arrived, xe, C, true);
    free(send);
    free(arrived);
}

void ct_moe_combine(ct_moe_plan *p, const float *ye, const float *gates, int64_t C, float *ys,
                    float *y) {
    float *leaving = rows_new(ct_moe_plan_rows(p), C);
    regroup(p, ye, leaving, C, false);
    exchange(p, leaving, ys, C, false);
    free(leaving);
    slot_sum(p, ys, gates, C, y);
}

void ct_moe_combine_bwd(ct_moe_plan *p, const float *dy, const float *ys, const float *gates,
                        int64_t C, float *dgates, float *dye) {
    float *send = rows_new(p->A, C), *arrived = rows_new(ct_moe_plan_rows(p), C);
    for (int64_t a = 0; a < p->A; a++) {
        const float *dyi = dy + (a / p->k) * C, *r = ys + p->pos[a] * C;
        float *d = send + p->pos[a] * C;
        double dot = 0.0;
        for (int64_t c = 0; c < C; c++) {
            dot += (double)dyi[c] * r[c];
            d[c] = gates[a] * dyi[c];
        }
        dgates[a] = (float)dot;
    }
    exchange(p, send, arrived, C, true);
    regroup(p, arrived, dye, C, true);
    free(send);
    free(arrived);
}

void ct_moe_dispatch_bwd(ct_moe_plan *p, const float *dxe, int64_t C, float *dx) {
    float *leaving = rows_new(ct_moe_plan_rows(p), C), *back = rows_new(p->A, C);
    regroup(p, dxe, leaving, C, false);
    exchange(p, leaving, back, C, false);
    free(leaving);
    slot_sum(p, back, NULL, C, dx);
    free(back);
}
