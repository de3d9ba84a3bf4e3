/*
 * trainer_internal.h — the training run's state, shared by the loop (trainer.c) and its report
 * (report.c); not for use elsewhere. The public interface is trainer.h.
 */
#ifndef CT_PARALLEL_TRAINER_INTERNAL_H
#define CT_PARALLEL_TRAINER_INTERNAL_H

#include "cmd/train/trainer.h"

#include "core/data/data.h"
#include "core/metrics.h"
#include "core/data/tokenizer.h"
#include "parallel/checkpoint_io.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"

/* Everything one training run holds. */
/* How many times a run measures its MFU and GEMM-efficiency denominators again. */
enum { CT_REMEASURE_MAX = 3 };

typedef struct trainer {
    const ct_config *cfg;
    ct_backend *be;
    ct_pctx *pctx;
    bool own_pctx, rank0;
    ct_model *model;
    ct_dp *dp;
    ct_pipeline *pipeline; /* pp > 1: runs the schedule; else microbatches run in a loop */
    ct_acts *acts;
    ct_grad_scratch *scratch;
    ct_dataset *train_data, *val_data;
    /* This rank's sequences of the step (or evaluation batch), read and checked before the step
     * starts: grad_accum microbatches of (micro_batch·T) tokens and targets. */
    int32_t *step_inputs, *step_targets;
    ct_metrics *metrics;     /* world rank 0 only; a failed write is agreed at the next step */
    ct_tokenizer *tokenizer; /* loaded at start when a sample is asked for */
    int dp_rank, dp_size;
    int replicas;        /* ranks holding the same parameters: dp · cp (the dpcp group) */
    int64_t T_local;     /* positions of a sequence on this rank: seq_len / cp */
    int32_t *cp_scratch; /* cp > 1: one step's tokens while they are cut to this rank's chunks */

    /* The run's constants, fixed by start_run. */
    int64_t accum;             /* microbatches per step on this rank */
    double tokens_per_step;    /* G·T */
    float dloss;               /* 1 / tokens_per_step: where backward starts */
    double flops_per_token;    /* this rank's share (1/world) of the model's */
    double hw_peak, gemm_rate; /* FLOP/s: the MFU and GEMM-efficiency denominators */
    int remeasured;            /* times a step outran them and they were measured again (at
                                  most CT_REMEASURE_MAX; then a figure above 100% is not shown) */
    bool said_unmeasurable;    /* the progress lines' note on that was printed */
    char peak_how[128];        /* how hw_peak was found */
    double dp_bytes_expected, tp_bytes_expected, cp_bytes_expected; /* per step, by formula */
    ct_comm *groups[9]; /* every group, for the profile's communication time */
    /* log.trace with MoE: each step's end time and tokens per expert (summed over the MoE layers
     * and every rank), [step][1 + E] */
    double *moe_trace;
    double *moe_load; /* model.moe_experts: the last step's tokens per expert (step_stats) */
    /* log.trace's clock (write_trace): ct_now + trace_skew is this rank's clock (the skew is 0
     * but under COOKTRAIN_TRACE_SKEW_S, which plays hosts whose clocks disagree); trace_origin is
     * that clock's reading when the world barrier at start ended, every rank's time 0. Each
     * step's span [begin, end) in step_spans (begin: after the step's first world allreduce). */
    double trace_skew, trace_origin, step_began;
    double *step_spans;

    /* Stragglers (every rank): this interval's seconds outside communication and waiting in it,
     * summed over steps; the groups' wait at the step's start. At each progress step they are
     * gathered (ct_report_stragglers): rank_compute and rank_wait hold every rank's means a step,
     * slow_in_a_row how many progress lines in a row each rank was slow, straggler the one named
     * (-1: none) with its compute over the median (rank 0's). */
    double strag_compute, strag_wait, comm_at_step;
    int64_t strag_steps;
    double *rank_compute, *rank_wait;
    int64_t *slow_in_a_row;
    int straggler;
    double straggler_ratio, straggler_median;
    bool stragglers_fresh; /* this step gathered them: its metrics line carries them */

    /* Progress since the last log line (rank 0 prints it). */
    double run_start, interval_start, interval_tokens, interval_exposed, interval_bubble;
    double profile_start;
    int64_t bad_in_a_row; /* consecutive non-finite steps */
    int32_t stop_signal;  /* agreed at the last step boundary: a rank saw SIGTERM / SIGUSR1 */
    int64_t first_step;   /* 0, or the step a checkpoint resumed from */
    char resumed_from[CT_PATH_MAX + 32]; /* that checkpoint's step directory; "" when fresh */
    ct_ckpt_local_info local_restore;    /* the local step gathered at the start (step -1: none) */
    ct_ckpt_saver *pending;              /* a checkpoint save begun and not yet ended */
    ct_ckpt_local_saver *local;          /* a local checkpoint begun and not yet ended */
    int64_t local_step, local_saved;     /* its step; local saves ended */
    bool local_written;   /* agreed at the last step boundary: every rank's local files written */
    double local_stall_s; /* training's wait for local saves since the last metrics line */
    int64_t last_logged_step; /* rank 0: the metrics file's last training step at start */
    bool pending_written;     /* agreed at the last step boundary: every rank's file is written */
    int64_t pending_step;
    bool stopped; /* ended early (signal or train.stop_after) */
    /* train.cuda_graph (graph_step): the step's tokens and targets on the device, and the graph
     * of the step's forward and backward, captured at the run's second step and again after a
     * device free (graph_ops operations; graph_captures so far) */
    ct_tensor *graph_inputs, *graph_targets;
    ct_backend_graph *graph;
    int64_t graph_ops, graph_captures;
    ct_train_result res;
} trainer;

/* What one optimizer step did, as the metrics and the log line report it. */
typedef struct step_stats {
    int64_t step; /* 0-based */
    double loss, grad_norm, lr;
    bool finite; /* false: the step was skipped */
    bool stop;   /* not run: a stop was agreed on at its start */
    double seconds, exposed, bubble;
    uint64_t dp_bytes, tp_bytes, cp_bytes; /* sent by this rank, ring model */
    uint64_t ep_bytes;   /* MoE dispatch and combine: rows sent to other ranks, and the counts */
    double cp_wait;      /* seconds this rank waited in the ring's sends and receives (cp group) */
    int64_t host_copies; /* copies from the backend to the host during the step */
    /* log.device_idle: the stream's seconds in ops and between them during the step */
    double device_busy, device_idle;
    /* Mixture of Experts (model.moe_experts > 0): the balancing loss (summed over MoE layers,
     * averaged over micro-batches; part of the objective, not of `loss`) and the tokens each
     * expert received in the step, summed over layers: least, mean and most */
    double moe_aux, moe_z, moe_load_min, moe_load_mean, moe_load_max; /* moe_z: the z-loss */
    const double *moe_load; /* every expert's (model.moe_experts of them; the trainer's buffer) */
    /* the largest of any MoE layer's most loaded expert's tokens over the layer's mean */
    double moe_layer_imbalance;
    /* this rank's seconds in MoE routing and exchange, and in expert GEMMs with their FLOPs */
    double moe_route_s, moe_expert_s, moe_expert_flops;
} step_stats;

/* report.c: rank 0's start-up report, from the constants start_run fixed. */
void ct_report_start(const trainer *t);
/* report.c: the first metrics line (the run's shape, rates, memory next to the ZeRO formula). */
/* The first metrics line of a run segment (a start or a resume: a metrics file is appended to,
 * never truncated): its first step, the checkpoint it resumed from, its shape, the measured rates,
 * memory by category after setup. */
void ct_report_setup_metrics(trainer *t);
/* report.c: the line that says the rates were measured again before step `step` (1-based), with
 * the new ones: that step's line and the later ones use them. */
void ct_report_remeasured_metrics(trainer *t, int64_t step);
/* report.c: one step's metrics line. */
void ct_report_step_metrics(trainer *t, const step_stats *s);
/* report.c: rank 0's progress line every log.interval steps (and the first and last), with the
 * profile when log.profile asks for it; restarts the interval's clocks. */
void ct_report_progress(trainer *t, const step_stats *s);
/* log.profile with pp > 1, on every rank at each progress step: the pipeline's measured cost of
 * each chunk's forward, input and weight parts, gathered, and rank 0 prints them with the
 * simulator's idle per rank for those costs. */
void ct_report_pipeline_costs(trainer *t, int64_t step);
/* Every rank after each step: adds the step's time outside communication and its waits to the
 * interval; at each progress step gathers every rank's means a step over the world, and rank 0
 * names a straggler (log.straggler_pct, log.straggler_intervals) for the metrics line and the
 * progress line that follow. */
void ct_report_stragglers(trainer *t, const step_stats *s);
/* The seconds every group (each once) spent waiting so far. */
double ct_report_comm_seconds(const trainer *t);

#endif /* CT_PARALLEL_TRAINER_INTERNAL_H */
