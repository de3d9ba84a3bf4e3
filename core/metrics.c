/* metrics.c — the JSON-lines metrics file. See metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct ct_metrics {
    FILE *file;
    char *path;
    char *line; /* the line being built */
    size_t len, cap;
    int fields;       /* in the line so far */
    ct_status status; /* the first failed write */
};

int64_t ct_metrics_last_step(const char *path) {
    struct stat st; /* a regular file only: /dev/full, say, reads as endless zeros */
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int64_t last = -1;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        const char *at = strstr(line, "\"step\": ");
        long long step;
        if (at && strstr(line, "\"loss\": ") && sscanf(at + 8, "%lld", &step) == 1)
            last = CT_MAX(last, (int64_t)step);
    }
    free(line);
    fclose(f);
    return last;
}

ct_status ct_metrics_open(ct_metrics **out, const char *path) {
    *out = NULL;
    CT_TRY(ct_mkdir_parents(path));
    FILE *f = fopen(path, "a"); /* a resumed run goes on in the same file */
    if (!f) {
        ct_error(CT_ERR_INPUT, "cannot open the metrics file '%s': %s", path, strerror(errno));
        ct_hint("check that the directory exists and is writable (log.metrics, log.run_dir)");
        return CT_ERR_INPUT;
    }
    ct_metrics *m = ct_xcalloc(1, sizeof *m);
    m->file = f;
    m->path = ct_xstrdup(path);
    *out = m;
    return CT_OK;
}

void ct_metrics_free(ct_metrics *m) {
    if (!m) return;
    fclose(m->file);
    free(m->path);
    free(m->line);
    free(m);
}

static void append(ct_metrics *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(ct_metrics *m, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(m->line + m->len, m->cap - m->len, fmt, ap);
        va_end(ap);
        CT_ASSERT(n >= 0);
        if (m->len + (size_t)n < m->cap) {
            m->len += (size_t)n;
            return;
        }
        m->cap = CT_MAX(2 * m->cap, m->len + (size_t)n + 256);
        m->line = realloc(m->line, m->cap);
        CT_ASSERT(m->line != NULL);
    }
}

/* The separator and the quoted key of the next field. */
static void key(ct_metrics *m, const char *name) {
    append(m, "%s\"%s\": ", m->fields++ ? ", " : "", name);
}

void ct_metrics_begin(ct_metrics *m) {
    if (!m) return;
    m->len = 0;
    m->fields = 0;
    append(m, "{");
}

void ct_metrics_int(ct_metrics *m, const char *name, int64_t value) {
    if (!m) return;
    key(m, name);
    append(m, "%lld", (long long)value);
}

void ct_metrics_uint(ct_metrics *m, const char *name, uint64_t value) {
    if (!m) return;
    key(m, name);
    append(m, "%llu", (unsigned long long)value);
}

/* value printed with fmt, or null if not finite (JSON has no NaN) */
static void number(ct_metrics *m, const char *fmt, double value) {
    char num[64];
    if (isfinite(value))
        snprintf(num, sizeof num, fmt, value);
    else
        snprintf(num, sizeof num, "null");
    append(m, "%s", num);
}

void ct_metrics_num(ct_metrics *m, const char *name, const char *fmt, double value) {
    if (!m) return;
    key(m, name);
    number(m, fmt, value);
}

void ct_metrics_nums(ct_metrics *m, const char *name, const char *fmt, int64_t n,
                     const double *values) {
    if (!m) return;
    key(m, name);
    append(m, "[");
    for (int64_t i = 0; i < n; i++) {
        if (i) append(m, ", ");
        number(m, fmt, values[i]);
    }
    append(m, "]");
}

void ct_metrics_bool(ct_metrics *m, const char *name, bool value) {
    if (!m) return;
    key(m, name);
    append(m, "%s", value ? "true" : "false");
}

void ct_metrics_str(ct_metrics *m, const char *name, const char *value) {
    if (!m) return;
    key(m, name);
    append(m, "\"%s\"", value);
}

void ct_metrics_end(ct_metrics *m) {
    if (!m) return;
    append(m, "}\n");
    if (m->status != CT_OK) return; /* already failed: the first message stands */
    bool written = fwrite(m->line, 1, m->len, m->file) == m->len;
    if (written && fflush(m->file) == 0 && !ferror(m->file)) return;
    m->status = ct_error(CT_ERR_RUNTIME, "cannot write the metrics file '%s': %s", m->path,
                         strerror(errno));
    ct_hint("check free space where log.metrics / log.run_dir point");
}

ct_status ct_metrics_status(const ct_metrics *m) {
    return m ? m->status : CT_OK;
}
