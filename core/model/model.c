/*
 * model.c — the model (GPT-2 or Llama): registry, initialisation, forward and backward per chunk.
 * See model.h; Llama's block is in model_llama.c.
 *
 * Forward of one layer (pre-LayerNorm block), x = residual[l] (B,T,C):
 *     ln1 = LN(x)                          q|k|v = ln1·Wqkvᵀ + b   (column-parallel, one GEMM)
 *     att = causal_attention(q, k, v)      mid = x + (att·Woᵀ [allreduce tp]) + bo
 *     ln2 = LN(mid)                        h = ln2·Wupᵀ + bup,  g = GELU(h)
 *     residual[l+1] = mid + (g·Wdownᵀ [allreduce tp]) + bdown
 * Backward mirrors it; the tensor-parallel "copy" operators turn into allreduces of the norm
 * output gradients. With tp = 1 every tp collective is on a group of one and costs nothing.
 * The collectives themselves (tp sums, sequence parallelism's gathers and reduce-scatters, the
 * block boundaries) are in model_collectives.c, the activation memory in model_acts.c.
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
#include "rope.h"
#include "core/rng.h"

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
    for (int j = 0; j < v; j++) {
        int c = pp_rank + j * pp, first = 0;
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
    int cap;
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

static void begin_unit(ct_model *m, const char *name, int *unit_cap) {
    if (m->n_units == *unit_cap) {
        *unit_cap = *unit_cap ? 2 * *unit_cap : 16;
        m->units = realloc(m->units, (size_t)*unit_cap * sizeof *m->units);
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

/* The tensors of one expert, in registry order (ct_model_expert_tensors). GPT-2: an MLP with
 * biases; Llama: SwiGLU's gate and up (adjacent: one (2Fe, C) matrix a tp rank) and down. */
typedef struct expert_tensor {
    const char *kind;
    int ndim, split;    /* dims; tp split (0 rows, 1 columns, -1 replicated) */
    bool out_fe, in_fe; /* rows / columns of width moe_d_ff (else d_model; 1-D: rows only) */
    ct_init_rule init;
    bool residual; /* the residual-stream projection's init std */
} expert_tensor;

static const expert_tensor gpt2_expert[] = {
    {"w_up", 2, 0, true, false, CT_INIT_NORMAL, false},
    {"b_up", 1, 0, true, false, CT_INIT_ZEROS, false},
    {"w_down", 2, 1, false, true, CT_INIT_NORMAL, true},
    {"b_down", 1, -1, false, false, CT_INIT_ZEROS, false},
};
static const expert_tensor llama_expert[] = {
    {"w_gate", 2, 0, true, false, CT_INIT_NORMAL, false},
    {"w_up", 2, 0, true, false, CT_INIT_NORMAL, false},
    {"w_down", 2, 1, false, true, CT_INIT_NORMAL, true},
};

int ct_model_expert_tensors(const ct_model *m) {
    return m->llama ? (int)CT_ARRAY_LEN(llama_expert) : (int)CT_ARRAY_LEN(gpt2_expert);
}

/* One expert tensor of kind k whose hidden width is `width`. */
static ct_param *add_expert_tensor(registry_builder *rb, const char *name, const expert_tensor *k,
                                   int64_t width, int chunk, float std, float residual_std) {
    const int64_t C = rb->model->C;
    const float sd = k->init == CT_INIT_ZEROS ? 0.0f : k->residual ? residual_std : std;
    return add_param(rb, name, k->ndim, k->out_fe ? width : C, k->in_fe ? width : C, k->split,
                     k->init, sd, chunk);
}

/* Mixture of Experts (moe.c) in layer l: the router, replicated, then in a unit of their own
 * (reduced and sharded over the ranks that hold the same experts, layout.edp, not over all of
 * dp) this rank's experts, the ep group's share (moe_experts / ep consecutive ones), each an MLP
 * like the dense one: ct_model_expert_tensors consecutive entries per expert, moe_experts naming
 * the first. */
static void add_moe(registry_builder *rb, int l, int chunk, int *unit_cap, float std,
                    float residual_std) {
    ct_model *m = rb->model;
    const int64_t C = m->C, E = m->mc.moe_experts, Fe = m->mc.moe_d_ff ? m->mc.moe_d_ff : m->F;
    const int64_t El = E / m->layout.ep_size, e0 = m->layout.ep_rank * El;
    const expert_tensor *kinds = m->llama ? llama_expert : gpt2_expert;
    char name[64];
    /* Shared experts (moe_shared of them): one MLP of their summed width every token goes
     * through, in the layer's own unit like a dense MLP, bound to the MLP's fields. */
    const int64_t Fs = m->mc.moe_shared * Fe;
    for (int j = 0; Fs && j < ct_model_expert_tensors(m); j++) {
        const expert_tensor *k = &kinds[j];
        static const size_t gpt2_fields[] = {
            offsetof(ct_layer_params, w_up), offsetof(ct_layer_params, b_up),
            offsetof(ct_layer_params, w_down), offsetof(ct_layer_params, b_down)};
        static const size_t llama_fields[] = {offsetof(ct_layer_params, w_gate),
                                              offsetof(ct_layer_params, w_up),
                                              offsetof(ct_layer_params, w_down)};
        snprintf(name, sizeof name, "layers.%d.moe.shared.%s", l, k->kind);
        ct_param *q = add_expert_tensor(rb, name, k, Fs, chunk, std, residual_std);
        q->layer = l;
        q->field = m->llama ? llama_fields[j] : gpt2_fields[j];
    }
    snprintf(name, sizeof name, "layers.%d.moe.router", l);
    ct_param *router = add_param(rb, name, 2, E, C, -1, CT_INIT_NORMAL, std, chunk);
    router->layer = l;
    router->field = offsetof(ct_layer_params, moe_router);
    snprintf(name, sizeof name, "experts.%d", l);
    begin_unit(m, name, unit_cap);
    m->units[m->n_units - 1].experts = true;
    m->units[m->n_units - 1].first_layer = l;
    m->expert_unit[l] = m->n_units - 1;
    for (int64_t e = e0; e < e0 + El; e++)
        for (int j = 0; j < ct_model_expert_tensors(m); j++) {
            snprintf(name, sizeof name, "layers.%d.moe.experts.%lld.%s", l, (long long)e,
                     kinds[j].kind);
            ct_param *q = add_expert_tensor(rb, name, &kinds[j], Fe, chunk, std, residual_std);
            q->layer = l;
            q->expert = (int)e;
            q->field =
                e == e0 && j == 0 ? offsetof(ct_layer_params, moe_experts) : CT_PARAM_NO_FIELD;
        }
}

static void build_registry(ct_model *m) {
    registry_builder rb = {.model = m, .cap = 0};
    m->embed_unit = m->head_unit = -1;
    m->layer_unit = ct_xmalloc((size_t)m->L * sizeof *m->layer_unit);
    m->expert_unit = ct_xmalloc((size_t)m->L * sizeof *m->expert_unit);
    for (int l = 0; l < m->L; l++) m->layer_unit[l] = m->expert_unit[l] = -1;
    int unit_cap = 0;
    const float std = 0.02f;
    /* GPT-2: projections that write into the residual stream are scaled by 1/sqrt(2·L) so the
     * stream's variance does not grow with depth. */
    const float residual_std = std / sqrtf(2.0f * (float)m->L);
    int64_t C = m->C, F = m->F, qdim = m->NH * m->hd, kvdim = m->NKV * m->hd;
    bool have_embed = false;
    for (int c = 0; c < m->layout.n_chunks; c++) have_embed |= m->layout.chunks[c].has_embed;

    for (int c = 0; c < m->layout.n_chunks; c++) {
        const int chunk = m->layout.chunks[c].index;
        if (m->layout.chunks[c].has_embed) {
            begin_unit(m, "embed", &unit_cap);
            m->embed_unit = m->n_units - 1;
            add_param(&rb, "wte", 2, m->Vp, C, 0, CT_INIT_NORMAL, std, chunk)->field =
                offsetof(ct_model, wte);
            if (!m->llama) /* Llama's positions are rotary: no table to learn */
                add_param(&rb, "wpe", 2, m->T_seq, C, -1, CT_INIT_NORMAL, std, chunk)->field =
                    offsetof(ct_model, wpe);
        }
        for (int i = 0; i < m->layout.chunks[c].n_layers; i++) {
            int l = m->layout.chunks[c].first_layer + i;
            char unit_name[32], name[64];
            /* The wrapping policy (model.h, Units): a layer joins the current unit while that
             * unit is below unit_min_bytes. The first layer of a chunk always opens a unit, so
             * none spans two chunks. */
            bool open = i == 0 || m->units[m->n_units - 1].experts ||
                        unit_bytes(m, &m->units[m->n_units - 1]) >= m->layout.unit_min_bytes;
            if (open) {
                snprintf(unit_name, sizeof unit_name, "layer.%d", l);
                begin_unit(m, unit_name, &unit_cap);
                m->units[m->n_units - 1].first_layer = l;
            }
            ct_unit *cur = &m->units[m->n_units - 1];
            if (!open) snprintf(cur->name, sizeof cur->name, "layers.%d-%d", cur->first_layer, l);
            cur->n_layers++;
            m->layer_unit[l] = m->n_units - 1;
#define P(field_name, suffix, nd, rows, cols, split, init, sd)                                     \
    do {                                                                                           \
        snprintf(name, sizeof name, "layers.%d.%s", l, suffix);                                    \
        ct_param *p_ = add_param(&rb, name, nd, rows, cols, split, init, sd, chunk);               \
        p_->layer = l;                                                                             \
        p_->field = offsetof(ct_layer_params, field_name);                                         \
    } while (0)
            if (m->llama) {
                /* No biases; wq, wk, wv back to back (one (q + 2 kv, C) matrix, qkv_params), and
                 * w_gate, w_up back to back (one (2F, C) matrix, gate_up_weight). */
                P(ln1_w, "ln1.weight", 1, C, 1, -1, CT_INIT_ONES, 0);
                P(wq, "attn.wq", 2, qdim, C, 0, CT_INIT_NORMAL, std);
                P(wk, "attn.wk", 2, kvdim, C, 0, CT_INIT_NORMAL, std);
                P(wv, "attn.wv", 2, kvdim, C, 0, CT_INIT_NORMAL, std);
                P(wo, "attn.wo", 2, C, qdim, 1, CT_INIT_NORMAL, residual_std);
                P(ln2_w, "ln2.weight", 1, C, 1, -1, CT_INIT_ONES, 0);
                if (ct_moe_layer(&m->mc, l)) {
                    add_moe(&rb, l, chunk, &unit_cap, std, residual_std);
                    continue;
                }
                P(w_gate, "mlp.w_gate", 2, F, C, 0, CT_INIT_NORMAL, std);
                P(w_up, "mlp.w_up", 2, F, C, 0, CT_INIT_NORMAL, std);
                P(w_down, "mlp.w_down", 2, C, F, 1, CT_INIT_NORMAL, residual_std);
                continue;
            }
            P(ln1_w, "ln1.weight", 1, C, 1, -1, CT_INIT_ONES, 0);
            P(ln1_b, "ln1.bias", 1, C, 1, -1, CT_INIT_ZEROS, 0);
            /* wq, wk, wv back to back, then bq, bk, bv: in the unit's flat range (and in each tp
             * rank's slice of it) they form one (q + 2 kv, C) matrix and one bias, which the
             * fused QKV projection uses (qkv_params) */
            P(wq, "attn.wq", 2, qdim, C, 0, CT_INIT_NORMAL, std);
            P(wk, "attn.wk", 2, kvdim, C, 0, CT_INIT_NORMAL, std);
            P(wv, "attn.wv", 2, kvdim, C, 0, CT_INIT_NORMAL, std);
            P(bq, "attn.bq", 1, qdim, 1, 0, CT_INIT_ZEROS, 0);
            P(bk, "attn.bk", 1, kvdim, 1, 0, CT_INIT_ZEROS, 0);
            P(bv, "attn.bv", 1, kvdim, 1, 0, CT_INIT_ZEROS, 0);
            P(wo, "attn.wo", 2, C, qdim, 1, CT_INIT_NORMAL, residual_std);
            P(bo, "attn.bo", 1, C, 1, -1, CT_INIT_ZEROS, 0);
            P(ln2_w, "ln2.weight", 1, C, 1, -1, CT_INIT_ONES, 0);
            P(ln2_b, "ln2.bias", 1, C, 1, -1, CT_INIT_ZEROS, 0);
            if (ct_moe_layer(&m->mc, l)) {
                add_moe(&rb, l, chunk, &unit_cap, std, residual_std);
                continue;
            }
            P(w_up, "mlp.w_up", 2, F, C, 0, CT_INIT_NORMAL, std);
            P(b_up, "mlp.b_up", 1, F, 1, 0, CT_INIT_ZEROS, 0);
            P(w_down, "mlp.w_down", 2, C, F, 1, CT_INIT_NORMAL, residual_std);
            P(b_down, "mlp.b_down", 1, C, 1, -1, CT_INIT_ZEROS, 0);
#undef P
        }
        if (m->layout.chunks[c].has_head) {
            begin_unit(m, "head", &unit_cap);
            m->head_unit = m->n_units - 1;
            if (!m->tied) {
                /* An LM head of its own: vocab-parallel like wte, first in its unit. */
                add_param(&rb, "lm_head", 2, m->Vp, C, 0, CT_INIT_NORMAL, std, chunk)->field =
                    offsetof(ct_model, lm_head);
            } else if (!have_embed) {
                /* The last stage's twin of the tied embedding (pipeline parallel). It comes
                 * first, at offset 0 like wte in the embedding unit, and both units are padded
                 * to the same size (ct_model_new): then every data-parallel shard covers the
                 * same part of the two copies and their gradients can be summed shard by
                 * shard. */
                ct_param *twin =
                    add_param(&rb, "head.wte", 2, m->Vp, C, 0, CT_INIT_NORMAL, std, chunk);
                twin->tied_to = "wte";
                twin->field = offsetof(ct_model, wte); /* the LM head reads m->wte either way */
            }
            add_param(&rb, "lnf.weight", 1, C, 1, -1, CT_INIT_ONES, 0, chunk)->field =
                offsetof(ct_model, lnf_w);
            if (!m->llama)
                add_param(&rb, "lnf.bias", 1, C, 1, -1, CT_INIT_ZEROS, 0, chunk)->field =
                    offsetof(ct_model, lnf_b);
        }
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
    m.llama = cfg->model.arch == CT_ARCH_LLAMA;
    m.tied = cfg->model.tie_embeddings;
    m.layout = ct_model_layout_single(cfg);
    build_registry(&m);
    free(m.units);
    free(m.layer_unit);
    free(m.expert_unit);
    *count = m.n_params;
    return m.params;
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
    m->llama = cfg->model.arch == CT_ARCH_LLAMA;
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

    /* Offsets: parameters packed in registry order inside their unit; units padded so that
     * every data-parallel shard is equal and 64-byte aligned. */
    const int64_t align = 16 * (int64_t)CT_MAX(1, layout->dp_size);
    /* With the embedding and the head on different pipeline ranks, both tied units get the
     * padded size of the larger one (see the twin in build_registry). */
    const int64_t vocab_slice = m->Vp / layout->tp_size * m->C;
    const int64_t embed_numel = vocab_slice + (m->llama ? 0 : m->T_seq * m->C); /* wte (+ wpe) */
    const int64_t head_numel = vocab_slice + (m->llama ? 1 : 2) * m->C;         /* twin + lnf */
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
    if (m->llama) {
        /* RoPE's angles, once, in double on the host: every backend reads these bytes */
        int64_t n = m->T_seq * m->hd;
        m->rope_table = ct_tensor_new_1d(be, CT_DTYPE_F32, n, CT_MEM_WORKSPACE);
        if (!m->rope_table) goto oom;
        float *host = ct_xmalloc((size_t)n * sizeof *host);
        const ct_model_config *mc = &cfg->model;
        const ct_rope_scaling scaling = {mc->rope_scaling_factor, mc->rope_low_freq_factor,
                                         mc->rope_high_freq_factor, mc->rope_original_max_pos};
        ct_rope_table(host, m->T_seq, m->hd, mc->rope_theta, &scaling); /* factor 0: unscaled */
        ct_tensor_from_host(m->rope_table, host);
        free(host);
    }
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
    for (int l = 0; l < m->L; l++) {
        n_matmul += (double)m->C * (m->NH * m->hd) * 2 + (double)m->C * (m->NKV * m->hd) * 2;
        if (ct_moe_layer(&m->mc, l)) /* the router, k routed and the shared experts (up, down;
                                         Llama: gate) */
            n_matmul += (double)m->C * m->mc.moe_experts +
                        (m->llama ? 3.0 : 2.0) * (double)(m->mc.moe_top_k + m->mc.moe_shared) *
                            m->C * (m->mc.moe_d_ff ? m->mc.moe_d_ff : m->F);
        else
            n_matmul += (m->llama ? 3.0 : 2.0) * (double)m->C * m->F; /* gate, up, down */
    }
    n_matmul += (double)m->Vp * m->C; /* the tied LM head */
    return 6.0 * n_matmul + 6.0 * (double)m->L * m->T_seq * m->C;
}

/* ---- forward ----------------------------------------------------------------------------------
 */

void ct_model_unit_begin(ct_model *m, int unit, ct_pass pass) {
    if (m->hooks.unit_begin) m->hooks.unit_begin(m->hooks.ctx, unit, pass);
}

void ct_model_unit_end(ct_model *m, int unit, ct_pass pass) {
    if (m->hooks.unit_end) m->hooks.unit_end(m->hooks.ctx, unit, pass);
}

/* Lets outstanding communication progress (MPI progresses only inside MPI calls). */
void ct_model_poll(ct_model *m) {
    if (m->hooks.poll) m->hooks.poll(m->hooks.ctx);
}

/* A linear layer's forward, y = x·Wᵀ + b: x (N, in), W (out, in), y (N, out). y starts as b and
 * the GEMM accumulates (beta = 1): a BLAS GEMM with beta = 0 zeroes its output in a pass of its
 * own, so this saves a pass over y (ct_bias_init; the MLP's up-projection does the same inside
 * ct_gemm_bias_gelu, or fuses bias and GELU into the GEMM's epilogue). */

/* Parameter gradients of y = x·Wᵀ + b: dW += dyᵀ·x, db += Σ dy. */
void ct_model_linear_bwd_params(const ct_tensor *dy, const ct_tensor *x, ct_tensor *dw,
                                ct_tensor *db) {
    ct_gemm(dw, dy, x, true, false, 1.0f, 1.0f);
    if (db) ct_bias_grad(db, dy);
}

/* Layer l's q, k and v projections as one: views of the (q + 2 kv, C) weight and (q + 2 kv) bias
 * that wq, wk, wv and bq, bk, bv form in the unit's range (see build_registry) — the values, or
 * with `grads` the gradients. One GEMM instead of three reads ln1 once and runs at the rate of
 * the larger shape. Free with ct_tensor_free. */
void ct_model_qkv_params(ct_model *m, int l, bool grads, ct_tensor **w, ct_tensor **b) {
    const ct_layer_params *p = &m->layers[l];
    const ct_unit *unit = &m->units[p->wq->unit];
    const ct_tensor *range = grads ? unit->grads : unit->params;
    int64_t rows = p->wq->local_shape[0] + p->wk->local_shape[0] + p->wv->local_shape[0];
    CT_ASSERT(p->wk->offset == p->wq->offset + p->wq->numel &&
              p->wv->offset == p->wk->offset + p->wk->numel);
    *w = ct_tensor_view_2d(range, p->wq->offset, rows, m->C);
    *b = NULL; /* Llama: no biases */
    if (!p->bq) return;
    CT_ASSERT(p->bq->offset == p->wv->offset + p->wv->numel &&
              p->bk->offset == p->bq->offset + p->bq->numel &&
              p->bv->offset == p->bk->offset + p->bk->numel);
    *b = ct_tensor_view_1d(range, p->bq->offset, rows);
}

/* Runs layer l on residual[l], writing its internals into a->layers[l] and its output to
 * `out` (residual[l+1], or a scratch when backward recomputes the internals). */
static void layer_forward(ct_model *m, int l, ct_acts *a, ct_tensor *out) {
    if (m->llama) {
        ct_model_llama_layer_forward(m, l, a, out);
        return;
    }
    ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_tensor *x = a->residual[l];

    ct_model_norm_for_columns(m, la->ln1, la->ln1_mean, la->ln1_rstd, x, NULL, p->ln1_w, p->ln1_b);
    ct_tensor *wqkv, *bqkv;
    ct_model_qkv_params(m, l, false, &wqkv, &bqkv);
    ct_gemm_bias(la->qkv, la->ln1, wqkv, bqkv); /* qkv = ln1·Wqkvᵀ + bqkv, a linear forward */
    ct_tensor_free(wqkv), ct_tensor_free(bqkv);
    ct_model_poll(m);
    ct_model_attention_fwd(m, la->att, la->lse, la->qkv, a->B);
    ct_model_poll(m);
    ct_model_row_parallel_out(m, la->mid, la->att, p->wo, p->bo, NULL);
    /* mid = x + (att·Woᵀ + bo), the residual add fused into ln2 = LN(mid) */
    ct_model_norm_for_columns(m, la->ln2, la->ln2_mean, la->ln2_rstd, la->mid, x, p->ln2_w,
                              p->ln2_b);
    if (p->moe_router) {
        ct_model_moe_forward(m, l, a, out);
        return;
    }
    /* h = ln2·Wupᵀ + b_up, g = GELU(h): fused into the GEMM where the backend can */
    ct_gemm_bias_gelu(la->h, la->g, la->ln2, p->w_up->value, p->b_up->value);
    ct_model_poll(m);
    ct_model_row_parallel_out(m, out, la->g, p->w_down, p->b_down, la->mid);
}

void ct_model_attention_fwd(ct_model *m, ct_tensor *out, ct_tensor *lse, const ct_tensor *qkv,
                            int64_t B) {
    const ct_model_layout *l = &m->layout;
    const int64_t nh = m->NH / l->tp_size, nkv = m->NKV / l->tp_size;
    if (l->cp_size > 1)
        ct_ring_attention_fwd(l->cp, l->cp_zigzag, m->ring_ws, out, lse, qkv, B, m->T, nh, nkv);
    else
        ct_attention_fwd(out, lse, qkv, B, m->T, nh, nkv);
}

void ct_model_attention_bwd(ct_model *m, ct_tensor *dqkv, ct_tensor *dbias, const ct_tensor *dout,
                            const ct_tensor *qkv, const ct_tensor *out, const ct_tensor *lse,
                            int64_t B) {
    const ct_model_layout *l = &m->layout;
    const int64_t nh = m->NH / l->tp_size, nkv = m->NKV / l->tp_size;
    if (l->cp_size > 1)
        ct_ring_attention_bwd(l->cp, l->cp_zigzag, m->ring_ws, dqkv, dbias, dout, qkv, out, lse, B,
                              m->T, nh, nkv);
    else
        ct_attention_bwd(dqkv, dbias, dout, qkv, out, lse, B, m->T, nh, nkv);
}

int64_t ct_model_position(const ct_model *m, int64_t row) {
    const ct_model_layout *l = &m->layout;
    return l->cp_size > 1 ? ct_cp_position(l->cp_size, l->cp_rank, l->cp_zigzag, m->T, row) : row;
}

void ct_model_for_position_runs(ct_model *m, ct_tensor *x, int64_t B, int64_t rows, int64_t row0,
                                void (*fn)(ct_model *m, ct_tensor *rows, int64_t B, int64_t n,
                                           int64_t pos, void *ctx),
                                void *ctx) {
    if (m->layout.cp_size == 1) { /* one run: every sequence's rows at once */
        fn(m, x, B, rows, row0, ctx);
        return;
    }
    const int64_t cols = ct_tensor_cols(x), half = m->T / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < rows;) {
            /* rows up to the end of the chunk holding local row row0 + i */
            int64_t n = CT_MIN(rows - i, half - (row0 + i) % half);
            ct_tensor *v = ct_tensor_view_2d(x, (b * rows + i) * cols, n, cols);
            fn(m, v, 1, n, ct_model_position(m, row0 + i), ctx);
            ct_tensor_free(v);
            i += n;
        }
}

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
    ct_model_norm_for_columns(m, a->lnf, a->lnf_mean, a->lnf_rstd, x, NULL, m->lnf_w, m->lnf_b);
    /* (lnf_b is NULL for llama: an RMSNorm) */
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
        layer_forward(m, l, a, a->residual[l + 1]);
        if (l == u->first_layer + u->n_layers - 1)
            ct_model_unit_end(m, m->layer_unit[l], CT_PASS_FORWARD);
    }
    if (has_head) {
        ct_model_unit_begin(m, m->head_unit, CT_PASS_FORWARD);
        head_forward(m, a, dloss);
        ct_model_unit_end(m, m->head_unit, CT_PASS_FORWARD);
        if (has_embed) ct_model_unit_end(m, m->embed_unit, CT_PASS_FORWARD);
    }
}

/* ---- backward ---------------------------------------------------------------------------------
 */

/* On entry s->dres = ∂L/∂residual[l+1]; on exit ∂L/∂residual[l]. Row-parallel biases take
 * their gradient from this rank's positions: with sequence parallelism that is a partial sum,
 * completed over the tp group by the data-parallel layer. */
/* Backward of a row-parallel projection into the residual stream, y = x·Wᵀ: dx = dy·W and
 * dW += dyᵀ·x, with dy = ∂L/∂residual over the full sequence (gathered under sequence
 * parallelism). */
void ct_model_row_parallel_backward(ct_model *m, ct_grad_scratch *s, const ct_param *w,
                                    const ct_tensor *x, ct_tensor *dx) {
    const ct_tensor *dy = ct_model_dres_full(m, s);
    ct_gemm(dx, dy, w->value, false, false, 1.0f, 0.0f);
    ct_gemm(w->grad, dy, x, true, false, 1.0f, 1.0f);
}

/* A norm's backward into s->dres (accumulating): LayerNorm with its bias, or Llama's RMSNorm
 * (b NULL). */
void ct_model_norm_backward(ct_tensor *dres, const ct_param *w, const ct_param *b,
                            const ct_tensor *dln, const ct_tensor *x, const ct_tensor *mean,
                            const ct_tensor *rstd) {
    if (b)
        ct_layernorm_bwd(dres, w->grad, b->grad, dln, x, w->value, mean, rstd);
    else
        ct_rmsnorm_bwd(dres, w->grad, dln, x, w->value, rstd);
}

static void layer_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s) {
    if (m->llama) {
        ct_model_llama_layer_backward(m, l, a, s);
        return;
    }
    ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_tensor *x = a->residual[l];

    ct_tensor *dln2;
    if (p->moe_router) {
        dln2 = ct_model_moe_backward(m, l, a, s);
    } else {
        /* MLP: out = mid + g·Wdownᵀ + b_down, g = GELU(h), h = ln2·Wupᵀ + b_up */
        ct_model_row_parallel_backward(m, s, p->w_down, la->g, s->dh); /* dg (B,T,F/tp) */
        ct_bias_grad(p->b_down->grad, s->dres);
        ct_model_poll(m);
        ct_gelu_bwd(s->dh, p->b_up->grad, la->h, s->dh); /* and b_up's gradient */
        ct_gemm(s->dln, s->dh, p->w_up->value, false, false, 1.0f, 0.0f);
        dln2 = ct_model_dln_reduced(m, s);
        ct_model_linear_bwd_params(s->dh, la->ln2, p->w_up->grad, NULL);
    }
    ct_layernorm_bwd(s->dres, p->ln2_w->grad, p->ln2_b->grad, dln2, la->mid, p->ln2_w->value,
                     la->ln2_mean, la->ln2_rstd); /* dres += : now ∂L/∂mid */
    ct_model_poll(m);

    /* Attention: mid = x + att·Woᵀ + bo */
    ct_model_row_parallel_backward(m, s, p->wo, la->att, s->datt);
    ct_bias_grad(p->bo->grad, s->dres);
    ct_tensor *wqkv, *bqkv, *dwqkv, *dbqkv;
    ct_model_qkv_params(m, l, false, &wqkv, &bqkv);
    ct_model_qkv_params(m, l, true, &dwqkv, &dbqkv);
    ct_model_attention_bwd(m, s->dqkv, dbqkv, s->datt, la->qkv, la->att, la->lse,
                           a->B); /* and the qkv bias gradient */
    ct_model_poll(m);
    ct_gemm(s->dln, s->dqkv, wqkv, false, false, 1.0f, 0.0f);
    ct_tensor *dln1 = ct_model_dln_reduced(m, s);
    ct_model_linear_bwd_params(s->dqkv, la->ln1, dwqkv, NULL);
    ct_tensor_free(wqkv), ct_tensor_free(bqkv), ct_tensor_free(dwqkv), ct_tensor_free(dbqkv);
    ct_layernorm_bwd(s->dres, p->ln1_w->grad, p->ln1_b->grad, dln1, x, p->ln1_w->value,
                     la->ln1_mean, la->ln1_rstd); /* dres += : now ∂L/∂x */
}

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
        if (has_embed) ct_model_unit_begin(m, m->embed_unit, CT_PASS_BACKWARD);
        ct_model_unit_begin(m, m->head_unit, CT_PASS_BACKWARD);
        head_backward(m, a, s);
        ct_model_unit_end(m, m->head_unit, CT_PASS_BACKWARD);
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
            layer_forward(m, l, a, out);
            m->recomputing = false;
            ct_tensor_free(out);
        }
        layer_backward(m, l, a, s);
        if (l == u->first_layer) ct_model_unit_end(m, m->layer_unit[l], CT_PASS_BACKWARD);
    }
    if (has_embed) {
        if (!has_head) ct_model_unit_begin(m, m->embed_unit, CT_PASS_BACKWARD);
        embed_backward(m, a, s);
        ct_model_unit_end(m, m->embed_unit, CT_PASS_BACKWARD);
    }
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
