/*
 * cpu_kernels.c — the CPU backend's fp32 kernels for every op but attention (cpu_kernels.h):
 * memory, GEMM, bias, embeddings, layernorm, GELU, cross-entropy, AdamW, norms and casts.
 * backend_cpu.c says how they stay deterministic and fast.
 */
#include "cpu_kernels.h"

#include "cpu_gemm.h"
#include <cblas.h>

/* The workspace, at least `bytes` long. Contents are not preserved across growth. */
void *ct_cpu_ws_get(cpu_ctx *c, size_t bytes) {
    if (bytes > c->ws_bytes) {
        free(c->ws);
        c->ws_bytes = round_up(bytes, 64);
        c->ws = aligned_alloc(64, c->ws_bytes);
        CT_ASSERTF(c->ws != NULL, "cpu backend: out of memory for a %zu-byte workspace",
                   c->ws_bytes);
    }
    return c->ws;
}

/* ---- memory ------------------------------------------------------------------------------- */

void *ct_cpu_alloc(void *ctx, size_t bytes) {
    /* 64-byte alignment (a cache line, a full AVX-512 vector); not zeroed: callers fill. */
    return aligned_alloc(64, round_up(bytes ? bytes : 1, 64));
}

void ct_cpu_free(void *ctx, void *ptr) {
    free(ptr);
}

void ct_cpu_fill(void *ctx, void *dst, ct_dtype dtype, int64_t n, float value) {
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
void ct_cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
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

/* How ct_cpu_gemm tiles an M x N x K product: blocks of GEMM_ROW_BLOCK rows, and when there are
 * fewer than GEMM_MIN_TILES of them (the weight gradient of a layer whose output is the model
 * width: one block at d = 256 ran on one of two threads, at half the rate), each split into
 * n_col column pieces of `cols` (a multiple of 16 floats), so that there are at least
 * GEMM_MIN_TILES tiles and a multiple of 4 (even over 1, 2 and 4 threads), each at least
 * GEMM_MIN_COLS wide. A product under GEMM_SPLIT_MIN_MACS multiply-adds is not worth the split.
 * A function of the shape alone: never of the thread count. */
gemm_tiling ct_cpu_gemm_tiles(int64_t M, int64_t N, int64_t K) {
    gemm_tiling t = {.n_row = (M + GEMM_ROW_BLOCK - 1) / GEMM_ROW_BLOCK, .n_col = 1, .cols = N};
    if (t.n_row >= GEMM_MIN_TILES || (double)M * (double)N * (double)K < GEMM_SPLIT_MIN_MACS)
        return t;
    const int64_t most = CT_MAX(1, N / GEMM_MIN_COLS);
    while (t.n_col < most && (t.n_row * t.n_col < GEMM_MIN_TILES || t.n_row * t.n_col % 4 != 0))
        t.n_col++;
    t.cols = round_up((N + t.n_col - 1) / t.n_col, 16);
    t.n_col = (N + t.cols - 1) / t.cols;
    return t;
}

void ct_cpu_gemm(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                 void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    cpu_ctx *c = ctx;
    if (M == 0 || N == 0) return;
    const bool openblas = !c->sgemm_onednn && ab_dtype == CT_DTYPE_F32 && c_dtype == CT_DTYPE_F32;
    CT_ASSERTF(!openblas || (M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX &&
                             lda <= INT32_MAX && ldb <= INT32_MAX && ldc <= INT32_MAX),
               "cpu gemm: %lld x %lld x %lld exceeds the 32-bit BLAS interface", (long long)M,
               (long long)N, (long long)K);
    if (K == 0 || alpha == 0.0f) {
        /* op(A)·op(B) is empty or not asked for: C = beta·C, with beta = 0 meaning "overwrite"
         * as in BLAS. ct_cpu_gemm_onednn does that itself, reading neither A nor B nor oneDNN. */
        ct_cpu_gemm_onednn(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_dtype,
                           c_dtype);
        return;
    }
    /* C in fixed tiles, each one single-threaded GEMM, the tiles spread over the threads: oneDNN's
     * matmul (ct_cpu_gemm_serial, created for one thread) or, for fp32 with
     * COOKTRAIN_CPU_SGEMM=openblas, cblas_sgemm (OpenBLAS runs single-threaded inside our parallel
     * region). A library's own threading splits the work by the thread count: OpenBLAS splits C,
     * and its kernels treat the edge rows and columns of a piece with other micro-kernels whose
     * sums run in another order (measured on an EPYC where it picks its Haswell kernels, 1 and 3
     * threads disagreed in 10% of the elements of a 333x517x200 product); oneDNN splits K when C
     * is small (bf16 64x64x16384 on the EPYC: 68% of the elements differed between 1 and 2
     * threads). With tiles fixed by the shape alone, every element's sum is the same for any
     * thread count (the top of this file). Each tile re-packs its rows of op(A) and its columns
     * of op(B), ~1/GEMM_ROW_BLOCK + 1/cols of its arithmetic. */
    const gemm_tiling t = ct_cpu_gemm_tiles(M, N, K);
    const int64_t n_tiles = t.n_row * t.n_col;
    const size_t ab_size = ct_dtype_size(ab_dtype), c_size = ct_dtype_size(c_dtype);
    CT_PRAGMA(omp parallel for schedule(static) num_threads(CT_MIN(c->n_threads, n_tiles)))
    for (int64_t tile = 0; tile < n_tiles; tile++) {
        const int64_t i0 = tile / t.n_col * GEMM_ROW_BLOCK, j0 = tile % t.n_col * t.cols;
        const int64_t rows = CT_MIN(GEMM_ROW_BLOCK, M - i0), cols = CT_MIN(t.cols, N - j0);
        /* row i of op(A) is row i of A, or column i of A when transposed; column j of op(B) is
         * column j of B, or row j of B when transposed */
        const char *a = (const char *)A + (size_t)(trans_a ? i0 : i0 * lda) * ab_size;
        const char *b = (const char *)B + (size_t)(trans_b ? j0 * ldb : j0) * ab_size;
        char *ct = (char *)C + (size_t)(i0 * ldc + j0) * c_size;
        if (openblas)
            cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                        trans_b ? CblasTrans : CblasNoTrans, (int)rows, (int)cols, (int)K, alpha,
                        (const float *)a, (int)lda, (const float *)b, (int)ldb, beta, (float *)ct,
                        (int)ldc);
        else
            ct_cpu_gemm_serial(trans_a, trans_b, rows, cols, K, alpha, a, lda, b, ldb, beta, ct,
                               ldc, ab_dtype, c_dtype);
    }
}

/* ---- elementwise and bias ------------------------------------------------------------------ */

void ct_cpu_bias_add(void *ctx, float *out, const float *bias, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t i = 0; i < N; i++) {
        float *o = out + i * C;
#pragma omp simd
        for (int64_t j = 0; j < C; j++) o[j] += bias[j];
    }
}

void ct_cpu_bias_init(void *ctx, float *out, const float *bias, const float *residual, int64_t N,
                      int64_t C) {
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
void ct_cpu_sum_rows(float *dst, const float *rows, int64_t ld, int64_t n_rows, int64_t width) {
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
void ct_cpu_add_chunk_partials(cpu_ctx *c, float *dst, const float *partial, int64_t n_chunks,
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
void ct_cpu_bias_grad(void *ctx, float *dbias, const float *dout, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    int64_t n_chunks = (N + CHUNK_ROWS - 1) / CHUNK_ROWS;
    if (n_chunks == 0) return;
    float *partial =
        ct_cpu_ws_get(c, (size_t)n_chunks * (size_t)C * sizeof(float)); /* (n_chunks, C) */
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        int64_t r0 = ch * CHUNK_ROWS, r1 = CT_MIN(r0 + CHUNK_ROWS, N);
        ct_cpu_sum_rows(partial + ch * C, dout + r0 * C, C, r1 - r0, C);
    }
    ct_cpu_add_chunk_partials(c, dbias, partial, n_chunks, C, C);
}

void ct_cpu_axpy(void *ctx, float *dst, const float *src, float alpha, int64_t n) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, n))
    for (int64_t i = 0; i < n; i++) dst[i] += alpha * src[i];
}

void ct_cpu_scale(void *ctx, float *x, float s, int64_t n) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, n))
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* ---- embeddings --------------------------------------------------------------------------- */

/* A row gather: no arithmetic, so it is the slot for both dtypes (f32 and bf16 rows are copied
 * as they are). */
/* Rows independent (each thread its own output rows); a row's k terms in slot order. */
void ct_cpu_gather_rows(void *ctx, float *out, const float *in, const int32_t *idx, const float *w,
                        int64_t N, int64_t k, int64_t C) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * k * C))
    for (int64_t i = 0; i < N; i++) {
        float *o = out + i * C;
        for (int64_t j = 0; j < k; j++) {
            const float *r = in + (int64_t)idx[i * k + j] * C;
            const float wj = w ? w[i * k + j] : 1.0f;
            if (j == 0)
                for (int64_t x = 0; x < C; x++) o[x] = wj * r[x];
            else
                for (int64_t x = 0; x < C; x++) o[x] += wj * r[x];
        }
    }
}

/* One output a row, its products summed in double in column order. */
void ct_cpu_gather_dot(void *ctx, float *out, const float *a, const int32_t *ia, const float *b,
                       const int32_t *ib, int64_t R, int64_t C) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, R * C))
    for (int64_t r = 0; r < R; r++) {
        const float *x = a + (int64_t)ia[r] * C, *y = b + (int64_t)ib[r] * C;
        double dot = 0.0;
        for (int64_t j = 0; j < C; j++) dot += (double)x[j] * y[j];
        out[r] = (float)dot;
    }
}

void ct_cpu_embedding_fwd(void *ctx, ct_dtype dt, void *out, const int32_t *tokens,
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
void ct_cpu_embedding_bwd(void *ctx, float *dtable, const float *dout, const int32_t *tokens,
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

void ct_cpu_posemb_fwd(void *ctx, float *out, const float *wpe, int64_t B, int64_t T, int64_t C,
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
void ct_cpu_posemb_bwd(void *ctx, float *dwpe, const float *dout, int64_t B, int64_t T, int64_t C,
                       int64_t pos_offset) {
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

void ct_cpu_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd, const float *inp,
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
void ct_cpu_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd,
                          int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    int64_t n_chunks = (N + CHUNK_ROWS - 1) / CHUNK_ROWS;
    if (n_chunks == 0) return;
    float *partial = ct_cpu_ws_get(c, (size_t)n_chunks * 2 * (size_t)C * sizeof(float));
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
    ct_cpu_add_chunk_partials(c, dw, partial, n_chunks, C, 2 * C);
    ct_cpu_add_chunk_partials(c, db, partial + C, n_chunks, C, 2 * C);
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

void ct_cpu_gelu_fwd(void *ctx, float *out, const float *inp, int64_t n) {
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
void ct_cpu_gelu_bwd(void *ctx, float *dinp, float *dbias, const float *inp, const float *dout,
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
    float *partial =
        ct_cpu_ws_get(c, (size_t)n_chunks * (size_t)C * sizeof(float)); /* (n_chunks, C) */
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
    ct_cpu_add_chunk_partials(c, dbias, partial, n_chunks, C, C);
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

void ct_cpu_xent_rowmax(void *ctx, float *rowmax, const float *logits, int64_t N, int64_t V,
                        int64_t n_valid) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * n_valid))
    for (int64_t i = 0; i < N; i++) {
        const float *x = logits + i * V;
        rowmax[i] = row_max(x, n_valid); /* -inf for a shard made only of padding */
    }
}

/* One row of each step, shared by the fp32 kernels and the bf16 ones (which run them on a
 * widened copy of the row, so both compute the same fp32 values). */
static float sumexp_row(float *x, float mx, int64_t n_valid, bool keep_exp) {
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
    return lane_sum(acc);
}

/* x holds exp(logit - rowmax) in [0, n_valid): becomes dloss·softmax - dloss·onehot(t), padding
 * [n_valid, V) zero. */
static void grad_row(float *x, float se, int64_t V, int64_t n_valid, int64_t t, float dloss) {
    float g = dloss / se; /* dloss·softmax = dloss/sumexp · exp(logit - rowmax) */
#pragma omp simd
    for (int64_t j = 0; j < n_valid; j++) x[j] *= g;
    for (int64_t j = n_valid; j < V; j++) x[j] = 0.0f; /* vocabulary padding */
    if (t >= 0 && t < n_valid) x[t] -= dloss;
}

void ct_cpu_xent_sumexp(void *ctx, float *sumexp, float *target_logit, float *logits,
                        const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                        int64_t n_valid, int64_t col_offset, bool keep_exp) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * n_valid))
    for (int64_t i = 0; i < N; i++) {
        float *x = logits + i * V;
        int64_t t = (int64_t)targets[i] - col_offset;
        target_logit[i] = (t >= 0 && t < n_valid) ? x[t] : 0.0f; /* before keep_exp writes */
        sumexp[i] = sumexp_row(x, rowmax[i], n_valid, keep_exp);
    }
}

void ct_cpu_xent_finish(void *ctx, float *losses, float *logits, const int32_t *targets,
                        const float *rowmax, const float *sumexp, const float *target_logit,
                        int64_t N, int64_t V, int64_t n_valid, int64_t col_offset, float dloss,
                        bool write_grad) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, write_grad ? N * V : N))
    for (int64_t i = 0; i < N; i++) {
        losses[i] = logf(sumexp[i]) + rowmax[i] - target_logit[i];
        if (write_grad)
            grad_row(logits + i * V, sumexp[i], V, n_valid, (int64_t)targets[i] - col_offset,
                     dloss);
    }
}

/* bf16 logits, a row at a time through a per-thread fp32 row (no (N, V) staging copy, and the
 * row stays in cache between widening, the step and rounding back). */
#define BF16_ROWS(c, work, V, body)                                                                \
    CT_PRAGMA(omp parallel num_threads(threads_for(c, work))) {                                    \
        float *row = ct_xmalloc((size_t)CT_MAX(V, 1) * sizeof(float));                             \
        CT_PRAGMA(omp for schedule(static))                                                        \
        for (int64_t i = 0; i < N; i++) {                                                          \
            body                                                                                   \
        }                                                                                          \
        free(row);                                                                                 \
    }

static void widen_row(float *dst, const uint16_t *src, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) dst[j] = ct_bf16_to_f32(src[j]);
}

static void narrow_row(uint16_t *dst, const float *src, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) dst[j] = ct_f32_to_bf16(src[j]);
}

void ct_cpu_xent_rowmax_bf16(void *ctx, float *rowmax, const uint16_t *logits, int64_t N, int64_t V,
                             int64_t n_valid) {
    cpu_ctx *c = ctx;
    BF16_ROWS(c, N * n_valid, V, {
        widen_row(row, logits + i * V, n_valid);
        rowmax[i] = row_max(row, n_valid);
    })
}

void ct_cpu_xent_sumexp_bf16(void *ctx, float *sumexp, float *target_logit, uint16_t *logits,
                             const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                             int64_t n_valid, int64_t col_offset, bool keep_exp) {
    cpu_ctx *c = ctx;
    BF16_ROWS(c, N * n_valid, V, {
        uint16_t *x = logits + i * V;
        int64_t t = (int64_t)targets[i] - col_offset;
        widen_row(row, x, n_valid);
        target_logit[i] = (t >= 0 && t < n_valid) ? row[t] : 0.0f;
        sumexp[i] = sumexp_row(row, rowmax[i], n_valid, keep_exp);
        if (keep_exp) narrow_row(x, row, n_valid);
    })
}

void ct_cpu_xent_finish_bf16(void *ctx, float *losses, uint16_t *logits, const int32_t *targets,
                             const float *rowmax, const float *sumexp, const float *target_logit,
                             int64_t N, int64_t V, int64_t n_valid, int64_t col_offset, float dloss,
                             bool write_grad) {
    cpu_ctx *c = ctx;
    BF16_ROWS(c, write_grad ? N * V : N, V, {
        losses[i] = logf(sumexp[i]) + rowmax[i] - target_logit[i];
        if (write_grad) {
            uint16_t *x = logits + i * V;
            widen_row(row, x, n_valid);
            grad_row(row, sumexp[i], V, n_valid, (int64_t)targets[i] - col_offset, dloss);
            narrow_row(x, row, V);
        }
    })
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
void ct_cpu_adamw(void *ctx, float *param, const float *grad, float *m, float *v,
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
    double *partial = ct_cpu_ws_get(c, (size_t)(n_chunks ? n_chunks : 1) * sizeof(double));
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

void ct_cpu_sumsq(void *ctx, float *out, const float *const *x, const int64_t *n, int count) {
    for (int i = 0; i < count; i++) cpu_sumsq_one(ctx, out + i, x[i], n[i]);
}

void ct_cpu_cast(void *ctx, void *dst, ct_dtype dst_dtype, const void *src, ct_dtype src_dtype,
                 int64_t n) {
    cpu_ctx *c = ctx;
    int nt = threads_for(c, n);
    if (dst_dtype == src_dtype) {
        ct_cpu_copy(ctx, dst, src, (size_t)n * ct_dtype_size(dst_dtype));
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

void ct_cpu_cast_cols(void *ctx, void *dst, ct_dtype dst_dtype, int64_t ld_dst, const void *src,
                      ct_dtype src_dtype, int64_t ld_src, int64_t rows, int64_t cols) {
    cpu_ctx *c = ctx;
    const size_t dsz = ct_dtype_size(dst_dtype), ssz = ct_dtype_size(src_dtype);
    CT_ASSERTF(dst_dtype == src_dtype || (dsz == 2 && ssz == 4) || (dsz == 4 && ssz == 2),
               "cpu cast_cols: %s -> %s is not supported", ct_dtype_name(src_dtype),
               ct_dtype_name(dst_dtype));
    PARALLEL_FOR(threads_for(c, rows * cols))
    for (int64_t r = 0; r < rows; r++) {
        char *d = (char *)dst + (size_t)(r * ld_dst) * dsz;
        const char *s = (const char *)src + (size_t)(r * ld_src) * ssz;
        if (dst_dtype == src_dtype)
            memcpy(d, s, (size_t)cols * dsz);
        else if (dsz == 2)
            for (int64_t j = 0; j < cols; j++)
                ((uint16_t *)d)[j] = ct_f32_to_bf16(((const float *)s)[j]);
        else
            for (int64_t j = 0; j < cols; j++)
                ((float *)d)[j] = ct_bf16_to_f32(((const uint16_t *)s)[j]);
    }
}
