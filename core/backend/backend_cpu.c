/*
 * backend_cpu.c — the CPU backend: every slot of struct ct_backend_i, for fp32 and bf16 (see
 * "bf16: the slots" near the end). It is the numerical reference the other backends are tested
 * against, and it is meant to be fast on a few cores:
 *   - fp32 GEMMs go to OpenBLAS (cblas_sgemm, row-major, transposes passed as flags), bf16 GEMMs
 *     to oneDNN's matmul (cpu_gemm.h: AMX or AVX512-BF16 kernels, fp32 accumulation);
 *   - every other op is an OpenMP loop over rows / elements with vectorisable inner loops;
 *   - one thread pool: OpenMP for our loops and the OpenMP build of OpenBLAS. A cblas call made
 *     inside one of our parallel regions runs single-threaded, which is what attention wants.
 *
 * Determinism: results are bit-identical for any thread count. Work is split over threads only
 * along dimensions whose elements are computed independently; every reduction runs in an order
 * fixed by the data shape alone:
 *   - sums inside a row (layernorm, softmax, cross-entropy) use 16 lane accumulators combined by
 *     a fixed tree (lane_sum), so they do not depend on vectoriser peeling or on alignment;
 *   - sums across rows (bias_grad, layernorm_bwd dw/db, gelu_bwd's dbias) use chunks of
 *     CHUNK_ROWS rows whose partials are combined in chunk order (add_chunk_partials); sumsq uses
 *     chunks of SUMSQ_CHUNK elements in double;
 *   - posemb_bwd sums the batch in order for each position; embedding_bwd is parallel over
 *     channel blocks and adds tokens in order (no atomics);
 *   - attention is parallel over (batch, head) — over (batch, kv head) in backward, where the
 *     query heads of a group are visited in order and accumulate into the shared dk/dv.
 *
 * Transcendentals: expf/tanhf from libm do not vectorise without -ffast-math, so exp_f32 below is
 * a small vectorisable exp (Cody–Waite reduction + degree-7 Taylor polynomial, about 1 ulp over
 * the range that matters) used by softmax, cross-entropy and GELU (written with the logistic
 * function, which equals the tanh form and keeps its accuracy for negative inputs).
 *
 * Memory: on a few cores most non-GEMM ops are bound by memory bandwidth (~24 GB/s on the
 * development VM), so the ops are shaped to touch each tensor as few times as possible: linear
 * outputs start as bias (+ residual) and the GEMM accumulates (bias_init), gelu_bwd sums the bias
 * gradient of the layer before it, the cross-entropy keeps its exponentials for the gradient, and
 * attention prefetches the next head's slices. Explicit AVX-512 appears only where the compiler
 * cannot find it (a 16x16 transpose), with a plain-C path beside it.
 *
 * The context keeps one workspace (partial sums, attention scratch), grown on demand and owned by
 * the backend; it is not counted in the per-category accounting of backend.c. Ops on one backend
 * must be issued from one thread at a time.
 */
#include "backend.h"

#include <cblas.h>

#include "cpu_gemm.h"
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

/* Provided by OpenBLAS (declared in its cblas.h as well; repeated here for older headers). */
void openblas_set_num_threads(int num_threads);

enum {
    CHUNK_ROWS = 64,    /* rows per partial sum in reductions across rows */
    SUMSQ_CHUNK = 4096, /* elements per double partial in sumsq */
    LANES = 16,         /* accumulators of in-row sums */
    ATT_BLOCK = 16,     /* query rows per causal block in attention: smaller blocks skip more of the
                         * masked triangle, larger ones make bigger GEMMs; 16 was fastest of 8-128
                         * at T = 128 and 256 (hd 64), by 10-15% over 64 */
    PAR_MIN_WORK = 16384, /* below this many elements an op runs on one thread */
    EW_BLOCK = 1024,      /* elements per block of an elementwise loop (4 KiB of floats) */
    GEMM_ROW_BLOCK = 256, /* rows of C per single-threaded sgemm (cpu_gemm) */
};

enum { N_STAGE = 5 }; /* most operands of one op staged through fp32 (attention backward) */

typedef struct cpu_ctx {
    int n_threads;
    void *ws; /* workspace, 64-byte aligned, ws_bytes long */
    size_t ws_bytes;
    float *stage[N_STAGE]; /* bf16 operands widened to fp32 (see "bf16" below) */
    size_t stage_bytes[N_STAGE];
} cpu_ctx;

#define CT_PRAGMA(x) _Pragma(#x)
/* A static-schedule parallel loop over `nt` threads. The split never changes results (see top). */
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
static void *ws_get(cpu_ctx *c, size_t bytes) {
    if (bytes > c->ws_bytes) {
        free(c->ws);
        c->ws_bytes = round_up(bytes, 64);
        c->ws = aligned_alloc(64, c->ws_bytes);
        CT_ASSERTF(c->ws != NULL, "cpu backend: out of memory for a %zu-byte workspace",
                   c->ws_bytes);
    }
    return c->ws;
}

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

/* ---- memory ------------------------------------------------------------------------------- */

static void *cpu_alloc(void *ctx, size_t bytes) {
    /* 64-byte alignment (a cache line, a full AVX-512 vector); not zeroed: callers fill. */
    return aligned_alloc(64, round_up(bytes ? bytes : 1, 64));
}

static void cpu_free(void *ctx, void *ptr) {
    free(ptr);
}

static void cpu_fill(void *ctx, void *dst, ct_dtype dtype, int64_t n, float value) {
    cpu_ctx *c = ctx;
    int nt = threads_for(c, n);
    switch (dtype) {
    case CT_DTYPE_F32: {
        float *d = dst;
        PARALLEL_FOR(nt)
        for (int64_t i = 0; i < n; i++) d[i] = value;
        break;
    }
    case CT_DTYPE_BF16: {
        uint16_t *d = dst, h = ct_f32_to_bf16(value);
        PARALLEL_FOR(nt)
        for (int64_t i = 0; i < n; i++) d[i] = h;
        break;
    }
    case CT_DTYPE_I32: {
        int32_t *d = dst, x = (int32_t)value;
        PARALLEL_FOR(nt)
        for (int64_t i = 0; i < n; i++) d[i] = x;
        break;
    }
    case CT_DTYPE_I64: {
        int64_t *d = dst, x = (int64_t)value;
        PARALLEL_FOR(nt)
        for (int64_t i = 0; i < n; i++) d[i] = x;
        break;
    }
    case CT_DTYPE_U8: memset(dst, (uint8_t)(int)value, (size_t)n); break;
    case CT_DTYPE_F64: {
        double *d = dst;
        PARALLEL_FOR(nt)
        for (int64_t i = 0; i < n; i++) d[i] = value;
        break;
    }
    }
}

/* Large copies are split into 1 MiB pieces so both cores pull on memory bandwidth. */
static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    cpu_ctx *c = ctx;
    const size_t piece = (size_t)1 << 20;
    if (bytes < 4 * piece) {
        memcpy(dst, src, bytes);
        return;
    }
    int64_t n_pieces = (int64_t)((bytes + piece - 1) / piece);
    PARALLEL_FOR(c->n_threads)
    for (int64_t p = 0; p < n_pieces; p++) {
        size_t off = (size_t)p * piece;
        memcpy((char *)dst + off, (const char *)src + off, CT_MIN(piece, bytes - off));
    }
}

/* ---- GEMM --------------------------------------------------------------------------------- */

static void cpu_gemm(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                     float beta, float *C, int64_t ldc) {
    cpu_ctx *c = ctx;
    if (M == 0 || N == 0) return;
    CT_ASSERTF(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && lda <= INT32_MAX &&
                   ldb <= INT32_MAX && ldc <= INT32_MAX,
               "cpu gemm: %lld x %lld x %lld exceeds the 32-bit BLAS interface", (long long)M,
               (long long)N, (long long)K);
    if (K == 0) {
        /* op(A)·op(B) is empty: C = beta·C, with beta = 0 meaning "overwrite" as in BLAS */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    /* Rows of C in fixed blocks, each one single-threaded sgemm (OpenBLAS runs single-threaded
     * inside our parallel region), the blocks spread over the threads. OpenBLAS's own threading
     * splits C by the thread count, and its kernels treat the edge rows and columns of a piece
     * with other micro-kernels whose sums run in another order: measured on an EPYC where it
     * picks its Haswell kernels, 1 and 3 threads disagreed in 10% of the elements of a
     * 333x517x200 product. With blocks fixed by the shape alone, every element's sum is the
     * same for any thread count (the top of this file). Each block re-packs op(B), which costs
     * ~1/GEMM_ROW_BLOCK of its arithmetic. */
    const int64_t n_blocks = (M + GEMM_ROW_BLOCK - 1) / GEMM_ROW_BLOCK;
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans,
                          tb = trans_b ? CblasTrans : CblasNoTrans;
    CT_PRAGMA(omp parallel for schedule(static) num_threads(CT_MIN(c->n_threads, n_blocks)))
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        const int64_t i0 = blk * GEMM_ROW_BLOCK, rows = CT_MIN(GEMM_ROW_BLOCK, M - i0);
        /* row i of op(A) is row i of A, or column i of A when transposed */
        const float *a = trans_a ? A + i0 : A + i0 * lda;
        cblas_sgemm(CblasRowMajor, ta, tb, (int)rows, (int)N, (int)K, alpha, a, (int)lda, B,
                    (int)ldb, beta, C + i0 * ldc, (int)ldc);
    }
}

/* ---- elementwise and bias ------------------------------------------------------------------ */

static void cpu_bias_add(void *ctx, float *out, const float *bias, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t i = 0; i < N; i++) {
        float *o = out + i * C;
#pragma omp simd
        for (int64_t j = 0; j < C; j++) o[j] += bias[j];
    }
}

static void cpu_bias_init(void *ctx, float *out, const float *bias, const float *residual,
                          int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t i = 0; i < N; i++) {
        float *o = out + i * C;
        if (residual) {
            const float *r = residual + i * C;
#pragma omp simd
            for (int64_t j = 0; j < C; j++) o[j] = r[j] + bias[j];
        } else {
            memcpy(o, bias, (size_t)C * sizeof(float));
        }
    }
}

/* Phase 1 of the sums across rows: dst(width) = Σ of n_rows rows (row stride ld) starting at rows,
 * added in row order (n_rows ≥ 1). */
static void sum_rows(float *dst, const float *rows, int64_t ld, int64_t n_rows, int64_t width) {
    memcpy(dst, rows, (size_t)width * sizeof(float));
    for (int64_t r = 1; r < n_rows; r++) {
        const float *row = rows + r * ld;
#pragma omp simd
        for (int64_t j = 0; j < width; j++) dst[j] += row[j];
    }
}

/* Phase 2 of the sums across rows: dst(C) += the per-chunk partial sums (chunk ch at
 * partial + ch·chunk_stride), added in chunk order. Parallel over blocks of columns, which are
 * independent. */
static void add_chunk_partials(cpu_ctx *c, float *dst, const float *partial, int64_t n_chunks,
                               int64_t C, int64_t chunk_stride) {
    const int64_t cb = 256;
    int64_t n_cb = (C + cb - 1) / cb;
    PARALLEL_FOR(threads_for(c, n_chunks * C))
    for (int64_t blk = 0; blk < n_cb; blk++) {
        int64_t j0 = blk * cb, j1 = CT_MIN(j0 + cb, C);
        float acc[256];
        for (int64_t j = j0; j < j1; j++) acc[j - j0] = partial[j];
        for (int64_t ch = 1; ch < n_chunks; ch++) {
            const float *p = partial + ch * chunk_stride;
#pragma omp simd
            for (int64_t j = j0; j < j1; j++) acc[j - j0] += p[j];
        }
        for (int64_t j = j0; j < j1; j++) dst[j] += acc[j - j0];
    }
}

/* Sums row chunks of dout into partial[chunk][C] (phase 1), then adds the partials to dbias in
 * chunk order (phase 2). Chunk boundaries depend on N only, so the thread count cannot change the
 * result. */
static void cpu_bias_grad(void *ctx, float *dbias, const float *dout, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    int64_t n_chunks = (N + CHUNK_ROWS - 1) / CHUNK_ROWS;
    if (n_chunks == 0) return;
    float *partial = ws_get(c, (size_t)n_chunks * (size_t)C * sizeof(float)); /* (n_chunks, C) */
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        int64_t r0 = ch * CHUNK_ROWS, r1 = CT_MIN(r0 + CHUNK_ROWS, N);
        sum_rows(partial + ch * C, dout + r0 * C, C, r1 - r0, C);
    }
    add_chunk_partials(c, dbias, partial, n_chunks, C, C);
}

static void cpu_axpy(void *ctx, float *dst, const float *src, float alpha, int64_t n) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, n))
    for (int64_t i = 0; i < n; i++) dst[i] += alpha * src[i];
}

static void cpu_scale(void *ctx, float *x, float s, int64_t n) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, n))
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* ---- embeddings --------------------------------------------------------------------------- */

/* A row gather: no arithmetic, so it is the slot for both dtypes (f32 and bf16 rows are copied
 * as they are). */
static void cpu_embedding_fwd(void *ctx, ct_dtype dt, void *out, const int32_t *tokens,
                              const void *table, int64_t N, int64_t C, int64_t rows,
                              int64_t row_offset) {
    cpu_ctx *c = ctx;
    const size_t row_bytes = (size_t)C * ct_dtype_size(dt);
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t i = 0; i < N; i++) {
        int64_t r = (int64_t)tokens[i] - row_offset;
        char *o = (char *)out + (size_t)i * row_bytes;
        if (r >= 0 && r < rows)
            memcpy(o, (const char *)table + (size_t)r * row_bytes, row_bytes);
        else
            memset(o, 0, row_bytes); /* another shard's token */
    }
}

/* Parallel over channel blocks; every thread walks all tokens in order, so each dtable element
 * receives its contributions in token order whatever the number of threads (no atomics). */
static void cpu_embedding_bwd(void *ctx, float *dtable, const float *dout, const int32_t *tokens,
                              int64_t N, int64_t C, int64_t rows, int64_t row_offset) {
    cpu_ctx *c = ctx;
    if (C == 0) return;
    int nt = threads_for(c, N * C);
    /* Blocks of whole cache lines so two threads never write the same line of dtable. */
    int64_t cb = round_up((size_t)((C + nt - 1) / nt), 16);
    int64_t n_cb = (C + cb - 1) / cb;
    PARALLEL_FOR(nt)
    for (int64_t blk = 0; blk < n_cb; blk++) {
        int64_t j0 = blk * cb, j1 = CT_MIN(j0 + cb, C);
        for (int64_t i = 0; i < N; i++) {
            int64_t r = (int64_t)tokens[i] - row_offset;
            if (r < 0 || r >= rows) continue;
            float *dst = dtable + r * C;
            const float *src = dout + i * C;
#pragma omp simd
            for (int64_t j = j0; j < j1; j++) dst[j] += src[j];
        }
    }
}

static void cpu_posemb_fwd(void *ctx, float *out, const float *wpe, int64_t B, int64_t T, int64_t C,
                           int64_t pos_offset) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, B * T * C))
    for (int64_t bt = 0; bt < B * T; bt++) {
        float *o = out + bt * C;
        const float *w = wpe + (pos_offset + bt % T) * C;
#pragma omp simd
        for (int64_t j = 0; j < C; j++) o[j] += w[j];
    }
}

/* Each position's sum over the batch is taken in batch order by one thread, then added. */
static void cpu_posemb_bwd(void *ctx, float *dwpe, const float *dout, int64_t B, int64_t T,
                           int64_t C, int64_t pos_offset) {
    cpu_ctx *c = ctx;
    if (B == 0) return;
    PARALLEL_FOR(threads_for(c, B * T * C))
    for (int64_t t = 0; t < T; t++) {
        float *dst = dwpe + (pos_offset + t) * C;
        for (int64_t j0 = 0; j0 < C; j0 += 256) {
            int64_t len = CT_MIN(256, C - j0);
            float acc[256];
            memcpy(acc, dout + t * C + j0, (size_t)len * sizeof(float));
            for (int64_t b = 1; b < B; b++) {
                const float *src = dout + (b * T + t) * C + j0;
#pragma omp simd
                for (int64_t j = 0; j < len; j++) acc[j] += src[j];
            }
#pragma omp simd
            for (int64_t j = 0; j < len; j++) dst[j0 + j] += acc[j];
        }
    }
}

/* ---- layernorm ---------------------------------------------------------------------------- */

#define LN_EPS 1e-5f

static void cpu_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C;
        int64_t cv = C - C % LANES;
        /* two passes (mean, then squared deviations): no cancellation for rows with a large
         * common offset */
        vf16 acc = {0};
        for (int64_t j = 0; j < cv; j += LANES) acc += LOAD16(x + j);
        for (int64_t j = cv; j < C; j++) acc[j - cv] += x[j];
        float m = vf16_sum(&acc) / (float)C;
        vf16 acc2 = {0};
        for (int64_t j = 0; j < cv; j += LANES) {
            vf16 d = LOAD16(x + j) - m;
            acc2 += d * d;
        }
        for (int64_t j = cv; j < C; j++) acc2[j - cv] += (x[j] - m) * (x[j] - m);
        float s = 1.0f / sqrtf(vf16_sum(&acc2) / (float)C + LN_EPS);
        float *o = out + i * C;
#pragma omp simd
        for (int64_t j = 0; j < C; j++) o[j] = (x[j] - m) * s * w[j] + b[j];
        mean[i] = m;
        rstd[i] = s;
    }
}

/*
 * With n = (x - mean)·rstd and g = dout·w:
 *   dinp += rstd·(g - mean(g) - n·mean(g·n)),  dw += sum_rows dout·n,  db += sum_rows dout.
 * dw/db go through per-chunk partials (partial[chunk] = [dw (C) | db (C)]) like bias_grad.
 */
static void cpu_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, const float *mean,
                              const float *rstd, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    int64_t n_chunks = (N + CHUNK_ROWS - 1) / CHUNK_ROWS;
    if (n_chunks == 0) return;
    float *partial = ws_get(c, (size_t)n_chunks * 2 * (size_t)C * sizeof(float));
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        float *pdw = partial + ch * 2 * C, *pdb = pdw + C;
        memset(pdw, 0, 2 * (size_t)C * sizeof(float));
        int64_t r0 = ch * CHUNK_ROWS, r1 = CT_MIN(r0 + CHUNK_ROWS, N);
        int64_t cv = C - C % LANES;
        for (int64_t i = r0; i < r1; i++) {
            const float *x = inp + i * C, *d = dout + i * C;
            float m = mean[i], s = rstd[i];
            vf16 acc_g = {0}, acc_gn = {0};
            for (int64_t j = 0; j < cv; j += LANES) {
                vf16 n = (LOAD16(x + j) - m) * s, g = LOAD16(d + j) * LOAD16(w + j);
                acc_g += g;
                acc_gn += g * n;
            }
            for (int64_t j = cv; j < C; j++) {
                float n = (x[j] - m) * s, g = d[j] * w[j];
                acc_g[j - cv] += g;
                acc_gn[j - cv] += g * n;
            }
            float g_mean = vf16_sum(&acc_g) / (float)C;
            float gn_mean = vf16_sum(&acc_gn) / (float)C;
            float *di = dinp + i * C;
#pragma omp simd
            for (int64_t j = 0; j < C; j++) {
                float n = (x[j] - m) * s, g = d[j] * w[j];
                di[j] += s * (g - g_mean - n * gn_mean);
                pdw[j] += d[j] * n;
                pdb[j] += d[j];
            }
        }
    }
    add_chunk_partials(c, dw, partial, n_chunks, C, 2 * C);
    add_chunk_partials(c, db, partial + C, n_chunks, C, 2 * C);
}

/* ---- GELU (tanh approximation, GPT-2) ------------------------------------------------------- */

/*
 * GELU, tanh form: 0.5x(1 + tanh u) with u = k(x + a x³), computed through the logistic function as
 * x·σ(2u) = x / (1 + t), t = exp(-2u). Unlike 1 + tanh u in float, this has no cancellation for
 * negative u, so gelu(x) keeps its relative accuracy where it is tiny. For u < -44 the clamped exp
 * gives t = e^88 instead of a larger number: the result is then below 1e-37 in magnitude, as is
 * the true value. A NaN input stays NaN through the product with x.
 */
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* t = exp(-2u) = exp(x·(-2k - 2ka·x²)) */
static inline float gelu_t(float x) {
    return exp_clamped_f32(x * fmaf(-2.0f * GELU_K * GELU_A, x * x, -2.0f * GELU_K));
}

static void cpu_gelu_fwd(void *ctx, float *out, const float *inp, int64_t n) {
    cpu_ctx *c = ctx;
    int64_t n_blk = (n + EW_BLOCK - 1) / EW_BLOCK;
    PARALLEL_FOR(threads_for(c, n))
    for (int64_t blk = 0; blk < n_blk; blk++) {
        int64_t i0 = blk * EW_BLOCK, i1 = CT_MIN(i0 + EW_BLOCK, n);
        prefetch_floats(inp + i1, inp + n, EW_BLOCK);
#pragma omp simd
        for (int64_t i = i0; i < i1; i++) out[i] = inp[i] / (1.0f + gelu_t(inp[i]));
    }
}

/* d/dx 0.5x(1 + tanh u) = 0.5(1 + tanh u) + 0.5x(1 - tanh²u)·du/dx = s + 2x·s(1-s)·du/dx
 * = s·(1 + 2x·(1-s)·du/dx), with s = σ(2u) = 1/(1+t), 1 - s = t·s (no cancellation) and
 * du/dx = k(1 + 3a x²). */
static inline float gelu_grad(float x) {
    float t = gelu_t(x);
    float s = 1.0f / (1.0f + t);
    float du = fmaf(3.0f * GELU_K * GELU_A, x * x, GELU_K);
    return s * fmaf(2.0f * x * du, t * s, 1.0f);
}

/* dinp = gelu'(inp)·dout over N rows of C; with dbias, also dbias(C) += Σ_rows dinp, summed
 * exactly as bias_grad sums (row chunks, then chunks in order) while the rows are in cache. */
static void cpu_gelu_bwd(void *ctx, float *dinp, float *dbias, const float *inp, const float *dout,
                         int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    int64_t n = N * C;
    if (!dbias) {
        int64_t n_blk = (n + EW_BLOCK - 1) / EW_BLOCK;
        PARALLEL_FOR(threads_for(c, n))
        for (int64_t blk = 0; blk < n_blk; blk++) {
            int64_t i0 = blk * EW_BLOCK, i1 = CT_MIN(i0 + EW_BLOCK, n);
            prefetch_floats(inp + i1, inp + n, EW_BLOCK);
            prefetch_floats(dout + i1, dout + n, EW_BLOCK);
#pragma omp simd
            for (int64_t i = i0; i < i1; i++) dinp[i] = gelu_grad(inp[i]) * dout[i];
        }
        return;
    }
    int64_t n_chunks = (N + CHUNK_ROWS - 1) / CHUNK_ROWS;
    if (n_chunks == 0) return;
    float *partial = ws_get(c, (size_t)n_chunks * (size_t)C * sizeof(float)); /* (n_chunks, C) */
    PARALLEL_FOR(threads_for(c, n))
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        float *p = partial + ch * C;
        int64_t r0 = ch * CHUNK_ROWS, r1 = CT_MIN(r0 + CHUNK_ROWS, N);
        for (int64_t r = r0; r < r1; r++) {
            const float *x = inp + r * C, *d = dout + r * C;
            float *o = dinp + r * C;
            prefetch_floats(x + C, inp + n, C);
            prefetch_floats(d + C, dout + n, C);
            if (r == r0) {
#pragma omp simd
                for (int64_t j = 0; j < C; j++) p[j] = o[j] = gelu_grad(x[j]) * d[j];
            } else {
#pragma omp simd
                for (int64_t j = 0; j < C; j++) {
                    float g = gelu_grad(x[j]) * d[j];
                    o[j] = g;
                    p[j] += g;
                }
            }
        }
    }
    add_chunk_partials(c, dbias, partial, n_chunks, C, C);
}

/* ---- attention ---------------------------------------------------------------------------- */

/*
 * Per (batch, head) the T query rows are walked in blocks of ATT_BLOCK rows [r0, r1); a block only
 * needs keys [0, r1) (causal), so S = scale·Q·K^T is computed on the block lower triangle and the
 * GEMMs skip the rest. Head slices are strided views of the (B, T, heads·hd) tensors: leading
 * dimension heads·hd, never copied.
 */

#if defined(__AVX512F__)
/* dst(16, 16) = src(16, 16)ᵀ (row strides ld_dst, ld_src): interleave pairs of rows at 32-bit,
 * then 64-bit granularity, then exchange 128-bit lanes twice. */
static void transpose_16x16(float *dst, int64_t ld_dst, const float *src, int64_t ld_src) {
    __m512 r[16], u[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ld_src);
    for (int i = 0; i < 16; i += 2) {
        u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int j = 0; j < 2; j++) {
            __m512d a = _mm512_castps_pd(u[i + j]), b = _mm512_castps_pd(u[i + j + 2]);
            r[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 4; i++) {
        u[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        u[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        u[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        u[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(u[i], u[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(u[i], u[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_f32x4(u[i + 4], u[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(u[i + 4], u[i + 12], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ld_dst, r[i]);
}
#endif

/* dst(hd, ld_dst) = src(T, hd)ᵀ for a head slice src of row stride ld_src (T ≤ ld_dst). OpenBLAS's
 * small-matrix kernel for A·Bᵀ runs at about half the rate of its A·B kernel at attention's
 * shapes (64x128x64: 86 vs 157 GFLOP/s on one AVX-512 core), so Kᵀ and Vᵀ are made explicit once
 * per head and the score GEMMs run as A·B. */
static void transpose_head(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t T,
                           int64_t hd) {
    int64_t t_done = 0, d_done = 0;
#if defined(__AVX512F__)
    /* whole 16x16 tiles in registers: 4x faster than the element loop below */
    t_done = T - T % 16, d_done = hd - hd % 16;
    for (int64_t t0 = 0; t0 < t_done; t0 += 16)
        for (int64_t d0 = 0; d0 < d_done; d0 += 16)
            transpose_16x16(dst + d0 * ld_dst + t0, ld_dst, src + t0 * ld_src + d0, ld_src);
#endif
    /* the rest: rows past the last whole tile, and columns past it for every row */
    for (int64_t t0 = 0; t0 < T; t0 += 16) {
        int64_t t1 = CT_MIN(t0 + 16, T);
        int64_t d_from = t0 + 16 <= t_done ? d_done : 0;
        for (int64_t d = d_from; d < hd; d++)
            for (int64_t t = t0; t < t1; t++) dst[d * ld_dst + t] = src[t * ld_src + d];
    }
}

/* Sets s[n .. round_up(n, 16)) to -inf with one masked vector write (exp then gives exactly 0
 * there, so a row is processed in whole 16-lane groups without a scalar tail). Returns
 * round_up(n, 16). */
static inline int64_t mask_past_diagonal(float *s, int64_t n) {
    int64_t n16 = (int64_t)round_up((size_t)n, LANES), tail = n16 - LANES;
    if (n16 > n) {
        const vi16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        const vi16 neg_inf = (vi16){0} + (int32_t)0xFF800000; /* bits of -inf */
        vi16 keep = lane < (int32_t)(n - tail);
        vi16 v = (vi16)LOAD16(s + tail);
        v = (v & keep) | (neg_inf & ~keep);
        memcpy(s + tail, &v, sizeof v);
    }
    return n16;
}

/* Row-wise causal softmax of a block S (rows r0..r1-1 of the score matrix, keys 0..r1-1, row stride
 * ld ≥ round_up(r1, LANES)), left unnormalised: S becomes exp(S - rowmax) with 0 past the diagonal,
 * inv_sum[i - r0] = 1/sum and lse[i] = max + log(sum). The caller scales the (hd-wide) output rows
 * by inv_sum instead of the (up to T-wide) probability rows. Each row is processed in whole 16-lane
 * groups: the columns between the diagonal and the next multiple of 16 are set to -inf first (exp
 * gives exactly 0), so there is no scalar tail. */
static void softmax_block(float *S, int64_t ld, int64_t r0, int64_t r1, float *lse,
                          float *inv_sum) {
    for (int64_t i = r0; i < r1; i++) {
        float *s = S + (i - r0) * ld;
        int64_t n = i + 1; /* keys 0..i are visible */
        int64_t n16 = mask_past_diagonal(s, n);
        float mx = row_max(s, n16);
        float acc[LANES] = {0};
        for (int64_t j = 0; j < n16; j += LANES)
            for (int l = 0; l < LANES; l++) {
                float e = exp_f32(s[j + l] - mx);
                s[j + l] = e;
                acc[l] += e;
            }
        if (r1 > n16) memset(s + n16, 0, (size_t)(r1 - n16) * sizeof(float));
        float sum = lane_sum(acc);
        inv_sum[i - r0] = 1.0f / sum;
        lse[i] = mx + logf(sum);
    }
}

static void cpu_attention_fwd(void *ctx, float *out, float *lse, const float *qkv, int64_t B,
                              int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    cpu_ctx *c = ctx;
    const int64_t cq = n_head * hd, ckv = n_kv_head * hd, group = n_head / n_kv_head;
    const int64_t lqkv = cq + 2 * ckv; /* row stride of the packed q | k | v */
    const float scale = 1.0f / sqrtf((float)hd);
    /* per-thread scratch: one block of scores (ATT_BLOCK, ld), rows padded to whole lane groups,
     * Kᵀ (hd, ld) and the block's 1/sum (ATT_BLOCK) */
    const int64_t ld = (int64_t)round_up((size_t)T, LANES);
    const size_t s_bytes = round_up((size_t)ATT_BLOCK * (size_t)ld * sizeof(float), 64);
    const size_t kt_bytes = round_up((size_t)hd * (size_t)ld * sizeof(float), 64);
    const size_t per_thread = s_bytes + kt_bytes + round_up(ATT_BLOCK * sizeof(float), 64);
    char *ws = ws_get(c, per_thread * (size_t)c->n_threads);
    PARALLEL_FOR(c->n_threads)
    for (int64_t bh = 0; bh < B * n_head; bh++) {
        float *S = (float *)(ws + per_thread * (size_t)omp_get_thread_num());
        float *Kt = (float *)((char *)S + s_bytes);
        float *inv = (float *)((char *)Kt + kt_bytes);
        int64_t b = bh / n_head, h = bh % n_head, kvh = h / group;
        const float *qh = qkv + b * T * lqkv + h * hd;              /* (T, hd), stride lqkv */
        const float *kh = qkv + b * T * lqkv + cq + kvh * hd;       /* (T, hd), stride lqkv */
        const float *vh = qkv + b * T * lqkv + cq + ckv + kvh * hd; /* (T, hd), stride lqkv */
        float *oh = out + b * T * cq + h * hd;                      /* (T, hd), stride cq */
        float *lh = lse + bh * T;                                   /* (T) */
        if (bh + 1 < B * n_head) {
            int64_t nb = (bh + 1) / n_head, nh = (bh + 1) % n_head, nkvh = nh / group;
            prefetch_rows(qkv + nb * T * lqkv + nh * hd, T, lqkv, hd);
            prefetch_rows(qkv + nb * T * lqkv + cq + nkvh * hd, T, lqkv, hd);
            prefetch_rows(qkv + nb * T * lqkv + cq + ckv + nkvh * hd, T, lqkv, hd);
            prefetch_rows_w(out + nb * T * cq + nh * hd, T, cq, hd);
        }
        transpose_head(Kt, ld, kh, lqkv, T, hd);
        for (int64_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
            int64_t r1 = CT_MIN(r0 + ATT_BLOCK, T), m = r1 - r0;
            /* S(m, r1) = scale · Q[r0:r1] · Kᵀ[:, 0:r1] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)r1, (int)hd, scale,
                        qh + r0 * lqkv, (int)lqkv, Kt, (int)ld, 0.0f, S, (int)ld);
            softmax_block(S, ld, r0, r1, lh, inv);
            /* O[r0:r1](m, hd) = diag(1/sum) · exp(S - max)(m, r1) · V[0:r1] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)hd, (int)r1, 1.0f,
                        S, (int)ld, vh, (int)lqkv, 0.0f, oh + r0 * cq, (int)cq);
            for (int64_t i = 0; i < m; i++) {
                float *o = oh + (r0 + i) * cq, f = inv[i];
#pragma omp simd
                for (int64_t d = 0; d < hd; d++) o[d] *= f;
            }
        }
    }
}

/*
 * Backward per query block, with P recomputed from the saved lse:
 *   dP = dO·V^T, D_i = rowsum(dO ⊙ O)_i, dS = P ⊙ (dP - D),
 *   dV += P^T·dO, dQ = scale·dS·K, dK += scale·dS^T·Q.
 * Parallel over (batch, kv head): the group's query heads and their blocks are visited in a fixed
 * order and accumulate into the kv head's dk/dv, so GQA needs no atomics and no reduction buffers.
 * dqkv has the packed layout of qkv.
 */
static void cpu_attention_bwd(void *ctx, float *dqkv, float *dbias, const float *dout,
                              const float *qkv, const float *out, const float *lse, int64_t B,
                              int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    cpu_ctx *c = ctx;
    const int64_t cq = n_head * hd, ckv = n_kv_head * hd, group = n_head / n_kv_head;
    const int64_t lqkv = cq + 2 * ckv;
    const float scale = 1.0f / sqrtf((float)hd);
    /* per-thread scratch: P and dP/dS blocks (ATT_BLOCK, ldt) each, Kᵀ and Vᵀ (hd, ldt) each, and D
     * (ATT_BLOCK); ldt is T rounded up to whole lane groups */
    const int64_t ldt = (int64_t)round_up((size_t)T, LANES);
    const size_t blk_bytes = round_up((size_t)ATT_BLOCK * (size_t)ldt * sizeof(float), 64);
    const size_t kt_bytes = round_up((size_t)hd * (size_t)ldt * sizeof(float), 64);
    const size_t per_thread =
        2 * blk_bytes + 2 * kt_bytes + round_up(ATT_BLOCK * sizeof(float), 64);
    /* after the threads' scratch: with dbias, each batch element's column sums of dqkv (B, lqkv) */
    const size_t scratch = per_thread * (size_t)c->n_threads;
    char *ws = ws_get(c, scratch + (dbias ? (size_t)(B * lqkv) * sizeof(float) : 0));
    float *colsums = (float *)(ws + scratch);
    PARALLEL_FOR(c->n_threads)
    for (int64_t bkv = 0; bkv < B * n_kv_head; bkv++) {
        char *mine = ws + per_thread * (size_t)omp_get_thread_num();
        float *P = (float *)mine, *dS = (float *)(mine + blk_bytes);
        float *Kt = (float *)(mine + 2 * blk_bytes),
              *Vt = (float *)(mine + 2 * blk_bytes + kt_bytes);
        float *D = (float *)(mine + 2 * blk_bytes + 2 * kt_bytes);
        int64_t b = bkv / n_kv_head, kvh = bkv % n_kv_head;
        const int64_t k_off = b * T * lqkv + cq + kvh * hd, v_off = k_off + ckv;
        const float *kh = qkv + k_off, *vh = qkv + v_off; /* (T, hd), stride lqkv */
        float *dkh = dqkv + k_off, *dvh = dqkv + v_off;
        if (bkv + 1 < B * n_kv_head) { /* the next item's q, k, v, out and dout slices */
            int64_t nb = (bkv + 1) / n_kv_head, nkvh = (bkv + 1) % n_kv_head;
            const float *row0 = qkv + nb * T * lqkv;
            prefetch_rows(row0 + cq + nkvh * hd, T, lqkv, hd);
            prefetch_rows(row0 + cq + ckv + nkvh * hd, T, lqkv, hd);
            prefetch_rows_w(dqkv + nb * T * lqkv + cq + nkvh * hd, T, lqkv, hd);
            prefetch_rows_w(dqkv + nb * T * lqkv + cq + ckv + nkvh * hd, T, lqkv, hd);
            for (int64_t h = nkvh * group; h < (nkvh + 1) * group; h++) {
                prefetch_rows(row0 + h * hd, T, lqkv, hd);
                prefetch_rows_w(dqkv + nb * T * lqkv + h * hd, T, lqkv, hd);
                prefetch_rows(out + nb * T * cq + h * hd, T, cq, hd);
                prefetch_rows(dout + nb * T * cq + h * hd, T, cq, hd);
            }
        }
        transpose_head(Kt, ldt, kh, lqkv, T, hd);
        transpose_head(Vt, ldt, vh, lqkv, T, hd);
        /* Blocks run last to first: the last block's dK/dV GEMMs cover all T keys, so for the
         * group's first head they overwrite (beta 0) and nothing needs zeroing beforehand. */
        const int64_t last_r0 = (T - 1) / ATT_BLOCK * ATT_BLOCK;
        for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
            const float *qh = qkv + b * T * lqkv + h * hd; /* (T, hd), stride lqkv */
            float *dqh = dqkv + b * T * lqkv + h * hd;
            const float *oh = out + b * T * cq + h * hd; /* (T, hd), stride cq */
            const float *doh = dout + b * T * cq + h * hd;
            const float *lh = lse + (b * n_head + h) * T;
            for (int64_t r0 = last_r0; r0 >= 0; r0 -= ATT_BLOCK) {
                int64_t r1 = CT_MIN(r0 + ATT_BLOCK, T), m = r1 - r0;
                const float kv_beta = h == kvh * group && r0 == last_r0 ? 0.0f : 1.0f;
                /* P(m, r1) = exp(scale·Q[r0:r1]·Kᵀ[:, 0:r1] - lse), 0 past the diagonal */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)r1, (int)hd,
                            scale, qh + r0 * lqkv, (int)lqkv, Kt, (int)ldt, 0.0f, P, (int)ldt);
                for (int64_t i = r0; i < r1; i++) {
                    float *p = P + (i - r0) * ldt;
                    float l = lh[i];
                    int64_t n16 = mask_past_diagonal(p, i + 1);
#pragma omp simd
                    for (int64_t j = 0; j < n16; j++) p[j] = exp_f32(p[j] - l);
                    if (r1 > n16) memset(p + n16, 0, (size_t)(r1 - n16) * sizeof(float));
                    /* D_i = dO_i · O_i */
                    const float *o = oh + i * cq, *d = doh + i * cq;
                    vf16 acc = {0};
                    int64_t hv = hd - hd % LANES;
                    for (int64_t j = 0; j < hv; j += LANES) acc += LOAD16(o + j) * LOAD16(d + j);
                    for (int64_t j = hv; j < hd; j++) acc[j - hv] += o[j] * d[j];
                    D[i - r0] = vf16_sum(&acc);
                }
                /* dP(m, r1) = dO[r0:r1] · Vᵀ[:, 0:r1] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)r1, (int)hd,
                            1.0f, doh + r0 * cq, (int)cq, Vt, (int)ldt, 0.0f, dS, (int)ldt);
                /* dS = P ⊙ (dP - D) */
                for (int64_t i = 0; i < m; i++) {
                    float *ds = dS + i * ldt;
                    const float *p = P + i * ldt;
                    float di = D[i];
#pragma omp simd
                    for (int64_t j = 0; j < r1; j++) ds[j] = p[j] * (ds[j] - di);
                }
                /* dV[0:r1](r1, hd) += P^T · dO[r0:r1] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r1, (int)hd, (int)m, 1.0f,
                            P, (int)ldt, doh + r0 * cq, (int)cq, kv_beta, dvh, (int)lqkv);
                /* dQ[r0:r1](m, hd) = scale · dS · K[0:r1] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)hd, (int)r1,
                            scale, dS, (int)ldt, kh, (int)lqkv, 0.0f, dqh + r0 * lqkv, (int)lqkv);
                /* dK[0:r1](r1, hd) += scale · dS^T · Q[r0:r1] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r1, (int)hd, (int)m,
                            scale, dS, (int)ldt, qh + r0 * lqkv, (int)lqkv, kv_beta, dkh,
                            (int)lqkv);
            }
            /* this head's dq columns are final: their sums over the batch element's rows */
            if (dbias) sum_rows(colsums + b * lqkv + h * hd, dqh, lqkv, T, hd);
        }
        if (dbias) {
            sum_rows(colsums + b * lqkv + cq + kvh * hd, dkh, lqkv, T, hd);
            sum_rows(colsums + b * lqkv + cq + ckv + kvh * hd, dvh, lqkv, T, hd);
        }
    }
    /* the bias gradient: the batch elements' column sums added in batch order */
    if (dbias) add_chunk_partials(c, dbias, colsums, B, lqkv, lqkv);
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

static void cpu_xent_rowmax(void *ctx, float *rowmax, const float *logits, int64_t N, int64_t V,
                            int64_t n_valid) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * n_valid))
    for (int64_t i = 0; i < N; i++) {
        const float *x = logits + i * V;
        rowmax[i] = row_max(x, n_valid); /* -inf for a shard made only of padding */
    }
}

static void cpu_xent_sumexp(void *ctx, float *sumexp, float *target_logit, float *logits,
                            const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                            int64_t n_valid, int64_t col_offset, bool keep_exp) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * n_valid))
    for (int64_t i = 0; i < N; i++) {
        float *x = logits + i * V;
        float mx = rowmax[i];
        int64_t t = (int64_t)targets[i] - col_offset;
        target_logit[i] = (t >= 0 && t < n_valid) ? x[t] : 0.0f; /* before keep_exp writes */
        float acc[LANES] = {0};
        int64_t nv = n_valid - n_valid % LANES;
        for (int64_t j = 0; j < nv; j += LANES) {
            if (j + 512 < n_valid) __builtin_prefetch(x + j + 512); /* see prefetch_floats */
            if (keep_exp) {
                for (int l = 0; l < LANES; l++) {
                    float e = exp_f32(x[j + l] - mx);
                    x[j + l] = e;
                    acc[l] += e;
                }
            } else {
                for (int l = 0; l < LANES; l++) acc[l] += exp_f32(x[j + l] - mx);
            }
        }
        for (int64_t j = nv; j < n_valid; j++) {
            float e = exp_f32(x[j] - mx);
            if (keep_exp) x[j] = e;
            acc[j - nv] += e;
        }
        sumexp[i] = lane_sum(acc);
    }
}

static void cpu_xent_finish(void *ctx, float *losses, float *logits, const int32_t *targets,
                            const float *rowmax, const float *sumexp, const float *target_logit,
                            int64_t N, int64_t V, int64_t n_valid, int64_t col_offset, float dloss,
                            bool write_grad) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, write_grad ? N * V : N))
    for (int64_t i = 0; i < N; i++) {
        float mx = rowmax[i], se = sumexp[i];
        losses[i] = logf(se) + mx - target_logit[i];
        if (!write_grad) continue;
        float *x = logits + i * V;
        float g = dloss / se; /* dloss·softmax = dloss/sumexp · exp(logit - rowmax) */
#pragma omp simd
        for (int64_t j = 0; j < n_valid; j++) x[j] *= g;   /* x holds exp(logit - rowmax) */
        for (int64_t j = n_valid; j < V; j++) x[j] = 0.0f; /* vocabulary padding */
        int64_t t = (int64_t)targets[i] - col_offset;
        if (t >= 0 && t < n_valid) x[t] -= dloss;
    }
}

/* ---- optimizer and norms ------------------------------------------------------------------ */

/*
 * AdamW, decoupled weight decay. The exact float operation order (the CUDA backend repeats it;
 * every multiply-add is an explicit fmaf so compiler contraction cannot change it):
 *   bc1 = (float)(1 - (double)beta1^step),  bc2 = (float)(1 - (double)beta2^step)   (host, double)
 *   g    = grad · grad_scale
 *   m    = fmaf(beta1, m, (1 - beta1)·g)
 *   v    = fmaf(beta2, v, (1 - beta2)·(g·g))
 *   mhat = m / bc1,  vhat = v / bc2
 *   upd  = fmaf(wd, param, mhat / (sqrtf(vhat) + eps))
 *   param = fmaf(-lr, upd, param)
 * (1 - beta1) and (1 - beta2) are computed in float.
 */
static void cpu_adamw(void *ctx, float *param, const float *grad, float *m, float *v,
                      const ct_adamw_segment *segments, int n_segments, const ct_adamw_hparams *hp,
                      void *param_copy, ct_dtype copy_dtype) {
    cpu_ctx *c = ctx;
    const float b1 = hp->beta1, b2 = hp->beta2, one_b1 = 1.0f - b1, one_b2 = 1.0f - b2;
    const float bc1 = (float)(1.0 - pow((double)b1, (double)hp->step));
    const float bc2 = (float)(1.0 - pow((double)b2, (double)hp->step));
    const float lr = hp->lr, eps = hp->eps, gs = hp->grad_scale;
    for (int s = 0; s < n_segments; s++) {
        const int64_t off = segments[s].offset, n = segments[s].count;
        const float wd = segments[s].weight_decay;
        float *p = param + off, *ms = m + off, *vs = v + off;
        const float *gr = grad + off;
        CT_PRAGMA(omp parallel for simd schedule(static) num_threads(threads_for(c, n)))
        for (int64_t i = 0; i < n; i++) {
            float g = gr[i] * gs;
            float mi = fmaf(b1, ms[i], one_b1 * g);
            float vi = fmaf(b2, vs[i], one_b2 * (g * g));
            float mhat = mi / bc1, vhat = vi / bc2;
            float upd = fmaf(wd, p[i], mhat / (sqrtf(vhat) + eps));
            p[i] = fmaf(-lr, upd, p[i]);
            ms[i] = mi;
            vs[i] = vi;
        }
        /* The bf16 parameters the model computes with: the updated master weights, rounded. */
        if (param_copy && copy_dtype == CT_DTYPE_BF16) {
            uint16_t *pc = (uint16_t *)param_copy + off;
            CT_PRAGMA(omp parallel for simd schedule(static) num_threads(threads_for(c, n)))
            for (int64_t i = 0; i < n; i++) pc[i] = ct_f32_to_bf16(p[i]);
        } else if (param_copy) {
            CT_ASSERTF(copy_dtype == CT_DTYPE_F32, "adamw: param copy of dtype %s",
                       ct_dtype_name(copy_dtype));
            memcpy((float *)param_copy + off, p, (size_t)n * sizeof(float));
        }
    }
}

/* out = sum x² in double: chunks of SUMSQ_CHUNK elements (16 double lanes each), chunk partials
 * added in chunk order. */
static void cpu_sumsq_one(cpu_ctx *c, float *out, const float *x, int64_t n) {
    int64_t n_chunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double *partial = ws_get(c, (size_t)(n_chunks ? n_chunks : 1) * sizeof(double));
    PARALLEL_FOR(threads_for(c, n))
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        const float *xc = x + ch * SUMSQ_CHUNK;
        int64_t len = CT_MIN((int64_t)SUMSQ_CHUNK, n - ch * SUMSQ_CHUNK);
        int64_t lv = len - len % LANES;
        double acc[LANES] = {0};
        for (int64_t j = 0; j < lv; j += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += (double)xc[j + l] * (double)xc[j + l];
        for (int64_t j = lv; j < len; j++) acc[j - lv] += (double)xc[j] * (double)xc[j];
        double a[8];
        for (int l = 0; l < 8; l++) a[l] = acc[l] + acc[l + 8];
        for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
        partial[ch] = (a[0] + a[2]) + (a[1] + a[3]);
    }
    double total = 0.0;
    for (int64_t ch = 0; ch < n_chunks; ch++) total += partial[ch];
    *out = (float)total;
}

static void cpu_sumsq(void *ctx, float *out, const float *const *x, const int64_t *n, int count) {
    for (int i = 0; i < count; i++) cpu_sumsq_one(ctx, out + i, x[i], n[i]);
}

static void cpu_cast(void *ctx, void *dst, ct_dtype dst_dtype, const void *src, ct_dtype src_dtype,
                     int64_t n) {
    cpu_ctx *c = ctx;
    int nt = threads_for(c, n);
    if (dst_dtype == src_dtype) {
        cpu_copy(ctx, dst, src, (size_t)n * ct_dtype_size(dst_dtype));
    } else if (dst_dtype == CT_DTYPE_BF16 && src_dtype == CT_DTYPE_F32) {
        uint16_t *d = dst;
        const float *s = src;
        CT_PRAGMA(omp parallel for simd schedule(static) num_threads(nt))
        for (int64_t i = 0; i < n; i++) d[i] = ct_f32_to_bf16(s[i]);
    } else if (dst_dtype == CT_DTYPE_F32 && src_dtype == CT_DTYPE_BF16) {
        float *d = dst;
        const uint16_t *s = src;
        CT_PRAGMA(omp parallel for simd schedule(static) num_threads(nt))
        for (int64_t i = 0; i < n; i++) d[i] = ct_bf16_to_f32(s[i]);
    } else {
        CT_ASSERTF(0, "cpu cast: %s -> %s is not supported", ct_dtype_name(src_dtype),
                   ct_dtype_name(dst_dtype));
    }
}

/* ---- bf16: the slots ------------------------------------------------------------------------
 *
 * Each slot takes the storage dtype of its activations and parameters (backend.h). fp32 goes
 * straight to the kernels above. bf16 runs the same kernels on fp32 copies: every bf16 operand is
 * widened into a staging buffer (exact: a bf16 value is an fp32 value), the kernel runs in fp32,
 * and every output is rounded back to nearest even. So the bf16 path computes exactly what the
 * fp32 reference computes on the rounded inputs, rounded once at the end — the numerics mixed
 * precision promises (fp32 arithmetic and accumulation, bf16 storage) — at the price of one extra
 * pass over each operand. GEMMs are the exception: oneDNN reads bf16 directly (cpu_gemm.h).
 */

/* Staging buffer k, at least n floats. */
static float *stage_buf(cpu_ctx *c, int k, int64_t n) {
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

static void widen(cpu_ctx *c, float *dst, const uint16_t *src, int64_t n) {
    CT_PRAGMA(omp parallel for simd schedule(static) num_threads(threads_for(c, n)))
    for (int64_t i = 0; i < n; i++) dst[i] = ct_bf16_to_f32(src[i]);
}

static void narrow(cpu_ctx *c, uint16_t *dst, const float *src, int64_t n) {
    CT_PRAGMA(omp parallel for simd schedule(static) num_threads(threads_for(c, n)))
    for (int64_t i = 0; i < n; i++) dst[i] = ct_f32_to_bf16(src[i]);
}

/* An input operand as fp32: the pointer itself for f32, else widened into staging buffer k. */
static const float *in_f32(cpu_ctx *c, int k, ct_dtype dt, const void *p, int64_t n) {
    if (dt == CT_DTYPE_F32 || !p) return p;
    float *f = stage_buf(c, k, n);
    widen(c, f, p, n);
    return f;
}

/* An output operand as fp32: the pointer itself for f32, else staging buffer k — holding the
 * widened current values when the op reads them (accumulates or updates in place). */
static float *out_f32(cpu_ctx *c, int k, ct_dtype dt, void *p, int64_t n, bool reads) {
    if (dt == CT_DTYPE_F32) return p;
    float *f = stage_buf(c, k, n);
    if (reads) widen(c, f, p, n);
    return f;
}

/* Stores an output obtained from out_f32 (bf16: rounded to nearest even). */
static void out_done(cpu_ctx *c, ct_dtype dt, void *p, const float *f, int64_t n) {
    if (dt != CT_DTYPE_F32) narrow(c, p, f, n);
}

static void slot_gemm(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                      float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                      float beta, void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    cpu_ctx *c = ctx;
    if (ab_dtype == CT_DTYPE_F32 && c_dtype == CT_DTYPE_F32) {
        cpu_gemm(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    CT_ASSERTF(ab_dtype == CT_DTYPE_BF16, "cpu gemm: %s inputs into a %s C",
               ct_dtype_name(ab_dtype), ct_dtype_name(c_dtype));
    /* M, N or K of 0 are handled there as BLAS defines them (K = 0: C = beta·C). */
    if (omp_get_max_threads() != c->n_threads) omp_set_num_threads(c->n_threads);
    ct_cpu_gemm_onednn(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_dtype,
                       c_dtype);
}

static void slot_bias_add(void *ctx, ct_dtype dt, void *out, const void *bias, int64_t N,
                          int64_t C) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, N * C, true);
    cpu_bias_add(c, o, in_f32(c, 1, dt, bias, C), N, C);
    out_done(c, dt, out, o, N * C);
}

static void slot_bias_init(void *ctx, ct_dtype dt, void *out, const void *bias,
                           const void *residual, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, N * C, false);
    cpu_bias_init(c, o, in_f32(c, 1, dt, bias, C), in_f32(c, 2, dt, residual, N * C), N, C);
    out_done(c, dt, out, o, N * C);
}

static void slot_bias_grad(void *ctx, ct_dtype dt, float *dbias, const void *dout, int64_t N,
                           int64_t C) {
    cpu_ctx *c = ctx;
    cpu_bias_grad(c, dbias, in_f32(c, 0, dt, dout, N * C), N, C);
}

static void slot_axpy(void *ctx, ct_dtype dt, void *dst, const void *src, float alpha, int64_t n) {
    cpu_ctx *c = ctx;
    float *d = out_f32(c, 0, dt, dst, n, true);
    cpu_axpy(c, d, in_f32(c, 1, dt, src, n), alpha, n);
    out_done(c, dt, dst, d, n);
}

static void slot_scale(void *ctx, ct_dtype dt, void *x, float s, int64_t n) {
    cpu_ctx *c = ctx;
    float *f = out_f32(c, 0, dt, x, n, true);
    cpu_scale(c, f, s, n);
    out_done(c, dt, x, f, n);
}

static void slot_embedding_bwd(void *ctx, ct_dtype dt, float *dtable, const void *dout,
                               const int32_t *tokens, int64_t N, int64_t C, int64_t rows,
                               int64_t row_offset) {
    cpu_ctx *c = ctx;
    cpu_embedding_bwd(c, dtable, in_f32(c, 0, dt, dout, N * C), tokens, N, C, rows, row_offset);
}

static void slot_posemb_fwd(void *ctx, ct_dtype dt, void *out, const void *wpe, int64_t B,
                            int64_t T, int64_t C, int64_t pos_offset) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, B * T * C, true);
    cpu_posemb_fwd(c, o, in_f32(c, 1, dt, wpe, (pos_offset + T) * C), B, T, C, pos_offset);
    out_done(c, dt, out, o, B * T * C);
}

static void slot_posemb_bwd(void *ctx, ct_dtype dt, float *dwpe, const void *dout, int64_t B,
                            int64_t T, int64_t C, int64_t pos_offset) {
    cpu_ctx *c = ctx;
    cpu_posemb_bwd(c, dwpe, in_f32(c, 0, dt, dout, B * T * C), B, T, C, pos_offset);
}

static void slot_layernorm_fwd(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd,
                               const void *inp, const void *w, const void *b, int64_t N,
                               int64_t C) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, N * C, false);
    cpu_layernorm_fwd(c, o, mean, rstd, in_f32(c, 1, dt, inp, N * C), in_f32(c, 2, dt, w, C),
                      in_f32(c, 3, dt, b, C), N, C);
    out_done(c, dt, out, o, N * C);
}

static void slot_layernorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, float *db,
                               const void *dout, const void *inp, const void *w, const float *mean,
                               const float *rstd, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    float *di = out_f32(c, 0, dt, dinp, N * C, true); /* accumulates */
    cpu_layernorm_bwd(c, di, dw, db, in_f32(c, 1, dt, dout, N * C), in_f32(c, 2, dt, inp, N * C),
                      in_f32(c, 3, dt, w, C), mean, rstd, N, C);
    out_done(c, dt, dinp, di, N * C);
}

static void slot_gelu_fwd(void *ctx, ct_dtype dt, void *out, const void *inp, int64_t n) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, n, false);
    cpu_gelu_fwd(c, o, in_f32(c, 1, dt, inp, n), n);
    out_done(c, dt, out, o, n);
}

static void slot_gelu_bwd(void *ctx, ct_dtype dt, void *dinp, float *dbias, const void *inp,
                          const void *dout, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    const float *dO = in_f32(c, 1, dt, dout, N * C); /* before dinp's stage: they may alias */
    float *di = out_f32(c, 0, dt, dinp, N * C, false);
    cpu_gelu_bwd(c, di, dbias, in_f32(c, 2, dt, inp, N * C), dO, N, C);
    out_done(c, dt, dinp, di, N * C);
}

static void slot_attention_fwd(void *ctx, ct_dtype dt, void *out, float *lse, const void *qkv,
                               int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                               int64_t hd) {
    cpu_ctx *c = ctx;
    int64_t n_out = B * T * n_head * hd, n_qkv = B * T * (n_head + 2 * n_kv_head) * hd;
    float *o = out_f32(c, 0, dt, out, n_out, false);
    cpu_attention_fwd(c, o, lse, in_f32(c, 1, dt, qkv, n_qkv), B, T, n_head, n_kv_head, hd);
    out_done(c, dt, out, o, n_out);
}

static void slot_attention_bwd(void *ctx, ct_dtype dt, void *dqkv, float *dbias, const void *dout,
                               const void *qkv, const void *out, const float *lse, int64_t B,
                               int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    cpu_ctx *c = ctx;
    int64_t n_out = B * T * n_head * hd, n_qkv = B * T * (n_head + 2 * n_kv_head) * hd;
    float *dq = out_f32(c, 0, dt, dqkv, n_qkv, false);
    cpu_attention_bwd(c, dq, dbias, in_f32(c, 1, dt, dout, n_out), in_f32(c, 2, dt, qkv, n_qkv),
                      in_f32(c, 3, dt, out, n_out), lse, B, T, n_head, n_kv_head, hd);
    out_done(c, dt, dqkv, dq, n_qkv);
}

static void slot_xent_rowmax(void *ctx, ct_dtype dt, float *rowmax, const void *logits, int64_t N,
                             int64_t V, int64_t n_valid) {
    cpu_ctx *c = ctx;
    cpu_xent_rowmax(c, rowmax, in_f32(c, 0, dt, logits, N * V), N, V, n_valid);
}

static void slot_xent_sumexp(void *ctx, ct_dtype dt, float *sumexp, float *target_logit,
                             void *logits, const int32_t *targets, const float *rowmax, int64_t N,
                             int64_t V, int64_t n_valid, int64_t col_offset, bool keep_exp) {
    cpu_ctx *c = ctx;
    float *l = out_f32(c, 0, dt, logits, N * V, true);
    cpu_xent_sumexp(c, sumexp, target_logit, l, targets, rowmax, N, V, n_valid, col_offset,
                    keep_exp);
    if (keep_exp) out_done(c, dt, logits, l, N * V);
}

static void slot_xent_finish(void *ctx, ct_dtype dt, float *losses, void *logits,
                             const int32_t *targets, const float *rowmax, const float *sumexp,
                             const float *target_logit, int64_t N, int64_t V, int64_t n_valid,
                             int64_t col_offset, float dloss, bool write_grad) {
    cpu_ctx *c = ctx;
    float *l = out_f32(c, 0, dt, logits, N * V, write_grad);
    cpu_xent_finish(c, losses, l, targets, rowmax, sumexp, target_logit, N, V, n_valid, col_offset,
                    dloss, write_grad);
    if (write_grad) out_done(c, dt, logits, l, N * V);
}

/* ---- the backend ---------------------------------------------------------------------------- */

static void cpu_copy_host(void *ctx, void *dst, const void *src, size_t bytes) {
    cpu_copy(ctx, dst, src, bytes);
}

/* ---- the hardware peak: a fused multiply-add loop ------------------------------------------
 *
 * MFU's denominator is the machine's peak in the model's dtype, measured rather than looked up.
 * fp32 (and the pattern of the bf16 loop below): each thread runs
 * CHAINS independent dependency chains of vector FMAs on registers (no memory traffic), enough
 * to cover the FMA latency on every FMA port, and the best of a few short runs is taken. This
 * is what the cores really deliver at the vector width the compiler targets (AVX-512 clocks
 * included), i.e. cores × FMA ports × lanes × 2 × the clock under load. */
#if defined(__AVX512F__)
#define PEAK_VECTOR_BYTES 64
#elif defined(__AVX__)
#define PEAK_VECTOR_BYTES 32
#else
#define PEAK_VECTOR_BYTES 16
#endif
typedef float peak_vec __attribute__((vector_size(PEAK_VECTOR_BYTES)));
#define PEAK_LANES ((int)(PEAK_VECTOR_BYTES / sizeof(float)))
#define PEAK_CHAINS 16

/* Where fma_loop leaves its result, so the loop cannot be optimised away. */
static volatile float peak_sink;

/* FLOPs done by one thread: `iters` rounds of CHAINS FMAs of LANES lanes. */
static double fma_loop(int64_t iters) {
    peak_vec acc[PEAK_CHAINS], mul, add;
    for (int l = 0; l < PEAK_LANES; l++) mul[l] = 0.999999f, add[l] = 1e-7f;
    for (int c = 0; c < PEAK_CHAINS; c++)
        for (int l = 0; l < PEAK_LANES; l++) acc[c][l] = (float)(c + l);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = acc[c] * mul + add; /* contracted to FMA */
    peak_vec sum = acc[0];
    for (int c = 1; c < PEAK_CHAINS; c++) sum += acc[c];
    peak_sink = sum[0];
    return 2.0 * PEAK_LANES * PEAK_CHAINS * (double)iters;
}

/* FLOPs done by one thread with AVX512-BF16: `iters` rounds of CHAINS vdpbf16ps, each 16 fp32
 * lanes += two bf16 products (4 FLOPs per lane). */
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bf16"))) static double dpbf16_loop(int64_t iters) {
    __m512 acc[PEAK_CHAINS];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __m512 sum = acc[0];
    for (int c = 1; c < PEAK_CHAINS; c++) sum = _mm512_add_ps(sum, acc[c]);
    peak_sink = _mm512_reduce_add_ps(sum);
    return 4.0 * 16 * PEAK_CHAINS * (double)iters;
}
#endif

/* Best of 3 runs of `loop` on every thread, in FLOP/s. */
static double best_loop_rate(const cpu_ctx *c, double (*loop)(int64_t), int64_t iters) {
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        double flops = 0.0, t0 = ct_now();
#pragma omp parallel num_threads(c->n_threads) reduction(+ : flops)
        flops += loop(iters);
        double rate = flops / (ct_now() - t0);
        if (rate > best) best = rate;
    }
    return best;
}

/*
 * The bf16 peak. AVX512-BF16 without AMX: the vdpbf16ps loop above, the vector units' bf16 rate
 * (twice fp32's on the same ports). With AMX the tiles outrun any vector loop and their rate is
 * reached only through a tiled kernel, so the peak is oneDNN's best bf16 matmul at a large square
 * shape, measured. Without native bf16 (forced on by COOKTRAIN_CPU_BF16=1), oneDNN emulates bf16
 * on the fp32 units: the fp32 peak stands.
 */
static double cpu_peak_bf16(cpu_ctx *c, char *how, size_t how_cap) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512bf16") && !__builtin_cpu_supports("amx-bf16")) {
        double rate = best_loop_rate(c, dpbf16_loop, 1000000);
        snprintf(how, how_cap, "measured: 16-lane bf16 dot-product (vdpbf16ps) loop on %d thread%s",
                 c->n_threads, c->n_threads == 1 ? "" : "s");
        return rate;
    }
    if (__builtin_cpu_supports("amx-bf16")) {
        enum { S = 1024 };
        uint16_t *a = calloc((size_t)S * S, 2), *b = calloc((size_t)S * S, 2);
        float *out = malloc((size_t)S * S * sizeof(float));
        CT_ASSERT(a && b && out);
        if (omp_get_max_threads() != c->n_threads) omp_set_num_threads(c->n_threads);
        double best = 0.0;
        for (int rep = 0; rep < 4; rep++) { /* the first call builds the primitive */
            double t0 = ct_now();
            ct_cpu_gemm_onednn(false, false, S, S, S, 1.0f, a, S, b, S, 0.0f, out, S, CT_DTYPE_BF16,
                               CT_DTYPE_F32);
            double rate = 2.0 * S * S * S / (ct_now() - t0);
            if (rep > 0 && rate > best) best = rate;
        }
        free(a), free(b), free(out);
        snprintf(how, how_cap, "measured: oneDNN bf16 matmul %dx%dx%d on AMX tiles, %d thread%s", S,
                 S, S, c->n_threads, c->n_threads == 1 ? "" : "s");
        return best;
    }
#endif
    double rate = best_loop_rate(c, fma_loop, 2000000);
    snprintf(how, how_cap,
             "measured: %d-lane fp32 FMA loop on %d thread%s (no native bf16: "
             "bf16 GEMMs run on the fp32 units)",
             PEAK_LANES, c->n_threads, c->n_threads == 1 ? "" : "s");
    return rate;
}

static double cpu_peak_flops(void *ctx, ct_dtype dt, char *how, size_t how_cap) {
    cpu_ctx *c = ctx;
    if (dt == CT_DTYPE_BF16) return cpu_peak_bf16(c, how, how_cap);
    const double rate = best_loop_rate(c, fma_loop, 2000000); /* ~20 ms per thread */
    snprintf(how, how_cap, "measured: %d-lane fp32 FMA loop on %d thread%s", PEAK_LANES,
             c->n_threads, c->n_threads == 1 ? "" : "s");
    return rate;
}

static void cpu_describe(void *ctx, char *buf, size_t cap) {
    const cpu_ctx *c = ctx;
    snprintf(buf, cap, "%d thread%s", c->n_threads, c->n_threads == 1 ? "" : "s");
}

static void cpu_free_backend(void *ctx) {
    cpu_ctx *c = ctx;
    free(c->ws);
    for (int k = 0; k < N_STAGE; k++) free(c->stage[k]);
    free(c);
}

static const struct ct_backend_i cpu_iface = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .fill = cpu_fill,
    .copy_from_host = cpu_copy_host,
    .copy_to_host = cpu_copy_host,
    .copy = cpu_copy,
    .gemm = slot_gemm,
    .bias_add = slot_bias_add,
    .bias_init = slot_bias_init,
    .bias_grad = slot_bias_grad,
    .axpy = slot_axpy,
    .scale = slot_scale,
    .embedding_fwd = cpu_embedding_fwd,
    .embedding_bwd = slot_embedding_bwd,
    .posemb_fwd = slot_posemb_fwd,
    .posemb_bwd = slot_posemb_bwd,
    .layernorm_fwd = slot_layernorm_fwd,
    .layernorm_bwd = slot_layernorm_bwd,
    .gelu_fwd = slot_gelu_fwd,
    .gelu_bwd = slot_gelu_bwd,
    .attention_fwd = slot_attention_fwd,
    .attention_bwd = slot_attention_bwd,
    .xent_rowmax = slot_xent_rowmax,
    .xent_sumexp = slot_xent_sumexp,
    .xent_finish = slot_xent_finish,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
    .cast = cpu_cast,
    .event_record = NULL, /* everything runs synchronously on the calling thread's team */
    .event_wait = NULL,
    .sync = NULL,
    .peak_flops = cpu_peak_flops,
    .describe = cpu_describe,
    .free_backend = cpu_free_backend,
};

ct_backend *ct_backend_cpu_new(int n_threads) {
    if (n_threads <= 0) n_threads = omp_get_max_threads();
    cpu_ctx *c = ct_xcalloc(1, sizeof *c);
    c->n_threads = n_threads;
    /* One pool, ours: our loops pass num_threads explicitly, and OpenBLAS never threads on its
     * own — every sgemm runs on the thread that calls it (the fp32 GEMM spreads fixed row blocks
     * over the threads; attention calls it per head inside its own loop). Left to itself,
     * OpenBLAS opens a nested team whenever it is called from a one-thread region (an op too
     * small to split), and under libgomp's default spin-wait those short-lived nested threads
     * and the idle pool's spinning workers fight over the cores: measured on 2 cores, a 2-thread
     * test-tiny step took 3.3 s instead of 33 ms. */
    omp_set_num_threads(n_threads);
    openblas_set_num_threads(1);
    ct_backend *be = ct_xcalloc(1, sizeof *be);
    be->iface = &cpu_iface;
    be->ctx = c;
    ct_backend_apply_env(be);
    return be;
}
