/*
 * html_report.c — `cooktrain report RUN_DIR...` (html_report.h): one self-contained HTML page of
 * one or more runs' metrics (log.run_dir/metrics.jsonl, or a metrics file), its charts inline SVG
 * drawn here: no script, no style sheet or font from elsewhere, nothing fetched.
 *
 * Every chart is a <svg class="chart" data-chart="NAME">; each series a <polyline> with
 * data-run (the run's index) and data-series (the metrics key), its points in data order, y
 * growing downward as SVG's does. Tick labels are <text class="xtick"> and class="ytick" (one
 * format per axis, whole steps on x), legend labels class="legend", resumes a <line
 * class="resume" data-run data-step> and its <text class="resume">. Byte counts are drawn in MiB,
 * or GiB from 1 GiB up, the unit named on the axis. The tests read them back
 * (test/tools/check_report.py).
 *
 * A metrics file may hold several segments: every start of the trainer (a fresh one, or a resume
 * from a checkpoint into the same file) appends its own setup line, with start_step (older files
 * lack it: the step after the last one seen) and resumed_from. A segment that starts at step S
 * replaces the steps >= S of the earlier ones (they were run again after a restart from an older
 * checkpoint), so every step is drawn once, in order; figures of the setup line are the last
 * segment's.
 */
#include "html_report.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* One series: (x, y) points, x a step. */
typedef struct series {
    double *x, *y;
    int n, cap;
} series;

enum {
    S_LOSS,
    S_VAL_LOSS,
    S_LR,
    S_GNORM,
    S_TOKS,
    S_MFU,
    S_COMM,
    S_BUBBLE,
    S_MEM,
    S_LOAD_MIN,
    S_LOAD_MEAN,
    S_LOAD_MAX,
    S_COUNT
};
static const char *series_keys[S_COUNT] = {
    "loss",           "val_loss", "lr",        "grad_norm",    "tokens_per_s",  "mfu",
    "exposed_comm_s", "bubble_s", "mem_bytes", "moe_load_min", "moe_load_mean", "moe_load_max"};

/* the setup line's memory categories, and their names on the page */
static const char *mem_keys[] = {"mem_params", "mem_grads", "mem_optim",    "mem_master",
                                 "mem_acts",   "mem_comm",  "mem_gathered", "mem_workspace"};
enum { N_MEM = sizeof mem_keys / sizeof mem_keys[0] };
static const char *mem_names[N_MEM] = {"params", "grads", "optimizer", "master",
                                       "acts",   "comm",  "gathered",  "workspace"};

enum { MAX_EXPERTS = 256 };      /* per-expert curves drawn (the min/mean/max chart covers all) */
enum { MAX_EXPERT_LEGEND = 32 }; /* legend entries of the per-expert chart; then "+N more" */

/* How a segment began: the first of its file and fresh, from a checkpoint, or over from step 1. */
typedef enum seg_kind { SEG_FRESH, SEG_RESUMED, SEG_RESTARTED } seg_kind;

typedef struct segment {
    long long start; /* its first step */
    seg_kind kind;
    long long rerun;         /* steps the segments before had run from start on: lost, run again */
    long long local;         /* a restart from this local checkpoint step (-1: none) */
    long long from_partners; /* of its rank files, partners' copies */
} segment;

typedef struct members {
    series *s;
    int n;
} members;

typedef struct run {
    char name[256];         /* its label: its folder's name, told apart from the others' */
    char path[CT_PATH_MAX]; /* the metrics file, as given */
    char *real;             /* the metrics file's resolved path, which names the run */
    series s[S_COUNT];
    series trained; /* x: every training step kept */
    /* one series per member: moe_tokens_per_expert (each expert's tokens a step) and
     * rank_compute_s (each rank's step time outside communication, at the progress steps) */
    members experts, ranks;
    segment *segs;
    int n_segs;
    /* from the last segment's setup line */
    double mem[N_MEM];
    bool have_setup;
    long long world, dp, zero, steps;
    char precision[16];
} run;

static const char *palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
enum { N_COLORS = sizeof palette / sizeof palette[0] };

static void push(series *s, double x, double y) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->x = realloc(s->x, (size_t)s->cap * sizeof *s->x);
        s->y = realloc(s->y, (size_t)s->cap * sizeof *s->y);
        CT_ASSERT(s->x && s->y);
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
}

/* Drops the points at steps >= start (run again by a later segment). */
static void drop_from(series *s, double start) {
    int k = 0;
    for (int i = 0; i < s->n; i++)
        if (s->x[i] < start) s->x[k] = s->x[i], s->y[k++] = s->y[i];
    s->n = k;
}

static void series_release(series *s) {
    free(s->x);
    free(s->y);
}

static bool number(json_t *obj, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || !json_is_number(v)) return false;
    *out = json_number_value(v);
    return isfinite(*out);
}

/* ---- reading --------------------------------------------------------------------------------- */

/* A setup line: a new segment, which replaces the earlier segments' steps from its start on. */
static void read_setup(run *r, json_t *obj) {
    double v, last = 0;
    for (int i = 0; i < r->trained.n; i++) last = fmax(last, r->trained.x[i]);
    segment seg = {.start = (long long)last + 1, .local = -1};
    if (number(obj, "start_step", &v)) seg.start = (long long)v;
    seg.rerun = CT_MAX((long long)last - seg.start + 1, 0);
    if (number(obj, "local_restore_step", &v) && v >= 0) seg.local = (long long)v;
    if (number(obj, "local_restore_from_partners", &v)) seg.from_partners = (long long)v;
    json_t *from = json_object_get(obj, "resumed_from");
    bool resumed = json_is_string(from) && json_string_length(from) > 0;
    seg.kind = resumed || seg.start > 1 ? SEG_RESUMED : r->n_segs ? SEG_RESTARTED : SEG_FRESH;
    for (int s = 0; s < S_COUNT; s++) drop_from(&r->s[s], (double)seg.start);
    for (int e = 0; e < r->experts.n; e++) drop_from(&r->experts.s[e], (double)seg.start);
    for (int q = 0; q < r->ranks.n; q++) drop_from(&r->ranks.s[q], (double)seg.start);
    drop_from(&r->trained, (double)seg.start);
    r->segs = realloc(r->segs, (size_t)(r->n_segs + 1) * sizeof *r->segs);
    CT_ASSERT(r->segs != NULL);
    r->segs[r->n_segs++] = seg;

    r->have_setup = true;
    memset(r->mem, 0, sizeof r->mem);
    r->world = r->dp = r->zero = r->steps = 0;
    r->precision[0] = '\0';
    for (int i = 0; i < N_MEM; i++)
        if (number(obj, mem_keys[i], &v)) r->mem[i] = v;
    if (number(obj, "world", &v)) r->world = (long long)v;
    if (number(obj, "dp", &v)) r->dp = (long long)v;
    if (number(obj, "zero_stage", &v)) r->zero = (long long)v;
    if (number(obj, "steps", &v)) r->steps = (long long)v;
    json_t *p = json_object_get(obj, "precision");
    if (json_is_string(p)) snprintf(r->precision, sizeof r->precision, "%s", json_string_value(p));
}

/* A line's array of per-member numbers (times scale) as the next point of each member's series;
 * MAX_EXPERTS members at most. */
static void read_members(members *g, json_t *per, double step, double scale) {
    if (!json_is_array(per)) return;
    int n = (int)CT_MIN(json_array_size(per), (size_t)MAX_EXPERTS);
    if (n > g->n) {
        g->s = realloc(g->s, (size_t)n * sizeof *g->s);
        CT_ASSERT(g->s != NULL);
        memset(g->s + g->n, 0, (size_t)(n - g->n) * sizeof *g->s);
        g->n = n;
    }
    for (int e = 0; e < n; e++) {
        json_t *x = json_array_get(per, (size_t)e);
        if (json_is_number(x) && isfinite(json_number_value(x)))
            push(&g->s[e], step, scale * json_number_value(x));
    }
}

/* A training or evaluation line. */
static void read_step(run *r, json_t *obj, double step) {
    double v;
    bool eval = json_object_get(obj, "val_loss") != NULL;
    for (int s = 0; s < S_COUNT; s++) {
        if ((s == S_VAL_LOSS) != eval) continue;
        if (number(obj, series_keys[s], &v)) push(&r->s[s], step, s == S_MFU ? 100 * v : v);
    }
    read_members(&r->experts, json_object_get(obj, "moe_tokens_per_expert"), step, 1.0);
    read_members(&r->ranks, json_object_get(obj, "rank_compute_s"), step, 1e3);
    if (!eval) push(&r->trained, step, 0);
}

static ct_status read_run(run *r, const char *arg) {
    struct stat st;
    if (stat(arg, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(r->path, sizeof r->path, "%s/metrics.jsonl", arg);
    else
        snprintf(r->path, sizeof r->path, "%s", arg);
    FILE *f = fopen(r->path, "r");
    if (!f) {
        ct_error(CT_ERR_INPUT, "cannot read metrics '%s'", r->path);
        ct_hint("pass a run directory (log.run_dir: it holds metrics.jsonl) or a log.metrics file");
        return CT_ERR_INPUT;
    }
    r->real = realpath(r->path, NULL);
    if (!r->real) r->real = ct_xstrdup(r->path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int n = 0;
    ct_status status = CT_OK;
    while (status == CT_OK && (got = getline(&line, &cap, f)) > 0) {
        n++;
        if (got == 1 && line[0] == '\n') continue;
        json_error_t err;
        json_t *obj = json_loads(line, 0, &err);
        if (!obj || !json_is_object(obj)) {
            ct_error(CT_ERR_INPUT, "%s:%d: not a metrics line (%s)", r->path, n,
                     obj ? "not an object" : err.text);
            ct_hint("metrics files are JSON lines written by cooktrain train (log.metrics)");
            status = CT_ERR_INPUT;
            json_decref(obj);
            break;
        }
        double step;
        if (json_is_true(json_object_get(obj, "setup")))
            read_setup(r, obj);
        else if (number(obj, "step", &step))
            read_step(r, obj, step);
        json_decref(obj);
    }
    free(line);
    fclose(f);
    if (status == CT_OK && r->trained.n == 0) {
        ct_error(CT_ERR_INPUT, "'%s' holds no training steps", r->path);
        ct_hint("a run writes one metrics line per logged step; check log.metrics or "
                "log.run_dir of the run");
        status = CT_ERR_INPUT;
    }
    return status;
}

/* The last k folders of the directory holding the file at `real` (an absolute path). */
static int folder_label(char *buf, size_t n, const char *real, int k) {
    const char *end = strrchr(real, '/');
    int comps = 0;
    for (const char *p = real; end && p < end; p++) comps += *p == '/';
    if (!end || end == real) {
        snprintf(buf, n, "%s", end ? "/" : real);
        return 1;
    }
    const char *p = end;
    for (int i = 0; i < k && p > real; i++) do
            p--;
        while (p > real && *p != '/');
    if (*p == '/') p++;
    snprintf(buf, n, "%.*s", (int)(end - p), p);
    return comps;
}

/* Whether another run has r's label and a metrics file in another folder (CLASH_FOLDER), in r's
 * folder but another file (CLASH_FILE), or the same file (CLASH_SAME). */
typedef enum clash_kind { CLASH_FOLDER, CLASH_FILE, CLASH_SAME } clash_kind;

static bool clash(const run *runs, int n_runs, int r, clash_kind kind) {
    const char *a = runs[r].real, *slash = strrchr(a, '/');
    size_t dir = slash ? (size_t)(slash - a) : 0;
    for (int o = 0; o < n_runs; o++) {
        const char *b = runs[o].real;
        if (o == r || strcmp(runs[o].name, runs[r].name) != 0) continue;
        bool same_dir = strncmp(a, b, dir) == 0 && strrchr(b, '/') == b + dir;
        bool same_file = strcmp(a, b) == 0;
        if (kind == CLASH_FOLDER ? !same_dir
            : kind == CLASH_FILE ? same_dir && !same_file
                                 : same_file)
            return true;
    }
    return false;
}

/* Labels: each run by its folder, with as many parent folders as it takes to tell runs in
 * different folders apart; two files of one folder add their file's name, a file given twice
 * " (2)". */
static void name_runs(run *runs, int n_runs) {
    int *k = ct_xcalloc((size_t)n_runs, sizeof *k), *comps = ct_xcalloc((size_t)n_runs, sizeof *k);
    bool *more = ct_xcalloc((size_t)n_runs, sizeof *more);
    for (int r = 0; r < n_runs; r++) k[r] = 1;
    for (bool any = true; any;) {
        for (int r = 0; r < n_runs; r++)
            comps[r] = folder_label(runs[r].name, sizeof runs[r].name, runs[r].real, k[r]);
        any = false;
        for (int r = 0; r < n_runs; r++)
            more[r] = k[r] < comps[r] && clash(runs, n_runs, r, CLASH_FOLDER);
        for (int r = 0; r < n_runs; r++) any |= more[r], k[r] += more[r];
    }
    for (int r = 0; r < n_runs; r++) more[r] = clash(runs, n_runs, r, CLASH_FILE);
    for (int r = 0; r < n_runs; r++) {
        size_t len = strlen(runs[r].name);
        if (more[r])
            snprintf(runs[r].name + len, sizeof runs[r].name - len, "%s",
                     strrchr(runs[r].real, '/'));
    }
    for (int r = n_runs - 1; r >= 0; r--) { /* from the last: the earlier labels stay to compare */
        int same = 0;
        for (int o = 0; o < r; o++) same += strcmp(runs[o].name, runs[r].name) == 0;
        size_t len = strlen(runs[r].name);
        if (same) snprintf(runs[r].name + len, sizeof runs[r].name - len, " (%d)", same + 1);
    }
    free(k);
    free(comps);
    free(more);
}

/* "3 segments: resumed at 4, 7" */
static void describe_segments(const run *r, char *buf, size_t n) {
    int n_segs = CT_MAX(r->n_segs, 1); /* a file without a setup line is one segment */
    size_t at = (size_t)snprintf(buf, n, "%d segment%s", n_segs, n_segs == 1 ? "" : "s");
    seg_kind said = SEG_FRESH;
    for (int i = 0; i < r->n_segs && at < n; i++) {
        const segment *s = &r->segs[i];
        if (s->kind == SEG_FRESH) continue;
        const char *sep = said == SEG_FRESH ? ": " : ", ";
        const char *verb = s->kind == said          ? ""
                           : s->kind == SEG_RESUMED ? "resumed at "
                                                    : "started over at ";
        at += (size_t)snprintf(buf + at, n - at, "%s%s%lld", sep, verb, s->start);
        said = s->kind;
        /* a restart after a crash: from where, and what it cost */
        if (at < n && s->local >= 0)
            at += (size_t)snprintf(buf + at, n - at,
                                   " (a local checkpoint, %lld rank file%s from partners' "
                                   "copies; %lld step%s lost)",
                                   s->from_partners, s->from_partners == 1 ? "" : "s", s->rerun,
                                   s->rerun == 1 ? "" : "s");
        else if (at < n && s->kind == SEG_RESUMED && s->rerun > 0)
            at += (size_t)snprintf(buf + at, n - at, " (%lld step%s lost)", s->rerun,
                                   s->rerun == 1 ? "" : "s");
    }
}

/* ---- drawing --------------------------------------------------------------------------------- */

static void html_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

/* The width of a text in pixels, to lay labels out: 0.62 em a character (sans-serif averages
 * about 0.55 em; the margin keeps a run of wide letters inside). */
static double text_px(const char *s, double size) {
    int chars = 0;
    for (; *s; s++) chars += ((unsigned char)*s & 0xC0) != 0x80;
    return chars * 0.62 * size;
}

/* s, cut with "…" to fit max_px at font size `size`, into buf. */
static const char *fit_text(char *buf, size_t n, const char *s, double max_px, double size) {
    if (text_px(s, size) <= max_px) {
        snprintf(buf, n, "%s", s);
        return buf;
    }
    int keep = CT_MAX(0, (int)(max_px / (0.62 * size)) - 1), chars = 0;
    const char *p = s;
    for (; *p && chars <= keep; p++) chars += ((unsigned char)*p & 0xC0) != 0x80;
    if (chars > keep) p--; /* p is the first byte of the first character left out */
    snprintf(buf, n, "%.*s…", (int)(p - s), s);
    return buf;
}

/* A "nice" step for about `want` intervals over span: 1, 2 or 5 times a power of ten. */
static double nice_step(double span, int want) {
    double raw = span / want, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* One printf format for every tick label of an axis whose ticks are multiples of `step` and at
 * most `most` in magnitude: fixed point with the decimals the step needs, or for large or tiny
 * values scientific with the mantissa digits the largest tick needs. */
typedef struct axis_format {
    bool sci;
    int decimals;
} axis_format;

static axis_format axis_format_of(double step, double most) {
    int p = (int)floor(log10(step) + 1e-9);
    if (most >= 1e6 || p < -4)
        return (axis_format){true, CT_MAX(0, (int)floor(log10(most) + 1e-9) - p)};
    return (axis_format){false, CT_MAX(0, -p)};
}

static void fmt_tick(char *buf, size_t n, axis_format a, double v) {
    snprintf(buf, n, a.sci ? "%.*e" : "%.*f", a.decimals, v);
}

/* Bytes in MiB, or in GiB from 1 GiB up (core/common.h's ct_format_bytes): the unit of a chart
 * whose largest value is `most` bytes. */
static const char *bytes_unit(double most, double *scale) {
    bool gib = most >= 1024.0 * 1024 * 1024;
    *scale = gib ? 1024.0 * 1024 * 1024 : 1024.0 * 1024;
    return gib ? "GiB" : "MiB";
}

#define W 560
#define H 260
#define L 64 /* plot area: left, right, top, bottom margins */
#define R 16
#define T 28
#define B 36
#define LEGEND_ROW 16

typedef struct chart {
    const char *name, *title, *unit;
    int keys[3]; /* series drawn, -1 ends */
    bool dashed[3];
    bool bytes; /* values are bytes: drawn in MiB or GiB */
} chart;

/* One polyline: a series of run `run`, named `key` in data-series. */
typedef struct line {
    const series *s;
    int run;
    char key[48];
    const char *color;
    bool dashed;
} line;

/* A resume of run `run` at `step`, drawn across the plot. */
typedef struct mark {
    double step;
    int run;
    seg_kind kind;
    bool local; /* from a local checkpoint */
} mark;

/* A legend entry: a box (areas) or a short line (curves) in its colour, then its label; no
 * colour, the label alone. */
typedef struct legend_item {
    char label[48];
    const char *color;
    bool box, dashed;
} legend_item;

/* Lays the entries out in rows within [x, x + width] from y down; draws them when f is not NULL.
 * Returns the height they take. */
static double draw_legend(FILE *f, double x, double y, double width, const legend_item *it, int n) {
    double cx = x, base = y + 11;
    for (int i = 0; i < n; i++) {
        double swatch = !it[i].color ? 0 : it[i].box ? 14 : 22;
        double w = swatch + text_px(it[i].label, 11);
        if (cx > x && cx + w > x + width) cx = x, base += LEGEND_ROW;
        if (f && it[i].color && it[i].box)
            fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"10\" height=\"10\" fill=\"%s\"/>", cx,
                    base - 9, it[i].color);
        else if (f && it[i].color)
            fprintf(f,
                    "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
                    "stroke-width=\"2\"%s/>",
                    cx, base - 4, cx + 18, base - 4, it[i].color,
                    it[i].dashed ? " stroke-dasharray=\"5 3\"" : "");
        if (f) {
            fprintf(f, "<text class=\"legend\" x=\"%.0f\" y=\"%.0f\" font-size=\"11\">",
                    cx + swatch, base);
            html_escape(f, it[i].label);
            fputs("</text>\n", f);
        }
        cx += w + 12;
    }
    return n ? base - y + LEGEND_ROW - 11 : 0;
}

/* A chart of lines over the step, on axes that hold every point and every resume. */
typedef struct plot {
    const char *name, *title, *unit; /* unit: "" for none */
    double scale;                    /* values are drawn divided by it */
    const line *lines;
    int n_lines;
    const mark *marks;
    int n_marks;
    const legend_item *legend;
    int n_legend;
} plot;

static void draw_lines(FILE *f, const plot *p) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    int points = 0;
    for (int l = 0; l < p->n_lines; l++)
        for (int i = 0; i < p->lines[l].s->n; i++) {
            double y = p->lines[l].s->y[i] / p->scale;
            x0 = fmin(x0, p->lines[l].s->x[i]), x1 = fmax(x1, p->lines[l].s->x[i]);
            y0 = fmin(y0, y), y1 = fmax(y1, y);
            points++;
        }
    if (!points) return;
    for (int m = 0; m < p->n_marks; m++)
        x0 = fmin(x0, p->marks[m].step), x1 = fmax(x1, p->marks[m].step);
    if (x1 <= x0) x0 -= 1, x1 += 1;
    if (y1 <= y0) { /* a constant: around it, or from 0 up when it is 0 */
        double pad = y0 != 0 ? fabs(y0) * 0.1 : 0;
        y0 -= pad, y1 += pad ? pad : 1;
    }
    /* whole steps on x: a tick every step at the least */
    double ys = nice_step(y1 - y0, 4), xs = fmax(1, nice_step(x1 - x0, 5));
    y0 = floor(y0 / ys) * ys, y1 = ceil(y1 / ys) * ys;
    const double pw = W - L - R, ph = H - T - B;
    const double legend_h = draw_legend(NULL, L, 0, pw, p->legend, p->n_legend);
    const int h = H + (legend_h > 0 ? (int)ceil(legend_h) + 4 : 0);
    fprintf(f,
            "<svg class=\"chart\" data-chart=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" "
            "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" data-x0=\"%.9g\" data-x1=\"%.9g\" "
            "data-y0=\"%.9g\" data-y1=\"%.9g\">\n"
            "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n"
            "<text class=\"title\" x=\"%d\" y=\"18\" font-size=\"14\" font-weight=\"bold\">",
            p->name, W, h, W, h, x0, x1, y0, y1, W, h, L);
    html_escape(f, p->title);
    fprintf(f, "%s%s%s</text>\n", p->unit[0] ? " (" : "", p->unit, p->unit[0] ? ")" : "");
    if (p->unit[0])
        fprintf(f,
                "<text class=\"yunit\" x=\"12\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\" "
                "transform=\"rotate(-90 12 %.0f)\">%s</text>\n",
                T + ph / 2, T + ph / 2, p->unit);
    char label[48];
    axis_format yf = axis_format_of(ys, fmax(fabs(y0), fabs(y1)));
    for (int i = 0;; i++) {
        double v = y0 + i * ys;
        if (v > y1 + ys * 1e-6) break;
        double y = T + ph * (1 - (v - y0) / (y1 - y0));
        fmt_tick(label, sizeof label, yf, fabs(v) < ys * 1e-9 ? 0 : v);
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#dddddd\"/>"
                "<text class=\"ytick\" x=\"%d\" y=\"%.1f\" font-size=\"11\" "
                "text-anchor=\"end\">%s</text>\n",
                L, y, W - R, y, L - 4, y + 4, label);
    }
    for (double v = ceil(x0 / xs) * xs; v <= x1 + xs * 1e-6; v += xs) {
        double x = L + pw * (v - x0) / (x1 - x0);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#999999\"/>"
                "<text class=\"xtick\" x=\"%.1f\" y=\"%d\" font-size=\"11\" "
                "text-anchor=\"middle\">%.0f</text>\n",
                x, H - B, x, H - B + 4, x, H - B + 16, v);
    }
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
            "stroke=\"#333333\"/>\n<text x=\"%.0f\" y=\"%d\" font-size=\"11\" "
            "text-anchor=\"middle\">step</text>\n",
            L, T, pw, ph, L + pw / 2, H - 4);
    for (int l = 0; l < p->n_lines; l++) {
        const series *s = p->lines[l].s;
        if (!s->n) continue;
        fprintf(f,
                "<polyline data-run=\"%d\" data-series=\"%s\" fill=\"none\" stroke=\"%s\" "
                "stroke-width=\"1.5\"%s points=\"",
                p->lines[l].run, p->lines[l].key, p->lines[l].color,
                p->lines[l].dashed ? " stroke-dasharray=\"5 3\"" : "");
        for (int i = 0; i < s->n; i++)
            fprintf(f, "%s%.2f,%.2f", i ? " " : "", L + pw * (s->x[i] - x0) / (x1 - x0),
                    T + ph * (1 - (s->y[i] / p->scale - y0) / (y1 - y0)));
        fprintf(f, "\"/>\n");
        if (s->n == 1) /* one point draws no line: a dot */
            fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"/>\n",
                    L + pw * (s->x[0] - x0) / (x1 - x0),
                    T + ph * (1 - (s->y[0] / p->scale - y0) / (y1 - y0)), p->lines[l].color);
    }
    /* resumes: a dotted line across the plot, its label at the top, one row per resume so that
     * close ones do not overlap; a white halo keeps a label readable over the curves */
    for (int m = 0; m < p->n_marks; m++) {
        const mark *k = &p->marks[m];
        double x = L + pw * (k->step - x0) / (x1 - x0);
        const char *color = palette[k->run % N_COLORS];
        snprintf(label, sizeof label, "%s at step %.0f%s",
                 k->kind == SEG_RESUMED ? "resumed" : "started over", k->step,
                 k->local ? " (local checkpoint)" : "");
        bool left = x + 4 + text_px(label, 10) > W - R;
        fprintf(
            f,
            "<line class=\"resume\" data-run=\"%d\" data-step=\"%.0f\" x1=\"%.2f\" y1=\"%d\" "
            "x2=\"%.2f\" y2=\"%.0f\" stroke=\"%s\" stroke-dasharray=\"2 3\"/>"
            "<text class=\"resume\" x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"%s\" "
            "fill=\"%s\" stroke=\"#ffffff\" stroke-width=\"3\" paint-order=\"stroke\">%s</text>\n",
            k->run, k->step, x, T, x, T + ph, color, left ? x - 4 : x + 4, T + 11 + 12 * (m % 8),
            left ? "end" : "start", color, label);
    }
    draw_legend(f, L, H + 2, pw, p->legend, p->n_legend);
    fprintf(f, "</svg>\n");
}

/* The resumes of the runs that have a point in `lines`, each once. */
static int collect_marks(const run *runs, const line *lines, int n_lines, mark **out) {
    int n = 0, cap = 0;
    *out = NULL;
    for (int l = 0; l < n_lines; l++) {
        const run *u = &runs[lines[l].run];
        if (!lines[l].s->n) continue;
        for (int i = 0; i < u->n_segs; i++) {
            if (u->segs[i].kind == SEG_FRESH) continue;
            bool seen = false;
            for (int m = 0; m < n; m++)
                seen |= (*out)[m].run == lines[l].run && (*out)[m].step == (double)u->segs[i].start;
            if (seen) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 8;
                *out = realloc(*out, (size_t)cap * sizeof **out);
                CT_ASSERT(*out != NULL);
            }
            (*out)[n++] = (mark){(double)u->segs[i].start, lines[l].run, u->segs[i].kind,
                                 u->segs[i].local >= 0};
        }
    }
    return n;
}

/* A metric's chart: its series of every run, in the run's colour. */
static void draw_chart(FILE *f, const chart *c, run *runs, int n_runs) {
    line *lines = ct_xcalloc((size_t)(3 * n_runs), sizeof *lines);
    int n = 0;
    double most = 0;
    for (int r = 0; r < n_runs; r++)
        for (int k = 0; k < 3 && c->keys[k] >= 0; k++) {
            line *l = &lines[n++];
            l->s = &runs[r].s[c->keys[k]];
            l->run = r;
            snprintf(l->key, sizeof l->key, "%s", series_keys[c->keys[k]]);
            l->color = palette[r % N_COLORS];
            l->dashed = c->dashed[k];
            for (int i = 0; i < l->s->n; i++) most = fmax(most, fabs(l->s->y[i]));
        }
    plot p = {.name = c->name,
              .title = c->title,
              .unit = c->unit,
              .scale = 1,
              .lines = lines,
              .n_lines = n};
    if (c->bytes) p.unit = bytes_unit(most, &p.scale);
    mark *marks;
    p.n_marks = collect_marks(runs, lines, n, &marks);
    p.marks = marks;
    draw_lines(f, &p);
    free(marks);
    free(lines);
}

/* A per-member chart for each run that has members: every member's curve, one colour each, a
 * legend ("expert 3", "rank 3"): MoE's tokens per expert, each rank's compute per step. */
static void draw_members(FILE *f, run *runs, int n_runs, bool ranks) {
    static const char *colors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                   "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
    enum { N_MEMBER_COLORS = sizeof colors / sizeof colors[0] };
    const char *what = ranks ? "rank" : "expert";
    /* a rank's compute: its step time outside communication, in ms */
    const char *title0 = ranks ? "compute per rank, " : "tokens per expert, ";
    const char *unit = ranks ? "ms" : "";
    line *lines = ct_xcalloc(MAX_EXPERTS, sizeof *lines);
    legend_item *legend = ct_xcalloc(MAX_EXPERT_LEGEND + 1, sizeof *legend);
    for (int r = 0; r < n_runs; r++) {
        const members *g = ranks ? &runs[r].ranks : &runs[r].experts;
        if (!g->n) continue;
        int n_legend = 0;
        for (int e = 0; e < g->n; e++) {
            lines[e].s = &g->s[e];
            lines[e].run = r;
            snprintf(lines[e].key, sizeof lines[e].key, "%s.%d",
                     ranks ? "rank_compute_s" : "moe_tokens_per_expert", e);
            lines[e].color = colors[e % N_MEMBER_COLORS];
            lines[e].dashed = e >= N_MEMBER_COLORS;
            if (e < MAX_EXPERT_LEGEND) {
                legend_item *it = &legend[n_legend++];
                snprintf(it->label, sizeof it->label, "%s %d", what, e);
                it->color = lines[e].color;
                it->dashed = lines[e].dashed;
            }
        }
        if (g->n > MAX_EXPERT_LEGEND)
            snprintf(legend[n_legend++].label, sizeof legend[0].label, "+%d more",
                     g->n - MAX_EXPERT_LEGEND);
        char name[64], title[400], who[256], tail[64];
        snprintf(name, sizeof name, "%s.%d", ranks ? "rank_compute" : "moe_experts", r);
        snprintf(tail, sizeof tail, " (%d %ss)", g->n, what);
        const double room = W - L - R - text_px(title0, 14) - text_px(tail, 14) -
                            (unit[0] ? text_px(" (ms)", 14) : 0);
        fit_text(who, sizeof who, runs[r].name, room, 14);
        snprintf(title, sizeof title, "%s%s%s", title0, who, tail);
        mark *marks;
        plot p = {.name = name,
                  .title = title,
                  .unit = unit,
                  .scale = 1,
                  .lines = lines,
                  .n_lines = g->n,
                  .legend = legend,
                  .n_legend = n_legend};
        p.n_marks = collect_marks(runs, lines, g->n, &marks);
        p.marks = marks;
        draw_lines(f, &p);
        free(marks);
    }
    free(legend);
    free(lines);
}

/* Memory by category at start-up (the last segment's): one stacked bar per run, its total at its
 * end, the categories some run has in the legend below. */
static void draw_memory(FILE *f, run *runs, int n_runs) {
    static const char *colors[N_MEM] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                        "#59a14f", "#edc948", "#b07aa1", "#9c755f"};
    double most = 0, names_w = 0;
    legend_item legend[N_MEM];
    int n_legend = 0;
    for (int i = 0; i < N_MEM; i++) {
        bool used = false;
        for (int r = 0; r < n_runs; r++) used |= runs[r].mem[i] > 0;
        if (!used) continue;
        legend[n_legend] = (legend_item){.color = colors[i], .box = true};
        snprintf(legend[n_legend++].label, sizeof legend[0].label, "%s", mem_names[i]);
    }
    for (int r = 0; r < n_runs; r++) {
        double sum = 0;
        for (int i = 0; i < N_MEM; i++) sum += runs[r].mem[i];
        most = fmax(most, sum);
        names_w = fmax(names_w, text_px(runs[r].name, 11));
    }
    if (most <= 0) return;
    double scale;
    const char *unit = bytes_unit(most, &scale);
    const int bar = 22;
    /* run names | bars | totals: the bars get what the longest name and total leave */
    const double x0 = 8 + fmin(names_w, 160) + 8, totals_w = text_px("1023.99 GiB", 11) + 8;
    const double pw = W - R - totals_w - x0, bars_h = n_runs * (bar + 10);
    const double legend_h = draw_legend(NULL, 8, 0, W - 16, legend, n_legend);
    const int h = (int)ceil(T + bars_h + 4 + legend_h + 4);
    fprintf(f,
            "<svg class=\"chart\" data-chart=\"memory\" xmlns=\"http://www.w3.org/2000/svg\" "
            "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n"
            "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n"
            "<text class=\"title\" x=\"8\" y=\"18\" font-size=\"14\" font-weight=\"bold\">memory "
            "by category at start-up, rank 0 (%s)</text>\n",
            W, h, W, h, W, h, unit);
    char label[64], who[256];
    for (int r = 0; r < n_runs; r++) {
        double x = x0, y = T + r * (bar + 10), sum = 0;
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"end\" fill=\"%s\">",
                x0 - 8, y + 15, palette[r % N_COLORS]);
        html_escape(f, fit_text(who, sizeof who, runs[r].name, 160, 11));
        fputs("</text>\n", f);
        for (int i = 0; i < N_MEM; i++) {
            double w = pw * runs[r].mem[i] / most;
            sum += runs[r].mem[i];
            if (w <= 0) continue;
            fprintf(f,
                    "<rect data-run=\"%d\" data-category=\"%s\" data-bytes=\"%.0f\" x=\"%.2f\" "
                    "y=\"%.0f\" width=\"%.2f\" height=\"%d\" fill=\"%s\"><title>%s %.*f "
                    "%s</title></rect>\n",
                    r, mem_names[i], runs[r].mem[i], x, y, w, bar, colors[i], mem_names[i],
                    scale > 1024.0 * 1024 ? 2 : 1, runs[r].mem[i] / scale, unit);
            x += w;
        }
        snprintf(label, sizeof label, "%.*f %s", scale > 1024.0 * 1024 ? 2 : 1, sum / scale, unit);
        fprintf(f, "<text class=\"total\" x=\"%.1f\" y=\"%.0f\" font-size=\"11\">%s</text>\n",
                x + 4, y + 15, label);
    }
    draw_legend(f, 8, T + bars_h + 4, W - 16, legend, n_legend);
    fprintf(f, "</svg>\n");
}

static double median(const series *s) {
    if (!s->n) return NAN;
    double *v = ct_xmalloc((size_t)s->n * sizeof *v);
    memcpy(v, s->y, (size_t)s->n * sizeof *v);
    double m = ct_median(v, s->n);
    free(v);
    return m;
}

static double lowest(const series *s) {
    double m = NAN;
    for (int i = 0; i < s->n; i++) m = isnan(m) || s->y[i] < m ? s->y[i] : m;
    return m;
}

/* A table cell of a number, or a dash where there is none (no evaluation, no setup line). */
static void cell(FILE *f, const char *fmt, double v) {
    fputs("<td>", f);
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("—", f);
    fputs("</td>", f);
}

static void write_page(FILE *f, run *runs, int n_runs) {
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
               "<title>cooktrain report</title>\n<style>\n"
               "body { font-family: sans-serif; margin: 16px; color: #222222; }\n"
               "svg.chart { margin: 6px; border: 1px solid #cccccc; vertical-align: top; }\n"
               "table { border-collapse: collapse; margin-bottom: 12px; }\n"
               "td, th { border: 1px solid #cccccc; padding: 3px 8px; text-align: right; }\n"
               "</style>\n</head>\n<body>\n<h1>cooktrain report</h1>\n"
               "<table>\n<tr><th>run</th><th>metrics</th><th>segments</th><th>world</th>"
               "<th>dp</th><th>ZeRO</th><th>precision</th><th>steps</th><th>last loss</th>"
               "<th>best val loss</th><th>median tok/s</th><th>median MFU %%</th></tr>\n");
    for (int r = 0; r < n_runs; r++) {
        const run *u = &runs[r];
        const series *loss = &u->s[S_LOSS];
        char segs[512];
        describe_segments(u, segs, sizeof segs);
        fprintf(f, "<tr><td style=\"color: %s; text-align: left\">", palette[r % N_COLORS]);
        html_escape(f, u->name);
        fputs("</td><td style=\"text-align: left\">", f);
        html_escape(f, u->path);
        fprintf(f, "</td><td style=\"text-align: left\">%s</td>", segs);
        cell(f, "%.0f", u->have_setup ? (double)u->world : NAN);
        cell(f, "%.0f", u->have_setup ? (double)u->dp : NAN);
        cell(f, "%.0f", u->have_setup ? (double)u->zero : NAN);
        fputs(u->precision[0] ? "<td>" : "<td>—", f);
        html_escape(f, u->precision);
        fputs("</td>", f);
        cell(f, "%.0f", (double)u->trained.n);
        cell(f, "%.4f", loss->n ? loss->y[loss->n - 1] : NAN);
        cell(f, "%.4f", lowest(&u->s[S_VAL_LOSS]));
        cell(f, "%.0f", median(&u->s[S_TOKS]));
        cell(f, "%.2f", median(&u->s[S_MFU]));
        fputs("</tr>\n", f);
    }
    fputs("</table>\n<div>\n", f);
    const chart charts[] = {
        {"loss",
         "loss (solid: train, dashed: validation)",
         "",
         {S_LOSS, S_VAL_LOSS, -1},
         {false, true},
         false},
        {"lr", "learning rate", "", {S_LR, -1}, {false}, false},
        {"grad_norm", "gradient norm", "", {S_GNORM, -1}, {false}, false},
        {"tokens_per_s", "throughput", "tokens/s", {S_TOKS, -1}, {false}, false},
        {"mfu", "model FLOPs utilisation", "%", {S_MFU, -1}, {false}, false},
        {"comm",
         "exposed comm (solid), bubble (dashed)",
         "s per step",
         {S_COMM, S_BUBBLE, -1},
         {false, true},
         false},
        {"mem_bytes", "backend memory, rank 0", "", {S_MEM, -1}, {false}, true},
        {"moe_load",
         "tokens per expert: min, mean (dashed), max",
         "",
         {S_LOAD_MIN, S_LOAD_MEAN, S_LOAD_MAX},
         {false, true, false},
         false},
    };
    for (size_t c = 0; c < sizeof charts / sizeof charts[0]; c++)
        draw_chart(f, &charts[c], runs, n_runs);
    draw_members(f, runs, n_runs, false);
    draw_members(f, runs, n_runs, true);
    draw_memory(f, runs, n_runs);
    fputs("</div>\n</body>\n</html>\n", f);
}

ct_status ct_html_report(int n_runs, char **run_args, const char *out_path) {
    run *runs = ct_xcalloc((size_t)n_runs, sizeof *runs);
    ct_status st = CT_OK;
    for (int r = 0; r < n_runs && st == CT_OK; r++) st = read_run(&runs[r], run_args[r]);
    if (st == CT_OK) name_runs(runs, n_runs);
    char path[CT_PATH_MAX + 32];
    if (st == CT_OK) {
        struct stat sb;
        if (out_path)
            snprintf(path, sizeof path, "%s", out_path);
        else if (stat(run_args[0], &sb) == 0 && S_ISDIR(sb.st_mode))
            snprintf(path, sizeof path, "%s/report.html", run_args[0]);
        else
            snprintf(path, sizeof path, "report.html");
    }
    FILE *f = st == CT_OK ? fopen(path, "w") : NULL;
    if (st == CT_OK && !f) {
        ct_error(CT_ERR_INPUT, "cannot write the report '%s'", path);
        ct_hint("choose a writable path with -o FILE");
        st = CT_ERR_INPUT;
    }
    if (st == CT_OK) {
        write_page(f, runs, n_runs);
        bool ok = fflush(f) == 0 && !ferror(f);
        if (fclose(f) != 0 || !ok) {
            ct_error(CT_ERR_RUNTIME, "cannot write the report '%s'", path);
            ct_hint("check free space");
            st = CT_ERR_RUNTIME;
        } else {
            printf("report: %s (%d run%s)\n", path, n_runs, n_runs == 1 ? "" : "s");
        }
    }
    for (int r = 0; r < n_runs; r++) {
        for (int s = 0; s < S_COUNT; s++) series_release(&runs[r].s[s]);
        for (int e = 0; e < runs[r].experts.n; e++) series_release(&runs[r].experts.s[e]);
        for (int q = 0; q < runs[r].ranks.n; q++) series_release(&runs[r].ranks.s[q]);
        series_release(&runs[r].trained);
        free(runs[r].experts.s);
        free(runs[r].ranks.s);
        free(runs[r].segs);
        free(runs[r].real);
    }
    free(runs);
    return st;
}
