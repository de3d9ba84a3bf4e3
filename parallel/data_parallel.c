/*
 * data_parallel.c — gradient reduction and ZeRO 1/2/3 (see data_parallel.h).
 *
 * Buffers that move: at stages 2-3 a unit's full gradients exist only while its backward runs
 * and its reduce-scatter is in flight (a staging slot); at stage 3 its full parameters exist only
 * between unit_begin and unit_end of a pass (a gather slot). The model's views are re-pointed at
 * the slot in use (ct_model_bind_unit_*). The tied embedding, whose brackets span a whole pass,
 * has dedicated slots so the rotating pool stays small: the unit in use plus the prefetched one
 * for gathers, the unit in use plus two reductions in flight for staging.
 *
 * Completion order is decided by program order, never by which request happens to finish first,
 * so the order of floating-point accumulation is the same on every run.
 */
#include "data_parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define STAGING_POOL 3
#define GATHER_POOL 3

typedef struct slot {
    ct_tensor *buf;
    ct_tensor *low; /* stages 2-3 with a bf16 reduction: buf rounded to bf16, what is reduced */
    int owner;      /* unit using it, or -1 */
    uint64_t since; /* when it was taken (for "oldest first") */
    int mb;         /* split backward: the microbatch whose gradients it holds */
    bool held;      /* split backward: its input part ran, its weight part has not (all of it:
                       brackets_left of the unit's weight-part brackets are still to end) */
    int brackets_left;
} slot;

typedef struct dp_unit {
    /* the group the unit is reduced and sharded over: the dp group, or for an MoE layer's
     * experts the ranks holding the same experts (model.h, layout.edp); its size and this
     * rank's place in it */
    ct_comm *comm;
    int N, rank;
    int64_t n, shard_n, shard_lo;
    bool dedicated;              /* the tied embedding: its own slots */
    ct_tensor *grad_shard;       /* stages 2-3: (shard_n) accumulated own gradients */
    ct_tensor *param_shard;      /* stage 3: (shard_n) own parameters (model dtype) */
    ct_tensor *reduce_buf;       /* stages 0-1 with a bf16 reduction: (n) the unit's gradients
                                    rounded to bf16, reduced in place */
    ct_comm_request *reduce_req; /* reduction in flight */
    slot *staging;               /* stages 2-3: slot holding its gradients */
    slot *gathered;              /* stage 3: slot holding its gathered parameters */
    ct_comm_request *gather_req; /* gather in flight into `gathered` */
    int backwards_left;          /* this step's backward passes of the unit still to end */
    bool reduce_seen_done;       /* its reduction was seen complete while polling (trace) */
} dp_unit;

struct ct_dp {
    ct_model *model;
    ct_backend *be; /* the model's: its stream's clock times waits and events */
    ct_comm *comm;  /* the dp group (dp × cp) */
    ct_comm *edp;   /* the expert units' group (== comm without expert parallelism) */
    int stage, N, rank;
    int n_gather; /* gather slots in use: 2, or GATHER_POOL with expert units (their bracket
                     nests in their layer's) */
    ct_dtype reduce_dtype; /* gradients are reduced in this dtype (they accumulate in f32) */
    ct_optimizer *opt;
    dp_unit *units;
    slot staging_pool[STAGING_POOL], staging_dedicated;
    slot gather_pool[GATHER_POOL], gather_dedicated;
    /* Stages 2-3 under a split backward (the zero-bubble schedules): a unit's gradients of one
     * microbatch are written by its input part and its weight part, which other microbatches'
     * input parts may run between; each (unit, microbatch) keeps a slot of its own from the
     * first to the second, then through its reduction. As many as the schedule holds at once,
     * taken as first needed (best fit) and kept for the next step. */
    slot **split;
    int n_split;
    uint64_t clock;         /* counts slot acquisitions */
    int microbatch;         /* the microbatch announced last (labels events) */
    int backwards_per_step; /* backward passes of every unit per step (ct_dp_begin_step) */
    double created;
    bool logging;
    ct_dp_event *events;
    int n_events, cap_events, settled_events; /* events before settled_events have their time */
    ct_waits waits; /* the compute stream's waits for communication (exposed) */
};

/* ---- small helpers ----------------------------------------------------------------------------
 */

static void log_event(ct_dp *dp, ct_dp_event_kind kind, int unit) {
    if (!dp->logging) return;
    if (dp->n_events == dp->cap_events) {
        dp->cap_events = dp->cap_events ? 2 * dp->cap_events : 256;
        dp->events = realloc(dp->events, (size_t)dp->cap_events * sizeof *dp->events);
        CT_ASSERT(dp->events != NULL);
    }
    dp->events[dp->n_events++] = (ct_dp_event){.kind = kind,
                                               .unit = unit,
                                               .microbatch = dp->microbatch,
                                               .time = NAN,
                                               .mark = ct_backend_mark(dp->be)};
}

/* Exposed communication is what the compute stream waits: a mark before the wait and one after
 * (the stream passes the second once the communication it now waits for is done), read at
 * ct_dp_settle. wait_begin returns the first mark for wait_end. */
static int64_t wait_begin(ct_dp *dp) {
    return ct_backend_mark(dp->be);
}

static void wait_end(ct_dp *dp, int64_t before) {
    ct_waits_end(&dp->waits, dp->be, before);
}

/* Waits for a request, counting the wait as exposed communication. */
static void timed_wait(ct_dp *dp, ct_comm *comm, ct_comm_request *req) {
    if (!req) return;
    int64_t before = wait_begin(dp);
    ct_comm_wait(comm, req);
    wait_end(dp, before);
}

void ct_dp_settle(ct_dp *dp) {
    ct_waits_settle(&dp->waits, dp->be);
    for (int i = dp->settled_events; i < dp->n_events; i++)
        dp->events[i].time = ct_backend_mark_time(dp->be, dp->events[i].mark) - dp->created;
    dp->settled_events = dp->n_events;
}

static ct_tensor *view(const ct_tensor *t, int64_t offset, int64_t n) {
    return ct_tensor_view_1d(t, offset, n);
}

/* ---- ZeRO-3: gathered parameters ----------------------------------------------------------- */

static slot *take_gather_slot(ct_dp *dp, int u) {
    slot *s = NULL;
    if (dp->units[u].dedicated) {
        s = &dp->gather_dedicated;
    } else {
        for (int i = 0; i < dp->n_gather && !s; i++)
            if (dp->gather_pool[i].owner < 0) s = &dp->gather_pool[i];
    }
    if (!s || s->owner >= 0) return NULL;
    s->owner = u;
    s->since = dp->clock++;
    return s;
}

static void start_gather(ct_dp *dp, int u, slot *s) {
    dp_unit *du = &dp->units[u];
    du->gathered = s;
    log_event(dp, CT_DP_EVENT_GATHER_START, u);
    du->gather_req =
        ct_comm_iallgather(du->comm, du->param_shard->data, s->buf->data, du->n, s->buf->dtype);
    ct_model_bind_unit_params(dp->model, u, s->buf, 0);
}

static void ensure_gathered(ct_dp *dp, int u) {
    dp_unit *du = &dp->units[u];
    if (!du->gathered) {
        slot *s = take_gather_slot(dp, u);
        CT_ASSERTF(s != NULL, "no free gather slot for unit %s", ct_model_unit(dp->model, u)->name);
        start_gather(dp, u, s);
    }
    if (du->gather_req) {
        timed_wait(dp, du->comm, du->gather_req);
        du->gather_req = NULL;
        log_event(dp, CT_DP_EVENT_GATHER_DONE, u);
    }
}

/* Starts gathering unit u ahead of its use if a pool slot is free (never waits). Only within
 * the chunk of `from`: across chunks (pipeline parallel) the next unit may run much later. */
static void prefetch(ct_dp *dp, int u, int from) {
    if (u < 0 || u >= ct_model_n_units(dp->model) || dp->units[u].gathered ||
        dp->units[u].dedicated)
        return;
    if (ct_model_unit_chunk(dp->model, u) != ct_model_unit_chunk(dp->model, from)) return;
    slot *s = take_gather_slot(dp, u);
    if (s) start_gather(dp, u, s);
}

static void release_gathered(ct_dp *dp, int u) {
    dp_unit *du = &dp->units[u];
    CT_ASSERT(du->gathered && !du->gather_req);
    ct_model_bind_unit_params(dp->model, u, NULL, 0);
    du->gathered->owner = -1;
    du->gathered = NULL;
}

/* ---- reductions ----------------------------------------------------------------------------- */

static ct_status alloc_slot(slot *s, ct_backend *be, int64_t n, ct_dtype dtype, ct_dtype low,
                            ct_mem_category category);

/* Waits for unit u's reduction; at stages 2-3 adds its shard into the accumulator and frees the
 * staging slot. */
static void complete_reduction(ct_dp *dp, int u) {
    dp_unit *du = &dp->units[u];
    bool reduced = du->reduce_req != NULL;
    if (du->reduce_req) {
        timed_wait(dp, du->comm, du->reduce_req);
        du->reduce_req = NULL;
        if (!du->reduce_seen_done) log_event(dp, CT_DP_EVENT_REDUCE_DONE, u);
    }
    if (reduced && du->reduce_buf) {
        /* A bf16 reduction lands back in the f32 gradients: all of them (stage 0), the own
         * shard (stage 1). */
        const ct_tensor *grads = ct_model_unit(dp->model, u)->grads;
        int64_t lo = dp->stage == 0 ? 0 : du->shard_lo, n = dp->stage == 0 ? du->n : du->shard_n;
        ct_tensor *from = view(du->reduce_buf, lo, n), *to = view(grads, lo, n);
        ct_cast(to, from);
        ct_tensor_free(from), ct_tensor_free(to);
    }
    if (dp->stage >= 2 && du->staging) {
        ct_tensor *mine = view(du->staging->buf, du->shard_lo, du->shard_n);
        if (reduced && du->staging->low) { /* the bf16 sums, widened into the f32 staging */
            ct_tensor *low = view(du->staging->low, du->shard_lo, du->shard_n);
            ct_cast(mine, low);
            ct_tensor_free(low);
        }
        ct_axpy(du->grad_shard, mine, 1.0f);
        ct_tensor_free(mine);
        du->staging->owner = -1;
        du->staging = NULL;
    }
}

static slot *take_staging_slot(ct_dp *dp, int u) {
    if (dp->units[u].dedicated) {
        slot *s = &dp->staging_dedicated;
        if (s->owner >= 0) complete_reduction(dp, s->owner);
        s->owner = u;
        s->since = dp->clock++;
        return s;
    }
    slot *s = NULL;
    for (int i = 0; i < STAGING_POOL && !s; i++)
        if (dp->staging_pool[i].owner < 0) s = &dp->staging_pool[i];
    if (!s) {
        /* All busy with reductions in flight: finish the oldest one. */
        slot *oldest = &dp->staging_pool[0];
        for (int i = 1; i < STAGING_POOL; i++)
            if (dp->staging_pool[i].since < oldest->since) oldest = &dp->staging_pool[i];
        complete_reduction(dp, oldest->owner);
        s = oldest;
    }
    s->owner = u;
    s->since = dp->clock++;
    return s;
}

/* Split backward: a free slot for unit u's gradients of the current microbatch (the smallest
 * that fits, or a new one). Out of memory in the middle of a step cannot be agreed on with the
 * other ranks: it ends the run, naming the size. */
static slot *take_split_slot(ct_dp *dp, int u) {
    const int64_t n = dp->units[u].n;
    slot *s = NULL;
    for (int i = 0; i < dp->n_split; i++) {
        slot *c = dp->split[i];
        if (c->owner < 0 && c->buf->numel >= n && (!s || c->buf->numel < s->buf->numel)) s = c;
    }
    if (!s) {
        s = ct_xcalloc(1, sizeof *s);
        const ct_dtype low = dp->units[u].N > 1 ? dp->reduce_dtype : CT_DTYPE_F32;
        CT_ASSERTF(alloc_slot(s, dp->be, n, CT_DTYPE_F32, low, CT_MEM_COMM) == CT_OK,
                   "out of memory for unit %s's gradients held from input to weight part: %s",
                   ct_model_unit(dp->model, u)->name, ct_error_message());
        dp->split = realloc(dp->split, (size_t)(dp->n_split + 1) * sizeof *dp->split);
        CT_ASSERT(dp->split != NULL);
        dp->split[dp->n_split++] = s;
    }
    s->owner = u;
    s->since = dp->clock++;
    s->mb = dp->microbatch;
    s->held = true;
    s->brackets_left = ct_model_unit_brackets(dp->model, u);
    return s;
}

/* Split backward: the slot holding unit u's gradients of the current microbatch between its
 * input and weight parts, or NULL (`must`: an assertion) when there is none. */
static slot *held_slot(ct_dp *dp, int u, bool must) {
    for (int i = 0; i < dp->n_split; i++) {
        slot *s = dp->split[i];
        if (s->held && s->owner == u && s->mb == dp->microbatch) return s;
    }
    CT_ASSERTF(!must, "unit %s: a weight part of microbatch %d before its input part",
               ct_model_unit(dp->model, u)->name, dp->microbatch);
    return NULL;
}

static void start_reduction(ct_dp *dp, int u) {
    dp_unit *du = &dp->units[u];
    const ct_unit *unit = ct_model_unit(dp->model, u);
    log_event(dp, CT_DP_EVENT_REDUCE_START, u);
    du->reduce_seen_done = false;
    /* What is reduced: the f32 gradients themselves, or their bf16 rounding (reduce_dtype
     * bf16: half the bytes on the wire). */
    const ct_tensor *grads = dp->stage >= 2 ? du->staging->buf : unit->grads;
    const ct_tensor *wire = grads;
    if (dp->reduce_dtype != grads->dtype) {
        ct_tensor *low = dp->stage >= 2 ? du->staging->low : du->reduce_buf;
        ct_cast(low, grads);
        wire = low;
    }
    char *g = wire->data;
    size_t esize = ct_dtype_size(wire->dtype);
    if (dp->stage == 0) {
        du->reduce_req = ct_comm_iallreduce(du->comm, g, du->n, wire->dtype, CT_REDUCE_SUM);
    } else {
        /* In place: this rank's shard of the sums lands at its own offset. */
        du->reduce_req = ct_comm_ireduce_scatter(du->comm, g, g + (size_t)du->shard_lo * esize,
                                                 du->n, wire->dtype, CT_REDUCE_SUM);
    }
    if (dp->stage >= 2) ct_model_bind_unit_grads(dp->model, u, NULL, 0);
}

/* ---- the model's hooks ------------------------------------------------------------------------
 */

static void hook_unit_begin(void *ctx, int u, ct_pass pass) {
    ct_dp *dp = ctx;
    /* ZeRO-3 gathers for the passes that read the parameters; a weight part reads only the
     * activations and output gradients its input part kept. */
    if (dp->stage == 3 && pass != CT_PASS_BACKWARD_WEIGHT) {
        ensure_gathered(dp, u);
        prefetch(dp, pass == CT_PASS_FORWARD ? u + 1 : u - 1, u);
    }
    if (pass == CT_PASS_FORWARD) return;
    dp_unit *du = &dp->units[u];
    if (pass != CT_PASS_BACKWARD_INPUT) log_event(dp, CT_DP_EVENT_BACKWARD_BEGIN, u);
    if (dp->stage < 2) return; /* gradients accumulate in the unit's own buffer */
    slot *s;
    if (pass == CT_PASS_BACKWARD) {
        CT_ASSERTF(ct_model_unit_brackets(dp->model, u) == 1,
                   "unit %s is bracketed twice a microbatch, which only a split backward runs",
                   ct_model_unit(dp->model, u)->name);
        /* The previous microbatch's reduction of this unit must land in the shard first. */
        if (du->staging || du->reduce_req) complete_reduction(dp, u);
        s = du->staging = take_staging_slot(dp, u);
        ct_tensor_zero(s->buf);
    } else if (pass == CT_PASS_BACKWARD_INPUT) {
        s = held_slot(dp, u, false);
        if (!s) { /* the microbatch's first input-part bracket of the unit */
            s = take_split_slot(dp, u);
            ct_tensor_zero(s->buf);
        }
    } else {
        s = held_slot(dp, u, true);
    }
    ct_model_bind_unit_grads(dp->model, u, s->buf, 0);
}

/*
 * Sequence parallelism leaves the gradients of tp-replicated tensors (norms, row-parallel
 * biases, position embeddings) as partial sums over the tp group's positions: sum them over
 * the group before the data-parallel reduction — and only then (without sequence parallelism
 * they are already identical on every tp rank). Done on the gradients of this microbatch alone
 * (stages 2-3) or on the accumulated ones at the last microbatch (stages 0-1), never twice.
 */
static void tp_reduce_replicated(ct_dp *dp, int u) {
    const ct_model *m = dp->model;
    const ct_unit *unit = ct_model_unit(m, u);
    ct_comm *tp = ct_model_layout_of(m)->tp;
    /* All of the unit's replicated tensors at once (a merged unit holds several layers'). */
    ct_comm_request **reqs = ct_xcalloc((size_t)unit->n_params, sizeof *reqs);
    int n = 0;
    for (int i = 0; i < unit->n_params; i++) {
        const ct_param *p = ct_model_param(m, unit->first_param + i);
        if (p->tp_split_dim >= 0) continue;
        reqs[n++] = ct_comm_iallreduce(tp, p->grad->data, p->numel, p->grad->dtype, CT_REDUCE_SUM);
    }
    for (int i = 0; i < n; i++) {
        int64_t before = wait_begin(dp);
        ct_comm_wait(tp, reqs[i]);
        wait_end(dp, before);
    }
    free(reqs);
}

static void hook_unit_end(void *ctx, int u, ct_pass pass) {
    ct_dp *dp = ctx;
    if (dp->stage == 3 && pass != CT_PASS_BACKWARD_WEIGHT) release_gathered(dp, u);
    if (pass == CT_PASS_FORWARD) return;
    if (pass == CT_PASS_BACKWARD_INPUT) { /* the slot waits for the weight part */
        if (dp->stage >= 2) ct_model_bind_unit_grads(dp->model, u, NULL, 0);
        return;
    }
    log_event(dp, CT_DP_EVENT_BACKWARD_END, u);
    /* The unit's gradients for the step are complete after its last backward bracket of the
     * step, whichever microbatch that is: counted, so a schedule that orders microbatches
     * differently cannot make stages 0-1 reduce partial sums. */
    dp_unit *du = &dp->units[u];
    CT_ASSERTF(du->backwards_left > 0, "unit %s: more backward passes than the %d of a step",
               ct_model_unit(dp->model, u)->name, dp->backwards_per_step);
    bool last = --du->backwards_left == 0;
    slot *split = NULL;
    if (dp->stage >= 2 && pass == CT_PASS_BACKWARD_WEIGHT) {
        /* the microbatch's gradients of the unit are complete at its last weight-part bracket */
        split = held_slot(dp, u, true);
        if (--split->brackets_left > 0) {
            ct_model_bind_unit_grads(dp->model, u, NULL, 0);
            return;
        }
    }
    const ct_model_layout *layout = ct_model_layout_of(dp->model);
    if (layout->sequence_parallel && layout->tp_size > 1 && (dp->stage >= 2 || last))
        tp_reduce_replicated(dp, u);
    if (split) { /* its reduction follows the previous microbatch's, in order */
        if (du->staging || du->reduce_req) complete_reduction(dp, u);
        split->held = false;
        du->staging = split;
    }
    if (dp->stage >= 2) {
        if (du->N > 1) {
            start_reduction(dp, u);
        } else {
            /* One rank: the reduction is the accumulation into the shard itself. */
            ct_model_bind_unit_grads(dp->model, u, NULL, 0);
            complete_reduction(dp, u);
        }
    } else if (last && du->N > 1) {
        start_reduction(dp, u);
    }
}

static void hook_poll(void *ctx) {
    ct_dp *dp = ctx;
    ct_comm_poll(dp->comm);
    if (dp->edp != dp->comm) ct_comm_poll(dp->edp);
    if (!dp->logging) return;
    /* For the trace: when each reduction is first seen complete, so the trace shows reductions
     * finishing while backward still runs (completion itself stays in program order). */
    for (int u = 0; u < ct_model_n_units(dp->model); u++) {
        dp_unit *du = &dp->units[u];
        if (du->reduce_req && !du->reduce_seen_done && ct_comm_test(du->comm, du->reduce_req)) {
            du->reduce_seen_done = true;
            log_event(dp, CT_DP_EVENT_REDUCE_DONE, u);
        }
    }
}

/* ---- construction ---------------------------------------------------------------------------- */

/* A slot of n elements of `dtype`; with `low` != dtype also its rounding buffer (staging slots of
 * a bf16 reduction). */
static ct_status alloc_slot(slot *s, ct_backend *be, int64_t n, ct_dtype dtype, ct_dtype low,
                            ct_mem_category category) {
    s->owner = -1;
    if (n == 0) return CT_OK;
    s->buf = ct_tensor_new_1d(be, dtype, n, category);
    if (s->buf && low != dtype) s->low = ct_tensor_new_1d(be, low, n, category);
    return s->buf && (low == dtype || s->low) ? CT_OK : CT_ERR_RUNTIME;
}

ct_status ct_dp_new(ct_dp **out, ct_model *model, ct_comm *comm, const ct_train_config *tc,
                    ct_dtype reduce_dtype) {
    const ct_model_layout *layout = ct_model_layout_of(model);
    CT_ASSERTF(layout->dp_size == comm->size, "model padded for dp=%d, group has %d",
               layout->dp_size, comm->size);
    const ct_zero_layout *zero = &layout->zero; /* the stage, decoded once (model.h) */
    ct_dp *dp = ct_xcalloc(1, sizeof *dp);
    dp->model = model;
    ct_comm_set_stream(comm,
                       ct_model_backend(model)); /* gradients and parameters: the model's memory */
    dp->comm = comm;
    dp->stage = zero->stage;
    dp->reduce_dtype = reduce_dtype;
    CT_ASSERT(reduce_dtype == CT_DTYPE_F32 || reduce_dtype == CT_DTYPE_BF16);
    dp->N = comm->size;
    dp->rank = comm->rank;
    dp->edp = layout->edp ? layout->edp : comm;
    if (dp->edp != comm) ct_comm_set_stream(dp->edp, ct_model_backend(model));
    dp->n_gather = GATHER_POOL - 1;
    dp->backwards_per_step = 1;
    dp->created = ct_now();
    ct_backend *be = dp->be = ct_model_backend(model);
    /* The tied embedding on one rank: its unit gets the dedicated slots. */
    int tied_unit;
    const bool tied_local = ct_model_tied_place(model, &tied_unit) == CT_TIED_LOCAL;

    int nu = ct_model_n_units(model);
    dp->units = ct_xcalloc((size_t)nu, sizeof *dp->units);
    int64_t *lo = ct_xcalloc((size_t)nu, sizeof(int64_t)),
            *len = ct_xcalloc((size_t)nu, sizeof(int64_t));
    int64_t pool_n = 0, dedicated_n = 0;
    ct_status st = CT_OK;
    for (int u = 0; u < nu; u++) {
        dp_unit *du = &dp->units[u];
        du->n = ct_model_unit(model, u)->padded_numel;
        du->comm = ct_model_unit(model, u)->experts ? dp->edp : comm;
        if (ct_model_unit(model, u)->experts) dp->n_gather = GATHER_POOL;
        du->N = du->comm->size;
        du->rank = du->comm->rank;
        CT_ASSERT(du->n % du->N == 0);
        du->shard_n = du->n / du->N;
        du->shard_lo = (int64_t)du->rank * du->shard_n;
        du->dedicated = tied_local && u == tied_unit;
        if (du->dedicated)
            dedicated_n = du->n;
        else
            pool_n = CT_MAX(pool_n, du->n);
        lo[u] = !zero->shard_optim ? 0 : du->shard_lo;
        len[u] = !zero->shard_optim ? du->n : du->shard_n;
        if (zero->shard_grads && st == CT_OK) {
            du->grad_shard = ct_tensor_new_1d(be, CT_DTYPE_F32, du->shard_n, CT_MEM_GRADS);
            if (!du->grad_shard) st = CT_ERR_RUNTIME;
        }
        if (zero->shard_params && st == CT_OK) {
            du->param_shard =
                ct_tensor_new_1d(be, ct_model_dtype(model), du->shard_n, CT_MEM_PARAMS);
            if (!du->param_shard) st = CT_ERR_RUNTIME;
        }
        if (!zero->shard_grads && reduce_dtype != CT_DTYPE_F32 && du->N > 1 && st == CT_OK) {
            du->reduce_buf = ct_tensor_new_1d(be, reduce_dtype, du->n, CT_MEM_COMM);
            if (!du->reduce_buf) st = CT_ERR_RUNTIME;
        }
    }
    if (st == CT_OK) st = ct_optim_new(&dp->opt, model, tc, lo, len);
    free(lo);
    free(len);
    for (int i = 0; i < STAGING_POOL; i++) dp->staging_pool[i].owner = -1;
    for (int i = 0; i < GATHER_POOL; i++) dp->gather_pool[i].owner = -1;
    dp->staging_dedicated.owner = dp->gather_dedicated.owner = -1;
    if (zero->shard_grads) {
        ct_dtype low = dp->N > 1 ? reduce_dtype : CT_DTYPE_F32;
        for (int i = 0; i < STAGING_POOL && st == CT_OK; i++)
            st = alloc_slot(&dp->staging_pool[i], be, pool_n, CT_DTYPE_F32, low, CT_MEM_COMM);
        if (st == CT_OK)
            st =
                alloc_slot(&dp->staging_dedicated, be, dedicated_n, CT_DTYPE_F32, low, CT_MEM_COMM);
    }
    if (zero->shard_params) {
        const ct_dtype pd = ct_model_dtype(model);
        for (int i = 0; i < dp->n_gather && st == CT_OK; i++)
            st = alloc_slot(&dp->gather_pool[i], be, pool_n, pd, pd, CT_MEM_GATHERED);
        if (st == CT_OK)
            st = alloc_slot(&dp->gather_dedicated, be, dedicated_n, pd, pd, CT_MEM_GATHERED);
        /* Initialise each unit in a full buffer, keep this rank's shard. */
        for (int u = 0; u < nu && st == CT_OK; u++) {
            dp_unit *du = &dp->units[u];
            slot *s = du->dedicated ? &dp->gather_dedicated : &dp->gather_pool[0];
            ct_model_bind_unit_params(model, u, s->buf, 0);
            ct_model_init_unit(model, u);
            ct_tensor *mine = view(s->buf, du->shard_lo, du->shard_n);
            ct_tensor_copy(du->param_shard, mine);
            ct_tensor_free(mine);
            ct_model_bind_unit_params(model, u, NULL, 0);
        }
    }
    if (st != CT_OK) {
        ct_dp_free(dp);
        return st;
    }
    ct_model_set_hooks(model, (ct_model_hooks){.ctx = dp,
                                               .unit_begin = hook_unit_begin,
                                               .unit_end = hook_unit_end,
                                               .poll = hook_poll});
    *out = dp;
    return CT_OK;
}

void ct_dp_free(ct_dp *dp) {
    if (!dp) return;
    if (dp->model) ct_comm_unset_stream(dp->comm, ct_model_backend(dp->model));
    if (dp->model && dp->edp != dp->comm)
        ct_comm_unset_stream(dp->edp, ct_model_backend(dp->model));
    if (dp->model && ct_model_hooks_of(dp->model)->ctx == dp)
        ct_model_set_hooks(dp->model, (ct_model_hooks){0});
    for (int u = 0; dp->units && u < ct_model_n_units(dp->model); u++) {
        ct_tensor_free(dp->units[u].grad_shard);
        ct_tensor_free(dp->units[u].param_shard);
        ct_tensor_free(dp->units[u].reduce_buf);
    }
    for (int i = 0; i < STAGING_POOL; i++)
        ct_tensor_free(dp->staging_pool[i].buf), ct_tensor_free(dp->staging_pool[i].low);
    for (int i = 0; i < GATHER_POOL; i++) ct_tensor_free(dp->gather_pool[i].buf);
    ct_tensor_free(dp->staging_dedicated.buf);
    ct_tensor_free(dp->staging_dedicated.low);
    ct_tensor_free(dp->gather_dedicated.buf);
    for (int i = 0; i < dp->n_split; i++) {
        ct_tensor_free(dp->split[i]->buf), ct_tensor_free(dp->split[i]->low);
        free(dp->split[i]);
    }
    free(dp->split);
    ct_optim_free(dp->opt);
    free(dp->units);
    free(dp->events);
    ct_waits_release(&dp->waits);
    free(dp);
}

/* ---- the step -------------------------------------------------------------------------------- */

void ct_dp_begin_step(ct_dp *dp, int n_microbatches) {
    CT_ASSERT(n_microbatches >= 1);
    dp->waits.seconds = 0.0;
    dp->backwards_per_step = n_microbatches;
    const int nu = ct_model_n_units(dp->model);
    for (int u = 0; u < nu; u++)
        dp->units[u].backwards_left = n_microbatches * ct_model_unit_brackets(dp->model, u);
    if (dp->stage >= 2) {
        for (int u = 0; u < nu; u++) ct_tensor_zero(dp->units[u].grad_shard);
    } else {
        ct_model_zero_grads(dp->model);
    }
}

void ct_dp_begin_microbatch(ct_dp *dp, int mb) {
    dp->microbatch = mb;
}

void ct_dp_finish_backward(ct_dp *dp) {
    const int nu = ct_model_n_units(dp->model);
    for (int u = 0; u < nu; u++)
        CT_ASSERTF(dp->units[u].backwards_left == 0,
                   "unit %s: %d of its %d backward passes of the step did not run",
                   ct_model_unit(dp->model, u)->name, dp->units[u].backwards_left,
                   dp->backwards_per_step);
    for (int i = 0; i < dp->n_split; i++)
        CT_ASSERTF(!dp->split[i]->held, "unit %s: microbatch %d's weight part did not run",
                   ct_model_unit(dp->model, dp->split[i]->owner)->name, dp->split[i]->mb);
    /* Oldest first: the order units finished their backward. */
    for (;;) {
        int next = -1;
        uint64_t since = UINT64_MAX;
        for (int u = 0; u < nu; u++) {
            dp_unit *du = &dp->units[u];
            if (!du->reduce_req && !du->staging) continue;
            uint64_t t = du->staging ? du->staging->since : 0;
            if (next < 0 || t < since) next = u, since = t;
        }
        if (next < 0) break;
        complete_reduction(dp, next);
    }
}

/* The (params, grads) ranges this rank updates for unit u; caller frees both views. */
static void unit_ranges(ct_dp *dp, int u, ct_tensor **params, ct_tensor **grads) {
    dp_unit *du = &dp->units[u];
    const ct_unit *unit = ct_model_unit(dp->model, u);
    switch (dp->stage) {
    case 0:
        *params = view(unit->params, 0, du->n);
        *grads = view(unit->grads, 0, du->n);
        break;
    case 1:
        *params = view(unit->params, du->shard_lo, du->shard_n);
        *grads = view(unit->grads, du->shard_lo, du->shard_n);
        break;
    case 2:
        *params = view(unit->params, du->shard_lo, du->shard_n);
        *grads = view(du->grad_shard, 0, du->shard_n);
        break;
    default:
        *params = view(du->param_shard, 0, du->shard_n);
        *grads = view(du->grad_shard, 0, du->shard_n);
        break;
    }
}

double ct_dp_grad_sumsq(ct_dp *dp) {
    int nu = ct_model_n_units(dp->model);
    ct_tensor **params = ct_xcalloc((size_t)nu, sizeof *params);
    ct_tensor **grads = ct_xcalloc((size_t)nu, sizeof *grads);
    for (int u = 0; u < nu; u++) unit_ranges(dp, u, &params[u], &grads[u]);
    const bool spread = dp->edp != dp->comm; /* experts differ between dp ranks */
    double sum;
    if (spread && dp->stage == 0) {
        /* Stage 0 holds every reduced gradient on every rank, but an expert's only on the ranks
         * holding it: the experts' part once per expert-data-parallel group, the rest once */
        ct_tensor **part[2] = {ct_xcalloc((size_t)nu, sizeof(ct_tensor *)),
                               ct_xcalloc((size_t)nu, sizeof(ct_tensor *))}; /* dense, experts */
        for (int u = 0; u < nu; u++) part[ct_model_unit(dp->model, u)->experts][u] = grads[u];
        double dense = ct_optim_grad_sumsq(dp->opt, part[0]),
               e = ct_optim_grad_sumsq(dp->opt, part[1]);
        free(part[0]), free(part[1]);
        sum = (dp->rank == 0 ? dense : 0.0) + (dp->edp->rank == 0 ? e : 0.0);
    } else {
        sum = ct_optim_grad_sumsq(dp->opt, grads);
    }
    for (int u = 0; u < nu; u++) ct_tensor_free(params[u]), ct_tensor_free(grads[u]);
    free(params);
    free(grads);
    /* Stage 0 holds the full reduced gradients on every rank; sharded stages sum their parts
     * (each expert unit's shards over its own group, the groups' experts over all of dp). */
    if ((dp->stage >= 1 || spread) && dp->N > 1) {
        int64_t before = wait_begin(dp);
        ct_comm_allreduce(dp->comm, &sum, 1, CT_DTYPE_F64, CT_REDUCE_SUM);
        wait_end(dp, before);
    }
    return sum;
}

/* Gathers left from a prefetch that was never used hold last step's parameters: drop them. */
static void drop_gathered(ct_dp *dp) {
    for (int u = 0; u < ct_model_n_units(dp->model); u++) {
        dp_unit *du = &dp->units[u];
        if (!du->gathered) continue;
        if (du->gather_req) timed_wait(dp, du->comm, du->gather_req);
        du->gather_req = NULL;
        release_gathered(dp, u);
    }
}

void ct_dp_sync_tied(ct_dp *dp, ct_comm *embed) {
    int u;
    const ct_tied_place place = ct_model_tied_place(dp->model, &u);
    const bool across = place == CT_TIED_FIRST || place == CT_TIED_LAST;
    if (!across || !embed || embed->size == 1) return;
    /* The embedding unit (first stage) and the head unit (last stage) hold wte / its twin at
     * offset 0 and have the same padded size (model.h, ct_model_tied_place), so this rank's range
     * covers the same elements of both: sum them over the two stages. */
    int64_t n_wte = ct_model_wte(dp->model)->numel; /* the twin on the last stage */
    ct_tensor *params, *grads;
    unit_ranges(dp, u, &params, &grads);
    int64_t lo = dp->stage == 0 ? 0 : dp->units[u].shard_lo;
    int64_t n = CT_MIN(n_wte, lo + grads->numel) - lo;
    if (n > 0) {
        int64_t before = wait_begin(dp);
        ct_comm_allreduce(embed, grads->data, n, grads->dtype, CT_REDUCE_SUM);
        wait_end(dp, before);
    }
    ct_tensor_free(params);
    ct_tensor_free(grads);
}

static void gather_updated_params(ct_dp *dp);

void ct_dp_optimizer_step(ct_dp *dp, float lr, float grad_scale) {
    int nu = ct_model_n_units(dp->model);
    if (dp->stage == 3) drop_gathered(dp);
    ct_optim_begin_step(dp->opt);
    for (int u = 0; u < nu; u++) {
        ct_tensor *p, *g;
        unit_ranges(dp, u, &p, &g);
        ct_optim_update_unit(dp->opt, u, p, g, lr, grad_scale);
        ct_tensor_free(p);
        ct_tensor_free(g);
        hook_poll(dp);
    }
    gather_updated_params(dp);
}

/* ZeRO 1-2: every rank updated its own shard: gather the parameters back, all units at once. */
static void gather_updated_params(ct_dp *dp) {
    int nu = ct_model_n_units(dp->model);
    if ((dp->stage == 1 || dp->stage == 2) && dp->N > 1) {
        ct_comm_request **reqs = ct_xcalloc((size_t)nu, sizeof *reqs);
        for (int u = 0; u < nu; u++) {
            const ct_tensor *params = ct_model_unit(dp->model, u)->params;
            char *all = params->data;
            size_t esize = ct_dtype_size(params->dtype);
            if (dp->units[u].N == 1) continue;
            reqs[u] =
                ct_comm_iallgather(dp->units[u].comm, all + (size_t)dp->units[u].shard_lo * esize,
                                   all, dp->units[u].n, params->dtype);
        }
        for (int u = 0; u < nu; u++) timed_wait(dp, dp->units[u].comm, reqs[u]);
        free(reqs);
    }
}

/* ---- accounting and introspection ------------------------------------------------------------ */

int64_t ct_dp_param_elems(const ct_dp *dp) {
    int64_t n = 0;
    for (int u = 0; u < ct_model_n_units(dp->model); u++) n += dp->units[u].n;
    return n;
}

size_t ct_dp_param_bytes(const ct_dp *dp) {
    return (size_t)ct_dp_param_elems(dp) * ct_dtype_size(ct_model_dtype(dp->model));
}

ct_state_bytes ct_dp_state_bytes(const ct_dp *dp) {
    return ct_state_bytes_of(ct_model_dtype(dp->model), dp->reduce_dtype);
}

void ct_zero_expected_memory(int64_t elems, ct_state_bytes sb, int N, int stage,
                             size_t bytes[CT_MEM_COUNT]) {
    size_t all = (size_t)elems, shard = all / (size_t)N;
    memset(bytes, 0, CT_MEM_COUNT * sizeof bytes[0]);
    bytes[CT_MEM_PARAMS] = sb.params * (stage == 3 ? shard : all);
    bytes[CT_MEM_GRADS] = sb.grads * (stage >= 2 ? shard : all);
    bytes[CT_MEM_OPTIM] = sb.optim * (stage >= 1 ? shard : all);
    bytes[CT_MEM_MASTER] = sb.master * (stage >= 1 ? shard : all);
}

double ct_zero_expected_step_bytes(int64_t elems, ct_state_bytes sb, int N, int stage, int m) {
    if (N <= 1) return 0.0;
    /* Ψ(N−1)/N elements per collective pass (ring model), times the bytes each pass moves: the
     * reduction moves gradients (reduce bytes), the allgathers parameters (params bytes). */
    double f = (double)elems * (double)(N - 1) / (double)N;
    double r = (double)sb.reduce, p = (double)sb.params, bytes;
    switch (stage) {
    case 0: bytes = 2.0 * r * f; break;                    /* allreduce */
    case 1: bytes = (r + p) * f; break;                    /* reduce-scatter + allgather */
    case 2: bytes = ((double)m * r + p) * f; break;        /* m reduce-scatters + allgather */
    default: bytes = (double)m * (2.0 * p + r) * f; break; /* 2m gathers + m reduce-scatters */
    }
    /* The sharded stages also allreduce the gradient norm's partial sum (one f64); counted
     * with the ring model's integer division, as comm.c counts it. */
    if (stage >= 1) bytes += (double)ct_zero_scalar_allreduce_bytes(N);
    return bytes;
}

uint64_t ct_zero_scalar_allreduce_bytes(int N) {
    return N <= 1 ? 0 : 2 * (uint64_t)sizeof(double) * (uint64_t)(N - 1) / (uint64_t)N;
}

/* Elements of this rank's units reduced over the dp group (experts false) or over the experts'
 * group (true). */
static int64_t elems_of(const ct_dp *dp, bool experts) {
    int64_t n = 0;
    for (int u = 0; u < ct_model_n_units(dp->model); u++)
        if (ct_model_unit(dp->model, u)->experts == experts) n += dp->units[u].n;
    return n;
}

void ct_zero_expected_memory_split(int64_t dense, int64_t experts, ct_state_bytes sb, int N,
                                   int N_e, int stage, size_t bytes[CT_MEM_COUNT]) {
    size_t e[CT_MEM_COUNT];
    ct_zero_expected_memory(dense, sb, N, stage, bytes);
    ct_zero_expected_memory(experts, sb, N_e, stage, e);
    for (int c = 0; c < CT_MEM_COUNT; c++) bytes[c] += e[c];
}

double ct_zero_expected_step_bytes_split(int64_t dense, int64_t experts, ct_state_bytes sb, int N,
                                         int N_e, int stage, int m) {
    double bytes = ct_zero_expected_step_bytes(dense, sb, N, stage, m);
    if (N_e == N) /* the experts reduce over the dp group itself: one norm allreduce in all */
        return bytes + ct_zero_expected_step_bytes(experts, sb, N, stage, m) -
               (stage >= 1 ? (double)ct_zero_scalar_allreduce_bytes(N) : 0.0);
    /* their passes over their own group (with no norm allreduce there), and the norm's
     * allreduce on the dp group at every stage (ct_dp_grad_sumsq) */
    bytes += ct_zero_expected_step_bytes(experts, sb, N_e, stage, m) -
             (stage >= 1 ? (double)ct_zero_scalar_allreduce_bytes(N_e) : 0.0);
    if (stage == 0) bytes += (double)ct_zero_scalar_allreduce_bytes(N);
    return bytes;
}

void ct_dp_expected_memory(const ct_dp *dp, size_t bytes[CT_MEM_COUNT]) {
    ct_zero_expected_memory_split(elems_of(dp, false), elems_of(dp, true), ct_dp_state_bytes(dp),
                                  dp->N, dp->edp->size, dp->stage, bytes);
}

double ct_zero_rebracket_bytes(const ct_model *model, ct_state_bytes sb, int N, int stage, int m) {
    double bytes = 0.0;
    for (int u = 0; stage == 3 && N > 1 && u < ct_model_n_units(model); u++) {
        const ct_unit *unit = ct_model_unit(model, u);
        const int extra = ct_model_unit_brackets(model, u) - 1;
        CT_ASSERT(extra == 0 || !unit->experts);
        bytes += 2.0 * m * extra * (double)sb.params * (double)unit->padded_numel * (N - 1) / N;
    }
    return bytes;
}

double ct_dp_expected_step_bytes(const ct_dp *dp, int m) {
    const ct_state_bytes sb = ct_dp_state_bytes(dp);
    return ct_zero_expected_step_bytes_split(elems_of(dp, false), elems_of(dp, true), sb, dp->N,
                                             dp->edp->size, dp->stage, m) +
           ct_zero_rebracket_bytes(dp->model, sb, dp->N, dp->stage, m);
}

double ct_dp_exposed_seconds(const ct_dp *dp) {
    return dp->waits.seconds;
}

void ct_dp_log_events(ct_dp *dp, bool on) {
    dp->logging = on;
    dp->waits.keep = on;
}

void ct_dp_trace(const ct_dp *dp, ct_trace *trace) {
    int n = 0;
    const ct_dp_event *ev = ct_dp_events(dp, &n);
    ct_trace_thread(trace, 0, "compute");
    ct_trace_thread(trace, 1, "dp comm");
    ct_trace_thread(trace, 4, "compute stream waits for dp (exposed)");
    for (int i = 0; i < dp->waits.n_spans; i += 2)
        ct_trace_span(trace, 4, "exposed comm", dp->waits.spans[i], dp->waits.spans[i + 1], -1);
    for (int i = 0; i < n; i++) {
        ct_dp_event_kind end;
        const char *what;
        int tid;
        switch (ev[i].kind) {
        case CT_DP_EVENT_BACKWARD_BEGIN:
            end = CT_DP_EVENT_BACKWARD_END, what = "backward", tid = 0;
            break;
        case CT_DP_EVENT_REDUCE_START:
            end = CT_DP_EVENT_REDUCE_DONE, what = "reduce", tid = 1;
            break;
        case CT_DP_EVENT_GATHER_START:
            end = CT_DP_EVENT_GATHER_DONE, what = "gather", tid = 1;
            break;
        default: continue;
        }
        /* The span ends at the unit's next event of the matching kind. */
        double stop = ev[i].time;
        for (int j = i + 1; j < n; j++)
            if (ev[j].kind == end && ev[j].unit == ev[i].unit) {
                stop = ev[j].time;
                break;
            }
        char name[96];
        snprintf(name, sizeof name, "%s %s", what, ct_model_unit(dp->model, ev[i].unit)->name);
        /* event times count from dp->created; the trace's from ct_now's origin */
        ct_trace_span(trace, tid, name, dp->created + ev[i].time, dp->created + stop,
                      ev[i].microbatch);
    }
}

const ct_dp_event *ct_dp_events(const ct_dp *dp, int *n) {
    *n = dp->settled_events;
    return dp->events;
}

ct_optimizer *ct_dp_optimizer(ct_dp *dp) {
    return dp->opt;
}

int ct_dp_stage(const ct_dp *dp) {
    return dp->stage;
}

void ct_dp_unit_range(const ct_dp *dp, int u, int64_t *lo, int64_t *n) {
    *lo = dp->opt->units[u].lo;
    *n = dp->opt->units[u].n;
}

void ct_dp_unit_state(ct_dp *dp, int u, ct_tensor **weights, ct_tensor **m, ct_tensor **v) {
    const ct_optim_unit *ou = &dp->opt->units[u];
    ct_tensor *params, *grads;
    unit_ranges(dp, u, &params, &grads);
    ct_tensor_free(grads);
    if (ou->master) {
        ct_tensor_free(params);
        *weights = view(ou->master, 0, ou->n);
    } else {
        *weights = params;
    }
    CT_ASSERT((*weights)->numel == ou->n && (*weights)->dtype == CT_DTYPE_F32);
    *m = view(ou->m, 0, ou->n);
    *v = view(ou->v, 0, ou->n);
}

void ct_dp_load_done(ct_dp *dp, int64_t optimizer_step) {
    dp->opt->step = optimizer_step;
    for (int u = 0; u < ct_model_n_units(dp->model); u++) {
        const ct_optim_unit *ou = &dp->opt->units[u];
        if (!ou->master) continue;
        ct_tensor *params, *grads;
        unit_ranges(dp, u, &params, &grads);
        ct_cast(params, ou->master); /* as AdamW writes them after every update */
        ct_tensor_free(params);
        ct_tensor_free(grads);
    }
    gather_updated_params(dp);
}

void ct_dp_unit_params_to_host(ct_dp *dp, int u, float *host) {
    const ct_optim_unit *ou = &dp->opt->units[u];
    if (ou->master) {
        /* bf16 training: the fp32 master weights are the parameters' true values (the bf16
         * ones are their rounding). Sharded at stages >= 1: gather them (host memory). */
        dp_unit *du = &dp->units[u];
        if (dp->stage == 0 || du->N == 1) {
            ct_tensor_to_host(host, ou->master);
            return;
        }
        float *mine = ct_xmalloc((size_t)CT_MAX(1, du->shard_n) * sizeof(float));
        ct_tensor_to_host(mine, ou->master);
        ct_comm_allgather(du->comm, mine, host, du->n, CT_DTYPE_F32);
        free(mine);
        return;
    }
    if (dp->stage < 3) {
        ct_tensor_to_host_f32(host, ct_model_unit(dp->model, u)->params);
        return;
    }
    ensure_gathered(dp, u);
    ct_tensor_to_host_f32(host, ct_model_unit(dp->model, u)->params);
    release_gathered(dp, u);
}
