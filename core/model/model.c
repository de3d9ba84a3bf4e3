/*
 * model.c — the model's construction and its driver: layouts, the parameter registry built from
 * the architecture's table (model_arch.h), units and slabs, initialisation, and forward and
 * backward over a chunk — the embeddings, each layer through its architecture's block
 * (model_gpt2.c, model_llama.c) and MLP part (dense, or moe.c), the final norm, the LM head and
 * the loss. See model.h and model/README.md. The helpers the blocks share are in model_layer.c,
 * the collectives (tp sums, sequence parallelism's gathers and reduce-scatters, the block
 * boundaries) in model_collectives.c, the activation memory in model_acts.c.
 */
#include "model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_collectives.h"
#include "model_layer.h"
#include "ring_attention.h"
#include "core/rng.h"

/* ---- architectures: one line each (model_arch.h) ------------------------------------------- */

static const ct_model_arch *const archs[] = {
    [CT_ARCH_GPT2] = &ct_model_arch_gpt2,
    [CT_ARCH_LLAMA] = &ct_model_arch_llama,
};

const ct_model_arch *ct_model_arch_of(ct_arch arch) {
    CT_ASSERTF((size_t)arch < CT_ARRAY_LEN(archs) && archs[arch], "model.arch %d", (int)arch);
    return archs[arch];
}

/* ---- layout --------------------------------------------------------------------------------- */

ct_zero_layout ct_zero_layout_of(int64_t zero_stage) {
    CT_ASSERTF(zero_stage >= 0 && zero_stage <= 3, "zero stage %lld", (long long)zero_stage);
    ct_zero_layout z = {
        .stage = (int)zero_stage,
        .shard_optim = zero_stage >= 1,
        .shard_grads = zero_stage >= 2,
        .shard_params = zero_stage == 3,
    };
    return z;
}

ct_model_layout ct_model_layout_single(const ct_config *cfg) {
    ct_model_layout layout;
    memset(&layout, 0, sizeof layout);
    layout.tp_rank = 0;
    layout.tp_size = 1;
    layout.tp = NULL;
    layout.dp_size = 1;
    layout.zero = ct_zero_layout_of(0);
    layout.sequence_parallel = false;
    layout.cp_size = 1;
    layout.ep_size = 1;
    layout.recompute = false;
    layout.n_chunks = 1;
    layout.chunks[0].index = 0;
    layout.chunks[0].first_layer = 0;
    layout.chunks[0].n_layers = (int)cfg->model.n_layer;
    layout.chunks[0].has_embed = true;
    layout.chunks[0].has_head = true;
    return layout;
}

int ct_layout_moe_layers(const ct_model_config *mc, const ct_model_layout *layout) {
    int n = 0;
    for (int c = 0; c < layout->n_chunks; c++)
        for (int i = 0; i < layout->chunks[c].n_layers; i++)
            n += ct_moe_layer(mc, layout->chunks[c].first_layer + i);
    return n;
}

ct_model_layout ct_model_layout_pipeline(const ct_config *cfg, int pp_rank) {
    ct_model_layout layout = ct_model_layout_single(cfg);
    const int pp = (int)cfg->parallel.pp, v = (int)cfg->parallel.virtual_stages;
    const int n_chunks = pp * v, L = (int)cfg->model.n_layer;
    CT_ASSERT(v <= CT_MAX_CHUNKS && pp_rank >= 0 && pp_rank < pp);
    /* Layers per global chunk: parallel.pp_layers (validated by the config), else even. */
    int *counts = ct_xcalloc((size_t)n_chunks, sizeof(int));
    const char *spec = cfg->parallel.pp_layers;
    for (int c = 0; c < n_chunks; c++) {
        if (spec[0]) {
            counts[c] = (int)strtol(spec, (char **)&spec, 10);
            if (*spec == ',') spec++;
        } else {
            counts[c] = L / n_chunks;
        }
    }
    layout.n_chunks = v;
    layout.v_shape = cfg->parallel.schedule == CT_SCHEDULE_ZBV;
    CT_ASSERT(!layout.v_shape || v == 2);
    for (int j = 0; j < v; j++) {
        int c = layout.v_shape && j == 1 ? 2 * pp - 1 - pp_rank : pp_rank + j * pp, first = 0;
        for (int k = 0; k < c; k++) first += counts[k];
        layout.chunks[j].index = c;
        layout.chunks[j].first_layer = first;
        layout.chunks[j].n_layers = counts[c];
        layout.chunks[j].has_embed = c == 0;
        layout.chunks[j].has_head = c == n_chunks - 1;
    }
    free(counts);
    return layout;
}

/* ---- registry ------------------------------------------------------------------------------- */

typedef struct registry_builder {
    ct_model *model;
    int cap, unit_cap;
    /* init N(0, std); projections that write into the residual stream (ct_arch_tensor.residual)
     * N(0, residual_std), std / sqrt(2·L), so the stream's variance does not grow with depth */
    float std, residual_std;
} registry_builder;

static ct_param *add_param(registry_builder *rb, const char *name, int ndim, int64_t rows,
                           int64_t cols, int split_dim, ct_init_rule init, float std, int chunk) {
    ct_model *m = rb->model;
    if (m->n_params == rb->cap) {
        rb->cap = rb->cap ? 2 * rb->cap : 64;
        m->params = realloc(m->params, (size_t)rb->cap * sizeof *m->params);
        CT_ASSERT(m->params != NULL);
    }
    ct_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->global_shape[0] = rows;
    p->global_shape[1] = ndim == 2 ? cols : 1;
    p->local_shape[0] = p->global_shape[0];
    p->local_shape[1] = p->global_shape[1];
    p->tp_split_dim = split_dim;
    int tp = m->layout.tp_size, r = m->layout.tp_rank;
    if (split_dim >= 0) {
        int64_t g = p->global_shape[split_dim];
        CT_ASSERTF(g % tp == 0, "%s: dim %d of size %lld does not split over tp=%d", name,
                   split_dim, (long long)g, tp);
        p->local_shape[split_dim] = g / tp;
        p->tp_offset = (int64_t)r * (g / tp);
    }
    p->chunk = chunk;
    p->layer = -1;
    p->expert = -1;
    p->unit = m->n_units - 1;
    p->decay = ndim >= 2;
    p->init = init;
    p->init_std = std;
    p->valid_rows = p->local_shape[0];
    p->numel = p->local_shape[0] * p->local_shape[1];
    return p;
}

static void begin_unit(registry_builder *rb, const char *name) {
    ct_model *m = rb->model;
    if (m->n_units == rb->unit_cap) {
        rb->unit_cap = rb->unit_cap ? 2 * rb->unit_cap : 16;
        m->units = realloc(m->units, (size_t)rb->unit_cap * sizeof *m->units);
        CT_ASSERT(m->units != NULL);
    }
    ct_unit *u = &m->units[m->n_units++];
    memset(u, 0, sizeof *u);
    snprintf(u->name, sizeof u->name, "%s", name);
    u->first_param = m->n_params;
}

/* Bytes of this rank's parameters registered so far in unit u (the unit being built). */
static int64_t unit_bytes(const ct_model *m, const ct_unit *u) {
    int64_t n = 0;
    for (int i = u->first_param; i < m->n_params; i++) n += m->params[i].numel;
    return n * (int64_t)sizeof(float);
}

int ct_model_expert_tensors(const ct_model *m) {
    return m->arch->n_mlp_tensors;
}

/* One tensor of layer l, named "layers.L.<prefix><t->name>", its dims resolved (CT_DIM_WIDTH:
 * `width`), bound to t->field. */
static ct_param *add_layer_tensor(registry_builder *rb, int l, const char *prefix,
                                  const ct_arch_tensor *t, int64_t width, int chunk) {
    const ct_model *m = rb->model;
    const int64_t dims[] = {[CT_DIM_ONE] = 1,
                            [CT_DIM_MODEL] = m->C,
                            [CT_DIM_Q] = m->NH * m->hd,
                            [CT_DIM_KV] = m->NKV * m->hd,
                            [CT_DIM_WIDTH] = width};
    char name[64];
    snprintf(name, sizeof name, "layers.%d.%s%s", l, prefix, t->name);
    const float sd = t->init != CT_INIT_NORMAL ? 0.0f : t->residual ? rb->residual_std : rb->std;
    ct_param *p =
        add_param(rb, name, t->ndim, dims[t->rows], dims[t->cols], t->split, t->init, sd, chunk);
    p->layer = l;
    p->field = t->field;
    return p;
}

/* An MLP of the architecture's kind in layer l, `width` wide, under "layers.L.<prefix>": bound to
 * the layer's MLP fields, or, for an expert (expert >= 0), not (reached through moe_experts): its
 * first tensor bound to first_field, the others to none. */
static void add_mlp(registry_builder *rb, int l, const char *prefix, int64_t width, int chunk,
                    int expert, size_t first_field) {
    const ct_model_arch *arch = rb->model->arch;
    for (int j = 0; j < arch->n_mlp_tensors; j++) {
        ct_param *q = add_layer_tensor(rb, l, prefix, &arch->mlp_tensors[j], width, chunk);
        if (expert < 0) continue;
        q->expert = expert;
        q->field = j == 0 ? first_field : CT_PARAM_NO_FIELD;
    }
}

/* Mixture of Experts (moe.c) in layer l: the router, replicated, then in a unit of their own
 * (reduced and sharded over the ranks that hold the same experts, layout.edp, not over all of
 * dp) this rank's experts, the ep group's share (moe_experts / ep consecutive ones), each an MLP
 * like the dense one: ct_model_expert_tensors consecutive entries per expert, moe_experts naming
 * the first. */
static void add_moe(registry_builder *rb, int l, int chunk) {
    ct_model *m = rb->model;
    const int64_t C = m->C, E = m->mc.moe_experts, Fe = m->mc.moe_d_ff ? m->mc.moe_d_ff : m->F;
    const int64_t El = E / m->layout.ep_size, e0 = m->layout.ep_rank * El;
    char name[64];
    /* Shared experts (moe_shared of them): one MLP of their summed width every token goes
     * through, in the layer's own unit like a dense MLP, bound to the MLP's fields. */
    if (m->mc.moe_shared) add_mlp(rb, l, "moe.shared.", m->mc.moe_shared * Fe, chunk, -1, 0);
    snprintf(name, sizeof name, "layers.%d.moe.router", l);
    ct_param *router = add_param(rb, name, 2, E, C, -1, CT_INIT_NORMAL, rb->std, chunk);
    router->layer = l;
    router->field = offsetof(ct_layer_params, moe_router);
    snprintf(name, sizeof name, "experts.%d", l);
    begin_unit(rb, name);
    m->units[m->n_units - 1].experts = true;
    m->units[m->n_units - 1].first_layer = l;
    m->expert_unit[l] = m->n_units - 1;
    for (int64_t e = e0; e < e0 + El; e++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "moe.experts.%lld.", (long long)e);
        add_mlp(rb, l, prefix, Fe, chunk, (int)e,
                e == e0 ? offsetof(ct_layer_params, moe_experts) : CT_PARAM_NO_FIELD);
    }
}

/* Layer l's tensors: the architecture's, then its MLP part, the dense MLP or the MoE layer. */
static void add_layer(registry_builder *rb, int l, int chunk) {
    const ct_model *m = rb->model;
    for (int j = 0; j < m->arch->n_layer_tensors; j++)
        add_layer_tensor(rb, l, "", &m->arch->layer_tensors[j], 0, chunk);
    if (ct_moe_layer(&m->mc, l))
        add_moe(rb, l, chunk);
    else
        add_mlp(rb, l, "mlp.", m->F, chunk, -1, 0);
}

/* The embedding unit: wte, and the learned positions where the architecture has them. */
static void add_embed(registry_builder *rb, int chunk) {
    ct_model *m = rb->model;
    begin_unit(rb, "embed");
    m->embed_unit = m->n_units - 1;
    add_param(rb, "wte", 2, m->Vp, m->C, 0, CT_INIT_NORMAL, rb->std, chunk)->field =
        offsetof(ct_model, wte);
    if (m->arch->learned_positions)
        add_param(rb, "wpe", 2, m->T_seq, m->C, -1, CT_INIT_NORMAL, rb->std, chunk)->field =
            offsetof(ct_model, wpe);
}

/* Layer l, the i-th of its chunk, in the unit the wrapping policy gives it (model.h, Units): a
 * layer joins the current unit while that unit is below unit_min_bytes. The first layer of a
 * chunk always opens a unit, so none spans two chunks. */
static void add_layer_in_unit(registry_builder *rb, int l, int i, int chunk) {
    ct_model *m = rb->model;
    bool open = i == 0 || m->units[m->n_units - 1].experts ||
                unit_bytes(m, &m->units[m->n_units - 1]) >= m->layout.unit_min_bytes;
    if (open) {
        char unit_name[32];
        snprintf(unit_name, sizeof unit_name, "layer.%d", l);
        begin_unit(rb, unit_name);
        m->units[m->n_units - 1].first_layer = l;
    }
    ct_unit *cur = &m->units[m->n_units - 1];
    if (!open) snprintf(cur->name, sizeof cur->name, "layers.%d-%d", cur->first_layer, l);
    cur->n_layers++;
    m->layer_unit[l] = m->n_units - 1;
    add_layer(rb, l, chunk);
}

/* The head unit: the LM head's own matrix or the tied embedding's twin, then the final norm. */
static void add_head(registry_builder *rb, int chunk, bool have_embed) {
    ct_model *m = rb->model;
    begin_unit(rb, "head");
    m->head_unit = m->n_units - 1;
    if (!m->tied) {
        /* An LM head of its own: vocab-parallel like wte, first in its unit. */
        add_param(rb, "lm_head", 2, m->Vp, m->C, 0, CT_INIT_NORMAL, rb->std, chunk)->field =
            offsetof(ct_model, lm_head);
    } else if (!have_embed) {
        /* The last stage's twin of the tied embedding (pipeline parallel). It comes first, at
         * offset 0 like wte in the embedding unit, and both units are padded to the same size
         * (ct_model_new): then every data-parallel shard covers the same part of the two copies
         * and their gradients can be summed shard by shard. */
        ct_param *twin =
            add_param(rb, "head.wte", 2, m->Vp, m->C, 0, CT_INIT_NORMAL, rb->std, chunk);
        twin->tied_to = "wte";
        twin->field = offsetof(ct_model, wte); /* the LM head reads m->wte either way */
    }
    add_param(rb, "lnf.weight", 1, m->C, 1, -1, CT_INIT_ONES, 0, chunk)->field =
        offsetof(ct_model, lnf_w);
    if (m->arch->norm_bias)
        add_param(rb, "lnf.bias", 1, m->C, 1, -1, CT_INIT_ZEROS, 0, chunk)->field =
            offsetof(ct_model, lnf_b);
}

static void build_registry(ct_model *m) {
    const float std = 0.02f;
    registry_builder rb = {.model = m, .std = std, .residual_std = std / sqrtf(2.0f * (float)m->L)};
    m->embed_unit = m->head_unit = -1;
    m->layer_unit = ct_xmalloc((size_t)m->L * sizeof *m->layer_unit);
    m->expert_unit = ct_xmalloc((size_t)m->L * sizeof *m->expert_unit);
    for (int l = 0; l < m->L; l++) m->layer_unit[l] = m->expert_unit[l] = -1;
    bool have_embed = false;
    for (int c = 0; c < m->layout.n_chunks; c++) have_embed |= m->layout.chunks[c].has_embed;

    for (int c = 0; c < m->layout.n_chunks; c++) {
        const int chunk = m->layout.chunks[c].index;
        if (m->layout.chunks[c].has_embed) add_embed(&rb, chunk);
        for (int i = 0; i < m->layout.chunks[c].n_layers; i++)
            add_layer_in_unit(&rb, m->layout.chunks[c].first_layer + i, i, chunk);
        if (m->layout.chunks[c].has_head) add_head(&rb, chunk, have_embed);
    }
    for (int u = 0; u < m->n_units; u++) {
        int next = u + 1 < m->n_units ? m->units[u + 1].first_param : m->n_params;
        m->units[u].n_params = next - m->units[u].first_param;
    }
}

/* Points the named fields at the registry entries (each entry says which field names it). */
static void bind_params(ct_model *m) {
    m->layers = ct_xcalloc((size_t)m->L, sizeof *m->layers);
    for (int i = 0; i < m->n_params; i++) {
        ct_param *p = &m->params[i];
        if (p->field == CT_PARAM_NO_FIELD) continue; /* reached through another entry */
        char *owner = p->layer >= 0 ? (char *)&m->layers[p->layer] : (char *)m;
        ct_param **slot = (ct_param **)(owner + p->field);
        CT_ASSERTF(!*slot, "two parameters bound to one field (%s)", p->name);
        *slot = p;
    }
    /* Each layer's MLP part: its architecture's dense MLP, or the MoE layer */
    for (int l = 0; l < m->L; l++)
        if (m->layer_unit[l] >= 0)
            m->layers[l].mlp = m->layers[l].moe_router ? &ct_model_moe_mlp : &m->arch->dense_mlp;
}

/* ---- construction -----------------------------------------------------------------------------
 */

ct_param *ct_model_registry(const ct_config *cfg, int *count) {
    ct_model m;
    memset(&m, 0, sizeof m);
    m.mc = cfg->model;
    m.T = m.T_seq = cfg->model.seq_len;
    m.C = cfg->model.d_model;
    m.L = (int)cfg->model.n_layer;
    m.NH = cfg->model.n_head;
    m.NKV = cfg->derived.n_kv_head;
    m.hd = cfg->derived.head_dim;
    m.F = cfg->derived.d_ff;
    m.V = cfg->model.vocab_size;
    m.Vp = cfg->derived.vocab_padded;
    m.arch = ct_model_arch_of(cfg->model.arch);
    m.tied = cfg->model.tie_embeddings;
    m.layout = ct_model_layout_single(cfg);
    build_registry(&m);
    free(m.units);
    free(m.layer_unit);
    free(m.expert_unit);
    *count = m.n_params;
    return m.params;
}

/* Offsets: parameters packed in registry order inside their unit; units padded so that every
 * data-parallel shard is equal and 64-byte aligned, and placed one after the other in the slabs
 * (m->slab_numel elements in all). */
static void lay_out_units(ct_model *m) {
    const int64_t align = 16 * (int64_t)CT_MAX(1, m->layout.dp_size);
    /* With the embedding and the head on different pipeline ranks, both tied units get the
     * padded size of the larger one (see the twin in build_registry). */
    const int64_t vocab_slice = m->Vp / m->layout.tp_size * m->C;
    const int64_t wpe_numel = m->arch->learned_positions ? m->T_seq * m->C : 0;
    const int64_t embed_numel = vocab_slice + wpe_numel;                          /* wte (+ wpe) */
    const int64_t head_numel = vocab_slice + (m->arch->norm_bias ? 2 : 1) * m->C; /* twin + lnf */
    const int64_t tied_numel = CT_MAX(embed_numel, head_numel);
    const ct_tied_place tied = ct_model_tied_place(m, NULL);
    const bool tie_across_ranks = tied == CT_TIED_FIRST || tied == CT_TIED_LAST;
    int64_t slab = 0;
    for (int u = 0; u < m->n_units; u++) {
        ct_unit *unit = &m->units[u];
        int64_t off = 0;
        for (int i = 0; i < unit->n_params; i++) {
            ct_param *p = &m->params[unit->first_param + i];
            p->offset = off;
            off += p->numel;
        }
        unit->numel = off;
        int64_t sized = off;
        if (tie_across_ranks && (u == m->embed_unit || u == m->head_unit)) {
            CT_ASSERT(off <= tied_numel);
            sized = tied_numel;
        }
        unit->padded_numel = (sized + align - 1) / align * align;
        unit->slab_offset = slab;
        slab += unit->padded_numel;
    }
    m->slab_numel = slab;
}

ct_status ct_model_new(ct_model **out, const ct_config *cfg, ct_backend *be,
                       const ct_model_layout *layout) {
    ct_model *m = ct_xcalloc(1, sizeof *m);
    m->mc = cfg->model;
    m->T_seq = cfg->model.seq_len;
    m->T = m->T_seq / CT_MAX(layout->cp_size, 1);
    m->C = cfg->model.d_model;
    m->L = cfg->model.n_layer;
    m->NH = cfg->model.n_head;
    m->NKV = cfg->derived.n_kv_head;
    m->hd = cfg->derived.head_dim;
    m->F = cfg->derived.d_ff;
    m->V = cfg->model.vocab_size;
    m->Vp = cfg->derived.vocab_padded;
    m->seed = cfg->train.seed;
    m->be = be;
    m->dtype = ct_precision_dtype(cfg->train.precision);
    m->arch = ct_model_arch_of(cfg->model.arch);
    m->tied = cfg->model.tie_embeddings;
    m->layout = *layout;
    if (!m->layout.tp) m->layout.tp = m->own_tp = ct_comm_local_new("tp");
    ct_comm_set_stream(m->layout.tp, be); /* its collectives carry this backend's activations */
    if (m->layout.cp) ct_comm_set_stream(m->layout.cp, be); /* and the ring's blocks */
    /* (a model without an ep group but ep_size > 1 is `plan`'s: registered, never run) */
    if (!m->layout.ep) m->layout.ep = m->own_ep = ct_comm_local_new("ep");
    ct_comm_set_stream(m->layout.ep, be); /* the MoE dispatch's rows (moe_dispatch.h) */
    CT_ASSERT(!layout->ep || layout->ep->size == CT_MAX(1, layout->ep_size));
    m->Tl = layout->sequence_parallel ? m->T / layout->tp_size : m->T;
    CT_ASSERT(m->Tl * layout->tp_size == m->T || !layout->sequence_parallel);
    CT_ASSERT(layout->unit_min_bytes >= 0);

    build_registry(m);
    m->n_moe_layers = ct_layout_moe_layers(&m->mc, &m->layout);
    m->moe_counts =
        ct_xcalloc((size_t)CT_MAX(1, m->n_moe_layers * m->mc.moe_experts), sizeof *m->moe_counts);
    m->moe_bias =
        ct_xcalloc((size_t)CT_MAX(1, m->n_moe_layers * m->mc.moe_experts), sizeof *m->moe_bias);

    lay_out_units(m);
    const int64_t slab = m->slab_numel;
    if (!layout->zero.shard_params) {
        m->param_slab = ct_tensor_new_1d(be, m->dtype, slab, CT_MEM_PARAMS);
        if (!m->param_slab) goto oom;
    }
    if (!layout->zero.shard_grads) {
        m->grad_slab = ct_tensor_new_1d(be, CT_DTYPE_F32, slab, CT_MEM_GRADS);
        if (!m->grad_slab) goto oom;
    }
    for (int u = 0; u < m->n_units; u++) {
        ct_unit *unit = &m->units[u];
        int64_t n = unit->padded_numel;
        unit->params = ct_tensor_new_unbound(be, m->dtype, 1, &n);
        unit->grads = ct_tensor_new_unbound(be, CT_DTYPE_F32, 1, &n);
        for (int i = 0; i < unit->n_params; i++) {
            ct_param *p = &m->params[unit->first_param + i];
            int64_t shape[2] = {p->local_shape[0], p->local_shape[1]};
            p->value = ct_tensor_new_unbound(be, m->dtype, p->ndim, shape);
            p->grad = ct_tensor_new_unbound(be, CT_DTYPE_F32, p->ndim, shape);
        }
        if (m->param_slab) ct_model_bind_unit_params(m, u, m->param_slab, unit->slab_offset);
        if (m->grad_slab) ct_model_bind_unit_grads(m, u, m->grad_slab, unit->slab_offset);
    }
    /* Vocabulary padding: rows at or past vocab_size are never real tokens. */
    for (int i = 0; i < m->n_params; i++) {
        ct_param *p = &m->params[i];
        if (!strcmp(p->name, "wte") || !strcmp(p->name, "head.wte") ||
            !strcmp(p->name, "lm_head")) {
            int64_t valid = m->V - p->tp_offset;
            p->valid_rows = CT_MAX(0, CT_MIN(valid, p->local_shape[0]));
        }
    }
    bind_params(m);
    /* The tied embedding where model.h says it is (ct_model_tied_place): at offset 0 of its unit.
     */
    int tied_unit;
    ct_model_tied_place(m, &tied_unit);
    CT_ASSERT((m->wte != NULL) == (tied_unit >= 0));
    CT_ASSERT(!m->wte || (m->wte->unit == tied_unit && m->wte->offset == 0));
    if (m->arch->setup && m->arch->setup(m, cfg) != CT_OK) goto oom; /* Llama: RoPE's table */
    if (layout->cp_size > 1) m->ring_ws = ct_ring_ws_new();
    if (m->param_slab) ct_model_init_params(m);
    ct_model_zero_grads(m);
    *out = m;
    return CT_OK;
oom:
    ct_model_free(m);
    return CT_ERR_RUNTIME;
}

void ct_model_bind_unit_params(ct_model *m, int u, const ct_tensor *buf, int64_t offset) {
    ct_unit *unit = &m->units[u];
    ct_tensor_rebind(unit->params, buf, offset);
    for (int i = 0; i < unit->n_params; i++) {
        ct_param *p = &m->params[unit->first_param + i];
        ct_tensor_rebind(p->value, buf, offset + p->offset);
    }
}

void ct_model_bind_unit_grads(ct_model *m, int u, const ct_tensor *buf, int64_t offset) {
    ct_unit *unit = &m->units[u];
    ct_tensor_rebind(unit->grads, buf, offset);
    for (int i = 0; i < unit->n_params; i++) {
        ct_param *p = &m->params[unit->first_param + i];
        ct_tensor_rebind(p->grad, buf, offset + p->offset);
    }
}

void ct_model_free(ct_model *m) {
    if (!m) return;
    ct_comm_unset_stream(m->layout.tp, m->be);
    ct_comm_unset_stream(m->layout.ep, m->be);
    if (m->layout.cp) ct_comm_unset_stream(m->layout.cp, m->be);
    ct_comm_free(m->own_tp);
    ct_comm_free(m->own_ep);
    free(m->moe_counts);
    free(m->moe_bias);
    for (int i = 0; i < m->n_params; i++) {
        ct_tensor_free(m->params[i].value);
        ct_tensor_free(m->params[i].grad);
    }
    for (int u = 0; u < m->n_units; u++) {
        ct_tensor_free(m->units[u].params);
        ct_tensor_free(m->units[u].grads);
    }
    ct_tensor_free(m->param_slab);
    ct_tensor_free(m->grad_slab);
    free(m->params);
    free(m->units);
    free(m->layers);
    free(m->layer_unit);
    free(m->expert_unit);
    ct_tensor_free(m->sp_local);
    ct_tensor_free(m->sp_full);
    ct_tensor_free(m->sp_perm);
    ct_tensor_free(m->recompute_ws);
    ct_tensor_free(m->recompute_out);
    ct_tensor_free(m->step_losses);
    ct_tensor_free(m->rope_table);
    ct_ring_ws_free(m->ring_ws);
    free(m);
}

ct_param *ct_model_find_param(ct_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

/* ---- accessors (model.h) ------------------------------------------------------------------- */

int ct_model_n_units(const ct_model *m) {
    return m->n_units;
}

const ct_unit *ct_model_unit(const ct_model *m, int u) {
    CT_ASSERTF(u >= 0 && u < m->n_units, "unit %d of %d", u, m->n_units);
    return &m->units[u];
}

int ct_model_unit_chunk(const ct_model *m, int u) {
    return ct_model_param(m, ct_model_unit(m, u)->first_param)->chunk;
}

int ct_model_n_params(const ct_model *m) {
    return m->n_params;
}

const ct_param *ct_model_param(const ct_model *m, int i) {
    CT_ASSERTF(i >= 0 && i < m->n_params, "parameter %d of %d", i, m->n_params);
    return &m->params[i];
}

const ct_model_layout *ct_model_layout_of(const ct_model *m) {
    return &m->layout;
}

ct_dtype ct_model_dtype(const ct_model *m) {
    return m->dtype;
}

ct_backend *ct_model_backend(const ct_model *m) {
    return m->be;
}

int ct_model_n_layers(const ct_model *m) {
    return (int)m->L;
}

int64_t ct_model_seq_len(const ct_model *m) {
    return m->T;
}

int64_t ct_model_local_seq_len(const ct_model *m) {
    return m->Tl;
}

int64_t ct_model_d_model(const ct_model *m) {
    return m->C;
}

int64_t ct_model_vocab_size(const ct_model *m) {
    return m->V;
}

int ct_model_embed_unit(const ct_model *m) {
    return m->embed_unit;
}

int ct_model_head_unit(const ct_model *m) {
    return m->head_unit;
}

const ct_param *ct_model_wte(const ct_model *m) {
    return m->wte;
}

const ct_param *ct_model_head_weight(const ct_model *m) {
    return m->tied ? m->wte : m->lm_head;
}

const ct_model_hooks *ct_model_hooks_of(const ct_model *m) {
    return &m->hooks;
}

void ct_model_set_hooks(ct_model *m, ct_model_hooks hooks) {
    m->hooks = hooks;
}

ct_tied_place ct_model_tied_place(const ct_model *m, int *unit) {
    const bool embed = m->embed_unit >= 0, head = m->head_unit >= 0;
    if (unit) *unit = embed ? m->embed_unit : head && m->tied ? m->head_unit : -1;
    if (embed && head) return CT_TIED_LOCAL;
    if (!m->tied) return CT_TIED_ABSENT; /* no twin: the head has its own lm_head */
    if (embed) return CT_TIED_FIRST;
    return head ? CT_TIED_LAST : CT_TIED_ABSENT;
}

/* Writes elements [e0, e1) of parameter p's local slice (row-major) as initial fp32 values into
 * dst[0, e1 - e0). Each element is a pure function of (seed, name, global index), so any part of a
 * tensor can be made on its own. */
static void init_param_host(const ct_model *m, const ct_param *p, int64_t e0, int64_t e1,
                            float *dst) {
    /* A tied twin draws from the stream of the tensor it is tied to: same bytes. */
    uint64_t stream = ct_rng_hash_name(p->tied_to ? p->tied_to : p->name);
    int64_t cols = p->local_shape[1];
    int64_t row0 = p->tp_split_dim == 0 ? p->tp_offset : 0;
    int64_t col0 = p->tp_split_dim == 1 ? p->tp_offset : 0;
    int64_t gcols = p->global_shape[1];
#pragma omp parallel for schedule(static)
    for (int64_t e = e0; e < e1; e++) {
        int64_t r = e / cols, c = e % cols;
        float v = 0.0f;
        if (r < p->valid_rows) {
            switch (p->init) {
            case CT_INIT_ZEROS: v = 0.0f; break;
            case CT_INIT_ONES: v = 1.0f; break;
            case CT_INIT_NORMAL: {
                uint64_t g = (uint64_t)((row0 + r) * gcols + col0 + c);
                v = (float)(p->init_std * ct_rng_normal(m->seed, stream, g));
                break;
            }
            }
        }
        dst[e - e0] = v;
    }
}

void ct_model_init_range_host(const ct_model *m, int u, int64_t lo, int64_t n, float *host) {
    const ct_unit *unit = &m->units[u];
    CT_ASSERT(lo >= 0 && n >= 0 && lo + n <= unit->padded_numel);
    memset(host, 0, (size_t)n * sizeof(float)); /* unit padding, and the gaps between tensors */
    for (int i = 0; i < unit->n_params; i++) {
        const ct_param *p = &m->params[unit->first_param + i];
        int64_t start = CT_MAX(lo, p->offset), end = CT_MIN(lo + n, p->offset + p->numel);
        if (start < end)
            init_param_host(m, p, start - p->offset, end - p->offset, host + (start - lo));
    }
}

void ct_model_init_unit(ct_model *m, int u) {
    ct_unit *unit = &m->units[u];
    CT_ASSERTF(unit->params->data != NULL, "unit %s has no parameter buffer bound", unit->name);
    float *host = ct_xmalloc((size_t)unit->padded_numel * sizeof(float));
    ct_model_init_range_host(m, u, 0, unit->padded_numel, host);
    ct_tensor_from_host_f32(unit->params, host); /* rounded once to bf16 in bf16 mode */
    free(host);
}

void ct_model_init_params(ct_model *m) {
    for (int u = 0; u < m->n_units; u++) ct_model_init_unit(m, u);
}

void ct_model_zero_grads(ct_model *m) {
    if (m->grad_slab) ct_tensor_zero(m->grad_slab);
}

double ct_model_flops_per_token(const ct_model *m) {
    /* Every weight used in a GEMM costs 2 FLOPs per token forward and 4 backward; the position
     * embedding and norms are not GEMMs. Causal attention: QKᵀ and P·V are 2·T·C FLOPs per token
     * each forward over the full square; the causal half is what is computed, so 2·T·C forward
     * and 4·T·C backward per layer. */
    double n_matmul = 0;
    const double mlp = m->arch->act.matmuls; /* an MLP's weight matrices: up, down (GPT-2);
                                                gate, up, down (Llama) */
    for (int l = 0; l < m->L; l++) {
        n_matmul += (double)m->C * (m->NH * m->hd) * 2 + (double)m->C * (m->NKV * m->hd) * 2;
        if (ct_moe_layer(&m->mc, l)) /* the router, k routed and the shared experts */
            n_matmul += (double)m->C * m->mc.moe_experts +
                        mlp * (double)(m->mc.moe_top_k + m->mc.moe_shared) * m->C *
                            (m->mc.moe_d_ff ? m->mc.moe_d_ff : m->F);
        else
            n_matmul += mlp * (double)m->C * m->F;
    }
    n_matmul += (double)m->Vp * m->C; /* the tied LM head */
    return 6.0 * n_matmul + 6.0 * (double)m->L * m->T_seq * m->C;
}

/* ---- forward ----------------------------------------------------------------------------------
 */

static void posemb_fwd_run(ct_model *m, ct_tensor *x, int64_t B, int64_t n, int64_t pos,
                           void *ctx) {
    (void)ctx;
    ct_posemb_fwd(x, m->wpe->value, B, n, pos);
}

static void posemb_bwd_run(ct_model *m, ct_tensor *dx, int64_t B, int64_t n, int64_t pos,
                           void *ctx) {
    (void)ctx;
    ct_posemb_bwd(m->wpe->grad, dx, B, n, pos);
}

static void embed_forward(ct_model *m, ct_acts *a) {
    ct_tensor *x = a->residual[0];
    if (!m->layout.sequence_parallel) {
        ct_embedding_fwd(x, a->tokens, m->wte->value, m->wte->tp_offset);
        /* vocab-parallel: each rank contributed its rows */
        ct_model_tp_allreduce(m, x, CT_REDUCE_SUM);
        if (m->wpe) ct_model_for_position_runs(m, x, a->B, m->T, 0, posemb_fwd_run, NULL);
        return;
    }
    ct_tensor *full = ct_model_sp_view(m->sp_full, a->B, m->T, m->C);
    ct_embedding_fwd(full, a->tokens, m->wte->value, m->wte->tp_offset);
    ct_model_seq_reduce_scatter(m, x, full);
    ct_tensor_free(full);
    if (m->wpe)
        ct_model_for_position_runs(m, x, a->B, m->Tl, m->layout.tp_rank * m->Tl, posemb_fwd_run,
                                   NULL);
}

void ct_model_begin_losses(ct_model *m, int n_microbatches, int64_t B) {
    if (m->head_unit < 0) return; /* the loss is computed on the last pipeline stage */
    const int64_t len = B * m->T, need = (int64_t)n_microbatches * len;
    if (!m->step_losses || m->step_losses->numel < need) {
        ct_tensor_free(m->step_losses);
        m->step_losses = ct_tensor_new_1d(m->be, CT_DTYPE_F32, need, CT_MEM_ACTS);
        CT_ASSERTF(m->step_losses, "out of memory for %lld per-token losses", (long long)need);
    }
    m->loss_slots = n_microbatches;
    m->loss_slot_len = len;
    ct_tensor_zero(m->step_losses);
}

double ct_model_loss_sum(ct_model *m) {
    if (m->loss_slots == 0) return 0.0;
    const int64_t len = m->loss_slot_len;
    ct_tensor *used = ct_tensor_view_1d(m->step_losses, 0, (int64_t)m->loss_slots * len);
    float *losses = ct_xmalloc((size_t)used->numel * sizeof(float));
    ct_tensor_to_host(losses, used); /* the step's one copy of its loss to the host */
    ct_tensor_free(used);
    double total = 0.0;
    for (int mb = 0; mb < m->loss_slots; mb++) {
        double sum = 0.0;
        for (int64_t i = 0; i < len; i++) sum += losses[(int64_t)mb * len + i];
        total += sum;
    }
    free(losses);
    return total;
}

/* Final norm, tied LM head and vocab-parallel cross-entropy; the per-token losses go to the
 * step's slot for this microbatch (copied on the backend: no host round trip per microbatch). */
static void head_forward(ct_model *m, ct_acts *a, float dloss) {
    int64_t N = a->B * m->T;
    ct_tensor *x = a->residual[m->L];
    /* LayerNorm, or RMSNorm where the architecture's norms have no bias (lnf_b NULL) */
    ct_model_norm_for_columns(m, a->lnf, a->lnf_mean, a->lnf_rstd, x, NULL, m->lnf_w, m->lnf_b);
    const ct_param *w = ct_model_head_weight(m);
    ct_gemm(a->logits, a->lnf, w->value, false, true, 1.0f, 0.0f);
    ct_vocab_parallel_xent(m->layout.tp, a->losses, a->logits, a->targets, a->rowmax, a->sumexp,
                           a->target_logit, w->valid_rows, w->tp_offset, dloss);
    if (a->mb >= 0 && a->mb < m->loss_slots) {
        CT_ASSERTF(N == m->loss_slot_len, "microbatch of %lld tokens, loss slots of %lld",
                   (long long)N, (long long)m->loss_slot_len);
        ct_tensor *slot = ct_tensor_view_1d(m->step_losses, (int64_t)a->mb * N, N);
        ct_tensor_copy(slot, a->losses);
        ct_tensor_free(slot);
    }
}

/* Under the V (layout.v_shape) the tied embedding and the LM head that reads it sit in two
 * chunks of one rank: the head's chunk brackets the embedding's unit too, around the head. */
static bool head_opens_embed(const ct_model *m, int c) {
    return m->tied && m->embed_unit >= 0 && m->layout.chunks[c].has_head &&
           !m->layout.chunks[c].has_embed;
}

int ct_model_unit_brackets(const ct_model *m, int unit) {
    if (unit != m->embed_unit) return 1;
    for (int c = 0; c < m->layout.n_chunks; c++)
        if (head_opens_embed(m, c)) return 2;
    return 1;
}

void ct_model_forward_chunk(ct_model *m, int c, ct_acts *a, float dloss) {
    a->dloss = dloss;
    const int first = m->layout.chunks[c].first_layer, n = m->layout.chunks[c].n_layers;
    const bool has_embed = m->layout.chunks[c].has_embed, has_head = m->layout.chunks[c].has_head;
    /* With the embedding and the head in one chunk, the tied embedding is read by both: its
     * unit stays open from the embedding to the LM head (one use per pass). */
    if (has_embed) {
        ct_model_unit_begin(m, m->embed_unit, CT_PASS_FORWARD);
        embed_forward(m, a);
        if (!has_head) ct_model_unit_end(m, m->embed_unit, CT_PASS_FORWARD);
    }
    /* A merged unit is open from its first layer to its last (units never span chunks). */
    for (int l = first; l < first + n; l++) {
        const ct_unit *u = &m->units[m->layer_unit[l]];
        if (l == u->first_layer) ct_model_unit_begin(m, m->layer_unit[l], CT_PASS_FORWARD);
        m->arch->layer_forward(m, l, a, a->residual[l + 1]);
        if (l == u->first_layer + u->n_layers - 1)
            ct_model_unit_end(m, m->layer_unit[l], CT_PASS_FORWARD);
    }
    if (has_head) {
        const bool apart = head_opens_embed(m, c);
        if (apart) ct_model_unit_begin(m, m->embed_unit, CT_PASS_FORWARD);
        ct_model_unit_begin(m, m->head_unit, CT_PASS_FORWARD);
        head_forward(m, a, dloss);
        ct_model_unit_end(m, m->head_unit, CT_PASS_FORWARD);
        if (has_embed || apart) ct_model_unit_end(m, m->embed_unit, CT_PASS_FORWARD);
    }
}

/* ---- backward ---------------------------------------------------------------------------------
 */

static void head_backward(ct_model *m, ct_acts *a, ct_grad_scratch *s) {
    /* a->logits holds dloss·(softmax − onehot) from head_forward. */
    const ct_param *w = ct_model_head_weight(m);
    ct_gemm(s->dln, a->logits, w->value, false, false, 1.0f, 0.0f); /* (N,C) */
    ct_tensor *dlnf = ct_model_dln_reduced(m, s);
    ct_gemm(w->grad, a->logits, a->lnf, true, false, 1.0f, 1.0f); /* (Vp/tp, C) */
    ct_tensor_zero(s->dres);
    ct_model_norm_backward(s->dres, m->lnf_w, m->lnf_b, dlnf, a->residual[m->L], a->lnf_mean,
                           a->lnf_rstd);
}

static void embed_backward(ct_model *m, ct_acts *a, ct_grad_scratch *s) {
    ct_embedding_bwd(m->wte->grad, ct_model_dres_full(m, s), a->tokens, m->wte->tp_offset);
    int64_t row0 = m->layout.sequence_parallel ? m->layout.tp_rank * m->Tl : 0;
    if (m->wpe) ct_model_for_position_runs(m, s->dres, a->B, m->Tl, row0, posemb_bwd_run, NULL);
}

void ct_model_backward_chunk(ct_model *m, int c, ct_acts *a, ct_grad_scratch *s) {
    const int first = m->layout.chunks[c].first_layer, n = m->layout.chunks[c].n_layers;
    const bool has_embed = m->layout.chunks[c].has_embed, has_head = m->layout.chunks[c].has_head;
    CT_ASSERT(s->B == a->B);
    if (has_head) {
        /* The tied embedding's gradient starts at the LM head and ends at the embedding. */
        const bool apart = head_opens_embed(m, c);
        if (has_embed || apart) ct_model_unit_begin(m, m->embed_unit, CT_PASS_BACKWARD);
        ct_model_unit_begin(m, m->head_unit, CT_PASS_BACKWARD);
        head_backward(m, a, s);
        ct_model_unit_end(m, m->head_unit, CT_PASS_BACKWARD);
        if (apart) ct_model_unit_end(m, m->embed_unit, CT_PASS_BACKWARD);
    }
    /* Layers last to first: a merged unit opens at its last layer and closes after its first,
     * when every layer in it has written its gradients. */
    for (int l = first + n - 1; l >= first; l--) {
        const ct_unit *u = &m->units[m->layer_unit[l]];
        if (l == u->first_layer + u->n_layers - 1)
            ct_model_unit_begin(m, m->layer_unit[l], CT_PASS_BACKWARD);
        if (m->layout.recompute) {
            /* Only the layer's input was kept: rebuild its internals (the forward's
             * collectives run again). The output is already in residual[l+1]. */
            ct_tensor *out = ct_tensor_view(m->recompute_out, 0, 3, a->residual[l + 1]->shape);
            m->recomputing = true;
            m->arch->layer_forward(m, l, a, out);
            m->recomputing = false;
            ct_tensor_free(out);
        }
        m->arch->layer_backward(m, l, a, s);
        if (l == u->first_layer) ct_model_unit_end(m, m->layer_unit[l], CT_PASS_BACKWARD);
    }
    if (has_embed) {
        if (!has_head) ct_model_unit_begin(m, m->embed_unit, CT_PASS_BACKWARD);
        embed_backward(m, a, s);
        ct_model_unit_end(m, m->embed_unit, CT_PASS_BACKWARD);
    }
}

void ct_model_backward_input(ct_model *m, int c, ct_acts *a, ct_grad_scratch *s) {
    CT_ASSERTF(c >= 0 && c < CT_MAX_CHUNKS && ct_wgrad_store_empty(a->wstore[c]),
               "an input part of chunk %d while its last weight part has not run", c);
    if (!a->wstore[c]) a->wstore[c] = ct_wgrad_store_new();
    m->wstore = a->wstore[c];
    ct_model_backward_chunk(m, c, a, s);
    m->wstore = NULL;
}

void ct_model_backward_weight(ct_model *m, int c, ct_acts *a) {
    CT_ASSERTF(c >= 0 && c < CT_MAX_CHUNKS && !ct_wgrad_store_empty(a->wstore[c]),
               "a weight part of chunk %d without its input part", c);
    ct_wgrad_replay(m, a->wstore[c]);
}

/* ---- decoding with a key/value cache --------------------------------------------------------
 */

ct_status ct_model_decode_begin(ct_model *m) {
    CT_ASSERTF(!m->decode, "ct_model_decode_begin: already decoding");
    CT_ASSERTF(m->live_acts == 0 || !m->layout.recompute || m->recompute_B >= 1,
               "ct_model_decode_begin: no recompute workspace");
    ct_model_decode *d = ct_xcalloc(1, sizeof *d);
    d->kv = ct_xcalloc((size_t)m->L, sizeof *d->kv);
    const int64_t kvdim = 2 * m->NKV / m->layout.tp_size * m->hd;
    for (int64_t l = 0; l < m->L; l++) {
        if (m->layer_unit[l] < 0) continue; /* not on this rank */
        d->kv[l] = ct_tensor_new_1d(m->be, m->dtype, m->T_seq * kvdim, CT_MEM_ACTS);
        if (!d->kv[l]) {
            char why[512]; /* the allocator's message: the bytes and the category */
            snprintf(why, sizeof why, "%s", ct_error_message());
            for (int64_t j = 0; j < l; j++) ct_tensor_free(d->kv[j]);
            free(d->kv);
            free(d);
            return ct_error(CT_ERR_RUNTIME,
                            "the key/value cache of sampling (%lld x %lld a layer): %s",
                            (long long)m->T_seq, (long long)kvdim, why);
        }
        ct_tensor_zero(d->kv[l]); /* rows not yet written hold zeros, never stale bits */
    }
    d->T = m->T, d->Tl = m->Tl, d->cp_size = m->layout.cp_size;
    d->sequence_parallel = m->layout.sequence_parallel;
    m->T = m->Tl = 1;
    m->layout.cp_size = 1;
    m->layout.sequence_parallel = false;
    m->decode = d;
    return CT_OK;
}

void ct_model_decode_at(ct_model *m, int64_t pos) {
    CT_ASSERTF(m->decode && pos >= 0 && pos < m->T_seq,
               "ct_model_decode_at(%lld): not decoding, or past seq_len %lld", (long long)pos,
               (long long)m->T_seq);
    m->decode->pos = pos;
}

void ct_model_decode_end(ct_model *m) {
    ct_model_decode *d = m->decode;
    if (!d) return;
    for (int64_t l = 0; l < m->L; l++) ct_tensor_free(d->kv[l]);
    free(d->kv);
    m->T = d->T, m->Tl = d->Tl, m->layout.cp_size = d->cp_size;
    m->layout.sequence_parallel = d->sequence_parallel;
    free(d);
    m->decode = NULL;
}

void ct_model_forward(ct_model *m, ct_acts *a, float dloss) {
    for (int c = 0; c < m->layout.n_chunks; c++) ct_model_forward_chunk(m, c, a, dloss);
}

double ct_model_forward_loss(ct_model *m, ct_acts *a, float dloss) {
    ct_model_begin_losses(m, 1, a->B);
    a->mb = 0;
    ct_model_forward(m, a, dloss);
    return ct_model_loss_sum(m);
}

void ct_model_backward(ct_model *m, ct_acts *a, ct_grad_scratch *s) {
    for (int c = m->layout.n_chunks - 1; c >= 0; c--) ct_model_backward_chunk(m, c, a, s);
}
