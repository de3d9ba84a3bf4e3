/*
 * cpu.h — what the CPU backend's files share (internal to core/backend/cpu/; backend.h is the
 * interface): its context, the tuning constants, the small vectorisable helpers, the staging of
 * bf16 operands through fp32, and the slot functions. backend_cpu.c says how the backend works
 * (determinism, exp, memory) and holds its table; each op family has its file, named as its CUDA
 * kernels' are in cuda/ (elementwise.c, embedding.c, moe_rows.c, norm.c, gelu.c, rope.c,
 * swiglu.c, attention.c, xent.c, adamw.c, gemm.c), with the fp32 kernel and the slot that gives
 * it its bf16 form.
 */
#ifndef CT_CPU_H
#define CT_CPU_H

#include "core/backend/backend.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
/* GCC keeps to 256-bit vectors on AVX-512 machines unless told otherwise; the compute-bound loops
 * here (exp, division) run up to ~2x faster with the full width. */
#pragma GCC target("prefer-vector-width=512")
#endif

enum {
    CHUNK_ROWS = 64,    /* rows per partial sum in reductions across rows */
    SUMSQ_CHUNK = 4096, /* elements per double partial in sumsq */
    LANES = 16,         /* accumulators of in-row sums */
    ATT_BLOCK = 16,     /* query rows per causal block in attention: smaller blocks skip more of the
                         * masked triangle, larger ones make bigger GEMMs; 16 was fastest of 8-128
                         * at T = 128 and 256 (hd 64), by 10-15% over 64 */
    PAR_MIN_WORK = 16384,          /* below this many elements an op runs on one thread */
    EW_BLOCK = 1024,               /* elements per block of an elementwise loop (4 KiB of floats) */
    GEMM_ROW_BLOCK = 256,          /* rows of C per single-threaded sgemm (cpu_gemm) */
    GEMM_MIN_TILES = 8,            /* fewer row blocks than this split C's columns too (cpu_gemm) */
    GEMM_MIN_COLS = 128,           /* ... into pieces no narrower than this */
    GEMM_SPLIT_MIN_MACS = 1 << 21, /* ... when it has at least this many multiply-adds */
};

enum { N_STAGE = 5 }; /* most operands of one op staged through fp32 (attention backward) */

typedef struct cpu_ctx {
    int n_threads;
    bool sgemm_onednn; /* fp32 GEMM tiles in oneDNN (else OpenBLAS): ct_backend_cpu_new */
    void *ws;          /* workspace, 64-byte aligned, ws_bytes long */
    size_t ws_bytes;
    float *stage[N_STAGE]; /* bf16 operands widened to fp32 (below, "bf16: the slots") */
    size_t stage_bytes[N_STAGE];
} cpu_ctx;

#define CT_PRAGMA(x) _Pragma(#x)
/* A static-schedule parallel loop over `nt` threads. The split never changes results
 * (backend_cpu.c, Determinism). */
#define PARALLEL_FOR(nt) CT_PRAGMA(omp parallel for schedule(static) num_threads(nt))

/* Threads for `work` elements: one when a parallel region would cost more than it saves. */
static inline int threads_for(const cpu_ctx *c, int64_t work) {
    return work < PAR_MIN_WORK ? 1 : c->n_threads;
}

static inline size_t round_up(size_t x, size_t to) {
    return (x + to - 1) / to * to;
}

/*
 * Software prefetch of the next `n` floats after `p` (up to `end`). Measured on the target VM: the
 * hardware prefetcher does not run far enough ahead of loops that do real arithmetic per element
 * (exp, division), which then stall on DRAM and run ~4x slower than from cache; touching the next
 * block one loop ahead restores streaming speed. Loops that only move data do not need it.
 */
static inline void prefetch_floats(const float *p, const float *end, int64_t n) {
    int64_t avail = end - p;
    if (n > avail) n = avail;
    for (int64_t j = 0; j < n; j += 16) __builtin_prefetch(p + j);
}

/* Prefetches `rows` rows of `width` floats at row stride `stride`: a head's slice of a (T,
 * heads·hd) tensor. Attention works through such slices one (batch, head) after the other; they
 * come from memory (tensors written or read long before), and the hardware prefetcher does not
 * follow the strided pattern, so each item prefetches the slices of the next one while it computes.
 */
static inline void prefetch_rows(const float *p, int64_t rows, int64_t stride, int64_t width) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < width; j += 16) __builtin_prefetch(p + r * stride + j);
}

/* The same for slices about to be written. */
static inline void prefetch_rows_w(float *p, int64_t rows, int64_t stride, int64_t width) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < width; j += 16) __builtin_prefetch(p + r * stride + j, 1);
}

/* The workspace, at least `bytes` long. Contents are not preserved across growth. */
void *ct_cpu_ws_get(cpu_ctx *c, size_t bytes);

/* ---- small numeric helpers ------------------------------------------------------------------ */

/* Fixed reduction tree over the 16 lane accumulators: the order never depends on the caller. */
static inline float lane_sum(const float acc[LANES]) {
    float a[8];
    for (int l = 0; l < 8; l++) a[l] = acc[l] + acc[l + 8];
    for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
    return (a[0] + a[2]) + (a[1] + a[3]);
}

/* 16 floats as one value (GCC/Clang vector extension; two AVX2 or one AVX-512 register). Used for
 * in-row sums whose lane order must be fixed: lane l always sums elements l, l+16, l+32, ...
 * Vectors are never passed by value between functions (that ABI depends on the target ISA):
 * LOAD16 reads 16 floats at any 4-byte alignment, vf16_sum takes a pointer. */
typedef float vf16 __attribute__((vector_size(64)));
typedef float vf16_unaligned __attribute__((vector_size(64), aligned(4), may_alias));
#define LOAD16(p) (*(const vf16_unaligned *)(p))

static inline float vf16_sum(const vf16 *v) {
    float a[LANES];
    memcpy(a, v, sizeof a);
    return lane_sum(a);
}

/* max of x[0..n) (-inf when n = 0) with 16 lane maxima in vector form (a compare and a bitwise
 * select), so it vectorises without -ffast-math under GCC and Clang alike; max is exact, so the
 * order does not matter for the value. NaNs are skipped here and propagate through the exp that
 * follows. */
typedef int32_t vi16 __attribute__((vector_size(64)));

static inline float row_max(const float *x, int64_t n) {
    vf16 m;
    for (int l = 0; l < LANES; l++) m[l] = -INFINITY;
    int64_t nv = n - n % LANES;
    for (int64_t j = 0; j < nv; j += LANES) {
        vf16 v = LOAD16(x + j);
        vi16 gt = v > m;
        m = (vf16)(((vi16)v & gt) | ((vi16)m & ~gt));
    }
    /* lanes combined as a tree (4 dependent steps instead of 16: rows in attention are short) */
    float a[LANES];
    memcpy(a, &m, sizeof a);
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) a[l] = a[l + w] > a[l] ? a[l + w] : a[l];
    float mx = a[0];
    for (int64_t j = nv; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

static inline float bits_to_f32(uint32_t u) {
    union {
        uint32_t u;
        float f;
    } x = {.u = u};
    return x.f;
}

static inline uint32_t f32_to_bits(float f) {
    union {
        float f;
        uint32_t u;
    } x = {.f = f};
    return x.u;
}

/*
 * exp(x) for the vectorised loops. x = n·ln2 + r with |r| <= ln2/2 (ln2 split in a short high
 * part, exact in float when multiplied by n, and a low correction), exp(r) by its Taylor series to
 * r^7 (truncation < 5e-9 relative, below float's 6e-8), times 2^n built in the exponent bits.
 * exp_clamped_f32 computes exp of x clamped to [-87, 88] (always finite and normal; NaN gives
 * e^-87) for callers whose formula is already right at the clamped ends; exp_f32 adds the edge
 * cases: inputs below -87 give 0 (true value < 1.7e-38, negligible in every sum we take), above
 * 88.7 +inf, NaN gives NaN.
 * Written with ternaries and a rounding constant instead of fminf/fmaxf/rintf: those do not
 * vectorise without -ffinite-math-only / -fno-trapping-math, which the build does not use.
 */
static inline float exp_clamped_f32(float x) {
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f;    /* 8 significant bits: n·ln2_hi is exact */
    const float ln2_lo = -2.12194440e-4f; /* ln2 - ln2_hi */
    const float round_k = 12582912.0f;    /* 1.5·2^23: adding it rounds to an integer */
    float xc = x > -87.0f ? x : -87.0f;   /* also maps NaN to a finite value: no UB below */
    xc = xc < 88.0f ? xc : 88.0f;
    float n = (xc * log2e + round_k) - round_k; /* nearest integer to x/ln2 */
    float r = fmaf(-n, ln2_hi, xc);
    r = fmaf(-n, ln2_lo, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    float scale = bits_to_f32((uint32_t)((int32_t)n + 127) << 23);
    return p * scale;
}

static inline float exp_f32(float x) {
    float y = exp_clamped_f32(x);
    y = x < -87.0f ? 0.0f : y;
    y = x > 88.7f ? INFINITY : y;
    y = x == x ? y : x; /* NaN in, NaN out (a NaN loss must reach the bad-step check) */
    return y;
}

/* ---- sums across rows, in a fixed order (backend_cpu.c, Determinism) ----------------------- */

/* Phase 1: dst(width) = the sum of n_rows rows (row stride ld) from rows, added in row order
 * (n_rows >= 1). */
void ct_cpu_sum_rows(float *dst, const float *rows, int64_t ld, int64_t n_rows, int64_t width);
/* Phase 2: dst(C) += the per-chunk partial sums (chunk ch at partial + ch·chunk_stride), added in
 * chunk order. Parallel over blocks of columns, which are independent. */
void ct_cpu_add_chunk_partials(cpu_ctx *c, float *dst, const float *partial, int64_t n_chunks,
                               int64_t C, int64_t chunk_stride);

/* ---- bf16: the slots ------------------------------------------------------------------------
 *
 * Each slot takes the storage dtype of its activations and parameters (backend.h). fp32 goes
 * straight to the kernel of its op file. bf16 runs the same kernel on fp32 copies: every bf16
 * operand is widened into a staging buffer (exact: a bf16 value is an fp32 value), the kernel runs
 * in fp32, and every output is rounded back to nearest even. So the bf16 path computes exactly
 * what the fp32 reference computes on the rounded inputs, rounded once at the end — the numerics
 * mixed precision promises (fp32 arithmetic and accumulation, bf16 storage) — at the price of one
 * extra pass over each operand. The exceptions: GEMMs (oneDNN reads bf16 directly,
 * gemm_onednn.h), SwiGLU (elementwise, read and written in place) and the cross-entropy (a row at
 * a time through a per-thread fp32 row).
 */

/* Staging buffer k, at least n floats. */
static inline float *stage_buf(cpu_ctx *c, int k, int64_t n) {
    size_t bytes = (size_t)CT_MAX(n, 1) * sizeof(float);
    if (bytes > c->stage_bytes[k]) {
        free(c->stage[k]);
        c->stage_bytes[k] = round_up(bytes, 64);
        c->stage[k] = aligned_alloc(64, c->stage_bytes[k]);
        CT_ASSERTF(c->stage[k] != NULL, "cpu backend: out of memory for a %zu-byte bf16 stage",
                   c->stage_bytes[k]);
    }
    return c->stage[k];
}

static inline void widen(cpu_ctx *c, float *dst, const uint16_t *src, int64_t n) {
    CT_PRAGMA(omp parallel for simd schedule(static) num_threads(threads_for(c, n)))
    for (int64_t i = 0; i < n; i++) dst[i] = ct_bf16_to_f32(src[i]);
}

static inline void narrow(cpu_ctx *c, uint16_t *dst, const float *src, int64_t n) {
    CT_PRAGMA(omp parallel for simd schedule(static) num_threads(threads_for(c, n)))
    for (int64_t i = 0; i < n; i++) dst[i] = ct_f32_to_bf16(src[i]);
}

/* An input operand as fp32: the pointer itself for f32, else widened into staging buffer k. */
static inline const float *in_f32(cpu_ctx *c, int k, ct_dtype dt, const void *p, int64_t n) {
    if (dt == CT_DTYPE_F32 || !p) return p;
    float *f = stage_buf(c, k, n);
    widen(c, f, p, n);
    return f;
}

/* An output operand as fp32: the pointer itself for f32, else staging buffer k — holding the
 * widened current values when the op reads them (accumulates or updates in place). */
static inline float *out_f32(cpu_ctx *c, int k, ct_dtype dt, void *p, int64_t n, bool reads) {
    if (dt == CT_DTYPE_F32) return p;
    float *f = stage_buf(c, k, n);
    if (reads) widen(c, f, p, n);
    return f;
}

/* Stores an output obtained from out_f32 (bf16: rounded to nearest even). */
static inline void out_done(cpu_ctx *c, ct_dtype dt, void *p, const float *f, int64_t n) {
    if (dt != CT_DTYPE_F32) narrow(c, p, f, n);
}

/* ---- GEMM tiles (gemm.c) -------------------------------------------------------------------- */

/* The tiles of C that ct_cpu_gemm runs as single-threaded GEMMs: n_row blocks of GEMM_ROW_BLOCK
 * rows by n_col pieces of `cols` columns (the last of each may be short). */
typedef struct gemm_tiling {
    int64_t n_row, n_col, cols;
} gemm_tiling;
gemm_tiling ct_cpu_gemm_tiles(int64_t M, int64_t N, int64_t K);

/* ---- the slots ------------------------------------------------------------------------------
 *
 * ct_cpu_<op> for every required and feature op of backend_ops.h, with the slot's parameters
 * (fp32 and bf16 as backend.h says); backend_cpu.c's table names them (CT_OP_SLOT). */
#define CT_CPU_DECL_(...) CT_OP_DECLARE(ct_cpu_, __VA_ARGS__)
CT_BACKEND_OPS(CT_CPU_DECL_)
#undef CT_CPU_DECL_

#endif /* CT_CPU_H */
