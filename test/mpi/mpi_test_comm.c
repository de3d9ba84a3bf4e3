/*
 * mpi_test_comm.c — the MPI comm layer and the rank grid, under mpirun (test/mpi/cli_mpi_comm.sh).
 *
 *   mpirun -np N build/test/mpi_test_comm            every check; rank 0 prints one line each,
 *                                                    "ok <name>" or "FAIL <name>"
 *   mpirun -np N build/test/mpi_test_comm watchdog   a collective one rank never reaches: the
 *                                                    job must abort with the watchdog's report
 *   mpirun -np N build/test/mpi_test_comm watchdog_recv   the same for a receive never matched
 *   ... watchdog_chunked, watchdog_recv_chunked      the same with operations split into pieces
 *   mpirun -np N build/test/mpi_test_comm bad_tag    rank 0 sends with a negative tag: the job
 *                                                    must abort with the CT_ASSERT's message
 *   mpirun -np N build/test/mpi_test_comm bad_tag_recv   the same for a receive's tag
 *   mpirun -np 2 build/test/mpi_test_comm big        real counts above INT_MAX (u8, one 4 GiB
 *                                                    buffer per rank): allreduce, allgather and
 *                                                    reduce_scatter; "ok"/"FAIL" lines as above
 *
 * Each rank's input is a pure function of (rank, index), so every rank computes the expected
 * result of a collective locally and compares exactly. The values are small integers: their
 * sums are exact in f32 and bf16 whatever order the library adds them in, so "exact" is the
 * right tolerance for every dtype. Every check is agreed over all ranks (MPI_Allreduce of the
 * verdict) before rank 0 prints it; a failing rank prints its own detail first.
 *
 * Built twice: as mpi_test_comm, the MPI comm on host memory; and with CT_TEST_NCCL as
 * mpi_test_comm_nccl (linked with the emulated CUDA backend and the NCCL stand-in, cuda/emu/),
 * where every group under test is the NCCL comm (cuda/comm_nccl.h) and every buffer the tests
 * allocate is device memory: the same checks, through NCCL. Device results are read after a
 * cudaDeviceSynchronize (the emulator's memory is host memory). The NCCL flavour leaves out what
 * is MPI's alone (chunked operations, MPI_TAG_UB, the grid and agreement, which stay MPI) and
 * has watchdog modes of its own: `watchdog` (a skipped collective) and `mismatch` (rank 1 calls
 * another collective than the others: the stand-in's asynchronous error).
 *
 * The collectives run again with the chunk limit lowered to a few elements, so that every
 * operation goes in pieces the way one above INT_MAX elements does (comm_mpi.h). Their names end
 * in "(chunks of K)", and their expectations are the same exact ones: splitting must not change
 * a bit of any result.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/comm/comm.h"
#include "core/common.h"
#include "core/comm/comm_mpi.h"
#include "parallel/context.h"
#include "test/mpi/mpi_check.h"

#ifdef CT_TEST_NCCL
#include <cuda_runtime_api.h>

#include "cuda/backend_cuda.h"
#include "cuda/comm_nccl.h"
#endif

static int world_rank, world_size;

/* ---- element values ------------------------------------------------------------------------ */

static const ct_dtype all_dtypes[] = {CT_DTYPE_F32, CT_DTYPE_BF16, CT_DTYPE_I32,
                                      CT_DTYPE_I64, CT_DTYPE_U8,   CT_DTYPE_F64};
#define N_DTYPES ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))
static const ct_reduce_op all_ops[] = {CT_REDUCE_SUM, CT_REDUCE_MAX, CT_REDUCE_MIN};
static const char *op_names[] = {"sum", "max", "min"};

/* Rank r's element i: small signed integers for float types (sums of ≤ 8 stay exact even in
 * bf16's 8-bit mantissa), values that need the full width for integer types. */
static int64_t input(ct_dtype dt, int r, int64_t i, int salt) {
    switch (dt) {
    case CT_DTYPE_I32: return (int64_t)r * 100003 + i * 7 - 50000 + salt;
    case CT_DTYPE_I64: return ((int64_t)(r + 1) << 36) + i * 13 - 7 + salt;
    case CT_DTYPE_U8: return (r * 37 + i * 11 + salt) & 0xff;
    default: return (r * 5 + i * 3 + salt) % 17 - 8;
    }
}

static int64_t reduce_expect(ct_dtype dt, ct_reduce_op op, int n_ranks, int64_t i, int salt) {
    int64_t acc = input(dt, 0, i, salt);
    for (int r = 1; r < n_ranks; r++) {
        int64_t v = input(dt, r, i, salt);
        acc = op == CT_REDUCE_SUM ? acc + v : op == CT_REDUCE_MAX ? CT_MAX(acc, v) : CT_MIN(acc, v);
    }
    return dt == CT_DTYPE_U8 ? (acc & 0xff) : acc;
}

static void put(void *buf, ct_dtype dt, int64_t i, int64_t v) {
    switch (dt) {
    case CT_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case CT_DTYPE_F64: ((double *)buf)[i] = (double)v; break;
    case CT_DTYPE_BF16: {
        float f = (float)v; /* small integers: the top 16 bits hold them exactly */
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
        break;
    }
    case CT_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case CT_DTYPE_I64: ((int64_t *)buf)[i] = v; break;
    case CT_DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    }
}

static double get(const void *buf, ct_dtype dt, int64_t i) {
    switch (dt) {
    case CT_DTYPE_F32: return ((const float *)buf)[i];
    case CT_DTYPE_F64: return ((const double *)buf)[i];
    case CT_DTYPE_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    case CT_DTYPE_I32: return ((const int32_t *)buf)[i];
    case CT_DTYPE_I64: return (double)((const int64_t *)buf)[i];
    case CT_DTYPE_U8: return ((const uint8_t *)buf)[i];
    }
    return NAN;
}

#ifdef CT_TEST_NCCL
/* Device memory: what the NCCL comm carries (host buffers would go through its MPI group). */
static void *alloc_garbage(int64_t n, ct_dtype dt) {
    size_t bytes = (size_t)n * ct_dtype_size(dt);
    void *p = NULL;
    CT_ASSERT(cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess);
    memset(p, 0xa5, bytes); /* so a missing write shows (the emulator's memory is host memory) */
    return p;
}
static void free_buf(void *p) {
    CT_ASSERT(cudaFree(p) == cudaSuccess);
}
/* Results on the device are read once the device is done (the comm only orders the compute
 * stream after its operations, not the host). */
static void device_sync(void) {
    CT_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
}
#else
static void *alloc_garbage(int64_t n, ct_dtype dt) {
    size_t bytes = (size_t)n * ct_dtype_size(dt);
    void *p = ct_xmalloc(bytes);
    memset(p, 0xa5, bytes); /* so a missing write shows */
    return p;
}
static void free_buf(void *p) {
    free(p);
}
static void device_sync(void) {}
#endif

static void fill_input(void *buf, ct_dtype dt, int r, int64_t from, int64_t n, int salt) {
    for (int64_t i = 0; i < n; i++) put(buf, dt, i, input(dt, r, from + i, salt));
}

/* Element i of `buf` (n of them) against want(i). */
#define EXPECT_ALL(buf, dt, n, want_expr)                                                          \
    ({                                                                                             \
        bool ok_ = true;                                                                           \
        device_sync();                                                                             \
        for (int64_t i = 0; i < (n) && ok_; i++) {                                                 \
            double got_ = get((buf), (dt), i), want_ = (double)(want_expr);                        \
            if (got_ != want_)                                                                     \
                ok_ = why("element %lld: got %.17g, want %.17g", (long long)i, got_, want_);       \
        }                                                                                          \
        ok_;                                                                                       \
    })

/* Some local compute to overlap with communication, with a poll between slices (the executor's
 * pattern: Open MPI progresses a non-blocking collective only inside MPI calls). */
static double overlap_work(ct_comm *c, int slices) {
    static float x[4096];
    double acc = 0;
    for (int s = 0; s < slices; s++) {
        for (int i = 0; i < 4096; i++) x[i] = sinf((float)(i + s));
        for (int i = 0; i < 4096; i++) acc += x[i];
        ct_comm_poll(c);
    }
    return acc;
}

/* ---- collectives on one group ------------------------------------------------------------- */

/* How a test starts and completes an operation: the blocking call, or the non-blocking one
 * completed by ct_comm_wait at once, by ct_comm_test until it says done, or by polls between
 * slices of work and then the wait. A request seen complete by test must hold its result
 * already, so that one is returned, to be waited for (freed) only after the result is checked. */
typedef enum { BLOCKING, BY_WAIT, BY_TEST, BY_POLL } completion;
static const char *completion_names[] = {"", ", waited", ", completed by test", ", polled"};

static ct_comm_request *complete(ct_comm *c, ct_comm_request *req, completion how) {
    if (how == BY_TEST) {
        while (!ct_comm_test(c, req)) sched_yield();
        return req;
    }
    if (how == BY_POLL) overlap_work(c, 8);
    ct_comm_wait(c, req);
    return NULL;
}

static void test_allreduce(ct_comm *c, ct_dtype dt, ct_reduce_op op, int64_t n, completion how,
                           const char *tag) {
    int N = c->size, r = c->rank, salt = (int)op * 3 + (int)dt;
    void *buf = alloc_garbage(n, dt);
    fill_input(buf, dt, r, 0, n, salt);
    ct_comm_request *left = NULL;
    if (how == BLOCKING)
        ct_comm_allreduce(c, buf, n, dt, all_ops[op]);
    else
        left = complete(c, ct_comm_iallreduce(c, buf, n, dt, all_ops[op]), how);
    bool ok = EXPECT_ALL(buf, dt, n, reduce_expect(dt, op, N, i, salt));
    ct_comm_wait(c, left);
    check(ok, "%sallreduce %s %s%s%s", how == BLOCKING ? "" : "i", ct_dtype_name(dt), op_names[op],
          completion_names[how], tag);
    free_buf(buf);
}

static void test_reduce_scatter(ct_comm *c, ct_dtype dt, ct_reduce_op op, int64_t n, bool in_place,
                                completion how, const char *tag) {
    int N = c->size, r = c->rank, salt = 11 + (int)op + 2 * (int)dt;
    int64_t s = n / N;
    size_t esz = ct_dtype_size(dt);
    void *send = alloc_garbage(n, dt);
    fill_input(send, dt, r, 0, n, salt);
    void *recv = in_place ? (char *)send + (size_t)(r * s) * esz : alloc_garbage(s, dt);
    ct_comm_request *left = NULL;
    if (how == BLOCKING)
        ct_comm_reduce_scatter(c, send, recv, n, dt, all_ops[op]);
    else
        left = complete(c, ct_comm_ireduce_scatter(c, send, recv, n, dt, all_ops[op]), how);
    bool ok = EXPECT_ALL(recv, dt, s, reduce_expect(dt, op, N, r * s + i, salt));
    ct_comm_wait(c, left);
    check(ok, "%sreduce_scatter %s %s%s%s%s", how == BLOCKING ? "" : "i", ct_dtype_name(dt),
          op_names[op], in_place ? " in place" : "", completion_names[how], tag);
    if (!in_place) free_buf(recv);
    free_buf(send);
}

static void test_allgather(ct_comm *c, ct_dtype dt, int64_t n, bool in_place, completion how,
                           const char *tag) {
    int N = c->size, r = c->rank, salt = 5 + (int)dt;
    int64_t s = n / N;
    size_t esz = ct_dtype_size(dt);
    void *recv = alloc_garbage(n, dt);
    void *send = in_place ? (char *)recv + (size_t)(r * s) * esz : alloc_garbage(s, dt);
    fill_input(send, dt, r, r * s, s, salt);
    ct_comm_request *left = NULL;
    if (how == BLOCKING)
        ct_comm_allgather(c, send, recv, n, dt);
    else
        left = complete(c, ct_comm_iallgather(c, send, recv, n, dt), how);
    bool ok = EXPECT_ALL(recv, dt, n, input(dt, (int)(i / s), i, salt));
    ct_comm_wait(c, left);
    check(ok, "%sallgather %s%s%s%s", how == BLOCKING ? "" : "i", ct_dtype_name(dt),
          in_place ? " in place" : "", completion_names[how], tag);
    if (!in_place) free_buf(send);
    free_buf(recv);
}

static void test_broadcast(ct_comm *c, ct_dtype dt, int64_t n, int root, const char *tag) {
    void *buf = alloc_garbage(n, dt);
    if (c->rank == root) fill_input(buf, dt, root, 0, n, 9);
    ct_comm_broadcast(c, buf, n, dt, root);
    bool ok = EXPECT_ALL(buf, dt, n, input(dt, root, i, 9));
    check(ok, "broadcast %s from rank %d%s", ct_dtype_name(dt), root, tag);
    free_buf(buf);
}

static void test_all_to_all(ct_comm *c, ct_dtype dt, int64_t n, bool in_place, const char *tag) {
    int N = c->size, r = c->rank;
    int64_t s = n / N;
    void *send = alloc_garbage(n, dt);
    fill_input(send, dt, r, 0, n, 21);
    void *recv = in_place ? send : alloc_garbage(n, dt);
    ct_comm_all_to_all(c, send, recv, n, dt);
    /* Block j of my result is block r of rank j's input. */
    bool ok = EXPECT_ALL(recv, dt, n, input(dt, (int)(i / s), r * s + i % s, 21));
    check(ok, "all_to_all %s%s%s", ct_dtype_name(dt), in_place ? " in place" : "", tag);
    if (!in_place) free_buf(recv);
    free_buf(send);
}

/* The variable all_to_all's block from rank `src` to rank `dst`, in three patterns: varied sizes
 * with empty blocks scattered (and rank 1 sending nothing at all), everything to rank 0 (the
 * others receive nothing), and nothing but each rank's own block. `scale` stretches the sizes
 * (past the chunk limits). */
static int64_t a2av_count(int pattern, int src, int dst, int64_t scale) {
    switch (pattern) {
    case 0:
        return src == 1 || (src + 2 * dst) % 4 == 0 ? 0 : scale * (1 + (src * 13 + dst * 7) % 5);
    case 1: return dst == 0 ? scale * (2 + src) : 0;
    default: return src == dst ? scale * 3 : 0;
    }
}

/* Counts exchanged first through ct_comm_all_to_all (as callers must), then the rows; block j of
 * the result is rank j's block for this rank, elements numbered by (destination, index). */
static void test_all_to_all_v(ct_comm *c, ct_dtype dt, int pattern, int64_t scale,
                              const char *tag) {
    int N = c->size, r = c->rank;
    int64_t *sc = ct_xcalloc((size_t)N, sizeof *sc), *rc = ct_xcalloc((size_t)N, sizeof *rc);
    int64_t *want_rc = ct_xcalloc((size_t)N, sizeof *want_rc), n_send = 0, n_recv = 0;
    for (int q = 0; q < N; q++) {
        sc[q] = a2av_count(pattern, r, q, scale);
        want_rc[q] = a2av_count(pattern, q, r, scale);
        n_send += sc[q];
        n_recv += want_rc[q];
    }
    ct_comm_all_to_all(c, sc, rc, N, CT_DTYPE_I64);
    bool ok = true;
    for (int q = 0; q < N && ok; q++)
        if (rc[q] != want_rc[q])
            ok = why("count from rank %d: %lld, want %lld", q, (long long)rc[q],
                     (long long)want_rc[q]);
    void *send = alloc_garbage(n_send, dt), *recv = alloc_garbage(n_recv + 1, dt);
    int64_t *src_of = ct_xcalloc((size_t)n_recv + 1, sizeof *src_of);
    int64_t *idx_of = ct_xcalloc((size_t)n_recv + 1, sizeof *idx_of);
    for (int q = 0, at = 0; q < N; at += (int)sc[q], q++)
        for (int64_t j = 0; j < sc[q]; j++) put(send, dt, at + j, input(dt, r, q * 100000 + j, 23));
    for (int q = 0, at = 0; q < N; at += (int)want_rc[q], q++)
        for (int64_t j = 0; j < want_rc[q]; j++)
            src_of[at + j] = q, idx_of[at + j] = r * 100000 + j;
    if (ok) {
        ct_comm_all_to_all_v(c, send, sc, recv, rc, dt);
        ok = EXPECT_ALL(recv, dt, n_recv, input(dt, (int)src_of[i], idx_of[i], 23));
        /* the element after the last block is never written */
        if (ok && get(recv, dt, n_recv) == get(recv, dt, n_recv) &&
            memcmp((char *)recv + (size_t)n_recv * ct_dtype_size(dt),
                   "\xa5\xa5\xa5\xa5\xa5\xa5\xa5\xa5", ct_dtype_size(dt)) != 0)
            ok = why("the element after the %lld received was written", (long long)n_recv);
    }
    static const char *names[] = {"varied, some empty", "all to rank 0", "own block only"};
    check(ok, "all_to_all_v %s, %s, x%lld%s", ct_dtype_name(dt), names[pattern], (long long)scale,
          tag);
    free_buf(send);
    free_buf(recv);
    free(sc), free(rc), free(want_rc), free(src_of), free(idx_of);
}

/* Every rank sends to its right neighbour and receives from its left one, in both directions. */
static void test_ring(ct_comm *c, ct_dtype dt, int64_t n, const char *tag) {
    int N = c->size, r = c->rank, right = (r + 1) % N, left = (r + N - 1) % N;
    void *to_right = alloc_garbage(n, dt), *to_left = alloc_garbage(n, dt);
    void *from_left = alloc_garbage(n, dt), *from_right = alloc_garbage(n, dt);
    fill_input(to_right, dt, r, 0, n, 1);
    fill_input(to_left, dt, r, 0, n, 2);
    ct_comm_request *reqs[4] = {
        ct_comm_irecv(c, from_left, n, dt, left, 10),
        ct_comm_irecv(c, from_right, n, dt, right, 20),
        ct_comm_isend(c, to_right, n, dt, right, 10),
        ct_comm_isend(c, to_left, n, dt, left, 20),
    };
    overlap_work(c, 4);
    for (int k = 3; k >= 0; k--) ct_comm_wait(c, reqs[k]);
    bool ok = EXPECT_ALL(from_left, dt, n, input(dt, left, i, 1)) &&
              EXPECT_ALL(from_right, dt, n, input(dt, right, i, 2));
    check(ok, "isend/irecv ring both ways %s%s", ct_dtype_name(dt), tag);
    free_buf(to_right);
    free_buf(to_left);
    free_buf(from_left);
    free_buf(from_right);
}

/* Several messages in flight between the same pair with the same tag, of different lengths, plus
 * one with another tag between them: each must arrive whole and in order, which split messages
 * get from MPI's non-overtaking rule only if their pieces are posted in order. The receives are
 * completed in reverse, by test, by poll and by wait. */
static void test_p2p_same_tag(ct_comm *c, ct_dtype dt, int64_t n, const char *tag) {
    enum { K = 4 };
    int N = c->size, r = c->rank, right = (r + 1) % N, left = (r + N - 1) % N;
    int64_t len[K] = {n, n / 2 + 3, 1, n};
    int tags[K] = {5, 5, 6, 5};
    void *out[K], *in[K];
    ct_comm_request *recvs[K], *sends[K];
    for (int k = 0; k < K; k++) {
        out[k] = alloc_garbage(len[k], dt);
        in[k] = alloc_garbage(len[k], dt);
        fill_input(out[k], dt, r, 0, len[k], 30 + k);
        recvs[k] = ct_comm_irecv(c, in[k], len[k], dt, left, tags[k]);
    }
    for (int k = 0; k < K; k++) sends[k] = ct_comm_isend(c, out[k], len[k], dt, right, tags[k]);
    ct_comm_request *left_over[K];
    for (int k = K - 1; k >= 0; k--) left_over[k] = complete(c, recvs[k], (completion)(1 + k % 3));
    bool ok = true;
    for (int k = 0; k < K && ok; k++)
        ok = EXPECT_ALL(in[k], dt, len[k], input(dt, left, i, 30 + k)) ||
             why("(message %d of %d, %lld elements)", k, K, (long long)len[k]);
    for (int k = 0; k < K; k++) ct_comm_wait(c, left_over[k]);
    for (int k = 0; k < K; k++) ct_comm_wait(c, sends[k]);
    check(ok, "isend/irecv: %d messages in flight to one peer, same tag, in order %s%s", K,
          ct_dtype_name(dt), tag);
    for (int k = 0; k < K; k++) {
        free_buf(out[k]);
        free_buf(in[k]);
    }
}

/* Three collectives in flight on one group at once, completed through test/poll and waited in
 * another order than they were started. */
static void test_many_in_flight(ct_comm *c, int64_t shard, const char *tag) {
    int N = c->size, r = c->rank;
    int64_t n = (int64_t)N * shard, s = n / N;
    float *a = alloc_garbage(n, CT_DTYPE_F32);
    int64_t *b = alloc_garbage(n, CT_DTYPE_I64);
    uint16_t *g_send = alloc_garbage(s, CT_DTYPE_BF16), *g_recv = alloc_garbage(n, CT_DTYPE_BF16);
    fill_input(a, CT_DTYPE_F32, r, 0, n, 3);
    fill_input(b, CT_DTYPE_I64, r, 0, n, 4);
    fill_input(g_send, CT_DTYPE_BF16, r, r * s, s, 5);
    ct_comm_request *ra = ct_comm_iallreduce(c, a, n, CT_DTYPE_F32, CT_REDUCE_SUM);
    ct_comm_request *rb = ct_comm_ireduce_scatter(c, b, b + r * s, n, CT_DTYPE_I64, CT_REDUCE_MAX);
    ct_comm_request *rg = ct_comm_iallgather(c, g_send, g_recv, n, CT_DTYPE_BF16);
    /* Poll until test says every one is done; no sleeping needed: the work itself yields CPU. */
    int rounds = 0;
    while (!(ct_comm_test(c, ra) && ct_comm_test(c, rb) && ct_comm_test(c, rg))) {
        overlap_work(c, 1);
        if (++rounds % 16 == 0) sched_yield();
    }
    /* Complete by test means the results are there before the waits, which only free. */
    bool ok =
        EXPECT_ALL(a, CT_DTYPE_F32, n, reduce_expect(CT_DTYPE_F32, 0, N, i, 3)) &&
        EXPECT_ALL(b + r * s, CT_DTYPE_I64, s, reduce_expect(CT_DTYPE_I64, 1, N, r * s + i, 4)) &&
        EXPECT_ALL(g_recv, CT_DTYPE_BF16, n, input(CT_DTYPE_BF16, (int)(i / s), i, 5));
    ct_comm_wait(c, rg);
    ct_comm_wait(c, ra);
    ct_comm_wait(c, rb);
    check(ok, "three collectives in flight, completed by test, waited out of order%s", tag);
    free_buf(a);
    free_buf(b);
    free_buf(g_send);
    free_buf(g_recv);
}

/* bf16 sums round to nearest even, not truncate. Only ranks 0 and 1 contribute non-zero values
 * (adding zero is exact), so the result is the same whatever order the algorithm adds in. */
static void test_bf16_rounding(ct_comm *c) {
    /* 258 + 1 = 259: a tie between 258 (odd mantissa) and 260 → 260; truncation gives 258.
     * 256 + 1 = 257: a tie between 256 (even) and 258 → 256.
     * 1 + 7/512 = 1.013671875: nearest is 1.015625; truncation gives 1.0078125. */
    static const float r0[3] = {258.0f, 256.0f, 1.0f}, r1[3] = {1.0f, 1.0f, 7.0f / 512};
    static const double want[3] = {260.0, 256.0, 1.015625}, alone[3] = {258.0, 256.0, 1.0};
    uint16_t v[3];
    for (int i = 0; i < 3; i++) {
        float f = c->rank == 0 ? r0[i] : c->rank == 1 ? r1[i] : 0.0f;
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        v[i] = (uint16_t)(u >> 16); /* all three inputs are exact in bf16 */
    }
    ct_comm_allreduce(c, v, 3, CT_DTYPE_BF16, CT_REDUCE_SUM);
    bool ok = EXPECT_ALL(v, CT_DTYPE_BF16, 3, c->size > 1 ? want[i] : alone[i]);
    check(ok, "bf16 sum rounds to nearest even");
}

/* The ring-model byte counters of comm.h, with the formulas written out here independently. */
static void test_counters(ct_comm *c, int64_t shard, const char *tag) {
    int N = c->size;
    int64_t n = (int64_t)N * shard;
    uint64_t want[CT_COMM_OP_COUNT] = {0}, want_calls[CT_COMM_OP_COUNT] = {0};
    float *buf = ct_xcalloc((size_t)n, 8), *out = ct_xcalloc((size_t)n, 8);
    ct_comm_reset_counters(c);

    ct_comm_allreduce(c, buf, n, CT_DTYPE_F32, CT_REDUCE_SUM);
    ct_comm_wait(c, ct_comm_iallreduce(c, buf, n, CT_DTYPE_BF16, CT_REDUCE_MAX));
    want[CT_COMM_ALLREDUCE] = 2 * 4 * n * (N - 1) / N + 2 * 2 * n * (N - 1) / N;
    want_calls[CT_COMM_ALLREDUCE] = 2;

    ct_comm_reduce_scatter(c, buf, out, n, CT_DTYPE_F32, CT_REDUCE_SUM);
    ct_comm_wait(c, ct_comm_ireduce_scatter(c, buf, out, n, CT_DTYPE_I64, CT_REDUCE_SUM));
    want[CT_COMM_REDUCE_SCATTER] = 4 * n * (N - 1) / N + 8 * n * (N - 1) / N;
    want_calls[CT_COMM_REDUCE_SCATTER] = 2;

    ct_comm_allgather(c, buf, out, n, CT_DTYPE_F32);
    ct_comm_wait(c, ct_comm_iallgather(c, buf, out, n, CT_DTYPE_U8));
    want[CT_COMM_ALLGATHER] = 4 * n * (N - 1) / N + 1 * n * (N - 1) / N;
    want_calls[CT_COMM_ALLGATHER] = 2;

    ct_comm_all_to_all(c, buf, out, n, CT_DTYPE_I32);
    want[CT_COMM_ALL_TO_ALL] = 4 * n * (N - 1) / N;
    want_calls[CT_COMM_ALL_TO_ALL] = 1;

    /* the variable all_to_all: the bytes sent to the other ranks, this rank's own block (never
     * empty here) not; block (src, dst) has shard / 10 · (1 + (src + dst) % 3) elements */
    int64_t sc[8], rc[8];
    CT_ASSERT(N <= 8);
    for (int q = 0; q < N; q++) {
        sc[q] = shard / 10 * (1 + (c->rank + q) % 3);
        rc[q] = sc[q]; /* (src + dst) is symmetric */
    }
    ct_comm_all_to_all_v(c, buf, sc, out, rc, CT_DTYPE_F32);
    for (int q = 0; q < N; q++)
        if (q != c->rank) want[CT_COMM_ALL_TO_ALL_V] += 4 * (uint64_t)sc[q];
    want_calls[CT_COMM_ALL_TO_ALL_V] = 1;

    int root = 1 % N;
    ct_comm_broadcast(c, buf, n, CT_DTYPE_F32, root);
    /* counted at the root only, and never on a group of one */
    want[CT_COMM_BROADCAST] = N > 1 && c->rank == root ? 4 * n : 0;
    want_calls[CT_COMM_BROADCAST] = 1;

    int right = (c->rank + 1) % N, left = (c->rank + N - 1) % N;
    ct_comm_request *rr = ct_comm_irecv(c, out, n, CT_DTYPE_F64, left, 3);
    ct_comm_request *rs = ct_comm_isend(c, buf, n, CT_DTYPE_F64, right, 3);
    ct_comm_wait(c, rs);
    ct_comm_wait(c, rr);
    want[CT_COMM_SEND] = 8 * n; /* receives count nothing: their bytes are the sender's */
    want_calls[CT_COMM_SEND] = 1;

    ct_comm_barrier(c);
    want_calls[CT_COMM_BARRIER] = 1;

    bool ok = true;
    for (int k = 0; k < CT_COMM_OP_COUNT && ok; k++) {
        if (c->bytes[k] != want[k])
            ok = why("%s bytes %llu, want %llu", ct_comm_op_name(k),
                     (unsigned long long)c->bytes[k], (unsigned long long)want[k]);
        else if (c->calls[k] != want_calls[k])
            ok = why("%s calls %llu, want %llu", ct_comm_op_name(k),
                     (unsigned long long)c->calls[k], (unsigned long long)want_calls[k]);
    }
    check(ok,
          "byte counters follow the ring model (allreduce 2n(N-1)/N, rs/ag/a2a n(N-1)/N, "
          "send n, broadcast n at root, a2a_v the bytes to other ranks)%s",
          tag);
    free(buf);
    free(out);
}

/* Every collective, dtype and op on a buffer of n elements (an odd shard size), each form. */
static void test_matrix(ct_comm *c, int64_t n, const char *tag) {
    int N = c->size;
    for (int d = 0; d < N_DTYPES; d++) {
        ct_dtype dt = all_dtypes[d];
        for (int op = 0; op < 3; op++) {
            test_allreduce(c, dt, op, n, BLOCKING, tag);
            test_allreduce(c, dt, op, n, BY_POLL, tag);
            test_allreduce(c, dt, op, n, BY_TEST, tag);
            test_reduce_scatter(c, dt, op, n, false, BLOCKING, tag);
            test_reduce_scatter(c, dt, op, n, true, BLOCKING, tag);
            test_reduce_scatter(c, dt, op, n, true, BY_POLL, tag);
            test_reduce_scatter(c, dt, op, n, false, BY_TEST, tag);
        }
        test_allgather(c, dt, n, false, BLOCKING, tag);
        test_allgather(c, dt, n, true, BLOCKING, tag);
        test_allgather(c, dt, n, false, BY_POLL, tag);
        test_allgather(c, dt, n, true, BY_TEST, tag);
        test_allgather(c, dt, n, false, BY_WAIT, tag);
        test_broadcast(c, dt, n, d % N, tag);
        test_all_to_all(c, dt, n, false, tag);
        test_all_to_all(c, dt, n, true, tag);
        for (int pattern = 0; pattern < 3; pattern++) test_all_to_all_v(c, dt, pattern, 9, tag);
        test_ring(c, dt, n, tag);
        test_p2p_same_tag(c, dt, n, tag);
    }
}

/* Larger buffers take the libraries' segmented / pipelined algorithms. */
static void test_large(ct_comm *c, const char *tag) {
    int64_t big = (int64_t)c->size * 50001;
    test_allreduce(c, CT_DTYPE_F32, CT_REDUCE_SUM, big, BLOCKING, tag);
    test_allreduce(c, CT_DTYPE_BF16, CT_REDUCE_SUM, big, BY_POLL, tag);
    test_reduce_scatter(c, CT_DTYPE_F32, CT_REDUCE_SUM, big, true, BLOCKING, tag);
    test_reduce_scatter(c, CT_DTYPE_BF16, CT_REDUCE_MAX, big, true, BY_POLL, tag);
    test_allgather(c, CT_DTYPE_F32, big, false, BLOCKING, tag);
    test_allgather(c, CT_DTYPE_BF16, big, true, BLOCKING, tag);
}

/* The tag bound: MPI's MPI_TAG_UB on MPI groups (read here independently, from the world), on a
 * duplicate and on a split communicator (which Open MPI gives no MPI_TAG_UB attribute of its
 * own), and INT_MAX on the local group. */
static void test_max_tag(ct_comm *c) {
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    int want = flag ? *ub : -1;
    int got = ct_comm_max_tag(c);
    check((flag && got == want && want >= 32767) || why("max_tag %d, MPI_TAG_UB %d", got, want),
          "ct_comm_max_tag is MPI_TAG_UB (%d) on an MPI group", want);
    MPI_Comm split;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &split);
    ct_comm *s = ct_comm_mpi_new(split, "split", 120.0);
    got = ct_comm_max_tag(s);
    check(got == want || why("max_tag %d, MPI_TAG_UB %d", got, want),
          "ct_comm_max_tag is MPI_TAG_UB on a group from MPI_Comm_split");
    ct_comm_free(s);
    ct_comm *local = ct_comm_local_new("local");
    got = ct_comm_max_tag(local);
    check(got == INT_MAX || why("max_tag %d", got), "ct_comm_max_tag is INT_MAX on a local group");
    ct_comm_free(local);
}

static void test_collectives(ct_comm *c) {
    int N = c->size;
    int64_t n = (int64_t)N * 129; /* an odd shard size */
    test_matrix(c, n, "");
    test_large(c, " (large)");
    test_many_in_flight(c, 3001, "");
    test_bf16_rounding(c);
    ct_comm_barrier(c);
    check(true, "barrier");
    test_counters(c, 1000, "");
#ifdef CT_TEST_NCCL
    check(ct_comm_max_tag(c) == INT_MAX, "ct_comm_max_tag is INT_MAX on an NCCL group (no tags)");
    (void)test_max_tag;
    return; /* chunked operations are the MPI comm's */
#else
    test_max_tag(c);
#endif

    /* Counts above the chunk limit are split into pieces (comm_mpi.h). Small limits exercise
     * the splitting of > INT_MAX counts on small buffers, with the same exact expectations: 7
     * divides neither the shard (129) nor n; 43 divides both; 200 exceeds the shard but not n
     * (for N > 1), so each piece is a whole shard. */
    static const int64_t limits[] = {7, 43, 200};
    char tag[64];
    for (int k = 0; k < (int)(sizeof limits / sizeof limits[0]); k++) {
        snprintf(tag, sizeof tag, " (chunks of %lld)", (long long)limits[k]);
        ct_comm_mpi_set_chunk_limit(limits[k]);
        test_matrix(c, n, tag);
        /* smaller: thousands of pieces in flight slow the progress engine at 8 ranks */
        test_many_in_flight(c, 301, tag);
        test_counters(c, 100, tag);
    }
    ct_comm_mpi_set_chunk_limit(10007); /* divides no shard of test_large */
    test_large(c, " (large, chunks of 10007)");
    ct_comm_mpi_set_chunk_limit(0);
}

/* ---- the grid ------------------------------------------------------------------------------ */

/* The world ranks of a group, gathered through the group itself, against the list the layout
 * formula gives; and the group rank is this rank's position in it. */
static bool check_members(ct_comm *c, const int *want, int n_want, const char *what) {
    if (!c) return why("%s group missing", what);
    if (c->size != n_want) return why("%s size %d, want %d", what, c->size, n_want);
    int32_t *got = ct_xcalloc((size_t)n_want, sizeof *got);
    int32_t me = world_rank;
    ct_comm_allgather(c, &me, got, n_want, CT_DTYPE_I32);
    bool ok = true;
    for (int i = 0; i < n_want && ok; i++)
        if (got[i] != want[i])
            ok = why("%s member %d is rank %d, want %d", what, i, got[i], want[i]);
    if (ok && want[c->rank] != world_rank)
        ok = why("%s: group rank %d but this is world rank %d", what, c->rank, world_rank);
    /* One reduction on the sub-communicator as well. */
    int64_t sum = world_rank, want_sum = 0;
    for (int i = 0; i < n_want; i++) want_sum += want[i];
    ct_comm_allreduce(c, &sum, 1, CT_DTYPE_I64, CT_REDUCE_SUM);
    if (ok && sum != want_sum)
        ok =
            why("%s allreduce of ranks %lld, want %lld", what, (long long)sum, (long long)want_sum);
    free(got);
    return ok;
}

/* What ct_pctx_print writes on this rank (free it); its length in *len. */
static char *printed_grid(const ct_pctx *p, size_t *len) {
    char *text = NULL;
    FILE *mem = open_memstream(&text, len);
    ct_pctx_print(p, mem);
    fclose(mem);
    return text;
}

static void test_grid(int tp, int pp, int dp) {
    char name[64];
    snprintf(name, sizeof name, "grid tp%d pp%d dp%d", tp, pp, dp);
    ct_pctx *p = NULL;
    ct_status st = ct_pctx_new(&p, tp, pp, dp, 120.0);
    check(st == CT_OK && p != NULL, "%s: ct_pctx_new", name);
    if (st != CT_OK) return;

    bool ok = true;
    if (p->tp_rank < 0 || p->tp_rank >= tp || p->dp_rank < 0 || p->dp_rank >= dp ||
        p->pp_rank < 0 || p->pp_rank >= pp)
        ok = why("coordinates (%d,%d,%d) out of range", p->tp_rank, p->pp_rank, p->dp_rank);
    else if (world_rank != p->tp_rank + tp * (p->dp_rank + dp * p->pp_rank))
        ok = why("rank %d != tp_rank %d + tp*(dp_rank %d + dp*pp_rank %d)", world_rank, p->tp_rank,
                 p->dp_rank, p->pp_rank);
    else if (p->tp != tp || p->pp != pp || p->dp != dp || p->world_size != world_size ||
             p->world_rank != world_rank)
        ok = why("sizes in ct_pctx do not match");
    check(ok, "%s: rank = tp_rank + tp*(dp_rank + dp*pp_rank)", name);
    int t = p->tp_rank, d = p->dp_rank, q = p->pp_rank;

    int *want = ct_xcalloc((size_t)world_size, sizeof *want), k = 0;
    for (int i = 0; i < world_size; i++) want[i] = i;
    check(check_members(p->world, want, world_size, "world"), "%s: world group", name);
    for (k = 0; k < tp; k++) want[k] = k + tp * (d + dp * q);
    check(check_members(p->tp_comm, want, tp, "tp"), "%s: tp group members", name);
    for (k = 0; k < dp; k++) want[k] = t + tp * (k + dp * q);
    check(check_members(p->dp_comm, want, dp, "dp"), "%s: dp group members", name);
    for (k = 0; k < pp; k++) want[k] = t + tp * (d + dp * k);
    check(check_members(p->pp_comm, want, pp, "pp"), "%s: pp group members", name);
    k = 0;
    for (int s = 0; s < pp; s++)
        for (int u = 0; u < tp; u++) want[k++] = u + tp * (d + dp * s);
    check(check_members(p->mp_comm, want, tp * pp, "mp"), "%s: mp (tp x pp) group members", name);

    /* The embedding group: first and last stage, same tp and dp rank; middle stages have none. */
    bool member = q == 0 || q == pp - 1;
    ok = true;
    if (!member) {
        ok = p->embed_comm == NULL || why("middle stage %d has an embedding group", q);
    } else {
        want[0] = t + tp * d;
        want[1] = t + tp * (d + dp * (pp - 1));
        ok = check_members(p->embed_comm, want, pp == 1 ? 1 : 2, "embed");
    }
    /* Every rank must take part in the verdict, members or not. */
    check(ok, "%s: embedding group (first + last stage)", name);

    /* The printed grid, checked on rank 0 against the tp groups written out here. */
    size_t text_len = 0;
    char *text = printed_grid(p, &text_len);
    ok = true;
    if (world_rank == 0) {
        char line[512];
        int len = snprintf(line, sizeof line, "grid: world %d = tp %d x pp %d x dp %d", world_size,
                           tp, pp, dp);
        if (!strstr(text, line)) ok = why("print lacks '%s'", line);
        len = snprintf(line, sizeof line, "tp groups:");
        for (int g = 0; g < world_size / tp; g++) {
            len += snprintf(line + len, sizeof line - (size_t)len, " [");
            for (int u = 0; u < tp; u++)
                len +=
                    snprintf(line + len, sizeof line - (size_t)len, u ? " %d" : "%d", g * tp + u);
            len += snprintf(line + len, sizeof line - (size_t)len, "]");
        }
        strcat(line, "\n");
        if (ok && !strstr(text, line)) ok = why("print lacks '%s'; got:\n%s", line, text);
        if (ok && tp == 2 && pp == 2 && dp == 2) {
            static const char *lines[] = {
                "dp groups: [0 2] [1 3] [4 6] [5 7]\n",
                "pp groups: [0 4] [1 5] [2 6] [3 7]\n",
                "mp groups: [0 1 4 5] [2 3 6 7]\n",
                "embed groups: [0 4] [1 5] [2 6] [3 7]\n",
            };
            for (int i = 0; i < 4 && ok; i++)
                if (!strstr(text, lines[i])) ok = why("print lacks '%s'; got:\n%s", lines[i], text);
        }
    } else if (text_len != 0) {
        ok = why("rank %d printed the grid", world_rank);
    }
    check(ok, "%s: ct_pctx_print", name);
    free(text);
    free(want);
    ct_pctx_free(p);
}

/* Expert parallelism inside dp: the ep groups (ep consecutive dp ranks) and the expert-data-
 * parallel groups (the same ep_rank in every block, every cp rank), written out here from the
 * rank formula; and the printout at world 8 with dp 8, ep 2. */
static void test_grid_ep(int tp, int cp, int pp, int dp, int ep) {
    char name[64];
    snprintf(name, sizeof name, "grid tp%d cp%d pp%d dp%d ep%d", tp, cp, pp, dp, ep);
    ct_pctx *p = NULL;
    ct_status st = ct_pctx_new_cp(&p, tp, cp, pp, dp, ep, 120.0);
    check(st == CT_OK && p != NULL, "%s: ct_pctx_new_cp", name);
    if (st != CT_OK) return;
    int t = p->tp_rank, c = p->cp_rank, d = p->dp_rank, q = p->pp_rank, b = d / ep, e = d % ep;
    bool ok = p->ep == ep && p->ep_rank == e ? true : why("ep %d ep_rank %d", p->ep, p->ep_rank);
    check(ok, "%s: ep_rank = dp_rank %% ep", name);
    int *want = ct_xcalloc((size_t)world_size, sizeof *want), k = 0;
    for (k = 0; k < ep; k++) want[k] = t + tp * (c + cp * (b * ep + k + dp * q));
    check(check_members(p->ep_comm, want, ep, "ep"), "%s: ep group members", name);
    k = 0;
    for (int bb = 0; bb < dp / ep; bb++)
        for (int cc = 0; cc < cp; cc++) want[k++] = t + tp * (cc + cp * (bb * ep + e + dp * q));
    check(check_members(p->edp_comm, want, k, "edp"), "%s: edp group members", name);
    size_t text_len = 0;
    char *text = printed_grid(p, &text_len);
    ok = true;
    if (world_rank == 0 && world_size == 8 && dp == 8 && ep == 2) {
        static const char *lines[] = {"experts: ep 2 inside dp 8",
                                      "ep groups: [0 1] [2 3] [4 5] [6 7]\n",
                                      "edp groups: [0 2 4 6] [1 3 5 7]\n"};
        for (int i = 0; i < 3 && ok; i++)
            if (!strstr(text, lines[i])) ok = why("print lacks '%s'; got:\n%s", lines[i], text);
    }
    check(ok, "%s: ct_pctx_print", name);
    free(text);
    free(want);
    ct_pctx_free(p);
}

static void test_grids(void) {
    for (int tp = 1; tp <= world_size; tp++)
        for (int pp = 1; pp <= world_size; pp++) {
            if (world_size % (tp * pp)) continue;
            int dp = world_size / (tp * pp);
            test_grid(tp, pp, dp);
            for (int ep = 2; ep <= dp; ep++)
                if (dp % ep == 0) test_grid_ep(tp, 1, pp, dp, ep);
        }
    if (world_size % 4 == 0) test_grid_ep(1, 2, 1, world_size / 2, 2);
}

/* ---- agreeing on a status ------------------------------------------------------------------ */

static void test_agree(void) {
    int N = world_size, last = N - 1;
    ct_error_clear();
    ct_status st = ct_mpi_agree(CT_OK);
    check(st == CT_OK || why("status %d", st), "agree: everyone OK");

    ct_error_clear();
    ct_status mine = CT_OK;
    if (world_rank == last) {
        mine = ct_error(CT_ERR_INPUT, "data file shard-%d.bin is missing", last);
        ct_hint("check data.train");
    }
    st = ct_mpi_agree(mine);
    char want[128];
    if (last != 0)
        snprintf(want, sizeof want, "rank %d: data file shard-%d.bin is missing", last, last);
    else /* a world of one: rank 0 is the failing rank, and rank 0 gets no prefix */
        snprintf(want, sizeof want, "data file shard-0.bin is missing");
    bool ok = st == CT_ERR_INPUT || why("status %d", st);
    ok = ok && (!strcmp(ct_error_message(), want) || why("message '%s'", ct_error_message()));
    ok = ok && (!strcmp(ct_error_hint(), "check data.train") || why("hint '%s'", ct_error_hint()));
    check(ok, "agree: rank %d fails with CT_ERR_INPUT, every rank gets it with 'rank %d:'", last,
          last);

    ct_error_clear();
    mine = world_rank == 0 ? ct_error(CT_ERR_INPUT, "bad config on rank zero") : CT_OK;
    st = ct_mpi_agree(mine);
    ok = st == CT_ERR_INPUT || why("status %d", st);
    ok = ok && (!strcmp(ct_error_message(), "bad config on rank zero") ||
                why("message '%s'", ct_error_message()));
    ok = ok && (ct_error_hint()[0] == '\0' || why("hint '%s'", ct_error_hint()));
    check(ok, "agree: rank 0 fails, message without a rank prefix");

    if (N >= 4) {
        /* Rank 1 sees bad input, ranks 2 and 3 a runtime failure: the worst status wins, and the
         * message comes from the lowest rank that has it, so message and exit code agree. */
        ct_error_clear();
        mine = CT_OK;
        if (world_rank == 1) mine = ct_error(CT_ERR_INPUT, "input trouble");
        if (world_rank == 2 || world_rank == 3)
            mine = ct_error(CT_ERR_RUNTIME, "out of memory here (%d)", world_rank);
        st = ct_mpi_agree(mine);
        ok = st == CT_ERR_RUNTIME || why("status %d", st);
        ok = ok && (!strcmp(ct_error_message(), "rank 2: out of memory here (2)") ||
                    why("message '%s'", ct_error_message()));
        check(ok, "agree: RUNTIME beats INPUT, message of the lowest rank with it");
    }
    ct_error_clear();
}

/* ---- the watchdog ------------------------------------------------------------------------- */

/* Rank 1 skips the second allreduce; everyone else must be stopped by the watchdog within about
 * its 2 s limit, with the diagnostic, instead of hanging. With `chunk` > 0 the allreduces go in
 * pieces, and the report must still name operation #2, not piece #12. */
static int watchdog_mode(int64_t chunk) {
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    ct_comm *c = ct_comm_mpi_new(dup, "world", 2.0);
    ct_comm_mpi_set_chunk_limit(chunk);
    float x[1024] = {1.0f};
    ct_comm_allreduce(c, x, 1024, CT_DTYPE_F32, CT_REDUCE_SUM); /* sequence #1: everyone */
    if (world_rank == 1) {
        for (int i = 0; i < 120; i++) sleep(1); /* MPI_Abort from another rank ends this */
    } else {
        ct_comm_allreduce(c, x, 1024, CT_DTYPE_F32, CT_REDUCE_SUM); /* #2: never completes */
    }
    fprintf(stderr, "rank %d: the watchdog did not fire\n", world_rank);
    return 3;
}

/* The same for a point-to-point wait: rank 0 waits for a message rank 1 never sends. */
static int watchdog_recv_mode(int64_t chunk) {
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    ct_comm *c = ct_comm_mpi_new(dup, "pp", 2.0);
    ct_comm_mpi_set_chunk_limit(chunk);
    float x[256];
    if (world_rank == 0) {
        ct_comm_wait(c, ct_comm_irecv(c, x, 256, CT_DTYPE_F32, 1, 42));
        fprintf(stderr, "rank 0: the watchdog did not fire\n");
        return 3;
    }
    for (int i = 0; i < 120; i++) sleep(1);
    return 3;
}

/* ---- tags out of range ---------------------------------------------------------------------- */

/* Rank 0 starts a send (or receive) with a tag outside [0, ct_comm_max_tag]: a caller's bug, so
 * the job must end in the CT_ASSERT, not in MPI's error or a message that never matches. A
 * receive gets the bound + 1 where the bound leaves room, else -1 (MPI_ANY_TAG in Open MPI, which
 * split messages cannot allow either). */
static int bad_tag_mode(bool recv) {
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    ct_comm *c = ct_comm_mpi_new(dup, "world", 10.0);
    int bound = ct_comm_max_tag(c);
    int tag = !recv ? -7 : bound < INT_MAX ? bound + 1 : -1;
    float x[4] = {0};
    if (world_rank == 0) {
        int peer = 1 % world_size;
        ct_comm_request *q = recv ? ct_comm_irecv(c, x, 4, CT_DTYPE_F32, peer, tag)
                                  : ct_comm_isend(c, x, 4, CT_DTYPE_F32, peer, tag);
        ct_comm_wait(c, q);
        fprintf(stderr, "rank 0: tag %d was accepted (bound %d)\n", tag, bound);
        return 3;
    }
    for (int i = 0; i < 60; i++) sleep(1); /* the abort of rank 0 ends the job */
    return 3;
}

/* ---- counts above INT_MAX, for real --------------------------------------------------------- */

/* u8 input of rank r at index i: the low byte of i plus a function of the higher bytes, so a
 * piece that lands at a wrong offset shows even when the offset is a multiple of 256. */
static inline uint8_t big_add(int64_t i, int mult, int r_term) {
    int64_t j = i >> 8;
    return (uint8_t)(mult * (j + (j >> 8) + (j >> 16)) + r_term);
}

/* Rank r's input over [from, from + len) into b[0 .. len). One 256-element block at a time, so
 * the inner loop is a plain vectorizable ramp. */
static void big_fill(uint8_t *b, int r, int64_t from, int64_t len) {
    for (int64_t i = from; i < from + len;) {
        int64_t end = CT_MIN(((i >> 8) + 1) << 8, from + len);
        uint8_t add = big_add(i, 1, 37 * r + 1);
        uint8_t *p = b + (i - from);
        for (int64_t k = 0; k < end - i; k++) p[k] = (uint8_t)(i + k + add);
        i = end;
    }
}

/* The first index in [from, from + len) where b[0 .. len) differs from rank `who`'s input
 * (who < 0: from the u8 sum, modulo 256, of every rank's input), or -1. */
static int64_t big_mismatch(const uint8_t *b, int who, int64_t from, int64_t len) {
    int N = world_size, mult = who < 0 ? N : 1;
    int r_term = who < 0 ? 37 * N * (N - 1) / 2 + N : 37 * who + 1;
    for (int64_t i = from; i < from + len;) {
        int64_t end = CT_MIN(((i >> 8) + 1) << 8, from + len);
        uint8_t add = big_add(i, mult, r_term), bad = 0;
        const uint8_t *p = b + (i - from);
        for (int64_t k = 0; k < end - i; k++) bad |= p[k] ^ (uint8_t)(mult * (i + k) + add);
        if (bad)
            for (int64_t k = 0; k < end - i; k++)
                if (p[k] != (uint8_t)(mult * (i + k) + add)) return i + k;
        i = end;
    }
    return -1;
}

static bool big_check(const uint8_t *b, int who, int64_t from, int64_t len) {
    int64_t at = big_mismatch(b, who, from, len);
    if (at < 0) return true;
    int N = world_size;
    uint8_t want = who < 0 ? (uint8_t)(N * at + big_add(at, N, 37 * N * (N - 1) / 2 + N))
                           : (uint8_t)(at + big_add(at, 1, 37 * who + 1));
    return why("element %lld: got %d, want %d", (long long)at, b[at - from], want);
}

/* Host memory the kernel says it can still give, in bytes (0 if unknown). */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* Allocates `bytes` on every rank, or on none: NULL everywhere when the machine has less than
 * `total` bytes available (over all ranks; checked by rank 0 before anyone allocates) or any
 * rank's allocation fails. */
static void *big_alloc(size_t bytes, uint64_t total) {
    int fits = world_rank != 0 || mem_available() >= total, all = 0;
    MPI_Bcast(&fits, 1, MPI_INT, 0, MPI_COMM_WORLD);
    void *p = fits ? malloc(bytes) : NULL;
    int have = p != NULL;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all) return p;
    free(p);
    if (world_rank == 0)
        printf("skip np%d operations on more than INT_MAX elements: %s %.1f GiB over all ranks\n",
               world_size, fits ? "could not allocate" : "less host memory available than",
               (double)total / 1073741824.0);
    return NULL;
}

/*
 * Counts above INT_MAX with the default chunk limit, at 2 ranks, on u8 so that one buffer of
 * 2·(2^31 + 1) bytes per rank serves all three operations. One buffer, reused, because on the
 * machines we test on the first touch of a page costs far more than the operation (about a
 * second per GiB), so a fresh buffer per operation would double the run time. Every element is
 * checked (a vectorized pass), so a lost, duplicated or misplaced piece shows wherever it is.
 * Memory: the buffer plus the library's temporaries for a reduction (about one piece each),
 * ~12 GiB over both ranks; the whole mode is skipped if the machine cannot hold 16.
 */
static int big_mode(void) {
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    ct_comm *c = ct_comm_mpi_new(dup, "world", 300.0);
    int N = c->size, r = c->rank;
    double t_all = ct_now();
    int64_t s = ((int64_t)1 << 31) + 1; /* per rank: above INT_MAX itself */
    int64_t n_all = s * N;
    uint8_t *buf = big_alloc((size_t)n_all, (uint64_t)n_all * (uint64_t)N * 2);
    if (buf) {
        int64_t n = ((int64_t)1 << 31) + 3;
        double t0 = ct_now();
        big_fill(buf, r, 0, n);
        double t1 = ct_now();
        ct_comm_allreduce(c, buf, n, CT_DTYPE_U8, CT_REDUCE_SUM);
        double t2 = ct_now();
        bool ok = big_check(buf, -1, 0, n);
        check(
            ok,
            "allreduce u8 sum of %lld elements (> INT_MAX) (fill %.1f s, op %.1f s, check %.1f s)",
            (long long)n, t1 - t0, t2 - t1, ct_now() - t2);

        /* In place: this rank's shard where it belongs in the full buffer. */
        uint8_t *mine = buf + (size_t)r * (size_t)s;
        t0 = ct_now();
        big_fill(mine, r, (int64_t)r * s, s);
        t1 = ct_now();
        ct_comm_allgather(c, mine, buf, n_all, CT_DTYPE_U8);
        t2 = ct_now();
        ok = true;
        for (int q = 0; q < N && ok; q++)
            ok = big_check(buf + (size_t)q * (size_t)s, q, (int64_t)q * s, s);
        check(ok,
              "allgather u8 in place, %lld elements per rank (> INT_MAX) (fill %.1f s, op %.1f s, "
              "check %.1f s)",
              (long long)s, t1 - t0, t2 - t1, ct_now() - t2);

        t0 = ct_now();
        big_fill(buf, r, 0, n_all);
        t1 = ct_now();
        ct_comm_reduce_scatter(c, buf, mine, n_all, CT_DTYPE_U8, CT_REDUCE_SUM);
        t2 = ct_now();
        ok = big_check(mine, -1, (int64_t)r * s, s);
        check(ok,
              "reduce_scatter u8 sum in place, %lld elements per rank (> INT_MAX) (fill %.1f s, op "
              "%.1f s, check %.1f s)",
              (long long)s, t1 - t0, t2 - t1, ct_now() - t2);
        free(buf);
    }
    ct_comm_free(c);

    /* The peak resident memory of this rank, for whoever sizes the machine for this test. */
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long hwm_kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &hwm_kb) == 1) break;
    if (f) fclose(f);
    long all_kb = 0;
    MPI_Reduce(&hwm_kb, &all_kb, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (world_rank == 0)
        printf("mpi_test_comm big np%d: %d ok, %d failed, %.1f s, peak resident %.1f GiB over all "
               "ranks\n",
               world_size, n_ok, n_fail, ct_now() - t_all, all_kb / 1048576.0);
    ct_mpi_finalize();
    return n_fail ? 1 : 0;
}

#ifdef CT_TEST_NCCL
static ct_backend *device_backend;

/* An NCCL group of the ranks of `comm` (a duplicate or split of the world); with `channels`,
 * transfers to the neighbours go on directed channels, else as held NCCL groups. */
static ct_comm *nccl_group(MPI_Comm comm, const char *name, double timeout_s, bool channels) {
    ct_comm *c = ct_comm_nccl_new(ct_comm_mpi_new(comm, name, timeout_s), device_backend, timeout_s,
                                  channels);
    CT_ASSERTF(c != NULL, "ct_comm_nccl_new: %s", ct_error_message());
    return c;
}

/* Rank 1 skips the second allreduce (or, for `mismatch`, calls an allgather in its place): the
 * others, which issue nine more collectives behind it, must end within about the 2 s limit with
 * the watchdog's report on the second (or the asynchronous error's), not hang. The wait that
 * notices is the backend's host wait (ct_backend_sync). */
static int nccl_watchdog_mode(bool mismatch) {
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    ct_comm_nccl_set_abort(ct_mpi_abort);
    ct_comm *c = nccl_group(dup, "dp", 2.0, false);
    float *x = alloc_garbage(1024, CT_DTYPE_F32);
    ct_comm_allreduce(c, x, 1024, CT_DTYPE_F32, CT_REDUCE_SUM); /* sequence #1: everyone */
    ct_backend_sync(device_backend);
    if (world_rank == 1 && !mismatch) {
        for (int i = 0; i < 120; i++) sleep(1); /* the abort from another rank ends this */
    } else if (world_rank == 1) {
        ct_comm_allgather(c, x + c->rank * (1024 / c->size), x, 1024, CT_DTYPE_F32);
        ct_backend_sync(device_backend);
    } else {
        ct_comm_allreduce(c, x, 1024, CT_DTYPE_F32, CT_REDUCE_SUM); /* #2: never completes */
        /* the host runs on (NCCL does not block it): the report must still name #2 as it was */
        uint16_t *y = alloc_garbage(64, CT_DTYPE_BF16);
        for (int i = 0; i < 9; i++) ct_comm_allreduce(c, y, 64, CT_DTYPE_BF16, CT_REDUCE_MAX);
        ct_backend_sync(device_backend);
    }
    fprintf(stderr, "rank %d: the watchdog did not fire\n", world_rank);
    return 3;
}
/* The NCCL flavour's checks (the file's comment says which). */
static int nccl_main(const char *mode) {
    /* one emulated device per rank (CUEMU_DEVICES), as cmd/ picks them */
    device_backend = ct_cuda_backend_new(ct_mpi_local_rank());
    if (!strcmp(mode, "watchdog")) return nccl_watchdog_mode(false);
    if (!strcmp(mode, "mismatch")) return nccl_watchdog_mode(true);
    CT_ASSERTF(!mode[0], "unknown mode '%s'", mode);
    double t0 = ct_now();
    MPI_Comm dup, half;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    ct_comm *world = nccl_group(dup, "world", 120.0, true);
    check(world->size == world_size && world->rank == world_rank,
          "ct_comm_nccl_new: a group of the world's ranks");
    test_collectives(world);
    ct_comm_free(world);
    /* a group of part of the world: ranks of the same parity, in reverse order; its transfers
     * go as held NCCL groups (the world's on directed channels) */
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_size - world_rank, &half);
    ct_comm *part = nccl_group(half, "dp", 120.0, false);
    test_matrix(part, (int64_t)part->size * 37, " (group of ranks of one parity)");
    ct_comm_free(part);
    ct_backend_free(device_backend);
    if (world_rank == 0)
        printf("mpi_test_comm_nccl np%d: %d ok, %d failed, %.1f s\n", world_size, n_ok, n_fail,
               ct_now() - t0);
    ct_mpi_finalize();
    return n_fail ? 1 : 0;
}
#endif

int main(int argc, char **argv) {
    if (ct_mpi_init(&argc, &argv) != CT_OK) {
        ct_error_print();
        return 1;
    }
    world_rank = ct_mpi_world_rank();
    world_size = ct_mpi_world_size();
    const char *mode = argc > 1 ? argv[1] : "";
#ifdef CT_TEST_NCCL
    return nccl_main(mode);
#endif
    if (!strcmp(mode, "watchdog")) return watchdog_mode(0);
    if (!strcmp(mode, "watchdog_recv")) return watchdog_recv_mode(0);
    if (!strcmp(mode, "watchdog_chunked")) return watchdog_mode(100);
    if (!strcmp(mode, "watchdog_recv_chunked")) return watchdog_recv_mode(100);
    if (!strcmp(mode, "bad_tag")) return bad_tag_mode(false);
    if (!strcmp(mode, "bad_tag_recv")) return bad_tag_mode(true);
    if (!strcmp(mode, "big")) return big_mode();
    CT_ASSERTF(!mode[0], "unknown mode '%s'", mode);
    double t0 = ct_now();

    /* Everything runs on one node here, so the node-local numbers are the world's. */
    check(ct_mpi_local_size() == world_size && ct_mpi_local_rank() == world_rank,
          "local rank %d of %d on this node", ct_mpi_local_rank(), ct_mpi_local_size());
    check(ct_log_rank() == world_rank, "log rank is the world rank");

    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    ct_comm *world = ct_comm_mpi_new(dup, "world", 120.0);
    check(world->size == world_size && world->rank == world_rank &&
              ct_comm_mpi_handle(world) == dup,
          "ct_comm_mpi_new wraps the communicator");
    test_collectives(world);
    ct_comm_free(world);

    test_grids();
    test_agree();

    if (world_rank == 0)
        printf("mpi_test_comm np%d: %d ok, %d failed, %.1f s\n", world_size, n_ok, n_fail,
               ct_now() - t0);
    ct_mpi_finalize();
    return n_fail ? 1 : 0;
}
