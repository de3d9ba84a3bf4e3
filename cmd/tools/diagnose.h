/*
 * diagnose.h — `cooktrain diagnose RUN_DIR`: reads the flight records every rank wrote
 * (core/comm/flight.h; RUN_DIR/flight/rank-R.txt) and prints which ranks wrote one, then the
 * diagnosis: the first operation (by the time it was entered) that some rank entered and another
 * member of its group never did, or entered as a different operation; for point-to-point, a send
 * whose receive was never posted, or the reverse — or that it is not hung. Exit 2 when there are
 * no readable records.
 */
#ifndef CT_DIAGNOSE_H
#define CT_DIAGNOSE_H

#include "core/common.h"

#include <stdio.h>

/* hang_after: the seconds one rank must have waited in an operation for a job whose records no
 * watchdog or error wrote (SIGUSR2, SIGTERM) to count as hung; < 0: the job's watchdog timeout,
 * at most 10 s. Below it, the diagnosis is "not hung": the records are snapshots of a running
 * job, taken each at its own moment. Only the job that wrote the newest record is read; records
 * of other jobs are named and left out. */
ct_status ct_diagnose(const char *run_dir, double hang_after, FILE *out);

#endif
