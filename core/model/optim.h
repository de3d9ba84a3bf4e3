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

/*
 * Bytes per parameter element of each piece of training state, by precision — written down here
 * once; memory accounting, the ZeRO formulas (data_parallel.h), `cooktrain plan` and
 * core/README.md (Precision) all follow it:
 *
 *   train.precision   params   grads   master   optim (m + v)   total
 *   fp32                 4        4       0          8            16
 *   bf16                 2        4       4          8            18
 *
 * Gradients stay fp32 in bf16 mode (they accumulate across microbatches); the data-parallel
 * reduction moves them as parallel.grad_reduce_dtype (`reduce`: 4, or 2 for bf16). ZeRO-3
 * gathers and the ZeRO-1/2 parameter allgather move parameters (`params` bytes).
 */
typedef struct ct_state_bytes {
    size_t params, grads, master, optim, reduce;
} ct_state_bytes;

ct_state_bytes ct_state_bytes_of(ct_dtype param_dtype, ct_dtype reduce_dtype);

typedef struct ct_optim_unit {
    int64_t lo, n;              /* the range [lo, lo + n) of the unit this rank updates */
    ct_tensor *m, *v;           /* (n) AdamW moments */
    ct_tensor *master;          /* (n) fp32 master weights when the model's parameters are bf16,
                                   else NULL (AdamW updates the fp32 parameters themselves) */
    ct_adamw_segment *segments; /* offsets relative to lo */
    int n_segments;
} ct_optim_unit;

typedef struct ct_optimizer {
    ct_model *model;
    ct_train_config tc;
    ct_optim_unit *units;     /* [model->n_units] */
    ct_tensor *norm_partials; /* (n_params) squared norm of each parameter's part */
    ct_tensor *master_slab;   /* every unit's master range, CT_MEM_MASTER; NULL in fp32 mode */
    int64_t step;             /* updates applied so far */
} ct_optimizer;

/*
 * Optimizer state for ranges [lo[u], lo[u] + n[u]) of each unit; lo = n = NULL means whole units.
 * The moments are allocated in the CT_MEM_OPTIM category (2·Σn floats). When the model's
 * parameters are bf16 the optimizer also keeps fp32 master weights of its ranges (CT_MEM_MASTER,
 * Σn floats), initialised from the exact fp32 initial values (not from the rounded parameters);
 * every update then writes the rounded master weights into the bf16 parameters.
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
 * model's own unit gradient views (whole units); a NULL grads[u] leaves unit u out.
 */
double ct_optim_grad_sumsq(ct_optimizer *opt, ct_tensor *const *grads);
/* Clip factor for a global gradient norm: min(1, grad_clip / norm) (1 when clipping is off). */
float ct_optim_clip_scale(const ct_train_config *tc, double grad_norm);

/* Increments the step counter; call once per optimizer step, before the unit updates. */
void ct_optim_begin_step(ct_optimizer *opt);
/* AdamW on unit u's range: params (model dtype) and grads (f32) are (n[u]) tensors of that
 * range. */
void ct_optim_update_unit(ct_optimizer *opt, int u, ct_tensor *params, const ct_tensor *grads,
                          float lr, float grad_scale);
/* Whole-model step for whole-unit ranges on resident slabs (world size 1 and ZeRO-0). */
void ct_optim_step(ct_optimizer *opt, float lr, float grad_scale);

#endif /* CT_OPTIM_H */
