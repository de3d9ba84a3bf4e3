/*
 * flight.h — the flight recorder (core/README.md, Flight recorder): every rank keeps its last N
 * collective and point-to-point operations (group, op, dtype, bytes, sequence number, start and
 * end time, state), recorded by the comm wrappers (comm.c) when an operation STARTS and updated
 * when it completes, so a hung operation is in the ring as "started". On a watchdog timeout, an
 * MPI or NCCL error, SIGTERM or SIGUSR2 the ring is written to DIR/flight/rank-R.txt (one file
 * per rank, written whole then renamed); `cooktrain diagnose` (cmd/tools/diagnose.c) reads them
 * all and names the first operation some rank entered and another never did.
 *
 * Sequence numbers follow the group: the k-th collective on a group is #k on every member; the
 * k-th send from rank p to rank q of a group is #k, and so is the k-th receive on q from p.
 * Groups of one rank are not recorded (nothing can hang there).
 *
 * The record file, one item per line ("-" for an unknown field):
 *   cooktrain flight record 2
 *   rank R world W pid P host HOST reason REASON time T capacity C recorded TOTAL job JOB timeout S
 *   group G NAME RANK SIZE MEMBER0 MEMBER1 ...        (members: world ranks, in group order)
 *   op G KIND SEQ PEER TAG DTYPE BYTES START END STATE
 * KIND is an op name of ct_comm_op_name, or "recv" (point-to-point is "send"/"recv"); PEER and
 * TAG are -1 for collectives; START and END are wall-clock seconds (END -1 while unfinished);
 * STATE is started, enqueued (handed to the device's stream: NCCL), or completed. JOB is the
 * job's id (parallel/context.h: ct_mpi_job_id), the same on every rank; S is the watchdog's
 * timeout (parallel.timeout_s). Version 1 records lack both. A record that an earlier job left in
 * DIR/flight is moved to DIR/flight/earlier/JOB/ when the next job configures its recorder.
 */
#ifndef CT_FLIGHT_H
#define CT_FLIGHT_H

#include "core/comm/comm.h"
#include "core/trace.h"

/* Keep the last `capacity` operations (0: record nothing) and write records under `dir`
 * ("DIR/flight/rank-R.txt") naming job `job` and the watchdog's `timeout_s`; moves an earlier
 * job's record of this rank aside. Installs the SIGUSR2 handler and starts the thread that writes
 * on a signal. Call once, from the main thread, before the first operation to record. */
void ct_flight_configure(int capacity, const char *dir, int world_size, const char *job,
                         double timeout_s);

/* What COOKTRAIN_FAULT_COMM=RANK:GROUP:SEQ:ACTION[:SECONDS] plants (for the tests): on world rank
 * RANK, the SEQ-th collective on group GROUP is skipped (never issued nor counted, as if the code
 * had not called it), issued as a barrier instead (mismatch), or issued after sleeping SECONDS
 * (sleep); or the SEQ-th send to a peer of the group is issued after sleeping SECONDS
 * (sleep-send: a late pipeline stage). */
typedef enum ct_flight_fault {
    CT_FAULT_NONE = 0,
    CT_FAULT_SKIP,
    CT_FAULT_MISMATCH
} ct_flight_fault;

/* Records the start of an operation of `comm` (comm.c's wrappers, groups of several ranks);
 * `is_recv` with kind CT_COMM_SEND marks a receive. Returns the planted fault for it, if any (a
 * skipped operation is not recorded); *id is the record's id for ct_flight_end. */
ct_flight_fault ct_flight_start(ct_comm *comm, ct_comm_op_kind kind, bool is_recv, int peer,
                                int tag, ct_dtype dtype, int64_t n, int64_t *id);
/* The record `id` has completed (or been enqueued on a device stream); ignored once the ring has
 * moved past it. */
void ct_flight_end(int64_t id, bool enqueued_only);
/* The device ran record `id` from start to end (seconds on ct_now's clock, from its stream's
 * events: NCCL): ends it as ct_flight_end does, and the trace's span gets these times. */
void ct_flight_end_device(int64_t id, double start, double end);
/* log.trace: from now on every operation that completes is also kept as a span (its host times,
 * or its device's through ct_flight_end_device) — for every operation, not the last N; recorded
 * only while the ring is (capacity > 0). */
void ct_flight_keep_spans(bool on);
/* Whether spans are kept (an implementation skips reading device times when not). */
bool ct_flight_keeps_spans(void);
/* Writes the spans kept into `trace`: per group, a thread "device comm NAME" (NCCL: spans from
 * the stream's events; tid_base + 2·index) and one "host comm NAME" (host memory, through MPI;
 * tid_base + 2·index + 1), each where it has spans, one span per operation
 * ("allreduce 256.0 KiB #3", "send 1.5 MiB peer 1 #2"). */
void ct_flight_trace(ct_trace *trace, int tid_base);
/* The id of the record started last (what an implementation that completes operations later,
 * NCCL, keeps to end it). */
int64_t ct_flight_last(void);
/* The non-blocking operation `req` has record `id`; ct_flight_request_take returns that id and
 * forgets the pair (0 when `req` has none: already taken, or never recorded). */
void ct_flight_request(ct_comm *comm, ct_comm_request *req, int64_t id);
int64_t ct_flight_request_take(ct_comm *comm, ct_comm_request *req);

/* Writes this rank's record now (from any thread but a signal handler); false if it could not.
 * Prints "flight record: PATH" on stderr. */
bool ct_flight_dump(const char *reason);
/* From a signal handler: asks the writer thread to write the record (async-signal-safe). */
void ct_flight_signal(int sig);

/* Releases a group's recorder state (comm.c, ct_comm_free). */
void ct_flight_forget(ct_comm *comm);

#endif
