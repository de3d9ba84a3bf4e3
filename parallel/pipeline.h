/*
 * pipeline.h — the executor that runs a schedule's action list on this pipeline rank
 * (parallel/README.md, Pipeline parallel; the lists come from schedule.h).
 *
 * Each microbatch in flight has its own activation context (ct_acts), taken from a pool on its
 * first forward here and given back once its last backward here is done, so memory follows the
 * schedule's in-flight count. The pool holds exactly the simulator's peak for this rank and is
 * allocated when the executor is made (out of memory is a start-up error, not a mid-step one).
 * The forward-only schedule (evaluation, sampling) reuses the pool: a context goes back once
 * its forwards here are done and the sends that read it have completed.
 * Activations travel as the residual stream at chunk boundaries, (B, T, C) — (B, T/tp, C) with
 * sequence parallelism — point to point on the pp group with non-blocking sends; a receive waits,
 * polling, and that waiting is the measured bubble. Between actions the executor polls the
 * data-parallel group so gradient reductions progress during the schedule.
 */
#ifndef CT_PARALLEL_PIPELINE_H
#define CT_PARALLEL_PIPELINE_H

#include "core/model/model.h"
#include "parallel/context.h"
#include "parallel/data_parallel.h"
#include "parallel/schedule.h"

/* Supplies microbatch mb's token ids and targets (B·T each, host memory). */
typedef void (*ct_batch_fn)(void *ctx, int mb, int32_t *tokens, int32_t *targets);

typedef struct ct_pipeline ct_pipeline;

/* An executor for `model` (this rank's chunks) on the grid's pp group; m microbatches of B
 * sequences per step, training with the `kind` schedule (v from the model's layout), or only
 * running forwards with kind CT_SCHEDULE_FORWARD_ONLY (then ct_pipeline_run must be called
 * with train = false). Allocates the activation contexts (CT_ERR_RUNTIME on out of memory). */
ct_status ct_pipeline_new(ct_pipeline **out, ct_model *model, ct_dp *dp, ct_pctx *pctx,
                          ct_schedule_kind kind, int m, int64_t B);

/* The same around a schedule the caller built (a schedule is data: any list the simulator runs
 * without deadlock; taken over, freed with the executor). m is schedule->m. */
ct_status ct_pipeline_new_from_schedule(ct_pipeline **out, ct_model *model, ct_dp *dp,
                                        ct_pctx *pctx, ct_schedule *schedule, int64_t B);

/* Called on the rank that holds the LM head right after each forward of that chunk, with the
 * microbatch and its activations (the logits are in acts->logits; with dloss = 0 they are kept
 * as logits). Lets a caller read the output before the context is reused (the sampler). */
typedef void (*ct_pipeline_head_fn)(void *ctx, int mb, ct_acts *acts);
void ct_pipeline_set_head_fn(ct_pipeline *p, ct_pipeline_head_fn fn, void *ctx);
void ct_pipeline_free(ct_pipeline *p);

/*
 * Runs one step: the training schedule (train = true; backward starts from dloss per token) or
 * the forward-only one (evaluation). Returns the summed loss of the microbatches whose last
 * chunk ran here (0 elsewhere), read from the backend once, after the run
 * (ct_model_begin_losses).
 */
double ct_pipeline_run(ct_pipeline *p, bool train, float dloss, ct_batch_fn fill, void *ctx);

/* Seconds the compute stream of the last run waited for activations or gradients from other
 * stages (bubble and transfer), as of the last ct_pipeline_settle: on the stream's clock
 * (backend.h, mark), so under NCCL it is the device that waited. */
double ct_pipeline_wait_seconds(const ct_pipeline *p);
/* Reads the times of the waits' marks (the caller has just called ct_backend_marks_settle on the
 * model's backend, and clears the marks after). */
void ct_pipeline_settle(ct_pipeline *p);
/* log.trace: keep every wait as a span from now on, and every compute action of a training run;
 * write them into `trace` as of the last settle: thread 5, "compute stream waits for pp
 * (bubble)", and thread 6, "pipeline actions", one span per action named by kind (F forward, B
 * input part, W weight part, BW a whole backward), microbatch and global chunk: "W 3:1". */
void ct_pipeline_log_waits(ct_pipeline *p, bool on);
void ct_pipeline_trace(const ct_pipeline *p, ct_trace *trace);
/* log.profile: time every compute action of a training run (as log.trace does) for
 * ct_pipeline_chunk_costs. */
void ct_pipeline_time_actions(ct_pipeline *p, bool on);
/* The mean seconds of a forward (f), an input part (b) and a weight part (w) of each local chunk
 * (costs[j], j as in the model's layout; a whole backward counts half to each) over the actions
 * timed since the last call, as of the last settle; returns how many forwards a chunk ran. */
int ct_pipeline_chunk_costs(ct_pipeline *p, ct_sim_costs *costs);
/* Peak activation contexts (microbatches) alive during the last run. */
int ct_pipeline_peak_inflight(const ct_pipeline *p);

/* For tests: executors made afterwards keep their message tags at or below max_tag (0: the
 * communicator's MPI_TAG_UB only), so tags repeat across microbatches as they do on an MPI with
 * a small tag bound. */
void ct_pipeline_set_tag_bound_for_tests(int max_tag);

/* The training schedule the executor runs. */
const ct_schedule *ct_pipeline_schedule(const ct_pipeline *p);

#endif /* CT_PARALLEL_PIPELINE_H */
