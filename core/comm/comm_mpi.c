/*
 * comm_mpi.c — the MPI group (comm_mpi.h): non-blocking MPI calls, the outstanding-request list
 * that poll drives, and the waiting watchdog.
 */
#define _GNU_SOURCE
#include "comm_mpi.h"

#include "core/comm/flight.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One group: the communicator plus the bookkeeping the watchdog and poll need. */
typedef struct mpi_group {
    MPI_Comm comm;
    /* all_to_all's point-to-point pieces travel on a duplicate, so they can never match the
     * caller's sends and receives whatever their tags; made on first need (a2a_comm_get) */
    MPI_Comm a2a_comm;
    char *name;
    int rank, size;
    int tag_ub; /* MPI_TAG_UB: point-to-point tags must lie in [0, tag_ub] */
    double timeout_s;
    /* Inside a blocking operation: its pieces are blocking MPI calls (Open MPI's tuned
     * algorithms, no request to poll), watched by the watchdog thread. */
    bool blocking;
    uint64_t coll_seq; /* collectives started: the same sequence on every rank of the group */
    uint64_t p2p_seq;  /* sends and receives started by this rank */
    ct_comm_request *pending; /* started, not yet seen complete (doubly linked) */
    int n_pending;
    /* scratch for MPI_Testsome in test and poll, grown on demand: handle, owner, piece index */
    MPI_Request *poll_mpi;
    int *poll_idx;
    ct_comm_request **poll_req;
    int *poll_piece;
    int poll_cap;
} mpi_group;

/* One ct_comm operation: one or more pieces, each one MPI call (comm_mpi.h: counts above the
 * chunk limit are split), finished when every piece has. */
struct ct_comm_request {
    MPI_Request *mpi; /* the pieces; MPI_REQUEST_NULL once a piece has finished */
    int n_mpi, cap_mpi;
    int n_left;      /* pieces not yet finished */
    MPI_Request one; /* `mpi` points here until a second piece is started */
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
    uint64_t seq;   /* one per operation, however many pieces it has */
    /* in-place reduce_scatter in one call: MPI leaves the shard at the buffer's start; moved on
     * completion */
    void *move_dst;
    const void *move_src;
    size_t move_bytes;
    void *scratch; /* freed on completion: the in-place all_to_all's copy of its input */
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
    ct_flight_dump("MPI error");
    MPI_Abort(MPI_COMM_WORLD, 1);
    abort(); /* MPI_Abort does not return, but is not declared noreturn */
}

/* ---- dtypes and ops ---------------------------------------------------------------------- */

/* MPI user ops: inout[i] = in[i] ∘ inout[i], computed in float and rounded once. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = ct_f32_to_bf16(ct_bf16_to_f32(a[i]) + ct_bf16_to_f32(b[i]));
}

static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        if (ct_bf16_to_f32(a[i]) > ct_bf16_to_f32(b[i])) b[i] = a[i];
}

static void bf16_min(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        if (ct_bf16_to_f32(a[i]) < ct_bf16_to_f32(b[i])) b[i] = a[i];
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

/* The most elements one MPI call may carry (comm_mpi.h): MPI's count type is int. */
static int64_t chunk_limit = INT_MAX;

void ct_comm_mpi_set_chunk_limit(int64_t elements) {
    CT_ASSERTF(elements <= INT_MAX, "chunk limit %lld elements: MPI counts are int",
               (long long)elements);
    chunk_limit = elements > 0 ? elements : INT_MAX;
}

static bool overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    const char *pa = a, *pb = b;
    return a_bytes && b_bytes && pa < pb + b_bytes && pb < pa + a_bytes;
}

/* ---- the watchdog thread ------------------------------------------------------------------
 *
 * Every wait is a blocking MPI call (MPI_Wait, or the blocking collective itself), which is as
 * fast as raw MPI: polling with MPI_Test and sleeping between tests cost ct_comm half of MPI's
 * bandwidth, because a non-blocking collective advances only inside MPI calls. A blocking call
 * cannot time itself out, so one thread per process watches it: the waiting thread arms the
 * watchdog with the operation before it blocks and disarms it after; the watchdog sleeps until
 * the armed operation's deadline and, if it is still armed then, reports it and ends the job
 * (watchdog_fire). The watchdog calls no MPI function but MPI_Abort, which may be called from
 * any thread to end the job. Oversubscribed ranks should let MPI yield while it waits
 * (OMPI_MCA_mpi_yield_when_idle=1, as the tests set; test/README.md, MPI tests).
 */
__attribute__((noreturn)) static void watchdog_fire(mpi_group *g, ct_comm_request *req,
                                                    double waited);

static struct {
    pthread_once_t once;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    mpi_group *group; /* the armed operation, NULL when none */
    ct_comm_request *req;
    double since; /* ct_now() when it was armed */
    bool idle;    /* the thread waits with no deadline: arming must wake it */
} watchdog = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

static void *watchdog_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&watchdog.mu);
    for (;;) {
        if (!watchdog.req) {
            watchdog.idle = true;
            pthread_cond_wait(&watchdog.wake, &watchdog.mu);
            watchdog.idle = false;
            continue;
        }
        double waited = ct_now() - watchdog.since;
        if (waited > watchdog.group->timeout_s) watchdog_fire(watchdog.group, watchdog.req, waited);
        /* Sleep to the deadline (or until re-armed: the loop re-reads the state). */
        double left = watchdog.group->timeout_s - waited + 1e-3;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)left;
        until.tv_nsec += (long)((left - (double)(time_t)left) * 1e9);
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&watchdog.wake, &watchdog.mu, &until);
    }
    return NULL;
}

static void watchdog_start(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&watchdog.wake, &attr);
    pthread_condattr_destroy(&attr);
    pthread_t thread;
    CT_ASSERTF(pthread_create(&thread, NULL, watchdog_main, NULL) == 0,
               "cannot start the collective watchdog thread");
    pthread_detach(thread);
}

/* The calling thread is about to block in `req` (timeout_s <= 0: unwatched). */
static void watchdog_arm(mpi_group *g, ct_comm_request *req) {
    if (g->timeout_s <= 0) return;
    pthread_once(&watchdog.once, watchdog_start);
    pthread_mutex_lock(&watchdog.mu);
    watchdog.group = g;
    watchdog.req = req;
    watchdog.since = ct_now();
    if (watchdog.idle) pthread_cond_signal(&watchdog.wake);
    pthread_mutex_unlock(&watchdog.mu);
}

/* The operation armed last has completed. */
static void watchdog_disarm(void) {
    if (!watchdog.req) return; /* never armed (timeout_s <= 0): only this thread writes it */
    pthread_mutex_lock(&watchdog.mu);
    watchdog.group = NULL;
    watchdog.req = NULL;
    pthread_mutex_unlock(&watchdog.mu);
}

/* ---- requests: start, completion --------------------------------------------------------------
 */

static ct_comm_request *request_new(mpi_group *g, ct_comm_op_kind kind, ct_dtype dtype, int64_t n) {
    ct_comm_request *req = ct_xcalloc(1, sizeof *req);
    req->mpi = &req->one;
    req->cap_mpi = 1;
    req->group = g;
    req->kind = kind;
    req->dtype = dtype;
    req->bytes = (uint64_t)n * ct_dtype_size(dtype);
    req->seq = kind == CT_COMM_SEND ? ++g->p2p_seq : ++g->coll_seq;
    if (g->blocking) watchdog_arm(g, req);
    return req;
}

/* The handle for the next piece's MPI call to fill. */
static MPI_Request *request_piece(ct_comm_request *req) {
    if (req->n_mpi == req->cap_mpi) {
        CT_ASSERTF(req->cap_mpi <= INT_MAX / 2, "%s split into more than %d pieces",
                   ct_comm_op_name(req->kind), req->cap_mpi);
        req->cap_mpi *= 2;
        MPI_Request *grown = ct_xmalloc((size_t)req->cap_mpi * sizeof *grown);
        memcpy(grown, req->mpi, (size_t)req->n_mpi * sizeof *grown);
        if (req->mpi != &req->one) free(req->mpi);
        req->mpi = grown;
    }
    req->n_left++;
    req->mpi[req->n_mpi] = MPI_REQUEST_NULL;
    return &req->mpi[req->n_mpi++];
}

/* Every piece has finished: finish our side (the request stays allocated until the wait). */
static void request_finish(ct_comm_request *req) {
    if (req->move_bytes) memmove(req->move_dst, req->move_src, req->move_bytes);
    free(req->scratch);
    req->scratch = NULL;
    req->done = true;
}

/* Called once every piece has been started. An operation of no pieces (an all_to_all on a group
 * of one) is complete at once and never pending. */
static ct_comm_request *request_track(mpi_group *g, ct_comm_request *req) {
    if (g->blocking) watchdog_disarm();
    if (req->n_left == 0) {
        request_finish(req);
        return req;
    }
    req->next = g->pending;
    if (g->pending) g->pending->prev = req;
    g->pending = req;
    g->n_pending++;
    return req;
}

/* Piece i has finished (MPI has already set its handle to MPI_REQUEST_NULL). */
static void request_piece_done(mpi_group *g, ct_comm_request *req, int i) {
    req->mpi[i] = MPI_REQUEST_NULL;
    if (--req->n_left > 0) return;
    request_finish(req);
    if (req->prev)
        req->prev->next = req->next;
    else
        g->pending = req->next;
    if (req->next) req->next->prev = req->prev;
    req->prev = req->next = NULL;
    g->n_pending--;
}

/* The scratch arrays of MPI_Testsome, for at least n handles. */
static void scratch_reserve(mpi_group *g, int n) {
    if (n <= g->poll_cap) return;
    g->poll_cap = CT_MAX(2 * g->poll_cap, n);
    free(g->poll_mpi);
    free(g->poll_idx);
    free(g->poll_req);
    free(g->poll_piece);
    g->poll_mpi = ct_xmalloc((size_t)g->poll_cap * sizeof *g->poll_mpi);
    g->poll_idx = ct_xmalloc((size_t)g->poll_cap * sizeof *g->poll_idx);
    g->poll_req = ct_xmalloc((size_t)g->poll_cap * sizeof *g->poll_req);
    g->poll_piece = ct_xmalloc((size_t)g->poll_cap * sizeof *g->poll_piece);
}

/* Tests the unfinished pieces of one request; true once all have finished. */
static bool request_test(mpi_group *g, ct_comm_request *req) {
    if (req->done) return true;
    if (req->n_mpi == 1) {
        int flag = 0;
        CT_MPI_CHECK(MPI_Test(&req->mpi[0], &flag, MPI_STATUS_IGNORE));
        if (flag) request_piece_done(g, req, 0);
        return req->done;
    }
    /* Testsome skips the pieces already finished (their handles are MPI_REQUEST_NULL). */
    scratch_reserve(g, req->n_mpi);
    int done = 0;
    CT_MPI_CHECK(MPI_Testsome(req->n_mpi, req->mpi, &done, g->poll_idx, MPI_STATUSES_IGNORE));
    if (done != MPI_UNDEFINED)
        for (int i = 0; i < done; i++) request_piece_done(g, req, g->poll_idx[i]);
    return req->done;
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
    const int world_rank = ct_log_rank();
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
    /* A split operation says how far it got: pieces finish in any order, so a count is all. */
    char pieces[64] = "";
    if (req->n_mpi > 1)
        snprintf(pieces, sizeof pieces, " in %d pieces (%d unfinished)", req->n_mpi, req->n_left);
    bool p2p = req->kind == CT_COMM_SEND;
    /* One fprintf, so the lines of different ranks do not interleave. */
    fprintf(stderr,
            "cooktrain: %s timed out on rank %d: group %s (rank %d of %d), op %s, %llu bytes%s, "
            "sequence #%llu (the %llu%s %s on this group), waited %.1f s\n"
            "hint: %s, or is much slower; raise parallel.timeout_s (now %g s) if it is just "
            "slow\n",
            p2p ? "point-to-point operation" : "collective", world_rank, g->name, g->rank, g->size,
            op, (unsigned long long)req->bytes, pieces, (unsigned long long)req->seq,
            (unsigned long long)req->seq, ordinal_suffix(req->seq),
            p2p ? "point-to-point operation" : "collective", waited,
            p2p ? "the peer did not post the matching operation"
                : "another rank did not reach this collective",
            g->timeout_s);
    fflush(stderr);
    /* This rank's flight record; a moment for the other ranks' watchdogs to fire and write
     * theirs before the abort ends them (the rest write theirs on the SIGTERM it brings). */
    if (ct_flight_dump("watchdog")) sleep(1);
    MPI_Abort(MPI_COMM_WORLD, 1);
    abort();
}

void ct_mpi_wait(MPI_Request *req) {
    if (!ct_idle_hooked()) {
        CT_MPI_CHECK(MPI_Wait(req, MPI_STATUS_IGNORE));
        return;
    }
    /* A device works on while the host waits; an emulated one only when the host lets it (the
     * idle hook): test and let it, instead of blocking in MPI. */
    int flag = 0;
    for (;;) {
        CT_MPI_CHECK(MPI_Test(req, &flag, MPI_STATUS_IGNORE));
        if (flag) return;
        ct_idle();
        sched_yield();
    }
}

/* ---- the interface slots ------------------------------------------------------------------ */

static void mpi_wait(void *ctx, ct_comm_request *req) {
    mpi_group *g = ctx;
    CT_ASSERTF(req->group == g, "request of group %s waited on group %s", req->group->name,
               g->name);
    if (!req->done) {
        watchdog_arm(g, req);
        for (int i = 0; i < req->n_mpi; i++) {
            if (req->mpi[i] == MPI_REQUEST_NULL) continue; /* finished before */
            ct_mpi_wait(&req->mpi[i]);
            request_piece_done(g, req, i);
        }
        watchdog_disarm();
    }
    if (req->mpi != &req->one) free(req->mpi);
    free(req);
}

static bool mpi_test(void *ctx, ct_comm_request *req) {
    return request_test(ctx, req);
}

/* One MPI_Testsome over every unfinished piece of every pending request: one pass of the
 * progress engine advances all of them (each round of a non-blocking collective needs such a
 * pass to move on). */
static void mpi_poll(void *ctx) {
    mpi_group *g = ctx;
    if (!g->pending) return;
    int n = 0;
    for (ct_comm_request *r = g->pending; r; r = r->next) n += r->n_left;
    scratch_reserve(g, n);
    n = 0;
    for (ct_comm_request *r = g->pending; r; r = r->next)
        for (int i = 0; i < r->n_mpi; i++) {
            if (r->mpi[i] == MPI_REQUEST_NULL) continue;
            g->poll_mpi[n] = r->mpi[i];
            g->poll_req[n] = r;
            g->poll_piece[n++] = i;
        }
    int done = 0;
    CT_MPI_CHECK(MPI_Testsome(n, g->poll_mpi, &done, g->poll_idx, MPI_STATUSES_IGNORE));
    if (done == MPI_UNDEFINED) return;
    /* The handles tested were copies: mark the owners' pieces finished. */
    for (int i = 0; i < done; i++) {
        int k = g->poll_idx[i];
        request_piece_done(g, g->poll_req[k], g->poll_piece[k]);
    }
}

/*
 * The starts. Each splits its buffer into pieces of at most piece_limit elements, one MPI call
 * each on contiguous memory, started in the same order on every rank (collectives must be).
 * Reductions stay predefined (or our user) ops on predefined datatypes: nothing here relies on
 * a reduction over a derived datatype. reduce_scatter, allgather and all_to_all take the
 * one-call path only when the FULL buffer fits the limit, not just the shard: Open MPI's
 * non-blocking forms compute full counts and offsets as int products of the group size and the
 * shard count (libnbc's `count = p * recvcount` in ireduce_scatter_block, `rank * recvcount` in
 * iallgather).
 */

/* Elements one MPI call may carry: the chunk limit, and at most INT_MAX bytes, because libnbc
 * also computes byte counts in int in places (nbc_ibcast.c's chain schedule: `count * size`). */
static int64_t piece_limit(ct_dtype dtype) {
    return CT_MIN(chunk_limit, (int64_t)INT_MAX / (int64_t)ct_dtype_size(dtype));
}

/* Elements in the piece that starts at `off` of a range of n. */
static int piece_count(int64_t limit, int64_t n, int64_t off) {
    return (int)CT_MIN(limit, n - off);
}

/* One piece of a collective: inside a blocking operation the blocking MPI call (complete on
 * return, under the armed watchdog), else the non-blocking one, whose handle joins `req`. */
static void piece_allreduce(mpi_group *g, ct_comm_request *req, void *buf, int c, MPI_Datatype dt,
                            MPI_Op op) {
    if (g->blocking)
        CT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, c, dt, op, g->comm));
    else
        CT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, c, dt, op, g->comm, request_piece(req)));
}

static void piece_reduce_scatter(mpi_group *g, ct_comm_request *req, const void *send, void *recv,
                                 int c, MPI_Datatype dt, MPI_Op op) {
    if (g->blocking)
        CT_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, c, dt, op, g->comm));
    else
        CT_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, c, dt, op, g->comm, request_piece(req)));
}

static void piece_allgather(mpi_group *g, ct_comm_request *req, const void *send, int send_c,
                            MPI_Datatype send_dt, void *recv, int c, MPI_Datatype dt) {
    if (g->blocking)
        CT_MPI_CHECK(MPI_Allgather(send, send_c, send_dt, recv, c, dt, g->comm));
    else
        CT_MPI_CHECK(
            MPI_Iallgather(send, send_c, send_dt, recv, c, dt, g->comm, request_piece(req)));
}

static void piece_bcast(mpi_group *g, ct_comm_request *req, void *buf, int c, MPI_Datatype dt,
                        int root) {
    if (g->blocking)
        CT_MPI_CHECK(MPI_Bcast(buf, c, dt, root, g->comm));
    else
        CT_MPI_CHECK(MPI_Ibcast(buf, c, dt, root, g->comm, request_piece(req)));
}

static void piece_alltoall(mpi_group *g, ct_comm_request *req, const void *send, int send_c,
                           MPI_Datatype send_dt, void *recv, int c, MPI_Datatype dt) {
    if (g->blocking)
        CT_MPI_CHECK(MPI_Alltoall(send, send_c, send_dt, recv, c, dt, g->comm));
    else
        CT_MPI_CHECK(
            MPI_Ialltoall(send, send_c, send_dt, recv, c, dt, g->comm, request_piece(req)));
}

static ct_comm_request *mpi_iallreduce(void *ctx, void *buf, int64_t n, ct_dtype dtype,
                                       ct_reduce_op op) {
    mpi_group *g = ctx;
    size_t esz = ct_dtype_size(dtype);
    int64_t lim = piece_limit(dtype);
    ct_comm_request *req = request_new(g, CT_COMM_ALLREDUCE, dtype, n);
    req->reduces = true;
    req->op = op;
    MPI_Datatype dt = mpi_type(dtype);
    MPI_Op mop = mpi_op(dtype, op);
    int64_t off = 0;
    do { /* at least one piece, so an empty allreduce still matches across ranks */
        int c = piece_count(lim, n, off);
        piece_allreduce(g, req, (char *)buf + (size_t)off * esz, c, dt, mop);
        off += c;
    } while (off < n);
    return request_track(g, req);
}

static ct_comm_request *mpi_ireduce_scatter(void *ctx, const void *send, void *recv, int64_t n,
                                            ct_dtype dtype, ct_reduce_op op) {
    mpi_group *g = ctx;
    CT_ASSERTF(n % g->size == 0, "reduce_scatter of %lld elements over %d ranks", (long long)n,
               g->size);
    int64_t s = n / g->size;
    size_t esz = ct_dtype_size(dtype), shard = (size_t)s * esz;
    int64_t lim = piece_limit(dtype);
    ct_comm_request *req = request_new(g, CT_COMM_REDUCE_SCATTER, dtype, n);
    req->reduces = true;
    req->op = op;
    MPI_Datatype dt = mpi_type(dtype);
    MPI_Op mop = mpi_op(dtype, op);
    /* The interface's send is const for the out-of-place form; in place the caller handed us
     * the whole buffer to work in. */
    char *full = (char *)(uintptr_t)send;
    bool in_place = (char *)recv == full + (size_t)g->rank * shard;
    CT_ASSERTF(in_place || !overlaps(send, (size_t)n * esz, recv, shard),
               "reduce_scatter on group %s: recv overlaps send but is not this rank's shard "
               "(in place needs recv == send + rank*n/size)",
               g->name);
    if (n <= lim) {
        if (in_place) {
            /* MPI's in-place form reads the full buffer and leaves the shard at its start. */
            piece_reduce_scatter(g, req, MPI_IN_PLACE, full, (int)s, dt, mop);
            if (g->rank != 0) {
                req->move_dst = recv;
                req->move_src = full;
                req->move_bytes = shard;
            }
        } else {
            piece_reduce_scatter(g, req, send, recv, (int)s, dt, mop);
        }
        return request_track(g, req);
    }
    /* Above the limit: an allreduce of the whole buffer in contiguous pieces, of which this rank
     * keeps its shard. Not a reduce per chunk and destination: for groups of up to 4 ranks Open
     * MPI's non-blocking reduce pipelines 8 KiB fragments, one per pass of the progress engine,
     * which took ~100 s per 2 GiB under the watchdog's polite wait; the allreduce (Rabenseifner,
     * parallel/context.c) moves at most twice the ring's bytes in a few full-size rounds. In
     * place the caller's buffer is the workspace (its other shards end unspecified, as
     * documented); out of place a copy of `send` is, and the shard is copied out at the end. */
    char *work = full;
    if (!in_place) {
        req->scratch = ct_xmalloc((size_t)n * esz);
        memcpy(req->scratch, send, (size_t)n * esz);
        work = req->scratch;
        req->move_dst = recv;
        req->move_src = work + (size_t)g->rank * shard;
        req->move_bytes = shard;
    }
    for (int64_t off = 0; off < n;) {
        int c = piece_count(lim, n, off);
        piece_allreduce(g, req, work + (size_t)off * esz, c, dt, mop);
        off += c;
    }
    return request_track(g, req);
}

static ct_comm_request *mpi_iallgather(void *ctx, const void *send, void *recv, int64_t n,
                                       ct_dtype dtype) {
    mpi_group *g = ctx;
    CT_ASSERTF(n % g->size == 0, "allgather of %lld elements over %d ranks", (long long)n, g->size);
    int64_t s = n / g->size;
    size_t esz = ct_dtype_size(dtype), shard = (size_t)s * esz;
    int64_t lim = piece_limit(dtype);
    ct_comm_request *req = request_new(g, CT_COMM_ALLGATHER, dtype, n);
    MPI_Datatype dt = mpi_type(dtype);
    char *mine = (char *)recv + (size_t)g->rank * shard;
    bool in_place = (const char *)send == mine;
    CT_ASSERTF(in_place || !overlaps(send, shard, recv, (size_t)n * esz),
               "allgather on group %s: send overlaps recv but is not this rank's shard "
               "(in place needs send == recv + rank*n/size)",
               g->name);
    if (n <= lim) {
        if (in_place)
            piece_allgather(g, req, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)s, dt);
        else
            piece_allgather(g, req, send, (int)s, dt, recv, (int)s, dt);
        return request_track(g, req);
    }
    /* Per chunk and per source rank q, a broadcast from q straight into recv; the root sends
     * from recv, so its own shard goes there first. */
    if (!in_place) memcpy(mine, send, shard);
    for (int64_t off = 0; off < s;) {
        int c = piece_count(lim, s, off);
        for (int q = 0; q < g->size; q++)
            piece_bcast(g, req, (char *)recv + ((size_t)q * (size_t)s + (size_t)off) * esz, c, dt,
                        q);
        off += c;
    }
    return request_track(g, req);
}

static ct_comm_request *mpi_ibroadcast(mpi_group *g, void *buf, int64_t n, ct_dtype dtype,
                                       int root) {
    CT_ASSERTF(root >= 0 && root < g->size, "broadcast root %d on group %s of %d ranks", root,
               g->name, g->size);
    size_t esz = ct_dtype_size(dtype);
    int64_t lim = piece_limit(dtype);
    ct_comm_request *req = request_new(g, CT_COMM_BROADCAST, dtype, n);
    int64_t off = 0;
    do {
        int c = piece_count(lim, n, off);
        piece_bcast(g, req, (char *)buf + (size_t)off * esz, c, mpi_type(dtype), root);
        off += c;
    } while (off < n);
    return request_track(g, req);
}

/* The communicator of all_to_all's pieces, duplicated on the first all_to_all that needs it.
 * The duplication is collective, which is safe here: every rank of the group reaches it inside
 * the same all_to_all. It is waited for under the watchdog, in the name of that all_to_all. */
static MPI_Comm a2a_comm_get(mpi_group *g, ct_comm_request *req) {
    if (g->a2a_comm != MPI_COMM_NULL) return g->a2a_comm;
    MPI_Request dup;
    CT_MPI_CHECK(MPI_Comm_idup(g->comm, &g->a2a_comm, &dup));
    watchdog_arm(g, req);
    CT_MPI_CHECK(MPI_Wait(&dup, MPI_STATUS_IGNORE));
    watchdog_disarm();
    CT_MPI_CHECK(MPI_Comm_set_errhandler(g->a2a_comm, MPI_ERRORS_RETURN));
    return g->a2a_comm;
}

static ct_comm_request *mpi_iall_to_all(mpi_group *g, const void *send, void *recv, int64_t n,
                                        ct_dtype dtype) {
    CT_ASSERTF(n % g->size == 0, "all_to_all of %lld elements over %d ranks", (long long)n,
               g->size);
    int64_t s = n / g->size;
    size_t esz = ct_dtype_size(dtype), bytes = (size_t)n * esz, block = (size_t)s * esz;
    int64_t lim = piece_limit(dtype);
    ct_comm_request *req = request_new(g, CT_COMM_ALL_TO_ALL, dtype, n);
    MPI_Datatype dt = mpi_type(dtype);
    CT_ASSERTF(send == recv || !overlaps(send, bytes, recv, bytes),
               "all_to_all on group %s: send and recv overlap but are not equal", g->name);
    if (n <= lim) {
        if (send == recv)
            piece_alltoall(g, req, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)s, dt);
        else
            piece_alltoall(g, req, send, (int)s, dt, recv, (int)s, dt);
        return request_track(g, req);
    }
    /* Point-to-point pieces: block q of this rank's input goes to rank q, block q of the output
     * comes from rank q. Pieces between one pair share a tag; MPI's non-overtaking rule matches
     * them in the order both sides post them. In place, the sends read a copy, because the
     * receives overwrite the blocks. This rank's own block never travels. */
    const char *src = send;
    if (send != recv)
        memcpy((char *)recv + (size_t)g->rank * block, src + (size_t)g->rank * block, block);
    if (g->size == 1) return request_track(g, req);
    if (send == recv) {
        req->scratch = ct_xmalloc(bytes);
        memcpy(req->scratch, send, bytes);
        src = req->scratch;
    }
    MPI_Comm pc = a2a_comm_get(g, req);
    for (int pass = 0; pass < 2; pass++) /* every receive is posted before any send */
        for (int q = 0; q < g->size; q++) {
            if (q == g->rank) continue;
            for (int64_t off = 0; off < s;) {
                int c = piece_count(lim, s, off);
                size_t at = ((size_t)q * (size_t)s + (size_t)off) * esz;
                if (pass == 0)
                    CT_MPI_CHECK(MPI_Irecv((char *)recv + at, c, dt, q, 0, pc, request_piece(req)));
                else
                    CT_MPI_CHECK(MPI_Isend(src + at, c, dt, q, 0, pc, request_piece(req)));
                off += c;
            }
        }
    return request_track(g, req);
}

/* The variable all_to_all, as point-to-point pieces on the all_to_all communicator (tag 1, so
 * they never match a fixed all_to_all's): every receive posted before any send, a block of more
 * than the chunk limit in several pieces, in order; an empty block is no message on either side
 * (the counts agree, comm.h). The own block is a copy. */
static ct_comm_request *mpi_iall_to_all_v(mpi_group *g, const void *send,
                                          const int64_t *send_counts, void *recv,
                                          const int64_t *recv_counts, ct_dtype dtype) {
    size_t esz = ct_dtype_size(dtype);
    int64_t n_send = 0, n_recv = 0, own_send = 0, own_recv = 0;
    for (int q = 0; q < g->size; q++) {
        if (q == g->rank) own_send = n_send, own_recv = n_recv;
        n_send += send_counts[q];
        n_recv += recv_counts[q];
    }
    CT_ASSERTF(!overlaps(send, (size_t)n_send * esz, recv, (size_t)n_recv * esz),
               "all_to_all_v on group %s: send and recv overlap", g->name);
    ct_comm_request *req = request_new(g, CT_COMM_ALL_TO_ALL_V, dtype, n_send);
    if (send_counts[g->rank] > 0)
        memcpy((char *)recv + (size_t)own_recv * esz, (const char *)send + (size_t)own_send * esz,
               (size_t)send_counts[g->rank] * esz);
    if (g->size == 1) return request_track(g, req);
    MPI_Comm pc = a2a_comm_get(g, req);
    int64_t lim = piece_limit(dtype);
    MPI_Datatype dt = mpi_type(dtype);
    for (int pass = 0; pass < 2; pass++) {
        const int64_t *counts = pass == 0 ? recv_counts : send_counts;
        int64_t at = 0;
        for (int q = 0; q < g->size; at += counts[q], q++) {
            if (q == g->rank) continue;
            for (int64_t off = 0; off < counts[q];) {
                int c = piece_count(lim, counts[q], off);
                size_t byte = (size_t)(at + off) * esz;
                if (pass == 0)
                    CT_MPI_CHECK(
                        MPI_Irecv((char *)recv + byte, c, dt, q, 1, pc, request_piece(req)));
                else
                    CT_MPI_CHECK(
                        MPI_Isend((const char *)send + byte, c, dt, q, 1, pc, request_piece(req)));
                off += c;
            }
        }
    }
    return request_track(g, req);
}

/* A message above the chunk limit goes as several with the same tag, in order (MPI's
 * non-overtaking rule), so a receive must name the count of its send (comm_mpi.h). */
static ct_comm_request *mpi_ip2p(mpi_group *g, bool is_recv, void *buf, int64_t n, ct_dtype dtype,
                                 int peer, int tag) {
    CT_ASSERTF(peer >= 0 && peer < g->size, "%s peer %d on group %s of %d ranks",
               is_recv ? "recv" : "send", peer, g->name, g->size);
    CT_ASSERTF(tag >= 0 && tag <= g->tag_ub,
               "%s tag %d on group %s is outside [0, %d] (the communicator's MPI_TAG_UB; "
               "ct_comm_max_tag gives the bound)",
               is_recv ? "recv" : "send", tag, g->name, g->tag_ub);
    size_t esz = ct_dtype_size(dtype);
    int64_t lim = piece_limit(dtype);
    ct_comm_request *req = request_new(g, CT_COMM_SEND, dtype, n);
    req->is_recv = is_recv;
    req->peer = peer;
    req->tag = tag;
    int64_t off = 0;
    do { /* at least one piece: an empty message is still a message */
        int c = piece_count(lim, n, off);
        char *at = (char *)buf + (size_t)off * esz;
        if (is_recv)
            CT_MPI_CHECK(MPI_Irecv(at, c, mpi_type(dtype), peer, tag, g->comm, request_piece(req)));
        else
            CT_MPI_CHECK(MPI_Isend(at, c, mpi_type(dtype), peer, tag, g->comm, request_piece(req)));
        off += c;
    } while (off < n);
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

/* The blocking forms. An operation that fits one MPI call (n elements of dtype within
 * piece_limit: every start takes its one-call path then) runs the start with g->blocking set, so
 * that call is the blocking MPI collective, watched by the watchdog thread (request_new arms it,
 * request_track disarms it), and the wait only frees the request. A split operation keeps its
 * non-blocking pieces and waits for them under the watchdog, which can then say how many of
 * them are unfinished. */
#define BLOCKING(g, n, dtype, start)                                                               \
    do {                                                                                           \
        (g)->blocking = (n) <= piece_limit(dtype) && !ct_idle_hooked();                            \
        ct_comm_request *req_ = (start);                                                           \
        (g)->blocking = false;                                                                     \
        mpi_wait((g), req_);                                                                       \
    } while (0)

static void mpi_allreduce(void *ctx, void *buf, int64_t n, ct_dtype dtype, ct_reduce_op op) {
    BLOCKING((mpi_group *)ctx, n, dtype, mpi_iallreduce(ctx, buf, n, dtype, op));
}

/* Reduce-scatter of 2 MiB or more takes the non-blocking algorithm in its blocking form too.
 * Measured with scripts/bench_comm.sh (Open MPI 4.1.4, one node, 2 cores, two runs): libnbc's
 * reduce_scatter_block completed by MPI_Wait ran at 1.5x the tuned blocking one's rate at 4 MiB
 * on 4 ranks and 1.2x at 16 MiB, and at 1.00-1.06x on 2 ranks; at 1 MiB the two were equal,
 * and below that the tuned one's few rounds are the better bet. */
enum { REDUCE_SCATTER_NONBLOCKING_BYTES = 2 << 20 };

static void mpi_reduce_scatter(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype,
                               ct_reduce_op op) {
    mpi_group *g = ctx;
    if ((size_t)n * ct_dtype_size(dtype) >= REDUCE_SCATTER_NONBLOCKING_BYTES)
        mpi_wait(g, mpi_ireduce_scatter(ctx, send, recv, n, dtype, op));
    else
        BLOCKING(g, n, dtype, mpi_ireduce_scatter(ctx, send, recv, n, dtype, op));
}

static void mpi_allgather(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype) {
    BLOCKING((mpi_group *)ctx, n, dtype, mpi_iallgather(ctx, send, recv, n, dtype));
}

static void mpi_broadcast(void *ctx, void *buf, int64_t n, ct_dtype dtype, int root) {
    BLOCKING((mpi_group *)ctx, n, dtype, mpi_ibroadcast(ctx, buf, n, dtype, root));
}

static void mpi_all_to_all(void *ctx, const void *send, void *recv, int64_t n, ct_dtype dtype) {
    BLOCKING((mpi_group *)ctx, n, dtype, mpi_iall_to_all(ctx, send, recv, n, dtype));
}

static void mpi_all_to_all_v(void *ctx, const void *send, const int64_t *send_counts, void *recv,
                             const int64_t *recv_counts, ct_dtype dtype) {
    mpi_wait(ctx, mpi_iall_to_all_v(ctx, send, send_counts, recv, recv_counts, dtype));
}

static ct_comm_request *barrier_start(mpi_group *g) {
    ct_comm_request *req = request_new(g, CT_COMM_BARRIER, CT_DTYPE_U8, 0);
    if (g->blocking)
        CT_MPI_CHECK(MPI_Barrier(g->comm));
    else
        CT_MPI_CHECK(MPI_Ibarrier(g->comm, request_piece(req)));
    return request_track(g, req);
}

static void mpi_barrier(void *ctx) {
    BLOCKING((mpi_group *)ctx, 0, CT_DTYPE_U8, barrier_start(ctx));
}

static int mpi_max_tag(void *ctx) {
    return ((const mpi_group *)ctx)->tag_ub;
}

static void mpi_free_comm(void *ctx) {
    mpi_group *g = ctx;
    CT_ASSERTF(g->n_pending == 0, "group %s freed with %d operations still pending", g->name,
               g->n_pending);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && g->a2a_comm != MPI_COMM_NULL) MPI_Comm_free(&g->a2a_comm);
    if (!finalized && g->comm != MPI_COMM_WORLD && g->comm != MPI_COMM_SELF)
        MPI_Comm_free(&g->comm);
    free(g->poll_mpi);
    free(g->poll_idx);
    free(g->poll_req);
    free(g->poll_piece);
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
    .all_to_all_v = mpi_all_to_all_v,
    .barrier = mpi_barrier,
    .max_tag = mpi_max_tag,
    .free_comm = mpi_free_comm,
};

/* MPI_TAG_UB is attached to MPI_COMM_WORLD; Open MPI copies it to duplicates but not to
 * communicators made by MPI_Comm_split, so those fall back to the world's value (the bound is
 * the library's, the same for every communicator). The standard guarantees at least 32767. */
static int tag_upper_bound(MPI_Comm comm) {
    int *ub = NULL, flag = 0;
    CT_MPI_CHECK(MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag));
    if (!flag) CT_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag));
    return flag && ub ? *ub : 32767;
}

ct_comm *ct_comm_mpi_new(MPI_Comm comm, const char *name, double timeout_s) {
    CT_ASSERT(comm != MPI_COMM_NULL);
    create_user_ops();
    mpi_group *g = ct_xcalloc(1, sizeof *g);
    g->comm = comm;
    g->a2a_comm = MPI_COMM_NULL;
    g->name = ct_xstrdup(name);
    g->timeout_s = timeout_s;
    CT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    CT_MPI_CHECK(MPI_Comm_rank(comm, &g->rank));
    CT_MPI_CHECK(MPI_Comm_size(comm, &g->size));
    g->tag_ub = tag_upper_bound(comm);

    ct_comm *c = ct_xcalloc(1, sizeof *c);
    c->iface = &mpi_iface;
    c->ctx = g;
    c->name = g->name;
    c->rank = g->rank;
    c->size = g->size;
    /* the members' world ranks, for the flight record */
    MPI_Group group, world;
    CT_MPI_CHECK(MPI_Comm_group(comm, &group));
    CT_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
    int *ranks = ct_xmalloc((size_t)g->size * sizeof *ranks);
    c->members = ct_xmalloc((size_t)g->size * sizeof *c->members);
    for (int r = 0; r < g->size; r++) ranks[r] = r;
    CT_MPI_CHECK(MPI_Group_translate_ranks(group, g->size, ranks, world, c->members));
    free(ranks);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    return c;
}

MPI_Comm ct_comm_mpi_handle(const ct_comm *comm) {
    if (!comm || comm->iface != &mpi_iface) return MPI_COMM_NULL;
    return ((const mpi_group *)comm->ctx)->comm;
}
