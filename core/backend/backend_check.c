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
 * What one op slot does (check_<slot> below):
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
#include "backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tolerances ------------------------------------------------------------------------------
 *
 * Every tolerance is per element, in fp32 units, and bounds |got - want| (both sides computed in
 * fp32 arithmetic from the same input bytes; they differ only in the order and form of their
 * roundings). U = 2^-24 is fp32's unit roundoff: a correctly rounded operation is within U·|x|.
 *   - exact ops (fill, copy, cast, embedding_fwd, xent_rowmax, target_logit): no arithmetic, or
 *     a correctly rounded conversion: the bytes must be equal;
 *   - elementwise ops: ULPS·U relative to the magnitudes of the terms (a few roundings per side,
 *     possibly fused differently: FMA or not);
 *   - reductions of K terms (sums across rows, dot products, GEMM): a sum computed in any order is
 *     within (K-1)·U·Σ|terms| of the exact one (first order), so two sides differ by at most
 *     red_tol(K)·Σ|terms| with red_tol(K) = 2(K+1)·U. Σ|terms| comes from the data: for GEMM from
 *     a second CPU run on |A|, |B|, |C| with |alpha|, |beta| (which yields exactly
 *     |alpha|·Σ|a||b| + |beta||c|), for the others from host loops over the snapshots;
 *   - transcendentals (exp, log, sqrt, GELU) and composite ops (layernorm, attention,
 *     cross-entropy, AdamW): the bound propagated through the formula, derived at each slot;
 *   - attention backward is the one documented rtol/atol pair rather than a bound (a bound would
 *     need the probabilities, as costly as the op itself): see check_attention_bwd;
 *   - bf16 outputs: both sides round an fp32 value that meets the tolerance above to bf16; the
 *     two roundings may land on neighbouring values, one bf16 ulp apart (≤ 2^-7 relative), so one
 *     ulp of the larger value is added (ops that round nothing stay exact). bf16 inputs add
 *     nothing: both sides read the same bytes.
 * NaN or Inf on one side where the other is finite is a mismatch; NaN on both sides, or the same
 * infinity, agrees. CT_CHECK_BACKEND_RTOL=<factor> scales every tolerance except the exact ones
 * and the bf16 ulp (for a user chasing a near miss).
 */
#define U 0x1p-24
#define ULPS 4.0
#define BF16_U 0x1p-8 /* one rounding to bf16 (round to nearest), relative */

static inline double red_tol(int64_t K) {
    return 2.0 * (double)(K + 1) * U;
}

/* ---- an op's buffers --------------------------------------------------------------------------
 */

enum { MAX_ARGS = 8 };

typedef enum arg_role { ARG_IN = 1, ARG_OUT = 2, ARG_INOUT = ARG_IN | ARG_OUT } arg_role;

typedef struct op_arg {
    const char *name;
    const void *dev; /* inner's memory; NULL: not passed (the CPU rerun gets NULL too) */
    int64_t n;       /* elements the op may touch, from dev on */
    ct_dtype dtype;
    arg_role role;
    /* op_begin */
    int region;         /* index into op_check.reg, -1 for an empty or NULL buffer */
    const void *before; /* host: the bytes before the op (inside the region's snapshot) */
    void *cpu;          /* the CPU backend's copy (inside the region's CPU buffer) */
    /* op_collect; x for f32/bf16 buffers, the others for outputs */
    float *x;                 /* the values before the op, in fp32 */
    void *got_raw, *want_raw; /* the bytes after the op: inner's, the CPU's */
    float *got, *want;        /* the same in fp32 (f32/bf16 only) */
    float *tol;               /* per element, zeroed; the slot states it */
} op_arg;

/* One contiguous piece of inner's memory holding one or more (overlapping) buffers. */
typedef struct region {
    uintptr_t lo, hi;
    unsigned char *host; /* snapshot before the op */
    void *cpu;
} region;

typedef struct op_check {
    const char *op;
    char shape[256]; /* the slot's shape arguments, for the report */
    bool exact;      /* every output must be bitwise equal */
    int n_args;
    op_arg arg[MAX_ARGS];
    int n_regions;
    region reg[MAX_ARGS];
} op_check;

typedef struct check_ctx {
    ct_backend *inner, *cpu;
    struct ct_backend_i iface;
    int64_t ops_agreed; /* ops checked so far, all of which agreed */
    double tol_scale;   /* CT_CHECK_BACKEND_RTOL */
    void *dummy;        /* a CPU buffer for empty operands (never read) */
} check_ctx;

#define INNER(k) ((k)->inner->iface)
#define INNER_CTX(k) ((k)->inner->ctx)
#define CPU(k) ((k)->cpu->iface)
#define CPU_CTX(k) ((k)->cpu->ctx)
#define SHAPE(o, ...) snprintf((o)->shape, sizeof(o)->shape, __VA_ARGS__)
#define LL(x) ((long long)(x))

static bool is_float(ct_dtype dt) {
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16;
}

static size_t arg_bytes(const op_arg *a) {
    return a->dev && a->n > 0 ? (size_t)a->n * ct_dtype_size(a->dtype) : 0;
}

/* n values of an f32 or bf16 buffer as fp32 (a new allocation). */
static float *to_f32(ct_dtype dt, const void *p, int64_t n) {
    float *f = ct_xmalloc((size_t)CT_MAX(n, 1) * sizeof *f);
    if (dt == CT_DTYPE_F32)
        memcpy(f, p, (size_t)n * sizeof *f);
    else
        for (int64_t i = 0; i < n; i++) f[i] = ct_bf16_to_f32(((const uint16_t *)p)[i]);
    return f;
}

/* Snapshots every buffer from inner and uploads it to the CPU backend (step 2 at the top). */
static void op_begin(check_ctx *k, op_check *o) {
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
static void op_collect(check_ctx *k, op_check *o) {
    for (int i = 0; i < o->n_args; i++) {
        op_arg *a = &o->arg[i];
        if (a->region < 0) continue;
        if (is_float(a->dtype)) a->x = to_f32(a->dtype, a->before, a->n);
        if (!(a->role & ARG_OUT)) continue;
        size_t bytes = arg_bytes(a);
        a->got_raw = ct_xmalloc(bytes);
        a->want_raw = ct_xmalloc(bytes);
        INNER(k)->copy_to_host(INNER_CTX(k), a->got_raw, a->dev, bytes);
        CPU(k)->copy_to_host(CPU_CTX(k), a->want_raw, a->cpu, bytes);
        if (is_float(a->dtype)) {
            a->got = to_f32(a->dtype, a->got_raw, a->n);
            a->want = to_f32(a->dtype, a->want_raw, a->n);
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
                    float *after = to_f32(a->dtype, now + off, a->n);
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
static void op_end(check_ctx *k, op_check *o) {
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

/* ---- the forwarding, generated ------------------------------------------------------------------
 *
 * run_<op> for every op of backend_ops.h: steps 2-4 at the top — snapshots (op_begin), the op on
 * inner with the slot's own arguments, the op on the CPU backend with every buffer argument
 * replaced by its CPU copy, the results downloaded (op_collect). Buffer arguments are the
 * pointers to void, float and int32_t (backend memory, by the convention of the slots); each must
 * be one of the buffers the checker listed, found by address. Other pointers (adamw's segments
 * and hyperparameters: host memory) pass as they are. sumsq's checker, which runs one call's
 * ranges one by one on the CPU, calls the slots itself.
 */

/* The CPU copy of inner's buffer `dev`: that of the listed buffer at the same address (one with
 * bytes, if several start there); NULL stays NULL. */
static void *cpu_buffer(const op_check *o, const void *dev) {
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

#define CPU_ARG_(type, name)                                                                       \
    _Generic((name),                                                                               \
        void *: cpu_buffer(o, (const void *)(uintptr_t)(name)),                                    \
        const void *: (const void *)cpu_buffer(o, (const void *)(uintptr_t)(name)),                \
        float *: (float *)cpu_buffer(o, (const void *)(uintptr_t)(name)),                          \
        const float *: (const float *)cpu_buffer(o, (const void *)(uintptr_t)(name)),              \
        const int32_t *: (const int32_t *)cpu_buffer(o, (const void *)(uintptr_t)(name)),          \
        default: (name))
#define RUN_OP_(name, need, queue, ...)                                                            \
    static inline void run_##name(check_ctx *k, op_check *o, CT_OP_PARAMS(__VA_ARGS__)) {          \
        op_begin(k, o);                                                                            \
        INNER(k)->name(INNER_CTX(k), CT_OP_NAMES(__VA_ARGS__));                                    \
        CPU(k)->name(CPU_CTX(k), CT_PP_LIST(CPU_ARG_, __VA_ARGS__));                               \
        op_collect(k, o);                                                                          \
    }
CT_BACKEND_OPS(RUN_OP_)
#undef RUN_OP_
#undef CPU_ARG_

/* ---- tolerance helpers -------------------------------------------------------------------------
 */

/* tol[i] += r·|x[i]| for n elements. */
static void tol_add_rel(float *tol, const float *x, double r, int64_t n) {
    for (int64_t i = 0; i < n; i++) tol[i] += (float)(r * fabs(x[i]));
}

/* acc(C) += Σ over N rows of |x(N, C)| */
static void sum_abs_rows(double *acc, const float *x, int64_t N, int64_t C) {
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < C; j++) acc[j] += fabs(x[i * C + j]);
}

/* A CPU buffer holding |values| of an f32 or bf16 operand (the sign bit cleared). */
static void *cpu_abs_copy(check_ctx *k, const op_arg *a) {
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

/* ---- memory ops, checked: exact
 * ------------------------------------------------------------------
 */

static void check_fill(void *ctx, void *dst, ct_dtype dtype, int64_t n, float value) {
    check_ctx *k = ctx;
    op_check o = {
        .op = "fill", .exact = true, .n_args = 1, .arg = {{"dst", dst, n, dtype, ARG_OUT}}};
    SHAPE(&o, "dtype=%s n=%lld value=%.9g", ct_dtype_name(dtype), LL(n), value);
    run_fill(k, &o, dst, dtype, n, value);
    op_end(k, &o);
}

static void check_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    check_ctx *k = ctx;
    op_check o = {.op = "copy",
                  .exact = true,
                  .n_args = 2,
                  .arg = {{"dst", dst, (int64_t)bytes, CT_DTYPE_U8, ARG_OUT},
                          {"src", src, (int64_t)bytes, CT_DTYPE_U8, ARG_IN}}};
    SHAPE(&o, "bytes=%zu", bytes);
    run_copy(k, &o, dst, src, bytes);
    op_end(k, &o);
}

/* ---- GEMM, bias and vector ops ------------------------------------------------------------------
 */

/* Elements a row-major operand of `rows` rows, row stride ld, spans (cols per row). */
static int64_t strided_extent(int64_t rows, int64_t cols, int64_t ld) {
    return rows > 0 && cols > 0 ? (rows - 1) * ld + cols : 0;
}

/* C = alpha·op(A)·op(B) + beta·C, a reduction of K products per element: red_tol(K) relative to
 * |alpha|·Σ|a||b| + |beta||c| (the CPU run on absolute values), plus two roundings (alpha, the
 * beta·C add) per side: ULPS·U. bf16 A and B: products of bf16 values are exact in fp32. */
static void check_gemm(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                       float beta, void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    check_ctx *k = ctx;
    enum { MAT_A, MAT_B, MAT_C };
    int64_t nA = trans_a ? strided_extent(K, M, lda) : strided_extent(M, K, lda);
    int64_t nB = trans_b ? strided_extent(N, K, ldb) : strided_extent(K, N, ldb);
    op_check o = {
        .op = "gemm",
        .n_args = 3,
        .arg = {{"A", A, nA, ab_dtype, ARG_IN},
                {"B", B, nB, ab_dtype, ARG_IN},
                {"C", C, strided_extent(M, N, ldc), c_dtype, beta == 0.0f ? ARG_OUT : ARG_INOUT}}};
    SHAPE(&o,
          "trans_a=%d trans_b=%d M=%lld N=%lld K=%lld alpha=%.9g lda=%lld ldb=%lld beta=%.9g "
          "ldc=%lld ab_dtype=%s c_dtype=%s",
          trans_a, trans_b, LL(M), LL(N), LL(K), alpha, LL(lda), LL(ldb), beta, LL(ldc),
          ct_dtype_name(ab_dtype), ct_dtype_name(c_dtype));
    run_gemm(k, &o, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_dtype,
             c_dtype);
    op_arg *c = &o.arg[MAT_C];
    if (c->region >= 0) {
        void *a_abs = cpu_abs_copy(k, &o.arg[MAT_A]), *b_abs = cpu_abs_copy(k, &o.arg[MAT_B]);
        void *c_abs = cpu_abs_copy(k, c);
        CPU(k)->gemm(CPU_CTX(k), trans_a, trans_b, M, N, K, fabsf(alpha), a_abs, lda, b_abs, ldb,
                     fabsf(beta), c_abs, ldc, ab_dtype, c_dtype);
        void *mag_raw = ct_xmalloc(arg_bytes(c));
        CPU(k)->copy_to_host(CPU_CTX(k), mag_raw, c_abs, arg_bytes(c));
        float *mag = to_f32(c_dtype, mag_raw, c->n);
        tol_add_rel(c->tol, mag, red_tol(K), c->n);
        tol_add_rel(c->tol, c->want, ULPS * U, c->n);
        free(mag), free(mag_raw);
        if (a_abs != o.arg[MAT_A].cpu) CPU(k)->free(CPU_CTX(k), a_abs);
        if (b_abs != o.arg[MAT_B].cpu) CPU(k)->free(CPU_CTX(k), b_abs);
        CPU(k)->free(CPU_CTX(k), c_abs);
    }
    op_end(k, &o);
}

/* out += bias: one add per element, ULPS·U relative to the terms. */
static void check_bias_add(void *ctx, ct_dtype dt, void *out, const void *bias, int64_t N,
                           int64_t C) {
    check_ctx *k = ctx;
    enum { OUT, BIAS };
    op_check o = {.op = "bias_add",
                  .n_args = 2,
                  .arg = {{"out", out, N * C, dt, ARG_INOUT}, {"bias", bias, C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld", ct_dtype_name(dt), LL(N), LL(C));
    run_bias_add(k, &o, dt, out, bias, N, C);
    const op_arg *a = &o.arg[OUT], *b = &o.arg[BIAS];
    for (int64_t i = 0; i < N * C; i++)
        a->tol[i] = (float)(ULPS * U * (fabs(a->x[i]) + fabs(b->x[i % C])));
    op_end(k, &o);
}

/* out = bias (+ residual): at most one add per element. */
static void check_bias_init(void *ctx, ct_dtype dt, void *out, const void *bias,
                            const void *residual, int64_t N, int64_t C) {
    check_ctx *k = ctx;
    enum { OUT, BIAS, RESIDUAL };
    op_check o = {.op = "bias_init",
                  .n_args = 3,
                  .arg = {{"out", out, N * C, dt, ARG_OUT},
                          {"bias", bias, C, dt, ARG_IN},
                          {"residual", residual, N * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld residual=%s", ct_dtype_name(dt), LL(N), LL(C),
          residual ? "yes" : "NULL");
    run_bias_init(k, &o, dt, out, bias, residual, N, C);
    const op_arg *a = &o.arg[OUT], *b = &o.arg[BIAS], *r = &o.arg[RESIDUAL];
    for (int64_t i = 0; i < N * C; i++)
        a->tol[i] = (float)(ULPS * U * (fabs(b->x[i % C]) + (r->x ? fabs(r->x[i]) : 0.0)));
    op_end(k, &o);
}

/* dbias += Σ_rows dout: a reduction of N terms onto the accumulator. */
static void check_bias_grad(void *ctx, ct_dtype dt, float *dbias, const void *dout, int64_t N,
                            int64_t C) {
    check_ctx *k = ctx;
    enum { DBIAS, DOUT };
    op_check o = {
        .op = "bias_grad",
        .n_args = 2,
        .arg = {{"dbias", dbias, C, CT_DTYPE_F32, ARG_INOUT}, {"dout", dout, N * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld", ct_dtype_name(dt), LL(N), LL(C));
    run_bias_grad(k, &o, dt, dbias, dout, N, C);
    if (C > 0) {
        double *mag = ct_xcalloc((size_t)C, sizeof *mag);
        const op_arg *d = &o.arg[DBIAS];
        if (N > 0) sum_abs_rows(mag, o.arg[DOUT].x, N, C);
        for (int64_t j = 0; j < C; j++) d->tol[j] = (float)(red_tol(N) * (mag[j] + fabs(d->x[j])));
        free(mag);
    }
    op_end(k, &o);
}

/* dst += alpha·src: a multiply and an add, fused or not. */
static void check_axpy(void *ctx, ct_dtype dt, void *dst, const void *src, float alpha, int64_t n) {
    check_ctx *k = ctx;
    enum { DST, SRC };
    op_check o = {.op = "axpy",
                  .n_args = 2,
                  .arg = {{"dst", dst, n, dt, ARG_INOUT}, {"src", src, n, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s alpha=%.9g n=%lld", ct_dtype_name(dt), alpha, LL(n));
    run_axpy(k, &o, dt, dst, src, alpha, n);
    const op_arg *d = &o.arg[DST], *s = &o.arg[SRC];
    for (int64_t i = 0; i < n; i++)
        d->tol[i] = (float)(ULPS * U * (fabs(d->x[i]) + fabs((double)alpha * s->x[i])));
    op_end(k, &o);
}

static void check_scale(void *ctx, ct_dtype dt, void *x, float s, int64_t n) {
    check_ctx *k = ctx;
    op_check o = {.op = "scale", .n_args = 1, .arg = {{"x", x, n, dt, ARG_INOUT}}};
    SHAPE(&o, "dt=%s s=%.9g n=%lld", ct_dtype_name(dt), s, LL(n));
    run_scale(k, &o, dt, x, s, n);
    tol_add_rel(o.arg[0].tol, o.arg[0].want, ULPS * U, n);
    op_end(k, &o);
}

/* ---- embeddings ----------------------------------------------------------------------------- */

/* A row gather: exact. */
static void check_embedding_fwd(void *ctx, ct_dtype dt, void *out, const int32_t *tokens,
                                const void *table, int64_t N, int64_t C, int64_t rows,
                                int64_t row_offset) {
    check_ctx *k = ctx;
    op_check o = {.op = "embedding_fwd",
                  .exact = true,
                  .n_args = 3,
                  .arg = {{"out", out, N * C, dt, ARG_OUT},
                          {"tokens", tokens, N, CT_DTYPE_I32, ARG_IN},
                          {"table", table, rows * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld rows=%lld row_offset=%lld", ct_dtype_name(dt), LL(N), LL(C),
          LL(rows), LL(row_offset));
    run_embedding_fwd(k, &o, dt, out, tokens, table, N, C, rows, row_offset);
    op_end(k, &o);
}

/* dtable[row] += dout of each token of that row: a reduction over the row's tokens. */
static void check_embedding_bwd(void *ctx, ct_dtype dt, float *dtable, const void *dout,
                                const int32_t *tokens, int64_t N, int64_t C, int64_t rows,
                                int64_t row_offset) {
    check_ctx *k = ctx;
    enum { DTABLE, DOUT, TOKENS };
    op_check o = {.op = "embedding_bwd",
                  .n_args = 3,
                  .arg = {{"dtable", dtable, rows * C, CT_DTYPE_F32, ARG_INOUT},
                          {"dout", dout, N * C, dt, ARG_IN},
                          {"tokens", tokens, N, CT_DTYPE_I32, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld rows=%lld row_offset=%lld", ct_dtype_name(dt), LL(N), LL(C),
          LL(rows), LL(row_offset));
    run_embedding_bwd(k, &o, dt, dtable, dout, tokens, N, C, rows, row_offset);
    const op_arg *d = &o.arg[DTABLE];
    if (d->region >= 0) {
        double *mag = ct_xcalloc((size_t)(rows * C), sizeof *mag);
        int64_t *count = ct_xcalloc((size_t)rows, sizeof *count);
        const int32_t *tok = o.arg[TOKENS].before;
        for (int64_t i = 0; i < N; i++) {
            int64_t r = (int64_t)tok[i] - row_offset;
            if (r < 0 || r >= rows) continue;
            count[r]++;
            for (int64_t j = 0; j < C; j++) mag[r * C + j] += fabs(o.arg[DOUT].x[i * C + j]);
        }
        for (int64_t i = 0; i < rows * C; i++)
            d->tol[i] = (float)(red_tol(count[i / C]) * (mag[i] + fabs(d->x[i])));
        free(mag), free(count);
    }
    op_end(k, &o);
}

/* out(B,T,C) += wpe[pos_offset + t]: one add per element. wpe is read up to row pos_offset + T. */
static void check_posemb_fwd(void *ctx, ct_dtype dt, void *out, const void *wpe, int64_t B,
                             int64_t T, int64_t C, int64_t pos_offset) {
    check_ctx *k = ctx;
    enum { OUT, WPE };
    op_check o = {.op = "posemb_fwd",
                  .n_args = 2,
                  .arg = {{"out", out, B * T * C, dt, ARG_INOUT},
                          {"wpe", wpe, (pos_offset + T) * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s B=%lld T=%lld C=%lld pos_offset=%lld", ct_dtype_name(dt), LL(B), LL(T), LL(C),
          LL(pos_offset));
    run_posemb_fwd(k, &o, dt, out, wpe, B, T, C, pos_offset);
    const op_arg *a = &o.arg[OUT], *w = &o.arg[WPE];
    for (int64_t i = 0; i < B * T * C; i++) {
        int64_t t = i / C % T, j = i % C;
        a->tol[i] = (float)(ULPS * U * (fabs(a->x[i]) + fabs(w->x[(pos_offset + t) * C + j])));
    }
    op_end(k, &o);
}

/* dwpe[pos_offset + t] += Σ_b dout[b, t]: a reduction of B terms onto the accumulator. */
static void check_posemb_bwd(void *ctx, ct_dtype dt, float *dwpe, const void *dout, int64_t B,
                             int64_t T, int64_t C, int64_t pos_offset) {
    check_ctx *k = ctx;
    enum { DWPE, DOUT };
    op_check o = {.op = "posemb_bwd",
                  .n_args = 2,
                  .arg = {{"dwpe", dwpe, (pos_offset + T) * C, CT_DTYPE_F32, ARG_INOUT},
                          {"dout", dout, B * T * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s B=%lld T=%lld C=%lld pos_offset=%lld", ct_dtype_name(dt), LL(B), LL(T), LL(C),
          LL(pos_offset));
    run_posemb_bwd(k, &o, dt, dwpe, dout, B, T, C, pos_offset);
    const op_arg *d = &o.arg[DWPE];
    if (d->region >= 0) {
        int64_t n = (pos_offset + T) * C;
        double *mag = ct_xcalloc((size_t)n, sizeof *mag);
        for (int64_t b = 0; b < B; b++)
            sum_abs_rows(mag + pos_offset * C, o.arg[DOUT].x + b * T * C, 1, T * C);
        for (int64_t i = 0; i < n; i++) d->tol[i] = (float)(red_tol(B) * (mag[i] + fabs(d->x[i])));
        free(mag);
    }
    op_end(k, &o);
}

/* ---- layernorm ------------------------------------------------------------------------------ */

/*
 * mean = Σx/C: red_tol(C)·L with L = Σ|x|/C.
 * rstd = 1/sqrt(Σ(x - mean)²/C + eps): a sum of C non-negative terms (each with ~3 roundings),
 *   then sqrt and a divide: relative 2(C+8)·U; the mean's error δm ≤ red_tol(C)·L enters the
 *   variance only as δm², relative (δm·rstd)².
 * out = (x - mean)·rstd·w + b: the mean's error times rstd·|w|, the relative error of rstd times
 *   |n·w| (n = (x - mean)·rstd), and ULPS roundings of |n·w| + |b|.
 */
static void check_layernorm_fwd(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd,
                                const void *inp, const void *w, const void *b, int64_t N,
                                int64_t C) {
    check_ctx *k = ctx;
    enum { OUT, MEAN, RSTD, INP, W, B };
    op_check o = {.op = "layernorm_fwd",
                  .n_args = 6,
                  .arg = {{"out", out, N * C, dt, ARG_OUT},
                          {"mean", mean, N, CT_DTYPE_F32, ARG_OUT},
                          {"rstd", rstd, N, CT_DTYPE_F32, ARG_OUT},
                          {"inp", inp, N * C, dt, ARG_IN},
                          {"w", w, C, dt, ARG_IN},
                          {"b", b, C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld", ct_dtype_name(dt), LL(N), LL(C));
    run_layernorm_fwd(k, &o, dt, out, mean, rstd, inp, w, b, N, C);
    const float *x = o.arg[INP].x, *wf = o.arg[W].x, *bf = o.arg[B].x;
    const float *m = o.arg[MEAN].want, *s = o.arg[RSTD].want;
    for (int64_t i = 0; i < N && C > 0; i++) {
        double L = 0.0;
        for (int64_t j = 0; j < C; j++) L += fabs(x[i * C + j]);
        L /= (double)C;
        double dm = red_tol(C) * L, rel_s = 2.0 * (double)(C + 8) * U + (dm * s[i]) * (dm * s[i]);
        o.arg[MEAN].tol[i] = (float)dm;
        o.arg[RSTD].tol[i] = (float)(rel_s * fabs(s[i]));
        for (int64_t j = 0; j < C; j++) {
            double nw = fabs(((double)x[i * C + j] - m[i]) * s[i] * wf[j]);
            o.arg[OUT].tol[i * C + j] =
                (float)(dm * s[i] * fabs(wf[j]) + rel_s * nw + ULPS * U * (nw + fabs(bf[j])));
        }
    }
    op_end(k, &o);
}

/*
 * With n = (x - mean)·rstd and g = dout·w (mean and rstd are inputs here, the same on both sides):
 *   dinp += rstd·(g - Σg/C - n·Σ(g·n)/C): two reductions of C terms, red_tol(C + 3) relative to
 *           |dinp| + rstd·(|g| + Σ|g|/C + |n|·Σ|g·n|/C);
 *   dw   += Σ_rows dout·n: red_tol(N + 3) relative to |dw| + Σ|dout·n| (n has ~3 roundings);
 *   db   += Σ_rows dout:   red_tol(N) relative to |db| + Σ|dout|.
 */
static void check_layernorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, float *db,
                                const void *dout, const void *inp, const void *w, const float *mean,
                                const float *rstd, int64_t N, int64_t C) {
    check_ctx *k = ctx;
    enum { DINP, DW, DB, DOUT, INP, W, MEAN, RSTD };
    op_check o = {.op = "layernorm_bwd",
                  .n_args = 8,
                  .arg = {{"dinp", dinp, N * C, dt, ARG_INOUT},
                          {"dw", dw, C, CT_DTYPE_F32, ARG_INOUT},
                          {"db", db, C, CT_DTYPE_F32, ARG_INOUT},
                          {"dout", dout, N * C, dt, ARG_IN},
                          {"inp", inp, N * C, dt, ARG_IN},
                          {"w", w, C, dt, ARG_IN},
                          {"mean", mean, N, CT_DTYPE_F32, ARG_IN},
                          {"rstd", rstd, N, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld", ct_dtype_name(dt), LL(N), LL(C));
    run_layernorm_bwd(k, &o, dt, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    if (N > 0 && C > 0) {
        const float *d = o.arg[DOUT].x, *x = o.arg[INP].x, *wf = o.arg[W].x;
        const float *m = o.arg[MEAN].x, *s = o.arg[RSTD].x;
        double *mag_dw = ct_xcalloc((size_t)C, sizeof *mag_dw);
        double *mag_db = ct_xcalloc((size_t)C, sizeof *mag_db);
        for (int64_t i = 0; i < N; i++) {
            double A = 0.0, G = 0.0; /* Σ|g|/C, Σ|g·n|/C */
            for (int64_t j = 0; j < C; j++) {
                double n = ((double)x[i * C + j] - m[i]) * s[i], g = (double)d[i * C + j] * wf[j];
                A += fabs(g), G += fabs(g * n);
                mag_dw[j] += fabs(d[i * C + j] * n);
                mag_db[j] += fabs(d[i * C + j]);
            }
            A /= (double)C, G /= (double)C;
            for (int64_t j = 0; j < C; j++) {
                double n = ((double)x[i * C + j] - m[i]) * s[i], g = (double)d[i * C + j] * wf[j];
                double mag =
                    fabs(o.arg[DINP].x[i * C + j]) + fabs(s[i]) * (fabs(g) + A + fabs(n) * G);
                o.arg[DINP].tol[i * C + j] = (float)(red_tol(C + 3) * mag);
            }
        }
        for (int64_t j = 0; j < C; j++) {
            o.arg[DW].tol[j] = (float)(red_tol(N + 3) * (mag_dw[j] + fabs(o.arg[DW].x[j])));
            o.arg[DB].tol[j] = (float)(red_tol(N) * (mag_db[j] + fabs(o.arg[DB].x[j])));
        }
        free(mag_dw), free(mag_db);
    }
    op_end(k, &o);
}

/* ---- GELU ----------------------------------------------------------------------------------- */

/*
 * gelu(x) = x·σ(a), a = 2k(x + 0.044715x³) (k = sqrt(2/π)); the tanh form 0.5x(1 + tanh(a/2)) is
 * the same function. Error sources per side: a is computed with ~4 roundings (relative error
 * 4U·|a|), exp or tanh adds ~2 ulps, and σ's relative error is (1 - σ) times exp's, so gelu's
 * absolute error is ~|x|·σ(1-σ)·(|a| + 2)·4U plus a few roundings of the result; the tanh form
 * loses up to ~U·|x| absolute to the cancellation in 1 + tanh for negative x. Two sides, with
 * margin: 8U·(|gelu| + |x|·(1 + (|a| + 2)·σ(1-σ))).
 * gelu'(x) = σ + q with q = 2x·(da/dx / 2)·σ(1-σ): the same analysis, scaled by |dout|:
 *   8U·(|dinp| + |dout|·(1 + (|a| + 2)·(σ(1-σ) + |q|))).
 * gelu_bwd's dbias += Σ_rows dinp (before dinp's bf16 rounding): red_tol(N) relative to
 *   |dbias| + Σ|dinp|, plus the sum of the dinp tolerances of the column.
 */
#define GELU_K 0.7978845608028654
#define GELU_A 0.044715

static double gelu_arg(double x) {
    return 2.0 * GELU_K * (x + GELU_A * x * x * x);
}

static double sigmoid_slope(double a) { /* σ(a)·(1 - σ(a)) without overflow */
    double e = exp(-fabs(a));
    return e / ((1.0 + e) * (1.0 + e));
}

static void check_gelu_fwd(void *ctx, ct_dtype dt, void *out, const void *inp, int64_t n) {
    check_ctx *k = ctx;
    enum { OUT, INP };
    op_check o = {.op = "gelu_fwd",
                  .n_args = 2,
                  .arg = {{"out", out, n, dt, ARG_OUT}, {"inp", inp, n, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s n=%lld", ct_dtype_name(dt), LL(n));
    run_gelu_fwd(k, &o, dt, out, inp, n);
    for (int64_t i = 0; i < n; i++) {
        double x = o.arg[INP].x[i], a = gelu_arg(x);
        o.arg[OUT].tol[i] = (float)(8.0 * U *
                                    (fabs(o.arg[OUT].want[i]) +
                                     fabs(x) * (1.0 + (fabs(a) + 2.0) * sigmoid_slope(a))));
    }
    op_end(k, &o);
}

static void check_gelu_bwd(void *ctx, ct_dtype dt, void *dinp, float *dbias, const void *inp,
                           const void *dout, int64_t N, int64_t C) {
    check_ctx *k = ctx;
    enum { DINP, DBIAS, INP, DOUT };
    op_check o = {.op = "gelu_bwd",
                  .n_args = 4,
                  .arg = {{"dinp", dinp, N * C, dt, ARG_OUT},
                          {"dbias", dbias, C, CT_DTYPE_F32, ARG_INOUT},
                          {"inp", inp, N * C, dt, ARG_IN},
                          {"dout", dout, N * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld dbias=%s dinp%sdout", ct_dtype_name(dt), LL(N), LL(C),
          dbias ? "yes" : "NULL", dinp == dout ? "==" : "!=");
    run_gelu_bwd(k, &o, dt, dinp, dbias, inp, dout, N, C);
    const op_arg *di = &o.arg[DINP];
    for (int64_t i = 0; i < N * C; i++) {
        double x = o.arg[INP].x[i], a = gelu_arg(x), sl = sigmoid_slope(a);
        double q = 2.0 * x * GELU_K * (1.0 + 3.0 * GELU_A * x * x) * sl;
        di->tol[i] = (float)(8.0 * U *
                             (fabs(di->want[i]) +
                              fabs(o.arg[DOUT].x[i]) * (1.0 + (fabs(a) + 2.0) * (sl + fabs(q)))));
    }
    const op_arg *db = &o.arg[DBIAS];
    if (db->region >= 0) {
        double *mag = ct_xcalloc((size_t)C, sizeof *mag),
               *sum_tol = ct_xcalloc((size_t)C, sizeof *sum_tol);
        sum_abs_rows(mag, di->want, N, C);
        sum_abs_rows(sum_tol, di->tol, N, C);
        for (int64_t j = 0; j < C; j++)
            db->tol[j] = (float)(red_tol(N) * (mag[j] + fabs(db->x[j])) + sum_tol[j]);
        free(mag), free(sum_tol);
    }
    op_end(k, &o);
}

/* ---- attention ------------------------------------------------------------------------------ */

/* Per (batch, kv column) the largest |value| of the K or V part of a packed qkv, over t:
 * max[b·ckv + c] for the columns at `col0` of each row. */
static float *column_max(const float *qkv, int64_t B, int64_t T, int64_t lqkv, int64_t col0,
                         int64_t ckv) {
    float *mx = ct_xcalloc((size_t)CT_MAX(B * ckv, 1), sizeof *mx);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < ckv; c++) {
                float v = fabsf(qkv[(b * T + t) * lqkv + col0 + c]);
                if (v > mx[b * ckv + c]) mx[b * ckv + c] = v;
            }
    return mx;
}

/*
 * Row t of head h (kv head h / group) sees keys 0..t. Its scores s_j = scale·q·k_j are dot
 * products of hd terms, each within red_tol(hd)·scale·Σ|q_d||k_jd| ≤ δs = red_tol(hd)·scale·
 * Σ_d |q_d|·Kmax_d of the other side's (Kmax_d: the largest |k| of column d in the batch element).
 * Perturbing every score by ≤ δs moves lse by ≤ δs and each softmax weight p_j by ≤ 2δs·p_j;
 * the sum of t+1 exponentials adds red_tol(t + 1). So:
 *   lse: δs + red_tol(t + 1) + ULPS·U·|lse|;
 *   out_d = Σ_j p_j·v_jd: (2δs + 3·red_tol(t + 1))·Vmax_d + ULPS·U·|out| (Σ p_j = 1: the weight
 *         errors, the normalisation and the sum of t+1 products are each bounded by Vmax_d).
 * bf16: a backend may round the weights to bf16 for the product P·V (CUDA's tensor cores do, as
 * FlashAttention does), each within BF16_U = 2^-8 relative: BF16_U·Σ_j p_j·|v_jd| ≤ BF16_U·Vmax_d
 * more for out (lse is computed from the fp32 weights).
 */
static void check_attention_fwd(void *ctx, ct_dtype dt, void *out, float *lse, const void *qkv,
                                int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                                int64_t head_dim) {
    check_ctx *k = ctx;
    enum { OUT, LSE, QKV };
    const int64_t hd = head_dim, cq = n_head * hd, ckv = n_kv_head * hd, lqkv = cq + 2 * ckv;
    op_check o = {.op = "attention_fwd",
                  .n_args = 3,
                  .arg = {{"out", out, B * T * cq, dt, ARG_OUT},
                          {"lse", lse, B * n_head * T, CT_DTYPE_F32, ARG_OUT},
                          {"qkv", qkv, B * T * lqkv, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s B=%lld T=%lld n_head=%lld n_kv_head=%lld head_dim=%lld", ct_dtype_name(dt),
          LL(B), LL(T), LL(n_head), LL(n_kv_head), LL(hd));
    run_attention_fwd(k, &o, dt, out, lse, qkv, B, T, n_head, n_kv_head, hd);
    if (o.arg[OUT].region >= 0) {
        const float *x = o.arg[QKV].x;
        float *kmax = column_max(x, B, T, lqkv, cq, ckv),
              *vmax = column_max(x, B, T, lqkv, cq + ckv, ckv);
        const double scale = 1.0 / sqrt((double)hd);
        const int64_t group = n_head / n_kv_head;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < n_head; h++)
                for (int64_t t = 0; t < T; t++) {
                    const float *q = x + (b * T + t) * lqkv + h * hd;
                    const int64_t kv = b * ckv + (h / group) * hd;
                    double S = 0.0;
                    for (int64_t d = 0; d < hd; d++) S += fabs(q[d]) * kmax[kv + d];
                    double ds = red_tol(hd) * scale * S;
                    const double wr = dt == CT_DTYPE_BF16 ? BF16_U : 0.0; /* bf16 weights */
                    int64_t il = (b * n_head + h) * T + t;
                    o.arg[LSE].tol[il] =
                        (float)(ds + red_tol(t + 1) + ULPS * U * fabs(o.arg[LSE].want[il]));
                    for (int64_t d = 0; d < hd; d++) {
                        int64_t io = (b * T + t) * cq + h * hd + d;
                        o.arg[OUT].tol[io] =
                            (float)((2.0 * ds + 3.0 * red_tol(t + 1) + wr) * vmax[kv + d] +
                                    ULPS * U * fabs(o.arg[OUT].want[io]));
                    }
                }
        free(kmax), free(vmax);
    }
    op_end(k, &o);
}

/*
 * The one documented rtol/atol pair. A bound like the forward's would need every probability
 * (the op's own cost), so: dqkv's element i of head slice (batch b, part q/k/v, head h) within
 *   R·(|want_i| + M_slice),  R = 4·(T + hd + 8)·U,
 * M_slice the largest |want| of the slice: each gradient is a sum of at most T products of
 * softmax weights with dot products of hd terms (dV = Pᵀ·dO; dS = P ⊙ (dO·Vᵀ - D); dQ, dK =
 * scale·dS·K, dSᵀ·Q), so red_tol(T) + red_tol(hd) relative to the slice's magnitudes, doubled.
 * dbias += Σ_rows dqkv: red_tol(B·T) relative to |dbias| + Σ|dqkv|, plus the column's dqkv
 * tolerances. bf16: a backend may round P and dS to bf16 for their products (dV = Pᵀ·dO; dQ, dK:
 * CUDA's tensor cores), each term within BF16_U = 2^-8 relative; a gradient's terms add up in
 * absolute value to at most Σ_i p_ij ≤ 1 + ln T times the slice's scale (uniform weights 1/(i+1)
 * summed over the rows that see key j), so R grows by 2·(1 + ln T)·BF16_U, doubled as the rest.
 */
static void check_attention_bwd(void *ctx, ct_dtype dt, void *dqkv, float *dbias, const void *dout,
                                const void *qkv, const void *out, const float *lse, int64_t B,
                                int64_t T, int64_t n_head, int64_t n_kv_head, int64_t head_dim) {
    check_ctx *k = ctx;
    enum { DQKV, DBIAS, DOUT, QKV, OUT, LSE };
    const int64_t hd = head_dim, cq = n_head * hd, ckv = n_kv_head * hd, lqkv = cq + 2 * ckv;
    op_check o = {.op = "attention_bwd",
                  .n_args = 6,
                  .arg = {{"dqkv", dqkv, B * T * lqkv, dt, ARG_OUT},
                          {"dbias", dbias, lqkv, CT_DTYPE_F32, ARG_INOUT},
                          {"dout", dout, B * T * cq, dt, ARG_IN},
                          {"qkv", qkv, B * T * lqkv, dt, ARG_IN},
                          {"out", out, B * T * cq, dt, ARG_IN},
                          {"lse", lse, B * n_head * T, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s B=%lld T=%lld n_head=%lld n_kv_head=%lld head_dim=%lld dbias=%s",
          ct_dtype_name(dt), LL(B), LL(T), LL(n_head), LL(n_kv_head), LL(hd),
          dbias ? "yes" : "NULL");
    run_attention_bwd(k, &o, dt, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head, hd);
    const op_arg *dq = &o.arg[DQKV];
    if (dq->region >= 0 && hd > 0) {
        const double R = 4.0 * (double)(T + hd + 8) * U +
                         (dt == CT_DTYPE_BF16 ? 2.0 * (1.0 + log((double)T)) * BF16_U : 0.0);
        const int64_t n_slices = lqkv / hd; /* head slices per row: q heads, k heads, v heads */
        float *smax = ct_xcalloc((size_t)(B * n_slices), sizeof *smax);
        for (int64_t i = 0; i < B * T * lqkv; i++) {
            int64_t s = i / (T * lqkv) * n_slices + i % lqkv / hd;
            smax[s] = fmaxf(smax[s], fabsf(dq->want[i]));
        }
        for (int64_t i = 0; i < B * T * lqkv; i++)
            dq->tol[i] =
                (float)(R * (fabs(dq->want[i]) + smax[i / (T * lqkv) * n_slices + i % lqkv / hd]));
        free(smax);
        const op_arg *db = &o.arg[DBIAS];
        if (db->region >= 0) {
            double *mag = ct_xcalloc((size_t)lqkv, sizeof *mag);
            double *sum_tol = ct_xcalloc((size_t)lqkv, sizeof *sum_tol);
            sum_abs_rows(mag, dq->want, B * T, lqkv);
            sum_abs_rows(sum_tol, dq->tol, B * T, lqkv);
            for (int64_t j = 0; j < lqkv; j++)
                db->tol[j] = (float)(red_tol(B * T) * (mag[j] + fabs(db->x[j])) + sum_tol[j]);
            free(mag), free(sum_tol);
        }
    }
    op_end(k, &o);
}

/* ---- cross-entropy -------------------------------------------------------------------------- */

/* A maximum: exact. */
static void check_xent_rowmax(void *ctx, ct_dtype dt, float *rowmax, const void *logits, int64_t N,
                              int64_t V, int64_t n_valid) {
    check_ctx *k = ctx;
    op_check o = {.op = "xent_rowmax",
                  .exact = true,
                  .n_args = 2,
                  .arg = {{"rowmax", rowmax, N, CT_DTYPE_F32, ARG_OUT},
                          {"logits", logits, N * V, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld V=%lld n_valid=%lld", ct_dtype_name(dt), LL(N), LL(V), LL(n_valid));
    run_xent_rowmax(k, &o, dt, rowmax, logits, N, V, n_valid);
    op_end(k, &o);
}

/*
 * e_j = exp(x_j - rowmax): the subtraction rounds (relative U of |x_j - rowmax|, which exp turns
 * into a relative error U·|x_j - rowmax| of e_j), exp adds ~2 ulps: per side U·e_j·(|x_j - m| + 4).
 *   keep_exp logits: 2U·e_j·(|x_j - m| + 4) (exact past n_valid: untouched);
 *   sumexp: red_tol(n_valid)·Σe + 2U·Σ e_j·(|x_j - m| + 4);
 *   target_logit: a copy of one logit: exact (zero tolerance).
 */
static void check_xent_sumexp(void *ctx, ct_dtype dt, float *sumexp, float *target_logit,
                              void *logits, const int32_t *targets, const float *rowmax, int64_t N,
                              int64_t V, int64_t n_valid, int64_t col_offset, bool keep_exp) {
    check_ctx *k = ctx;
    enum { SUMEXP, TARGET_LOGIT, LOGITS, TARGETS, ROWMAX };
    op_check o = {.op = "xent_sumexp",
                  .n_args = 5,
                  .arg = {{"sumexp", sumexp, N, CT_DTYPE_F32, ARG_OUT},
                          {"target_logit", target_logit, N, CT_DTYPE_F32, ARG_OUT},
                          {"logits", logits, N * V, dt, keep_exp ? ARG_INOUT : ARG_IN},
                          {"targets", targets, N, CT_DTYPE_I32, ARG_IN},
                          {"rowmax", rowmax, N, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld V=%lld n_valid=%lld col_offset=%lld keep_exp=%d", ct_dtype_name(dt),
          LL(N), LL(V), LL(n_valid), LL(col_offset), keep_exp);
    run_xent_sumexp(k, &o, dt, sumexp, target_logit, logits, targets, rowmax, N, V, n_valid,
                    col_offset, keep_exp);
    const float *x = o.arg[LOGITS].x, *m = o.arg[ROWMAX].x;
    for (int64_t i = 0; i < N && o.arg[SUMEXP].region >= 0; i++) {
        double sum = 0.0, err = 0.0;
        for (int64_t j = 0; j < n_valid; j++) {
            double y = (double)x[i * V + j] - m[i], e = exp(y);
            sum += e, err += e * (fabs(y) + 4.0);
            if (keep_exp) o.arg[LOGITS].tol[i * V + j] = (float)(2.0 * U * e * (fabs(y) + 4.0));
        }
        o.arg[SUMEXP].tol[i] = (float)(red_tol(n_valid) * sum + 2.0 * U * err);
    }
    op_end(k, &o);
}

/*
 * losses = log(sumexp) + rowmax - target_logit: a log (~2 ulps) and two adds: ULPS·U·2 relative
 *   to |log(sumexp)| + |rowmax| + |target_logit|.
 * write_grad: logits_j = e_j·(dloss/sumexp) (- dloss at the target): a divide, a multiply and a
 *   subtract: ULPS·U·(|e_j·dloss/sumexp| + |result|), and ULPS·U·|dloss| at the target; padding
 *   columns are exactly 0.
 */
static void check_xent_finish(void *ctx, ct_dtype dt, float *losses, void *logits_to_grad,
                              const int32_t *targets, const float *rowmax, const float *sumexp,
                              const float *target_logit, int64_t N, int64_t V, int64_t n_valid,
                              int64_t col_offset, float dloss, bool write_grad) {
    check_ctx *k = ctx;
    enum { LOSSES, LOGITS, TARGETS, ROWMAX, SUMEXP, TARGET_LOGIT };
    op_check o = {.op = "xent_finish",
                  .n_args = 6,
                  .arg = {{"losses", losses, N, CT_DTYPE_F32, ARG_OUT},
                          {"logits", logits_to_grad, N * V, dt, write_grad ? ARG_INOUT : ARG_IN},
                          {"targets", targets, N, CT_DTYPE_I32, ARG_IN},
                          {"rowmax", rowmax, N, CT_DTYPE_F32, ARG_IN},
                          {"sumexp", sumexp, N, CT_DTYPE_F32, ARG_IN},
                          {"target_logit", target_logit, N, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld V=%lld n_valid=%lld col_offset=%lld dloss=%.9g write_grad=%d",
          ct_dtype_name(dt), LL(N), LL(V), LL(n_valid), LL(col_offset), dloss, write_grad);
    run_xent_finish(k, &o, dt, losses, logits_to_grad, targets, rowmax, sumexp, target_logit, N, V,
                    n_valid, col_offset, dloss, write_grad);
    const float *m = o.arg[ROWMAX].x, *se = o.arg[SUMEXP].x, *tl = o.arg[TARGET_LOGIT].x;
    const int32_t *tgt = o.arg[TARGETS].before;
    for (int64_t i = 0; i < N && o.arg[LOSSES].region >= 0; i++) {
        o.arg[LOSSES].tol[i] =
            (float)(2.0 * ULPS * U * (fabs(log(se[i])) + fabs(m[i]) + fabs(tl[i])));
        if (!write_grad) continue;
        const op_arg *l = &o.arg[LOGITS];
        double g = (double)dloss / se[i];
        for (int64_t j = 0; j < n_valid; j++)
            l->tol[i * V + j] =
                (float)(ULPS * U * (fabs(l->x[i * V + j] * g) + fabs(l->want[i * V + j])));
        int64_t t = (int64_t)tgt[i] - col_offset;
        if (t >= 0 && t < n_valid) l->tol[i * V + t] += (float)(ULPS * U * fabs(dloss));
    }
    op_end(k, &o);
}

/* ---- optimizer, norms, casts ---------------------------------------------------------------- */

/*
 * Per element (backend_cpu.c gives the exact operation order), with g = grad·grad_scale:
 *   m' = β1·m + (1-β1)·g:        ULPS·U·(|β1·m| + |(1-β1)·g|)
 *   v' = β2·v + (1-β2)·g²:       ULPS·U·v' (all terms non-negative)
 *   upd = m̂/(sqrt(v̂) + eps) + wd·p, m̂ = m'/bc1, v̂ = v'/bc2: the error of m' divided by the
 *         denominator, plus |m̂|/den times (half v's relative error + ~4 roundings), plus
 *         ULPS roundings of the terms;
 *   p' = p - lr·upd:             ULPS·U·(|p| + lr·|upd|) + lr·(upd's error).
 * param_copy holds p' in its dtype (bf16: rounded, one ulp at the comparison). Elements outside
 * the segments are untouched: exact.
 */
static void check_adamw(void *ctx, float *param, const float *grad, float *m, float *v,
                        const ct_adamw_segment *segments, int n_segments,
                        const ct_adamw_hparams *hp, void *param_copy, ct_dtype copy_dtype) {
    check_ctx *k = ctx;
    enum { PARAM, GRAD, M, V, PARAM_COPY };
    int64_t n = 0; /* the flat range ends at the last segment's end (the slot is not told more) */
    for (int s = 0; s < n_segments; s++) n = CT_MAX(n, segments[s].offset + segments[s].count);
    op_check o = {.op = "adamw",
                  .n_args = 5,
                  .arg = {{"param", param, n, CT_DTYPE_F32, ARG_INOUT},
                          {"grad", grad, n, CT_DTYPE_F32, ARG_IN},
                          {"m", m, n, CT_DTYPE_F32, ARG_INOUT},
                          {"v", v, n, CT_DTYPE_F32, ARG_INOUT},
                          {"param_copy", param_copy, n, copy_dtype, ARG_OUT}}};
    SHAPE(&o,
          "n_segments=%d (elements [0, %lld)) lr=%.9g beta1=%.9g beta2=%.9g eps=%.9g step=%lld "
          "grad_scale=%.9g param_copy=%s",
          n_segments, LL(n), hp->lr, hp->beta1, hp->beta2, hp->eps, LL(hp->step), hp->grad_scale,
          param_copy ? ct_dtype_name(copy_dtype) : "NULL");
    run_adamw(k, &o, param, grad, m, v, segments, n_segments, hp, param_copy, copy_dtype);
    const double b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, eps = hp->eps;
    const double bc1 = 1.0 - pow(b1, (double)hp->step), bc2 = 1.0 - pow(b2, (double)hp->step);
    for (int s = 0; s < n_segments && n > 0; s++) {
        const double wd = segments[s].weight_decay;
        for (int64_t i = segments[s].offset; i < segments[s].offset + segments[s].count; i++) {
            double p0 = o.arg[PARAM].x[i], g = (double)o.arg[GRAD].x[i] * hp->grad_scale;
            double tol_m = ULPS * U * (fabs(b1 * o.arg[M].x[i]) + fabs((1.0 - b1) * g));
            double v1 = o.arg[V].want[i], tol_v = ULPS * U * fabs(v1);
            double den = sqrt(fabs(v1) / bc2) + eps, ratio = fabs(o.arg[M].want[i] / bc1) / den;
            double d_upd = tol_m / bc1 / den + ratio * (0.5 * ULPS * U + 4.0 * U) +
                           ULPS * U * (ratio + fabs(wd * p0));
            double tol_p = ULPS * U * (fabs(p0) + lr * (ratio + fabs(wd * p0))) + lr * d_upd;
            o.arg[M].tol[i] = (float)tol_m;
            o.arg[V].tol[i] = (float)tol_v;
            o.arg[PARAM].tol[i] = (float)tol_p;
            if (o.arg[PARAM_COPY].tol) o.arg[PARAM_COPY].tol[i] = (float)tol_p;
        }
    }
    op_end(k, &o);
}

/* out[i] = Σ x_i² (in double on the CPU): a reduction of n_i non-negative terms, held to the fp32
 * rule red_tol(n_i)·out[i] (Σ|terms| = out[i]), so a backend may sum in fp32. The backend under
 * test runs all count ranges in one call, as the model makes it; the check is one per range
 * (an op_check holds a bounded number of arguments), every snapshot taken before that call. */
static void check_sumsq(void *ctx, float *out, const float *const *x, const int64_t *n, int count) {
    check_ctx *k = ctx;
    enum { OUT, X };
    op_check *o = ct_xcalloc((size_t)CT_MAX(count, 1), sizeof *o);
    for (int i = 0; i < count; i++) {
        o[i] = (op_check){.op = "sumsq",
                          .n_args = 2,
                          .arg = {{"out", out + i, 1, CT_DTYPE_F32, ARG_OUT},
                                  {"x", x[i], n[i], CT_DTYPE_F32, ARG_IN}}};
        SHAPE(&o[i], "range %d of %d, n=%lld", i, count, LL(n[i]));
        op_begin(k, &o[i]);
    }
    INNER(k)->sumsq(INNER_CTX(k), out, x, n, count);
    for (int i = 0; i < count; i++) {
        const float *cx = o[i].arg[X].cpu;
        CPU(k)->sumsq(CPU_CTX(k), o[i].arg[OUT].cpu, &cx, &n[i], 1);
        op_collect(k, &o[i]);
        tol_add_rel(o[i].arg[OUT].tol, o[i].arg[OUT].want, red_tol(n[i]), 1);
        op_end(k, &o[i]);
    }
    free(o);
}

/* f32 <-> bf16 round to nearest even, or a copy: exact. */
static void check_cast(void *ctx, void *dst, ct_dtype dst_dtype, const void *src,
                       ct_dtype src_dtype, int64_t n) {
    check_ctx *k = ctx;
    op_check o = {.op = "cast",
                  .exact = true,
                  .n_args = 2,
                  .arg = {{"dst", dst, n, dst_dtype, ARG_OUT}, {"src", src, n, src_dtype, ARG_IN}}};
    SHAPE(&o, "%s -> %s n=%lld", ct_dtype_name(src_dtype), ct_dtype_name(dst_dtype), LL(n));
    run_cast(k, &o, dst, dst_dtype, src, src_dtype, n);
    op_end(k, &o);
}

/* ---- the table ------------------------------------------------------------------------------ */

/* Every slot; ct_backend_check_new clears those whose inner slot is NULL. The ops come from the
 * list: every required op of backend_ops.h gets its check_<op> above (an op without one does not
 * compile); optional ops stay NULL, so that their ct_ wrappers run the reference composition
 * instead and each op of it is checked on its own (gemm_bias_gelu: bias_init, gemm, gelu_fwd). */
#define CHECK_SLOT_CT_OP_REQUIRED(name) .name = check_##name,
#define CHECK_SLOT_CT_OP_OPTIONAL(name)
#define OP_SLOT_(name, need, queue, ...) CHECK_SLOT_##need(name)
static const struct ct_backend_i check_template = {
    .name = NULL, /* inner's: the backend is the same one, watched */
    .alloc = check_alloc,
    .free = check_free,
    .copy_from_host = check_copy_from_host,
    .copy_to_host = check_copy_to_host,
    .event_record = check_event_record,
    .event_wait = check_event_wait,
    .sync = check_sync,
    .peak_flops = check_peak_flops,
    .describe = check_describe,
    .free_backend = check_free_backend,
    CT_BACKEND_OPS(OP_SLOT_)};
#undef OP_SLOT_
#undef CHECK_SLOT_CT_OP_REQUIRED
#undef CHECK_SLOT_CT_OP_OPTIONAL

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
