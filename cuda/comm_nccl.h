/*
 * comm_nccl.h — the NCCL implementation of the comm interface (core/comm/comm.h) for the CUDA
 * backend (core/README.md, The comm interface; parallel/README.md, The grid).
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
 * Point-to-point (the pipeline). NCCL matches sends and receives between two ranks in posting
 * order, a send may not finish before its receive has started, and the operations of one
 * communicator run one after another. On one communicator a send and a receive posted in
 * opposite orders on two ranks (1F1B's "send activation, receive gradient" against "send
 * gradient, receive activation") wait for each other, and grouping pairs of them
 * (ncclGroupStart/End) is not enough for the interleaved schedule, whose stages send ahead for
 * later chunks. So a group made with p2p_channels (the pipeline's) has directed channels for
 * each way to and from its next and previous rank: communicators of two ranks on a stream of their
 * own, on which one rank only sends and the other only receives, in the same order — queues,
 * which cannot wait in a cycle whatever the schedule. Each way has two lanes, chosen by the tag's
 * parity (the pipeline's tags: activations even, gradients odd): a V-shaped schedule (zbv) sends
 * a neighbour activations of one leg and gradients of the other, in an order its receives need
 * not share, and each lane carries one boundary's messages in order. Transfers to other ranks (or
 * on groups without channels) are held and started together, in one ncclGroupStart/End, at the
 * next wait, test, collective or barrier. Tags are not carried otherwise: sender and receiver post
 * in matching order.
 *
 * Byte counters are core/comm/comm.c's ring model, as for MPI. all_to_all is grouped sends and
 * receives. Dtypes f32, bf16, i32, i64, u8, f64; ops sum, max, min.
 *
 * Watchdog (core/README.md, Errors). Every device operation is tracked from the moment it is issued
 * until its event has passed. While the host waits for the device (the CUDA backend's host waits
 * poll the stream and call ct_idle(), common.h, between polls), every group checks its operations:
 * one older than `timeout_s`, or an asynchronous error from ncclCommGetAsyncError, prints rank,
 * group, op, bytes and sequence number, calls ncclCommAbort and ends the job (exit status 1).
 * Destroying the group destroys the communicator; ncclCommAbort is used when the job is failing.
 */
#ifndef CT_CUDA_COMM_NCCL_H
#define CT_CUDA_COMM_NCCL_H

#include <stdbool.h>

#include "core/backend/backend.h"
#include "core/comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Wraps `boot` (an MPI group; taken over, freed with the result) with an NCCL communicator of
 * the same ranks on `be`'s device (a "cuda" backend), and with p2p_channels the directed channels
 * to and from the next and previous rank (above). Collective over `boot`. NULL with the error
 * set (ct_error) when NCCL cannot make the communicator; `boot` is then freed too.
 */
ct_comm *ct_comm_nccl_new(ct_comm *boot, ct_backend *be, double timeout_s, bool p2p_channels);

/* Ends the job after a watchdog report (default: exit(1)); cmd/ passes MPI_Abort's wrapper so
 * every rank ends at once. */
void ct_comm_nccl_set_abort(void (*abort_job)(int exit_code));

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_COMM_NCCL_H */
