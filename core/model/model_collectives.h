/*
 * model_collectives.h — the model's tensor- and sequence-parallel collectives
 * (model_collectives.c), for model.c only; callers outside the model use model.h. Every function
 * runs the same collectives on every rank of the tp group, in the same order.
 */
#ifndef CT_MODEL_COLLECTIVES_H
#define CT_MODEL_COLLECTIVES_H

#include "model.h"

/* Sum (or max) over the tensor-parallel group in place (no-op for tp = 1). */
void ct_model_tp_allreduce(ct_model *m, ct_tensor *t, ct_reduce_op op);

/* A (B, T, C) or (B, T/tp, C) view of one of the sequence-parallel workspaces (m->sp_local,
 * sp_full); free with ct_tensor_free. */
ct_tensor *ct_model_sp_view(ct_tensor *slab, int64_t B, int64_t T, int64_t C);
/* slice (B,T/tp,C) = this rank's positions of the tp-group sum of full (B,T,C). */
void ct_model_seq_reduce_scatter(ct_model *m, ct_tensor *slice, const ct_tensor *full);
/* The sequence-parallel workspaces for microbatches of B sequences (grown, never shrunk; nothing
 * without sequence parallelism). CT_ERR_RUNTIME when out of memory. */
ct_status ct_model_sp_reserve(ct_model *m, int64_t B);

/* The "copy" entering a column-parallel block: out_full = LN(x) (RMSNorm when b is NULL: Llama),
 * gathered to the full sequence under sequence parallelism (x is then this rank's slice). With a
 * residual (not NULL), x += residual first, fused into the norm: the residual connection around
 * the block before (see ct_model_row_parallel_out). */
void ct_model_norm_for_columns(ct_model *m, ct_tensor *out_full, ct_tensor *mean, ct_tensor *rstd,
                               ct_tensor *x, const ct_tensor *residual, const ct_param *w,
                               const ct_param *b);
/* The "reduce" leaving a row-parallel block: out (B,Tl,C) = Σ_tp x·Wᵀ + bias (the bias added
 * once, after the reduction; b NULL: none), rounded to out's dtype, then the residual connection
 * around the block, out += residual, unless residual is NULL: then the caller adds it, fused
 * into the norm that reads out (ct_model_norm_for_columns). */
void ct_model_row_parallel_out(ct_model *m, ct_tensor *out, const ct_tensor *x, const ct_param *w,
                               const ct_param *b, const ct_tensor *residual);
/* Backward: ∂L/∂(residual) over the full sequence (s->dres, or gathered into s->dfull). */
ct_tensor *ct_model_dres_full(ct_model *m, ct_grad_scratch *s);
/* Backward: s->dln summed over the tp group (in place, or reduce-scattered into s->dln_local);
 * returns the norm's dout. */
ct_tensor *ct_model_dln_reduced(ct_model *m, ct_grad_scratch *s);

#endif /* CT_MODEL_COLLECTIVES_H */
