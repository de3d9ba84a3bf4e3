/* pipeline.c — the schedule executor (see pipeline.h). */
#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

typedef struct pending_send {
    ct_comm_request *req;
    ct_tensor *buf; /* owned copy (gradients), or NULL when sending from activations */
    int mb;         /* whose activations it reads (-1 for owned copies) */
} pending_send;

struct ct_pipeline {
    ct_model *model;
    ct_dp *dp;
    ct_pctx *pctx;
    ct_schedule *train, *forward_only; /* train is NULL for a forward-only executor */
    int m, n_chunks;
    int tag_cycle; /* microbatches whose messages get distinct tags (see tag_of) */
    int max_tag;   /* the bound choose_tags kept to */
    int64_t B;
    ct_acts **pool; /* free activation contexts, all allocated up front */
    int n_pool, pool_size;
    ct_acts **acts;              /* [m] context of each microbatch in flight, or NULL */
    int *backwards_left;         /* [m] local chunks whose backward (or input part) is to run */
    int *weights_left;           /* [m] split backward: local chunks whose weight part is to run */
    int *forwards_left;          /* [m] local chunks whose forward is still to run (forward-only) */
    ct_pipeline_head_fn head_fn; /* called after each forward of the chunk with the LM head */
    void *head_ctx;
    ct_grad_scratch *scratch;
    pending_send *sends;
    int n_sends, cap_sends;
    ct_tensor **grad_bufs; /* free gradient send buffers (B,Tl,C) */
    /* [m] a gradient this rank sent itself (the turn of the V, zbv: chunks pp−1 and pp are both
     * the last rank's), held until its receive; transfers to oneself are copies, never messages
     * (NCCL does not pair a lone send and receive with oneself) */
    ct_tensor **self_grad;
    int n_grad_bufs;
    int32_t *host_tokens, *host_targets;
    int inflight, peak_inflight;
    ct_waits waits; /* the compute stream's waits for the other stages (seconds: this run's) */
    /* log.trace: each compute action's span on the stream's clock (work.spans), and what it
     * was (labels, in the same order) */
    ct_waits work;
    ct_action *labels;
    int n_labels, cap_labels;
    int costs_from; /* the first span ct_pipeline_chunk_costs has not read */
    bool keep_work; /* log.trace: every span kept for the trace (else read spans are dropped) */
};

/* For tests: a tag bound below the communicator's, so the wrapping of tags is exercised. */
static int tag_bound_for_tests;

void ct_pipeline_set_tag_bound_for_tests(int max_tag) {
    tag_bound_for_tests = max_tag;
}

/*
 * Tags: a message is named by (microbatch, boundary, direction), tag ((mb mod K)·n_chunks +
 * lower chunk)·2 + (gradient?). MPI only promises tags up to 32767 (MPI_TAG_UB; Open MPI's ob1
 * allows INT_MAX, other transports less), so K — the microbatches whose messages get distinct
 * tags — is as many as fit. When K < m, messages of different microbatches share a tag on one
 * channel, which is safe because MPI matches same-source, same-tag messages in send order to
 * receives in posting order, and every schedule sends each channel's microbatches in the order
 * its receiver receives them (ct_schedule_channels_in_order, checked here).
 */
static ct_status choose_tags(ct_pipeline *p) {
    int max_tag = ct_comm_max_tag(p->pctx->pp_comm);
    if (tag_bound_for_tests > 0) max_tag = CT_MIN(max_tag, tag_bound_for_tests);
    const int64_t per_mb = 2 * (int64_t)p->n_chunks;
    if (per_mb - 1 > max_tag) {
        ct_error(CT_ERR_INPUT,
                 "a pipeline of %d chunks needs %lld message tags, but MPI allows tags up to %d",
                 p->n_chunks, (long long)per_mb, max_tag);
        ct_hint("use fewer pipeline chunks (parallel.pp x parallel.virtual_stages)");
        return CT_ERR_INPUT;
    }
    p->max_tag = max_tag;
    p->tag_cycle = (int)CT_MIN((int64_t)p->m, ((int64_t)max_tag + 1) / per_mb);
    char why[256];
    const ct_schedule *lists[] = {p->train, p->forward_only};
    for (int i = 0; i < 2 && p->tag_cycle < p->m; i++)
        CT_ASSERTF(!lists[i] || ct_schedule_channels_in_order(lists[i], why, sizeof why),
                   "tags repeat every %d microbatches, but a channel is out of order: %s",
                   p->tag_cycle, why);
    return CT_OK;
}

/* The executor around a training schedule (taken over; NULL for a forward-only executor). */
static ct_status pipeline_make(ct_pipeline **out, ct_model *model, ct_dp *dp, ct_pctx *pctx,
                               ct_schedule *train, int m, int64_t B) {
    *out = NULL;
    ct_pipeline *p = ct_xcalloc(1, sizeof *p);
    p->model = model;
    p->dp = dp;
    p->pctx = pctx;
    p->m = m;
    p->B = B;
    p->train = train;
    /* activations and their gradients travel between stages: the model's memory */
    if (pctx->pp_comm) ct_comm_set_stream(pctx->pp_comm, ct_model_backend(model));
    if (pctx->embed_comm) ct_comm_set_stream(pctx->embed_comm, ct_model_backend(model));
    int v = ct_model_layout_of(model)->n_chunks;
    p->n_chunks = pctx->pp * v;
    p->forward_only = ct_model_layout_of(model)->v_shape
                          ? ct_schedule_new_forward_only_v(pctx->pp, m)
                          : ct_schedule_new(CT_SCHEDULE_FORWARD_ONLY, pctx->pp, v, m);
    ct_status tags = p->forward_only ? choose_tags(p) : CT_ERR_INPUT;
    if (tags != CT_OK) {
        ct_pipeline_free(p);
        return tags;
    }
    p->acts = ct_xcalloc((size_t)m, sizeof *p->acts);
    p->backwards_left = ct_xcalloc((size_t)m, sizeof(int));
    p->weights_left = ct_xcalloc((size_t)m, sizeof(int));
    p->self_grad = ct_xcalloc((size_t)m, sizeof *p->self_grad);
    p->forwards_left = ct_xcalloc((size_t)m, sizeof(int));
    /* At most one owned gradient buffer per backward action can be in flight. */
    p->grad_bufs = ct_xcalloc((size_t)m * (size_t)v + 1, sizeof *p->grad_bufs);
    const int64_t T = ct_model_seq_len(model);
    p->host_tokens = ct_xmalloc((size_t)(B * T) * sizeof(int32_t));
    p->host_targets = ct_xmalloc((size_t)(B * T) * sizeof(int32_t));
    /* Activation contexts: as many as the training schedule holds at once on this rank (the
     * simulator's peak, which the executor meets exactly), all allocated now so that running
     * out of memory is a start-up error with a message rather than a failure mid-step. The
     * forward-only schedule reuses them (it frees a context once its forwards here are done). */
    p->pool_size = 1;
    if (p->train) {
        ct_sim_result sim = ct_schedule_simulate(p->train, 2.0);
        CT_ASSERTF(!sim.deadlock && sim.order_ok, "the training schedule is not runnable: %s",
                   sim.deadlock ? "it deadlocks" : sim.order_msg);
        p->pool_size = CT_MAX(1, sim.peak_inflight_mb[pctx->pp_rank]);
        ct_sim_result_release(&sim);
    }
    p->pool = ct_xcalloc((size_t)p->pool_size, sizeof *p->pool);
    ct_status st = CT_OK;
    for (int i = 0; i < p->pool_size && st == CT_OK; i++) {
        st = ct_acts_new(&p->pool[i], model, B);
        if (st == CT_OK) p->n_pool++;
    }
    if (st == CT_OK && p->train) st = ct_grad_scratch_new(&p->scratch, model, B);
    if (st != CT_OK) {
        ct_pipeline_free(p);
        return st;
    }
    *out = p;
    return CT_OK;
}

ct_status ct_pipeline_new(ct_pipeline **out, ct_model *model, ct_dp *dp, ct_pctx *pctx,
                          ct_schedule_kind kind, int m, int64_t B) {
    *out = NULL;
    ct_schedule *train = NULL;
    if (kind != CT_SCHEDULE_FORWARD_ONLY) {
        train = ct_schedule_new(kind, pctx->pp, ct_model_layout_of(model)->n_chunks, m);
        if (!train) return CT_ERR_INPUT;
    }
    return pipeline_make(out, model, dp, pctx, train, m, B);
}

ct_status ct_pipeline_new_from_schedule(ct_pipeline **out, ct_model *model, ct_dp *dp,
                                        ct_pctx *pctx, ct_schedule *schedule, int64_t B) {
    const int v = ct_model_layout_of(model)->n_chunks;
    CT_ASSERTF(schedule->pp == pctx->pp && schedule->v == v,
               "schedule for pp=%d v=%d on pp=%d v=%d", schedule->pp, schedule->v, pctx->pp, v);
    return pipeline_make(out, model, dp, pctx, schedule, schedule->m, B);
}

void ct_pipeline_set_head_fn(ct_pipeline *p, ct_pipeline_head_fn fn, void *ctx) {
    p->head_fn = fn;
    p->head_ctx = ctx;
}

static void wait_sends(ct_pipeline *p, int mb);
static void release_acts(ct_pipeline *p, int mb);

void ct_pipeline_free(ct_pipeline *p) {
    if (!p) return;
    wait_sends(p, -2);
    ct_comm_unset_stream(p->pctx->pp_comm, ct_model_backend(p->model));
    ct_comm_unset_stream(p->pctx->embed_comm, ct_model_backend(p->model));
    for (int i = 0; i < p->n_pool; i++) ct_acts_free(p->pool[i]);
    for (int i = 0; p->acts && i < p->m; i++) ct_acts_free(p->acts[i]);
    for (int i = 0; i < p->n_grad_bufs; i++) ct_tensor_free(p->grad_bufs[i]);
    ct_grad_scratch_free(p->scratch);
    ct_schedule_free(p->train);
    ct_schedule_free(p->forward_only);
    free(p->pool);
    free(p->acts);
    free(p->backwards_left);
    free(p->weights_left);
    for (int i = 0; p->self_grad && i < p->m; i++) ct_tensor_free(p->self_grad[i]);
    free(p->self_grad);
    free(p->forwards_left);
    free(p->grad_bufs);
    free(p->sends);
    ct_waits_release(&p->waits);
    ct_waits_release(&p->work);
    free(p->labels);
    free(p->host_tokens);
    free(p->host_targets);
    free(p);
}

/* ---- helpers ------------------------------------------------------------------------------- */

static int local_chunk(const ct_pipeline *p, int chunk) {
    return chunk / p->pctx->pp;
}

/* Tag of the message crossing the boundary between chunks `lower` and lower + 1. */
static int tag_of(const ct_pipeline *p, int mb, int lower, bool grad) {
    int tag = ((mb % p->tag_cycle) * p->n_chunks + lower) * 2 + (grad ? 1 : 0); /* choose_tags */
    CT_ASSERTF(tag >= 0 && tag <= p->max_tag, "pipeline tag %d outside [0, %d]", tag, p->max_tag);
    return tag;
}

static void poll_all(ct_pipeline *p) {
    ct_comm_poll(p->pctx->pp_comm);
    ct_comm_poll(p->pctx->dpcp_comm);
}

/* Waits for a request, counting the time as pipeline waiting (bubble and transfer): what the
 * compute stream waits, between a mark before and one after (read at ct_pipeline_settle). */
static void timed_wait(ct_pipeline *p, ct_comm_request *req) {
    ct_backend *be = ct_model_backend(p->model);
    int64_t before = ct_backend_mark(be);
    ct_comm_wait(p->pctx->pp_comm, req);
    ct_waits_end(&p->waits, be, before);
}

void ct_pipeline_settle(ct_pipeline *p) {
    ct_waits_settle(&p->waits, ct_model_backend(p->model));
    ct_waits_settle(&p->work, ct_model_backend(p->model));
}

void ct_pipeline_log_waits(ct_pipeline *p, bool on) {
    p->waits.keep = on;
    p->work.keep = p->keep_work = on;
}

void ct_pipeline_time_actions(ct_pipeline *p, bool on) {
    p->work.keep = on || p->keep_work;
}

int ct_pipeline_chunk_costs(ct_pipeline *p, ct_sim_costs *costs) {
    const ct_model_layout *layout = ct_model_layout_of(p->model);
    int n[CT_MAX_CHUNKS][3] = {{0}}, runs = 0;
    for (int j = 0; j < layout->n_chunks; j++) costs[j] = (ct_sim_costs){0};
    for (int i = p->costs_from; i < p->work.n_spans / 2; i++) {
        const ct_action *a = &p->labels[i];
        const double dt = p->work.spans[2 * i + 1] - p->work.spans[2 * i];
        ct_sim_costs *c = &costs[local_chunk(p, a->chunk)];
        int *k = n[local_chunk(p, a->chunk)];
        switch (a->kind) {
        case CT_ACTION_FORWARD: c->f += dt, k[0]++; break;
        case CT_ACTION_BACKWARD_INPUT: c->b += dt, k[1]++; break;
        case CT_ACTION_BACKWARD_WEIGHT: c->w += dt, k[2]++; break;
        default: c->b += dt / 2, c->w += dt / 2, k[1]++, k[2]++; break; /* a whole one: halves */
        }
    }
    for (int j = 0; j < layout->n_chunks; j++) {
        costs[j].f /= CT_MAX(1, n[j][0]), costs[j].b /= CT_MAX(1, n[j][1]);
        costs[j].w /= CT_MAX(1, n[j][2]);
        runs = CT_MAX(runs, n[j][0]);
    }
    p->costs_from = p->work.n_spans / 2;
    if (!p->keep_work) p->work.n_spans = p->n_labels = p->costs_from = 0;
    return runs;
}

/* log.trace: the end of compute action `act`, begun at mark `before` (ct_backend_mark). */
static void work_done(ct_pipeline *p, const ct_action *act, int64_t before) {
    if (!p->work.keep) return;
    ct_waits_end(&p->work, ct_model_backend(p->model), before);
    if (p->n_labels == p->cap_labels) {
        p->cap_labels = p->cap_labels ? 2 * p->cap_labels : 64;
        p->labels = realloc(p->labels, (size_t)p->cap_labels * sizeof *p->labels);
        CT_ASSERT(p->labels != NULL);
    }
    p->labels[p->n_labels++] = *act;
}

void ct_pipeline_trace(const ct_pipeline *p, ct_trace *trace) {
    ct_trace_thread(trace, 5, "compute stream waits for pp (bubble)");
    for (int i = 0; i < p->waits.n_spans; i += 2)
        ct_trace_span(trace, 5, "pipeline wait", p->waits.spans[i], p->waits.spans[i + 1], -1);
    ct_trace_thread(trace, 6, "pipeline actions");
    CT_ASSERT(p->work.n_spans == 2 * p->n_labels || !p->work.keep);
    for (int i = 0; i < p->work.n_spans / 2; i++) {
        const ct_action *a = &p->labels[i];
        const char *kind = a->kind == CT_ACTION_FORWARD           ? "F"
                           : a->kind == CT_ACTION_BACKWARD_INPUT  ? "B"
                           : a->kind == CT_ACTION_BACKWARD_WEIGHT ? "W"
                                                                  : "BW";
        char name[48];
        snprintf(name, sizeof name, "%s %d:%d", kind, a->mb, a->chunk);
        ct_trace_span(trace, 6, name, p->work.spans[2 * i], p->work.spans[2 * i + 1], -1);
    }
}

/* Completes sends that read microbatch mb's activations (mb = -1: owned buffers whose request
 * has finished; mb = -2: everything). */
static void wait_sends(ct_pipeline *p, int mb) {
    int keep = 0;
    for (int i = 0; i < p->n_sends; i++) {
        pending_send *s = &p->sends[i];
        bool wait = mb == -2 || (mb >= 0 && s->mb == mb) ||
                    (mb == -1 && ct_comm_test(p->pctx->pp_comm, s->req));
        if (!wait) {
            p->sends[keep++] = *s;
            continue;
        }
        timed_wait(p, s->req);
        if (s->buf) p->grad_bufs[p->n_grad_bufs++] = s->buf;
    }
    p->n_sends = keep;
}

static void track_send(ct_pipeline *p, ct_comm_request *req, ct_tensor *buf, int mb) {
    if (p->n_sends == p->cap_sends) {
        p->cap_sends = p->cap_sends ? 2 * p->cap_sends : 16;
        p->sends = realloc(p->sends, (size_t)p->cap_sends * sizeof *p->sends);
        CT_ASSERT(p->sends != NULL);
    }
    p->sends[p->n_sends++] = (pending_send){.req = req, .buf = buf, .mb = mb};
}

/* Forward-only: frees the context of a microbatch whose forwards here are all done (the oldest
 * such one), once the sends that read it complete. */
static bool release_finished_forward(ct_pipeline *p) {
    for (int mb = 0; mb < p->m; mb++) {
        if (p->acts[mb] && p->forwards_left[mb] == 0) {
            release_acts(p, mb);
            return true;
        }
    }
    return false;
}

/* The activation context of microbatch mb, taken from the pool on first use. */
static ct_acts *acts_for(ct_pipeline *p, int mb, ct_batch_fn fill, void *ctx, bool train) {
    if (p->acts[mb]) return p->acts[mb];
    if (p->n_pool == 0 && !train) release_finished_forward(p);
    /* Training holds at most the simulated peak, which is the pool's size (pipeline.h). */
    CT_ASSERTF(p->n_pool > 0, "pipeline rank %d: more than %d activation contexts in flight",
               p->pctx->pp_rank, p->pool_size);
    ct_acts *a = p->pool[--p->n_pool];
    fill(ctx, mb, p->host_tokens, p->host_targets);
    ct_acts_set_batch(a, mb, p->host_tokens, p->host_targets);
    p->acts[mb] = a;
    const int here = ct_model_layout_of(p->model)->n_chunks;
    p->backwards_left[mb] = train ? here : 0;
    p->weights_left[mb] = train && ct_schedule_splits_backward(p->train->kind) ? here : 0;
    p->forwards_left[mb] = here;
    p->inflight++;
    p->peak_inflight = CT_MAX(p->peak_inflight, p->inflight);
    return a;
}

/* Out of memory in the middle of a step: one rank cannot agree with the others, which are busy
 * in the schedule, so the job ends here (exit 1) with the rank and the allocation named. */
__attribute__((noreturn)) static void fail_out_of_memory(ct_pipeline *p, const char *what) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ct_error_message());
    ct_error(CT_ERR_RUNTIME, "rank %d (pipeline stage %d), %s: %s", p->pctx->world_rank,
             p->pctx->pp_rank, what, msg);
    ct_mpi_abort(1);
}

/* Gives microbatch mb's context back to the pool; sends that read it must have completed. */
static void release_acts(ct_pipeline *p, int mb) {
    wait_sends(p, mb);
    p->pool[p->n_pool++] = p->acts[mb];
    p->acts[mb] = NULL;
    p->inflight--;
}

/* ---- the executor --------------------------------------------------------------------------- */

double ct_pipeline_run(ct_pipeline *p, bool train, float dloss, ct_batch_fn fill, void *ctx) {
    CT_ASSERTF(!train || p->train, "a forward-only pipeline cannot train");
    const ct_schedule *s = train ? p->train : p->forward_only;
    const int r = p->pctx->pp_rank;
    ct_comm *pp = p->pctx->pp_comm;
    ct_model *m = p->model;
    ct_backend *be = ct_model_backend(m);
    const ct_model_layout *layout = ct_model_layout_of(m);
    ct_model_begin_losses(m, s->m, p->B);
    p->waits.seconds = 0.0;
    p->waits.n_marks = 0; /* a run's waits are its own; the last run's were read or are unwanted */
    p->peak_inflight = 0;
    for (int i = 0; i < s->n_actions[r]; i++) {
        const ct_action *act = &s->actions[r][i];
        const int mb = act->mb, j = local_chunk(p, act->chunk);
        switch (act->kind) {
        case CT_ACTION_RECV_ACT: {
            ct_tensor *in = ct_acts_chunk_input(acts_for(p, mb, fill, ctx, train), j);
            if (act->peer == r) { /* the previous chunk is this rank's too */
                const ct_tensor *out =
                    ct_acts_chunk_output(p->acts[mb], local_chunk(p, act->chunk - 1));
                if (out->data != in->data) ct_tensor_copy(in, out);
                break;
            }
            ct_comm_request *req = ct_comm_irecv(pp, in->data, in->numel, in->dtype, act->peer,
                                                 tag_of(p, mb, act->chunk - 1, false));
            timed_wait(p, req);
            break;
        }
        case CT_ACTION_FORWARD: {
            ct_acts *a = acts_for(p, mb, fill, ctx, train);
            ct_dp_begin_microbatch(p->dp, mb);
            const int64_t before = p->work.keep && train ? ct_backend_mark(be) : 0;
            ct_model_forward_chunk(m, j, a, train ? dloss : 0.0f);
            if (p->work.keep && train) work_done(p, act, before);
            if (layout->chunks[j].has_head && p->head_fn) p->head_fn(p->head_ctx, mb, a);
            /* Forward-only: the context is free once its last forward here is done and its
             * send completes; taken back when the pool runs dry (release_finished_forward). */
            p->forwards_left[mb]--;
            break;
        }
        case CT_ACTION_SEND_ACT: {
            if (act->peer == r) break; /* RECV_ACT copies it from the activations */
            ct_tensor *o = ct_acts_chunk_output(p->acts[mb], j);
            ct_comm_request *req = ct_comm_isend(pp, o->data, o->numel, o->dtype, act->peer,
                                                 tag_of(p, mb, act->chunk, false));
            track_send(p, req, NULL, mb);
            break;
        }
        case CT_ACTION_RECV_GRAD: {
            ct_tensor *dres = ct_grad_scratch_dres(p->scratch);
            if (act->peer == r) { /* sent by this rank's next chunk */
                CT_ASSERT(p->self_grad[mb]);
                ct_tensor_copy(dres, p->self_grad[mb]);
                p->grad_bufs[p->n_grad_bufs++] = p->self_grad[mb];
                p->self_grad[mb] = NULL;
                break;
            }
            ct_comm_request *req = ct_comm_irecv(pp, dres->data, dres->numel, dres->dtype,
                                                 act->peer, tag_of(p, mb, act->chunk, true));
            timed_wait(p, req);
            break;
        }
        case CT_ACTION_BACKWARD:
        case CT_ACTION_BACKWARD_INPUT: {
            ct_dp_begin_microbatch(p->dp, mb);
            const int64_t before = p->work.keep ? ct_backend_mark(be) : 0;
            if (act->kind == CT_ACTION_BACKWARD)
                ct_model_backward_chunk(m, j, p->acts[mb], p->scratch);
            else
                ct_model_backward_input(m, j, p->acts[mb], p->scratch);
            work_done(p, act, before);
            /* The first chunk sends nothing back: its last backward frees the context now;
             * elsewhere SEND_GRAD follows and frees it. Weight parts still to run keep it. */
            if (--p->backwards_left[mb] == 0 && act->chunk == 0 && p->weights_left[mb] == 0)
                release_acts(p, mb);
            break;
        }
        case CT_ACTION_BACKWARD_WEIGHT: {
            ct_dp_begin_microbatch(p->dp, mb);
            const int64_t before = p->work.keep ? ct_backend_mark(be) : 0;
            ct_model_backward_weight(m, j, p->acts[mb]);
            work_done(p, act, before);
            if (--p->weights_left[mb] == 0 && p->backwards_left[mb] == 0) release_acts(p, mb);
            break;
        }
        case CT_ACTION_SEND_GRAD: {
            /* Backward's scratch is reused by the next backward: send a copy. */
            wait_sends(p, -1);
            const ct_tensor *dres = ct_grad_scratch_dres(p->scratch);
            ct_tensor *buf = p->n_grad_bufs > 0 ? p->grad_bufs[--p->n_grad_bufs] : NULL;
            if (!buf) {
                buf = ct_tensor_new(ct_model_backend(m), dres->dtype, 3, dres->shape, CT_MEM_COMM);
                if (!buf) fail_out_of_memory(p, "a gradient send buffer");
            }
            ct_tensor_copy(buf, dres);
            if (act->peer == r) {
                CT_ASSERT(!p->self_grad[mb]);
                p->self_grad[mb] = buf;
            } else {
                ct_comm_request *req =
                    ct_comm_isend(pp, buf->data, buf->numel, buf->dtype, act->peer,
                                  tag_of(p, mb, act->chunk - 1, true));
                track_send(p, req, buf, -1);
            }
            if (p->backwards_left[mb] == 0 && p->weights_left[mb] == 0) release_acts(p, mb);
            break;
        }
        }
        poll_all(p);
    }
    wait_sends(p, -2);
    for (int mb = 0; mb < p->m; mb++)
        if (p->acts[mb]) release_acts(p, mb);
    return ct_model_loss_sum(m); /* the run's one copy of its loss to the host */
}

double ct_pipeline_wait_seconds(const ct_pipeline *p) {
    return p->waits.seconds;
}
int ct_pipeline_peak_inflight(const ct_pipeline *p) {
    return p->peak_inflight;
}
const ct_schedule *ct_pipeline_schedule(const ct_pipeline *p) {
    return p->train;
}
