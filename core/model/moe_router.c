/*
 * moe_router.c — the MoE router on the host (moe_router.h): per token, the distribution over the
 * experts in double, the top k by key with ties to the lower index, the gates, and their
 * backward; the Switch/GShard balancing loss and its gradient.
 */
#include "core/model/moe_router.h"

#include <math.h>
#include <stdlib.h>

#include "core/common.h"

/* The token's distribution (softmax of z, or sigmoid scores s for SIGMOID, with their sum) in
 * double: dist[i] and, for SIGMOID, sum = Σ s. */
static void token_dist(ct_router_kind kind, const float *z, int E, double *dist, double *sum) {
    double acc = 0.0;
    if (kind == CT_ROUTER_SIGMOID) {
        for (int i = 0; i < E; i++) acc += dist[i] = 1.0 / (1.0 + exp(-(double)z[i]));
    } else {
        double m = z[0];
        for (int i = 1; i < E; i++) m = fmax(m, z[i]);
        for (int i = 0; i < E; i++) acc += dist[i] = exp((double)z[i] - m);
        for (int i = 0; i < E; i++) dist[i] /= acc;
    }
    *sum = acc;
}

/* The k largest keys, descending, the lower index first among equals (a strict > keeps the first
 * seen). taken: E flags, cleared here. */
static void top_k(const double *key, int E, int k, int32_t *ids, unsigned char *taken) {
    for (int i = 0; i < E; i++) taken[i] = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < E; i++)
            if (!taken[i] && (best < 0 || key[i] > key[best])) best = i;
        taken[best] = 1;
        ids[j] = best;
    }
}

/* The chosen experts' gates in double: g[j] for ids[j]. */
static void token_gates(ct_router_kind kind, const float *z, const double *dist, const int32_t *ids,
                        int k, double *g) {
    double sum = 0.0;
    switch (kind) {
    case CT_ROUTER_SOFTMAX_TOPK:
        for (int j = 0; j < k; j++) g[j] = dist[ids[j]];
        return;
    case CT_ROUTER_TOPK_SOFTMAX: {
        double m = z[ids[0]];
        for (int j = 1; j < k; j++) m = fmax(m, z[ids[j]]);
        for (int j = 0; j < k; j++) sum += g[j] = exp((double)z[ids[j]] - m);
        break;
    }
    case CT_ROUTER_SIGMOID:
        for (int j = 0; j < k; j++) sum += g[j] = dist[ids[j]];
        break;
    }
    for (int j = 0; j < k; j++) g[j] /= sum;
}

void ct_router_fwd(ct_router_kind kind, const float *logits, const float *bias, int64_t N, int E,
                   int k, float *probs, int32_t *ids, float *gates) {
    CT_ASSERTF(E >= 1 && k >= 1 && k <= E && N >= 0, "router: N=%lld E=%d k=%d", (long long)N, E,
               k);
    double *dist = ct_xmalloc(sizeof(double) * (size_t)(2 * E + k));
    double *key = dist + E, *g = key + E;
    unsigned char *taken = ct_xmalloc((size_t)E);
    for (int64_t t = 0; t < N; t++) {
        const float *z = logits + t * E;
        double sum;
        token_dist(kind, z, E, dist, &sum);
        for (int i = 0; i < E; i++) {
            key[i] = kind == CT_ROUTER_TOPK_SOFTMAX ? (double)z[i] : dist[i];
            if (bias) key[i] += bias[i];
            probs[t * E + i] = (float)(kind == CT_ROUTER_SIGMOID ? dist[i] / sum : dist[i]);
        }
        top_k(key, E, k, ids + t * k, taken);
        token_gates(kind, z, dist, ids + t * k, k, g);
        for (int j = 0; j < k; j++) gates[t * k + j] = (float)g[j];
    }
    free(taken);
    free(dist);
}

void ct_router_bwd(ct_router_kind kind, const float *logits, const int32_t *ids,
                   const float *dgates, int64_t N, int E, int k, float *dlogits) {
    double *dist = ct_xmalloc(sizeof(double) * (size_t)(E + k));
    double *g = dist + E;
    for (int64_t t = 0; t < N; t++) {
        const float *z = logits + t * E;
        const int32_t *id = ids + t * k;
        const float *dg = dgates + t * k;
        float *dz = dlogits + t * E;
        double sum, gdg = 0.0;
        token_dist(kind, z, E, dist, &sum);
        token_gates(kind, z, dist, id, k, g);
        for (int j = 0; j < k; j++) gdg += g[j] * dg[j];
        for (int i = 0; i < E; i++) dz[i] = 0.0f;
        switch (kind) {
        case CT_ROUTER_SOFTMAX_TOPK: /* dp = dg on the chosen; dz = p ⊙ (dp − Σ p·dp) */
            for (int i = 0; i < E; i++) {
                double dp = 0.0;
                for (int j = 0; j < k; j++)
                    if (id[j] == i) dp = dg[j];
                dz[i] = (float)(dist[i] * (dp - gdg));
            }
            break;
        case CT_ROUTER_TOPK_SOFTMAX: /* a softmax over the chosen logits */
            for (int j = 0; j < k; j++) dz[id[j]] = (float)(g[j] * (dg[j] - gdg));
            break;
        case CT_ROUTER_SIGMOID: { /* g = s / S over the chosen; ds = (dg − Σ g·dg) / S */
            double S = 0.0;
            for (int j = 0; j < k; j++) S += dist[id[j]];
            for (int j = 0; j < k; j++) {
                const double s = dist[id[j]];
                dz[id[j]] = (float)((dg[j] - gdg) / S * s * (1.0 - s));
            }
            break;
        }
        }
    }
    free(dist);
}

double ct_router_aux_loss(const int64_t *counts, const double *psum, int64_t T, int E, int k,
                          double alpha) {
    double acc = 0.0;
    for (int i = 0; i < E; i++) acc += (double)counts[i] / ((double)T * k) * (psum[i] / (double)T);
    return alpha * E * acc;
}

void ct_router_aux_bwd(ct_router_kind kind, const float *logits, const int64_t *counts, int64_t T,
                       int64_t N, int E, int k, double alpha, double scale, float *dlogits) {
    double *dist = ct_xmalloc(sizeof(double) * (size_t)(2 * E));
    double *coef = dist + E;
    for (int i = 0; i < E; i++)
        coef[i] = scale * alpha * E * (double)counts[i] / ((double)k * (double)T * (double)T);
    for (int64_t t = 0; t < N; t++) {
        const float *z = logits + t * E;
        float *dz = dlogits + t * E;
        double sum, pc = 0.0;
        token_dist(kind, z, E, dist, &sum);
        if (kind == CT_ROUTER_SIGMOID) { /* q = s / S over all E */
            for (int i = 0; i < E; i++) pc += dist[i] / sum * coef[i];
            for (int i = 0; i < E; i++)
                dz[i] += (float)((coef[i] - pc) / sum * dist[i] * (1.0 - dist[i]));
        } else { /* dz = p ⊙ (c − Σ p·c) */
            for (int i = 0; i < E; i++) pc += dist[i] * coef[i];
            for (int i = 0; i < E; i++) dz[i] += (float)(dist[i] * (coef[i] - pc));
        }
    }
    free(dist);
}

void ct_router_bias_update(const int64_t *counts, int E, float rate, float *bias) {
    int64_t sum = 0;
    for (int i = 0; i < E; i++) sum += counts[i];
    for (int i = 0; i < E; i++) {
        const int64_t share = (int64_t)E * counts[i];
        if (share > sum)
            bias[i] -= rate;
        else if (share < sum)
            bias[i] += rate;
    }
}
