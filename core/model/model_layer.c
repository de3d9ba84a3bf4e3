/*
 * model_layer.c — what the model's blocks and the driver share (model_layer.h): the data-parallel
 * layer's brackets and poll, the fused projections' weights, the backward of linear layers and
 * norms, attention (the backend's, or the ring over a context-parallel group), the global
 * positions of this rank's rows, and the parts of a pre-norm block every architecture shares.
 */
#include "model_layer.h"

#include "model_collectives.h"
#include "ring_attention.h"

/* In a split backward's input part (m->wstore) a backward bracket is recorded for the weight
 * part and passed on as CT_PASS_BACKWARD_INPUT: the unit's gradients are not complete yet. */
void ct_model_unit_begin(ct_model *m, int unit, ct_pass pass) {
    if (m->wstore && pass == CT_PASS_BACKWARD) {
        ct_wgrad_bracket(m->wstore, unit, true);
        pass = CT_PASS_BACKWARD_INPUT;
    }
    if (m->hooks.unit_begin) m->hooks.unit_begin(m->hooks.ctx, unit, pass);
}

void ct_model_unit_end(ct_model *m, int unit, ct_pass pass) {
    if (m->wstore && pass == CT_PASS_BACKWARD) {
        ct_wgrad_bracket(m->wstore, unit, false);
        pass = CT_PASS_BACKWARD_INPUT;
    }
    if (m->hooks.unit_end) m->hooks.unit_end(m->hooks.ctx, unit, pass);
}

/* Lets outstanding communication progress (MPI progresses only inside MPI calls). */
void ct_model_poll(ct_model *m) {
    if (m->hooks.poll) m->hooks.poll(m->hooks.ctx);
}

/* Layer l's q, k and v projections as one: views of the (q + 2 kv, C) weight and (q + 2 kv) bias
 * that wq, wk, wv and bq, bk, bv form in the unit's range (registered back to back) — the values,
 * or with `grads` the gradients. One GEMM instead of three reads ln1 once and runs at the rate of
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

ct_tensor *ct_model_mlp_up_weight(const ct_model *m, const ct_layer_params *mlp, bool grads) {
    const int hidden = m->arch->act.hidden;
    const ct_param *w = *(ct_param *const *)((const char *)mlp + m->arch->mlp_tensors[0].field);
    for (int i = 1; i < hidden; i++) /* registered back to back: adjacent in the unit */
        CT_ASSERT(w[i].unit == w->unit && w[i].offset == w[i - 1].offset + w[i - 1].numel);
    const ct_unit *unit = &m->units[w->unit];
    return ct_tensor_view_2d(grads ? unit->grads : unit->params, w->offset,
                             hidden * w->local_shape[0], m->C);
}

/* Parameter gradients of y = x·Wᵀ + b: dW += dyᵀ·x, db += Σ dy. */
void ct_model_linear_bwd_params(ct_model *m, const ct_tensor *dy, const ct_tensor *x, ct_tensor *dw,
                                ct_tensor *db) {
    ct_model_weight_grad(m, dw, dy, x, true);
    if (db) ct_bias_grad(db, dy);
}

/* Backward of a row-parallel projection into the residual stream, y = x·Wᵀ: dx = dy·W and
 * dW += dyᵀ·x, with dy = ∂L/∂residual over the full sequence (gathered under sequence
 * parallelism). */
void ct_model_row_parallel_backward(ct_model *m, ct_grad_scratch *s, const ct_param *w,
                                    const ct_tensor *x, ct_tensor *dx) {
    const ct_tensor *dy = ct_model_dres_full(m, s);
    ct_gemm(dx, dy, w->value, false, false, 1.0f, 0.0f);
    ct_model_weight_grad(m, w->grad, dy, x, true);
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
    if (m->decode) return m->decode->pos + row;
    return l->cp_size > 1 ? ct_cp_position(l->cp_size, l->cp_rank, l->cp_zigzag, m->T, row) : row;
}

void ct_model_for_position_runs(ct_model *m, ct_tensor *x, int64_t B, int64_t rows, int64_t row0,
                                void (*fn)(ct_model *m, ct_tensor *rows, int64_t B, int64_t n,
                                           int64_t pos, void *ctx),
                                void *ctx) {
    if (m->layout.cp_size == 1) { /* one run: every sequence's rows at once */
        fn(m, x, B, rows, ct_model_position(m, row0), ctx);
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

void ct_model_attention_out_forward(ct_model *m, int l, ct_acts *a) {
    const ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_model_poll(m);
    if (m->decode) /* one position against the cache of the ones before it */
        ct_attention_decode(la->att, m->decode->kv[l], la->qkv, m->decode->pos,
                            m->NH / m->layout.tp_size, m->NKV / m->layout.tp_size);
    else
        ct_model_attention_fwd(m, la->att, la->lse, la->qkv, a->B);
    ct_model_poll(m);
    ct_model_row_parallel_out(m, la->mid, la->att, p->wo, p->bo, NULL);
    /* mid = x + (att·Woᵀ + bo), the residual add fused into ln2 = Norm(mid) */
    ct_model_norm_for_columns(m, la->ln2, la->ln2_mean, la->ln2_rstd, la->mid, a->residual[l],
                              p->ln2_w, p->ln2_b);
}

void ct_model_mlp_out_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s) {
    const ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_tensor *dln2 = p->mlp->backward(m, l, a, s);
    ct_model_norm_backward(s->dres, p->ln2_w, p->ln2_b, dln2, la->mid, la->ln2_mean,
                           la->ln2_rstd); /* dres += : now ∂L/∂mid */
    ct_model_poll(m);
    /* Attention: mid = x + att·Woᵀ (+ bo). A row-parallel bias takes its gradient from this
     * rank's positions: with sequence parallelism a partial sum, completed over the tp group by
     * the data-parallel layer. */
    ct_model_row_parallel_backward(m, s, p->wo, la->att, s->datt);
    if (p->bo) ct_bias_grad(p->bo->grad, s->dres);
}

void ct_model_qkv_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s) {
    const ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_tensor *wqkv, *bqkv, *dwqkv, *dbqkv;
    ct_model_qkv_params(m, l, false, &wqkv, &bqkv);
    ct_model_qkv_params(m, l, true, &dwqkv, &dbqkv);
    ct_gemm(s->dln, s->dqkv, wqkv, false, false, 1.0f, 0.0f);
    ct_tensor *dln1 = ct_model_dln_reduced(m, s);
    ct_model_linear_bwd_params(m, s->dqkv, la->ln1, dwqkv, NULL);
    ct_tensor_free(wqkv), ct_tensor_free(bqkv), ct_tensor_free(dwqkv), ct_tensor_free(dbqkv);
    ct_model_norm_backward(s->dres, p->ln1_w, p->ln1_b, dln1, a->residual[l], la->ln1_mean,
                           la->ln1_rstd); /* dres += : now ∂L/∂x */
}
