/*
 * test_moe_router.c — the MoE router (core/model/moe_router.h) against a scalar reference written
 * here (a full sort of the experts by key, then the gate formulas in long double), ties, the
 * balancing loss's two anchor values, and both backward passes against central finite
 * differences.
 *
 * Tolerances: the router and the reference both compute in double and round once to fp32, so
 * gates and probabilities agree to 2 fp32 ulps (2^-23 relative each; 1e-6 covers it with room for
 * the different summation orders of E <= 16 terms in double). The finite differences use h = 1e-3
 * on logits of order 1 in long double: their truncation error is O(h²·|f'''|) < 1e-6, and the
 * gradients are compared to 2e-5 absolute, which covers that and the fp32 rounding of dlogits.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/model/moe_router.h"

static const ct_router_kind kinds[] = {CT_ROUTER_SOFTMAX_TOPK, CT_ROUTER_TOPK_SOFTMAX,
                                       CT_ROUTER_SIGMOID};

static float uniform(unsigned *seed) {
    *seed = *seed * 1664525u + 1013904223u;
    return (float)(*seed >> 8) / (float)(1u << 24) * 4.0f - 2.0f;
}

/* ---- the reference --------------------------------------------------------------------------- */

typedef struct {
    long double key;
    int index;
} keyed;

static int by_key(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return x->index - y->index;
}

/* dist: softmax or sigmoid of z in long double (no max subtraction: |z| <= 2 here). */
static void ref_dist(ct_router_kind kind, const float *z, int E, long double *dist) {
    long double s = 0;
    for (int i = 0; i < E; i++) {
        dist[i] = kind == CT_ROUTER_SIGMOID ? 1.0L / (1.0L + expl(-(long double)z[i]))
                                            : expl((long double)z[i]);
        s += dist[i];
    }
    if (kind != CT_ROUTER_SIGMOID)
        for (int i = 0; i < E; i++) dist[i] /= s;
}

/* The chosen experts (ids, k of them) and their gates for one token, with the ids given (fixed)
 * or chosen (ids_fixed NULL). */
static void ref_token(ct_router_kind kind, const float *z, const float *bias, int E, int k,
                      const int32_t *ids_fixed, int32_t *ids, long double *gates) {
    long double dist[64];
    keyed order[64];
    ref_dist(kind, z, E, dist);
    for (int i = 0; i < E; i++) {
        order[i].key = kind == CT_ROUTER_TOPK_SOFTMAX ? (long double)z[i] : dist[i];
        if (bias) order[i].key += bias[i];
        order[i].index = i;
    }
    qsort(order, (size_t)E, sizeof *order, by_key);
    for (int j = 0; j < k; j++) ids[j] = ids_fixed ? ids_fixed[j] : order[j].index;
    long double sum = 0;
    for (int j = 0; j < k; j++) {
        gates[j] = kind == CT_ROUTER_TOPK_SOFTMAX ? expl((long double)z[ids[j]]) : dist[ids[j]];
        sum += gates[j];
    }
    if (kind != CT_ROUTER_SOFTMAX_TOPK)
        for (int j = 0; j < k; j++) gates[j] /= sum;
}

/* ---- forward --------------------------------------------------------------------------------- */

static void check_forward(ct_router_kind kind, int E, int k, bool with_bias, unsigned seed) {
    enum { N = 40 };
    float z[N * 16], bias[16], probs[N * 16], gates[N * 16];
    int32_t ids[N * 16], rids[16];
    long double rg[16], dist[64];
    for (int i = 0; i < N * E; i++) z[i] = uniform(&seed);
    for (int i = 0; i < E; i++) bias[i] = 0.3f * uniform(&seed);
    ct_router_fwd(kind, z, with_bias ? bias : NULL, N, E, k, probs, ids, gates);
    for (int t = 0; t < N; t++) {
        ref_token(kind, z + t * E, with_bias ? bias : NULL, E, k, NULL, rids, rg);
        ref_dist(kind, z + t * E, E, dist);
        long double s = 0;
        for (int i = 0; i < E; i++) s += dist[i];
        for (int j = 0; j < k; j++) {
            assert_int_equal(ids[t * k + j], rids[j]);
            assert_true(fabsl(gates[t * k + j] - rg[j]) <= 1e-6L * fabsl(rg[j]));
        }
        for (int i = 0; i < E; i++) {
            long double want = kind == CT_ROUTER_SIGMOID ? dist[i] / s : dist[i];
            assert_true(fabsl(probs[t * E + i] - want) <= 1e-6L * want);
        }
    }
}

static void test_router_forward(void **state) {
    (void)state;
    for (int v = 0; v < 3; v++) {
        check_forward(kinds[v], 8, 2, false, 1u + (unsigned)v);
        check_forward(kinds[v], 8, 1, false, 11u + (unsigned)v);
        check_forward(kinds[v], 16, 4, true, 21u + (unsigned)v);
        check_forward(kinds[v], 5, 5, false, 31u + (unsigned)v);
    }
}

/* Equal keys go to the lower index, listed first. */
static void test_router_ties(void **state) {
    (void)state;
    const int E = 6, k = 3;
    float z[2 * 6] = {0.5f,   0.5f,  0.5f,  0.5f,  0.5f,  0.5f,   /* all equal */
                      0.125f, 0.25f, 0.25f, 0.75f, 0.25f, 0.75f}; /* exact in binary */
    float probs[12], gates[6];
    int32_t ids[6];
    for (int v = 0; v < 3; v++) {
        ct_router_fwd(kinds[v], z, NULL, 2, E, k, probs, ids, gates);
        const int32_t want[6] = {0, 1, 2, 3, 5, 1};
        for (int j = 0; j < 6; j++) assert_int_equal(ids[j], want[j]);
    }
    /* a bias that makes experts 1 and 4 equal to 3 and 5 keeps the index order */
    const float bias[6] = {0, 0.5f, 0, 0, 0.5f, 0};
    ct_router_fwd(CT_ROUTER_TOPK_SOFTMAX, z + 6, bias, 1, E, 4, probs, ids, gates);
    const int32_t want[4] = {1, 3, 4, 5};
    for (int j = 0; j < 4; j++) assert_int_equal(ids[j], want[j]);
}

/* ---- balancing loss -------------------------------------------------------------------------- */

static void test_aux_loss_anchors(void **state) {
    (void)state;
    const int E = 8;
    int64_t counts[8];
    double psum[8];
    /* uniform: T tokens, k = 2, each expert gets T·k/E slots and probability 1/E */
    const int64_t T = 64;
    for (int i = 0; i < E; i++) counts[i] = T * 2 / E, psum[i] = (double)T / E;
    assert_true(fabs(ct_router_aux_loss(counts, psum, T, E, 2, 0.01) - 0.01) <= 1e-15);
    /* every token to expert 3 with probability 1, k = 1: alpha·E */
    for (int i = 0; i < E; i++) counts[i] = i == 3 ? T : 0, psum[i] = i == 3 ? (double)T : 0.0;
    assert_true(fabs(ct_router_aux_loss(counts, psum, T, E, 1, 0.01) - 0.08) <= 1e-15);
}

/* Auxiliary-loss-free balancing: each expert's bias moves by the rate against its load, on
 * integer counts (a mean of 5 exactly: no float rounding may tip the equal expert), and then
 * shifts the choice toward the underloaded expert. */
static void test_bias_update(void **state) {
    (void)state;
    const int64_t counts[4] = {11, 2, 5, 2}; /* sum 20, mean 5 */
    float bias[4] = {0.25f, 0.0f, -0.5f, 0.0f};
    ct_router_bias_update(counts, 4, 0.125f, bias);
    const float want[4] = {0.125f, 0.125f, -0.5f, 0.125f};
    for (int i = 0; i < 4; i++) assert_true(bias[i] == want[i]);
    /* balanced: nothing moves */
    const int64_t even[4] = {3, 3, 3, 3};
    ct_router_bias_update(even, 4, 0.125f, bias);
    for (int i = 0; i < 4; i++) assert_true(bias[i] == want[i]);
    /* the bias moves the choice from the overloaded expert 0 to expert 1 */
    const float z[4] = {1.0f, 0.875f, 0.0f, 0.0f};
    float probs[4], gates[1];
    int32_t id;
    const float tilt[4] = {-0.125f, 0.125f, 0.0f, 0.0f};
    ct_router_fwd(CT_ROUTER_TOPK_SOFTMAX, z, NULL, 1, 4, 1, probs, &id, gates);
    assert_int_equal(id, 0);
    ct_router_fwd(CT_ROUTER_TOPK_SOFTMAX, z, tilt, 1, 4, 1, probs, &id, gates);
    assert_int_equal(id, 1);
    assert_true(gates[0] == 1.0f); /* the gate is the chosen expert's own, not the bias's */
}

/* ---- backward against finite differences ----------------------------------------------------- */

/* What an objective of the logits needs besides them. */
typedef struct {
    ct_router_kind kind;
    int64_t N;
    int E, k;
    const int32_t *ids; /* the gates' experts, held fixed */
    const float *w;     /* the gates' weights */
    const int64_t *counts;
    double alpha;
} objective_ctx;
typedef long double (*objective_fn)(const float *z, const objective_ctx *c);

/* d f / d z[i] by central differences of step h (the steps as the fp32 logit really moved). */
static long double central_diff(objective_fn f, const objective_ctx *c, float *z, int i, double h) {
    const float z0 = z[i];
    z[i] = (float)(z0 + h);
    const long double up = f(z, c), hu = (long double)z[i] - z0;
    z[i] = (float)(z0 - h);
    const long double down = f(z, c), hd = z0 - (long double)z[i];
    z[i] = z0;
    return (up - down) / (hu + hd);
}

/* Σ_t Σ_j w[t][j]·gate[t][j] with the experts fixed (ids), in long double. */
static long double gate_objective(const float *z, const objective_ctx *c) {
    long double acc = 0, g[16];
    int32_t tmp[16];
    for (int64_t t = 0; t < c->N; t++) {
        ref_token(c->kind, z + t * c->E, NULL, c->E, c->k, c->ids + t * c->k, tmp, g);
        for (int j = 0; j < c->k; j++) acc += c->w[t * c->k + j] * g[j];
    }
    return acc;
}

static void test_router_backward(void **state) {
    (void)state;
    enum { N = 6, E = 8, K = 3 };
    const double h = 1e-3;
    unsigned seed = 77;
    for (int v = 0; v < 3; v++) {
        float z[N * E], probs[N * E], gates[N * K], w[N * K], dz[N * E];
        int32_t ids[N * K];
        for (int i = 0; i < N * E; i++) z[i] = uniform(&seed);
        for (int i = 0; i < N * K; i++) w[i] = uniform(&seed);
        ct_router_fwd(kinds[v], z, NULL, N, E, K, probs, ids, gates);
        ct_router_bwd(kinds[v], z, ids, w, N, E, K, dz);
        const objective_ctx c = {kinds[v], N, E, K, ids, w, NULL, 0.0};
        for (int i = 0; i < N * E; i++)
            assert_true(fabsl(dz[i] - central_diff(gate_objective, &c, z, i, h)) <= 2e-5L);
    }
}

/* The balancing loss of N tokens with their counts fixed, as a function of the logits. */
static long double aux_objective(const float *z, const objective_ctx *c) {
    const ct_router_kind kind = c->kind;
    const int64_t N = c->N;
    const int E = c->E, k = c->k;
    long double psum[16] = {0}, dist[64];
    for (int64_t t = 0; t < N; t++) {
        ref_dist(kind, z + t * E, E, dist);
        long double s = 0;
        for (int i = 0; i < E; i++) s += dist[i];
        for (int i = 0; i < E; i++) psum[i] += kind == CT_ROUTER_SIGMOID ? dist[i] / s : dist[i];
    }
    long double acc = 0;
    for (int i = 0; i < E; i++)
        acc += (long double)c->counts[i] / ((long double)N * k) * psum[i] / N;
    return c->alpha * E * acc;
}

static void test_aux_backward(void **state) {
    (void)state;
    enum { N = 5, E = 6, K = 2 };
    const double h = 1e-3, alpha = 0.3, scale = 2.0;
    unsigned seed = 5;
    for (int v = 0; v < 3; v++) {
        float z[N * E], probs[N * E], gates[N * K], dz[N * E];
        int32_t ids[N * K];
        int64_t counts[E] = {0};
        for (int i = 0; i < N * E; i++) z[i] = uniform(&seed);
        ct_router_fwd(kinds[v], z, NULL, N, E, K, probs, ids, gates);
        for (int i = 0; i < N * K; i++) counts[ids[i]]++;
        for (int i = 0; i < N * E; i++) dz[i] = 0.25f; /* added to, not overwritten */
        ct_router_aux_bwd(kinds[v], z, counts, N, N, E, K, alpha, scale, dz);
        const objective_ctx c = {kinds[v], N, E, K, NULL, NULL, counts, alpha};
        for (int i = 0; i < N * E; i++)
            assert_true(fabsl(dz[i] - 0.25L - scale * central_diff(aux_objective, &c, z, i, h)) <=
                        2e-5L);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router_forward),   cmocka_unit_test(test_router_ties),
        cmocka_unit_test(test_aux_loss_anchors), cmocka_unit_test(test_router_backward),
        cmocka_unit_test(test_aux_backward),     cmocka_unit_test(test_bias_update),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
