/* trace.c — Chrome/Perfetto trace files. See trace.h. */
#include "trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ct_trace {
    FILE *file;
    char *path;
    int rank;
    double shift; /* seconds added to every time */
    int events;   /* written so far: every one but the first is preceded by a comma */
};

void ct_trace_rank_path(char *buf, size_t n, const char *path, int rank, int world_size) {
    if (world_size > 1) {
        const char *dot = strrchr(path, '.');
        int stem = dot && !strchr(dot, '/') ? (int)(dot - path) : (int)strlen(path);
        snprintf(buf, n, "%.*s.rank%d.json", stem, path, rank);
    } else {
        snprintf(buf, n, "%s", path);
    }
}

ct_status ct_trace_open(ct_trace **out, const char *path, int rank, int world_size) {
    *out = NULL;
    size_t cap = strlen(path) + 32;
    char *file = ct_xmalloc(cap);
    ct_trace_rank_path(file, cap, path, rank, world_size);
    ct_status st = ct_mkdir_parents(file);
    FILE *f = st == CT_OK ? fopen(file, "w") : NULL;
    if (st == CT_OK && !f) {
        st = ct_error(CT_ERR_INPUT, "cannot open log.trace file '%s': %s", file, strerror(errno));
        ct_hint("check that the directory exists and is writable");
    }
    if (st != CT_OK) {
        free(file);
        return st;
    }
    ct_trace *t = ct_xcalloc(1, sizeof *t);
    t->file = f;
    t->path = file;
    t->rank = rank;
    fprintf(f, "{\"traceEvents\": [\n");
    *out = t;
    return CT_OK;
}

static void separate(ct_trace *t) {
    if (t->events++) fprintf(t->file, ",\n");
}

void ct_trace_set_shift(ct_trace *t, double shift) {
    t->shift = shift;
}

void ct_trace_process(ct_trace *t, const char *name) {
    separate(t);
    fprintf(t->file,
            "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": "
            "\"%s\"}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, "
            "\"args\": {\"sort_index\": %d}}",
            t->rank, name, t->rank, t->rank);
}

void ct_trace_thread(ct_trace *t, int tid, const char *name) {
    separate(t);
    fprintf(t->file,
            "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
            "\"args\": {\"name\": \"%s\"}}",
            t->rank, tid, name);
}

void ct_trace_span(ct_trace *t, int tid, const char *name, double start, double end,
                   int microbatch) {
    separate(t);
    fprintf(t->file,
            "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, "
            "\"dur\": %.3f, \"args\": {\"microbatch\": %d}}",
            name, t->rank, tid, 1e6 * (start + t->shift), 1e6 * (end - start), microbatch);
}

void ct_trace_counter(ct_trace *t, const char *name, double time, int n, const double *values) {
    separate(t);
    fprintf(t->file, "{\"name\": \"%s\", \"ph\": \"C\", \"pid\": %d, \"ts\": %.3f, \"args\": {",
            name, t->rank, 1e6 * (time + t->shift));
    for (int i = 0; i < n; i++) fprintf(t->file, "%s\"%d\": %.17g", i ? ", " : "", i, values[i]);
    fprintf(t->file, "}}");
}

ct_status ct_trace_close(ct_trace *t) {
    fprintf(t->file, "\n]}\n");
    bool written = !ferror(t->file);
    ct_status st = CT_OK;
    if (fclose(t->file) != 0 || !written) {
        st = ct_error(CT_ERR_INPUT, "cannot write log.trace file '%s': %s", t->path,
                      strerror(errno));
        ct_hint("check free space");
    }
    free(t->path);
    free(t);
    return st;
}

/* The events of one file's text: between its first "[" and its last "]". */
static bool events_of(const char *body, const char **begin, size_t *len) {
    const char *open = strchr(body, '['), *close = strrchr(body, ']');
    if (!open || !close || close < open) return false;
    *begin = open + 1;
    *len = (size_t)(close - open - 1);
    while (*len && (**begin == '\n' || **begin == ' ')) (*begin)++, (*len)--;
    while (*len && ((*begin)[*len - 1] == '\n' || (*begin)[*len - 1] == ' ')) (*len)--;
    return true;
}

ct_status ct_trace_write_merged(const char *path, int n, char *const *bodies) {
    ct_status st = ct_mkdir_parents(path);
    FILE *f = st == CT_OK ? fopen(path, "w") : NULL;
    if (st == CT_OK && !f) {
        st = ct_error(CT_ERR_INPUT, "cannot open log.trace file '%s': %s", path, strerror(errno));
        ct_hint("check that the directory exists and is writable");
    }
    if (st != CT_OK) return st;
    fprintf(f, "{\"traceEvents\": [\n");
    bool first = true;
    for (int r = 0; r < n; r++) {
        const char *ev;
        size_t len;
        if (!bodies[r] || !events_of(bodies[r], &ev, &len) || !len) continue;
        if (!first) fprintf(f, ",\n");
        fwrite(ev, 1, len, f);
        first = false;
    }
    fprintf(f, "\n]}\n");
    bool written = !ferror(f);
    if (fclose(f) != 0 || !written) {
        st = ct_error(CT_ERR_INPUT, "cannot write log.trace file '%s': %s", path, strerror(errno));
        ct_hint("check free space");
    }
    return st;
}
