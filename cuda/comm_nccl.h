/*
 * comm_nccl.h — the NCCL implementation of the comm interface (core/comm.h) for the CUDA backend
 * (DESIGN §3, §4, §10).
 *
 * One ct_comm wraps one NCCL communicator of the ranks of an MPI group (its "bootstrap" group,
 * taken over): group rank 0 makes the unique id, the bootstrap group broadcasts it, every rank
 * calls ncclCommInitRank. MPI stays the control plane: buffers in host memory (the trainer's
 * scalars: loss sums, norms, agreement flags) still go through the bootstrap group, so a bound
 * group may carry both; device buffers go through NCCL.
 *
 * Ordering (comm.h). Collectives and transfers run on the group's own communication stream.
 * Before one starts, that stream waits (on the device) for the event the compute stream recorded
 * (wait_compute); after it, an event is recorded on the communication stream, and
 *   a blocking operation makes the compute stream wait for it at once (the host does not wait:
 *   later compute is ordered after the collective on the device);
 *   a non-blocking one keeps the event in its request: ct_comm_test asks whether it has passed,
 *   ct_comm_wait makes the compute stream wait for it.
 * So data-parallel reductions started during backward overlap the rest of backward, and nothing
 * blocks the host but the backend's own host waits.
 *
 * Point-to-point (the pipeline): isend and irecv are held and started together, inside one
 * ncclGroupStart/ncclGroupEnd, at the next wait, test, collective or barrier of the group. NCCL
 * matches sends and receives between two ranks in posting order and a send may not finish until
 * its receive has started, so a send and a receive posted back to back on two ranks (1F1B's
 * "send activation, receive gradient" against "send gradient, receive activation") must be one
 * group or they wait for each other. Tags are not carried: the pipeline posts in matching order.
 *
 * Byte counters are core/comm.c's ring model, as for MPI. all_to_all is grouped sends and
 * receives. Dtypes f32, bf16, i32, i64, u8, f64; ops sum, max, min.
 *
 * Watchdog (DESIGN §9). Every device operation is tracked from the moment it is issued until its
 * event has passed. While the host waits for the device (the CUDA backend's host waits poll the
 * stream and call ct_idle(), common.h, between polls), every group checks its operations: one
 * older than `timeout_s`, or an asynchronous error from ncclCommGetAsyncError, prints rank,
 * group, op, bytes and sequence number, calls ncclCommAbort and ends the job (exit status 1).
 * Destroying the group destroys the communicator; ncclCommAbort is used when the job is failing.
 */
#ifndef CT_CUDA_COMM_NCCL_H
#define CT_CUDA_COMM_NCCL_H

#include "core/backend.h"
#include "core/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Wraps `boot` (an MPI group; taken over, freed with the result) with an NCCL communicator of
 * the same ranks on `be`'s device (a "cuda" backend). Collective over `boot`. NULL with the error
 * set (ct_error) when NCCL cannot make the communicator; `boot` is then freed too.
 */
ct_comm *ct_comm_nccl_new(ct_comm *boot, ct_backend *be, double timeout_s);

/* Ends the job after a watchdog report (default: exit(1)); cmd/ passes MPI_Abort's wrapper so
 * every rank ends at once. */
void ct_comm_nccl_set_abort(void (*abort_job)(int exit_code));

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_COMM_NCCL_H */
