/*
 * bench_comm.c — collective bandwidth through the comm layer and through raw MPI, run under
 * mpirun by scripts/bench_comm.sh (which builds it).
 *
 * For each buffer size (f32; sizes from the command line, MiB or with a k suffix KiB) it times
 * allreduce, reduce_scatter and allgather four ways:
 *   ct_comm   the blocking ct_comm_* call on an MPI group (the blocking MPI call, armed with the
 *             watchdog thread)
 *   mpi       the blocking MPI call itself (Open MPI's tuned algorithms)
 *   ct_nb     the non-blocking ct_comm_i* call completed by ct_comm_wait (MPI_I* + MPI_Wait
 *             under the watchdog)
 *   mpi_nb    the same non-blocking MPI call, completed by MPI_Wait
 * so ct_comm / mpi and ct_nb / mpi_nb are the comm layer's cost (the goal: >= 0.9x of the raw
 * call's rate at every size >= 1 MiB; the ratio columns print them), and mpi_nb / mpi the
 * difference between Open MPI's non-blocking and blocking algorithms. Time is the slowest rank's,
 * median of a few runs after one warm-up. algbw = buffer bytes / time (the full buffer, as
 * nccl-tests counts it); busbw = algbw·2(N−1)/N for allreduce and algbw·(N−1)/N for the others: the
 * bytes each rank's links carry under the ring model, which is comparable across rank counts. The
 * last column divides busbw by single-thread memcpy bandwidth measured at the start of the same run
 * (rank 0 alone, the others asleep in a barrier), since on one machine collectives are memory
 * copies.
 *
 *   mpirun -np N bench_comm [SIZE...]     SIZE: MiB, or KiB as "64k"; default 1 4 16 64
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm/comm.h"
#include "core/common.h"
#include "core/comm/comm_mpi.h"
#include "parallel/context.h"

enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, N_OPS };
enum { PATH_CT, PATH_MPI, PATH_CT_NB, PATH_MPI_NB, N_PATHS };
static const char *op_names[N_OPS] = {"allreduce", "reduce_scatter", "allgather"};
static const char *path_names[N_PATHS] = {"ct_comm", "mpi", "ct_nb", "mpi_nb"};

/* Single-thread memcpy GB/s over `bytes`, median of 5 after a warm-up. */
static double memcpy_gbps(size_t bytes) {
    char *a = malloc(bytes), *b = malloc(bytes);
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double t[5];
    memcpy(b, a, bytes);
    for (int i = 0; i < 5; i++) {
        double t0 = ct_now();
        memcpy(i % 2 ? a : b, i % 2 ? b : a, bytes);
        t[i] = ct_now() - t0;
    }
    free(a);
    free(b);
    return (double)bytes / ct_median(t, 5) / 1e9;
}

/* One timed run of one op through one path; returns this rank's seconds. */
static double run_once(int op, int path, ct_comm *c, MPI_Comm mc, float *buf, float *out,
                       int64_t n) {
    int N = c->size;
    int s = (int)(n / N);
    MPI_Request req;
    MPI_Barrier(mc);
    double t0 = ct_now();
    switch (path * N_OPS + op) {
    case PATH_CT *N_OPS + OP_ALLREDUCE:
        ct_comm_allreduce(c, buf, n, CT_DTYPE_F32, CT_REDUCE_SUM);
        break;
    case PATH_CT *N_OPS + OP_REDUCE_SCATTER:
        ct_comm_reduce_scatter(c, buf, out, n, CT_DTYPE_F32, CT_REDUCE_SUM);
        break;
    case PATH_CT *N_OPS + OP_ALLGATHER: ct_comm_allgather(c, buf, out, n, CT_DTYPE_F32); break;
    case PATH_MPI *N_OPS + OP_ALLREDUCE:
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, mc);
        break;
    case PATH_MPI *N_OPS + OP_REDUCE_SCATTER:
        MPI_Reduce_scatter_block(buf, out, s, MPI_FLOAT, MPI_SUM, mc);
        break;
    case PATH_MPI *N_OPS + OP_ALLGATHER:
        MPI_Allgather(buf, s, MPI_FLOAT, out, s, MPI_FLOAT, mc);
        break;
    case PATH_CT_NB *N_OPS + OP_ALLREDUCE:
        ct_comm_wait(c, ct_comm_iallreduce(c, buf, n, CT_DTYPE_F32, CT_REDUCE_SUM));
        break;
    case PATH_CT_NB *N_OPS + OP_REDUCE_SCATTER:
        ct_comm_wait(c, ct_comm_ireduce_scatter(c, buf, out, n, CT_DTYPE_F32, CT_REDUCE_SUM));
        break;
    case PATH_CT_NB *N_OPS + OP_ALLGATHER:
        ct_comm_wait(c, ct_comm_iallgather(c, buf, out, n, CT_DTYPE_F32));
        break;
    case PATH_MPI_NB *N_OPS + OP_ALLREDUCE:
        MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, mc, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        break;
    case PATH_MPI_NB *N_OPS + OP_REDUCE_SCATTER:
        MPI_Ireduce_scatter_block(buf, out, s, MPI_FLOAT, MPI_SUM, mc, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        break;
    case PATH_MPI_NB *N_OPS + OP_ALLGATHER:
        MPI_Iallgather(buf, s, MPI_FLOAT, out, s, MPI_FLOAT, mc, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        break;
    }
    return ct_now() - t0;
}

int main(int argc, char **argv) {
    if (ct_mpi_init(&argc, &argv) != CT_OK) {
        ct_error_print();
        return 1;
    }
    int rank = ct_mpi_world_rank(), N = ct_mpi_world_size();
    int sizes_kib[16] = {1 << 10, 4 << 10, 16 << 10, 64 << 10}, n_sizes = 4;
    if (argc > 1) {
        n_sizes = 0;
        for (int i = 1; i < argc && n_sizes < 16; i++) {
            char *end;
            long v = strtol(argv[i], &end, 10);
            sizes_kib[n_sizes++] = (int)(*end == 'k' ? v : v << 10);
        }
    }
    int max_kib = 0;
    for (int i = 0; i < n_sizes; i++) max_kib = CT_MAX(max_kib, sizes_kib[i]);

    MPI_Comm dup, mc;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    MPI_Comm_dup(MPI_COMM_WORLD, &mc);
    ct_comm *c = ct_comm_mpi_new(dup, "world", 600.0);

    /* memcpy reference: rank 0 alone, everyone else sleeps in the comm layer's barrier wait. */
    double copy_gbps = 0;
    if (rank == 0) copy_gbps = memcpy_gbps((size_t)(64 << 10) << 10);
    ct_comm_barrier(c);

    size_t max_bytes = (size_t)max_kib << 10;
    float *buf = malloc(max_bytes), *out = malloc(max_bytes);
    for (size_t i = 0; i < max_bytes / 4; i++) buf[i] = out[i] = (float)(i % 7);

    if (rank == 0) {
        printf("ranks %d; memcpy (1 thread, %d MiB): %.2f GB/s\n", N, (64 << 10) >> 10, copy_gbps);
        printf("%-15s %7s %-8s %10s %11s %11s %13s %13s\n", "op", "size", "path", "time_ms",
               "algbw_GB/s", "busbw_GB/s", "busbw/memcpy", "ct/raw rate");
    }
    for (int si = 0; si < n_sizes; si++) {
        size_t bytes = (size_t)sizes_kib[si] << 10;
        char size_text[16];
        if (sizes_kib[si] % 1024)
            snprintf(size_text, sizeof size_text, "%d KiB", sizes_kib[si]);
        else
            snprintf(size_text, sizeof size_text, "%d MiB", sizes_kib[si] >> 10);
        int64_t n = (int64_t)(bytes / 4) / N * N; /* divisible by N for the sharded ops */
        /* Fewer runs for big buffers keeps the whole bench within minutes on two cores. */
        int reps = sizes_kib[si] >= (64 << 10) ? 7 : sizes_kib[si] >= (16 << 10) ? 11 : 21;
        for (int op = 0; op < N_OPS; op++) {
            double path_sec[N_PATHS];
            /* Warm-up: every path of the op once before any is timed. The first calls of an op
             * after another one can be several times slower (measured: a blocking
             * reduce-scatter of 1 MiB on 4 ranks took 1.3 ms first, 0.3 ms after), and
             * whichever path came first used to pay for it. */
            for (int path = 0; path < N_PATHS; path++) run_once(op, path, c, mc, buf, out, n);
            for (int path = 0; path < N_PATHS; path++) {
                double t[32];
                run_once(op, path, c, mc, buf, out, n); /* warm-up */
                for (int r = 0; r < reps; r++) {
                    double mine = run_once(op, path, c, mc, buf, out, n);
                    MPI_Allreduce(&mine, &t[r], 1, MPI_DOUBLE, MPI_MAX, mc); /* slowest rank */
                }
                /* Values grow with every allreduce; keep them small so no run hits inf. */
                if (op == OP_ALLREDUCE) memset(buf, 0, (size_t)n * 4);
                double sec = ct_median(t, reps);
                path_sec[path] = sec;
                double algbw = (double)n * 4 / sec / 1e9;
                double factor = op == OP_ALLREDUCE ? 2.0 * (N - 1) / N : (double)(N - 1) / N;
                /* The comm layer's rate over the raw call's, on the raw call's line. */
                char ratio[16] = "";
                if (path == PATH_MPI || path == PATH_MPI_NB)
                    snprintf(ratio, sizeof ratio, "%.2f", sec / path_sec[path - 1]);
                if (rank == 0)
                    printf("%-15s %8s %-8s %10.3f %11.2f %11.2f %13.2f %13s\n", op_names[op],
                           size_text, path_names[path], sec * 1e3, algbw, algbw * factor,
                           algbw * factor / copy_gbps, ratio);
            }
        }
        if (rank == 0) fflush(stdout);
    }
    free(buf);
    free(out);
    ct_comm_free(c);
    MPI_Comm_free(&mc);
    ct_mpi_finalize();
    return 0;
}
