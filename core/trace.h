/*
 * trace.h — Chrome/Perfetto trace files (log.trace; core/README.md, Logging): {"traceEvents":
 * [...]} with one process per rank (pid = world rank), named threads (tid) and complete spans
 * ("ph": "X", microseconds of ct_now, shifted: ct_trace_set_shift). With several ranks each
 * writes PATH.rank<R>.json (PATH without its extension), and the trainer merges them into PATH
 * (ct_trace_write_merged: a process per rank, on one clock); one process writes PATH itself.
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
/* Every time given from now on is written as time + shift (seconds): the trainer puts each
 * rank's time 0 at one moment, the end of a barrier (core/README.md, Logging). */
void ct_trace_set_shift(ct_trace *trace, double shift);
/* Names this rank's process. */
void ct_trace_process(ct_trace *trace, const char *name);
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
/* The path of this rank's file (PATH.rank<R>.json with several ranks). */
void ct_trace_rank_path(char *buf, size_t n, const char *path, int rank, int world_size);
/* Writes PATH as one trace holding the events of the n rank files' texts `bodies` (each a whole
 * file as ct_trace_close leaves it), in rank order. CT_ERR_INPUT (message set) on failure. */
ct_status ct_trace_write_merged(const char *path, int n, char *const *bodies);

#endif /* CT_CORE_TRACE_H */
