/*
 * model_gpt2.c — GPT-2 (model.arch: gpt2; core/README.md, The model): its entry of the
 * architecture table (model_arch.h): the tensors of a layer, the pre-LayerNorm block, the GELU
 * MLP with biases, the Hugging Face names. Forward of one layer, x = residual[l] (B,T,C):
 *     ln1 = LN(x)                          q|k|v = ln1·Wqkvᵀ + b   (column-parallel, one GEMM)
 *     att = causal_attention(q, k, v)      mid = x + (att·Woᵀ [allreduce tp]) + bo
 *     ln2 = LN(mid)                        h = ln2·Wupᵀ + bup,  g = GELU(h)
 *     residual[l+1] = mid + (g·Wdownᵀ [allreduce tp]) + bdown
 * Backward mirrors it; the tensor-parallel "copy" operators turn into allreduces of the norm
 * output gradients. With tp = 1 every tp collective is on a group of one and costs nothing.
 * A linear layer's forward, y = x·Wᵀ + b, starts y as b and lets the GEMM accumulate (beta = 1):
 * a BLAS GEMM with beta = 0 zeroes its output in a pass of its own, so this saves a pass over y
 * (ct_gemm_bias; the MLP's up-projection does the same inside ct_gemm_bias_gelu, or fuses bias
 * and GELU into the GEMM's epilogue).
 */
#include "model_layer.h"

#include <stddef.h>

#include "model_collectives.h"

#define FIELD(name) offsetof(ct_layer_params, name)

/* wq, wk, wv back to back, then bq, bk, bv: in the unit's flat range (and in each tp rank's slice
 * of it) they form one (q + 2 kv, C) matrix and one bias, which the fused QKV projection uses
 * (ct_model_qkv_params). */
static const ct_arch_tensor gpt2_layer[] = {
    {"ln1.weight", FIELD(ln1_w), 1, CT_DIM_MODEL, CT_DIM_ONE, -1, CT_INIT_ONES, false},
    {"ln1.bias", FIELD(ln1_b), 1, CT_DIM_MODEL, CT_DIM_ONE, -1, CT_INIT_ZEROS, false},
    {"attn.wq", FIELD(wq), 2, CT_DIM_Q, CT_DIM_MODEL, 0, CT_INIT_NORMAL, false},
    {"attn.wk", FIELD(wk), 2, CT_DIM_KV, CT_DIM_MODEL, 0, CT_INIT_NORMAL, false},
    {"attn.wv", FIELD(wv), 2, CT_DIM_KV, CT_DIM_MODEL, 0, CT_INIT_NORMAL, false},
    {"attn.bq", FIELD(bq), 1, CT_DIM_Q, CT_DIM_ONE, 0, CT_INIT_ZEROS, false},
    {"attn.bk", FIELD(bk), 1, CT_DIM_KV, CT_DIM_ONE, 0, CT_INIT_ZEROS, false},
    {"attn.bv", FIELD(bv), 1, CT_DIM_KV, CT_DIM_ONE, 0, CT_INIT_ZEROS, false},
    {"attn.wo", FIELD(wo), 2, CT_DIM_MODEL, CT_DIM_Q, 1, CT_INIT_NORMAL, true},
    {"attn.bo", FIELD(bo), 1, CT_DIM_MODEL, CT_DIM_ONE, -1, CT_INIT_ZEROS, false},
    {"ln2.weight", FIELD(ln2_w), 1, CT_DIM_MODEL, CT_DIM_ONE, -1, CT_INIT_ONES, false},
    {"ln2.bias", FIELD(ln2_b), 1, CT_DIM_MODEL, CT_DIM_ONE, -1, CT_INIT_ZEROS, false},
};

/* The MLP (dense, shared or routed expert): up with its bias, down with its bias. */
static const ct_arch_tensor gpt2_mlp[] = {
    {"w_up", FIELD(w_up), 2, CT_DIM_WIDTH, CT_DIM_MODEL, 0, CT_INIT_NORMAL, false},
    {"b_up", FIELD(b_up), 1, CT_DIM_WIDTH, CT_DIM_ONE, 0, CT_INIT_ZEROS, false},
    {"w_down", FIELD(w_down), 2, CT_DIM_MODEL, CT_DIM_WIDTH, 1, CT_INIT_NORMAL, true},
    {"b_down", FIELD(b_down), 1, CT_DIM_MODEL, CT_DIM_ONE, -1, CT_INIT_ZEROS, false},
};

static void gpt2_layer_forward(ct_model *m, int l, ct_acts *a, ct_tensor *out) {
    ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_model_norm_for_columns(m, la->ln1, la->ln1_mean, la->ln1_rstd, a->residual[l], NULL,
                              p->ln1_w, p->ln1_b);
    ct_tensor *wqkv, *bqkv;
    ct_model_qkv_params(m, l, false, &wqkv, &bqkv);
    ct_gemm_bias(la->qkv, la->ln1, wqkv, bqkv); /* qkv = ln1·Wqkvᵀ + bqkv, a linear forward */
    ct_tensor_free(wqkv), ct_tensor_free(bqkv);
    ct_model_attention_out_forward(m, l, a);
    p->mlp->forward(m, l, a, out);
}

static void gpt2_layer_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s) {
    ct_layer_acts *la = &a->layers[l];
    ct_model_mlp_out_backward(m, l, a, s);
    ct_tensor *dwqkv, *dbqkv; /* the attention's backward also gives the qkv bias's gradient */
    ct_model_qkv_params(m, l, true, &dwqkv, &dbqkv);
    ct_model_attention_bwd(m, s->dqkv, dbqkv, s->datt, la->qkv, la->att, la->lse, a->B);
    ct_tensor_free(dwqkv), ct_tensor_free(dbqkv);
    ct_model_poll(m);
    ct_model_qkv_backward(m, l, a, s);
}

/* The dense MLP: h = ln2·Wupᵀ + b_up, g = GELU(h) (fused into the GEMM where the backend can),
 * out = mid + g·Wdownᵀ [reduce tp] + b_down. */
static void gpt2_mlp_forward(ct_model *m, int l, ct_acts *a, ct_tensor *out) {
    const ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_gemm_bias_gelu(la->h, la->g, la->ln2, p->w_up->value, p->b_up->value);
    ct_model_poll(m);
    ct_model_row_parallel_out(m, out, la->g, p->w_down, p->b_down, la->mid);
}

static ct_tensor *gpt2_mlp_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s) {
    const ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_model_row_parallel_backward(m, s, p->w_down, la->g, s->dh); /* dg (B,T,F/tp) */
    ct_bias_grad(p->b_down->grad, s->dres);
    ct_model_poll(m);
    ct_gelu_bwd(s->dh, p->b_up->grad, la->h, s->dh); /* and b_up's gradient */
    ct_gemm(s->dln, s->dh, p->w_up->value, false, false, 1.0f, 0.0f);
    ct_tensor *dln2 = ct_model_dln_reduced(m, s);
    ct_model_linear_bwd_params(m, s->dh, la->ln2, p->w_up->grad, NULL);
    return dln2;
}

/* Hugging Face's GPT-2 (GPT2LMHeadModel): a Conv1D stores its weight (in, out), transposed. */
static const ct_arch_hf_tensor gpt2_hf_layer[] = {
    {"ln_1.weight", {"ln1.weight"}, false, false},
    {"ln_1.bias", {"ln1.bias"}, false, false},
    {"attn.c_attn.weight", {"attn.wq", "attn.wk", "attn.wv"}, true, false},
    {"attn.c_attn.bias", {"attn.bq", "attn.bk", "attn.bv"}, false, false},
    {"attn.c_proj.weight", {"attn.wo"}, true, false},
    {"attn.c_proj.bias", {"attn.bo"}, false, false},
    {"ln_2.weight", {"ln2.weight"}, false, false},
    {"ln_2.bias", {"ln2.bias"}, false, false},
    {"mlp.c_fc.weight", {"mlp.w_up"}, true, false},
    {"mlp.c_fc.bias", {"mlp.b_up"}, false, false},
    {"mlp.c_proj.weight", {"mlp.w_down"}, true, false},
    {"mlp.c_proj.bias", {"mlp.b_down"}, false, false},
};

const ct_model_arch ct_model_arch_gpt2 = {
    .layer_tensors = gpt2_layer,
    .n_layer_tensors = (int)CT_ARRAY_LEN(gpt2_layer),
    .mlp_tensors = gpt2_mlp,
    .n_mlp_tensors = (int)CT_ARRAY_LEN(gpt2_mlp),
    .learned_positions = true,
    .norm_bias = true,
    .linear_bias = true,
    .act = {.hidden = 1, .matmuls = 2, .fwd = ct_gelu_fwd, .bwd = ct_gelu_bwd},
    .setup = NULL,
    .layer_forward = gpt2_layer_forward,
    .layer_backward = gpt2_layer_backward,
    .dense_mlp = {.forward = gpt2_mlp_forward, .backward = gpt2_mlp_backward},
    .hf =
        {
            .state_prefix = "transformer.",
            .layer = "h.%lld.",
            .wte = "wte.weight",
            .wpe = "wpe.weight",
            .lnf_w = "ln_f.weight",
            .lnf_b = "ln_f.bias",
            .layer_tensors = gpt2_hf_layer,
            .n_layer_tensors = (int)CT_ARRAY_LEN(gpt2_hf_layer),
            .router = NULL, /* GPT-2 experts have no Hugging Face layout */
        },
};
