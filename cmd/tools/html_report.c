/*
 * html_report.c — `cooktrain report RUN_DIR...` (html_report.h): one self-contained HTML page of
 * one or more runs' metrics (log.run_dir/metrics.jsonl, or a metrics file), its charts inline SVG
 * drawn here: no script, no style sheet or font from elsewhere, nothing fetched.
 *
 * Every chart is a <svg class="chart" data-chart="NAME">; each series a <polyline> with
 * data-run (the run's index) and data-series (the metrics key), its points in data order, y
 * growing downward as SVG's does. The tests read them back (test/tools/check_report.py).
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

/* the setup line's memory categories */
static const char *mem_keys[] = {"mem_params", "mem_grads", "mem_optim",    "mem_master",
                                 "mem_acts",   "mem_comm",  "mem_gathered", "mem_workspace"};
enum { N_MEM = sizeof mem_keys / sizeof mem_keys[0] };

enum { MAX_EXPERTS = 256 }; /* per-expert curves drawn (the min/mean/max chart covers all) */

typedef struct run {
    char name[256];
    char path[CT_PATH_MAX];
    series s[S_COUNT];
    series *experts; /* moe_tokens_per_expert: one series per expert */
    int n_experts;
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

static bool number(json_t *obj, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || !json_is_number(v)) return false;
    *out = json_number_value(v);
    return isfinite(*out);
}

/* ---- reading --------------------------------------------------------------------------------- */

static ct_status read_run(run *r, const char *arg) {
    struct stat st;
    if (stat(arg, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(r->path, sizeof r->path, "%s/metrics.jsonl", arg);
    else
        snprintf(r->path, sizeof r->path, "%s", arg);
    /* the name: the directory's (or file's) last component */
    char tmp[CT_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", arg);
    size_t len = strlen(tmp);
    while (len > 1 && tmp[len - 1] == '/') tmp[--len] = '\0';
    const char *slash = strrchr(tmp, '/');
    snprintf(r->name, sizeof r->name, "%s", slash ? slash + 1 : tmp);
    FILE *f = fopen(r->path, "r");
    if (!f) {
        ct_error(CT_ERR_INPUT, "cannot read metrics '%s'", r->path);
        ct_hint("pass a run directory (log.run_dir: it holds metrics.jsonl) or a log.metrics file");
        return CT_ERR_INPUT;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int n = 0, steps = 0;
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
        double v, step;
        if (json_is_true(json_object_get(obj, "setup"))) {
            r->have_setup = true;
            for (int i = 0; i < N_MEM; i++)
                if (number(obj, mem_keys[i], &v)) r->mem[i] = v;
            if (number(obj, "world", &v)) r->world = (long long)v;
            if (number(obj, "dp", &v)) r->dp = (long long)v;
            if (number(obj, "zero_stage", &v)) r->zero = (long long)v;
            if (number(obj, "steps", &v)) r->steps = (long long)v;
            json_t *p = json_object_get(obj, "precision");
            if (json_is_string(p))
                snprintf(r->precision, sizeof r->precision, "%s", json_string_value(p));
        } else if (number(obj, "step", &step)) {
            bool eval = json_object_get(obj, "val_loss") != NULL;
            for (int s = 0; s < S_COUNT; s++) {
                if ((s == S_VAL_LOSS) != eval) continue;
                if (number(obj, series_keys[s], &v)) push(&r->s[s], step, s == S_MFU ? 100 * v : v);
            }
            json_t *per = json_object_get(obj, "moe_tokens_per_expert");
            if (json_is_array(per)) {
                int n = (int)CT_MIN(json_array_size(per), (size_t)MAX_EXPERTS);
                if (n > r->n_experts) {
                    r->experts = realloc(r->experts, (size_t)n * sizeof *r->experts);
                    CT_ASSERT(r->experts != NULL);
                    memset(r->experts + r->n_experts, 0,
                           (size_t)(n - r->n_experts) * sizeof *r->experts);
                    r->n_experts = n;
                }
                for (int e = 0; e < n; e++) {
                    json_t *x = json_array_get(per, (size_t)e);
                    if (json_is_number(x) && isfinite(json_number_value(x)))
                        push(&r->experts[e], step, json_number_value(x));
                }
            }
            steps += !eval;
        }
        json_decref(obj);
    }
    free(line);
    fclose(f);
    if (status == CT_OK && steps == 0) {
        ct_error(CT_ERR_INPUT, "'%s' holds no training steps", r->path);
        ct_hint("a run writes one metrics line per logged step; check log.metrics or "
                "log.run_dir of the run");
        status = CT_ERR_INPUT;
    }
    return status;
}

static void html_escape(FILE *f, const char *s);

/* ---- drawing --------------------------------------------------------------------------------- */

/* A "nice" step for about `want` intervals over span: 1, 2 or 5 times a power of ten. */
static double nice_step(double span, int want) {
    double raw = span / want, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void fmt_num(char *buf, size_t n, double v) {
    double a = fabs(v);
    if (v == 0)
        snprintf(buf, n, "0");
    else if (a >= 1e6 || a < 1e-3)
        snprintf(buf, n, "%.1e", v);
    else
        snprintf(buf, n, "%.4g", v);
}

#define W 560
#define H 260
#define L 64 /* plot area: left, right, top, bottom margins */
#define R 16
#define T 28
#define B 36

typedef struct chart {
    const char *name, *title, *unit;
    int keys[3]; /* series drawn, -1 ends */
    bool dashed[3];
} chart;

/* One polyline: a series of run `run`, named `key` in data-series. */
typedef struct line {
    const series *s;
    int run;
    char key[48];
    const char *color;
    bool dashed;
} line;

/* A chart of lines over the step, on axes that hold every point. */
static void draw_lines(FILE *f, const char *name, const char *title, const char *unit,
                       const line *lines, int n_lines) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    int points = 0;
    for (int l = 0; l < n_lines; l++)
        for (int i = 0; i < lines[l].s->n; i++) {
            x0 = fmin(x0, lines[l].s->x[i]), x1 = fmax(x1, lines[l].s->x[i]);
            y0 = fmin(y0, lines[l].s->y[i]), y1 = fmax(y1, lines[l].s->y[i]);
            points++;
        }
    if (!points) return;
    if (x1 <= x0) x0 -= 1, x1 += 1;
    if (y1 <= y0) { /* a constant: around it, or from 0 up when it is 0 */
        double pad = y0 != 0 ? fabs(y0) * 0.1 : 0;
        y0 -= pad, y1 += pad ? pad : 1;
    }
    double ys = nice_step(y1 - y0, 4), xs = nice_step(x1 - x0, 5);
    y0 = floor(y0 / ys) * ys, y1 = ceil(y1 / ys) * ys;
    const double pw = W - L - R, ph = H - T - B;
    fprintf(f,
            "<svg class=\"chart\" data-chart=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" "
            "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" data-x0=\"%.9g\" data-x1=\"%.9g\" "
            "data-y0=\"%.9g\" data-y1=\"%.9g\">\n"
            "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n"
            "<text x=\"%d\" y=\"18\" font-size=\"14\" font-weight=\"bold\">",
            name, W, H, W, H, x0, x1, y0, y1, W, H, L);
    html_escape(f, title);
    fprintf(f, "%s%s%s</text>\n", unit[0] ? " (" : "", unit, unit[0] ? ")" : "");
    char label[32];
    for (double v = y0; v <= y1 + ys * 1e-6; v += ys) {
        double y = T + ph * (1 - (v - y0) / (y1 - y0));
        fmt_num(label, sizeof label, fabs(v) < ys * 1e-9 ? 0 : v);
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#dddddd\"/>"
                "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
                L, y, W - R, y, L - 4, y + 4, label);
    }
    for (double v = ceil(x0 / xs) * xs; v <= x1 + xs * 1e-6; v += xs) {
        double x = L + pw * (v - x0) / (x1 - x0);
        fmt_num(label, sizeof label, v);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#999999\"/>"
                "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                x, H - B, x, H - B + 4, x, H - B + 16, label);
    }
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
            "stroke=\"#333333\"/>\n<text x=\"%.0f\" y=\"%d\" font-size=\"11\" "
            "text-anchor=\"middle\">step</text>\n",
            L, T, pw, ph, L + pw / 2, H - 4);
    for (int l = 0; l < n_lines; l++) {
        const series *s = lines[l].s;
        if (!s->n) continue;
        fprintf(f,
                "<polyline data-run=\"%d\" data-series=\"%s\" fill=\"none\" stroke=\"%s\" "
                "stroke-width=\"1.5\"%s points=\"",
                lines[l].run, lines[l].key, lines[l].color,
                lines[l].dashed ? " stroke-dasharray=\"5 3\"" : "");
        for (int i = 0; i < s->n; i++)
            fprintf(f, "%s%.2f,%.2f", i ? " " : "", L + pw * (s->x[i] - x0) / (x1 - x0),
                    T + ph * (1 - (s->y[i] - y0) / (y1 - y0)));
        fprintf(f, "\"/>\n");
        if (s->n == 1) /* one point draws no line: a dot */
            fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"/>\n",
                    L + pw * (s->x[0] - x0) / (x1 - x0), T + ph * (1 - (s->y[0] - y0) / (y1 - y0)),
                    lines[l].color);
    }
    fprintf(f, "</svg>\n");
}

/* A metric's chart: its series of every run, in the run's colour. */
static void draw_chart(FILE *f, const chart *c, run *runs, int n_runs) {
    line *lines = ct_xcalloc((size_t)(3 * n_runs), sizeof *lines);
    int n = 0;
    for (int r = 0; r < n_runs; r++)
        for (int k = 0; k < 3 && c->keys[k] >= 0; k++) {
            line *l = &lines[n++];
            l->s = &runs[r].s[c->keys[k]];
            l->run = r;
            snprintf(l->key, sizeof l->key, "%s", series_keys[c->keys[k]]);
            l->color = palette[r % N_COLORS];
            l->dashed = c->dashed[k];
        }
    draw_lines(f, c->name, c->title, c->unit, lines, n);
    free(lines);
}

/* MoE: every expert's tokens per step, one chart per run, one colour per expert. */
static void draw_experts(FILE *f, run *runs, int n_runs) {
    static const char *colors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                   "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
    line *lines = ct_xcalloc(MAX_EXPERTS, sizeof *lines);
    for (int r = 0; r < n_runs; r++) {
        if (!runs[r].n_experts) continue;
        for (int e = 0; e < runs[r].n_experts; e++) {
            lines[e].s = &runs[r].experts[e];
            lines[e].run = r;
            snprintf(lines[e].key, sizeof lines[e].key, "moe_tokens_per_expert.%d", e);
            lines[e].color = colors[e % (int)(sizeof colors / sizeof colors[0])];
            lines[e].dashed = e >= (int)(sizeof colors / sizeof colors[0]);
        }
        char name[64], title[320];
        snprintf(name, sizeof name, "moe_experts.%d", r);
        snprintf(title, sizeof title, "tokens per expert, %s (%d experts)", runs[r].name,
                 runs[r].n_experts);
        draw_lines(f, name, title, "", lines, runs[r].n_experts);
    }
    free(lines);
}

/* Memory by category at start-up: one stacked bar per run. */
static void draw_memory(FILE *f, run *runs, int n_runs) {
    static const char *names[N_MEM] = {"params", "grads", "optimizer", "master",
                                       "acts",   "comm",  "gathered",  "workspace"};
    static const char *colors[N_MEM] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                        "#59a14f", "#edc948", "#b07aa1", "#9c755f"};
    double most = 0;
    for (int r = 0; r < n_runs; r++) {
        double sum = 0;
        for (int i = 0; i < N_MEM; i++) sum += runs[r].mem[i];
        most = fmax(most, sum);
    }
    if (most <= 0) return;
    const int bar = 22, h = T + 40 + n_runs * (bar + 10);
    fprintf(f,
            "<svg class=\"chart\" data-chart=\"memory\" xmlns=\"http://www.w3.org/2000/svg\" "
            "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n"
            "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n"
            "<text x=\"8\" y=\"18\" font-size=\"14\" font-weight=\"bold\">memory per rank "
            "(rank 0, MiB), by category</text>\n",
            W, h, W, h, W, h);
    const double pw = W - 120 - R;
    for (int r = 0; r < n_runs; r++) {
        double x = 120, y = T + r * (bar + 10), sum = 0;
        fprintf(f,
                "<text x=\"112\" y=\"%.0f\" font-size=\"11\" text-anchor=\"end\" "
                "fill=\"%s\">%s</text>\n",
                y + 15, palette[r % N_COLORS], runs[r].name);
        for (int i = 0; i < N_MEM; i++) {
            double w = pw * runs[r].mem[i] / most;
            sum += runs[r].mem[i];
            if (w <= 0) continue;
            fprintf(f,
                    "<rect data-run=\"%d\" data-category=\"%s\" data-bytes=\"%.0f\" x=\"%.2f\" "
                    "y=\"%.0f\" width=\"%.2f\" height=\"%d\" fill=\"%s\"><title>%s %.1f "
                    "MiB</title></rect>\n",
                    r, names[i], runs[r].mem[i], x, y, w, bar, colors[i], names[i],
                    runs[r].mem[i] / (1024.0 * 1024));
            x += w;
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\">%.1f</text>\n",
                fmin(x + 4, W - 40.0), y + 15, sum / (1024.0 * 1024));
    }
    double lx = 8, ly = T + n_runs * (bar + 10) + 14;
    for (int i = 0; i < N_MEM; i++) {
        fprintf(f,
                "<rect x=\"%.0f\" y=\"%.0f\" width=\"10\" height=\"10\" fill=\"%s\"/><text "
                "x=\"%.0f\" y=\"%.0f\" font-size=\"11\">%s</text>\n",
                lx, ly - 9, colors[i], lx + 13, ly, names[i]);
        lx += 74;
    }
    fprintf(f, "</svg>\n");
}

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

ct_status ct_html_report(int n_runs, char **run_args, const char *out_path) {
    run *runs = ct_xcalloc((size_t)n_runs, sizeof *runs);
    ct_status st = CT_OK;
    for (int r = 0; r < n_runs && st == CT_OK; r++) st = read_run(&runs[r], run_args[r]);
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
        fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                   "<title>cooktrain report</title>\n<style>\n"
                   "body { font-family: sans-serif; margin: 16px; color: #222222; }\n"
                   "svg.chart { margin: 6px; border: 1px solid #cccccc; }\n"
                   "table { border-collapse: collapse; margin-bottom: 12px; }\n"
                   "td, th { border: 1px solid #cccccc; padding: 3px 8px; text-align: right; }\n"
                   "</style>\n</head>\n<body>\n<h1>cooktrain report</h1>\n"
                   "<table>\n<tr><th>run</th><th>metrics</th><th>world</th><th>dp</th>"
                   "<th>ZeRO</th><th>precision</th><th>steps</th><th>last loss</th>"
                   "<th>best val loss</th><th>median tok/s</th><th>median MFU %%</th></tr>\n");
        for (int r = 0; r < n_runs; r++) {
            const run *u = &runs[r];
            const series *loss = &u->s[S_LOSS];
            fprintf(f, "<tr><td style=\"color: %s; text-align: left\">", palette[r % N_COLORS]);
            html_escape(f, u->name);
            fputs("</td><td style=\"text-align: left\">", f);
            html_escape(f, u->path);
            fprintf(f,
                    "</td><td>%lld</td><td>%lld</td><td>%lld</td><td>%s</td><td>%d</td>"
                    "<td>%.4f</td><td>%.4f</td><td>%.0f</td><td>%.2f</td></tr>\n",
                    u->world, u->dp, u->zero, u->precision[0] ? u->precision : "?", loss->n,
                    loss->n ? loss->y[loss->n - 1] : NAN, lowest(&u->s[S_VAL_LOSS]),
                    median(&u->s[S_TOKS]), median(&u->s[S_MFU]));
        }
        fputs("</table>\n<div>\n", f);
        const chart charts[] = {
            {"loss",
             "loss (solid: train, dashed: validation)",
             "",
             {S_LOSS, S_VAL_LOSS, -1},
             {false, true}},
            {"lr", "learning rate", "", {S_LR, -1}, {false}},
            {"grad_norm", "gradient norm", "", {S_GNORM, -1}, {false}},
            {"tokens_per_s", "throughput", "tokens/s", {S_TOKS, -1}, {false}},
            {"mfu", "model FLOPs utilisation", "%", {S_MFU, -1}, {false}},
            {"comm",
             "exposed comm (solid), bubble (dashed)",
             "s per step",
             {S_COMM, S_BUBBLE, -1},
             {false, true}},
            {"mem_bytes", "backend memory, rank 0", "bytes", {S_MEM, -1}, {false}},
            {"moe_load",
             "tokens per expert: min, mean (dashed), max",
             "",
             {S_LOAD_MIN, S_LOAD_MEAN, S_LOAD_MAX},
             {false, true, false}},
        };
        for (size_t c = 0; c < sizeof charts / sizeof charts[0]; c++)
            draw_chart(f, &charts[c], runs, n_runs);
        draw_experts(f, runs, n_runs);
        draw_memory(f, runs, n_runs);
        fputs("</div>\n</body>\n</html>\n", f);
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
        for (int s = 0; s < S_COUNT; s++) free(runs[r].s[s].x), free(runs[r].s[s].y);
        for (int e = 0; e < runs[r].n_experts; e++)
            free(runs[r].experts[e].x), free(runs[r].experts[e].y);
        free(runs[r].experts);
    }
    free(runs);
    return st;
}
