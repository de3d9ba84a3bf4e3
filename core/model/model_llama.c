/*
 * model_llama.c — Llama's block (model.arch: llama; core/README.md, The model): RMSNorm, the QKV
 * projection with rotary positions, grouped-query attention, SwiGLU, no biases. model.c calls it
 * for each layer instead of GPT-2's and shares its helpers through model_layer.h.
 */
#include "model_layer.h"

#include "model_collectives.h"

/* Llama's gate and up projections as one (2F/tp, C) matrix (they are adjacent in the unit's
 * range, build_registry): one GEMM gives gate|up per row, the layout ct_swiglu_fwd reads. The
 * values, or with `grads` the gradients; free with ct_tensor_free. */
static ct_tensor *gate_up_weight(ct_model *m, int l, bool grads) {
    const ct_layer_params *p = &m->layers[l];
    const ct_unit *unit = &m->units[p->w_gate->unit];
    CT_ASSERT(p->w_up->offset == p->w_gate->offset + p->w_gate->numel);
    return ct_tensor_view_2d(grads ? unit->grads : unit->params, p->w_gate->offset,
                             2 * p->w_gate->local_shape[0], m->C);
}

/* Heads RoPE rotates in a packed qkv on this rank: its query and key heads. */
static int64_t rotated_heads(const ct_model *m) {
    return (m->NH + m->NKV) / m->layout.tp_size;
}

static void rope_run(ct_model *m, ct_tensor *x, int64_t B, int64_t n, int64_t pos, void *ctx) {
    ct_rope(x, m->rope_table, B, n, rotated_heads(m), m->hd, pos, *(const bool *)ctx);
}

void ct_model_rope(ct_model *m, ct_tensor *x, int64_t B, bool inverse) {
    ct_model_for_position_runs(m, x, B, m->T, 0, rope_run, &inverse);
}

/* Llama's block (pre-norm):
 *     ln1 = RMSNorm(x)        q|k|v = ln1·Wqkvᵀ, q and k rotated (RoPE)
 *     att = causal_attention(q, k, v)      mid = x + att·Woᵀ [reduce tp]
 *     ln2 = RMSNorm(mid)      gate|up = ln2·Wguᵀ,  g = silu(gate)·up
 *     out = mid + g·Wdownᵀ [reduce tp] */
void ct_model_llama_layer_forward(ct_model *m, int l, ct_acts *a, ct_tensor *out) {
    ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_tensor *x = a->residual[l];

    ct_model_norm_for_columns(m, la->ln1, la->ln1_mean, la->ln1_rstd, x, NULL, p->ln1_w, NULL);
    ct_tensor *wqkv, *bqkv;
    ct_model_qkv_params(m, l, false, &wqkv, &bqkv);
    ct_gemm(la->qkv, la->ln1, wqkv, false, true, 1.0f, 0.0f);
    ct_tensor_free(wqkv);
    ct_model_rope(m, la->qkv, a->B, false);
    ct_model_poll(m);
    ct_model_attention_fwd(m, la->att, la->lse, la->qkv, a->B);
    ct_model_poll(m);
    ct_model_row_parallel_out(m, la->mid, la->att, p->wo, NULL, NULL);
    /* mid = x + att·Woᵀ, the residual add fused into ln2 = RMSNorm(mid) */
    ct_model_norm_for_columns(m, la->ln2, la->ln2_mean, la->ln2_rstd, la->mid, x, p->ln2_w, NULL);
    if (p->moe_router) { /* SwiGLU experts (moe.c) */
        ct_model_moe_forward(m, l, a, out);
        return;
    }
    ct_tensor *wgu = gate_up_weight(m, l, false);
    ct_gemm(la->h, la->ln2, wgu, false, true, 1.0f, 0.0f);
    ct_tensor_free(wgu);
    ct_swiglu_fwd(la->g, la->h);
    ct_model_poll(m);
    ct_model_row_parallel_out(m, out, la->g, p->w_down, NULL, la->mid);
}

void ct_model_llama_layer_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s) {
    ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_tensor *x = a->residual[l];

    ct_tensor *dln2;
    if (p->moe_router) {
        dln2 = ct_model_moe_backward(m, l, a, s);
    } else {
        /* MLP: out = mid + g·Wdownᵀ, g = silu(gate)·up, gate|up = ln2·Wguᵀ */
        ct_model_row_parallel_backward(m, s, p->w_down, la->g, s->dh); /* dg (B,T,F/tp) */
        ct_model_poll(m);
        ct_swiglu_bwd(s->dgu, la->h, s->dh);
        ct_tensor *wgu = gate_up_weight(m, l, false), *dwgu = gate_up_weight(m, l, true);
        ct_gemm(s->dln, s->dgu, wgu, false, false, 1.0f, 0.0f);
        dln2 = ct_model_dln_reduced(m, s);
        ct_model_linear_bwd_params(s->dgu, la->ln2, dwgu, NULL);
        ct_tensor_free(wgu), ct_tensor_free(dwgu);
    }
    ct_model_norm_backward(s->dres, p->ln2_w, NULL, dln2, la->mid, NULL,
                           la->ln2_rstd); /* ∂L/∂mid */
    ct_model_poll(m);

    /* Attention: mid = x + att·Woᵀ */
    ct_model_row_parallel_backward(m, s, p->wo, la->att, s->datt);
    ct_model_attention_bwd(m, s->dqkv, NULL, s->datt, la->qkv, la->att, la->lse, a->B);
    /* the gradient of the rotated q and k, turned back: the rotation's transpose */
    ct_model_rope(m, s->dqkv, a->B, true);
    ct_model_poll(m);
    ct_tensor *wqkv, *bqkv, *dwqkv, *dbqkv;
    ct_model_qkv_params(m, l, false, &wqkv, &bqkv);
    ct_model_qkv_params(m, l, true, &dwqkv, &dbqkv);
    ct_gemm(s->dln, s->dqkv, wqkv, false, false, 1.0f, 0.0f);
    ct_tensor *dln1 = ct_model_dln_reduced(m, s);
    ct_model_linear_bwd_params(s->dqkv, la->ln1, dwqkv, NULL);
    ct_tensor_free(wqkv), ct_tensor_free(dwqkv);
    ct_model_norm_backward(s->dres, p->ln1_w, NULL, dln1, x, NULL, la->ln1_rstd); /* ∂L/∂x */
}
