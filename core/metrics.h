/*
 * metrics.h — the JSON-lines metrics file (log.metrics; core/README.md, Logging), written by world
 * rank 0.
 *
 * One JSON object per line: a setup line first ("setup": true: the run's shape, measured rates,
 * memory by category next to the formulas), then one line per training step (at least step,
 * loss, lr, grad_norm, tokens_per_s) and one per evaluation (step, val_loss). A line is built
 * field by field and written whole with a flush, so a reader (tail -f, a test) never sees half
 * of one. Numbers that are not finite are written as null: JSON has no spelling for NaN.
 *
 * A failed write (a full disk) is not fatal on the spot: the first failure is kept, with its
 * message, and ct_metrics_status returns it, so the trainer can agree on it with every rank at
 * the next step boundary and all stop together. Every function accepts a NULL handle and does
 * nothing — ranks other than 0 hold none.
 */
#ifndef CT_CORE_METRICS_H
#define CT_CORE_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/common.h"

typedef struct ct_metrics ct_metrics;

/* Creates the file's parent directories and opens it for writing (truncating). CT_ERR_INPUT
 * with a hint when that fails. */
ct_status ct_metrics_open(ct_metrics **out, const char *path);
/* The largest "step" of a training line ("loss" in it) in metrics file `path`: the last step a
 * run that logged there finished; -1 for none or no file. */
int64_t ct_metrics_last_step(const char *path);
void ct_metrics_free(ct_metrics *metrics);

/* One line: begin, fields in order, end (which writes and flushes it). */
void ct_metrics_begin(ct_metrics *metrics);
void ct_metrics_int(ct_metrics *metrics, const char *key, int64_t value);
void ct_metrics_uint(ct_metrics *metrics, const char *key, uint64_t value);
/* value printed with the printf format fmt (one double conversion), or null if not finite. */
void ct_metrics_num(ct_metrics *metrics, const char *key, const char *fmt, double value);
/* An array of n values, each as ct_metrics_num prints it. */
void ct_metrics_nums(ct_metrics *metrics, const char *key, const char *fmt, int64_t n,
                     const double *values);
void ct_metrics_bool(ct_metrics *metrics, const char *key, bool value);
/* value must need no JSON escaping (names the program chooses, not user text). */
void ct_metrics_str(ct_metrics *metrics, const char *key, const char *value);
void ct_metrics_end(ct_metrics *metrics);

/* CT_OK, or CT_ERR_RUNTIME once a write has failed (the message was set then). */
ct_status ct_metrics_status(const ct_metrics *metrics);

#endif /* CT_CORE_METRICS_H */
