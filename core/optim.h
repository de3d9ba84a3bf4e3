/*
 * optim.h — AdamW on flat ranges, the learning-rate schedule and gradient-norm clipping.
 *
 * The optimizer works on one range of each FSDP unit's flat buffer (model.h): the whole unit
 * without ZeRO, this rank's 1/dp shard with ZeRO ≥ 1. Inside a range, segments describe the
 * real elements of each parameter (vocabulary padding rows are left out) with its weight decay
 * (train.weight_decay for tensors with ≥ 2 dims, 0 for biases and norm weights); elements in no
 * segment (unit padding) are never touched. Because a shard is just a shorter range, a ZeRO
 * shard that cuts through tensors needs nothing special.
 *
 * Schedule: linear warmup from lr/warmup to lr over warmup_steps, then cosine decay to min_lr at
 * the last step.
 */
#ifndef CT_OPTIM_H
#define CT_OPTIM_H

#include "model.h"

typedef struct ct_optim_unit {
    int64_t lo, n;              /* the range [lo, lo + n) of the unit this rank updates */
    ct_tensor *m, *v;           /* (n) AdamW moments */
    ct_adamw_segment *segments; /* offsets relative to lo */
    int n_segments;
} ct_optim_unit;

typedef struct ct_optimizer {
    ct_model *model;
    ct_train_config tc;
    ct_optim_unit *units;     /* [model->n_units] */
    ct_tensor *norm_partials; /* (n_params) squared norm of each parameter's part */
    int64_t step;             /* updates applied so far */
} ct_optimizer;

/*
 * Optimizer state for ranges [lo[u], lo[u] + n[u]) of each unit; lo = n = NULL means whole units.
 * The moments are allocated in the CT_MEM_OPTIM category (2·Σn floats).
 */
ct_status ct_optim_new(ct_optimizer **out, ct_model *model, const ct_train_config *tc,
                       const int64_t *lo, const int64_t *n);
void ct_optim_free(ct_optimizer *opt);

/* Learning rate for 0-based step `step` of a run of tc->steps. */
double ct_optim_lr(const ct_train_config *tc, int64_t step);

/*
 * Sum of squared gradients over this rank's ranges: grads[u] holds the gradients of unit u's
 * range (n[u] elements). Each tensor is counted once in the whole job: a tied twin and the
 * tensor-parallel replicas on tp ranks > 0 are left out; padding is zero. NULL grads means the
 * model's own unit gradient views (whole units).
 */
double ct_optim_grad_sumsq(ct_optimizer *opt, ct_tensor *const *grads);
/* Clip factor for a global gradient norm: min(1, grad_clip / norm) (1 when clipping is off). */
float ct_optim_clip_scale(const ct_train_config *tc, double grad_norm);

/* Increments the step counter; call once per optimizer step, before the unit updates. */
void ct_optim_begin_step(ct_optimizer *opt);
/* AdamW on unit u's range: params and grads are (n[u]) tensors of that range. */
void ct_optim_update_unit(ct_optimizer *opt, int u, ct_tensor *params, const ct_tensor *grads,
                          float lr, float grad_scale);
/* Whole-model step for whole-unit ranges on resident slabs (world size 1 and ZeRO-0). */
void ct_optim_step(ct_optimizer *opt, float lr, float grad_scale);

#endif /* CT_OPTIM_H */
