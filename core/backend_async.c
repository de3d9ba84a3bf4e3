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

/* One kind per slot; the argument structs below list the slot's parameters in the slot's order,
 * so an op slot fills its struct positionally and the executor hands the fields back in that
 * order. Pointers are backend memory, stored as given, unless marked "owned" (freed after the
 * command has run) or "host" (a call's output, valid while the host waits for it). */
typedef enum cmd_kind {
    /* ops, queued */
    CMD_MARKER = 0, /* event_record: the point an event stands for */
    CMD_FILL,
    CMD_COPY_FROM_HOST,
    CMD_COPY,
    CMD_GEMM,
    CMD_GEMM_BIAS_GELU,
    CMD_BIAS_ADD,
    CMD_BIAS_INIT,
    CMD_BIAS_GRAD,
    CMD_AXPY,
    CMD_SCALE,
    CMD_EMBEDDING_FWD,
    CMD_EMBEDDING_BWD,
    CMD_POSEMB_FWD,
    CMD_POSEMB_BWD,
    CMD_LAYERNORM_FWD,
    CMD_LAYERNORM_BWD,
    CMD_GELU_FWD,
    CMD_GELU_BWD,
    CMD_ATTENTION_FWD,
    CMD_ATTENTION_BWD,
    CMD_XENT_ROWMAX,
    CMD_XENT_SUMEXP,
    CMD_XENT_FINISH,
    CMD_ADAMW,
    CMD_SUMSQ,
    CMD_CAST,
    /* calls, run while the host waits (host_wait) */
    CMD_COPY_TO_HOST,
    CMD_FREE,
    CMD_EVENT_WAIT,
    CMD_SYNC,
    CMD_PEAK_FLOPS,
} cmd_kind;

struct marker_args {
    int event;
};
struct fill_args {
    void *dst;
    ct_dtype dtype;
    int64_t n;
    float value;
};
struct copy_from_host_args {
    void *dst;
    const void *src;
    size_t bytes;
    void *staged; /* owned: src when it is a copy of the caller's bytes (NULL: src is theirs) */
};
struct copy_args {
    void *dst;
    const void *src;
    size_t bytes;
};
struct gemm_args {
    bool trans_a, trans_b;
    int64_t M, N, K;
    float alpha;
    const void *A;
    int64_t lda;
    const void *B;
    int64_t ldb;
    float beta;
    void *C;
    int64_t ldc;
    ct_dtype ab_dtype, c_dtype;
};
struct gemm_bias_gelu_args {
    int64_t M, N, K;
    const void *A;
    int64_t lda;
    const void *B;
    int64_t ldb;
    const void *bias;
    void *pre;
    int64_t ldpre;
    void *out;
    int64_t ldout;
    ct_dtype dt;
};
struct bias_add_args {
    ct_dtype dt;
    void *out;
    const void *bias;
    int64_t N, C;
};
struct bias_init_args {
    ct_dtype dt;
    void *out;
    const void *bias, *residual;
    int64_t N, C;
};
struct bias_grad_args {
    ct_dtype dt;
    float *dbias;
    const void *dout;
    int64_t N, C;
};
struct axpy_args {
    ct_dtype dt;
    void *dst;
    const void *src;
    float alpha;
    int64_t n;
};
struct scale_args {
    ct_dtype dt;
    void *x;
    float s;
    int64_t n;
};
struct embedding_fwd_args {
    ct_dtype dt;
    void *out;
    const int32_t *tokens;
    const void *table;
    int64_t N, C, rows, row_offset;
};
struct embedding_bwd_args {
    ct_dtype dt;
    float *dtable;
    const void *dout;
    const int32_t *tokens;
    int64_t N, C, rows, row_offset;
};
struct posemb_fwd_args {
    ct_dtype dt;
    void *out;
    const void *wpe;
    int64_t B, T, C, pos_offset;
};
struct posemb_bwd_args {
    ct_dtype dt;
    float *dwpe;
    const void *dout;
    int64_t B, T, C, pos_offset;
};
struct layernorm_fwd_args {
    ct_dtype dt;
    void *out;
    float *mean, *rstd;
    const void *inp, *w, *b;
    int64_t N, C;
};
struct layernorm_bwd_args {
    ct_dtype dt;
    void *dinp;
    float *dw, *db;
    const void *dout, *inp, *w;
    const float *mean, *rstd;
    int64_t N, C;
};
struct gelu_fwd_args {
    ct_dtype dt;
    void *out;
    const void *inp;
    int64_t n;
};
struct gelu_bwd_args {
    ct_dtype dt;
    void *dinp;
    float *dbias;
    const void *inp, *dout;
    int64_t N, C;
};
struct attention_fwd_args {
    ct_dtype dt;
    void *out;
    float *lse;
    const void *qkv;
    int64_t B, T, n_head, n_kv_head, head_dim;
};
struct attention_bwd_args {
    ct_dtype dt;
    void *dqkv;
    float *dbias;
    const void *dout, *qkv, *out;
    const float *lse;
    int64_t B, T, n_head, n_kv_head, head_dim;
};
struct xent_rowmax_args {
    ct_dtype dt;
    float *rowmax;
    const void *logits;
    int64_t N, V, n_valid;
};
struct xent_sumexp_args {
    ct_dtype dt;
    float *sumexp, *target_logit;
    void *logits;
    const int32_t *targets;
    const float *rowmax;
    int64_t N, V, n_valid, col_offset;
    bool keep_exp;
};
struct xent_finish_args {
    ct_dtype dt;
    float *losses;
    void *logits_to_grad;
    const int32_t *targets;
    const float *rowmax, *sumexp, *target_logit;
    int64_t N, V, n_valid, col_offset;
    float dloss;
    bool write_grad;
};
struct adamw_args {
    float *param;
    const float *grad;
    float *m, *v;
    ct_adamw_segment *segments; /* owned copy */
    int n_segments;
    ct_adamw_hparams hp; /* by value */
    void *param_copy;
    ct_dtype copy_dtype;
};
struct sumsq_args {
    float *out;
    const float **x; /* owned copy */
    int64_t *n;      /* owned copy */
    int count;
};
struct cast_args {
    void *dst;
    ct_dtype dst_dtype;
    const void *src;
    ct_dtype src_dtype;
    int64_t n;
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
        struct fill_args fill;
        struct copy_from_host_args copy_from_host;
        struct copy_args copy;
        struct gemm_args gemm;
        struct gemm_bias_gelu_args gemm_bias_gelu;
        struct bias_add_args bias_add;
        struct bias_init_args bias_init;
        struct bias_grad_args bias_grad;
        struct axpy_args axpy;
        struct scale_args scale;
        struct embedding_fwd_args embedding_fwd;
        struct embedding_bwd_args embedding_bwd;
        struct posemb_fwd_args posemb_fwd;
        struct posemb_bwd_args posemb_bwd;
        struct layernorm_fwd_args layernorm_fwd;
        struct layernorm_bwd_args layernorm_bwd;
        struct gelu_fwd_args gelu_fwd;
        struct gelu_bwd_args gelu_bwd;
        struct attention_fwd_args attention_fwd;
        struct attention_bwd_args attention_bwd;
        struct xent_rowmax_args xent_rowmax;
        struct xent_sumexp_args xent_sumexp;
        struct xent_finish_args xent_finish;
        struct adamw_args adamw;
        struct sumsq_args sumsq;
        struct cast_args cast;
        struct copy_to_host_args copy_to_host;
        struct free_args free;
        struct event_wait_args event_wait;
        struct peak_flops_args peak_flops;
    };
} cmd;

/* Runs a queued op that marks the stream or moves memory. Worker thread only. */
static void run_stream_op(const struct ct_backend_i *f, void *x, cmd *c) {
    switch (c->kind) {
    case CMD_MARKER:
        if (f->event_record) f->event_record(x, c->marker.event);
        break;
    case CMD_FILL: {
        struct fill_args *a = &c->fill;
        f->fill(x, a->dst, a->dtype, a->n, a->value);
        break;
    }
    case CMD_COPY_FROM_HOST: {
        struct copy_from_host_args *a = &c->copy_from_host;
        f->copy_from_host(x, a->dst, a->src, a->bytes);
        free(a->staged);
        break;
    }
    case CMD_COPY: {
        struct copy_args *a = &c->copy;
        f->copy(x, a->dst, a->src, a->bytes);
        break;
    }
    case CMD_CAST: {
        struct cast_args *a = &c->cast;
        f->cast(x, a->dst, a->dst_dtype, a->src, a->src_dtype, a->n);
        break;
    }
    default: CT_ASSERTF(false, "command kind %d sent to run_stream_op", (int)c->kind);
    }
}

/* Runs a queued GEMM, bias or vector op. Worker thread only. */
static void run_linear_op(const struct ct_backend_i *f, void *x, cmd *c) {
    switch (c->kind) {
    case CMD_GEMM: {
        struct gemm_args *a = &c->gemm;
        f->gemm(x, a->trans_a, a->trans_b, a->M, a->N, a->K, a->alpha, a->A, a->lda, a->B, a->ldb,
                a->beta, a->C, a->ldc, a->ab_dtype, a->c_dtype);
        break;
    }
    case CMD_GEMM_BIAS_GELU: {
        struct gemm_bias_gelu_args *a = &c->gemm_bias_gelu;
        f->gemm_bias_gelu(x, a->M, a->N, a->K, a->A, a->lda, a->B, a->ldb, a->bias, a->pre,
                          a->ldpre, a->out, a->ldout, a->dt);
        break;
    }
    case CMD_BIAS_ADD: {
        struct bias_add_args *a = &c->bias_add;
        f->bias_add(x, a->dt, a->out, a->bias, a->N, a->C);
        break;
    }
    case CMD_BIAS_INIT: {
        struct bias_init_args *a = &c->bias_init;
        f->bias_init(x, a->dt, a->out, a->bias, a->residual, a->N, a->C);
        break;
    }
    case CMD_BIAS_GRAD: {
        struct bias_grad_args *a = &c->bias_grad;
        f->bias_grad(x, a->dt, a->dbias, a->dout, a->N, a->C);
        break;
    }
    case CMD_AXPY: {
        struct axpy_args *a = &c->axpy;
        f->axpy(x, a->dt, a->dst, a->src, a->alpha, a->n);
        break;
    }
    case CMD_SCALE: {
        struct scale_args *a = &c->scale;
        f->scale(x, a->dt, a->x, a->s, a->n);
        break;
    }
    default: CT_ASSERTF(false, "command kind %d sent to run_linear_op", (int)c->kind);
    }
}

/* Runs a queued forward or backward op of a model layer. Worker thread only. */
static void run_layer_op(const struct ct_backend_i *f, void *x, cmd *c) {
    switch (c->kind) {
    case CMD_EMBEDDING_FWD: {
        struct embedding_fwd_args *a = &c->embedding_fwd;
        f->embedding_fwd(x, a->dt, a->out, a->tokens, a->table, a->N, a->C, a->rows, a->row_offset);
        break;
    }
    case CMD_EMBEDDING_BWD: {
        struct embedding_bwd_args *a = &c->embedding_bwd;
        f->embedding_bwd(x, a->dt, a->dtable, a->dout, a->tokens, a->N, a->C, a->rows,
                         a->row_offset);
        break;
    }
    case CMD_POSEMB_FWD: {
        struct posemb_fwd_args *a = &c->posemb_fwd;
        f->posemb_fwd(x, a->dt, a->out, a->wpe, a->B, a->T, a->C, a->pos_offset);
        break;
    }
    case CMD_POSEMB_BWD: {
        struct posemb_bwd_args *a = &c->posemb_bwd;
        f->posemb_bwd(x, a->dt, a->dwpe, a->dout, a->B, a->T, a->C, a->pos_offset);
        break;
    }
    case CMD_LAYERNORM_FWD: {
        struct layernorm_fwd_args *a = &c->layernorm_fwd;
        f->layernorm_fwd(x, a->dt, a->out, a->mean, a->rstd, a->inp, a->w, a->b, a->N, a->C);
        break;
    }
    case CMD_LAYERNORM_BWD: {
        struct layernorm_bwd_args *a = &c->layernorm_bwd;
        f->layernorm_bwd(x, a->dt, a->dinp, a->dw, a->db, a->dout, a->inp, a->w, a->mean, a->rstd,
                         a->N, a->C);
        break;
    }
    case CMD_GELU_FWD: {
        struct gelu_fwd_args *a = &c->gelu_fwd;
        f->gelu_fwd(x, a->dt, a->out, a->inp, a->n);
        break;
    }
    case CMD_GELU_BWD: {
        struct gelu_bwd_args *a = &c->gelu_bwd;
        f->gelu_bwd(x, a->dt, a->dinp, a->dbias, a->inp, a->dout, a->N, a->C);
        break;
    }
    case CMD_ATTENTION_FWD: {
        struct attention_fwd_args *a = &c->attention_fwd;
        f->attention_fwd(x, a->dt, a->out, a->lse, a->qkv, a->B, a->T, a->n_head, a->n_kv_head,
                         a->head_dim);
        break;
    }
    case CMD_ATTENTION_BWD: {
        struct attention_bwd_args *a = &c->attention_bwd;
        f->attention_bwd(x, a->dt, a->dqkv, a->dbias, a->dout, a->qkv, a->out, a->lse, a->B, a->T,
                         a->n_head, a->n_kv_head, a->head_dim);
        break;
    }
    default: CT_ASSERTF(false, "command kind %d sent to run_layer_op", (int)c->kind);
    }
}

/* Runs a queued cross-entropy or optimizer op. Worker thread only. */
static void run_loss_optim_op(const struct ct_backend_i *f, void *x, cmd *c) {
    switch (c->kind) {
    case CMD_XENT_ROWMAX: {
        struct xent_rowmax_args *a = &c->xent_rowmax;
        f->xent_rowmax(x, a->dt, a->rowmax, a->logits, a->N, a->V, a->n_valid);
        break;
    }
    case CMD_XENT_SUMEXP: {
        struct xent_sumexp_args *a = &c->xent_sumexp;
        f->xent_sumexp(x, a->dt, a->sumexp, a->target_logit, a->logits, a->targets, a->rowmax, a->N,
                       a->V, a->n_valid, a->col_offset, a->keep_exp);
        break;
    }
    case CMD_XENT_FINISH: {
        struct xent_finish_args *a = &c->xent_finish;
        f->xent_finish(x, a->dt, a->losses, a->logits_to_grad, a->targets, a->rowmax, a->sumexp,
                       a->target_logit, a->N, a->V, a->n_valid, a->col_offset, a->dloss,
                       a->write_grad);
        break;
    }
    case CMD_ADAMW: {
        struct adamw_args *a = &c->adamw;
        f->adamw(x, a->param, a->grad, a->m, a->v, a->segments, a->n_segments, &a->hp,
                 a->param_copy, a->copy_dtype);
        free(a->segments);
        break;
    }
    case CMD_SUMSQ: {
        struct sumsq_args *a = &c->sumsq;
        f->sumsq(x, a->out, a->x, a->n, a->count);
        free(a->x);
        free(a->n);
        break;
    }
    default: CT_ASSERTF(false, "command kind %d sent to run_loss_optim_op", (int)c->kind);
    }
}

/* Runs a call the host waits for (host_wait). Worker thread only. */
static void run_call(const struct ct_backend_i *f, void *x, cmd *c) {
    switch (c->kind) {
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
    default: CT_ASSERTF(false, "command kind %d sent to run_call", (int)c->kind);
    }
}

/* Runs one command by inner's slot, then frees what the command owns. Worker thread only. */
static void cmd_run(ct_backend *inner, cmd *c) {
    const struct ct_backend_i *f = inner->iface;
    void *x = inner->ctx;
    switch (c->kind) {
    case CMD_MARKER:
    case CMD_FILL:
    case CMD_COPY_FROM_HOST:
    case CMD_COPY:
    case CMD_CAST: run_stream_op(f, x, c); break;
    case CMD_GEMM:
    case CMD_GEMM_BIAS_GELU:
    case CMD_BIAS_ADD:
    case CMD_BIAS_INIT:
    case CMD_BIAS_GRAD:
    case CMD_AXPY:
    case CMD_SCALE: run_linear_op(f, x, c); break;
    case CMD_EMBEDDING_FWD:
    case CMD_EMBEDDING_BWD:
    case CMD_POSEMB_FWD:
    case CMD_POSEMB_BWD:
    case CMD_LAYERNORM_FWD:
    case CMD_LAYERNORM_BWD:
    case CMD_GELU_FWD:
    case CMD_GELU_BWD:
    case CMD_ATTENTION_FWD:
    case CMD_ATTENTION_BWD: run_layer_op(f, x, c); break;
    case CMD_XENT_ROWMAX:
    case CMD_XENT_SUMEXP:
    case CMD_XENT_FINISH:
    case CMD_ADAMW:
    case CMD_SUMSQ: run_loss_optim_op(f, x, c); break;
    case CMD_COPY_TO_HOST:
    case CMD_FREE:
    case CMD_EVENT_WAIT:
    case CMD_SYNC:
    case CMD_PEAK_FLOPS: run_call(f, x, c); break;
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

static void async_fill(void *ctx, void *dst, ct_dtype dtype, int64_t n, float value) {
    enqueue(ctx, &(cmd){.kind = CMD_FILL, .fill = {dst, dtype, n, value}});
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

static void async_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    enqueue(ctx, &(cmd){.kind = CMD_COPY, .copy = {dst, src, bytes}});
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

static void async_gemm(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                       float beta, void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    enqueue(ctx, &(cmd){.kind = CMD_GEMM,
                        .gemm = {trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                 ab_dtype, c_dtype}});
}

static void async_gemm_bias_gelu(void *ctx, int64_t M, int64_t N, int64_t K, const void *A,
                                 int64_t lda, const void *B, int64_t ldb, const void *bias,
                                 void *pre, int64_t ldpre, void *out, int64_t ldout, ct_dtype dt) {
    enqueue(ctx,
            &(cmd){.kind = CMD_GEMM_BIAS_GELU,
                   .gemm_bias_gelu = {M, N, K, A, lda, B, ldb, bias, pre, ldpre, out, ldout, dt}});
}

static void async_bias_add(void *ctx, ct_dtype dt, void *out, const void *bias, int64_t N,
                           int64_t C) {
    enqueue(ctx, &(cmd){.kind = CMD_BIAS_ADD, .bias_add = {dt, out, bias, N, C}});
}

static void async_bias_init(void *ctx, ct_dtype dt, void *out, const void *bias,
                            const void *residual, int64_t N, int64_t C) {
    enqueue(ctx, &(cmd){.kind = CMD_BIAS_INIT, .bias_init = {dt, out, bias, residual, N, C}});
}

static void async_bias_grad(void *ctx, ct_dtype dt, float *dbias, const void *dout, int64_t N,
                            int64_t C) {
    enqueue(ctx, &(cmd){.kind = CMD_BIAS_GRAD, .bias_grad = {dt, dbias, dout, N, C}});
}

static void async_axpy(void *ctx, ct_dtype dt, void *dst, const void *src, float alpha, int64_t n) {
    enqueue(ctx, &(cmd){.kind = CMD_AXPY, .axpy = {dt, dst, src, alpha, n}});
}

static void async_scale(void *ctx, ct_dtype dt, void *x, float s, int64_t n) {
    enqueue(ctx, &(cmd){.kind = CMD_SCALE, .scale = {dt, x, s, n}});
}

static void async_embedding_fwd(void *ctx, ct_dtype dt, void *out, const int32_t *tokens,
                                const void *table, int64_t N, int64_t C, int64_t rows,
                                int64_t row_offset) {
    enqueue(ctx, &(cmd){.kind = CMD_EMBEDDING_FWD,
                        .embedding_fwd = {dt, out, tokens, table, N, C, rows, row_offset}});
}

static void async_embedding_bwd(void *ctx, ct_dtype dt, float *dtable, const void *dout,
                                const int32_t *tokens, int64_t N, int64_t C, int64_t rows,
                                int64_t row_offset) {
    enqueue(ctx, &(cmd){.kind = CMD_EMBEDDING_BWD,
                        .embedding_bwd = {dt, dtable, dout, tokens, N, C, rows, row_offset}});
}

static void async_posemb_fwd(void *ctx, ct_dtype dt, void *out, const void *wpe, int64_t B,
                             int64_t T, int64_t C, int64_t pos_offset) {
    enqueue(ctx, &(cmd){.kind = CMD_POSEMB_FWD, .posemb_fwd = {dt, out, wpe, B, T, C, pos_offset}});
}

static void async_posemb_bwd(void *ctx, ct_dtype dt, float *dwpe, const void *dout, int64_t B,
                             int64_t T, int64_t C, int64_t pos_offset) {
    enqueue(ctx,
            &(cmd){.kind = CMD_POSEMB_BWD, .posemb_bwd = {dt, dwpe, dout, B, T, C, pos_offset}});
}

static void async_layernorm_fwd(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd,
                                const void *inp, const void *w, const void *b, int64_t N,
                                int64_t C) {
    enqueue(ctx, &(cmd){.kind = CMD_LAYERNORM_FWD,
                        .layernorm_fwd = {dt, out, mean, rstd, inp, w, b, N, C}});
}

static void async_layernorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, float *db,
                                const void *dout, const void *inp, const void *w, const float *mean,
                                const float *rstd, int64_t N, int64_t C) {
    enqueue(ctx, &(cmd){.kind = CMD_LAYERNORM_BWD,
                        .layernorm_bwd = {dt, dinp, dw, db, dout, inp, w, mean, rstd, N, C}});
}

static void async_gelu_fwd(void *ctx, ct_dtype dt, void *out, const void *inp, int64_t n) {
    enqueue(ctx, &(cmd){.kind = CMD_GELU_FWD, .gelu_fwd = {dt, out, inp, n}});
}

static void async_gelu_bwd(void *ctx, ct_dtype dt, void *dinp, float *dbias, const void *inp,
                           const void *dout, int64_t N, int64_t C) {
    enqueue(ctx, &(cmd){.kind = CMD_GELU_BWD, .gelu_bwd = {dt, dinp, dbias, inp, dout, N, C}});
}

static void async_attention_fwd(void *ctx, ct_dtype dt, void *out, float *lse, const void *qkv,
                                int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                                int64_t head_dim) {
    enqueue(ctx, &(cmd){.kind = CMD_ATTENTION_FWD,
                        .attention_fwd = {dt, out, lse, qkv, B, T, n_head, n_kv_head, head_dim}});
}

static void async_attention_bwd(void *ctx, ct_dtype dt, void *dqkv, float *dbias, const void *dout,
                                const void *qkv, const void *out, const float *lse, int64_t B,
                                int64_t T, int64_t n_head, int64_t n_kv_head, int64_t head_dim) {
    enqueue(ctx, &(cmd){.kind = CMD_ATTENTION_BWD,
                        .attention_bwd = {dt, dqkv, dbias, dout, qkv, out, lse, B, T, n_head,
                                          n_kv_head, head_dim}});
}

static void async_xent_rowmax(void *ctx, ct_dtype dt, float *rowmax, const void *logits, int64_t N,
                              int64_t V, int64_t n_valid) {
    enqueue(ctx,
            &(cmd){.kind = CMD_XENT_ROWMAX, .xent_rowmax = {dt, rowmax, logits, N, V, n_valid}});
}

static void async_xent_sumexp(void *ctx, ct_dtype dt, float *sumexp, float *target_logit,
                              void *logits, const int32_t *targets, const float *rowmax, int64_t N,
                              int64_t V, int64_t n_valid, int64_t col_offset, bool keep_exp) {
    enqueue(ctx, &(cmd){.kind = CMD_XENT_SUMEXP,
                        .xent_sumexp = {dt, sumexp, target_logit, logits, targets, rowmax, N, V,
                                        n_valid, col_offset, keep_exp}});
}

static void async_xent_finish(void *ctx, ct_dtype dt, float *losses, void *logits_to_grad,
                              const int32_t *targets, const float *rowmax, const float *sumexp,
                              const float *target_logit, int64_t N, int64_t V, int64_t n_valid,
                              int64_t col_offset, float dloss, bool write_grad) {
    enqueue(ctx,
            &(cmd){.kind = CMD_XENT_FINISH,
                   .xent_finish = {dt, losses, logits_to_grad, targets, rowmax, sumexp,
                                   target_logit, N, V, n_valid, col_offset, dloss, write_grad}});
}

static void async_adamw(void *ctx, float *param, const float *grad, float *m, float *v,
                        const ct_adamw_segment *segments, int n_segments,
                        const ct_adamw_hparams *hp, void *param_copy, ct_dtype copy_dtype) {
    ct_adamw_segment *owned = NULL;
    if (n_segments > 0) {
        owned = ct_xmalloc((size_t)n_segments * sizeof *owned);
        memcpy(owned, segments, (size_t)n_segments * sizeof *owned);
    }
    enqueue(ctx,
            &(cmd){.kind = CMD_ADAMW,
                   .adamw = {param, grad, m, v, owned, n_segments, *hp, param_copy, copy_dtype}});
}

static void async_sumsq(void *ctx, float *out, const float *const *x, const int64_t *n, int count) {
    const float **ox = ct_xmalloc((size_t)CT_MAX(count, 1) * sizeof *ox);
    int64_t *on = ct_xmalloc((size_t)CT_MAX(count, 1) * sizeof *on);
    memcpy(ox, x, (size_t)count * sizeof *ox);
    memcpy(on, n, (size_t)count * sizeof *on);
    enqueue(ctx, &(cmd){.kind = CMD_SUMSQ, .sumsq = {out, ox, on, count}});
}

static void async_cast(void *ctx, void *dst, ct_dtype dst_dtype, const void *src,
                       ct_dtype src_dtype, int64_t n) {
    enqueue(ctx, &(cmd){.kind = CMD_CAST, .cast = {dst, dst_dtype, src, src_dtype, n}});
}

/* Every slot; ct_backend_async_new clears those whose inner slot is NULL. */
static const struct ct_backend_i async_template = {
    .name = NULL, /* per object: "<inner>-async" */
    .alloc = async_alloc,
    .free = async_free,
    .fill = async_fill,
    .copy_from_host = async_copy_from_host,
    .copy_to_host = async_copy_to_host,
    .copy = async_copy,
    .gemm = async_gemm,
    .gemm_bias_gelu = async_gemm_bias_gelu,
    .bias_add = async_bias_add,
    .bias_init = async_bias_init,
    .bias_grad = async_bias_grad,
    .axpy = async_axpy,
    .scale = async_scale,
    .embedding_fwd = async_embedding_fwd,
    .embedding_bwd = async_embedding_bwd,
    .posemb_fwd = async_posemb_fwd,
    .posemb_bwd = async_posemb_bwd,
    .layernorm_fwd = async_layernorm_fwd,
    .layernorm_bwd = async_layernorm_bwd,
    .gelu_fwd = async_gelu_fwd,
    .gelu_bwd = async_gelu_bwd,
    .attention_fwd = async_attention_fwd,
    .attention_bwd = async_attention_bwd,
    .xent_rowmax = async_xent_rowmax,
    .xent_sumexp = async_xent_sumexp,
    .xent_finish = async_xent_finish,
    .adamw = async_adamw,
    .sumsq = async_sumsq,
    .cast = async_cast,
    /* always present, whatever inner has: they are this stream's ordering (inner's own, if any,
     * is called from them) */
    .event_record = async_event_record,
    .event_wait = async_event_wait,
    .sync = async_sync,
    .peak_flops = async_peak_flops,
    .describe = async_describe,
    .free_backend = async_free_backend,
};

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
    KEEP_IF_INNER_HAS(gemm);
    KEEP_IF_INNER_HAS(gemm_bias_gelu);
    KEEP_IF_INNER_HAS(bias_add);
    KEEP_IF_INNER_HAS(bias_init);
    KEEP_IF_INNER_HAS(bias_grad);
    KEEP_IF_INNER_HAS(axpy);
    KEEP_IF_INNER_HAS(scale);
    KEEP_IF_INNER_HAS(embedding_fwd);
    KEEP_IF_INNER_HAS(embedding_bwd);
    KEEP_IF_INNER_HAS(posemb_fwd);
    KEEP_IF_INNER_HAS(posemb_bwd);
    KEEP_IF_INNER_HAS(layernorm_fwd);
    KEEP_IF_INNER_HAS(layernorm_bwd);
    KEEP_IF_INNER_HAS(gelu_fwd);
    KEEP_IF_INNER_HAS(gelu_bwd);
    KEEP_IF_INNER_HAS(attention_fwd);
    KEEP_IF_INNER_HAS(attention_bwd);
    KEEP_IF_INNER_HAS(xent_rowmax);
    KEEP_IF_INNER_HAS(xent_sumexp);
    KEEP_IF_INNER_HAS(xent_finish);
    KEEP_IF_INNER_HAS(adamw);
    KEEP_IF_INNER_HAS(sumsq);
    KEEP_IF_INNER_HAS(cast);
    KEEP_IF_INNER_HAS(peak_flops);
    KEEP_IF_INNER_HAS(describe);
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
