/*
 * data_parallel.h — gradient reduction and ZeRO 1/2/3 over the data-parallel group
 * (parallel/README.md, Data parallel and ZeRO).
 *
 * The unit of everything is the model's FSDP unit (one flat range per transformer layer, one
 * for the embeddings, one for the final norm), padded to a multiple of 16·dp, so every shard
 * is equal: rank r owns elements [r·n/dp, (r+1)·n/dp) of a unit of n elements. With m
 * microbatches per step and Φ the bytes of this rank's parameters, per-rank traffic on the
 * dp group per step is (ring model, comm.h; written for fp32, where gradients and parameters
 * travel at 4 bytes per element — in general each reduction pass moves Ψ gradient elements at
 * parallel.grad_reduce_dtype's size and each gather pass Ψ parameters at the parameter dtype's
 * size, Ψ = elements of this rank's slice; see ct_state_bytes in core/model/optim.h):
 *   stage 0: gradients accumulate locally; each unit is allreduced when its last-microbatch
 *            gradients are complete                                          → 2Φ(N−1)/N
 *   stage 1: AdamW moments sharded; reduce-scatter at the last microbatch, update the own
 *            shard, allgather the parameters                                 → 2Φ(N−1)/N
 *   stage 2: gradients sharded too: each unit is reduce-scattered after every microbatch's
 *            backward into a staging buffer and only the own shard is kept   → (m+1)Φ(N−1)/N
 *   stage 3: parameters sharded too: a unit is gathered once per forward and once per
 *            backward of each microbatch, released after its last use in that pass, the
 *            next unit's gather prefetched                                   → 3mΦ(N−1)/N
 *            (the tied embedding under the V, used by two chunks of the rank, is gathered for
 *            each: its bytes count twice in the gathers)
 * Memory (per element of Ψ, bytes from ct_state_bytes): parameters (1/N at stage 3), gradients
 * (1/N at stages 2-3), optimizer state and fp32 master weights (1/N at stages ≥ 1); staging
 * buffers (and the bf16 copies a bf16 reduction sends) count as communication buffers and
 * gathered units as gathered parameters.
 *
 * Reductions start (non-blocking) the moment a unit's gradients are complete and progress while
 * backward continues: the model's poll hook drives MPI between ops.
 */
#ifndef CT_DATA_PARALLEL_H
#define CT_DATA_PARALLEL_H

#include "core/comm/comm.h"
#include "core/model/model.h"
#include "core/trace.h"
#include "core/model/optim.h"

typedef struct ct_dp ct_dp;

/* One entry of the event log (used by the overlap test and the trace). */
typedef enum ct_dp_event_kind {
    CT_DP_EVENT_BACKWARD_BEGIN = 0, /* a unit's backward starts */
    CT_DP_EVENT_BACKWARD_END,       /* a unit's gradients are complete */
    CT_DP_EVENT_REDUCE_START,       /* its reduction is started */
    CT_DP_EVENT_REDUCE_DONE,        /* its reduction is first seen complete (polled between ops
                                       while the log is on; else when waited for) */
    CT_DP_EVENT_GATHER_START,       /* ZeRO-3: a unit's gather starts */
    CT_DP_EVENT_GATHER_DONE,
} ct_dp_event_kind;

typedef struct ct_dp_event {
    ct_dp_event_kind kind;
    int unit, microbatch;
    double time;  /* seconds since the dp layer was created, on the stream's clock (backend.h,
                   * mark): when the compute stream reached the event; known from ct_dp_settle */
    int64_t mark; /* until then, the backend's mark */
} ct_dp_event;

/*
 * Sets up the ZeRO stage of `model`'s layout (layout.zero, model.h: the stage decoded once; the
 * model was created with layout.dp_size = comm->size) over the dp group `comm`:
 * allocates the optimizer state (ct_optimizer over this rank's ranges), gradient shards,
 * staging and gather buffers, initialises ZeRO-3 parameter shards, and installs the model's
 * hooks. Gradients accumulate in f32 and are reduced in reduce_dtype (f32, or bf16 to halve the
 * traffic: rounded into a bf16 buffer, reduced, widened back).
 */
ct_status ct_dp_new(ct_dp **out, ct_model *model, ct_comm *comm, const ct_train_config *tc,
                    ct_dtype reduce_dtype);
void ct_dp_free(ct_dp *dp);

/* Starts a step of n_microbatches: zeroes gradients (full buffers or shards) and the
 * exposed-communication clock. Every unit on this rank will run n_microbatches backward passes;
 * stages 0-1 reduce a unit when its last one ends, counted, in whatever order a schedule runs
 * the microbatches. */
void ct_dp_begin_step(ct_dp *dp, int n_microbatches);
/* Announces microbatch `mb` (it labels the event log; reductions do not depend on it). */
void ct_dp_begin_microbatch(ct_dp *dp, int mb);
/* Waits for every outstanding reduction; after it, this rank's gradient ranges are final. Every
 * unit must have run its n_microbatches backward passes (an assertion). */
void ct_dp_finish_backward(ct_dp *dp);
/* Pipeline parallel: sums the tied embedding's gradient between the first stage (wte) and the
 * last (its twin) over the embedding group, on this rank's range, after ct_dp_finish_backward.
 * No-op when both live on this rank. */
void ct_dp_sync_tied(ct_dp *dp, ct_comm *embed);
/* Sum of squared gradients over the whole dp group's view of this rank's model slice. */
double ct_dp_grad_sumsq(ct_dp *dp);
/* AdamW on this rank's ranges, then (stages 1-2) the parameter allgather. */
void ct_dp_optimizer_step(ct_dp *dp, float lr, float grad_scale);

/* The formulas above for Ψ = elems parameter elements over N ranks at a ZeRO stage, with the
 * bytes per element of `sb` (used by `plan`). The step bytes are exact: the formula plus, at
 * stages >= 1, the gradient norm's one-f64 allreduce (ct_zero_scalar_allreduce_bytes). */
void ct_zero_expected_memory(int64_t elems, ct_state_bytes sb, int N, int stage,
                             size_t bytes[CT_MEM_COUNT]);
double ct_zero_expected_step_bytes(int64_t elems, ct_state_bytes sb, int N, int stage, int m);
/* The same for a model whose MoE experts (`experts` elements) are reduced and sharded over
 * groups of N_e ranks and the rest (`dense`) over the N of the dp group; with N_e < N the
 * gradient norm's f64 allreduce over dp happens at stage 0 too (ct_dp_grad_sumsq). */
void ct_zero_expected_memory_split(int64_t dense, int64_t experts, ct_state_bytes sb, int N,
                                   int N_e, int stage, size_t bytes[CT_MEM_COUNT]);
double ct_zero_expected_step_bytes_split(int64_t dense, int64_t experts, ct_state_bytes sb, int N,
                                         int N_e, int stage, int m);
/* What ZeRO 3 gathers beyond the formula: a unit bracketed twice a pass (ct_model_unit_brackets:
 * the tied embedding under the V) is gathered for each, over the dp group of N. */
double ct_zero_rebracket_bytes(const ct_model *model, ct_state_bytes sb, int N, int stage, int m);
/* Ring-model bytes of one f64 allreduce over N ranks, as comm.c counts them (2·8·(N−1)/N,
 * rounded down): the per-step scalars (loss, gradient norm) a trainer adds to the formulas. */
uint64_t ct_zero_scalar_allreduce_bytes(int N);
/* Predicted bytes per category (params, grads, optim, master) from the formulas above. */
void ct_dp_expected_memory(const ct_dp *dp, size_t bytes[CT_MEM_COUNT]);
/* Predicted dp-group bytes sent per step by this rank for m microbatches (ring model). */
double ct_dp_expected_step_bytes(const ct_dp *dp, int m);
/* Elements of this rank's parameter slice (Ψ, the padded unit sizes) and their bytes (Φ). */
int64_t ct_dp_param_elems(const ct_dp *dp);
size_t ct_dp_param_bytes(const ct_dp *dp);
/* Bytes per element of each state for this dp layer's precision and reduce dtype. */
ct_state_bytes ct_dp_state_bytes(const ct_dp *dp);
/* Seconds the compute stream waited for dp communication since ct_dp_begin_step (exposed
 * communication), as of the last ct_dp_settle. Measured on the stream's clock (backend.h, mark):
 * on the CPU that is the host's wait; under NCCL the host does not wait, the device does. */
double ct_dp_exposed_seconds(const ct_dp *dp);
/* Reads the times of the marks taken since the last settle (the caller has just called
 * ct_backend_marks_settle on the model's backend, and clears the marks after): adds the waits to
 * the exposed time and gives logged events their times. */
void ct_dp_settle(ct_dp *dp);

/* The event log (events since creation, in order, up to the last ct_dp_settle); recording starts
 * with ct_dp_log_events. */
void ct_dp_log_events(ct_dp *dp, bool on);
const ct_dp_event *ct_dp_events(const ct_dp *dp, int *n);
/* The event log as trace spans (core/trace.h): thread 0 "compute" (one span per unit backward),
 * thread 1 "dp comm" (one per reduction or gather, from its start to when the rank saw it
 * complete). */
void ct_dp_trace(const ct_dp *dp, ct_trace *trace);

ct_optimizer *ct_dp_optimizer(ct_dp *dp);
/* Copies this rank's full parameters of unit u into host memory as fp32 (gathers them at stage
 * 3): collective over the dp group. In bf16 training these are the fp32 master weights (gathered
 * at stages >= 1), of which the bf16 parameters are the rounding. */
void ct_dp_unit_params_to_host(ct_dp *dp, int u, float *host);

/* ---- checkpoints (parallel/checkpoint_io.c) ---------------------------------------------- */

int ct_dp_stage(const ct_dp *dp);
/* The range [lo, lo + n) of unit u that this rank's optimizer updates. */
void ct_dp_unit_range(const ct_dp *dp, int u, int64_t *lo, int64_t *n);
/* Views of that range's optimizer state (n f32 elements each; the caller frees them): the fp32
 * weights AdamW updates (the master weights in bf16 training, else the parameters themselves:
 * the unit's range, or the ZeRO-3 shard), and the moments m and v. */
void ct_dp_unit_state(ct_dp *dp, int u, ct_tensor **weights, ct_tensor **m, ct_tensor **v);
/* After every unit's state was written through ct_dp_unit_state: sets the optimizer's step
 * counter, rounds the bf16 parameters from the master weights, and at ZeRO 1-2 gathers the
 * parameters outside each rank's shard — the parameters then stand as after that optimizer
 * step. Collective over the dp group. */
void ct_dp_load_done(ct_dp *dp, int64_t optimizer_step);

#endif /* CT_DATA_PARALLEL_H */
