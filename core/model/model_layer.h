/*
 * model_layer.h — what the model's blocks and the driver share (internal to core/model/; defined
 * in model_layer.c): the data-parallel layer's brackets, the fused QKV and MLP up-projection
 * weights, linear and norm backward, attention (or ring attention over cp), the positions of this
 * rank's rows, and the parts of a pre-norm block every architecture shares. The blocks are
 * model_gpt2.c and model_llama.c (model_arch.h), the driver over chunks model.c, the MoE layer
 * moe.c.
 */
#ifndef CT_MODEL_LAYER_H
#define CT_MODEL_LAYER_H

#include "model_arch.h"

/* Decoding (model.h, ct_model_decode_begin): the row's position, each layer's key/value cache
 * (T_seq rows of this rank's 2·NKV/tp·hd; NULL for layers not on this rank), and the sizes and
 * layout decoding set aside. */
typedef struct ct_model_decode {
    int64_t pos;
    ct_tensor **kv;
    int64_t T, Tl;
    int cp_size;
    bool sequence_parallel;
} ct_model_decode;

/* The weight gradient dW += dyᵀ·x of a linear layer (_grouped: of n, as one grouped GEMM): run
 * now, or while a split backward's input part records (m->wstore, model_split.c) recorded with a
 * copy of dy, and of x unless x_kept says x is an activation of this microbatch that stays until
 * the weight part (never under recompute, whose internals are a shared workspace). */
void ct_model_weight_grad(ct_model *m, ct_tensor *dw, const ct_tensor *dy, const ct_tensor *x,
                          bool x_kept);
void ct_model_weight_grads_grouped(ct_model *m, int n, ct_tensor *const *dw,
                                   const ct_tensor *const *dy, const ct_tensor *const *x,
                                   bool x_kept);
/* The record of a split backward's input part (model_split.c): a store per chunk of a
 * microbatch's activations; a bracket of unit `unit` (begin or end); the replay that is the weight
 * part (ct_model_backward_weight), which empties the store and keeps its memory for the next. */
ct_wgrad_store *ct_wgrad_store_new(void);
void ct_wgrad_bracket(ct_wgrad_store *st, int unit, bool begin);
bool ct_wgrad_store_empty(const ct_wgrad_store *st);
size_t ct_wgrad_store_bytes(const ct_wgrad_store *st); /* held in its copies */
void ct_wgrad_replay(ct_model *m, ct_wgrad_store *st);
void ct_wgrad_store_free(ct_wgrad_store *st);

/* The data-parallel layer's brackets around a use of a unit (model.h, ct_model_hooks). */
void ct_model_unit_begin(ct_model *m, int unit, ct_pass pass);
void ct_model_unit_end(ct_model *m, int unit, ct_pass pass);
/* Lets outstanding communication progress between ops (the data-parallel layer's poll hook). */
void ct_model_poll(ct_model *m);
/* Layer l's q, k and v projections as one: views of the (q + 2 kv, C) weight and (q + 2 kv) bias
 * that wq, wk, wv and bq, bk, bv form in the unit's range (*b NULL without biases) — the values,
 * or with `grads` the gradients. Free with ct_tensor_free. */
void ct_model_qkv_params(ct_model *m, int l, bool grads, ct_tensor **w, ct_tensor **b);
/* The up projection of the MLP whose fields of `mlp` name its tensors (a layer's dense MLP or
 * shared experts, or one expert's) as one matrix: the architecture's first act.hidden MLP tensors
 * (model_arch.h), adjacent in their unit, (hidden·width/tp, C): GPT-2's w_up, Llama's gate|up —
 * the values, or with `grads` the gradients. Free with ct_tensor_free. */
ct_tensor *ct_model_mlp_up_weight(const ct_model *m, const ct_layer_params *mlp, bool grads);
/* Parameter gradients of y = x·Wᵀ + b: dW += dyᵀ·x (ct_model_weight_grad: x an activation of
 * this microbatch), db += Σ dy (db may be NULL; never deferred). */
void ct_model_linear_bwd_params(ct_model *m, const ct_tensor *dy, const ct_tensor *x, ct_tensor *dw,
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

/* The parts of a pre-norm block that are the same in every architecture (its block calls them
 * in this order, with its own QKV projection before and the MLP part after):
 *   attention_out_forward  from la->qkv (positions applied): causal attention into la->att,
 *                          mid = x + att·Woᵀ [reduce tp] (+ bo where the layer has one) and
 *                          ln2 = Norm(mid), the residual add fused into the norm (la->mid, la->ln2)
 *   mlp_out_backward       from s->dres = ∂L/∂residual[l+1]: the MLP part's backward, ln2's and
 *                          the output projection's (and bo's), leaving s->dres = ∂L/∂mid and
 *                          s->datt = ∂L/∂att for the attention's backward
 *   qkv_backward           from s->dqkv = ∂L/∂qkv (positions undone): the QKV projection's input
 *                          gradient (reduced over tp) and weight gradient, then ln1's backward:
 *                          s->dres = ∂L/∂residual[l] */
void ct_model_attention_out_forward(ct_model *m, int l, ct_acts *a);
void ct_model_mlp_out_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s);
void ct_model_qkv_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s);

/* The backend bytes one micro-batch of B sequences holds in this rank's MoE layers under
 * uniform routing (the experts' rows follow the routing; grown as needed, kept for reuse). */
size_t ct_model_moe_acts_bytes(const ct_model *m, int64_t B);
struct ct_moe_acts;
void ct_moe_acts_free(struct ct_moe_acts *ma); /* accepts NULL */

#endif /* CT_MODEL_LAYER_H */
