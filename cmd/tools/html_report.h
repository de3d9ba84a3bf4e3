/*
 * html_report.h — `cooktrain report RUN_DIR... [-o FILE]`: one self-contained HTML page (inline
 * SVG, no script, nothing fetched) of one or more runs' metrics: a table of the runs, then loss
 * and validation loss, learning rate, gradient norm, tokens/s, MFU, exposed communication and
 * bubble, backend memory over the steps, tokens per expert with MoE, and memory per category at
 * start-up; several runs are overlaid, one colour each, labelled by their folders. A run is a
 * log.run_dir (its metrics.jsonl) or a metrics file; the segments a resumed run appended to it
 * are stitched (each step once, the later segment's; each resume marked). The page goes to FILE,
 * else the first run directory's report.html, else ./report.html.
 */
#ifndef CT_HTML_REPORT_H
#define CT_HTML_REPORT_H

#include "core/common.h"

ct_status ct_html_report(int n_runs, char **run_args, const char *out_path);

#endif
