/*
 * backend_async.c — the asynchronous stream (ct_backend_async_new): a backend whose ops run on a
 * worker thread, after their slot has returned, by another backend's (`inner`'s) slots, in issue
 * order. It exists to prove the ordering rules of backend.h: it runs queued work LAZILY, only when
 * the host demands it, so a caller that reaches tensor memory without the wait the rules require
 * (a collective reading a gradient before the backward that writes it has run) sees stale values
 * every time, not by chance. Results are bit-identical to `inner`'s: the same slots run on the
 * same arguments in the same order.
 *
 * How it works. Every op slot copies its arguments into a command (one small struct per slot
 * kind, in the slot's parameter order) and appends it to a ring of QUEUE_CAP commands; the host
 * structures a slot receives (AdamW's hp and segments, copy_from_host's source) are copied into
 * the command, so the caller may reuse them at once. Commands are numbered in issue order:
 * `issued` have been queued, `done` have run. The host raises `demand` (the worker may run the
 * commands numbered below it) only when it waits:
 *   - event_wait(e):  up to e's marker command, as last recorded (at once if never recorded);
 *   - sync, copy_to_host, free, peak_flops: everything issued;
 *   - a full queue:   everything issued (the only time work runs without a wait in the caller).
 * A wait that must also touch `inner` (its copy_to_host, free, peak_flops, and its own
 * event_wait and sync, for an inner backend that is itself asynchronous) hands the worker one
 * "call", a command run once the demanded point is reached and before anything after it.
 *
 * Invariants:
 *   - the worker never runs ahead: it runs commands only while done < demand, so with one host
 *     thread the host and the worker never run at the same time (the host is blocked in
 *     host_wait whenever the worker works);
 *   - inner's slots run on the worker thread only (one OpenMP pool, and a device backend sees
 *     one calling thread), except alloc and describe, which read no stream state, and
 *     free_backend, after the worker has been joined;
 *   - every shared field is read and written under `lock`; a command is copied out of the ring
 *     under the lock before it runs, so the ring slot may be reused while it runs;
 *   - no busy waiting: the worker sleeps on `work`, the host on `idle` (tests run many ranks on
 *     few cores).
 */
#include "backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { QUEUE_CAP = 4096 }; /* commands queued before the host must flush (~0.5 MiB of ring) */

/* ---- commands ------------------------------------------------------------------------------- */

/* One kind per op of CT_BACKEND_OPS (backend_ops.h), whose argument struct lists the slot's
 * parameters in the slot's order (generated: an op slot fills its struct positionally and the
 * executor hands the fields back in that order), then the kinds written here: the marker, the
 * staged copy from the host, and the calls. Pointers are backend memory, stored as given, unless
 * marked "owned" (freed after the command has run) or "host" (a call's output, valid while the
 * host waits for it); an op whose queue column is CT_OP_HOST owns copies of the host memory it
 * reads (own_<op>, release_<op> below). */
typedef enum cmd_kind {
    /* ops, queued */
    CMD_MARKER = 0, /* event_record: the point an event stands for */
    CMD_MARK,       /* mark: inner's mark, at its place in the stream */
    CMD_COPY_FROM_HOST,
#define CMD_KIND_(name, need, queue, ...) CMD_##name,
    CT_BACKEND_OPS(CMD_KIND_)
#undef CMD_KIND_
    /* calls, run while the host waits (host_wait) */
    CMD_COPY_TO_HOST,
    CMD_FREE,
    CMD_EVENT_WAIT,
    CMD_SYNC,
    CMD_PEAK_FLOPS,
    CMD_MARKS_READ,
} cmd_kind;

#define OP_ARGS_(name, need, queue, ...)                                                           \
    struct name##_args {                                                                           \
        CT_OP_MEMBERS(__VA_ARGS__)                                                                 \
    };
CT_BACKEND_OPS(OP_ARGS_)
#undef OP_ARGS_

struct marker_args {
    int event;
};
struct mark_args {
    int64_t id;
};
struct marks_read_args {
    int64_t n;
    double *times; /* host */
};
struct copy_from_host_args {
    void *dst;
    const void *src;
    size_t bytes;
    void *staged; /* owned: src when it is a copy of the caller's bytes (NULL: src is theirs) */
};
struct copy_to_host_args {
    void *dst; /* host */
    const void *src;
    size_t bytes;
};
struct free_args {
    void *ptr;
};
struct event_wait_args {
    int event;
};
struct peak_flops_args {
    ct_dtype dt;
    char *how; /* host */
    size_t how_cap;
    double *result; /* host */
};

typedef struct cmd {
    cmd_kind kind;
    union {
        struct marker_args marker;
        struct mark_args mark;
        struct copy_from_host_args copy_from_host;
#define OP_MEMBER_(name, need, queue, ...) struct name##_args name;
        CT_BACKEND_OPS(OP_MEMBER_)
#undef OP_MEMBER_
        struct copy_to_host_args copy_to_host;
        struct free_args free;
        struct event_wait_args event_wait;
        struct peak_flops_args peak_flops;
        struct marks_read_args marks_read;
    };
} cmd;

/* The host memory of the CT_OP_HOST ops: own_<op> points the command's fields at copies it owns
 * before the command is queued (the caller may reuse its arrays as soon as the slot returns);
 * release_<op> frees them once the command has run. */
static void own_adamw(struct adamw_args *a) {
    ct_adamw_segment *segments = NULL;
    if (a->n_segments > 0) {
        segments = ct_xmalloc((size_t)a->n_segments * sizeof *segments);
        memcpy(segments, a->segments, (size_t)a->n_segments * sizeof *segments);
    }
    ct_adamw_hparams *hp = ct_xmalloc(sizeof *hp);
    *hp = *a->hp;
    a->segments = segments;
    a->hp = hp;
}

static void release_adamw(struct adamw_args *a) {
    free((void *)a->segments);
    free((void *)a->hp);
}

static void own_gemm_grouped(struct gemm_grouped_args *a) {
    int64_t *mnk = ct_xmalloc((size_t)CT_MAX(a->count, 1) * 3 * sizeof *mnk);
    void **ptrs = ct_xmalloc((size_t)CT_MAX(a->count, 1) * 3 * sizeof *ptrs);
    memcpy(mnk, a->mnk, (size_t)a->count * 3 * sizeof *mnk);
    memcpy(ptrs, a->ptrs, (size_t)a->count * 3 * sizeof *ptrs);
    a->mnk = mnk;
    a->ptrs = ptrs;
}

static void release_gemm_grouped(struct gemm_grouped_args *a) {
    free((void *)a->mnk);
    free((void *)a->ptrs);
}

static void own_sumsq(struct sumsq_args *a) {
    const float **x = ct_xmalloc((size_t)CT_MAX(a->count, 1) * sizeof *x);
    int64_t *n = ct_xmalloc((size_t)CT_MAX(a->count, 1) * sizeof *n);
    memcpy(x, a->x, (size_t)a->count * sizeof *x);
    memcpy(n, a->n, (size_t)a->count * sizeof *n);
    a->x = x;
    a->n = n;
}

static void release_sumsq(struct sumsq_args *a) {
    free((void *)a->x);
    free((void *)a->n);
}

#define OWN_CT_OP_ARGS(name, args)
#define OWN_CT_OP_HOST(name, args) own_##name(args)
#define RELEASE_CT_OP_ARGS(name, args)
#define RELEASE_CT_OP_HOST(name, args) release_##name(args)
#define ARG_FIELD_(type, name) a->name

/* Runs one command by inner's slot, then frees what the command owns. Worker thread only. */
static void cmd_run(ct_backend *inner, cmd *c) {
    const struct ct_backend_i *f = inner->iface;
    void *x = inner->ctx;
    switch (c->kind) {
    case CMD_MARKER:
        if (f->event_record) f->event_record(x, c->marker.event);
        break;
    case CMD_MARK: f->mark(x, c->mark.id); break;
    case CMD_COPY_FROM_HOST: {
        struct copy_from_host_args *a = &c->copy_from_host;
        f->copy_from_host(x, a->dst, a->src, a->bytes);
        free(a->staged);
        break;
    }
#define RUN_OP_(name, need, queue, ...)                                                            \
    case CMD_##name: {                                                                             \
        struct name##_args *a = &c->name;                                                          \
        f->name(x, CT_PP_LIST(ARG_FIELD_, __VA_ARGS__));                                           \
        RELEASE_##queue(name, a);                                                                  \
        break;                                                                                     \
    }
        CT_BACKEND_OPS(RUN_OP_)
#undef RUN_OP_
    case CMD_COPY_TO_HOST: {
        struct copy_to_host_args *a = &c->copy_to_host;
        f->copy_to_host(x, a->dst, a->src, a->bytes);
        break;
    }
    case CMD_FREE: f->free(x, c->free.ptr); break;
    case CMD_EVENT_WAIT:
        if (f->event_wait) f->event_wait(x, c->event_wait.event);
        break;
    case CMD_SYNC:
        if (f->sync) f->sync(x);
        break;
    case CMD_PEAK_FLOPS: {
        struct peak_flops_args *a = &c->peak_flops;
        *a->result = f->peak_flops(x, a->dt, a->how, a->how_cap);
        break;
    }
    case CMD_MARKS_READ: f->marks_read(x, c->marks_read.n, c->marks_read.times); break;
    }
}

/* ---- the stream ------------------------------------------------------------------------------ */

typedef struct async_ctx {
    ct_backend *inner;
    struct ct_backend_i iface; /* this object's table: inner's optional slots decide ours */
    char name[64];             /* "<inner>-async" */

    pthread_t worker;
    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t work;  /* worker sleeps here: demand raised, a call handed over, or stop */
    pthread_cond_t idle;  /* host sleeps here: the demanded point reached, or a call done */

    cmd *ring;       /* QUEUE_CAP commands; command number s lives at ring[s % QUEUE_CAP] */
    uint64_t issued; /* commands queued so far */
    uint64_t done;   /* commands run so far (done <= demand <= issued) */
    uint64_t demand; /* the worker may run commands numbered below this */
    const cmd *call; /* a call to run once done >= demand (NULL: none) */
    bool stop;
    /* Per event, 1 + the number of its last marker command (0: never recorded): waiting for the
     * event means waiting until done reaches this. */
    uint64_t event_end[CT_BACKEND_EVENTS];
} async_ctx;

static void *worker_main(void *arg) {
    async_ctx *a = arg;
    pthread_mutex_lock(&a->lock);
    for (;;) {
        if (a->done < a->demand) {
            cmd c = a->ring[a->done % QUEUE_CAP];
            pthread_mutex_unlock(&a->lock);
            cmd_run(a->inner, &c);
            pthread_mutex_lock(&a->lock);
            a->done++;
            if (a->done == a->demand) pthread_cond_broadcast(&a->idle);
        } else if (a->call) {
            cmd c = *a->call;
            pthread_mutex_unlock(&a->lock);
            cmd_run(a->inner, &c);
            pthread_mutex_lock(&a->lock);
            a->call = NULL;
            pthread_cond_broadcast(&a->idle);
        } else if (a->stop) {
            break;
        } else {
            pthread_cond_wait(&a->work, &a->lock);
        }
    }
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

/* The host's one way to make work run: lets the worker run the commands numbered below `upto`,
 * blocks until they have run, then (if `call` is not NULL) has the worker run `call` and blocks
 * until it has. Called with `lock` held. */
static void host_wait_locked(async_ctx *a, uint64_t upto, const cmd *call) {
    if (upto > a->demand) {
        a->demand = upto;
        pthread_cond_signal(&a->work);
    }
    while (a->done < upto) pthread_cond_wait(&a->idle, &a->lock);
    if (!call) return;
    while (a->call) pthread_cond_wait(&a->idle, &a->lock); /* another host thread's call */
    a->call = call;
    pthread_cond_signal(&a->work);
    while (a->call == call) pthread_cond_wait(&a->idle, &a->lock);
}

/* host_wait_locked up to everything issued so far. */
static void host_wait_all(async_ctx *a, const cmd *call) {
    pthread_mutex_lock(&a->lock);
    host_wait_locked(a, a->issued, call);
    pthread_mutex_unlock(&a->lock);
}

/* Appends a command (flushing the whole queue first when it is full); returns its number.
 * Called with `lock` held. */
static uint64_t enqueue_locked(async_ctx *a, const cmd *c) {
    if (a->issued - a->done == QUEUE_CAP) host_wait_locked(a, a->issued, NULL);
    uint64_t seq = a->issued++;
    a->ring[seq % QUEUE_CAP] = *c;
    return seq;
}

static void enqueue(async_ctx *a, const cmd *c) {
    pthread_mutex_lock(&a->lock);
    enqueue_locked(a, c);
    pthread_mutex_unlock(&a->lock);
}

/* ---- memory and ordering slots ------------------------------------------------------------- */

static void *async_alloc(void *ctx, size_t bytes) {
    async_ctx *a = ctx; /* no ordering needed: new memory is used by no queued op */
    return a->inner->iface->alloc(a->inner->ctx, bytes);
}

static void async_free(void *ctx, void *ptr) {
    host_wait_all(ctx, &(cmd){.kind = CMD_FREE, .free = {ptr}});
}

static void async_copy_from_host(void *ctx, void *dst, const void *src, size_t bytes) {
    void *staged = malloc(bytes ? bytes : 1);
    if (!staged) { /* no room to stage the bytes: copy them now, as a call (same result) */
        host_wait_all(
            ctx, &(cmd){.kind = CMD_COPY_FROM_HOST, .copy_from_host = {dst, src, bytes, NULL}});
        return;
    }
    memcpy(staged, src, bytes);
    enqueue(ctx,
            &(cmd){.kind = CMD_COPY_FROM_HOST, .copy_from_host = {dst, staged, bytes, staged}});
}

static void async_copy_to_host(void *ctx, void *dst, const void *src, size_t bytes) {
    host_wait_all(ctx, &(cmd){.kind = CMD_COPY_TO_HOST, .copy_to_host = {dst, src, bytes}});
}

static void async_event_record(void *ctx, int event) {
    CT_ASSERTF(event >= 0 && event < CT_BACKEND_EVENTS, "event %d outside [0, %d)", event,
               CT_BACKEND_EVENTS);
    async_ctx *a = ctx;
    pthread_mutex_lock(&a->lock);
    a->event_end[event] = enqueue_locked(a, &(cmd){.kind = CMD_MARKER, .marker = {event}}) + 1;
    pthread_mutex_unlock(&a->lock);
}

static void async_event_wait(void *ctx, int event) {
    CT_ASSERTF(event >= 0 && event < CT_BACKEND_EVENTS, "event %d outside [0, %d)", event,
               CT_BACKEND_EVENTS);
    async_ctx *a = ctx;
    pthread_mutex_lock(&a->lock);
    if (a->event_end[event]) {
        cmd inner_wait = {.kind = CMD_EVENT_WAIT, .event_wait = {event}};
        host_wait_locked(a, a->event_end[event], a->inner->iface->event_wait ? &inner_wait : NULL);
    }
    pthread_mutex_unlock(&a->lock);
}

static void async_sync(void *ctx) {
    async_ctx *a = ctx;
    host_wait_all(a, a->inner->iface->sync ? &(cmd){.kind = CMD_SYNC} : NULL);
}

/* The inner backend's clock, when it has one (else these slots are NULL: the host's clock, as
 * backend.h says — this stream runs lazily, so its worker's times would be when the host waited,
 * not when the work could have run). */
static void async_mark(void *ctx, int64_t id) {
    async_ctx *a = ctx;
    pthread_mutex_lock(&a->lock);
    enqueue_locked(a, &(cmd){.kind = CMD_MARK, .mark = {id}});
    pthread_mutex_unlock(&a->lock);
}

static void async_marks_read(void *ctx, int64_t n, double *times) {
    host_wait_all(ctx, &(cmd){.kind = CMD_MARKS_READ, .marks_read = {n, times}});
}

static double async_peak_flops(void *ctx, ct_dtype dt, char *how, size_t how_cap) {
    double result = 0.0;
    host_wait_all(ctx, &(cmd){.kind = CMD_PEAK_FLOPS, .peak_flops = {dt, how, how_cap, &result}});
    return result;
}

static void async_describe(void *ctx, char *buf, size_t cap) {
    async_ctx *a = ctx; /* reads no stream state: inner's configuration only */
    a->inner->iface->describe(a->inner->ctx, buf, cap);
}

static void async_free_backend(void *ctx) {
    async_ctx *a = ctx;
    async_sync(a);
    pthread_mutex_lock(&a->lock);
    a->stop = true;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->lock);
    pthread_join(a->worker, NULL);
    ct_backend_free(a->inner);
    pthread_cond_destroy(&a->idle);
    pthread_cond_destroy(&a->work);
    pthread_mutex_destroy(&a->lock);
    free(a->ring);
    free(a);
}

/* ---- op slots: each queues its arguments and returns ------------------------------------------
 */

#define QUEUE_OP_(name, need, queue, ...)                                                          \
    static void async_##name(void *ctx, CT_OP_PARAMS(__VA_ARGS__)) {                               \
        cmd c = {.kind = CMD_##name, .name = {CT_OP_NAMES(__VA_ARGS__)}};                          \
        OWN_##queue(name, &c.name);                                                                \
        enqueue(ctx, &c);                                                                          \
    }
CT_BACKEND_OPS(QUEUE_OP_)
#undef QUEUE_OP_

/* Every slot; ct_backend_async_new clears those whose inner slot is NULL. */
#define OP_SLOT_(name, need, queue, ...) .name = async_##name,
static const struct ct_backend_i async_template = {
    .name = NULL, /* per object: "<inner>-async" */
    .alloc = async_alloc,
    .free = async_free,
    .copy_from_host = async_copy_from_host,
    .copy_to_host = async_copy_to_host,
    /* always present, whatever inner has: they are this stream's ordering (inner's own, if any,
     * is called from them) */
    .event_record = async_event_record,
    .event_wait = async_event_wait,
    .sync = async_sync,
    .mark = async_mark,
    .marks_read = async_marks_read,
    .peak_flops = async_peak_flops,
    .describe = async_describe,
    .free_backend = async_free_backend,
    /* the ops, from the list */
    CT_BACKEND_OPS(OP_SLOT_)};
#undef OP_SLOT_

ct_backend *ct_backend_async_new(ct_backend *inner) {
    CT_ASSERT(inner != NULL);
    const struct ct_backend_i *in = inner->iface;
    CT_ASSERTF(in->alloc && in->free && in->fill && in->copy_from_host && in->copy_to_host &&
                   in->copy,
               "backend %s lacks a memory slot", in->name);
    async_ctx *a = ct_xcalloc(1, sizeof *a);
    a->inner = inner;
    a->ring = ct_xmalloc(QUEUE_CAP * sizeof *a->ring);
    snprintf(a->name, sizeof a->name, "%s-async", in->name);

    a->iface = async_template;
    a->iface.name = a->name;
#define KEEP_IF_INNER_HAS(slot)                                                                    \
    if (!in->slot) a->iface.slot = NULL
#define KEEP_OP_(name, need, queue, ...) KEEP_IF_INNER_HAS(name);
    CT_BACKEND_OPS(KEEP_OP_)
#undef KEEP_OP_
    KEEP_IF_INNER_HAS(peak_flops);
    KEEP_IF_INNER_HAS(describe);
    KEEP_IF_INNER_HAS(mark);
    KEEP_IF_INNER_HAS(marks_read);
#undef KEEP_IF_INNER_HAS

    CT_ASSERT(pthread_mutex_init(&a->lock, NULL) == 0);
    CT_ASSERT(pthread_cond_init(&a->work, NULL) == 0);
    CT_ASSERT(pthread_cond_init(&a->idle, NULL) == 0);
    int rc = pthread_create(&a->worker, NULL, worker_main, a);
    CT_ASSERTF(rc == 0, "cannot start the asynchronous stream's worker thread (error %d)", rc);

    ct_backend *be = ct_xcalloc(1, sizeof *be);
    be->iface = &a->iface;
    be->ctx = a;
    ct_backend_apply_env(be);
    return be;
}
