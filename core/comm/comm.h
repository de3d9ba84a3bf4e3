/*
 * comm.h — collectives on one group of ranks (core/README.md, The comm interface).
 *
 * A communicator (ct_comm) is a group: a table of function pointers plus a context, reached
 * through the wrappers below. Implementations: the local one here (a group of one rank: every
 * collective is a copy or nothing, and counts zero bytes), the MPI one in parallel/ (host
 * memory), the NCCL one in cuda/ (device memory, on a communication stream).
 *
 * Buffers are backend memory given as (pointer, element count, dtype). Reductions take an op.
 * "n" below is the element count of the FULL buffer: for reduce_scatter, `send` holds n elements
 * and `recv` n / size; for allgather, `send` holds n / size and `recv` n.
 *
 * Byte counters, per group and per op kind, follow the ring model whatever algorithm the library
 * really uses (bytes = n·dtype size, N = group size): allreduce 2·bytes·(N−1)/N, reduce_scatter
 * and allgather bytes·(N−1)/N, all_to_all bytes·(N−1)/N, send bytes, broadcast bytes at the
 * root and 0 elsewhere. Tests and `plan` check communication volume with them. The variable
 * all_to_all_v counts the bytes this rank really sends to other ranks (its own block stays).
 */
#ifndef CT_COMM_H
#define CT_COMM_H

#include "core/common.h"

typedef enum ct_reduce_op { CT_REDUCE_SUM = 0, CT_REDUCE_MAX, CT_REDUCE_MIN } ct_reduce_op;

typedef enum ct_comm_op_kind {
    CT_COMM_ALLREDUCE = 0,
    CT_COMM_REDUCE_SCATTER,
    CT_COMM_ALLGATHER,
    CT_COMM_BROADCAST,
    CT_COMM_SEND,
    CT_COMM_ALL_TO_ALL,
    CT_COMM_ALL_TO_ALL_V,
    CT_COMM_BARRIER,
    CT_COMM_OP_COUNT
} ct_comm_op_kind;

const char *ct_comm_op_name(ct_comm_op_kind kind);

struct ct_backend; /* backend.h: the memory buffers live in, for ordering */

/* A pending non-blocking operation; completed by ct_comm_wait. */
typedef struct ct_comm_request ct_comm_request;

struct ct_comm_i {
    void (*allreduce)(void *ctx, void *buf, int64_t n, ct_dtype dtype, ct_reduce_op op);
    void (*reduce_scatter)(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype,
                           ct_reduce_op op);
    void (*allgather)(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype);
    void (*broadcast)(void *ctx, void *buf, int64_t n, ct_dtype dtype, int root);
    ct_comm_request *(*isend)(void *ctx, const void *buf, int64_t n, ct_dtype dtype, int peer,
                              int tag);
    ct_comm_request *(*irecv)(void *ctx, void *buf, int64_t n, ct_dtype dtype, int peer, int tag);
    /* Non-blocking collectives: started now, completed by wait (or seen complete by test).
     * NULL request means "already complete". Same buffer rules as the blocking forms. */
    ct_comm_request *(*iallreduce)(void *ctx, void *buf, int64_t n, ct_dtype dtype,
                                   ct_reduce_op op);
    ct_comm_request *(*ireduce_scatter)(void *ctx, const void *send, void *recv, int64_t n,
                                        ct_dtype dtype, ct_reduce_op op);
    ct_comm_request *(*iallgather)(void *ctx, const void *send, void *recv, int64_t n,
                                   ct_dtype dtype);
    /* Completes and frees the request; on timeout the implementation reports and aborts. */
    void (*wait)(void *ctx, ct_comm_request *req);
    bool (*test)(void *ctx, ct_comm_request *req); /* NULL: always complete */
    /* Lets outstanding operations progress (MPI has no progress thread); NULL: nothing to do. */
    void (*poll)(void *ctx);
    void (*all_to_all)(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype);
    /* ct_comm_all_to_all_v's exchange (counts already checked by the wrapper). */
    void (*all_to_all_v)(void *ctx, const void *send, const int64_t *send_counts, void *recv,
                         const int64_t *recv_counts, ct_dtype dtype);
    void (*barrier)(void *ctx);
    /* Orders this group's next operation after the compute issued so far on `be` (whose memory
     * the buffers are), recorded as event `event`: a communication stream would wait for the
     * event on the device. NULL: the host waits for the event (the MPI implementation, which
     * reads and writes the buffers from the host). */
    void (*wait_compute)(void *ctx, struct ct_backend *be, int event);
    /* The largest point-to-point tag the group accepts (MPI_TAG_UB for MPI); NULL: INT_MAX. */
    int (*max_tag)(void *ctx);
    void (*free_comm)(void *ctx); /* NULL: nothing to release */
    /* Operations complete on a device stream after the call returns (NCCL): the flight recorder
     * marks them enqueued, and the implementation ends their records (ct_flight_end). */
    bool completes_later;
};

typedef struct ct_comm {
    const struct ct_comm_i *iface;
    void *ctx;
    /* The backend whose memory this group's buffers are (ct_comm_set_stream); NULL: host
     * memory, written by nobody else while an operation runs. */
    struct ct_backend *stream;
    const char *name; /* "tp", "dp", "pp", "mp", "embed", "world" */
    int rank, size;
    uint64_t bytes[CT_COMM_OP_COUNT]; /* ring-model bytes sent by this rank */
    uint64_t calls[CT_COMM_OP_COUNT];
    double seconds; /* wall time spent inside blocking collectives and waits (groups of > 1) */
    int *members;   /* the members' world ranks in group order (owned); NULL when unknown */
    struct ct_flight_group *flight; /* the flight recorder's counters (flight.c) */
} ct_comm;

/* A group of one rank (world size 1, or tp = 1 inside a bigger job). */
ct_comm *ct_comm_local_new(const char *name);
/*
 * Ordering against compute (core/README.md, Ordering). After ct_comm_set_stream(comm, be), every
 * operation the group starts on buffers of `be`'s memory is ordered after the ops issued on `be`
 * before it: they may still be running (an asynchronous backend), and a collective must neither
 * read a buffer before the op that writes it has run nor overwrite one an earlier op still reads. A
 * completed operation (a blocking one on return, a non-blocking one when ct_comm_wait returns)
 * is seen by every op issued on `be` after that. The one-rank group copies through `be` instead
 * of the host, so its copies need no wait at all. Whoever puts tensors on a group binds it and
 * unbinds it when done: the model its tp group, data_parallel its dp group, the pipeline its pp
 * and embedding groups. Groups that carry host scalars only (mp, world) stay unbound; a bound
 * group of several ranks may carry host buffers too (the wait is then merely unneeded), but the
 * one-rank group copies through its backend, so its callers keep host buffers off it.
 */
void ct_comm_set_stream(ct_comm *comm, struct ct_backend *be);
/* Unbinds `comm` if it is bound to `be` (whoever bound it calls this before `be` may be freed). */
void ct_comm_unset_stream(ct_comm *comm, const struct ct_backend *be);
/* The event a comm records on its stream before it reads or writes the buffers. */
#define CT_EVENT_COMM 0
void ct_comm_free(ct_comm *comm); /* accepts NULL */

void ct_comm_allreduce(ct_comm *comm, void *buf, int64_t n, ct_dtype dtype, ct_reduce_op op);
void ct_comm_reduce_scatter(ct_comm *comm, const void *send, void *recv, int64_t n, ct_dtype dtype,
                            ct_reduce_op op);
void ct_comm_allgather(ct_comm *comm, const void *send, void *recv, int64_t n, ct_dtype dtype);
void ct_comm_broadcast(ct_comm *comm, void *buf, int64_t n, ct_dtype dtype, int root);
ct_comm_request *ct_comm_isend(ct_comm *comm, const void *buf, int64_t n, ct_dtype dtype, int peer,
                               int tag);
ct_comm_request *ct_comm_irecv(ct_comm *comm, void *buf, int64_t n, ct_dtype dtype, int peer,
                               int tag);
/* Non-blocking collectives (counted when started). Complete with ct_comm_wait. */
ct_comm_request *ct_comm_iallreduce(ct_comm *comm, void *buf, int64_t n, ct_dtype dtype,
                                    ct_reduce_op op);
ct_comm_request *ct_comm_ireduce_scatter(ct_comm *comm, const void *send, void *recv, int64_t n,
                                         ct_dtype dtype, ct_reduce_op op);
ct_comm_request *ct_comm_iallgather(ct_comm *comm, const void *send, void *recv, int64_t n,
                                    ct_dtype dtype);
/* Waits for and frees a request (NULL is a no-op). */
void ct_comm_wait(ct_comm *comm, ct_comm_request *req);
/* True when the request has completed (it must still be passed to ct_comm_wait). */
bool ct_comm_test(ct_comm *comm, ct_comm_request *req);
/* Drives progress of this group's outstanding operations; call it between compute ops. */
void ct_comm_poll(ct_comm *comm);
void ct_comm_all_to_all(ct_comm *comm, const void *send, void *recv, int64_t n, ct_dtype dtype);
/*
 * The variable all-to-all: this rank sends send_counts[q] elements to rank q and receives
 * recv_counts[q] from it. `send` holds the blocks for ranks 0, 1, ... one after another, `recv`
 * gets the blocks from ranks 0, 1, ... one after another; the count arrays (comm->size each) are
 * host memory, the buffers the group's memory, and they must not overlap. Blocking.
 *
 * Every rank must agree: send_counts[q] on this rank equals recv_counts[this rank] on rank q.
 * Nothing here can check that across ranks, and a disagreement leaves a receive waiting (the
 * collective timeout then reports it), so callers exchange the counts first — an all_to_all of
 * one int64 per rank, counted as all_to_all — and pass what they received. The rank's own block
 * (send_counts[rank] == recv_counts[rank], asserted) is a local copy; counted: the bytes sent to
 * the other ranks.
 */
void ct_comm_all_to_all_v(ct_comm *comm, const void *send, const int64_t *send_counts, void *recv,
                          const int64_t *recv_counts, ct_dtype dtype);
void ct_comm_barrier(ct_comm *comm);

/* The largest tag isend/irecv accept on this group: tags must lie in [0, ct_comm_max_tag], and
 * one outside is a caller's bug (CT_ASSERT). MPI only promises 32767 and the bound differs
 * between transports (Open MPI's ob1 allows INT_MAX), so code that builds tags from indices (the
 * pipeline's microbatch and stage numbers) asks here instead of assuming. INT_MAX for groups
 * without a bound (the local group). */
int ct_comm_max_tag(const ct_comm *comm);

/* Clears the byte, call and time counters. */
void ct_comm_reset_counters(ct_comm *comm);

#endif /* CT_COMM_H */
