/*
 * comm_mpi.h — the MPI implementation of the comm interface (core/comm/comm.h) on host memory.
 *
 * One ct_comm wraps one MPI communicator. Every operation, blocking or not, is started as a
 * non-blocking MPI call; the blocking forms are that call plus ct_comm_wait. The wait is the
 * collective watchdog (core/README.md, Errors): it tests the request, yielding the CPU while it is
 * pending (oversubscribed ranks must let the others run), and when `timeout_s` passes it prints
 * rank, group, op, byte count and sequence number to stderr and ends the job with MPI_Abort.
 *
 * Open MPI has no progress thread on the CPU: a started operation advances only inside MPI
 * calls. ct_comm_poll tests every outstanding request of the group, and callers that overlap
 * communication with compute call it between compute ops.
 *
 * Supported: dtypes f32, bf16, i32, i64, u8, f64; ops sum, max, min on all of them. bf16
 * reductions use user-defined MPI ops that widen to float, reduce, and round back to nearest
 * even, so a bf16 sum is rounded once per partial sum of the library's algorithm (fine for
 * gradients, and exact for values whose partial sums are representable). u8 sums wrap modulo
 * 256 (a user op too: Open MPI 4.1's AVX component saturates them).
 *
 * Buffer rules (n = elements of the full buffer, N = group size, s = n / N, r = group rank):
 *   allreduce        always in place on `buf`.
 *   reduce_scatter   out of place (`recv` does not overlap `send`), or in place when
 *                    recv == send + r·s: this rank's shard is reduced where it already lies.
 *                    In place, the other shards of `send` are left with unspecified contents.
 *   allgather        out of place, or in place when send == recv + r·s (MPI_IN_PLACE).
 *   all_to_all       out of place, or send == recv (this rank's block j goes to rank j).
 *   broadcast        in place on `buf`.
 * Any other overlap is a bug and fails a CT_ASSERT.
 *
 * Counts of any size. MPI's count type is int, so an operation on more elements than one call
 * may carry is split into pieces, each one MPI call on contiguous memory, all behind the one
 * ct_comm_request: wait, test, poll and the watchdog handle them together, and the byte counters
 * (core/comm/comm.c) count the whole operation once, in the ring model as ever. One call carries
 * at most the chunk limit (INT_MAX elements; tests lower it with ct_comm_mpi_set_chunk_limit) and
 * at most INT_MAX bytes (Open MPI's non-blocking collectives compute some byte counts in int). The
 * pieces:
 *   allreduce, broadcast   contiguous chunks of the buffer.
 *   reduce_scatter         an allreduce of the whole buffer in contiguous chunks, of which this
 *                          rank keeps its shard: in place the buffer is the workspace (hence the
 *                          other shards' unspecified contents), out of place a temporary copy
 *                          of `send` (n elements) is. Up to twice the ring's traffic, but a few
 *                          full-size rounds, where Open MPI's reduce per destination would move
 *                          8 KiB per pass of the progress engine.
 *   allgather              for each chunk of the shard and each rank q, a broadcast from q
 *                          straight into recv (out of place, this rank first copies its shard
 *                          there).
 *   all_to_all             sends and receives between every pair, on a duplicate of the
 *                          communicator (made, collectively, inside the group's first split
 *                          all_to_all) so they never match the caller's messages; in place, the
 *                          sends read a temporary copy of the whole buffer.
 *   isend / irecv          consecutive messages with the same tag, kept in order by MPI's
 *                          non-overtaking rule. A receive must therefore name the count of its
 *                          send once either exceeds the limit (below it, MPI's own rule holds: a
 *                          receive may be longer than its message).
 * reduce_scatter, allgather and all_to_all stay one MPI call only while the FULL buffer n fits,
 * not just the shard: Open MPI's non-blocking forms compute n, and offsets into it, as int
 * products of group size and shard count. Reductions always use predefined (or our user) ops on
 * predefined datatypes, never derived ones. Every rank of a group must start an operation under
 * the same limit. The temporary copies are host allocations that abort (CT_ASSERT) on failure.
 *
 * Point-to-point tags must lie in [0, MPI_TAG_UB of the communicator], read once per group and
 * given to callers by ct_comm_max_tag; a tag outside is a caller's bug (CT_ASSERT).
 *
 * Sequence numbers in diagnostics: collectives are counted per group in the order this rank
 * started them, which is the same order on every rank of the group (MPI requires it), so the
 * number identifies one collective across ranks. Point-to-point operations have their own count.
 * An operation split into pieces has one number, and the watchdog's report says how many of its
 * pieces were still unfinished.
 */
#ifndef CT_PARALLEL_COMM_MPI_H
#define CT_PARALLEL_COMM_MPI_H

#include <mpi.h>

#include "core/comm/comm.h"
#include "core/common.h"

/*
 * Wraps `comm` (taken over: freeing the ct_comm frees it) as a group named `name` (copied).
 * `timeout_s` is the watchdog limit of each wait; <= 0 waits forever. The communicator's error
 * handler is set to MPI_ERRORS_RETURN so failures come back to CT_MPI_CHECK. Not collective.
 */
ct_comm *ct_comm_mpi_new(MPI_Comm comm, const char *name, double timeout_s);

/* The MPI communicator behind an MPI group (to bootstrap NCCL from it); MPI_COMM_NULL for any
 * other kind of group. Still owned by the ct_comm. */
MPI_Comm ct_comm_mpi_handle(const ct_comm *comm);

/* For tests: the most elements one MPI call carries, so small buffers exercise the splitting
 * of big ones. <= 0 restores the default, INT_MAX (the most an int count can say). Takes effect
 * for operations started afterwards; every rank of a group must set the same value at the same
 * point of its sequence of operations. */
void ct_comm_mpi_set_chunk_limit(int64_t elements);

/* Frees the user-defined reduction ops (bf16, u8 sum); ct_mpi_finalize calls it before
 * MPI_Finalize. */
void ct_comm_mpi_release_ops(void);

/* Completes `req` (MPI_Wait), or, while the idle hook is set (core/common.h: NCCL groups exist),
 * tests it and runs the hook between tests instead of blocking in MPI, so an emulated device
 * moves on while its host waits. */
void ct_mpi_wait(MPI_Request *req);

/*
 * Checks an MPI call: on failure prints the call, MPI's error string, the rank and file:line,
 * then aborts the job (an MPI error mid-run is a runtime failure nobody can recover from).
 */
#define CT_MPI_CHECK(call)                                                                         \
    do {                                                                                           \
        int ct_mpi_rc_ = (call);                                                                   \
        if (ct_mpi_rc_ != MPI_SUCCESS) ct_mpi_check_fail(#call, ct_mpi_rc_, __FILE__, __LINE__);   \
    } while (0)

__attribute__((noreturn)) void ct_mpi_check_fail(const char *call, int rc, const char *file,
                                                 int line);

#endif /* CT_PARALLEL_COMM_MPI_H */
