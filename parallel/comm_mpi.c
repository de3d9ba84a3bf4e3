/*
 * comm_mpi.c — the MPI group (comm_mpi.h): non-blocking MPI calls, the outstanding-request list
 * that poll drives, and the waiting watchdog.
 */
#define _GNU_SOURCE
#include "comm_mpi.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One group: the communicator plus the bookkeeping the watchdog and poll need. */
typedef struct mpi_group {
    MPI_Comm comm;
    char *name;
    int rank, size;
    double timeout_s;
    uint64_t coll_seq; /* collectives started: the same sequence on every rank of the group */
    uint64_t p2p_seq;  /* sends and receives started by this rank */
    ct_comm_request *pending; /* started, not yet seen complete (doubly linked) */
    int n_pending;
    /* scratch for MPI_Testsome in poll, grown on demand */
    MPI_Request *poll_mpi;
    int *poll_idx;
    ct_comm_request **poll_req;
    int poll_cap;
} mpi_group;

struct ct_comm_request {
    MPI_Request mpi;
    mpi_group *group;
    bool done;
    /* what it is, for the watchdog's message */
    ct_comm_op_kind kind; /* CT_COMM_SEND for both directions of point-to-point */
    bool is_recv;
    int peer, tag;
    ct_dtype dtype;
    bool reduces;
    ct_reduce_op op;
    uint64_t bytes; /* the buffer this rank passes, n · dtype size */
    uint64_t seq;
    /* in-place reduce_scatter: MPI leaves the shard at the buffer's start; moved on completion */
    void *move_dst;
    const void *move_src;
    size_t move_bytes;
    ct_comm_request *prev, *next;
};

/* ---- MPI error checks -------------------------------------------------------------------- */

void ct_mpi_check_fail(const char *call, int rc, const char *file, int line) {
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = '\0';
    fprintf(stderr, "cooktrain: internal error on rank %d at %s:%d: MPI call `%s` failed: %s\n",
            ct_log_rank(), file, line, call, len ? msg : "(no error string)");
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    abort(); /* MPI_Abort does not return, but is not declared noreturn */
}

/* ---- dtypes and ops ---------------------------------------------------------------------- */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; NaN stays a (quiet) NaN instead of rounding into infinity. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* MPI user ops: inout[i] = in[i] ∘ inout[i], computed in float and rounded once. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        if (bf16_to_f32(a[i]) > bf16_to_f32(b[i])) b[i] = a[i];
}

static void bf16_min(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        if (bf16_to_f32(a[i]) < bf16_to_f32(b[i])) b[i] = a[i];
}

/* u8 sums wrap modulo 256 (C and the MPI standard). Open MPI 4.1's AVX op component adds 8-bit
 * integers with saturating instructions instead (open-mpi/ompi#8045, closed as wontfix), so the
 * predefined MPI_SUM cannot be trusted on MPI_UINT8_T. */
static void u8_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint8_t *a = in;
    uint8_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = (uint8_t)(a[i] + b[i]);
}

static MPI_Op bf16_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
static MPI_Op u8_sum_op = MPI_OP_NULL;

/* Created on first use, from the main thread (MPI_THREAD_FUNNELED). */
static void create_user_ops(void) {
    if (u8_sum_op != MPI_OP_NULL) return;
    CT_MPI_CHECK(MPI_Op_create(bf16_sum, 1, &bf16_ops[CT_REDUCE_SUM]));
    CT_MPI_CHECK(MPI_Op_create(bf16_max, 1, &bf16_ops[CT_REDUCE_MAX]));
    CT_MPI_CHECK(MPI_Op_create(bf16_min, 1, &bf16_ops[CT_REDUCE_MIN]));
    CT_MPI_CHECK(MPI_Op_create(u8_sum, 1, &u8_sum_op));
}

void ct_comm_mpi_release_ops(void) {
    for (int i = 0; i < 3; i++)
        if (bf16_ops[i] != MPI_OP_NULL) MPI_Op_free(&bf16_ops[i]);
    if (u8_sum_op != MPI_OP_NULL) MPI_Op_free(&u8_sum_op);
}

/* bf16 travels as 16-bit integers: MPI has no bf16 type, and only our user ops interpret it. */
static MPI_Datatype mpi_type(ct_dtype dtype) {
    switch (dtype) {
    case CT_DTYPE_F32: return MPI_FLOAT;
    case CT_DTYPE_BF16: return MPI_UINT16_T;
    case CT_DTYPE_I32: return MPI_INT32_T;
    case CT_DTYPE_I64: return MPI_INT64_T;
    case CT_DTYPE_U8: return MPI_UINT8_T;
    case CT_DTYPE_F64: return MPI_DOUBLE;
    }
    CT_ASSERTF(0, "unknown dtype %d", (int)dtype);
}

static MPI_Op mpi_op(ct_dtype dtype, ct_reduce_op op) {
    CT_ASSERTF(op == CT_REDUCE_SUM || op == CT_REDUCE_MAX || op == CT_REDUCE_MIN,
               "unknown reduce op %d", (int)op);
    if (dtype == CT_DTYPE_BF16) return bf16_ops[op];
    if (dtype == CT_DTYPE_U8 && op == CT_REDUCE_SUM) return u8_sum_op;
    return op == CT_REDUCE_SUM ? MPI_SUM : op == CT_REDUCE_MAX ? MPI_MAX : MPI_MIN;
}

static const char *reduce_op_name(ct_reduce_op op) {
    return op == CT_REDUCE_SUM ? "sum" : op == CT_REDUCE_MAX ? "max" : "min";
}

static int mpi_count(int64_t n, const char *what) {
    CT_ASSERTF(n >= 0 && n <= INT_MAX, "%s of %lld elements per rank: MPI counts are int", what,
               (long long)n);
    return (int)n;
}

static bool overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    const char *pa = a, *pb = b;
    return a_bytes && b_bytes && pa < pb + b_bytes && pb < pa + a_bytes;
}

/* ---- requests: start, completion, the watchdog -------------------------------------------- */

static ct_comm_request *request_new(mpi_group *g, ct_comm_op_kind kind, ct_dtype dtype, int64_t n) {
    ct_comm_request *req = ct_xcalloc(1, sizeof *req);
    req->mpi = MPI_REQUEST_NULL;
    req->group = g;
    req->kind = kind;
    req->dtype = dtype;
    req->bytes = (uint64_t)n * ct_dtype_size(dtype);
    req->seq = kind == CT_COMM_SEND ? ++g->p2p_seq : ++g->coll_seq;
    return req;
}

/* Called right after the MPI call that filled req->mpi. */
static ct_comm_request *request_track(mpi_group *g, ct_comm_request *req) {
    req->next = g->pending;
    if (g->pending) g->pending->prev = req;
    g->pending = req;
    g->n_pending++;
    return req;
}

/* The MPI request has finished (its handle is already MPI_REQUEST_NULL): finish our side. */
static void request_complete(mpi_group *g, ct_comm_request *req) {
    if (req->move_bytes) memmove(req->move_dst, req->move_src, req->move_bytes);
    req->done = true;
    if (req->prev)
        req->prev->next = req->next;
    else
        g->pending = req->next;
    if (req->next) req->next->prev = req->prev;
    req->prev = req->next = NULL;
    g->n_pending--;
}

static const char *ordinal_suffix(uint64_t k) {
    if (k % 100 >= 11 && k % 100 <= 13) return "th";
    switch (k % 10) {
    case 1: return "st";
    case 2: return "nd";
    case 3: return "rd";
    default: return "th";
    }
}

/* Nobody recovers from a lost collective: the other ranks are stuck in it. Say exactly which one
 * it was — the sequence number lets the reader line up this rank's report with the others' —
 * then end the whole job rather than hang until the scheduler's limit. */
__attribute__((noreturn)) static void watchdog_fire(mpi_group *g, ct_comm_request *req,
                                                    double waited) {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    char op[96];
    if (req->kind == CT_COMM_SEND)
        snprintf(op, sizeof op, "%s %s group rank %d (tag %d, %s)", req->is_recv ? "recv" : "send",
                 req->is_recv ? "from" : "to", req->peer, req->tag, ct_dtype_name(req->dtype));
    else if (req->reduces)
        snprintf(op, sizeof op, "%s (%s %s)", ct_comm_op_name(req->kind), ct_dtype_name(req->dtype),
                 reduce_op_name(req->op));
    else if (req->kind == CT_COMM_BARRIER)
        snprintf(op, sizeof op, "barrier");
    else
        snprintf(op, sizeof op, "%s (%s)", ct_comm_op_name(req->kind), ct_dtype_name(req->dtype));
    bool p2p = req->kind == CT_COMM_SEND;
    /* One fprintf, so the lines of different ranks do not interleave. */
    fprintf(stderr,
            "cooktrain: %s timed out on rank %d: group %s (rank %d of %d), op %s, %llu bytes, "
            "sequence #%llu (the %llu%s %s on this group), waited %.1f s\n"
            "hint: %s, or is much slower; raise parallel.timeout_s (now %g s) if it is just "
            "slow\n",
            p2p ? "point-to-point operation" : "collective", world_rank, g->name, g->rank, g->size,
            op, (unsigned long long)req->bytes, (unsigned long long)req->seq,
            (unsigned long long)req->seq, ordinal_suffix(req->seq),
            p2p ? "point-to-point operation" : "collective", waited,
            p2p ? "the peer did not post the matching operation"
                : "another rank did not reach this collective",
            g->timeout_s);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    abort();
}

/* Waiting politely: ranks often outnumber cores (tests, laptops), and a rank that spins takes
 * the core its peer needs to reach the collective. Spin-yield for the first millisecond (short
 * operations finish without a sleep's latency), then sleep briefly between tests. */
static void idle(double waited) {
    if (waited < 1e-3) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, waited < 1e-2 ? 50000 : 200000};
    nanosleep(&ts, NULL);
}

/* ---- the interface slots ------------------------------------------------------------------ */

static void mpi_wait(void *ctx, ct_comm_request *req) {
    mpi_group *g = ctx;
    CT_ASSERTF(req->group == g, "request of group %s waited on group %s", req->group->name,
               g->name);
    double t0 = ct_now();
    while (!req->done) {
        int flag = 0;
        CT_MPI_CHECK(MPI_Test(&req->mpi, &flag, MPI_STATUS_IGNORE));
        if (flag) {
            request_complete(g, req);
            break;
        }
        double waited = ct_now() - t0;
        if (g->timeout_s > 0 && waited > g->timeout_s) watchdog_fire(g, req, waited);
        idle(waited);
    }
    free(req);
}

static bool mpi_test(void *ctx, ct_comm_request *req) {
    mpi_group *g = ctx;
    if (!req->done) {
        int flag = 0;
        CT_MPI_CHECK(MPI_Test(&req->mpi, &flag, MPI_STATUS_IGNORE));
        if (flag) request_complete(g, req);
    }
    return req->done;
}

/* One MPI_Testsome over every pending request: one pass of the progress engine advances all of
 * them (each round of a non-blocking collective needs such a pass to move on). */
static void mpi_poll(void *ctx) {
    mpi_group *g = ctx;
    if (!g->pending) return;
    if (g->n_pending > g->poll_cap) {
        g->poll_cap = CT_MAX(2 * g->poll_cap, g->n_pending);
        free(g->poll_mpi);
        free(g->poll_idx);
        free(g->poll_req);
        g->poll_mpi = ct_xmalloc((size_t)g->poll_cap * sizeof *g->poll_mpi);
        g->poll_idx = ct_xmalloc((size_t)g->poll_cap * sizeof *g->poll_idx);
        g->poll_req = ct_xmalloc((size_t)g->poll_cap * sizeof *g->poll_req);
    }
    int n = 0;
    for (ct_comm_request *r = g->pending; r; r = r->next) {
        g->poll_mpi[n] = r->mpi;
        g->poll_req[n++] = r;
    }
    int done = 0;
    CT_MPI_CHECK(MPI_Testsome(n, g->poll_mpi, &done, g->poll_idx, MPI_STATUSES_IGNORE));
    if (done == MPI_UNDEFINED) return;
    for (int i = 0; i < done; i++) {
        ct_comm_request *r = g->poll_req[g->poll_idx[i]];
        r->mpi = MPI_REQUEST_NULL;
        request_complete(g, r);
    }
}

static ct_comm_request *mpi_iallreduce(void *ctx, void *buf, int64_t n, ct_dtype dtype,
                                       ct_reduce_op op) {
    mpi_group *g = ctx;
    int count = mpi_count(n, "allreduce");
    ct_comm_request *req = request_new(g, CT_COMM_ALLREDUCE, dtype, n);
    req->reduces = true;
    req->op = op;
    CT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, count, mpi_type(dtype), mpi_op(dtype, op),
                                g->comm, &req->mpi));
    return request_track(g, req);
}

static ct_comm_request *mpi_ireduce_scatter(void *ctx, const void *send, void *recv, int64_t n,
                                            ct_dtype dtype, ct_reduce_op op) {
    mpi_group *g = ctx;
    CT_ASSERTF(n % g->size == 0, "reduce_scatter of %lld elements over %d ranks", (long long)n,
               g->size);
    int count = mpi_count(n / g->size, "reduce_scatter");
    size_t esz = ct_dtype_size(dtype), shard = (size_t)count * esz;
    ct_comm_request *req = request_new(g, CT_COMM_REDUCE_SCATTER, dtype, n);
    req->reduces = true;
    req->op = op;
    MPI_Datatype dt = mpi_type(dtype);
    MPI_Op mop = mpi_op(dtype, op);
    /* The interface's send is const for the out-of-place form; in place the caller handed us
     * the whole buffer to work in. */
    char *full = (char *)(uintptr_t)send;
    if ((char *)recv == full + (size_t)g->rank * shard) {
        /* MPI's in-place form reads the full buffer and leaves the shard at its start. */
        CT_MPI_CHECK(
            MPI_Ireduce_scatter_block(MPI_IN_PLACE, full, count, dt, mop, g->comm, &req->mpi));
        if (g->rank != 0) {
            req->move_dst = recv;
            req->move_src = full;
            req->move_bytes = shard;
        }
    } else {
        CT_ASSERTF(!overlaps(send, (size_t)n * esz, recv, shard),
                   "reduce_scatter on group %s: recv overlaps send but is not this rank's shard "
                   "(in place needs recv == send + rank*n/size)",
                   g->name);
        CT_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, count, dt, mop, g->comm, &req->mpi));
    }
    return request_track(g, req);
}

static ct_comm_request *mpi_iallgather(void *ctx, const void *send, void *recv, int64_t n,
                                       ct_dtype dtype) {
    mpi_group *g = ctx;
    CT_ASSERTF(n % g->size == 0, "allgather of %lld elements over %d ranks", (long long)n, g->size);
    int count = mpi_count(n / g->size, "allgather");
    size_t esz = ct_dtype_size(dtype), shard = (size_t)count * esz;
    ct_comm_request *req = request_new(g, CT_COMM_ALLGATHER, dtype, n);
    MPI_Datatype dt = mpi_type(dtype);
    if ((const char *)send == (char *)recv + (size_t)g->rank * shard) {
        CT_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, count, dt, g->comm,
                                    &req->mpi));
    } else {
        CT_ASSERTF(!overlaps(send, shard, recv, (size_t)n * esz),
                   "allgather on group %s: send overlaps recv but is not this rank's shard "
                   "(in place needs send == recv + rank*n/size)",
                   g->name);
        CT_MPI_CHECK(MPI_Iallgather(send, count, dt, recv, count, dt, g->comm, &req->mpi));
    }
    return request_track(g, req);
}

static ct_comm_request *mpi_ibroadcast(mpi_group *g, void *buf, int64_t n, ct_dtype dtype,
                                       int root) {
    CT_ASSERTF(root >= 0 && root < g->size, "broadcast root %d on group %s of %d ranks", root,
               g->name, g->size);
    int count = mpi_count(n, "broadcast");
    ct_comm_request *req = request_new(g, CT_COMM_BROADCAST, dtype, n);
    CT_MPI_CHECK(MPI_Ibcast(buf, count, mpi_type(dtype), root, g->comm, &req->mpi));
    return request_track(g, req);
}

static ct_comm_request *mpi_iall_to_all(mpi_group *g, const void *send, void *recv, int64_t n,
                                        ct_dtype dtype) {
    CT_ASSERTF(n % g->size == 0, "all_to_all of %lld elements over %d ranks", (long long)n,
               g->size);
    int count = mpi_count(n / g->size, "all_to_all");
    size_t bytes = (size_t)n * ct_dtype_size(dtype);
    ct_comm_request *req = request_new(g, CT_COMM_ALL_TO_ALL, dtype, n);
    MPI_Datatype dt = mpi_type(dtype);
    if (send == recv) {
        CT_MPI_CHECK(
            MPI_Ialltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, count, dt, g->comm, &req->mpi));
    } else {
        CT_ASSERTF(!overlaps(send, bytes, recv, bytes),
                   "all_to_all on group %s: send and recv overlap but are not equal", g->name);
        CT_MPI_CHECK(MPI_Ialltoall(send, count, dt, recv, count, dt, g->comm, &req->mpi));
    }
    return request_track(g, req);
}

static ct_comm_request *mpi_ip2p(mpi_group *g, bool is_recv, void *buf, int64_t n, ct_dtype dtype,
                                 int peer, int tag) {
    CT_ASSERTF(peer >= 0 && peer < g->size, "%s peer %d on group %s of %d ranks",
               is_recv ? "recv" : "send", peer, g->name, g->size);
    int count = mpi_count(n, is_recv ? "recv" : "send");
    ct_comm_request *req = request_new(g, CT_COMM_SEND, dtype, n);
    req->is_recv = is_recv;
    req->peer = peer;
    req->tag = tag;
    if (is_recv)
        CT_MPI_CHECK(MPI_Irecv(buf, count, mpi_type(dtype), peer, tag, g->comm, &req->mpi));
    else
        CT_MPI_CHECK(MPI_Isend(buf, count, mpi_type(dtype), peer, tag, g->comm, &req->mpi));
    return request_track(g, req);
}

static ct_comm_request *mpi_isend(void *ctx, const void *buf, int64_t n, ct_dtype dtype, int peer,
                                  int tag) {
    return mpi_ip2p(ctx, false, (void *)(uintptr_t)buf, n, dtype, peer, tag);
}

static ct_comm_request *mpi_irecv(void *ctx, void *buf, int64_t n, ct_dtype dtype, int peer,
                                  int tag) {
    return mpi_ip2p(ctx, true, buf, n, dtype, peer, tag);
}

/* The blocking forms: the non-blocking start plus the watchdog's wait. */
static void mpi_allreduce(void *ctx, void *buf, int64_t n, ct_dtype dtype, ct_reduce_op op) {
    mpi_wait(ctx, mpi_iallreduce(ctx, buf, n, dtype, op));
}

static void mpi_reduce_scatter(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype,
                               ct_reduce_op op) {
    mpi_wait(ctx, mpi_ireduce_scatter(ctx, send, recv, n, dtype, op));
}

static void mpi_allgather(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype) {
    mpi_wait(ctx, mpi_iallgather(ctx, send, recv, n, dtype));
}

static void mpi_broadcast(void *ctx, void *buf, int64_t n, ct_dtype dtype, int root) {
    mpi_wait(ctx, mpi_ibroadcast(ctx, buf, n, dtype, root));
}

static void mpi_all_to_all(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype) {
    mpi_wait(ctx, mpi_iall_to_all(ctx, send, recv, n, dtype));
}

static void mpi_barrier(void *ctx) {
    mpi_group *g = ctx;
    ct_comm_request *req = request_new(g, CT_COMM_BARRIER, CT_DTYPE_U8, 0);
    CT_MPI_CHECK(MPI_Ibarrier(g->comm, &req->mpi));
    mpi_wait(g, request_track(g, req));
}

static void mpi_free_comm(void *ctx) {
    mpi_group *g = ctx;
    CT_ASSERTF(g->n_pending == 0, "group %s freed with %d operations still pending", g->name,
               g->n_pending);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && g->comm != MPI_COMM_WORLD && g->comm != MPI_COMM_SELF)
        MPI_Comm_free(&g->comm);
    free(g->poll_mpi);
    free(g->poll_idx);
    free(g->poll_req);
    free(g->name);
    free(g);
}

static const struct ct_comm_i mpi_iface = {
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .broadcast = mpi_broadcast,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .iallreduce = mpi_iallreduce,
    .ireduce_scatter = mpi_ireduce_scatter,
    .iallgather = mpi_iallgather,
    .wait = mpi_wait,
    .test = mpi_test,
    .poll = mpi_poll,
    .all_to_all = mpi_all_to_all,
    .barrier = mpi_barrier,
    .free_comm = mpi_free_comm,
};

ct_comm *ct_comm_mpi_new(MPI_Comm comm, const char *name, double timeout_s) {
    CT_ASSERT(comm != MPI_COMM_NULL);
    create_user_ops();
    mpi_group *g = ct_xcalloc(1, sizeof *g);
    g->comm = comm;
    g->name = ct_xstrdup(name);
    g->timeout_s = timeout_s;
    CT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    CT_MPI_CHECK(MPI_Comm_rank(comm, &g->rank));
    CT_MPI_CHECK(MPI_Comm_size(comm, &g->size));

    ct_comm *c = ct_xcalloc(1, sizeof *c);
    c->iface = &mpi_iface;
    c->ctx = g;
    c->name = g->name;
    c->rank = g->rank;
    c->size = g->size;
    return c;
}

MPI_Comm ct_comm_mpi_handle(const ct_comm *comm) {
    if (!comm || comm->iface != &mpi_iface) return MPI_COMM_NULL;
    return ((const mpi_group *)comm->ctx)->comm;
}
