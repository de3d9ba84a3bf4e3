/*
 * train.h — the training loop: microbatches, loss, clipping, AdamW, evaluation, logging.
 *
 * One optimizer step uses train.global_batch sequences: samples [s·G, (s+1)·G) of the data
 * order (data.h); data-parallel rank r takes its G/dp contiguous share, split in order into
 * grad_accum microbatches of micro_batch sequences. Backward starts from
 * dloss = 1 / (tokens in the global batch), so the summed gradients are those of the mean loss
 * whatever the layout (DESIGN §5). A step whose loss or gradient norm is not finite is skipped
 * and logged; train.max_bad_steps consecutive ones abort the run.
 */
#ifndef CT_TRAIN_H
#define CT_TRAIN_H

#include "backend.h"
#include "config.h"

typedef struct ct_train_result {
    int64_t steps_done;
    double first_loss, last_loss, last_val_loss;
    int64_t skipped_steps;
    double *losses;        /* [steps_done] training loss per step (malloc'd; caller frees) */
    float *final_params;   /* host copy of the parameter slab at the end (malloc'd) */
    int64_t n_final_params;
} ct_train_result;

void ct_train_result_release(ct_train_result *result);

/* Trains per cfg (validated) on one process; prints progress on stdout. */
ct_status ct_train_run(const ct_config *cfg, ct_backend *be, ct_train_result *result);

/* Measures the backend's fp32 GEMM rate (FLOP/s) at shape M×N×K: the median of a few runs. */
double ct_measure_gemm_flops(ct_backend *be, int64_t M, int64_t N, int64_t K, int reps);

/*
 * The backend's GEMM rate at the model's own shapes: every linear layer's forward (x·Wᵀ),
 * input-gradient (dy·W) and weight-gradient (dyᵀ·x) GEMM for a microbatch of B sequences, each
 * timed (median of `reps`) and weighted by how often a step runs it. Returns FLOP/s; this is
 * the MFU denominator of scripts/bench_cpu.sh.
 */
double ct_measure_model_gemm_flops(const ct_config *cfg, ct_backend *be, int reps);

#endif /* CT_TRAIN_H */
