/*
 * check_ops.h — what check mode's two files share (internal to core/backend/): backend_check.c is
 * the machinery (how an op is checked: snapshots, the CPU rerun, comparison, the report; read its
 * top comment first), check_ops.c the checker of each op of backend_ops.h — its buffers, its
 * shape string and its tolerance, derived in the comment above it.
 */
#ifndef CT_CHECK_OPS_H
#define CT_CHECK_OPS_H

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
 *     need the probabilities, as costly as the op itself): see ct_check_attention_bwd in
 * check_ops.c;
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

static inline bool is_float(ct_dtype dt) {
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16;
}

static inline size_t arg_bytes(const op_arg *a) {
    return a->dev && a->n > 0 ? (size_t)a->n * ct_dtype_size(a->dtype) : 0;
}

/* ---- the machinery (backend_check.c; steps 2, 4 and 6 of its top comment) ------------------ */

/* n values of an f32 or bf16 buffer as fp32 (a new allocation). */
float *ct_check_to_f32(ct_dtype dt, const void *p, int64_t n);
/* Snapshots every buffer from inner and uploads it to the CPU backend (step 2). */
void ct_check_op_begin(check_ctx *k, op_check *o);
/* Downloads both sides' outputs and the fp32 views (step 4). */
void ct_check_op_collect(check_ctx *k, op_check *o);
/* Compares, reports the first output beyond tolerance (and exits), frees everything (step 6). */
void ct_check_op_end(check_ctx *k, op_check *o);
/* The CPU copy of inner's buffer `dev`: that of the listed buffer at the same address; NULL stays
 * NULL. */
void *ct_check_cpu_buffer(const op_check *o, const void *dev);

/* ---- tolerance helpers ------------------------------------------------------------------------
 */

/* tol[i] += r·|x[i]| for n elements. */
void ct_check_tol_add_rel(float *tol, const float *x, double r, int64_t n);
/* acc(C) += the sum over N rows of |x(N, C)| */
void ct_check_sum_abs_rows(double *acc, const float *x, int64_t N, int64_t C);
/* A CPU buffer holding |values| of an f32 or bf16 operand (the sign bit cleared). */
void *ct_check_cpu_abs_copy(check_ctx *k, const op_arg *a);

/* ---- the forwarding, generated ------------------------------------------------------------------
 *
 * run_<op> for every op of backend_ops.h: steps 2-4 of backend_check.c's top comment — snapshots
 * (op_begin), the op on inner with the slot's own arguments, the op on the CPU backend with every
 * buffer argument replaced by its CPU copy, the results downloaded (op_collect). Buffer arguments
 * are the pointers to void, float and int32_t (backend memory, by the convention of the slots);
 * each must be one of the buffers the checker listed, found by address. Other pointers (adamw's
 * segments and hyperparameters: host memory) pass as they are. sumsq's checker, which runs one
 * call's ranges one by one on the CPU, calls the slots itself.
 */
#define CPU_BUF_(name) ct_check_cpu_buffer(o, (const void *)(uintptr_t)(name))
#define CPU_ARG_(type, name)                                                                       \
    _Generic((name),                                                                               \
        void *: CPU_BUF_(name),                                                                    \
        const void *: (const void *)CPU_BUF_(name),                                                \
        float *: (float *)CPU_BUF_(name),                                                          \
        const float *: (const float *)CPU_BUF_(name),                                              \
        const int32_t *: (const int32_t *)CPU_BUF_(name),                                          \
        default: (name))
#define RUN_OP_(name, need, queue, ...)                                                            \
    static inline void run_##name(check_ctx *k, op_check *o, CT_OP_PARAMS(__VA_ARGS__)) {          \
        ct_check_op_begin(k, o);                                                                   \
        INNER(k)->name(INNER_CTX(k), CT_OP_NAMES(__VA_ARGS__));                                    \
        CPU(k)->name(CPU_CTX(k), CT_PP_LIST(CPU_ARG_, __VA_ARGS__));                               \
        ct_check_op_collect(k, o);                                                                 \
    }
CT_BACKEND_OPS(RUN_OP_)
#undef RUN_OP_
#undef CPU_ARG_
#undef CPU_BUF_

/* The checker of every required and feature op (check_ops.c): the slots of check mode's table
 * (optional ops have none: check mode hides them, so that their compositions are checked). */
#define CHECK_DECL_(...) CT_OP_DECLARE(ct_check_, __VA_ARGS__)
CT_BACKEND_OPS(CHECK_DECL_)
#undef CHECK_DECL_

#endif /* CT_CHECK_OPS_H */
