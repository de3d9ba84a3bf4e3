/*
 * model_layer.h — what the model's blocks share (internal to core/model/: model.c runs the
 * chunks and GPT-2's block, model_llama.c Llama's block).
 */
#ifndef CT_MODEL_LAYER_H
#define CT_MODEL_LAYER_H

#include "model.h"

/* The data-parallel layer's brackets around a use of a unit (model.h, ct_model_hooks). */
void ct_model_unit_begin(ct_model *m, int unit, ct_pass pass);
void ct_model_unit_end(ct_model *m, int unit, ct_pass pass);
/* Lets outstanding communication progress between ops (the data-parallel layer's poll hook). */
void ct_model_poll(ct_model *m);
/* Layer l's q, k and v projections as one: views of the (q + 2 kv, C) weight and (q + 2 kv) bias
 * that wq, wk, wv and bq, bk, bv form in the unit's range (*b NULL without biases) — the values,
 * or with `grads` the gradients. Free with ct_tensor_free. */
void ct_model_qkv_params(ct_model *m, int l, bool grads, ct_tensor **w, ct_tensor **b);
/* Parameter gradients of y = x·Wᵀ + b: dW += dyᵀ·x, db += Σ dy (db may be NULL). */
void ct_model_linear_bwd_params(const ct_tensor *dy, const ct_tensor *x, ct_tensor *dw,
                                ct_tensor *db);
/* Backward of a row-parallel projection into the residual stream, y = x·Wᵀ: dx = dy·W and
 * dW += dyᵀ·x, with dy = ∂L/∂residual over the full sequence (gathered under sequence
 * parallelism). */
void ct_model_row_parallel_backward(ct_model *m, ct_grad_scratch *s, const ct_param *w,
                                    const ct_tensor *x, ct_tensor *dx);
/* A norm's backward into dres (accumulating): LayerNorm with its bias b, or RMSNorm (b NULL). */
void ct_model_norm_backward(ct_tensor *dres, const ct_param *w, const ct_param *b,
                            const ct_tensor *dln, const ct_tensor *x, const ct_tensor *mean,
                            const ct_tensor *rstd);

/* Causal attention of a layer: the backend's op, or under context parallelism the ring over
 * the cp group (ring_attention.h); the same contract as ct_attention_fwd / _bwd on this rank's
 * m->T rows of each of B sequences. */
void ct_model_attention_fwd(ct_model *m, ct_tensor *out, ct_tensor *lse, const ct_tensor *qkv,
                            int64_t B);
void ct_model_attention_bwd(ct_model *m, ct_tensor *dqkv, ct_tensor *dbias, const ct_tensor *dout,
                            const ct_tensor *qkv, const ct_tensor *out, const ct_tensor *lse,
                            int64_t B);
/* The global position of this rank's local row `row` (0 ≤ row < m->T). */
int64_t ct_model_position(const ct_model *m, int64_t row);
/* Calls fn on the runs of rows [row0, row0 + rows) of every one of B sequences in x (B·rows rows)
 * whose global positions are consecutive, with the run's first position: one call for all of x
 * without context parallelism, else one per sequence and chunk (views of x). */
void ct_model_for_position_runs(ct_model *m, ct_tensor *x, int64_t B, int64_t rows, int64_t row0,
                                void (*fn)(ct_model *m, ct_tensor *rows, int64_t B, int64_t n,
                                           int64_t pos, void *ctx),
                                void *ctx);
/* RoPE on the rotated heads of x (B sequences of this rank's m->T rows, packed qkv) at their
 * global positions (inverse: the backward). */
void ct_model_rope(ct_model *m, ct_tensor *x, int64_t B, bool inverse);

/* Llama's layer l (model_llama.c): forward on residual[l] into `out`, and backward from
 * s->dres = ∂L/∂residual[l+1] to ∂L/∂residual[l]. */
void ct_model_llama_layer_forward(ct_model *m, int l, ct_acts *a, ct_tensor *out);
void ct_model_llama_layer_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s);

/* An MoE layer's MLP part (moe.c), after ln2: forward from la->ln2 and la->mid into `out`, and
 * backward from s->dres = ∂L/∂out, leaving ∂L/∂ln2 (reduced over tp) for the ln2 backward in
 * the returned tensor. */
void ct_model_moe_forward(ct_model *m, int l, ct_acts *a, ct_tensor *out);
ct_tensor *ct_model_moe_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s);
/* The backend bytes one micro-batch of B sequences holds in this rank's MoE layers under
 * uniform routing (the experts' rows follow the routing; grown as needed, kept for reuse). */
size_t ct_model_moe_acts_bytes(const ct_model *m, int64_t B);
struct ct_moe_acts;
void ct_moe_acts_free(struct ct_moe_acts *ma); /* accepts NULL */

#endif /* CT_MODEL_LAYER_H */
