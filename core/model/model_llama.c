/*
 * model_llama.c — Llama (model.arch: llama; core/README.md, The model): its entry of the
 * architecture table (model_arch.h): the tensors of a layer, RoPE's table, the block (RMSNorm,
 * the QKV projection with rotary positions, grouped-query attention), the SwiGLU MLP, no biases,
 * the Hugging Face names (Mixtral's for MoE layers).
 */
#include "model_layer.h"

#include <stddef.h>
#include <stdlib.h>

#include "model_collectives.h"
#include "rope.h"

#define FIELD(name) offsetof(ct_layer_params, name)

/* No biases; wq, wk, wv back to back (one (q + 2 kv, C) matrix, ct_model_qkv_params). */
static const ct_arch_tensor llama_layer[] = {
    {"ln1.weight", FIELD(ln1_w), 1, CT_DIM_MODEL, CT_DIM_ONE, -1, CT_INIT_ONES, false},
    {"attn.wq", FIELD(wq), 2, CT_DIM_Q, CT_DIM_MODEL, 0, CT_INIT_NORMAL, false},
    {"attn.wk", FIELD(wk), 2, CT_DIM_KV, CT_DIM_MODEL, 0, CT_INIT_NORMAL, false},
    {"attn.wv", FIELD(wv), 2, CT_DIM_KV, CT_DIM_MODEL, 0, CT_INIT_NORMAL, false},
    {"attn.wo", FIELD(wo), 2, CT_DIM_MODEL, CT_DIM_Q, 1, CT_INIT_NORMAL, true},
    {"ln2.weight", FIELD(ln2_w), 1, CT_DIM_MODEL, CT_DIM_ONE, -1, CT_INIT_ONES, false},
};

/* The MLP (dense, shared or routed expert): w_gate and w_up back to back (one (2·width, C)
 * matrix, ct_model_mlp_up_weight), then w_down. */
static const ct_arch_tensor llama_mlp[] = {
    {"w_gate", FIELD(w_gate), 2, CT_DIM_WIDTH, CT_DIM_MODEL, 0, CT_INIT_NORMAL, false},
    {"w_up", FIELD(w_up), 2, CT_DIM_WIDTH, CT_DIM_MODEL, 0, CT_INIT_NORMAL, false},
    {"w_down", FIELD(w_down), 2, CT_DIM_MODEL, CT_DIM_WIDTH, 1, CT_INIT_NORMAL, true},
};

/* RoPE's angles, once, in double on the host: every backend reads these bytes. */
static ct_status llama_setup(ct_model *m, const ct_config *cfg) {
    if (m->layout.measure_only) return CT_OK; /* never runs: rope() is never called */
    int64_t n = m->T_seq * m->hd;
    m->rope_table = ct_tensor_new_1d(m->be, CT_DTYPE_F32, n, CT_MEM_WORKSPACE);
    if (!m->rope_table) return CT_ERR_RUNTIME;
    float *host = ct_xmalloc((size_t)n * sizeof *host);
    const ct_model_config *mc = &cfg->model;
    const ct_rope_scaling scaling = {mc->rope_scaling_factor, mc->rope_low_freq_factor,
                                     mc->rope_high_freq_factor, mc->rope_original_max_pos};
    ct_rope_table(host, m->T_seq, m->hd, mc->rope_theta, &scaling); /* factor 0: unscaled */
    ct_tensor_from_host(m->rope_table, host);
    free(host);
    return CT_OK;
}

/* Heads RoPE rotates in a packed qkv on this rank: its query and key heads. */
static int64_t rotated_heads(const ct_model *m) {
    return (m->NH + m->NKV) / m->layout.tp_size;
}

static void rope_run(ct_model *m, ct_tensor *x, int64_t B, int64_t n, int64_t pos, void *ctx) {
    ct_rope(x, m->rope_table, B, n, rotated_heads(m), m->hd, pos, *(const bool *)ctx);
}

/* RoPE on the rotated heads of x (B sequences of this rank's m->T rows, packed qkv) at their
 * global positions (inverse: the backward). */
static void rope(ct_model *m, ct_tensor *x, int64_t B, bool inverse) {
    CT_ASSERTF(m->rope_table, "a measure-only model (layout.measure_only) does not run");
    ct_model_for_position_runs(m, x, B, m->T, 0, rope_run, &inverse);
}

/* Llama's block (pre-norm):
 *     ln1 = RMSNorm(x)        q|k|v = ln1·Wqkvᵀ, q and k rotated (RoPE)
 *     att = causal_attention(q, k, v)      mid = x + att·Woᵀ [reduce tp]
 *     ln2 = RMSNorm(mid)      gate|up = ln2·Wguᵀ,  g = silu(gate)·up
 *     out = mid + g·Wdownᵀ [reduce tp] */
static void llama_layer_forward(ct_model *m, int l, ct_acts *a, ct_tensor *out) {
    ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_model_norm_for_columns(m, la->ln1, la->ln1_mean, la->ln1_rstd, a->residual[l], NULL,
                              p->ln1_w, NULL);
    ct_tensor *wqkv, *bqkv;
    ct_model_qkv_params(m, l, false, &wqkv, &bqkv);
    ct_gemm(la->qkv, la->ln1, wqkv, false, true, 1.0f, 0.0f);
    ct_tensor_free(wqkv);
    rope(m, la->qkv, a->B, false);
    ct_model_attention_out_forward(m, l, a);
    p->mlp->forward(m, l, a, out);
}

static void llama_layer_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s) {
    ct_layer_acts *la = &a->layers[l];
    ct_model_mlp_out_backward(m, l, a, s);
    ct_model_attention_bwd(m, s->dqkv, NULL, s->datt, la->qkv, la->att, la->lse, a->B);
    /* the gradient of the rotated q and k, turned back: the rotation's transpose */
    rope(m, s->dqkv, a->B, true);
    ct_model_poll(m);
    ct_model_qkv_backward(m, l, a, s);
}

/* The dense MLP: gate|up = ln2·Wguᵀ (one GEMM), g = silu(gate)·up, out = mid + g·Wdownᵀ
 * [reduce tp]. */
static void llama_mlp_forward(ct_model *m, int l, ct_acts *a, ct_tensor *out) {
    const ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_tensor *wgu = ct_model_mlp_up_weight(m, p, false);
    ct_gemm(la->h, la->ln2, wgu, false, true, 1.0f, 0.0f);
    ct_tensor_free(wgu);
    ct_swiglu_fwd(la->g, la->h);
    ct_model_poll(m);
    ct_model_row_parallel_out(m, out, la->g, p->w_down, NULL, la->mid);
}

static ct_tensor *llama_mlp_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s) {
    const ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_model_row_parallel_backward(m, s, p->w_down, la->g, s->dh); /* dg (B,T,F/tp) */
    ct_model_poll(m);
    ct_swiglu_bwd(s->dgu, la->h, s->dh);
    ct_tensor *wgu = ct_model_mlp_up_weight(m, p, false),
              *dwgu = ct_model_mlp_up_weight(m, p, true);
    ct_gemm(s->dln, s->dgu, wgu, false, false, 1.0f, 0.0f);
    ct_tensor *dln2 = ct_model_dln_reduced(m, s);
    ct_model_linear_bwd_params(m, s->dgu, la->ln2, dwgu, NULL);
    ct_tensor_free(wgu), ct_tensor_free(dwgu);
    return dln2;
}

/* SwiGLU's backward in the table's form: an MLP without biases has no db_up. */
static void swiglu_bwd(ct_tensor *dh, ct_tensor *db_up, const ct_tensor *h, const ct_tensor *dg) {
    CT_ASSERT(db_up == NULL);
    ct_swiglu_bwd(dh, h, dg);
}

/* Hugging Face's Llama (nn.Linear: (out, in), as ours: nothing transposed). */
static const ct_arch_hf_tensor llama_hf_layer[] = {
    {"input_layernorm.weight", {"ln1.weight"}, false, false},
    {"self_attn.q_proj.weight", {"attn.wq"}, false, true},
    {"self_attn.k_proj.weight", {"attn.wk"}, false, true},
    {"self_attn.v_proj.weight", {"attn.wv"}, false, false},
    {"self_attn.o_proj.weight", {"attn.wo"}, false, false},
    {"post_attention_layernorm.weight", {"ln2.weight"}, false, false},
    {"mlp.gate_proj.weight", {"mlp.w_gate"}, false, false},
    {"mlp.up_proj.weight", {"mlp.w_up"}, false, false},
    {"mlp.down_proj.weight", {"mlp.w_down"}, false, false},
};

/* Mixtral's sparse MLP (block_sparse_moe): per expert SwiGLU's w1 (gate), w3 (up) and w2 (down). */
static const ct_arch_hf_tensor mixtral_expert[] = {
    {"w1.weight", {"w_gate"}, false, false},
    {"w2.weight", {"w_down"}, false, false},
    {"w3.weight", {"w_up"}, false, false},
};

const ct_model_arch ct_model_arch_llama = {
    .layer_tensors = llama_layer,
    .n_layer_tensors = (int)CT_ARRAY_LEN(llama_layer),
    .mlp_tensors = llama_mlp,
    .n_mlp_tensors = (int)CT_ARRAY_LEN(llama_mlp),
    .learned_positions = false, /* rotary positions: no table to learn */
    .norm_bias = false,
    .linear_bias = false,
    .act = {.hidden = 2, .matmuls = 3, .fwd = ct_swiglu_fwd, .bwd = swiglu_bwd},
    .setup = llama_setup,
    .layer_forward = llama_layer_forward,
    .layer_backward = llama_layer_backward,
    .dense_mlp = {.forward = llama_mlp_forward, .backward = llama_mlp_backward},
    .hf =
        {
            .state_prefix = NULL,
            .layer = "model.layers.%lld.",
            .wte = "model.embed_tokens.weight",
            .wpe = NULL,
            .lnf_w = "model.norm.weight",
            .lnf_b = NULL,
            .layer_tensors = llama_hf_layer,
            .n_layer_tensors = (int)CT_ARRAY_LEN(llama_hf_layer),
            .router = "block_sparse_moe.gate.weight",
            .expert = "block_sparse_moe.experts.%lld.",
            .expert_tensors = mixtral_expert,
            .n_expert_tensors = (int)CT_ARRAY_LEN(mixtral_expert),
        },
};
