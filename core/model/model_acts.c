/*
 * model_acts.c — the model's activation memory (model.h: ct_acts, ct_grad_scratch): one slab per
 * microbatch set carved into typed views (each layer's internals, or one shared workspace under
 * recompute), the gradient scratch of backward, and the chunk inputs and outputs a pipeline
 * passes on. The model's forward and backward (model.c) read and write them.
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "model_collectives.h"
#include "model_layer.h"

/* ---- activations ------------------------------------------------------------------------------
 */

/* Carves views out of one byte slab (activations in the model's dtype, statistics in f32); with
 * slab == NULL it only counts. Every view starts on a 64-byte boundary. */
typedef struct carver {
    ct_tensor *slab;
    size_t used; /* bytes */
} carver;

static ct_tensor *carve_as(carver *cv, ct_dtype dtype, int ndim, int64_t d0, int64_t d1,
                           int64_t d2) {
    int64_t shape[3] = {d0, d1, d2};
    int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    ct_tensor *t = cv->slab ? ct_tensor_view_as(cv->slab, dtype, cv->used, ndim, shape) : NULL;
    cv->used += ((size_t)n * ct_dtype_size(dtype) + 63) / 64 * 64;
    return t;
}

/* An activation (model dtype) and a statistic (f32: norms' mean and rstd, attention's lse, the
 * loss's row values). */
#define carve(cv, ndim, d0, d1, d2) carve_as(cv, m->dtype, ndim, d0, d1, d2)
#define carve_stat(cv, ndim, d0, d1, d2) carve_as(cv, CT_DTYPE_F32, ndim, d0, d1, d2)

/* A layer's internal activations (everything but its input and output residuals); `mlp`: the
 * dense MLP's hidden (h, g), which an MoE layer does without (its buffers are moe.c's). */
static void carve_layer(ct_model *m, ct_layer_acts *la, carver *cv, int64_t B, bool mlp) {
    int64_t T = m->T, C = m->C, tp = m->layout.tp_size, Nl = B * m->Tl;
    int64_t qdim = m->NH * m->hd / tp, kvdim = m->NKV * m->hd / tp, F = m->F / tp;
    const bool mean = m->arch->norm_bias; /* LayerNorm keeps a mean, RMSNorm none */
    la->ln1 = carve(cv, 3, B, T, C);
    la->ln1_mean = mean ? carve_stat(cv, 1, Nl, 0, 0) : NULL;
    la->ln1_rstd = carve_stat(cv, 1, Nl, 0, 0);
    la->qkv = carve(cv, 3, B, T, qdim + 2 * kvdim);
    la->att = carve(cv, 3, B, T, qdim);
    la->lse = carve_stat(cv, 3, B, m->NH / tp, T);
    la->mid = carve(cv, 3, B, m->Tl, C);
    la->ln2 = carve(cv, 3, B, T, C);
    la->ln2_mean = mean ? carve_stat(cv, 1, Nl, 0, 0) : NULL;
    la->ln2_rstd = carve_stat(cv, 1, Nl, 0, 0);
    la->h = mlp ? carve(cv, 3, B, T, m->arch->act.hidden * F) : NULL; /* llama: gate|up */
    la->g = mlp ? carve(cv, 3, B, T, F) : NULL;
}

/* Bytes of one layer's internal activations for a micro-batch of B. */
static size_t layer_internals_bytes(ct_model *m, int64_t B) {
    ct_layer_acts la;
    carver cv = {0};
    carve_layer(m, &la, &cv, B, true); /* the largest: a dense layer's */
    return cv.used;
}

/*
 * Every activation of a microbatch: the residual stream at each layer boundary, the layers'
 * internals, and the head's. With train.recompute = full the internals are not kept: every
 * layer's views point into the one shared workspace m->recompute_ws, which forward overwrites
 * layer after layer and backward refills by running the layer's forward again.
 */
static void carve_acts(ct_model *m, ct_acts *a, carver *cv) {
    int64_t B = a->B, C = m->C, N = B * m->T, Tl = m->Tl, Nl = B * Tl;
    int64_t vloc = m->Vp / m->layout.tp_size;
    for (int c = 0; c < m->layout.n_chunks; c++) {
        int first = m->layout.chunks[c].first_layer, n = m->layout.chunks[c].n_layers;
        a->residual[first] = carve(cv, 3, B, Tl, C); /* the chunk's input (received under pp) */
        for (int l = first; l < first + n; l++) {
            if (m->layout.recompute) {
                carver shared = {.slab = cv->slab ? m->recompute_ws : NULL};
                carve_layer(m, &a->layers[l], &shared, B, !ct_moe_layer(&m->mc, l));
            } else {
                carve_layer(m, &a->layers[l], cv, B, !ct_moe_layer(&m->mc, l));
            }
            a->residual[l + 1] = carve(cv, 3, B, Tl, C);
        }
        if (m->layout.chunks[c].has_head) {
            a->lnf = carve(cv, 3, B, m->T, C);
            a->lnf_mean = m->arch->norm_bias ? carve_stat(cv, 1, Nl, 0, 0) : NULL;
            a->lnf_rstd = carve_stat(cv, 1, Nl, 0, 0);
            a->logits = carve(cv, 2, N, vloc, 0);
            a->rowmax = carve_stat(cv, 1, N, 0, 0);
            a->sumexp = carve_stat(cv, 1, N, 0, 0);
            a->target_logit = carve_stat(cv, 1, N, 0, 0);
            a->losses = carve_stat(cv, 1, N, 0, 0);
        }
    }
}

size_t ct_acts_bytes(const ct_model *m, int64_t B) {
    ct_acts a = {.B = B};
    a.residual = ct_xcalloc((size_t)m->L + 1, sizeof *a.residual);
    a.layers = ct_xcalloc((size_t)m->L, sizeof *a.layers);
    carver cv = {0};
    carve_acts((ct_model *)m, &a, &cv);
    free(a.residual);
    free(a.layers);
    return cv.used + 2 * (size_t)(B * m->T) * sizeof(int32_t) + ct_model_moe_acts_bytes(m, B);
}

size_t ct_acts_moe_first_step_bytes(const ct_model *m, int64_t B) {
    return m->n_moe_layers ? (size_t)m->live_acts * ct_model_moe_acts_bytes(m, B) : 0;
}

ct_status ct_acts_new(ct_acts **out, ct_model *m, int64_t B) {
    ct_acts *a = ct_xcalloc(1, sizeof *a);
    a->B = B;
    a->n_layers = (int)m->L;
    a->residual = ct_xcalloc((size_t)m->L + 1, sizeof *a->residual);
    a->layers = ct_xcalloc((size_t)m->L, sizeof *a->layers);
    carver cv = {0};
    carve_acts(m, a, &cv);
    if (m->layout.recompute && B > m->recompute_B) {
        /* Views of live activation contexts point into the workspace: it may only grow
         * before the first one exists. */
        CT_ASSERTF(m->live_acts == 0,
                   "recompute workspace must grow from B=%lld to %lld with "
                   "activations alive",
                   (long long)m->recompute_B, (long long)B);
        ct_tensor_free(m->recompute_ws);
        ct_tensor_free(m->recompute_out);
        m->recompute_ws =
            ct_tensor_new_1d(m->be, CT_DTYPE_U8, (int64_t)layer_internals_bytes(m, B), CT_MEM_ACTS);
        int64_t shape[3] = {B, m->Tl, m->C};
        m->recompute_out = ct_tensor_new(m->be, m->dtype, 3, shape, CT_MEM_ACTS);
        m->recompute_B = B;
        if (!m->recompute_ws || !m->recompute_out) {
            ct_acts_free(a);
            return CT_ERR_RUNTIME;
        }
    }
    a->slab = ct_tensor_new_1d(m->be, CT_DTYPE_U8, (int64_t)cv.used, CT_MEM_ACTS);
    a->tokens = ct_tensor_new_1d(m->be, CT_DTYPE_I32, B * m->T, CT_MEM_ACTS);
    a->targets = ct_tensor_new_1d(m->be, CT_DTYPE_I32, B * m->T, CT_MEM_ACTS);
    if (!a->slab || !a->tokens || !a->targets) {
        ct_acts_free(a);
        return CT_ERR_RUNTIME;
    }
    cv = (carver){.slab = a->slab};
    carve_acts(m, a, &cv);
    m->live_acts++;
    a->model = m;
    if (ct_model_sp_reserve(m, B) != CT_OK) {
        ct_acts_free(a);
        return CT_ERR_RUNTIME;
    }
    *out = a;
    return CT_OK;
}

size_t ct_acts_wgrad_bytes(const ct_acts *a) {
    size_t bytes = 0;
    for (int c = 0; c < CT_MAX_CHUNKS; c++) bytes += ct_wgrad_store_bytes(a->wstore[c]);
    return bytes;
}

void ct_acts_free(ct_acts *a) {
    if (!a) return;
    if (a->model) a->model->live_acts--;
    for (int c = 0; c < CT_MAX_CHUNKS; c++) ct_wgrad_store_free(a->wstore[c]);
    ct_tensor *singles[] = {a->lnf,    a->lnf_mean, a->lnf_rstd,     a->logits,
                            a->rowmax, a->sumexp,   a->target_logit, a->losses};
    for (size_t i = 0; i < sizeof singles / sizeof singles[0]; i++) ct_tensor_free(singles[i]);
    for (int l = 0; l < a->n_layers; l++) {
        ct_layer_acts *la = &a->layers[l];
        ct_tensor *views[] = {la->ln1, la->ln1_mean, la->ln1_rstd, la->qkv,      la->att, la->lse,
                              la->mid, la->ln2,      la->ln2_mean, la->ln2_rstd, la->h,   la->g};
        for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) ct_tensor_free(views[i]);
        ct_moe_acts_free(la->moe);
    }
    for (int l = 0; l <= a->n_layers; l++) ct_tensor_free(a->residual[l]);
    free(a->layers);
    free(a->residual);
    ct_tensor_free(a->slab);
    ct_tensor_free(a->tokens);
    ct_tensor_free(a->targets);
    free(a);
}

ct_status ct_grad_scratch_new(ct_grad_scratch **out, ct_model *m, int64_t B) {
    int64_t T = m->T, C = m->C, tp = m->layout.tp_size;
    int64_t qdim = m->NH * m->hd / tp, kvdim = m->NKV * m->hd / tp, F = m->F / tp;
    ct_grad_scratch *s = ct_xcalloc(1, sizeof *s);
    s->B = B;
    carver cv = {0};
    const int64_t Tl = m->Tl;
    const bool sp = m->layout.sequence_parallel;
    for (int pass = 0; pass < 2; pass++) {
        s->dres = carve(&cv, 3, B, Tl, C);
        s->dln = carve(&cv, 3, B, T, C);
        s->dln_local = sp ? carve(&cv, 3, B, Tl, C) : NULL;
        s->dfull = sp ? carve(&cv, 3, B, T, C) : NULL;
        s->datt = carve(&cv, 3, B, T, qdim);
        s->dqkv = carve(&cv, 3, B, T, qdim + 2 * kvdim);
        s->dh = carve(&cv, 3, B, T, F);
        /* a hidden wider than F (llama's gate|up) has its gradient apart; else dh serves */
        const int hidden = m->arch->act.hidden;
        s->dgu = hidden > 1 ? carve(&cv, 3, B, T, hidden * F) : NULL;
        if (pass == 0) {
            s->slab = ct_tensor_new_1d(m->be, CT_DTYPE_U8, (int64_t)cv.used, CT_MEM_WORKSPACE);
            if (!s->slab) {
                free(s);
                return CT_ERR_RUNTIME;
            }
            cv = (carver){.slab = s->slab};
        }
    }
    *out = s;
    return CT_OK;
}

void ct_grad_scratch_free(ct_grad_scratch *s) {
    if (!s) return;
    ct_tensor *views[] = {s->dres, s->dln, s->datt, s->dqkv, s->dh, s->dln_local, s->dfull, s->dgu};
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) ct_tensor_free(views[i]);
    ct_tensor_free(s->slab);
    free(s);
}

void ct_acts_set_batch(ct_acts *a, int mb, const int32_t *tokens, const int32_t *targets) {
    a->mb = mb;
    ct_tensor_from_host(a->tokens, tokens);
    if (targets) ct_tensor_from_host(a->targets, targets);
}

void ct_acts_set_batch_device(ct_acts *a, int mb, const ct_tensor *tokens,
                              const ct_tensor *targets) {
    a->mb = mb;
    ct_tensor_copy(a->tokens, tokens);
    if (targets) ct_tensor_copy(a->targets, targets);
}

ct_tensor *ct_acts_chunk_input(const ct_acts *a, int c) {
    const ct_model_layout *l = &a->model->layout;
    CT_ASSERTF(c >= 0 && c < l->n_chunks, "chunk %d of %d", c, l->n_chunks);
    return a->residual[l->chunks[c].first_layer];
}

ct_tensor *ct_acts_chunk_output(const ct_acts *a, int c) {
    const ct_model_layout *l = &a->model->layout;
    CT_ASSERTF(c >= 0 && c < l->n_chunks, "chunk %d of %d", c, l->n_chunks);
    return a->residual[l->chunks[c].first_layer + l->chunks[c].n_layers];
}

ct_tensor *ct_acts_logits(const ct_acts *a) {
    return a->logits;
}

ct_tensor *ct_grad_scratch_dres(const ct_grad_scratch *scratch) {
    return scratch->dres;
}
