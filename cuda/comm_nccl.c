/*
 * comm_nccl.c — the NCCL comm (comm_nccl.h says what it promises). Host C, identical in the real
 * build (linked with libnccl) and the emulated one (linked with cuda/emu/nccl_emu.cc).
 */
#include "cuda/comm_nccl.h"

#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl.h>

#include "cuda/backend_cuda.h"
#include "cuda/ct_cuda_check.h"
#include "cuda/ct_cuda_ctx.h"
#include "core/comm/flight.h"

#define CT_NCCL_CHECK(call)                                                                        \
    do {                                                                                           \
        ncclResult_t ct_nccl_status_ = (call);                                                     \
        if (ct_nccl_status_ != ncclSuccess)                                                        \
            ct_cuda_fail("NCCL", ncclGetErrorString(ct_nccl_status_),                              \
                         nccl_result_name(ct_nccl_status_), #call, __FILE__, __LINE__);            \
    } while (0)

static const char *nccl_result_name(ncclResult_t r) {
    static const char *names[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                  "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                  "ncclRemoteError",   "ncclInProgress"};
    return (int)r >= 0 && (int)r < (int)(sizeof names / sizeof *names) ? names[r] : "ncclResult?";
}

/* A device operation the watchdog tracks, from issue until its event has passed. */
typedef struct flight {
    cudaEvent_t began, done; /* on the operation's stream, just before it and just after */
    ct_comm_op_kind kind;
    char what[32]; /* dtype and op, for the report */
    int64_t bytes;
    uint64_t seq; /* per group: collectives and point-to-point counted apart, as for MPI */
    bool p2p;
    double since;
    int refs;       /* the tracker, and the request while it is held */
    int64_t record; /* its flight-recorder record (core/comm/flight.h), ended when it passes */
} flight;

/* A point-to-point operation held until the next flush. */
typedef struct held_p2p {
    bool send;
    void *buf;
    int64_t n;
    ct_dtype dtype;
    int peer;
    flight *f;
} held_p2p;

typedef struct nccl_request {
    bool host;             /* carried by the bootstrap group */
    ct_comm_request *boot; /* its request there */
    flight *f;             /* device: the operation's completion */
} nccl_request;

/* A directed point-to-point channel to or from one peer: a communicator of two ranks (the sender
 * is its rank 0) on a stream of its own, carrying transfers one way only (comm_nccl.h). */
typedef struct channel {
    int peer; /* the other end's rank in the group */
    bool send;
    int lane; /* the tags' parity it carries (comm_nccl.h) */
    ncclComm_t nccl;
    cudaStream_t stream;
} channel;

typedef struct nccl_group {
    ncclComm_t nccl;
    channel chans[8]; /* to and from the next and the previous rank, two lanes each */
    int n_chans;
    cudaEvent_t compute_event; /* wait_compute's, for the stream the next operation goes on */
    bool compute_pending;
    ct_comm *boot;
    ct_backend *be;
    cudaStream_t stream, compute;
    int rank, size;
    char name[16];
    double timeout_s;
    uint64_t seq_coll, seq_p2p;
    held_p2p *held;
    int n_held, cap_held;
    flight **flights; /* tracked operations, oldest first */
    int n_flights, cap_flights;
    cudaEvent_t *spare; /* events for reuse */
    int n_spare, cap_spare;
    void *scratch; /* all_to_all in place */
    size_t scratch_bytes;
    struct nccl_group *next; /* live groups, for the idle hook */
} nccl_group;

static nccl_group *live_groups;
static void (*abort_job)(int);

void ct_comm_nccl_set_abort(void (*fn)(int)) {
    abort_job = fn;
}

static ncclDataType_t nccl_dtype(ct_dtype dt) {
    switch (dt) {
    case CT_DTYPE_F32: return ncclFloat32;
    case CT_DTYPE_BF16: return ncclBfloat16;
    case CT_DTYPE_I32: return ncclInt32;
    case CT_DTYPE_I64: return ncclInt64;
    case CT_DTYPE_U8: return ncclUint8;
    case CT_DTYPE_F64: return ncclFloat64;
    default: CT_ASSERTF(false, "dtype %s has no NCCL type", ct_dtype_name(dt));
    }
    return ncclFloat32;
}

static ncclRedOp_t nccl_op(ct_reduce_op op) {
    return op == CT_REDUCE_SUM ? ncclSum : op == CT_REDUCE_MAX ? ncclMax : ncclMin;
}

/* No reduction op: a transfer or gather; a receive (for the report). */
enum { OP_NONE = -1, OP_RECEIVE = -2 };

/* Device memory goes through NCCL, host memory through the bootstrap group. */
static bool on_device(const void *p) {
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* a plain host pointer on older runtimes */
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

/* ---- events and the watchdog ------------------------------------------------------------- */

static cudaEvent_t event_get(nccl_group *g) {
    if (g->n_spare > 0) return g->spare[--g->n_spare];
    cudaEvent_t e;
    /* timed: the trace's device spans (flight.h, ct_flight_end_device) */
    CT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
    return e;
}

static void event_put(nccl_group *g, cudaEvent_t e) {
    if (g->n_spare == g->cap_spare) {
        g->cap_spare = g->cap_spare ? 2 * g->cap_spare : 16;
        g->spare = realloc(g->spare, (size_t)g->cap_spare * sizeof *g->spare);
        CT_ASSERT(g->spare != NULL);
    }
    g->spare[g->n_spare++] = e;
}

static void flight_unref(nccl_group *g, flight *f) {
    if (--f->refs > 0) return;
    event_put(g, f->began);
    event_put(g, f->done);
    free(f);
}

/* An operation; the watchdog tracks it once record() has put its event on the stream. One
 * reference for the issuer (the request, or the blocking call until it has ordered compute). */
static flight *flight_new(nccl_group *g, ct_comm_op_kind kind, ct_dtype dt, int op, int64_t bytes,
                          bool p2p) {
    flight *f = ct_xcalloc(1, sizeof *f);
    f->began = event_get(g);
    f->done = event_get(g);
    f->kind = kind;
    static const char *ops[] = {"sum", "max", "min"};
    if (op == OP_RECEIVE)
        snprintf(f->what, sizeof f->what, "receive %s", ct_dtype_name(dt));
    else
        snprintf(f->what, sizeof f->what, "%s%s%s", ct_dtype_name(dt), op >= 0 ? " " : "",
                 op >= 0 ? ops[op] : "");
    f->bytes = bytes;
    f->p2p = p2p;
    f->seq = p2p ? ++g->seq_p2p : ++g->seq_coll;
    f->refs = 1;
    f->record = ct_flight_last(); /* comm.c started it just before calling us */
    return f;
}

__attribute__((noreturn)) static void watchdog_fire(nccl_group *g, const flight *f, double waited,
                                                    ncclResult_t async) {
    if (async != ncclSuccess)
        fprintf(stderr,
                "cooktrain: NCCL reported an asynchronous error on rank %d: %s (%s), group %s "
                "(rank %d of %d)\n",
                ct_log_rank(), ncclGetErrorString(async), nccl_result_name(async), g->name, g->rank,
                g->size);
    if (f)
        fprintf(stderr,
                "cooktrain: %s timed out on rank %d after %.1f s: group %s (rank %d of %d), op %s "
                "(%s), %lld bytes, sequence #%llu (NCCL)\n",
                f->p2p ? "point-to-point operation" : "collective", ct_log_rank(), waited, g->name,
                g->rank, g->size, ct_comm_op_name(f->kind), f->what, (long long)f->bytes,
                (unsigned long long)f->seq);
    if (f)
        fprintf(stderr,
                "hint: a rank never reached this operation (or died); raise parallel.timeout_s "
                "(now %g s) if a step is legitimately slower\n",
                g->timeout_s);
    else
        fprintf(stderr, "hint: NCCL_DEBUG=WARN prints NCCL's own account of the failure\n");
    fflush(stderr);
    if (ct_flight_dump(f ? "watchdog" : "NCCL error")) sleep(1);
    (void)ncclCommAbort(g->nccl);
    if (abort_job) abort_job(1);
    exit(1);
}

/* Drops passed operations; fires on an old one or an asynchronous error. */
static void watchdog_check(nccl_group *g) {
    ncclResult_t async = ncclSuccess;
    CT_NCCL_CHECK(ncclCommGetAsyncError(g->nccl, &async));
    if (async != ncclSuccess && async != ncclInProgress) watchdog_fire(g, NULL, 0.0, async);
    int keep = 0;
    double now = ct_now();
    for (int i = 0; i < g->n_flights; i++) {
        flight *f = g->flights[i];
        cudaError_t e = cudaEventQuery(f->done);
        if (e == cudaSuccess) {
            /* the device's times for the trace, when it keeps them (flight.h) */
            double t0 = NAN, t1 = NAN;
            if (ct_flight_keeps_spans()) {
                t0 = ct_cuda_backend_event_time(g->be, f->began);
                t1 = ct_cuda_backend_event_time(g->be, f->done);
            }
            if (isnan(t0) || isnan(t1))
                ct_flight_end(f->record, false);
            else
                ct_flight_end_device(f->record, t0, t1);
            flight_unref(g, f);
            continue;
        }
        if (e != cudaErrorNotReady) CT_CUDA_CHECK(e);
        if (g->timeout_s > 0 && now - f->since > g->timeout_s)
            watchdog_fire(g, f, now - f->since, ncclSuccess);
        g->flights[keep++] = f;
    }
    g->n_flights = keep;
}

static void idle_all(void) {
    for (nccl_group *g = live_groups; g; g = g->next) watchdog_check(g);
}

/* ---- issuing ----------------------------------------------------------------------------- */

/* The stream an operation is issued on waits for the compute recorded by wait_compute. */
static void after_compute(nccl_group *g, cudaStream_t stream) {
    if (!g->compute_pending) return;
    CT_CUDA_CHECK(cudaStreamWaitEvent(stream, g->compute_event, 0));
    g->compute_pending = false;
}

/* The operation starts here on `stream` (after what it waits for): its device span opens. */
static void begin_on(flight *f, cudaStream_t stream) {
    CT_CUDA_CHECK(cudaEventRecord(f->began, stream));
}

/* Records the operation's completion on `stream`, issued now: from here the watchdog tracks it
 * (a reference of its own, dropped once the event has passed). */
static void record_on(nccl_group *g, flight *f, cudaStream_t stream) {
    CT_CUDA_CHECK(cudaEventRecord(f->done, stream));
    f->since = ct_now();
    f->refs++;
    if (g->n_flights == g->cap_flights) {
        g->cap_flights = g->cap_flights ? 2 * g->cap_flights : 32;
        g->flights = realloc(g->flights, (size_t)g->cap_flights * sizeof *g->flights);
        CT_ASSERT(g->flights != NULL);
    }
    g->flights[g->n_flights++] = f;
}

static void record(nccl_group *g, flight *f) {
    record_on(g, f, g->stream);
}

/* A blocking operation: later compute waits for it on the device. */
static void finish_blocking(nccl_group *g, flight *f) {
    record(g, f);
    CT_CUDA_CHECK(cudaStreamWaitEvent(g->compute, f->done, 0));
    flight_unref(g, f); /* the tracker keeps it */
}

static ct_comm_request *device_request(flight *f) {
    nccl_request *r = ct_xcalloc(1, sizeof *r);
    r->f = f;
    return (ct_comm_request *)r;
}

static ct_comm_request *host_request(ct_comm_request *boot) {
    if (!boot) return NULL;
    nccl_request *r = ct_xcalloc(1, sizeof *r);
    r->host = true;
    r->boot = boot;
    return (ct_comm_request *)r;
}

/* Starts the held sends and receives as one NCCL group. */
static void flush_p2p(nccl_group *g) {
    if (g->n_held == 0) return;
    for (int i = 0; i < g->n_held; i++) begin_on(g->held[i].f, g->stream);
    CT_NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < g->n_held; i++) {
        held_p2p *h = &g->held[i];
        if (h->send)
            CT_NCCL_CHECK(
                ncclSend(h->buf, (size_t)h->n, nccl_dtype(h->dtype), h->peer, g->nccl, g->stream));
        else
            CT_NCCL_CHECK(
                ncclRecv(h->buf, (size_t)h->n, nccl_dtype(h->dtype), h->peer, g->nccl, g->stream));
    }
    CT_NCCL_CHECK(ncclGroupEnd());
    for (int i = 0; i < g->n_held; i++) {
        record(g, g->held[i].f);
        flight_unref(g, g->held[i].f); /* the hold's reference */
    }
    g->n_held = 0;
}

static ct_comm_request *hold_p2p(nccl_group *g, bool send, const void *buf, int64_t n, ct_dtype dt,
                                 int peer) {
    if (g->n_held == g->cap_held) {
        g->cap_held = g->cap_held ? 2 * g->cap_held : 8;
        g->held = realloc(g->held, (size_t)g->cap_held * sizeof *g->held);
        CT_ASSERT(g->held != NULL);
    }
    after_compute(g, g->stream); /* the group flushed later comes after this on the stream */
    flight *f = flight_new(g, CT_COMM_SEND, dt, send ? OP_NONE : OP_RECEIVE,
                           n * (int64_t)ct_dtype_size(dt), true);
    f->refs++; /* the request's and the hold's */
    g->held[g->n_held++] =
        (held_p2p){.send = send, .buf = (void *)buf, .n = n, .dtype = dt, .peer = peer, .f = f};
    return device_request(f);
}

/* ---- the comm slots ----------------------------------------------------------------------- */

static void nccl_wait_compute(void *ctx, ct_backend *be, int event) {
    nccl_group *g = ctx;
    CT_ASSERTF(be == g->be, "group %s: bound to another backend than the one it was made on",
               g->name);
    g->compute_event = ct_cuda_backend_event(be, event);
    g->compute_pending = true;
}

/* What every device collective does first, on the communication stream: wait for the compute
 * recorded by wait_compute, start the held transfers (their order on the group), and open the
 * operation the watchdog tracks (n elements of the full buffer). */
static flight *start_collective(nccl_group *g, ct_comm_op_kind kind, ct_dtype dt, int op,
                                int64_t n) {
    after_compute(g, g->stream);
    flush_p2p(g);
    flight *f = flight_new(g, kind, dt, op, n * (int64_t)ct_dtype_size(dt), false);
    begin_on(f, g->stream);
    return f;
}

static flight *start_allreduce(nccl_group *g, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op) {
    flight *f = start_collective(g, CT_COMM_ALLREDUCE, dt, (int)op, n);
    CT_NCCL_CHECK(
        ncclAllReduce(buf, buf, (size_t)n, nccl_dtype(dt), nccl_op(op), g->nccl, g->stream));
    return f;
}

static flight *start_reduce_scatter(nccl_group *g, const void *send, void *recv, int64_t n,
                                    ct_dtype dt, ct_reduce_op op) {
    flight *f = start_collective(g, CT_COMM_REDUCE_SCATTER, dt, (int)op, n);
    CT_NCCL_CHECK(ncclReduceScatter(send, recv, (size_t)(n / g->size), nccl_dtype(dt), nccl_op(op),
                                    g->nccl, g->stream));
    return f;
}

static flight *start_allgather(nccl_group *g, const void *send, void *recv, int64_t n,
                               ct_dtype dt) {
    flight *f = start_collective(g, CT_COMM_ALLGATHER, dt, OP_NONE, n);
    CT_NCCL_CHECK(
        ncclAllGather(send, recv, (size_t)(n / g->size), nccl_dtype(dt), g->nccl, g->stream));
    return f;
}

static void nccl_allreduce(void *ctx, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op) {
    nccl_group *g = ctx;
    if (!on_device(buf)) {
        g->boot->iface->allreduce(g->boot->ctx, buf, n, dt, op);
        return;
    }
    finish_blocking(g, start_allreduce(g, buf, n, dt, op));
}

static void nccl_reduce_scatter(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dt,
                                ct_reduce_op op) {
    nccl_group *g = ctx;
    if (!on_device(send)) {
        g->boot->iface->reduce_scatter(g->boot->ctx, send, recv, n, dt, op);
        return;
    }
    finish_blocking(g, start_reduce_scatter(g, send, recv, n, dt, op));
}

static void nccl_allgather(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dt) {
    nccl_group *g = ctx;
    if (!on_device(recv)) {
        g->boot->iface->allgather(g->boot->ctx, send, recv, n, dt);
        return;
    }
    finish_blocking(g, start_allgather(g, send, recv, n, dt));
}

static ct_comm_request *nccl_iallreduce(void *ctx, void *buf, int64_t n, ct_dtype dt,
                                        ct_reduce_op op) {
    nccl_group *g = ctx;
    if (!on_device(buf))
        return host_request(g->boot->iface->iallreduce(g->boot->ctx, buf, n, dt, op));
    flight *f = start_allreduce(g, buf, n, dt, op);
    record(g, f);
    return device_request(f);
}

static ct_comm_request *nccl_ireduce_scatter(void *ctx, const void *send, void *recv, int64_t n,
                                             ct_dtype dt, ct_reduce_op op) {
    nccl_group *g = ctx;
    if (!on_device(send))
        return host_request(g->boot->iface->ireduce_scatter(g->boot->ctx, send, recv, n, dt, op));
    flight *f = start_reduce_scatter(g, send, recv, n, dt, op);
    record(g, f);
    return device_request(f);
}

static ct_comm_request *nccl_iallgather(void *ctx, const void *send, void *recv, int64_t n,
                                        ct_dtype dt) {
    nccl_group *g = ctx;
    if (!on_device(recv))
        return host_request(g->boot->iface->iallgather(g->boot->ctx, send, recv, n, dt));
    flight *f = start_allgather(g, send, recv, n, dt);
    record(g, f);
    return device_request(f);
}

static void nccl_broadcast(void *ctx, void *buf, int64_t n, ct_dtype dt, int root) {
    nccl_group *g = ctx;
    if (!on_device(buf)) {
        g->boot->iface->broadcast(g->boot->ctx, buf, n, dt, root);
        return;
    }
    flight *f = start_collective(g, CT_COMM_BROADCAST, dt, OP_NONE, n);
    CT_NCCL_CHECK(ncclBroadcast(buf, buf, (size_t)n, nccl_dtype(dt), root, g->nccl, g->stream));
    finish_blocking(g, f);
}

static channel *channel_of(nccl_group *g, bool send, int peer, int tag) {
    for (int i = 0; i < g->n_chans; i++)
        if (g->chans[i].send == send && g->chans[i].peer == peer && g->chans[i].lane == (tag & 1))
            return &g->chans[i];
    return NULL;
}

/* A transfer on a directed channel: issued at once, alone, on the channel's stream. */
static ct_comm_request *channel_p2p(nccl_group *g, channel *ch, void *buf, int64_t n, ct_dtype dt) {
    after_compute(g, ch->stream);
    flight *f = flight_new(g, CT_COMM_SEND, dt, ch->send ? OP_NONE : OP_RECEIVE,
                           n * (int64_t)ct_dtype_size(dt), true);
    begin_on(f, ch->stream);
    if (ch->send)
        CT_NCCL_CHECK(ncclSend(buf, (size_t)n, nccl_dtype(dt), 1, ch->nccl, ch->stream));
    else
        CT_NCCL_CHECK(ncclRecv(buf, (size_t)n, nccl_dtype(dt), 0, ch->nccl, ch->stream));
    record_on(g, f, ch->stream);
    return device_request(f);
}

static ct_comm_request *nccl_isend(void *ctx, const void *buf, int64_t n, ct_dtype dt, int peer,
                                   int tag) {
    nccl_group *g = ctx;
    if (!on_device(buf))
        return host_request(g->boot->iface->isend(g->boot->ctx, buf, n, dt, peer, tag));
    channel *ch = channel_of(g, true, peer, tag);
    if (ch) return channel_p2p(g, ch, (void *)buf, n, dt);
    return hold_p2p(g, true, buf, n, dt, peer);
}

static ct_comm_request *nccl_irecv(void *ctx, void *buf, int64_t n, ct_dtype dt, int peer,
                                   int tag) {
    nccl_group *g = ctx;
    if (!on_device(buf))
        return host_request(g->boot->iface->irecv(g->boot->ctx, buf, n, dt, peer, tag));
    channel *ch = channel_of(g, false, peer, tag);
    if (ch) return channel_p2p(g, ch, buf, n, dt);
    return hold_p2p(g, false, buf, n, dt, peer);
}

static void nccl_wait(void *ctx, ct_comm_request *req) {
    nccl_group *g = ctx;
    nccl_request *r = (nccl_request *)req;
    if (r->host) {
        g->boot->iface->wait(g->boot->ctx, r->boot);
    } else {
        flush_p2p(g);
        CT_CUDA_CHECK(cudaStreamWaitEvent(g->compute, r->f->done, 0));
        flight_unref(g, r->f);
    }
    free(r);
}

static bool nccl_test(void *ctx, ct_comm_request *req) {
    nccl_group *g = ctx;
    nccl_request *r = (nccl_request *)req;
    if (r->host) return !g->boot->iface->test || g->boot->iface->test(g->boot->ctx, r->boot);
    flush_p2p(g);
    cudaError_t e = cudaEventQuery(r->f->done);
    if (e == cudaErrorNotReady) {
        watchdog_check(g);
        return false;
    }
    CT_CUDA_CHECK(e);
    return true;
}

static void nccl_poll(void *ctx) {
    nccl_group *g = ctx;
    if (g->boot->iface->poll) g->boot->iface->poll(g->boot->ctx);
    /* a query lets the communication stream move (and costs nothing on a GPU) */
    cudaError_t e = cudaStreamQuery(g->stream);
    if (e != cudaErrorNotReady) CT_CUDA_CHECK(e);
}

static void nccl_all_to_all(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dt) {
    nccl_group *g = ctx;
    if (!on_device(recv)) {
        g->boot->iface->all_to_all(g->boot->ctx, send, recv, n, dt);
        return;
    }
    flight *f = start_collective(g, CT_COMM_ALL_TO_ALL, dt, OP_NONE, n);
    size_t esz = ct_dtype_size(dt), block = (size_t)(n / g->size) * esz;
    if (send == recv) {
        /* in place: the sends read a copy, made on the communication stream */
        if (g->scratch_bytes < (size_t)n * esz) {
            CT_CUDA_CHECK(cudaStreamSynchronize(g->stream));
            if (g->scratch) CT_CUDA_CHECK(cudaFree(g->scratch));
            CT_CUDA_CHECK(cudaMalloc(&g->scratch, (size_t)n * esz));
            g->scratch_bytes = (size_t)n * esz;
        }
        CT_CUDA_CHECK(cudaMemcpyAsync(g->scratch, send, (size_t)n * esz, cudaMemcpyDeviceToDevice,
                                      g->stream));
        send = g->scratch;
    }
    CT_CUDA_CHECK(cudaMemcpyAsync((char *)recv + (size_t)g->rank * block,
                                  (const char *)send + (size_t)g->rank * block, block,
                                  cudaMemcpyDeviceToDevice, g->stream));
    CT_NCCL_CHECK(ncclGroupStart());
    for (int q = 0; q < g->size; q++) {
        if (q == g->rank) continue;
        CT_NCCL_CHECK(ncclSend((const char *)send + (size_t)q * block, (size_t)(n / g->size),
                               nccl_dtype(dt), q, g->nccl, g->stream));
        CT_NCCL_CHECK(ncclRecv((char *)recv + (size_t)q * block, (size_t)(n / g->size),
                               nccl_dtype(dt), q, g->nccl, g->stream));
    }
    CT_NCCL_CHECK(ncclGroupEnd());
    finish_blocking(g, f);
}

/* Device buffers: the own block copied on the communication stream, then one NCCL group of a
 * send and a receive per other rank with a non-empty block (the counts agree, comm.h, so both
 * sides skip the same empty ones). Host buffers: the MPI group's. */
static void nccl_all_to_all_v(void *ctx, const void *send, const int64_t *send_counts, void *recv,
                              const int64_t *recv_counts, ct_dtype dt) {
    nccl_group *g = ctx;
    if (!on_device(recv) && !on_device(send)) {
        g->boot->iface->all_to_all_v(g->boot->ctx, send, send_counts, recv, recv_counts, dt);
        return;
    }
    size_t esz = ct_dtype_size(dt);
    int64_t n_send = 0, own_send = 0, own_recv = 0;
    for (int q = 0; q < g->size; q++) {
        if (q < g->rank) own_send += send_counts[q], own_recv += recv_counts[q];
        n_send += send_counts[q];
    }
    flight *f = start_collective(g, CT_COMM_ALL_TO_ALL_V, dt, OP_NONE, n_send);
    if (send_counts[g->rank] > 0)
        CT_CUDA_CHECK(cudaMemcpyAsync(
            (char *)recv + (size_t)own_recv * esz, (const char *)send + (size_t)own_send * esz,
            (size_t)send_counts[g->rank] * esz, cudaMemcpyDeviceToDevice, g->stream));
    CT_NCCL_CHECK(ncclGroupStart());
    int64_t at_send = 0, at_recv = 0;
    for (int q = 0; q < g->size; at_send += send_counts[q], at_recv += recv_counts[q], q++) {
        if (q == g->rank) continue;
        if (send_counts[q] > 0)
            CT_NCCL_CHECK(ncclSend((const char *)send + (size_t)at_send * esz,
                                   (size_t)send_counts[q], nccl_dtype(dt), q, g->nccl, g->stream));
        if (recv_counts[q] > 0)
            CT_NCCL_CHECK(ncclRecv((char *)recv + (size_t)at_recv * esz, (size_t)recv_counts[q],
                                   nccl_dtype(dt), q, g->nccl, g->stream));
    }
    CT_NCCL_CHECK(ncclGroupEnd());
    finish_blocking(g, f);
}

static void nccl_barrier(void *ctx) {
    nccl_group *g = ctx;
    flush_p2p(g);
    g->boot->iface->barrier(g->boot->ctx);
}

static int nccl_max_tag(void *ctx) {
    (void)ctx;
    return INT_MAX; /* tags are not carried (comm_nccl.h) */
}

static void nccl_free_comm(void *ctx) {
    nccl_group *g = ctx;
    flush_p2p(g);
    CT_CUDA_CHECK(cudaStreamSynchronize(g->stream));
    for (nccl_group **p = &live_groups; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    if (!live_groups) ct_set_idle_hook(NULL);
    for (int i = 0; i < g->n_flights; i++) {
        g->flights[i]->refs = 1;
        flight_unref(g, g->flights[i]);
    }
    for (int i = 0; i < g->n_chans; i++) {
        CT_CUDA_CHECK(cudaStreamSynchronize(g->chans[i].stream));
        CT_NCCL_CHECK(ncclCommDestroy(g->chans[i].nccl));
        CT_CUDA_CHECK(cudaStreamDestroy(g->chans[i].stream));
    }
    CT_NCCL_CHECK(ncclCommDestroy(g->nccl));
    for (int i = 0; i < g->n_spare; i++) CT_CUDA_CHECK(cudaEventDestroy(g->spare[i]));
    if (g->scratch) CT_CUDA_CHECK(cudaFree(g->scratch));
    CT_CUDA_CHECK(cudaStreamDestroy(g->stream));
    ct_comm_free(g->boot);
    free(g->held);
    free(g->flights);
    free(g->spare);
    free(g);
}

static const struct ct_comm_i nccl_iface = {
    .allreduce = nccl_allreduce,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .broadcast = nccl_broadcast,
    .isend = nccl_isend,
    .irecv = nccl_irecv,
    .iallreduce = nccl_iallreduce,
    .ireduce_scatter = nccl_ireduce_scatter,
    .iallgather = nccl_iallgather,
    .wait = nccl_wait,
    .test = nccl_test,
    .poll = nccl_poll,
    .all_to_all = nccl_all_to_all,
    .all_to_all_v = nccl_all_to_all_v,
    .barrier = nccl_barrier,
    .wait_compute = nccl_wait_compute,
    .max_tag = nccl_max_tag,
    .free_comm = nccl_free_comm,
    .completes_later = true,
};

/* The channels to and from the next and the previous rank (one peer when the group has two),
 * made in one order on every rank, lowest (sender, receiver) first, so that the two ranks of a
 * channel, each blocked in ncclCommInitRank until the other comes, never wait in a cycle. The
 * sender makes the id and sends it over the bootstrap group. */
static ncclResult_t make_channels(nccl_group *g) {
    int next = (g->rank + 1) % g->size, prev = (g->rank + g->size - 1) % g->size;
    int peers[2] = {next, prev}, n_peers = next == prev ? 1 : 2;
    for (int i = 0; i < n_peers; i++)
        for (int lane = 0; lane < 2; lane++) {
            g->chans[g->n_chans++] = (channel){.peer = peers[i], .send = true, .lane = lane};
            g->chans[g->n_chans++] = (channel){.peer = peers[i], .send = false, .lane = lane};
        }
    /* order by (sender, receiver, lane): a channel's key is the same on both its ranks */
    for (int i = 1; i < g->n_chans; i++)
        for (int j = i; j > 0; j--) {
            channel *a = &g->chans[j - 1], *b = &g->chans[j];
            int ka =
                2 * (a->send ? g->rank * g->size + a->peer : a->peer * g->size + g->rank) + a->lane;
            int kb =
                2 * (b->send ? g->rank * g->size + b->peer : b->peer * g->size + g->rank) + b->lane;
            if (ka <= kb) break;
            channel t = *a;
            *a = *b;
            *b = t;
        }
    enum { TAG_CHANNEL_ID = 7 };
    for (int i = 0; i < g->n_chans; i++) {
        channel *ch = &g->chans[i];
        ncclUniqueId id;
        memset(&id, 0, sizeof id);
        ct_comm_request *req;
        if (ch->send) {
            ncclResult_t made = ncclGetUniqueId(&id);
            if (made != ncclSuccess) return made; /* the peer then waits: the job is failing */
            req = g->boot->iface->isend(g->boot->ctx, &id, (int64_t)sizeof id, CT_DTYPE_U8,
                                        ch->peer, TAG_CHANNEL_ID);
        } else {
            req = g->boot->iface->irecv(g->boot->ctx, &id, (int64_t)sizeof id, CT_DTYPE_U8,
                                        ch->peer, TAG_CHANNEL_ID);
        }
        g->boot->iface->wait(g->boot->ctx, req);
        ncclResult_t made = ncclCommInitRank(&ch->nccl, 2, id, ch->send ? 0 : 1);
        if (made != ncclSuccess) return made;
        CT_CUDA_CHECK(cudaStreamCreateWithFlags(&ch->stream, cudaStreamNonBlocking));
    }
    return ncclSuccess;
}

ct_comm *ct_comm_nccl_new(ct_comm *boot, ct_backend *be, double timeout_s, bool p2p_channels) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t made = ncclSuccess;
    if (boot->rank == 0) made = ncclGetUniqueId(&id);
    /* every rank learns whether the root could make an id, with the id */
    int32_t root_ok = made == ncclSuccess;
    boot->iface->broadcast(boot->ctx, &root_ok, 1, CT_DTYPE_I32, 0);
    if (!root_ok) {
        ct_error(CT_ERR_RUNTIME, "group %s: ncclGetUniqueId failed on its rank 0%s%s", boot->name,
                 boot->rank == 0 ? ": " : "", boot->rank == 0 ? ncclGetErrorString(made) : "");
        ct_comm_free(boot);
        return NULL;
    }
    boot->iface->broadcast(boot->ctx, &id, (int64_t)sizeof id, CT_DTYPE_U8, 0);
    nccl_group *g = ct_xcalloc(1, sizeof *g);
    g->boot = boot;
    g->be = be;
    g->compute = ct_cuda_backend_stream(be);
    g->rank = boot->rank;
    g->size = boot->size;
    g->timeout_s = timeout_s;
    snprintf(g->name, sizeof g->name, "%s", boot->name);
    made = ncclCommInitRank(&g->nccl, boot->size, id, boot->rank);
    if (made != ncclSuccess) {
        ct_error(CT_ERR_RUNTIME, "group %s: ncclCommInitRank failed on rank %d of %d: %s (%s)",
                 g->name, g->rank, g->size, ncclGetErrorString(made), nccl_result_name(made));
        ct_comm_free(boot);
        free(g);
        return NULL;
    }
    if (p2p_channels && g->size > 1 && (made = make_channels(g)) != ncclSuccess) {
        ct_error(CT_ERR_RUNTIME, "group %s: a point-to-point channel failed on rank %d: %s (%s)",
                 g->name, g->rank, ncclGetErrorString(made), nccl_result_name(made));
        return NULL; /* the job ends: what was made is not worth unwinding */
    }
    /* a priority above compute's, so reductions are not queued behind a long backward */
    int least = 0, greatest = 0;
    CT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CT_CUDA_CHECK(cudaStreamCreateWithPriority(&g->stream, cudaStreamNonBlocking, greatest));
    g->next = live_groups;
    live_groups = g;
    ct_set_idle_hook(idle_all);
    ct_comm *c = ct_xcalloc(1, sizeof *c);
    c->iface = &nccl_iface;
    c->ctx = g;
    c->name = g->name;
    c->rank = boot->rank;
    c->size = boot->size;
    if (boot->members) {
        c->members = ct_xmalloc((size_t)c->size * sizeof *c->members);
        memcpy(c->members, boot->members, (size_t)c->size * sizeof *c->members);
    }
    return c;
}
