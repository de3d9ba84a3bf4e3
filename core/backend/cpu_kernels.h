/*
 * cpu_kernels.h — what the CPU backend's files share (internal to core/backend/; backend.h is
 * the interface): its context, the tuning constants, the small vectorisable helpers, and the fp32
 * kernels. backend_cpu.c says how the backend works (determinism, exp, memory) and holds the
 * slots, which give each kernel its bf16 form; cpu_kernels.c holds the kernels of every op but
 * attention, cpu_attention.c the causal attention.
 */
#ifndef CT_CPU_KERNELS_H
#define CT_CPU_KERNELS_H

#include "backend.h"

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
    float *stage[N_STAGE]; /* bf16 operands widened to fp32 (backend_cpu.c, "bf16: the slots") */
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

/* ---- the fp32 kernels (cpu_kernels.c, cpu_attention.c): each slot of backend.h in fp32 ------ */

void *ct_cpu_alloc(void *ctx, size_t bytes);
void ct_cpu_free(void *ctx, void *ptr);
void ct_cpu_fill(void *ctx, void *dst, ct_dtype dtype, int64_t n, float value);
void ct_cpu_copy(void *ctx, void *dst, const void *src, size_t bytes);
/* The tiles of C that ct_cpu_gemm runs as single-threaded sgemms: n_row blocks of GEMM_ROW_BLOCK
 * rows by n_col pieces of `cols` columns (the last of each may be short). */
typedef struct gemm_tiling {
    int64_t n_row, n_col, cols;
} gemm_tiling;
gemm_tiling ct_cpu_gemm_tiles(int64_t M, int64_t N, int64_t K);
/* Every CPU GEMM: fp32 or bf16 A and B, fp32 or (with bf16 inputs) bf16 C, as cpu_gemm.h. */
void ct_cpu_gemm(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                 void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype);
void ct_cpu_bias_add(void *ctx, float *out, const float *bias, int64_t N, int64_t C);
void ct_cpu_bias_init(void *ctx, float *out, const float *bias, const float *residual, int64_t N,
                      int64_t C);
void ct_cpu_bias_grad(void *ctx, float *dbias, const float *dout, int64_t N, int64_t C);
void ct_cpu_axpy(void *ctx, float *dst, const float *src, float alpha, int64_t n);
void ct_cpu_scale(void *ctx, float *x, float s, int64_t n);
void ct_cpu_gather_rows(void *ctx, float *out, const float *in, const int32_t *idx, const float *w,
                        int64_t N, int64_t k, int64_t C);
void ct_cpu_gather_dot(void *ctx, float *out, const float *a, const int32_t *ia, const float *b,
                       const int32_t *ib, int64_t R, int64_t C);
void ct_cpu_embedding_fwd(void *ctx, ct_dtype dt, void *out, const int32_t *tokens,
                          const void *table, int64_t N, int64_t C, int64_t rows,
                          int64_t row_offset);
void ct_cpu_embedding_bwd(void *ctx, float *dtable, const float *dout, const int32_t *tokens,
                          int64_t N, int64_t C, int64_t rows, int64_t row_offset);
void ct_cpu_posemb_fwd(void *ctx, float *out, const float *wpe, int64_t B, int64_t T, int64_t C,
                       int64_t pos_offset);
void ct_cpu_posemb_bwd(void *ctx, float *dwpe, const float *dout, int64_t B, int64_t T, int64_t C,
                       int64_t pos_offset);
void ct_cpu_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int64_t N, int64_t C);
void ct_cpu_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd,
                          int64_t N, int64_t C);
void ct_cpu_gelu_fwd(void *ctx, float *out, const float *inp, int64_t n);
void ct_cpu_gelu_bwd(void *ctx, float *dinp, float *dbias, const float *inp, const float *dout,
                     int64_t N, int64_t C);
void ct_cpu_xent_rowmax(void *ctx, float *rowmax, const float *logits, int64_t N, int64_t V,
                        int64_t n_valid);
void ct_cpu_xent_sumexp(void *ctx, float *sumexp, float *target_logit, float *logits,
                        const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                        int64_t n_valid, int64_t col_offset, bool keep_exp);
void ct_cpu_xent_finish(void *ctx, float *losses, float *logits, const int32_t *targets,
                        const float *rowmax, const float *sumexp, const float *target_logit,
                        int64_t N, int64_t V, int64_t n_valid, int64_t col_offset, float dloss,
                        bool write_grad);
/* The same on bf16 logits (in place, a row at a time; values as the fp32 kernels compute them on
 * the widened row, rounded once where stored). */
void ct_cpu_xent_rowmax_bf16(void *ctx, float *rowmax, const uint16_t *logits, int64_t N, int64_t V,
                             int64_t n_valid);
void ct_cpu_xent_sumexp_bf16(void *ctx, float *sumexp, float *target_logit, uint16_t *logits,
                             const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                             int64_t n_valid, int64_t col_offset, bool keep_exp);
void ct_cpu_xent_finish_bf16(void *ctx, float *losses, uint16_t *logits, const int32_t *targets,
                             const float *rowmax, const float *sumexp, const float *target_logit,
                             int64_t N, int64_t V, int64_t n_valid, int64_t col_offset, float dloss,
                             bool write_grad);
void ct_cpu_adamw(void *ctx, float *param, const float *grad, float *m, float *v,
                  const ct_adamw_segment *segments, int n_segments, const ct_adamw_hparams *hp,
                  void *param_copy, ct_dtype copy_dtype);
void ct_cpu_sumsq(void *ctx, float *out, const float *const *x, const int64_t *n, int count);
void ct_cpu_cast(void *ctx, void *dst, ct_dtype dst_dtype, const void *src, ct_dtype src_dtype,
                 int64_t n);
void ct_cpu_cast_cols(void *ctx, void *dst, ct_dtype dst_dtype, int64_t ld_dst, const void *src,
                      ct_dtype src_dtype, int64_t ld_src, int64_t rows, int64_t cols);
void ct_cpu_attention_fwd(void *ctx, float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                          int64_t n_head, int64_t n_kv_head, int64_t hd);
void ct_cpu_attention_bwd(void *ctx, float *dqkv, float *dbias, const float *dout, const float *qkv,
                          const float *out, const float *lse, int64_t B, int64_t T, int64_t n_head,
                          int64_t n_kv_head, int64_t hd);
void ct_cpu_attention_part_fwd(void *ctx, float *o_acc, float *lse_acc, const float *qkv,
                               const float *kv, int64_t B, int64_t T, int64_t n_head,
                               int64_t n_kv_head, int64_t hd, int64_t chunks);
void ct_cpu_attention_part_bwd(void *ctx, float *dq_acc, float *dkv_acc, const float *dout,
                               const float *qkv, const float *out, const float *lse,
                               const float *kv, int64_t B, int64_t T, int64_t n_head,
                               int64_t n_kv_head, int64_t hd, int64_t chunks);
/* cpu_llama.c */
void ct_cpu_rmsnorm_fwd(void *ctx, float *out, float *rstd, const float *inp, const float *w,
                        int64_t N, int64_t C, float eps);
void ct_cpu_rmsnorm_bwd(void *ctx, float *dinp, float *dw, const float *dout, const float *inp,
                        const float *w, const float *rstd, int64_t N, int64_t C);
void ct_cpu_rope(void *ctx, float *x, const float *cos_sin, int64_t B, int64_t T,
                 int64_t n_rot_head, int64_t head_dim, int64_t ld, int64_t pos_offset,
                 bool inverse);
void ct_cpu_swiglu_fwd(void *ctx, float *out, const float *gate, const float *up, int64_t N,
                       int64_t H, int64_t ld);
void ct_cpu_swiglu_fwd_bf16(void *ctx, uint16_t *out, const uint16_t *gate, const uint16_t *up,
                            int64_t N, int64_t H, int64_t ld);
void ct_cpu_swiglu_bwd_bf16(void *ctx, uint16_t *dgate, uint16_t *dup, const uint16_t *gate,
                            const uint16_t *up, const uint16_t *dout, int64_t N, int64_t H,
                            int64_t ld);
void ct_cpu_swiglu_bwd(void *ctx, float *dgate, float *dup, const float *gate, const float *up,
                       const float *dout, int64_t N, int64_t H, int64_t ld);

#endif /* CT_CPU_KERNELS_H */
