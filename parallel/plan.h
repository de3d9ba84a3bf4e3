/*
 * plan.h — `cooktrain plan`: what a config will cost before it runs (parallel/README.md, Plan).
 *
 * For a validated config on tp × cp × pp × dp ranks it prints, per pipeline stage (one tp rank;
 * every dp rank of a stage is alike): the parameters this rank holds (Φ), memory by category
 * from the ZeRO formulas, activation memory at the schedule's peak of microbatches in flight,
 * and bytes sent per step on the dp, tp and pp groups (the formulas the trainer checks against
 * its counters); then, with pp > 1, the schedule's timeline, bubble and in-flight counts from
 * the simulator. Nothing is allocated: the model is built with sharded (unbound) storage.
 */
#ifndef CT_PARALLEL_PLAN_H
#define CT_PARALLEL_PLAN_H

#include <stdio.h>

#include "core/config/config.h"
#include "core/model/model.h"
#include "parallel/schedule.h"

/* What one pipeline stage's rank (tp rank 0) holds and sends per step, from the formulas the
 * trainer checks its counters against. */
typedef struct ct_plan_stage {
    size_t phi;               /* parameter bytes this rank holds (before ZeRO sharding) */
    size_t mem[CT_MEM_COUNT]; /* params, grads, optim, master by the ZeRO formulas */
    double acts;              /* activation bytes at the schedule's peak of microbatches */
    int inflight;             /* that peak */
    double dp_bytes, tp_bytes, cp_bytes, pp_bytes, ep_bytes; /* sent per step */
    double flops_per_token; /* the whole model's, forward and backward */
} ct_plan_stage;

/* Stage r of a validated config (sim: the schedule's simulation when pp > 1, else NULL); the
 * model is built on `be` (the CPU backend) with unbound storage: nothing is allocated. */
ct_status ct_plan_stage_cost(const ct_config *cfg, int r, ct_backend *be, const ct_sim_result *sim,
                             ct_plan_stage *out);

/* The two halves of ct_plan_stage_cost, for a caller that costs many layouts of one model
 * (`plan --search`): building the model is most of the work — a Llama's RoPE table alone is
 * seq_len × head_dim sines — and it depends only on the config's model, precision, tp, cp, dp,
 * pp, virtual stages, sequence parallelism and recompute, not on the ZeRO stage or the
 * micro-batch. ct_plan_stage_model builds stage r's model (free it with ct_model_free);
 * ct_plan_stage_cost_of costs any config that agrees with the one it was built from on those. */
ct_status ct_plan_stage_model(const ct_config *cfg, int r, ct_backend *be, ct_model **out);
ct_status ct_plan_stage_cost_of(const ct_config *cfg, int r, const ct_model *model,
                                const ct_sim_result *sim, ct_plan_stage *out);

/* json: one JSON object per stage with exact byte counts instead of the table and timeline. */
ct_status ct_plan_print(const ct_config *cfg, double backward_ratio, bool json, FILE *out);

/* Tensor-parallel bytes a rank with `layout` sends per step of m microbatches (the formula is
 * written out above its definition in plan.c and in parallel/README.md); the trainer checks its tp
 * group's counters against it. */
double ct_expected_tp_bytes(const ct_config *cfg, const ct_model_layout *layout, int64_t m);
/* Expert-parallel all-to-all bytes per step under uniform routing (plan.c says what counts). */
double ct_expected_ep_bytes(const ct_config *cfg, const ct_model_layout *layout, int64_t m);
/* Context-parallel (ring attention) bytes a rank sends per step, the same way (plan.c). */
double ct_expected_cp_bytes(const ct_config *cfg, const ct_model_layout *layout, int64_t m);

#endif /* CT_PARALLEL_PLAN_H */
