/*
 * mpi_test_moe.c — MoE dispatch and combine (core/model/moe_dispatch.h) over an expert-parallel
 * group of every world size it runs at (test/mpi/cli_mpi_comm.sh: 1, 2, 4 and 8 ranks; ep = world),
 * on CPU backend tensors (the rows gathered by ct_gather_rows, moved by the group's
 * all_to_all_v).
 *
 * The global batch is the same at every size: tokens g = 0 .. G − 1, rank r holding a contiguous
 * run of them (rank 2 none, when there is one: a rank that sends nothing), each token's row and
 * its k experts a function of g alone. So every check has one answer whatever the ep size:
 *   - identity experts with gates 1/k: the combined output is the input and the gradient that
 *     comes back through dispatch is the upstream one, bit for bit (the rows are multiples of
 *     1/64 below 2, so k·(x/k) sums exactly for k = 1, 2, 4); the gate gradient dy·x, summed in
 *     double as the plan does, against the same sum computed here;
 *   - affine experts (expert e: x·(e + 1) + e) with uneven gates: the output equals the one-process
 *     formula Σ_j g_j · f_{e_j}(x) in slot order, bit for bit — so every row reached the expert it
 *     was routed to, and came back to its own token and slot;
 *   - the load: the assignments to each expert summed over the ranks (an MPI allreduce here) are
 *     the global counts, and the rows each rank's experts receive are what the routing sent them;
 * under three routings: spread (token g to experts h(g), h(g) + 1, ...), skewed (every token to
 * experts 0 .. k − 1, so one rank receives everything and the others nothing) and holes (even
 * experts only: the odd ones receive nothing). Prints "ok <what>" / "FAIL <what>"; exits 1 on any
 * failure.
 */
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/comm/comm.h"
#include "core/common.h"
#include "core/model/moe_dispatch.h"
#include "core/comm/comm_mpi.h"
#include "test/mpi/mpi_check.h"

static int world_rank, world_size;
static ct_backend *be; /* the CPU backend: the rows live in its memory */
static ct_moe_scratch *scratch;

enum { E = 8, C = 6, G = 61 };
enum routing { SPREAD, SKEWED, HOLES };
static const char *routing_name[] = {"spread", "skewed", "holes"};

static uint32_t hash(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    return x ^ (x >> 16);
}

/* Token g's slot j: distinct experts for one token. */
static int32_t expert_of(enum routing r, int64_t g, int j) {
    switch (r) {
    case SPREAD: return (int32_t)((hash((uint32_t)g) + (uint32_t)j) % E);
    case SKEWED: return j;
    default: return (int32_t)(2 * ((hash((uint32_t)g) + (uint32_t)j) % (E / 2)));
    }
}

/* Element c of token g's row (x, salt 0) or upstream gradient (salt 1): a multiple of 1/64 in
 * (−2, 2). */
static float value(int64_t g, int64_t c, uint32_t salt) {
    return (float)((int)(hash((uint32_t)(g * 131 + c * 7 + salt * 7919)) % 255) - 127) / 64.0f;
}

/* The tokens of rank r: a contiguous run, rank 2 holding none. */
static void my_tokens(int r, int P, int64_t *first, int64_t *n) {
    int64_t share[8] = {0}, holders = 0;
    for (int q = 0; q < P; q++) holders += q != 2;
    int64_t at = 0;
    for (int q = 0, h = 0; q < P; q++) {
        share[q] = q == 2 ? 0 : G / holders + (h < G % holders);
        if (q != 2) h++;
        if (q < r) at += share[q];
    }
    *first = at;
    *n = share[r];
}

static bool same_bits(const float *a, const float *b, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            return why("%s[%lld] = %.9g, want %.9g", what, (long long)i, a[i], b[i]);
    return true;
}

/* A (rows, cols) f32 tensor of be, from h (NULL: unset). */
static ct_tensor *dev(const float *h, int64_t rows, int64_t cols) {
    ct_tensor *t = ct_tensor_new_2d(be, CT_DTYPE_F32, rows, cols, CT_MEM_ACTS);
    if (h && rows * cols > 0) ct_tensor_from_host(t, h);
    return t;
}

static void down(float *h, const ct_tensor *t) {
    if (t->numel) ct_tensor_to_host(h, t);
}

static void test_routing(ct_comm *ep, enum routing r, int k) {
    const int P = ep->size, per = E / P;
    int64_t first, N;
    my_tokens(ep->rank, P, &first, &N);
    float *x = ct_xmalloc((size_t)(N * C + 1) * sizeof(float));
    float *dy = ct_xmalloc((size_t)(N * C + 1) * sizeof(float));
    int32_t *ids = ct_xmalloc((size_t)(N * k + 1) * sizeof(int32_t));
    float *gates = ct_xmalloc((size_t)(N * k + 1) * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
        for (int64_t c = 0; c < C; c++) {
            x[i * C + c] = value(first + i, c, 0);
            dy[i * C + c] = value(first + i, c, 1);
        }
        for (int j = 0; j < k; j++) ids[i * k + j] = expert_of(r, first + i, j);
    }
    ct_moe_plan *p = ct_moe_plan_new(ep, ids, N, k, E);
    const int64_t R = ct_moe_plan_rows(p);
    float *xe = ct_xmalloc((size_t)(R * C + 1) * sizeof(float));
    float *ye = ct_xmalloc((size_t)(R * C + 1) * sizeof(float));
    float *y = ct_xmalloc((size_t)(N * C + 1) * sizeof(float));
    float *dx = ct_xmalloc((size_t)(N * C + 1) * sizeof(float));
    float *dgates = ct_xmalloc((size_t)(N * k + 1) * sizeof(float));

    /* the load: this rank's experts receive what every rank routed to them */
    int64_t sent[E], global[E];
    for (int e = 0; e < E; e++) sent[e] = ct_moe_plan_sent_to(p, e);
    MPI_Allreduce(sent, global, E, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    int64_t want[E] = {0};
    for (int64_t g = 0; g < G; g++)
        for (int j = 0; j < k; j++) want[expert_of(r, g, j)]++;
    bool ok = true;
    for (int e = 0; e < E && ok; e++)
        if (global[e] != want[e])
            ok = why("expert %d: %lld assignments over the ranks, want %lld", e,
                     (long long)global[e], (long long)want[e]);
    for (int l = 0; l < per && ok; l++)
        if (ct_moe_plan_expert_rows(p, l) != want[ep->rank * per + l])
            ok = why("local expert %d receives %lld rows, want %lld", l,
                     (long long)ct_moe_plan_expert_rows(p, l), (long long)want[ep->rank * per + l]);
    check(ok, "moe load: counts per expert, %s routing, k=%d", routing_name[r], k);

    /* identity experts, gates 1/k */
    ct_tensor *tx = dev(x, N, C), *tdy = dev(dy, N, C), *txe = dev(NULL, R, C);
    ct_tensor *tys = dev(NULL, N * k, C), *ty = dev(NULL, N, C), *tdye = dev(NULL, R, C);
    ct_tensor *tdx = dev(NULL, N, C), *tdg = dev(NULL, N * k, 1);
    for (int64_t a = 0; a < N * k; a++) gates[a] = 1.0f / (float)k;
    ct_tensor *tg = dev(gates, N * k, 1);
    ct_moe_dispatch(p, scratch, tx, txe);
    ct_moe_combine(p, scratch, txe, tg, tys, ty); /* ye = xe */
    down(y, ty);
    ok = same_bits(y, x, N * C, "y");
    ct_moe_combine_bwd(p, scratch, tdy, tys, tg, tdg, tdye);
    ct_moe_dispatch_bwd(p, scratch, tdye, tdx);
    down(dx, tdx), down(dgates, tdg);
    ok = ok && same_bits(dx, dy, N * C, "dx");
    for (int64_t a = 0; a < N * k && ok; a++) {
        double dot = 0.0;
        for (int64_t c = 0; c < C; c++) dot += (double)dy[(a / k) * C + c] * x[(a / k) * C + c];
        float w = (float)dot;
        ok = same_bits(&dgates[a], &w, 1, "dgates");
    }
    check(ok, "moe identity experts, gates 1/k: y = x, dx = dy, dgates = dy.x, %s routing, k=%d",
          routing_name[r], k);

    /* affine experts, uneven gates: against the one-process formula */
    for (int64_t a = 0; a < N * k; a++)
        gates[a] = 0.5f + 0.25f * (float)(hash((uint32_t)(first * k + a)) % 7);
    ct_tensor_from_host(tg, gates);
    ct_moe_dispatch(p, scratch, tx, txe);
    down(xe, txe);
    for (int l = 0; l < per; l++) {
        const float e = (float)(ep->rank * per + l);
        for (int64_t row = ct_moe_plan_expert_offset(p, l);
             row < ct_moe_plan_expert_offset(p, l + 1); row++)
            for (int64_t c = 0; c < C; c++) ye[row * C + c] = xe[row * C + c] * (e + 1.0f) + e;
    }
    ct_tensor *tye = dev(ye, R, C);
    ct_moe_combine(p, scratch, tye, tg, tys, ty);
    down(y, ty);
    ok = true;
    for (int64_t i = 0; i < N && ok; i++)
        for (int64_t c = 0; c < C && ok; c++) {
            float want_y = 0.0f;
            for (int j = 0; j < k; j++) {
                const float e = (float)ids[i * k + j], f = x[i * C + c] * (e + 1.0f) + e;
                want_y = j == 0 ? gates[i * k] * f : want_y + gates[i * k + j] * f;
            }
            ok = same_bits(&y[i * C + c], &want_y, 1, "y");
        }
    check(ok, "moe affine experts: y = sum_j g_j f_e_j(x) as one process, %s routing, k=%d",
          routing_name[r], k);

    ct_moe_plan_free(p);
    ct_tensor *ts[] = {tx, tdy, txe, tys, ty, tdye, tdx, tdg, tg, tye};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_free(ts[i]);
    free(x), free(dy), free(ids), free(gates), free(xe), free(ye), free(y);
    free(dx), free(dgates);
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int provided;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (E % world_size != 0 || world_size > 8) {
        if (world_rank == 0)
            printf("skip np%d: %d experts do not split over %d ranks\n", world_size, E, world_size);
        MPI_Finalize();
        return 0;
    }
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    ct_comm *ep = ct_comm_mpi_new(dup, "ep", 120.0);
    if (ct_backend_new(&be, "cpu", 1, NULL, 0) != CT_OK) {
        ct_error_print();
        return 1;
    }
    ct_comm_set_stream(ep, be);
    scratch = ct_moe_scratch_new(be);
    for (int r = SPREAD; r <= HOLES; r++)
        for (int k = 1; k <= 4; k *= 2) test_routing(ep, (enum routing)r, k);
    ct_moe_scratch_free(scratch);
    ct_comm_unset_stream(ep, be);
    ct_backend_free(be);
    ct_comm_free(ep);
    MPI_Finalize();
    return n_fail ? 1 : 0;
}
