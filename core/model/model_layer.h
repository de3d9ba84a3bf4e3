/*
 * model_layer.h — what the model's blocks share (internal to core/model/: model.c runs the
 * chunks and GPT-2's block, model_llama.c Llama's block).
 */
#ifndef CT_MODEL_LAYER_H
#define CT_MODEL_LAYER_H

#include "model.h"

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

/* Llama's layer l (model_llama.c): forward on residual[l] into `out`, and backward from
 * s->dres = ∂L/∂residual[l+1] to ∂L/∂residual[l]. */
void ct_model_llama_layer_forward(ct_model *m, int l, ct_acts *a, ct_tensor *out);
void ct_model_llama_layer_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s);

#endif /* CT_MODEL_LAYER_H */
