/*
 * backend.c — the device-independent half of backend.h: memory accounting per category and
 * tensor handles (slabs and views); the ct_* op wrappers are in backend_ops.c.
 *
 * These are also the helpers every backend uses (ct_backend_apply_env, ct_backend_free, ...):
 * this file calls no backend by name. The registry, which makes backends (the CPU backend, the
 * asynchronous stream, check mode, the registered ones), is backend_registry.c, so the arrows
 * run one way: registry -> backends -> this file.
 */
#include "backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names and accounting ------------------------------------------------------------------- */

const char *ct_mem_category_name(ct_mem_category category) {
    switch (category) {
    case CT_MEM_PARAMS: return "params";
    case CT_MEM_GRADS: return "grads";
    case CT_MEM_OPTIM: return "optim";
    case CT_MEM_MASTER: return "master";
    case CT_MEM_ACTS: return "acts";
    case CT_MEM_COMM: return "comm";
    case CT_MEM_GATHERED: return "gathered";
    case CT_MEM_WORKSPACE: return "workspace";
    case CT_MEM_COUNT: break;
    }
    return "?";
}

void ct_backend_free(ct_backend *be) {
    if (!be) return;
    if (be->iface->free_backend) be->iface->free_backend(be->ctx);
    free(be->mark_times);
    free(be->idle_ops);
    free(be);
}

/* What a graph cannot hold (ct_backend_capture_begin): the host waiting for, or reading, the
 * stream; memory coming or going. */
#define NOT_CAPTURING(be, what)                                                                    \
    CT_ASSERTF(!(be)->capturing, "%s during a graph capture (train.cuda_graph)", what)

void ct_backend_sync(ct_backend *be) {
    NOT_CAPTURING(be, "a wait for the stream");
    if (be->iface->sync) be->iface->sync(be->ctx);
}

void ct_backend_event_record(ct_backend *be, int event) {
    CT_ASSERTF(event >= 0 && event < CT_BACKEND_EVENTS, "event %d", event);
    NOT_CAPTURING(be, "an event");
    if (be->iface->event_record) be->iface->event_record(be->ctx, event);
}

void ct_backend_event_wait(ct_backend *be, int event) {
    CT_ASSERTF(event >= 0 && event < CT_BACKEND_EVENTS, "event %d", event);
    NOT_CAPTURING(be, "an event");
    if (be->iface->event_wait) be->iface->event_wait(be->ctx, event);
}

/* ---- the stream's clock -------------------------------------------------------------------- */

int64_t ct_backend_mark(ct_backend *be) {
    NOT_CAPTURING(be, "a mark");
    if (be->n_marks == be->cap_marks) {
        be->cap_marks = be->cap_marks ? 2 * be->cap_marks : 256;
        be->mark_times = realloc(be->mark_times, (size_t)be->cap_marks * sizeof *be->mark_times);
        CT_ASSERT(be->mark_times != NULL);
    }
    const int64_t id = be->n_marks++;
    if (be->iface->mark) {
        be->mark_times[id] = NAN;
        be->iface->mark(be->ctx, id);
    } else {
        be->mark_times[id] = ct_now();
    }
    return id;
}

static void idle_settle(ct_backend *be);

void ct_backend_marks_settle(ct_backend *be) {
    ct_backend_sync(be);
    if (be->iface->marks_read && be->n_marks > 0)
        be->iface->marks_read(be->ctx, be->n_marks, be->mark_times);
    idle_settle(be);
}

void ct_backend_marks_clear(ct_backend *be) {
    CT_ASSERTF(be->n_idle_ops == 0, "%lld audited ops not settled", (long long)be->n_idle_ops);
    be->n_marks = 0;
}

/* ---- graphs -------------------------------------------------------------------------------- */

bool ct_backend_can_capture(const ct_backend *be) {
    return be->iface->capture_begin && be->iface->capture_end && be->iface->graph_launch &&
           be->iface->graph_free;
}

void ct_backend_capture_begin(ct_backend *be) {
    CT_ASSERTF(ct_backend_can_capture(be), "backend %s cannot capture", be->iface->name);
    NOT_CAPTURING(be, "a capture");
    be->iface->capture_begin(be->ctx);
    be->capturing = true;
}

ct_backend_graph *ct_backend_capture_end(ct_backend *be, int64_t *ops) {
    CT_ASSERTF(be->capturing, "no capture to end");
    be->capturing = false;
    return be->iface->capture_end(be->ctx, ops);
}

bool ct_backend_graph_launch(ct_backend *be, ct_backend_graph *graph) {
    NOT_CAPTURING(be, "a graph launch");
    return be->iface->graph_launch(be->ctx, graph);
}

void ct_backend_graph_free(ct_backend *be, ct_backend_graph *graph) {
    if (graph) be->iface->graph_free(be->ctx, graph);
}

/* ---- the device-idle audit (log.device_idle) ------------------------------------------------ */

void ct_backend_idle(ct_backend *be, bool on) {
    CT_ASSERTF(be->idle_depth == 0 && be->n_idle_ops == 0,
               "the idle audit switched inside an op or before a settle");
    be->idle_on = on;
    be->idle_busy = be->idle_gaps = 0.0;
    be->idle_n_ops = 0;
    be->n_idle_by_op = be->n_busy_by_op = be->n_busy_by_gemm = 0;
    be->idle_settled_at = ct_now(); /* nothing audited is in flight: count from here */
}

/* COOKTRAIN_FAULT_HOST_DELAY=OP:N:SECONDS: the host sleeps before issuing the N-th call of op OP
 * (counted from the audit's start), as a host that falls behind its stream would. */
static void planted_delay(const char *name) {
    static char op[64];
    static long long n = -1, calls;
    static double seconds;
    if (n < 0) {
        n = 0;
        const char *env = getenv("COOKTRAIN_FAULT_HOST_DELAY");
        if (env && env[0])
            CT_ASSERTF(sscanf(env, "%63[^:]:%lld:%lf", op, &n, &seconds) == 3 && n > 0,
                       "COOKTRAIN_FAULT_HOST_DELAY=%s: expected OP:N:SECONDS", env);
    }
    if (n == 0 || strcmp(name, op) != 0 || ++calls != n) return;
    fprintf(stderr, "cooktrain: planted fault: the host sleeps %g s before %s #%lld\n", seconds, op,
            n);
    ct_sleep(seconds);
}

void ct_backend_idle_pause(ct_backend *be, bool paused) {
    CT_ASSERTF(be->idle_depth == 0, "the idle audit paused inside an op");
    be->idle_paused = paused;
}

void ct_backend_idle_begin(ct_backend *be, const char *name) {
    if (!be->idle_on || be->idle_paused || be->idle_depth++ > 0) return;
    planted_delay(name);
    if (be->n_idle_ops == be->cap_idle_ops) {
        be->cap_idle_ops = be->cap_idle_ops ? 2 * be->cap_idle_ops : 256;
        be->idle_ops = realloc(be->idle_ops, (size_t)be->cap_idle_ops * sizeof *be->idle_ops);
        CT_ASSERT(be->idle_ops != NULL);
    }
    be->idle_ops[be->n_idle_ops++] =
        (struct ct_idle_op){.before = ct_backend_mark(be), .after = -1, .name = name, .gemm = -1};
}

void ct_backend_idle_gemm(ct_backend *be, int64_t M, int64_t N, int64_t K, bool trans_a,
                          bool trans_b, bool accumulate, ct_dtype ab, ct_dtype c) {
    if (!be->idle_on || be->idle_paused || be->idle_depth != 1) return;
    struct ct_idle_op *op = &be->idle_ops[be->n_idle_ops - 1];
    const struct ct_gemm_shape k = {.op = op->name,
                                    .M = M,
                                    .N = N,
                                    .K = K,
                                    .trans_a = trans_a,
                                    .trans_b = trans_b,
                                    .accumulate = accumulate,
                                    .ab = ab,
                                    .c = c};
    int i = 0;
    for (; i < be->n_busy_by_gemm; i++) {
        const struct ct_gemm_shape *s = &be->busy_by_gemm[i];
        if (s->op == k.op && s->M == M && s->N == N && s->K == K && s->trans_a == trans_a &&
            s->trans_b == trans_b && s->accumulate == accumulate && s->ab == ab && s->c == c)
            break;
    }
    if (i == be->n_busy_by_gemm) {
        if (i == CT_GEMM_SHAPES_MAX) return; /* dropped: the op still counts by name */
        be->busy_by_gemm[be->n_busy_by_gemm++] = k;
    }
    op->gemm = i;
}

void ct_backend_idle_end(ct_backend *be) {
    if (!be->idle_on || be->idle_paused || be->idle_depth == 0 || --be->idle_depth > 0) return;
    be->idle_ops[be->n_idle_ops - 1].after = ct_backend_mark(be);
}

/* The audited ops since the last settle, in issue order: each one's time in the stream, and the
 * stream's idle time before it — since the previous op's end, or for the first one since the last
 * settle's wait ended (the stream was empty then). A gap a clock's offset makes negative counts
 * as 0. */
static void idle_settle(ct_backend *be) {
    double prev_end = be->idle_settled_at;
    for (int64_t i = 0; i < be->n_idle_ops; i++) {
        const struct ct_idle_op *op = &be->idle_ops[i];
        CT_ASSERTF(op->after >= 0, "audited op %lld has not ended", (long long)i);
        const double t0 = ct_backend_mark_time(be, op->before),
                     t1 = ct_backend_mark_time(be, op->after);
        const double gap = CT_MAX(0.0, t0 - prev_end), busy = CT_MAX(0.0, t1 - t0);
        be->idle_busy += busy;
        be->idle_gaps += gap;
        be->idle_n_ops++;
        ct_prof_op_add(be->idle_by_op, &be->n_idle_by_op, op->name, gap);
        ct_prof_op_add(be->busy_by_op, &be->n_busy_by_op, op->name, busy);
        if (op->gemm >= 0) {
            be->busy_by_gemm[op->gemm].seconds += busy;
            be->busy_by_gemm[op->gemm].calls++;
        }
        prev_end = CT_MAX(prev_end, t1);
    }
    be->n_idle_ops = 0;
    be->idle_settled_at = ct_now();
}

double ct_backend_mark_time(const ct_backend *be, int64_t id) {
    CT_ASSERTF(id >= 0 && id < be->n_marks, "mark %lld of %lld", (long long)id,
               (long long)be->n_marks);
    CT_ASSERTF(!isnan(be->mark_times[id]), "mark %lld read before ct_backend_marks_settle",
               (long long)id);
    return be->mark_times[id];
}

static void push_pair(double **v, int *n, int *cap, double a, double b) {
    if (*n + 2 > *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *v = realloc(*v, (size_t)*cap * sizeof **v);
        CT_ASSERT(*v != NULL);
    }
    (*v)[(*n)++] = a;
    (*v)[(*n)++] = b;
}

void ct_waits_end(ct_waits *w, ct_backend *be, int64_t before) {
    if (w->n_marks + 2 > w->cap_marks) {
        w->cap_marks = w->cap_marks ? 2 * w->cap_marks : 64;
        w->marks = realloc(w->marks, (size_t)w->cap_marks * sizeof *w->marks);
        CT_ASSERT(w->marks != NULL);
    }
    w->marks[w->n_marks++] = before;
    w->marks[w->n_marks++] = ct_backend_mark(be);
}

void ct_waits_settle(ct_waits *w, const ct_backend *be) {
    for (int i = 0; i < w->n_marks; i += 2) {
        double t0 = ct_backend_mark_time(be, w->marks[i]),
               t1 = ct_backend_mark_time(be, w->marks[i + 1]);
        w->seconds += t1 - t0;
        if (w->keep) push_pair(&w->spans, &w->n_spans, &w->cap_spans, t0, t1);
    }
    w->n_marks = 0;
}

void ct_waits_release(ct_waits *w) {
    free(w->marks);
    free(w->spans);
    memset(w, 0, sizeof *w);
}

void ct_backend_describe(const ct_backend *be, char *buf, size_t cap) {
    char what[96] = "";
    if (be->iface->describe) be->iface->describe(be->ctx, what, sizeof what);
    snprintf(buf, cap, "%s%s%s", be->iface->name, what[0] ? ", " : "", what);
}

void ct_backend_apply_env(ct_backend *be) {
    be->mem_limit = 0;
    be->fail_category = -1;
    const char *env = getenv("COOKTRAIN_MEM_LIMIT_MB");
    if (env && env[0]) {
        char *end = NULL;
        double mb = strtod(env, &end);
        if (*end || !(mb > 0) || mb > 1e12)
            fprintf(stderr,
                    "cooktrain: ignoring COOKTRAIN_MEM_LIMIT_MB='%s' (not a positive "
                    "number of MiB)\n",
                    env);
        else
            be->mem_limit = (size_t)(mb * 1024.0 * 1024.0);
    }
    env = getenv("COOKTRAIN_FAIL_ALLOC");
    for (int c = 0; env && c < CT_MEM_COUNT; c++)
        if (!strcmp(env, ct_mem_category_name((ct_mem_category)c))) be->fail_category = c;
}

double ct_backend_peak_flops(ct_backend *be, ct_dtype dt, char *how, size_t how_cap) {
    if (!be->iface->peak_flops) {
        snprintf(how, how_cap, "unknown for the %s backend", be->iface->name);
        return 0.0;
    }
    return be->iface->peak_flops(be->ctx, dt, how, how_cap);
}

size_t ct_backend_mem(const ct_backend *be, ct_mem_category category) {
    CT_ASSERTF(category >= 0 && category < CT_MEM_COUNT, "bad memory category %d", (int)category);
    return be->bytes_in_use[category];
}

const char *ct_prof_category_name(ct_prof_category category) {
    static const char *names[CT_PROF_COUNT] = {"gemm",      "attention", "norms",    "elementwise",
                                               "embedding", "loss",      "optimizer"};
    return category < CT_PROF_COUNT ? names[category] : "?";
}

void ct_prof_op_add(struct ct_prof_op *ops, int *n, const char *name, double seconds) {
    int i = 0;
    while (i < *n && ops[i].name != name) i++;
    if (i == *n) {
        if (i == CT_PROF_OPS_MAX) return;
        ops[(*n)++] = (struct ct_prof_op){.name = name};
    }
    ops[i].seconds += seconds;
    ops[i].calls++;
}

void ct_backend_profile(ct_backend *be, bool on) {
    be->profiling = on;
    for (int c = 0; c < CT_PROF_COUNT; c++) be->prof_seconds[c] = 0.0;
    be->n_prof_ops = 0;
}

void ct_backend_mem_snapshot(const ct_backend *be, size_t *bytes) {
    for (int c = 0; c < CT_MEM_COUNT; c++) bytes[c] = be->bytes_in_use[c];
}

size_t ct_backend_mem_total(const ct_backend *be) {
    size_t total = 0;
    for (int c = 0; c < CT_MEM_COUNT; c++) total += be->bytes_in_use[c];
    return total;
}

/* ---- completeness ------------------------------------------------------------------------- */

const char *ct_backend_missing_op(const struct ct_backend_i *iface) {
    if (!iface->alloc) return "alloc";
    if (!iface->free) return "free";
    if (!iface->copy_from_host) return "copy_from_host";
    if (!iface->copy_to_host) return "copy_to_host";
#define IS_OPTIONAL_CT_OP_REQUIRED false
#define IS_OPTIONAL_CT_OP_OPTIONAL true
#define IS_OPTIONAL_CT_OP_FEATURE true
#define MISSING_OP(name, need, queue, ...)                                                         \
    if (!IS_OPTIONAL_##need && !iface->name) return #name;
    CT_BACKEND_OPS(MISSING_OP)
#undef MISSING_OP
#undef IS_OPTIONAL_CT_OP_REQUIRED
#undef IS_OPTIONAL_CT_OP_OPTIONAL
#undef IS_OPTIONAL_CT_OP_FEATURE
    return NULL;
}

/* ---- shape strings for assertion messages ---------------------------------------------------- */

const char *ct_tensor_shape_str(const ct_tensor *t) {
    static _Thread_local char bufs[8][96];
    static _Thread_local int next;
    char *buf = bufs[next++ & 7];
    if (!t) {
        snprintf(buf, 96, "(null)");
        return buf;
    }
    int len = snprintf(buf, 96, "%s[", ct_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim && len < 90; d++)
        len += snprintf(buf + len, 96 - len, d ? ",%lld" : "%lld", (long long)t->shape[d]);
    snprintf(buf + len, 96 - len, "]");
    return buf;
}
#define SH(t) ct_tensor_shape_str(t)

/* ---- tensors ------------------------------------------------------------------------------ */

static int64_t shape_numel(int ndim, const int64_t *shape) {
    CT_ASSERTF(ndim >= 1 && ndim <= CT_MAX_DIMS, "ndim %d outside [1, %d]", ndim, CT_MAX_DIMS);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        CT_ASSERTF(shape[d] >= 0, "negative extent %lld in dim %d", (long long)shape[d], d);
        CT_ASSERTF(shape[d] == 0 || n <= INT64_MAX / shape[d], "tensor element count overflows");
        n *= shape[d];
    }
    return n;
}

ct_tensor *ct_tensor_new(ct_backend *be, ct_dtype dtype, int ndim, const int64_t *shape,
                         ct_mem_category category) {
    CT_ASSERT(be != NULL);
    CT_ASSERTF(category >= 0 && category < CT_MEM_COUNT, "bad memory category %d", (int)category);
    int64_t numel = shape_numel(ndim, shape);
    size_t esize = ct_dtype_size(dtype);
    CT_ASSERTF((uint64_t)numel <= SIZE_MAX / esize, "tensor byte count overflows");
    size_t bytes = (size_t)numel * esize;

    /* Never ask for 0 bytes: a NULL from alloc must mean out-of-memory. */
    size_t in_use = ct_backend_mem_total(be);
    bool over_limit = be->mem_limit && (bytes > be->mem_limit || in_use > be->mem_limit - bytes);
    over_limit = over_limit || (int)category == be->fail_category;
    NOT_CAPTURING(be, "an allocation");
    void *data = over_limit ? NULL : be->iface->alloc(be->ctx, bytes ? bytes : 1);
    if (!data) {
        char limit[96] = "";
        if (be->mem_limit)
            snprintf(limit, sizeof limit, "; limit %.1f MiB (COOKTRAIN_MEM_LIMIT_MB)",
                     (double)be->mem_limit / (1024.0 * 1024.0));
        ct_error(CT_ERR_RUNTIME,
                 "out of %s memory: could not allocate %zu bytes (%.1f MiB) for %s "
                 "(%zu bytes already in use in total%s)",
                 be->iface->name, bytes, (double)bytes / (1024.0 * 1024.0),
                 ct_mem_category_name(category), in_use, limit);
        ct_hint("reduce train.micro_batch or model size, use activation recompute or a higher "
                "parallel.zero_stage, or spread the model over more ranks (tp/pp)");
        return NULL;
    }

    ct_tensor *t = ct_xcalloc(1, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->numel = numel;
    t->backend = be;
    t->data = data;
    t->owns_data = true;
    t->category = category;

    be->bytes_in_use[category] += bytes;
    if (be->bytes_in_use[category] > be->peak_bytes[category])
        be->peak_bytes[category] = be->bytes_in_use[category];
    return t;
}

ct_tensor *ct_tensor_new_1d(ct_backend *be, ct_dtype dtype, int64_t n, ct_mem_category category) {
    int64_t shape[1] = {n};
    return ct_tensor_new(be, dtype, 1, shape, category);
}

ct_tensor *ct_tensor_new_2d(ct_backend *be, ct_dtype dtype, int64_t rows, int64_t cols,
                            ct_mem_category category) {
    int64_t shape[2] = {rows, cols};
    return ct_tensor_new(be, dtype, 2, shape, category);
}

ct_tensor *ct_tensor_view(const ct_tensor *parent, int64_t offset, int ndim, const int64_t *shape) {
    CT_ASSERT(parent != NULL);
    int64_t numel = shape_numel(ndim, shape);
    CT_ASSERTF(offset >= 0 && offset <= parent->numel && numel <= parent->numel - offset,
               "view of %lld elements at offset %lld does not fit in %s", (long long)numel,
               (long long)offset, SH(parent));
    ct_tensor *t = ct_xcalloc(1, sizeof *t);
    t->dtype = parent->dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->numel = numel;
    t->backend = parent->backend;
    t->data = (char *)parent->data + (size_t)offset * ct_dtype_size(parent->dtype);
    t->owns_data = false;
    t->category = parent->category;
    return t;
}

ct_tensor *ct_tensor_view_as(const ct_tensor *parent, ct_dtype dtype, size_t byte_offset, int ndim,
                             const int64_t *shape) {
    CT_ASSERT(parent != NULL);
    size_t bytes = (size_t)shape_numel(ndim, shape) * ct_dtype_size(dtype);
    CT_ASSERTF(byte_offset % ct_dtype_size(dtype) == 0 && byte_offset <= ct_tensor_bytes(parent) &&
                   bytes <= ct_tensor_bytes(parent) - byte_offset,
               "%s view of %zu bytes at byte %zu does not fit in %s", ct_dtype_name(dtype), bytes,
               byte_offset, SH(parent));
    ct_tensor *t = ct_xcalloc(1, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->numel = shape_numel(ndim, shape);
    t->backend = parent->backend;
    t->data = (char *)parent->data + byte_offset;
    t->owns_data = false;
    t->category = parent->category;
    return t;
}

ct_tensor *ct_tensor_new_unbound(ct_backend *be, ct_dtype dtype, int ndim, const int64_t *shape) {
    ct_tensor *t = ct_xcalloc(1, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->numel = shape_numel(ndim, shape);
    t->backend = be;
    t->data = NULL;
    t->owns_data = false;
    return t;
}

void ct_tensor_rebind(ct_tensor *view, const ct_tensor *parent, int64_t offset) {
    CT_ASSERT(!view->owns_data);
    if (!parent) {
        view->data = NULL;
        return;
    }
    CT_ASSERTF(parent->dtype == view->dtype && offset >= 0 && offset <= parent->numel &&
                   view->numel <= parent->numel - offset,
               "rebinding %s at offset %lld into %s", SH(view), (long long)offset, SH(parent));
    view->data = (char *)parent->data + (size_t)offset * ct_dtype_size(parent->dtype);
    view->category = parent->category;
}

ct_tensor *ct_tensor_view_1d(const ct_tensor *parent, int64_t offset, int64_t n) {
    int64_t shape[1] = {n};
    return ct_tensor_view(parent, offset, 1, shape);
}

ct_tensor *ct_tensor_view_2d(const ct_tensor *parent, int64_t offset, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    return ct_tensor_view(parent, offset, 2, shape);
}

void ct_tensor_free(ct_tensor *t) {
    if (!t) return;
    if (t->owns_data) {
        ct_backend *be = t->backend;
        size_t bytes = ct_tensor_bytes(t);
        CT_ASSERTF(be->bytes_in_use[t->category] >= bytes,
                   "freeing %zu bytes of %s but only %zu are accounted", bytes,
                   ct_mem_category_name(t->category), be->bytes_in_use[t->category]);
        be->bytes_in_use[t->category] -= bytes;
        NOT_CAPTURING(be, "a free");
        be->iface->free(be->ctx, t->data);
    }
    free(t);
}

size_t ct_tensor_bytes(const ct_tensor *t) {
    return (size_t)t->numel * ct_dtype_size(t->dtype);
}

int64_t ct_tensor_rows(const ct_tensor *t) {
    int64_t rows = 1;
    for (int d = 0; d < t->ndim - 1; d++) rows *= t->shape[d];
    return rows;
}

int64_t ct_tensor_cols(const ct_tensor *t) {
    return t->shape[t->ndim - 1];
}

void ct_tensor_fill(ct_tensor *t, float value) {
    ct_backend_idle_begin(t->backend, "fill");
    t->backend->iface->fill(t->backend->ctx, t->data, t->dtype, t->numel, value);
    ct_backend_idle_end(t->backend);
}

void ct_tensor_zero(ct_tensor *t) {
    ct_tensor_fill(t, 0.0f);
}

void ct_tensor_from_host(ct_tensor *dst, const void *src) {
    ct_backend *be = dst->backend;
    NOT_CAPTURING(be, "a copy from the host");
    ct_backend_idle_begin(be, "from_host");
    be->iface->copy_from_host(be->ctx, dst->data, src, ct_tensor_bytes(dst));
    ct_backend_idle_end(be);
}

void ct_tensor_to_host(void *dst, const ct_tensor *src) {
    ct_backend *be = src->backend;
    NOT_CAPTURING(be, "a copy to the host");
    be->host_copies++;
    be->iface->copy_to_host(be->ctx, dst, src->data, ct_tensor_bytes(src));
}

void ct_tensor_copy(ct_tensor *dst, const ct_tensor *src) {
    CT_ASSERTF(dst->dtype == src->dtype && dst->numel == src->numel,
               "copy %s into %s: dtype and element count must match", SH(src), SH(dst));
    CT_ASSERTF(dst->backend == src->backend, "copy between different backends");
    ct_backend *be = dst->backend;
    ct_backend_idle_begin(be, "copy");
    be->iface->copy(be->ctx, dst->data, src->data, ct_tensor_bytes(dst));
    ct_backend_idle_end(be);
}

void ct_tensor_from_host_f32(ct_tensor *dst, const float *src) {
    if (dst->dtype == CT_DTYPE_F32) {
        ct_tensor_from_host(dst, src);
        return;
    }
    CT_ASSERTF(dst->dtype == CT_DTYPE_BF16, "from_host_f32 into %s", SH(dst));
    uint16_t *h = ct_xmalloc((size_t)CT_MAX(1, dst->numel) * sizeof *h);
    for (int64_t i = 0; i < dst->numel; i++) h[i] = ct_f32_to_bf16(src[i]);
    ct_tensor_from_host(dst, h);
    free(h);
}

void ct_tensor_to_host_f32(float *dst, const ct_tensor *src) {
    if (src->dtype == CT_DTYPE_F32) {
        ct_tensor_to_host(dst, src);
        return;
    }
    CT_ASSERTF(src->dtype == CT_DTYPE_BF16, "to_host_f32 from %s", SH(src));
    uint16_t *h = ct_xmalloc((size_t)CT_MAX(1, src->numel) * sizeof *h);
    ct_tensor_to_host(h, src);
    for (int64_t i = 0; i < src->numel; i++) dst[i] = ct_bf16_to_f32(h[i]);
    free(h);
}
