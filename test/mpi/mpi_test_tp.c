/*
 * mpi_test_tp.c — tensor parallelism against the unsplit model, run under mpirun by
 * test/mpi/cli_mpi_tp.sh with the world as one tp group (2 or 4 ranks).
 *
 * Every rank builds the full model (a one-rank layout) and its tp shard of the same model
 * (same seed: the shard initialises exactly its slice; biases and norm weights are then moved
 * off their initial zeros and ones, the same way in both) and runs one microbatch through both:
 *   - forward: the logits of the shard are its vocabulary slice of the full logits; the loss
 *     matches;
 *   - backward: every parameter's gradient is its slice of the full gradient — column-parallel
 *     (q, k, v, MLP up: rows), row-parallel (attention out, MLP down: columns), the
 *     vocab-parallel embedding / tied LM head (rows), and the replicated norms, biases and
 *     position embedding (identical on every rank; with sequence parallelism partial sums
 *     whose tp sum is the full gradient).
 * Then the vocab-parallel cross-entropy alone against the plain one on the same logits, with
 * targets on every shard and padded columns, counting exactly three allreduces. Then a model with
 * an MoE layer: the balancing loss's value and gradient alone (compare_moe_aux), with and without
 * sequence parallelism.
 *
 * Tolerance: the shard sums the same products in another order (partial sums over tp, then
 * an allreduce), so values agree to fp32 rounding of the magnitudes involved: we allow
 * 2e-5 · max|full gradient of that tensor| + 1e-7 absolute, and 1e-5 relative on the loss.
 * Prints "ok <what>" / "FAIL <what>" lines; exits 1 on any failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/model/model.h"
#include "core/rng.h"
#include "parallel/context.h"
#include "test/unit/test_util.h"

static int failures, rank, world;

static void check(bool cond, const char *fmt, const char *what, double a, double b) {
    if (rank != 0 && cond) return;
    if (cond)
        printf("ok %s\n", what);
    else {
        printf("FAIL %s (rank %d): ", what, rank);
        printf(fmt, a, b);
        printf("\n");
        failures++;
    }
}

static float *to_host(const ct_tensor *t) {
    float *h = ct_xmalloc((size_t)t->numel * sizeof(float));
    ct_tensor_to_host(h, t);
    return h;
}

/* test_util.h's tiny model on 8 positions and 2 sequences. */
static void tiny_config(ct_config *cfg) {
    test_tiny_config(cfg, NULL);
    cfg->model.seq_len = 8;
    cfg->train.global_batch = 2;
    cfg->train.micro_batch = 2;
    if (ct_config_validate(cfg, 1) != CT_OK) {
        ct_error_print();
        exit(1);
    }
}

/* The larger of two errors where NaN wins: fmax would drop a NaN and let a broken value pass. */
static double worse(double a, double b) {
    return isnan(a) || isnan(b) ? NAN : (a > b ? a : b);
}

/* Max |x| over a tensor's host copy (NaN if any element is NaN). */
static double max_abs(const float *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = worse(m, fabs(x[i]));
    return m;
}

/*
 * At initialisation biases are zero and norm weights one, so a bug that adds a bias twice or
 * scales by a norm weight in the wrong place would not show. Both models get the same nonzero
 * values instead: every bias and norm element is offset by a deterministic function of (tensor
 * name, global element index), the shard writing exactly its slice (padded vocabulary rows stay
 * zero: they are not parameters anyone may use).
 */
static void perturb(ct_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        ct_param *p = &m->params[i];
        if (p->init == CT_INIT_NORMAL) continue;
        float *h = to_host(p->value);
        uint64_t stream = ct_rng_hash_name(p->name);
        int64_t rows = p->local_shape[0], cols = p->local_shape[1], gcols = p->global_shape[1];
        int64_t row0 = p->tp_split_dim == 0 ? p->tp_offset : 0;
        int64_t col0 = p->tp_split_dim == 1 ? p->tp_offset : 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                h[r * cols + c] +=
                    (float)(0.1 *
                            ct_rng_normal(99, stream, (uint64_t)((row0 + r) * gcols + col0 + c)));
        ct_tensor_from_host(p->value, h);
        free(h);
    }
}

static void compare_model(ct_pctx *pctx, bool sp) {
    ct_config cfg;
    tiny_config(&cfg);
    ct_backend *be = test_backend_new(1);
    ct_model_layout full_layout = ct_model_layout_single(&cfg);
    ct_model_layout shard_layout = full_layout;
    shard_layout.tp = pctx->tp_comm;
    shard_layout.tp_rank = pctx->tp_rank;
    shard_layout.tp_size = pctx->tp;
    shard_layout.sequence_parallel = sp;
    ct_model *full, *shard;
    ct_acts *fa, *sa;
    ct_grad_scratch *fs, *ss;
    const int64_t B = 2, T = cfg.model.seq_len, N = B * T;
    if (ct_model_new(&full, &cfg, be, &full_layout) ||
        ct_model_new(&shard, &cfg, be, &shard_layout) || ct_acts_new(&fa, full, B) ||
        ct_acts_new(&sa, shard, B) || ct_grad_scratch_new(&fs, full, B) ||
        ct_grad_scratch_new(&ss, shard, B)) {
        ct_error_print();
        exit(1);
    }
    perturb(full);
    perturb(shard);
    int32_t tokens[64], targets[64];
    for (int64_t i = 0; i < N; i++) {
        /* every vocabulary shard gets targets, padded columns never */
        tokens[i] = (int32_t)(ct_rng_u64(3, 1, (uint64_t)i) % 123);
        targets[i] = (int32_t)((i * 37 + 5) % 123);
    }
    ct_acts_set_batch(fa, 0, tokens, targets);
    ct_acts_set_batch(sa, 0, tokens, targets);
    char what[160];

    /* Forward only: the logits are a column slice of the full logits. */
    double lf = ct_model_forward_loss(full, fa, 0.0f), ls = ct_model_forward_loss(shard, sa, 0.0f);
    snprintf(what, sizeof what, "tp=%d%s forward loss", world, sp ? " sp" : "");
    check(fabs(lf - ls) <= 1e-5 * fabs(lf), "%.8g vs %.8g", what, lf, ls);
    float *logits_full = to_host(fa->logits), *logits_shard = to_host(sa->logits);
    int64_t Vl = sa->logits->shape[1], Vp = fa->logits->shape[1], off = shard->wte->tp_offset;
    double worst = 0, scale = max_abs(logits_full, N * Vp);
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < Vl; c++)
            worst = worse(worst, fabs(logits_full[r * Vp + off + c] - logits_shard[r * Vl + c]));
    snprintf(what, sizeof what, "tp=%d%s logits are the vocabulary slice", world, sp ? " sp" : "");
    check(worst <= 2e-5 * scale + 1e-7, "max diff %.3g (scale %.3g)", what, worst, scale);
    free(logits_full);
    free(logits_shard);

    /* Forward + backward. */
    ct_model_zero_grads(full);
    ct_model_zero_grads(shard);
    ct_model_forward(full, fa, (float)(1.0 / N));
    ct_model_forward(shard, sa, (float)(1.0 / N));
    ct_model_backward(full, fa, fs);
    ct_model_backward(shard, sa, ss);
    for (int i = 0; i < shard->n_params; i++) {
        ct_param *ps = &shard->params[i];
        ct_param *pf = ct_model_find_param(full, ps->name);
        float *gf = to_host(pf->grad), *gs = to_host(ps->grad);
        if (sp && ps->tp_split_dim < 0) {
            /* partial over the tp group's positions: their sum is the gradient */
            ct_comm_allreduce(pctx->tp_comm, gs, ps->numel, CT_DTYPE_F32, CT_REDUCE_SUM);
        }
        int64_t rows = ps->local_shape[0], cols = ps->local_shape[1], gcols = pf->local_shape[1];
        int64_t row0 = ps->tp_split_dim == 0 ? ps->tp_offset : 0;
        int64_t col0 = ps->tp_split_dim == 1 ? ps->tp_offset : 0;
        double err = 0, gscale = max_abs(gf, pf->numel);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                err = worse(err, fabs(gf[(row0 + r) * gcols + col0 + c] - gs[r * cols + c]));
        const char *kind = ps->tp_split_dim == 0   ? "rows"
                           : ps->tp_split_dim == 1 ? "columns"
                                                   : "replicated";
        snprintf(what, sizeof what, "tp=%d%s gradient of %s (%s)", world, sp ? " sp" : "", ps->name,
                 kind);
        check(err <= 2e-5 * gscale + 1e-7, "max diff %.3g (scale %.3g)", what, err, gscale);
        free(gf);
        free(gs);
    }
    ct_grad_scratch_free(fs), ct_grad_scratch_free(ss);
    ct_acts_free(fa), ct_acts_free(sa);
    ct_model_free(full), ct_model_free(shard);
    ct_backend_free(be);
}

/* Every parameter's gradient of one forward + backward, host copies in registry order; with
 * sequence parallelism a replicated tensor's partials summed over the tp group (allreduce). */
static float **all_grads(ct_model *m, ct_acts *a, ct_grad_scratch *gs, ct_pctx *pctx, bool sp) {
    ct_model_zero_grads(m);
    ct_model_forward(m, a, (float)(1.0 / (double)ct_tensor_rows(a->logits)));
    ct_model_backward(m, a, gs);
    float **g = ct_xcalloc((size_t)m->n_params, sizeof *g);
    for (int i = 0; i < m->n_params; i++) {
        g[i] = to_host(m->params[i].grad);
        if (sp && m->params[i].tp_split_dim < 0 && pctx)
            ct_comm_allreduce(pctx->tp_comm, g[i], m->params[i].numel, CT_DTYPE_F32, CT_REDUCE_SUM);
    }
    return g;
}

static void free_grads(float **g, int n) {
    for (int i = 0; i < n; i++) free(g[i]);
    free(g);
}

/*
 * The MoE balancing loss alone, split over tp with and without sequence parallelism: its value
 * (ct_model_moe_stats) on every tp rank equals the unsplit model's, and so does its gradient —
 * taken as the difference of every parameter's gradient with the loss weighted alpha and with
 * alpha 0 (the routing does not depend on alpha; the language-model part cancels), which carries
 * the loss's input gradient through the MoE layer into layer 0 and the embeddings. Tolerance:
 * each of the two gradients within 2e-5 · its scale (as compare_model), so the difference within
 * 2e-5 · (both scales) + 1e-7. The balancing part must be real: the router's, and layer 0's query
 * weights' (reached only through the MoE layer's input gradient), differ from zero by far more.
 */
static void compare_moe_aux(ct_pctx *pctx, bool sp) {
    ct_config cfg;
    test_tiny_config(&cfg, NULL);
    cfg.model.seq_len = 8;
    cfg.train.global_batch = cfg.train.micro_batch = 2;
    cfg.model.moe_experts = 4, cfg.model.moe_top_k = 2, cfg.model.moe_every = 2;
    cfg.model.moe_d_ff = 32, cfg.model.moe_aux_alpha = 1.0;
    if (ct_config_validate(&cfg, 1) != CT_OK) {
        ct_error_print();
        exit(1);
    }
    ct_backend *be = test_backend_new(1);
    ct_model_layout full_layout = ct_model_layout_single(&cfg), shard_layout = full_layout;
    shard_layout.tp = pctx->tp_comm;
    shard_layout.tp_rank = pctx->tp_rank;
    shard_layout.tp_size = pctx->tp;
    shard_layout.sequence_parallel = sp;
    ct_model *m[2];
    ct_acts *a[2];
    ct_grad_scratch *gs[2];
    const int64_t B = 2, N = B * cfg.model.seq_len;
    int32_t tokens[16], targets[16];
    for (int64_t i = 0; i < N; i++) {
        tokens[i] = (int32_t)(ct_rng_u64(5, 1, (uint64_t)i) % 123);
        targets[i] = (int32_t)((i * 41 + 3) % 123);
    }
    float **g[2][2]; /* [full, shard][alpha, 0] */
    double aux[2];
    for (int s = 0; s < 2; s++) {
        if (ct_model_new(&m[s], &cfg, be, s ? &shard_layout : &full_layout) ||
            ct_acts_new(&a[s], m[s], B) || ct_grad_scratch_new(&gs[s], m[s], B)) {
            ct_error_print();
            exit(1);
        }
        perturb(m[s]);
        ct_acts_set_batch(a[s], 0, tokens, targets);
        g[s][0] = all_grads(m[s], a[s], gs[s], s ? pctx : NULL, sp);
        double z;
        int64_t counts[4];
        ct_model_moe_stats(m[s], &aux[s], &z, counts);
        m[s]->mc.moe_aux_alpha = 0.0;
        g[s][1] = all_grads(m[s], a[s], gs[s], s ? pctx : NULL, sp);
    }
    char what[200];
    snprintf(what, sizeof what, "tp=%d%s MoE balancing loss equals the unsplit model's", world,
             sp ? " sp" : "");
    check(fabs(aux[0] - aux[1]) <= 1e-6 * fabs(aux[0]) && aux[0] > 0, "%.9g vs %.9g", what, aux[0],
          aux[1]);
    double router_aux = 0, router_tol = 0, below_aux = 0, below_tol = 0;
    for (int i = 0; i < m[1]->n_params; i++) {
        const ct_param *ps = &m[1]->params[i];
        const ct_param *pf = ct_model_find_param(m[0], ps->name);
        const int j = (int)(pf - m[0]->params);
        const float *fa = g[0][0][j], *f0 = g[0][1][j], *sa = g[1][0][i], *s0 = g[1][1][i];
        const int64_t rows = ps->local_shape[0], cols = ps->local_shape[1];
        const int64_t gcols = pf->local_shape[1];
        const int64_t row0 = ps->tp_split_dim == 0 ? ps->tp_offset : 0;
        const int64_t col0 = ps->tp_split_dim == 1 ? ps->tp_offset : 0;
        double err = 0, big = 0;
        const double tol = 2e-5 * (max_abs(fa, pf->numel) + max_abs(f0, pf->numel)) + 1e-7;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                const int64_t at = (row0 + r) * gcols + col0 + c;
                const double want = (double)fa[at] - f0[at];
                const double got = (double)sa[r * cols + c] - s0[r * cols + c];
                err = worse(err, fabs(want - got));
                big = worse(big, fabs(want));
            }
        if (strstr(ps->name, "moe.router")) router_aux = big, router_tol = tol;
        if (!strcmp(ps->name, "layers.0.attn.wq")) below_aux = big, below_tol = tol;
        snprintf(what, sizeof what, "tp=%d%s balancing-loss gradient of %s", world, sp ? " sp" : "",
                 ps->name);
        check(err <= tol, "max diff %.3g (tol %.3g)", what, err, tol);
    }
    snprintf(what, sizeof what, "tp=%d%s the balancing loss reaches the router's gradient", world,
             sp ? " sp" : "");
    check(router_aux > 100 * router_tol, "largest %.3g (tol %.3g)", what, router_aux, router_tol);
    snprintf(what, sizeof what, "tp=%d%s its input gradient reaches layer 0 (attn.wq)", world,
             sp ? " sp" : "");
    check(below_aux > 100 * below_tol, "largest %.3g (tol %.3g)", what, below_aux, below_tol);
    for (int s = 0; s < 2; s++) {
        free_grads(g[s][0], m[s]->n_params), free_grads(g[s][1], m[s]->n_params);
        ct_grad_scratch_free(gs[s]), ct_acts_free(a[s]), ct_model_free(m[s]);
    }
    ct_backend_free(be);
}

/* The vocab-parallel loss alone: three allreduces, same losses and dlogits as the plain one. */
static void compare_xent(ct_pctx *pctx) {
    ct_backend *be = test_backend_new(1);
    const int64_t N = 24, Vp = 128, V = 123, Vl = Vp / world, off = pctx->tp_rank * Vl;
    const int64_t n_valid = CT_MAX(0, CT_MIN(Vl, V - off));
    float *logits = ct_xmalloc((size_t)(N * Vp) * sizeof(float));
    int32_t targets[64];
    for (int64_t i = 0; i < N * Vp; i++)
        logits[i] = (float)(3.0 * ct_rng_normal(9, 0, (uint64_t)i));
    for (int64_t r = 0; r < N; r++) targets[r] = (int32_t)((r * 29) % V); /* every shard */
    ct_tensor *lf = ct_tensor_new_2d(be, CT_DTYPE_F32, N, Vp, CT_MEM_ACTS);
    ct_tensor *ls = ct_tensor_new_2d(be, CT_DTYPE_F32, N, Vl, CT_MEM_ACTS);
    ct_tensor *tg = ct_tensor_new_1d(be, CT_DTYPE_I32, N, CT_MEM_ACTS);
    ct_tensor *v[8];
    for (int k = 0; k < 8; k++) v[k] = ct_tensor_new_1d(be, CT_DTYPE_F32, N, CT_MEM_ACTS);
    ct_tensor_from_host(lf, logits);
    float *slice = ct_xmalloc((size_t)(N * Vl) * sizeof(float));
    for (int64_t r = 0; r < N; r++) memcpy(slice + r * Vl, logits + r * Vp + off, (size_t)Vl * 4);
    ct_tensor_from_host(ls, slice);
    ct_tensor_from_host(tg, targets);
    ct_comm *self = ct_comm_local_new("self");
    ct_vocab_parallel_xent(self, v[0], lf, tg, v[1], v[2], v[3], V, 0, 0.5f);
    uint64_t before = pctx->tp_comm->calls[CT_COMM_ALLREDUCE];
    ct_comm_set_stream(pctx->tp_comm, be); /* it carries be's tensors (core/comm/comm.h) */
    ct_vocab_parallel_xent(pctx->tp_comm, v[4], ls, tg, v[5], v[6], v[7], n_valid, off, 0.5f);
    ct_comm_unset_stream(pctx->tp_comm, be);
    uint64_t calls = pctx->tp_comm->calls[CT_COMM_ALLREDUCE] - before;
    char what[128];
    snprintf(what, sizeof what, "tp=%d vocab-parallel loss uses exactly 3 allreduces", world);
    check(calls == 3, "%g calls (want %g)", what, (double)calls, 3.0);
    float *a = to_host(v[0]), *b = to_host(v[4]);
    double worst = 0;
    for (int64_t r = 0; r < N; r++) worst = worse(worst, fabs(a[r] - b[r]) / fabs(a[r]));
    snprintf(what, sizeof what, "tp=%d vocab-parallel losses match the plain ones", world);
    check(worst <= 1e-6, "max rel diff %.3g (tol %.1g)", what, worst, 1e-6);
    float *df = to_host(lf), *ds = to_host(ls);
    worst = 0;
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < Vl; c++)
            worst = worse(worst, fabs(df[r * Vp + off + c] - ds[r * Vl + c]));
    snprintf(what, sizeof what, "tp=%d vocab-parallel dlogits are the slice (padding zero)", world);
    check(worst <= 1e-7, "max diff %.3g (tol %.1g)", what, worst, 1e-7);
    free(a), free(b), free(df), free(ds), free(logits), free(slice);
    for (int k = 0; k < 8; k++) ct_tensor_free(v[k]);
    ct_tensor_free(lf), ct_tensor_free(ls), ct_tensor_free(tg);
    ct_comm_free(self);
    ct_backend_free(be);
}

int main(int argc, char **argv) {
    if (ct_mpi_init(&argc, &argv) != CT_OK) {
        ct_error_print();
        return 1;
    }
    rank = ct_mpi_world_rank();
    world = ct_mpi_world_size();
    ct_pctx *pctx;
    if (ct_pctx_new(&pctx, world, 1, 1, 120.0) != CT_OK) {
        ct_error_print();
        return 1;
    }
    compare_model(pctx, false);
    compare_model(pctx, true);
    compare_xent(pctx);
    compare_moe_aux(pctx, false);
    compare_moe_aux(pctx, true);
    int any = failures;
    ct_comm_allreduce(pctx->world, &any, 1, CT_DTYPE_I32, CT_REDUCE_MAX);
    ct_pctx_free(pctx);
    ct_mpi_finalize();
    return any ? 1 : 0;
}
