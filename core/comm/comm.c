/*
 * comm.c — the comm wrappers (byte counting in the ring model) and the local, one-rank group.
 */
#include "comm.h"

#include "core/backend/backend.h"
#include "flight.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

const char *ct_comm_op_name(ct_comm_op_kind kind) {
    static const char *names[CT_COMM_OP_COUNT] = {
        "allreduce", "reduce_scatter", "allgather",    "broadcast",
        "send",      "all_to_all",     "all_to_all_v", "barrier",
    };
    return (int)kind >= 0 && kind < CT_COMM_OP_COUNT ? names[kind] : "?";
}

/* Ring-model bytes this rank sends for an op over `size` ranks on a buffer of `bytes`. */
static uint64_t ring_bytes(ct_comm_op_kind kind, uint64_t bytes, int size) {
    if (size <= 1) return 0;
    switch (kind) {
    case CT_COMM_ALLREDUCE: return 2 * bytes * (uint64_t)(size - 1) / (uint64_t)size;
    case CT_COMM_REDUCE_SCATTER:
    case CT_COMM_ALLGATHER:
    case CT_COMM_ALL_TO_ALL: return bytes * (uint64_t)(size - 1) / (uint64_t)size;
    case CT_COMM_SEND: return bytes;
    case CT_COMM_BROADCAST: return bytes; /* caller passes 0 for non-roots */
    default: return 0;
    }
}

static void count(ct_comm *comm, ct_comm_op_kind kind, int64_t n, ct_dtype dtype) {
    comm->calls[kind]++;
    comm->bytes[kind] += ring_bytes(kind, (uint64_t)n * ct_dtype_size(dtype), comm->size);
}

/* Time spent blocked in communication, for the profile. */
#define TIMED(comm, call)                                                                          \
    do {                                                                                           \
        double t0_ = ct_now();                                                                     \
        call;                                                                                      \
        (comm)->seconds += ct_now() - t0_;                                                         \
    } while (0)

void ct_comm_set_stream(ct_comm *comm, struct ct_backend *be) {
    comm->stream = be;
}

void ct_comm_unset_stream(ct_comm *comm, const struct ct_backend *be) {
    if (comm && comm->stream == be) comm->stream = NULL;
}

/* Before an operation on the buffers: the compute issued so far on the group's stream has run
 * (comm.h). Groups of one copy on the stream itself and skip this. */
static const struct ct_comm_i local_iface;

static void after_compute(ct_comm *comm) {
    if (!comm->stream || comm->iface == &local_iface) return;
    ct_backend_event_record(comm->stream, CT_EVENT_COMM);
    if (comm->iface->wait_compute)
        comm->iface->wait_compute(comm->ctx, comm->stream, CT_EVENT_COMM);
    else
        ct_backend_event_wait(comm->stream, CT_EVENT_COMM);
}

/* Starts an operation's flight record (flight.h). False: the planted fault skips it, or has
 * issued a barrier in its place (a mismatch), and the caller issues nothing. */
static bool begin(ct_comm *comm, ct_comm_op_kind kind, bool is_recv, int peer, int tag,
                  ct_dtype dtype, int64_t n, int64_t *rec) {
    ct_flight_fault fault = ct_flight_start(comm, kind, is_recv, peer, tag, dtype, n, rec);
    if (fault == CT_FAULT_MISMATCH) {
        comm->iface->barrier(comm->ctx);
        ct_flight_end(*rec, comm->iface->completes_later);
    }
    return fault == CT_FAULT_NONE;
}

static void done(const ct_comm *comm, int64_t rec) {
    ct_flight_end(rec, comm->iface->completes_later);
}

/* A blocking operation, recorded: started, issued (and timed), ended. */
#define RECORDED(comm, kind, dtype, n, call)                                                       \
    do {                                                                                           \
        int64_t rec_;                                                                              \
        if (begin(comm, kind, false, -1, -1, dtype, n, &rec_)) {                                   \
            TIMED(comm, call);                                                                     \
            done(comm, rec_);                                                                      \
        }                                                                                          \
    } while (0)

/* A non-blocking one: its record ends when a wait or test sees it complete. */
static ct_comm_request *started(ct_comm *comm, ct_comm_request *req, int64_t rec) {
    if (req)
        ct_flight_request(comm, req, rec);
    else
        done(comm, rec);
    return req;
}

void ct_comm_allreduce(ct_comm *comm, void *buf, int64_t n, ct_dtype dtype, ct_reduce_op op) {
    count(comm, CT_COMM_ALLREDUCE, n, dtype);
    after_compute(comm);
    if (comm->size > 1)
        RECORDED(comm, CT_COMM_ALLREDUCE, dtype, n,
                 comm->iface->allreduce(comm->ctx, buf, n, dtype, op));
}

void ct_comm_reduce_scatter(ct_comm *comm, const void *send, void *recv, int64_t n, ct_dtype dtype,
                            ct_reduce_op op) {
    CT_ASSERTF(n % comm->size == 0, "reduce_scatter of %lld elements over %d ranks", (long long)n,
               comm->size);
    count(comm, CT_COMM_REDUCE_SCATTER, n, dtype);
    after_compute(comm);
    RECORDED(comm, CT_COMM_REDUCE_SCATTER, dtype, n,
             comm->iface->reduce_scatter(comm->ctx, send, recv, n, dtype, op));
}

void ct_comm_allgather(ct_comm *comm, const void *send, void *recv, int64_t n, ct_dtype dtype) {
    CT_ASSERTF(n % comm->size == 0, "allgather of %lld elements over %d ranks", (long long)n,
               comm->size);
    count(comm, CT_COMM_ALLGATHER, n, dtype);
    after_compute(comm);
    RECORDED(comm, CT_COMM_ALLGATHER, dtype, n,
             comm->iface->allgather(comm->ctx, send, recv, n, dtype));
}

void ct_comm_broadcast(ct_comm *comm, void *buf, int64_t n, ct_dtype dtype, int root) {
    comm->calls[CT_COMM_BROADCAST]++;
    if (comm->rank == root)
        comm->bytes[CT_COMM_BROADCAST] +=
            ring_bytes(CT_COMM_BROADCAST, (uint64_t)n * ct_dtype_size(dtype), comm->size);
    after_compute(comm);
    if (comm->size > 1)
        RECORDED(comm, CT_COMM_BROADCAST, dtype, n,
                 comm->iface->broadcast(comm->ctx, buf, n, dtype, root));
}

ct_comm_request *ct_comm_isend(ct_comm *comm, const void *buf, int64_t n, ct_dtype dtype, int peer,
                               int tag) {
    comm->calls[CT_COMM_SEND]++;
    comm->bytes[CT_COMM_SEND] += (uint64_t)n * ct_dtype_size(dtype);
    after_compute(comm);
    int64_t rec;
    if (!begin(comm, CT_COMM_SEND, false, peer, tag, dtype, n, &rec)) return NULL;
    return started(comm, comm->iface->isend(comm->ctx, buf, n, dtype, peer, tag), rec);
}

ct_comm_request *ct_comm_irecv(ct_comm *comm, void *buf, int64_t n, ct_dtype dtype, int peer,
                               int tag) {
    after_compute(comm); /* the buffer may still be read by an earlier op */
    int64_t rec;
    if (!begin(comm, CT_COMM_SEND, true, peer, tag, dtype, n, &rec)) return NULL;
    return started(comm, comm->iface->irecv(comm->ctx, buf, n, dtype, peer, tag), rec);
}

ct_comm_request *ct_comm_iallreduce(ct_comm *comm, void *buf, int64_t n, ct_dtype dtype,
                                    ct_reduce_op op) {
    count(comm, CT_COMM_ALLREDUCE, n, dtype);
    after_compute(comm);
    if (comm->size == 1) return NULL;
    int64_t rec;
    if (!begin(comm, CT_COMM_ALLREDUCE, false, -1, -1, dtype, n, &rec)) return NULL;
    return started(comm, comm->iface->iallreduce(comm->ctx, buf, n, dtype, op), rec);
}

ct_comm_request *ct_comm_ireduce_scatter(ct_comm *comm, const void *send, void *recv, int64_t n,
                                         ct_dtype dtype, ct_reduce_op op) {
    CT_ASSERTF(n % comm->size == 0, "reduce_scatter of %lld elements over %d ranks", (long long)n,
               comm->size);
    count(comm, CT_COMM_REDUCE_SCATTER, n, dtype);
    after_compute(comm);
    int64_t rec;
    if (!begin(comm, CT_COMM_REDUCE_SCATTER, false, -1, -1, dtype, n, &rec)) return NULL;
    return started(comm, comm->iface->ireduce_scatter(comm->ctx, send, recv, n, dtype, op), rec);
}

ct_comm_request *ct_comm_iallgather(ct_comm *comm, const void *send, void *recv, int64_t n,
                                    ct_dtype dtype) {
    CT_ASSERTF(n % comm->size == 0, "allgather of %lld elements over %d ranks", (long long)n,
               comm->size);
    count(comm, CT_COMM_ALLGATHER, n, dtype);
    after_compute(comm);
    int64_t rec;
    if (!begin(comm, CT_COMM_ALLGATHER, false, -1, -1, dtype, n, &rec)) return NULL;
    return started(comm, comm->iface->iallgather(comm->ctx, send, recv, n, dtype), rec);
}

void ct_comm_poll(ct_comm *comm) {
    if (comm && comm->iface->poll) comm->iface->poll(comm->ctx);
}

void ct_comm_wait(ct_comm *comm, ct_comm_request *req) {
    if (!req) return;
    int64_t rec = ct_flight_request_take(comm, req);
    TIMED(comm, comm->iface->wait(comm->ctx, req));
    done(comm, rec);
}

bool ct_comm_test(ct_comm *comm, ct_comm_request *req) {
    if (!req || !comm->iface->test) return true;
    if (!comm->iface->test(comm->ctx, req)) return false;
    done(comm, ct_flight_request_take(comm, req)); /* its wait finds no record */
    return true;
}

void ct_comm_all_to_all(ct_comm *comm, const void *send, void *recv, int64_t n, ct_dtype dtype) {
    count(comm, CT_COMM_ALL_TO_ALL, n, dtype);
    after_compute(comm);
    RECORDED(comm, CT_COMM_ALL_TO_ALL, dtype, n,
             comm->iface->all_to_all(comm->ctx, send, recv, n, dtype));
}

void ct_comm_all_to_all_v(ct_comm *comm, const void *send, const int64_t *send_counts, void *recv,
                          const int64_t *recv_counts, ct_dtype dtype) {
    uint64_t sent = 0;
    for (int q = 0; q < comm->size; q++) {
        CT_ASSERTF(send_counts[q] >= 0 && recv_counts[q] >= 0,
                   "all_to_all_v on group %s: counts %lld to and %lld from rank %d", comm->name,
                   (long long)send_counts[q], (long long)recv_counts[q], q);
        if (q != comm->rank) sent += (uint64_t)send_counts[q] * ct_dtype_size(dtype);
    }
    CT_ASSERTF(send_counts[comm->rank] == recv_counts[comm->rank],
               "all_to_all_v on group %s: rank %d sends itself %lld elements but receives %lld",
               comm->name, comm->rank, (long long)send_counts[comm->rank],
               (long long)recv_counts[comm->rank]);
    comm->calls[CT_COMM_ALL_TO_ALL_V]++;
    comm->bytes[CT_COMM_ALL_TO_ALL_V] += sent;
    after_compute(comm);
    RECORDED(comm, CT_COMM_ALL_TO_ALL_V, dtype, (int64_t)(sent / ct_dtype_size(dtype)),
             comm->iface->all_to_all_v(comm->ctx, send, send_counts, recv, recv_counts, dtype));
}

void ct_comm_barrier(ct_comm *comm) {
    comm->calls[CT_COMM_BARRIER]++;
    if (comm->size > 1)
        RECORDED(comm, CT_COMM_BARRIER, CT_DTYPE_U8, 0, comm->iface->barrier(comm->ctx));
}

int ct_comm_max_tag(const ct_comm *comm) {
    return comm->iface->max_tag ? comm->iface->max_tag(comm->ctx) : INT_MAX;
}

void ct_comm_reset_counters(ct_comm *comm) {
    memset(comm->bytes, 0, sizeof comm->bytes);
    memset(comm->calls, 0, sizeof comm->calls);
    comm->seconds = 0.0;
}

void ct_comm_free(ct_comm *comm) {
    if (!comm) return;
    if (comm->iface->free_comm) comm->iface->free_comm(comm->ctx);
    ct_flight_forget(comm);
    free(comm->members);
    free(comm);
}

/* ---- the local group: one rank, so every collective is the identity ------------------------ */

/* With one rank reduce_scatter, allgather and all_to_all are plain copies of n elements. Buffers
 * may be device memory, so a bound group (ct_comm_set_stream) copies through its backend. */
/* The one copy of the local group: through the stream's backend when the group has one (device
 * memory, and ordered with the compute around it), else on the host. */
static void local_copy(ct_comm *comm, void *dst, const void *src, int64_t n, ct_dtype dtype) {
    if (dst == src || n == 0) return;
    size_t bytes = (size_t)n * ct_dtype_size(dtype);
    if (comm->stream)
        comm->stream->iface->copy(comm->stream->ctx, dst, src, bytes);
    else
        memmove(dst, src, bytes);
}

static void local_reduce_scatter(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype,
                                 ct_reduce_op op) {
    local_copy(ctx, recv, send, n, dtype);
}

static void local_allgather(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype) {
    local_copy(ctx, recv, send, n, dtype);
}

static ct_comm_request *local_p2p(void *ctx, const void *buf, int64_t n, ct_dtype dtype, int peer,
                                  int tag) {
    CT_ASSERTF(0, "point-to-point on a one-rank group (peer %d, tag %d)", peer, tag);
}

static ct_comm_request *local_irecv(void *ctx, void *buf, int64_t n, ct_dtype dtype, int peer,
                                    int tag) {
    return local_p2p(ctx, buf, n, dtype, peer, tag);
}

static void local_wait(void *ctx, ct_comm_request *req) {}

static ct_comm_request *local_ireduce_scatter(void *ctx, const void *send, void *recv, int64_t n,
                                              ct_dtype dtype, ct_reduce_op op) {
    local_reduce_scatter(ctx, send, recv, n, dtype, op);
    return NULL;
}

static ct_comm_request *local_iallgather(void *ctx, const void *send, void *recv, int64_t n,
                                         ct_dtype dtype) {
    local_allgather(ctx, send, recv, n, dtype);
    return NULL;
}

static void local_all_to_all(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype) {
    local_copy(ctx, recv, send, n, dtype);
}

static void local_all_to_all_v(void *ctx, const void *send, const int64_t *send_counts, void *recv,
                               const int64_t *recv_counts, ct_dtype dtype) {
    (void)recv_counts; /* == send_counts[0] (the wrapper checked) */
    local_copy(ctx, recv, send, send_counts[0], dtype);
}

static const struct ct_comm_i local_iface = {
    .allreduce = NULL, /* never called: the wrapper skips groups of one */
    .reduce_scatter = local_reduce_scatter,
    .allgather = local_allgather,
    .broadcast = NULL, /* never called */
    .isend = local_p2p,
    .irecv = local_irecv,
    .iallreduce = NULL, /* never called */
    .ireduce_scatter = local_ireduce_scatter,
    .iallgather = local_iallgather,
    .wait = local_wait,
    .test = NULL,
    .poll = NULL,
    .all_to_all = local_all_to_all,
    .all_to_all_v = local_all_to_all_v,
    .barrier = NULL, /* never called */
    .max_tag = NULL, /* INT_MAX: there is no point-to-point on one rank anyway */
    .free_comm = NULL,
};

ct_comm *ct_comm_local_new(const char *name) {
    ct_comm *comm = ct_xcalloc(1, sizeof *comm);
    comm->iface = &local_iface;
    comm->ctx = comm; /* the local slots need the group itself (its stream) */
    comm->name = name;
    comm->rank = 0;
    comm->size = 1;
    return comm;
}
