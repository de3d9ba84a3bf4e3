/*
 * trace.h — Chrome/Perfetto trace files (log.trace; core/README.md, Logging): {"traceEvents":
 * [...]} with one process per rank (pid = world rank), named threads (tid) and complete spans
 * ("ph": "X", microseconds of ct_now). With several ranks each writes PATH.rank<R>.json (PATH
 * without its extension), which Perfetto opens side by side; one process writes PATH itself.
 *
 * The writer knows nothing of what it traces: data_parallel.c turns its events into spans
 * (ct_dp_trace), and other modules can add threads of their own.
 */
#ifndef CT_CORE_TRACE_H
#define CT_CORE_TRACE_H

#include "core/common.h"

typedef struct ct_trace ct_trace;

/* Creates the parent directories and opens this rank's file. CT_ERR_INPUT with a hint. */
ct_status ct_trace_open(ct_trace **out, const char *path, int rank, int world_size);
/* Names thread tid of this rank's process. */
void ct_trace_thread(ct_trace *trace, int tid, const char *name);
/* A span on thread tid from start to end (seconds, ct_now), labelled with its microbatch. */
void ct_trace_span(ct_trace *trace, int tid, const char *name, double start, double end,
                   int microbatch);
/* A counter track at `time` (seconds, ct_now): series "0", "1", ... n-1 with these values
 * ("ph": "C"; Perfetto draws them stacked). */
void ct_trace_counter(ct_trace *trace, const char *name, double time, int n, const double *values);
/* Ends the file and frees the writer; CT_ERR_INPUT (message set) if a write failed. */
ct_status ct_trace_close(ct_trace *trace);

#endif /* CT_CORE_TRACE_H */
