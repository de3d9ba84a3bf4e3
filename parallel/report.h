/*
 * report.h — the training run's report (report.c): rank 0's start-up report and progress lines,
 * the metrics lines; and the byte formatter that the report and `cooktrain plan` share. The
 * functions that read the trainer's state are declared in trainer_internal.h.
 */
#ifndef CT_PARALLEL_REPORT_H
#define CT_PARALLEL_REPORT_H

#include <stddef.h>

/* "12.3 MiB" below 1 GiB, "1.23 GiB" from there on, into buf (n bytes); returns buf. */
const char *ct_format_bytes(char *buf, size_t n, double bytes);

#endif /* CT_PARALLEL_REPORT_H */
