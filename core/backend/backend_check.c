/*
 * backend_check.c — check mode (ct_backend_check_new; CT_CHECK_BACKEND=1 in ct_backend_new): a
 * decorator backend that runs every op on `inner`, the backend under test, then reruns it on a
 * private CPU backend (the numerical reference) from the same inputs and compares the results.
 * The first op whose result differs beyond tolerance is reported — the op, its shape arguments,
 * the output buffer, the worst element (index, got, want, tolerance) and how many ops agreed
 * before it — and the process exits with status 1. It is a debugging mode for a first run on new
 * hardware or a new kernel, slow by design: every op sends all its operands through the host and
 * runs a second time on the CPU.
 *
 * What one op slot does (ct_check_<slot>, check_ops.c):
 *   1. it lists the buffers the op reads or writes (struct op_arg: inner's pointer, extent in
 *      elements, dtype, in / out / in-out), in the slot's parameter order; extents follow from the
 *      slot's arguments exactly as the CPU backend reads them (gemm's leading dimensions, the
 *      packed qkv of attention, adamw's segments, ...);
 *   2. op_begin downloads every buffer from inner BEFORE the op (copy_to_host waits for inner's
 *      stream) — outputs too, so accumulating outputs (dbias, dw, adamw's m and v) start from the
 *      same values on both sides and elements an op leaves alone (gemm's row gaps) compare
 *      equal — and uploads the snapshots into CPU buffers. Buffers that overlap in inner's memory
 *      (gelu_bwd's dinp == dout) are one region with one CPU buffer, so the rerun sees the same
 *      aliasing;
 *   3. the op runs on inner, then on the CPU backend with the CPU buffers (steps 2 to 4 are
 *      run_<slot>, generated from the op list of backend_ops.h: the checker's own code is its
 *      buffer list, its shape string and its tolerances);
 *   4. op_collect downloads inner's outputs ("got") and the CPU's ("want"), in fp32 for f32 and
 *      bf16 buffers, and zeroes a per-element tolerance array for each output;
 *   5. the slot fills the tolerances (see "Tolerances" below);
 *   6. op_end compares, and also checks that every input no output overlaps came back from inner
 *      unchanged, so a kernel that writes into its operands is caught at the op that does it.
 *
 * Memory, copies and ordering pass through: alloc, free, copy_from_host, copy_to_host, and the
 * event and sync slots (the downloads of step 2 and 4 wait for inner's stream anyway). fill and
 * copy are checked like ops (exact). The host memory an op needs is about eight times its
 * operands (snapshots, both results, fp32 views, tolerances): a small micro_batch keeps the
 * largest op (the vocabulary projection) affordable.
 */
#include "check_ops.h"

/* n values of an f32 or bf16 buffer as fp32 (a new allocation). */
float *ct_check_to_f32(ct_dtype dt, const void *p, int64_t n) {
    float *f = ct_xmalloc((size_t)CT_MAX(n, 1) * sizeof *f);
    if (dt == CT_DTYPE_F32)
        memcpy(f, p, (size_t)n * sizeof *f);
    else
        for (int64_t i = 0; i < n; i++) f[i] = ct_bf16_to_f32(((const uint16_t *)p)[i]);
    return f;
}

/* Snapshots every buffer from inner and uploads it to the CPU backend (step 2 at the top). */
void ct_check_op_begin(check_ctx *k, op_check *o) {
    int order[MAX_ARGS], n = 0;
    for (int i = 0; i < o->n_args; i++) {
        op_arg *a = &o->arg[i];
        a->region = -1;
        a->cpu = a->dev ? k->dummy : NULL;
        if (arg_bytes(a) == 0) continue;
        int j = n++; /* insertion sort by address */
        while (j > 0 && (uintptr_t)o->arg[order[j - 1]].dev > (uintptr_t)a->dev) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    o->n_regions = 0;
    for (int s = 0; s < n; s++) {
        op_arg *a = &o->arg[order[s]];
        uintptr_t lo = (uintptr_t)a->dev, hi = lo + arg_bytes(a);
        region *r = o->n_regions ? &o->reg[o->n_regions - 1] : NULL;
        if (r && lo < r->hi) { /* overlaps the previous region: the same memory */
            if (hi > r->hi) r->hi = hi;
        } else {
            o->reg[o->n_regions++] = (region){.lo = lo, .hi = hi};
        }
        a->region = o->n_regions - 1;
    }
    for (int r = 0; r < o->n_regions; r++) {
        region *g = &o->reg[r];
        size_t bytes = g->hi - g->lo;
        g->host = ct_xmalloc(bytes);
        INNER(k)->copy_to_host(INNER_CTX(k), g->host, (const void *)g->lo, bytes);
        g->cpu = CPU(k)->alloc(CPU_CTX(k), bytes);
        CT_ASSERTF(g->cpu != NULL, "check backend: out of host memory for %zu bytes of '%s'", bytes,
                   o->op);
        CPU(k)->copy_from_host(CPU_CTX(k), g->cpu, g->host, bytes);
    }
    for (int i = 0; i < o->n_args; i++) {
        op_arg *a = &o->arg[i];
        if (a->region < 0) continue;
        size_t off = (uintptr_t)a->dev - o->reg[a->region].lo;
        a->before = o->reg[a->region].host + off;
        a->cpu = (char *)o->reg[a->region].cpu + off;
    }
}

/* Downloads both sides' outputs and the fp32 views (step 4 at the top). */
void ct_check_op_collect(check_ctx *k, op_check *o) {
    for (int i = 0; i < o->n_args; i++) {
        op_arg *a = &o->arg[i];
        if (a->region < 0) continue;
        if (is_float(a->dtype)) a->x = ct_check_to_f32(a->dtype, a->before, a->n);
        if (!(a->role & ARG_OUT)) continue;
        size_t bytes = arg_bytes(a);
        a->got_raw = ct_xmalloc(bytes);
        a->want_raw = ct_xmalloc(bytes);
        INNER(k)->copy_to_host(INNER_CTX(k), a->got_raw, a->dev, bytes);
        CPU(k)->copy_to_host(CPU_CTX(k), a->want_raw, a->cpu, bytes);
        if (is_float(a->dtype)) {
            a->got = ct_check_to_f32(a->dtype, a->got_raw, a->n);
            a->want = ct_check_to_f32(a->dtype, a->want_raw, a->n);
        }
        a->tol = ct_xcalloc((size_t)a->n, sizeof *a->tol);
    }
}

/* ---- comparison and the report ----------------------------------------------------------------
 */

typedef struct worst {
    int64_t index, n_bad;
    double got, want, tol, badness; /* badness: |got - want| / tol (inf: not finite or exact) */
} worst;

/* One bf16 ulp at |x|: 2^(e - 8) for |x| = m·2^e, m in [0.5, 1). */
static double bf16_ulp(double x) {
    int e;
    frexp(fabs(x), &e);
    return x == 0.0 ? 0.0 : ldexp(1.0, e - 8);
}

static void note_bad(worst *w, int64_t i, double got, double want, double tol, double badness) {
    if (w->n_bad++ == 0 || badness > w->badness) *w = (worst){i, w->n_bad, got, want, tol, badness};
}

/* Compares one output; w->n_bad counts the elements beyond tolerance, *w holds the worst. */
static void compare_arg(const check_ctx *k, const op_check *o, const op_arg *a, worst *w) {
    *w = (worst){0};
    if (!is_float(a->dtype)) { /* integers and raw bytes: equal or not */
        size_t es = ct_dtype_size(a->dtype);
        for (int64_t i = 0; i < a->n; i++)
            if (memcmp((char *)a->got_raw + i * es, (char *)a->want_raw + i * es, es))
                note_bad(w, i, 0, 0, 0, INFINITY);
        return;
    }
    for (int64_t i = 0; i < a->n; i++) {
        double g = a->got[i], v = a->want[i];
        if (g == v || (isnan(g) && isnan(v))) continue;
        if (o->exact || !isfinite(g) || !isfinite(v)) {
            note_bad(w, i, g, v, 0, INFINITY);
            continue;
        }
        double tol = a->tol[i] * k->tol_scale;
        if (a->dtype == CT_DTYPE_BF16) tol += bf16_ulp(fmax(fabs(g), fabs(v)));
        double diff = fabs(g - v);
        if (!(diff <= tol))
            note_bad(w, i, g, v, tol, tol > 0 ? diff / tol : INFINITY); /* NaN tol: bad */
    }
}

static void elem_str(char *buf, size_t cap, ct_dtype dt, const void *raw, int64_t i) {
    switch (dt) {
    case CT_DTYPE_I32: snprintf(buf, cap, "%d", ((const int32_t *)raw)[i]); break;
    case CT_DTYPE_I64: snprintf(buf, cap, "%lld", LL(((const int64_t *)raw)[i])); break;
    case CT_DTYPE_U8: snprintf(buf, cap, "0x%02x", ((const uint8_t *)raw)[i]); break;
    case CT_DTYPE_F64: snprintf(buf, cap, "%.17g", ((const double *)raw)[i]); break;
    default: snprintf(buf, cap, "?"); break;
    }
}

__attribute__((noreturn)) static void report(const check_ctx *k, const op_check *o, const op_arg *a,
                                             const worst *w, bool input) {
    fprintf(stderr,
            "cooktrain: check backend: op '%s' on %s differs from the CPU reference (op %lld; "
            "the %lld ops before it agreed)\n  arguments: %s\n",
            o->op, k->inner->iface->name, LL(k->ops_agreed + 1), LL(k->ops_agreed), o->shape);
    char got[64], want[64];
    if (is_float(a->dtype)) {
        snprintf(got, sizeof got, "%.9g", w->got);
        snprintf(want, sizeof want, "%.9g", w->want);
    } else {
        elem_str(got, sizeof got, a->dtype, a->got_raw, w->index);
        elem_str(want, sizeof want, a->dtype, a->want_raw, w->index);
    }
    if (input) {
        fprintf(stderr,
                "  input '%s' (%s, %lld elements) was changed by the op: element %lld was %s, "
                "is %s (%lld elements changed)\n",
                a->name, ct_dtype_name(a->dtype), LL(a->n), LL(w->index), want, got, LL(w->n_bad));
        fprintf(stderr, "hint: the op on %s writes into an operand it should only read\n",
                k->inner->iface->name);
    } else {
        char diff[96] = "not comparable (NaN or Inf on one side only)";
        if (o->exact && isfinite(w->got) && isfinite(w->want))
            snprintf(diff, sizeof diff, "must be equal (an exact op)");
        else if (isfinite(w->badness))
            snprintf(diff, sizeof diff, "|got - want| = %.3g > tolerance %.3g",
                     fabs(w->got - w->want), w->tol);
        else if (isfinite(w->got) && isfinite(w->want))
            snprintf(diff, sizeof diff, "|got - want| = %.3g > tolerance 0",
                     fabs(w->got - w->want));
        fprintf(stderr,
                "  output '%s' (%s, %lld elements): worst element %lld: got %s, want %s, %s; "
                "%lld of %lld elements beyond tolerance\n",
                a->name, ct_dtype_name(a->dtype), LL(a->n), LL(w->index), got, want, diff,
                LL(w->n_bad), LL(a->n));
        fprintf(stderr,
                "hint: the kernel of '%s' on %s is wrong for these arguments, or the tolerance "
                "is too tight for it: CT_CHECK_BACKEND_RTOL=10 scales every tolerance by 10\n",
                o->op, k->inner->iface->name);
    }
    fflush(stderr);
    exit(1);
}

/* Inputs that share no region with an output must come back unchanged. */
static void check_inputs_unchanged(check_ctx *k, op_check *o) {
    for (int r = 0; r < o->n_regions; r++) {
        region *g = &o->reg[r];
        bool written = false;
        for (int i = 0; i < o->n_args; i++)
            if (o->arg[i].region == r && (o->arg[i].role & ARG_OUT)) written = true;
        if (written) continue;
        size_t bytes = g->hi - g->lo;
        unsigned char *now = ct_xmalloc(bytes);
        INNER(k)->copy_to_host(INNER_CTX(k), now, (const void *)g->lo, bytes);
        if (memcmp(now, g->host, bytes) != 0) {
            for (int i = 0; i < o->n_args; i++) {
                op_arg *a = &o->arg[i];
                if (a->region != r) continue;
                size_t off = (uintptr_t)a->dev - g->lo, es = ct_dtype_size(a->dtype);
                worst w = {0};
                for (int64_t j = 0; j < a->n; j++)
                    if (memcmp(now + off + j * es, g->host + off + j * es, es))
                        note_bad(&w, j, 0, 0, 0, INFINITY);
                if (w.n_bad == 0) continue;
                if (is_float(a->dtype)) {
                    float *after = ct_check_to_f32(a->dtype, now + off, a->n);
                    w.got = after[w.index], w.want = a->x[w.index];
                    free(after);
                }
                a->got_raw = now + off; /* for the report of a non-float input */
                a->want_raw = (void *)a->before;
                report(k, o, a, &w, true);
            }
        }
        free(now);
    }
}

/* Compares, reports the first output beyond tolerance, frees everything (step 6 at the top). */
void ct_check_op_end(check_ctx *k, op_check *o) {
    check_inputs_unchanged(k, o);
    for (int i = 0; i < o->n_args; i++) {
        op_arg *a = &o->arg[i];
        if (a->region < 0 || !(a->role & ARG_OUT)) continue;
        worst w;
        compare_arg(k, o, a, &w);
        if (w.n_bad) report(k, o, a, &w, false);
    }
    k->ops_agreed++;
    for (int i = 0; i < o->n_args; i++) {
        op_arg *a = &o->arg[i];
        free(a->x), free(a->got_raw), free(a->want_raw), free(a->got), free(a->want), free(a->tol);
    }
    for (int r = 0; r < o->n_regions; r++) {
        free(o->reg[r].host);
        CPU(k)->free(CPU_CTX(k), o->reg[r].cpu);
    }
}

/* The CPU copy of inner's buffer `dev`: that of the listed buffer at the same address (one with
 * bytes, if several start there); NULL stays NULL. */
void *ct_check_cpu_buffer(const op_check *o, const void *dev) {
    if (!dev) return NULL;
    const op_arg *first = NULL;
    for (int i = 0; i < o->n_args; i++) {
        if (o->arg[i].dev != dev) continue;
        if (o->arg[i].region >= 0) return o->arg[i].cpu;
        if (!first) first = &o->arg[i];
    }
    CT_ASSERTF(first != NULL, "check backend: a buffer argument of '%s' is not in its list", o->op);
    return first->cpu;
}

/* ---- tolerance helpers -------------------------------------------------------------------------
 */

/* tol[i] += r·|x[i]| for n elements. */
void ct_check_tol_add_rel(float *tol, const float *x, double r, int64_t n) {
    for (int64_t i = 0; i < n; i++) tol[i] += (float)(r * fabs(x[i]));
}

/* acc(C) += Σ over N rows of |x(N, C)| */
void ct_check_sum_abs_rows(double *acc, const float *x, int64_t N, int64_t C) {
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < C; j++) acc[j] += fabs(x[i * C + j]);
}

/* A CPU buffer holding |values| of an f32 or bf16 operand (the sign bit cleared). */
void *ct_check_cpu_abs_copy(check_ctx *k, const op_arg *a) {
    size_t bytes = arg_bytes(a);
    if (!bytes) return a->cpu;
    unsigned char *h = ct_xmalloc(bytes);
    memcpy(h, a->before, bytes);
    for (int64_t i = 0; i < a->n; i++) {
        if (a->dtype == CT_DTYPE_F32)
            h[i * 4 + 3] &= 0x7f; /* little-endian: the sign is the top bit of the last byte */
        else
            h[i * 2 + 1] &= 0x7f;
    }
    void *p = CPU(k)->alloc(CPU_CTX(k), bytes);
    CT_ASSERTF(p != NULL, "check backend: out of host memory for %zu bytes", bytes);
    CPU(k)->copy_from_host(CPU_CTX(k), p, h, bytes);
    free(h);
    return p;
}

/* ---- pass-through slots ------------------------------------------------------------------------
 */

static void *check_alloc(void *ctx, size_t bytes) {
    check_ctx *k = ctx;
    return INNER(k)->alloc(INNER_CTX(k), bytes);
}

static void check_free(void *ctx, void *ptr) {
    check_ctx *k = ctx;
    INNER(k)->free(INNER_CTX(k), ptr);
}

static void check_copy_from_host(void *ctx, void *dst, const void *src, size_t bytes) {
    check_ctx *k = ctx;
    INNER(k)->copy_from_host(INNER_CTX(k), dst, src, bytes);
}

static void check_copy_to_host(void *ctx, void *dst, const void *src, size_t bytes) {
    check_ctx *k = ctx;
    INNER(k)->copy_to_host(INNER_CTX(k), dst, src, bytes);
}

static void check_event_record(void *ctx, int event) {
    check_ctx *k = ctx;
    INNER(k)->event_record(INNER_CTX(k), event);
}

static void check_event_wait(void *ctx, int event) {
    check_ctx *k = ctx;
    INNER(k)->event_wait(INNER_CTX(k), event);
}

static void check_mark(void *ctx, int64_t id) {
    check_ctx *k = ctx;
    INNER(k)->mark(INNER_CTX(k), id);
}

static void check_marks_read(void *ctx, int64_t n, double *times) {
    check_ctx *k = ctx;
    INNER(k)->marks_read(INNER_CTX(k), n, times);
}

static void check_sync(void *ctx) {
    check_ctx *k = ctx;
    INNER(k)->sync(INNER_CTX(k));
}

static double check_peak_flops(void *ctx, ct_dtype dt, char *how, size_t how_cap) {
    check_ctx *k = ctx;
    return INNER(k)->peak_flops(INNER_CTX(k), dt, how, how_cap);
}

static void check_describe(void *ctx, char *buf, size_t cap) {
    check_ctx *k = ctx;
    char what[96] = "";
    if (INNER(k)->describe) INNER(k)->describe(INNER_CTX(k), what, sizeof what);
    snprintf(buf, cap, "checked: %s", what[0] ? what : "against the CPU backend");
}

static void check_free_backend(void *ctx) {
    check_ctx *k = ctx;
    CPU(k)->free(CPU_CTX(k), k->dummy);
    ct_backend_free(k->cpu);
    ct_backend_free(k->inner);
    free(k);
}

/* ---- the table ------------------------------------------------------------------------------ */

/* Every slot; ct_backend_check_new clears those whose inner slot is NULL. The ops come from the
 * list: every required op of backend_ops.h has its ct_check_<op> in check_ops.c (an op without
 * one does not compile); optional ops stay NULL, so that their ct_ wrappers run the reference
 * composition instead and each op of it is checked on its own (gemm_bias_gelu: bias_init, gemm,
 * gelu_fwd); feature ops (cast_cols, attention_part_*) are checked, and stay NULL when inner
 * lacks them (below), so that the feature is refused as it would be without check mode. */
#define OP_SLOT_(...) CT_OP_SLOT(ct_check_, __VA_ARGS__)
static const struct ct_backend_i check_template = {
    .name = NULL, /* inner's: the backend is the same one, watched */
    .alloc = check_alloc,
    .free = check_free,
    .copy_from_host = check_copy_from_host,
    .copy_to_host = check_copy_to_host,
    .event_record = check_event_record,
    .event_wait = check_event_wait,
    .sync = check_sync,
    .mark = check_mark,
    .marks_read = check_marks_read,
    .peak_flops = check_peak_flops,
    .describe = check_describe,
    .free_backend = check_free_backend,
    CT_BACKEND_OPS(OP_SLOT_)};
#undef OP_SLOT_

ct_backend *ct_backend_check_new(ct_backend *inner) {
    CT_ASSERT(inner != NULL);
    const struct ct_backend_i *in = inner->iface;
    CT_ASSERTF(in->alloc && in->free && in->fill && in->copy_from_host && in->copy_to_host &&
                   in->copy,
               "backend %s lacks a memory slot", in->name);
    check_ctx *k = ct_xcalloc(1, sizeof *k);
    k->inner = inner;
    k->cpu = ct_backend_cpu_new(0);
    k->dummy = CPU(k)->alloc(CPU_CTX(k), 64);
    k->tol_scale = 1.0;
    const char *env = getenv("CT_CHECK_BACKEND_RTOL");
    if (env && env[0]) {
        char *end = NULL;
        double f = strtod(env, &end);
        if (*end || !(f > 0) || !isfinite(f))
            fprintf(stderr,
                    "cooktrain: ignoring CT_CHECK_BACKEND_RTOL='%s' (not a positive factor)\n",
                    env);
        else
            k->tol_scale = f;
    }

    k->iface = check_template;
    k->iface.name = in->name;
    /* optional ops are hidden (the template leaves them NULL) whatever inner has: for
     * gemm_bias_gelu the wrapper then runs bias_init, gemm and gelu_fwd, each checked here. */
#define KEEP_IF_INNER_HAS(slot)                                                                    \
    if (!in->slot) k->iface.slot = NULL
#define KEEP_OP_(name, need, queue, ...) KEEP_IF_INNER_HAS(name);
    CT_BACKEND_OPS(KEEP_OP_)
#undef KEEP_OP_
    KEEP_IF_INNER_HAS(event_record);
    KEEP_IF_INNER_HAS(mark);
    KEEP_IF_INNER_HAS(marks_read);
    KEEP_IF_INNER_HAS(event_wait);
    KEEP_IF_INNER_HAS(sync);
    KEEP_IF_INNER_HAS(peak_flops);
#undef KEEP_IF_INNER_HAS

    ct_backend *be = ct_xcalloc(1, sizeof *be);
    be->iface = &k->iface;
    be->ctx = k;
    ct_backend_apply_env(be);
    return be;
}
