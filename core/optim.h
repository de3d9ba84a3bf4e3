/*
 * optim.h — AdamW on flat ranges, the learning-rate schedule and gradient-norm clipping.
 *
 * The optimizer works on each FSDP unit's flat range (model.h) described by segments: one per
 * parameter, covering its real elements only (vocabulary padding rows are left out), each with
 * its weight decay (train.weight_decay for tensors with ≥ 2 dims, 0 for biases and norm
 * weights). Elements in no segment (unit padding) are never touched. Because it works on ranges
 * and segments, a ZeRO shard that cuts through tensors is just a shorter range.
 *
 * Schedule: linear warmup from lr/warmup to lr over warmup_steps, then cosine decay to min_lr at
 * the last step.
 */
#ifndef CT_OPTIM_H
#define CT_OPTIM_H

#include "model.h"

typedef struct ct_optimizer {
    ct_model *model;
    ct_train_config tc;
    ct_tensor *m_slab, *v_slab;   /* AdamW moments, same layout as the parameter slab */
    ct_tensor **unit_m, **unit_v; /* per-unit views */
    ct_adamw_segment **segments;  /* per unit */
    int *n_segments;
    ct_tensor *norm_partials;     /* (n_params) squared norms of each parameter's gradient */
    int64_t step;                 /* updates applied so far */
} ct_optimizer;

ct_status ct_optim_new(ct_optimizer **out, ct_model *model, const ct_train_config *tc);
void ct_optim_free(ct_optimizer *opt);

/* Learning rate for 0-based step `step` of a run of tc->steps. */
double ct_optim_lr(const ct_train_config *tc, int64_t step);

/* Sum of squared gradient elements over this rank's parameters, each tensor counted once
 * (a tied twin and tensor-parallel replicas on tp ranks > 0 are left out; padding is zero). */
double ct_optim_grad_sumsq_local(ct_optimizer *opt);

/* Clip factor for a global gradient norm: min(1, grad_clip / norm) (1 when clipping is off). */
float ct_optim_clip_scale(const ct_train_config *tc, double grad_norm);

/* One AdamW update of every unit with the given lr and gradient scale; increments opt->step. */
void ct_optim_step(ct_optimizer *opt, float lr, float grad_scale);

#endif /* CT_OPTIM_H */
