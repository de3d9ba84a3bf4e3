/*
 * diagnose.h — `cooktrain diagnose RUN_DIR`: reads the flight records every rank wrote
 * (core/comm/flight.h; RUN_DIR/flight/rank-R.txt) and prints which ranks wrote one, then the
 * diagnosis: the first operation (by the time it was entered) that some rank entered and another
 * member of its group never did, or entered as a different operation; for point-to-point, a send
 * whose receive was never posted, or the reverse. Exit 2 when there are no readable records.
 */
#ifndef CT_DIAGNOSE_H
#define CT_DIAGNOSE_H

#include "core/common.h"

#include <stdio.h>

ct_status ct_diagnose(const char *run_dir, FILE *out);

#endif
