/*
 * trainer.h — the training loop: microbatches, loss, clipping, AdamW, evaluation, logging.
 *
 * One optimizer step uses train.global_batch sequences: samples [s·G, (s+1)·G) of the data
 * order (data.h); data-parallel rank r takes its G/dp contiguous share, split in order into
 * grad_accum microbatches of micro_batch sequences. Backward starts from
 * dloss = 1 / (tokens in the global batch), so the summed gradients are those of the mean loss
 * whatever the layout (core/README.md, Determinism). A step whose loss or gradient norm is not
 * finite is skipped and logged; train.max_bad_steps consecutive ones abort the run.
 */
#ifndef CT_PARALLEL_TRAINER_H
#define CT_PARALLEL_TRAINER_H

#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/model/model.h"
#include "parallel/context.h"

/* Where one parameter tensor lies in ct_train_result's flat copies. */
typedef struct ct_param_span {
    char name[64];
    int64_t offset, numel; /* elements */
} ct_param_span;

typedef struct ct_train_result {
    int64_t steps_done;
    double first_loss, last_loss, last_val_loss;
    int64_t skipped_steps;
    double *losses;     /* [steps_done] training loss per step (malloc'd; caller frees) */
    double *grad_norms; /* [steps_done] gradient norm per step (malloc'd) */
    /* With ct_train_options.keep_params, on world rank 0: the parameters before the first and
     * after the last step as global tensors in the world-size-1 order (param_stream.h), and
     * where each tensor lies in them (malloc'd). */
    float *init_params, *final_params;
    int64_t n_params;
    ct_param_span *spans;
    int n_spans;
} ct_train_result;

void ct_train_result_release(ct_train_result *result);

/* What a run writes besides training (all optional; a zeroed struct asks for nothing). */
typedef struct ct_train_options {
    const char *dump_params;      /* the final parameters as a dump (param_stream.h format) */
    const char *dump_init_params; /* the parameters before the first step, the same way */
    bool keep_params;             /* fill result->init_params / final_params (tests) */
} ct_train_options;

/*
 * Trains per cfg (validated for pctx's world size) on this rank; rank 0 prints progress on
 * stdout. pctx NULL means one process without MPI. Failures seen by some ranks only are agreed
 * on, so every rank returns the same status. opts may be NULL; result may be NULL.
 */
ct_status ct_train_run(const ct_config *cfg, ct_backend *be, ct_pctx *pctx,
                       const ct_train_options *opts, ct_train_result *result);

#endif /* CT_PARALLEL_TRAINER_H */
