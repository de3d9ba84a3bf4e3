/*
 * elementwise.c — the CPU backend's element-wise ops (cpu.h): fill, bias_add, bias_init,
 * bias_grad, axpy, scale, cast and cast_cols, each an fp32 kernel and its slot (bf16 staged
 * through fp32, cpu.h), and the sums across rows in a fixed order that bias_grad and the other
 * ops' parameter gradients finish with.
 */
#include "core/backend/cpu/cpu.h"

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

static void bias_add_f32(void *ctx, float *out, const float *bias, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t i = 0; i < N; i++) {
        float *o = out + i * C;
#pragma omp simd
        for (int64_t j = 0; j < C; j++) o[j] += bias[j];
    }
}

static void bias_init_f32(void *ctx, float *out, const float *bias, const float *residual,
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
static void bias_grad_f32(void *ctx, float *dbias, const float *dout, int64_t N, int64_t C) {
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

static void axpy_f32(void *ctx, float *dst, const float *src, float alpha, int64_t n) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, n))
    for (int64_t i = 0; i < n; i++) dst[i] += alpha * src[i];
}

static void scale_f32(void *ctx, float *x, float s, int64_t n) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, n))
    for (int64_t i = 0; i < n; i++) x[i] *= s;
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

void ct_cpu_bias_add(void *ctx, ct_dtype dt, void *out, const void *bias, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, N * C, true);
    bias_add_f32(c, o, in_f32(c, 1, dt, bias, C), N, C);
    out_done(c, dt, out, o, N * C);
}

void ct_cpu_bias_init(void *ctx, ct_dtype dt, void *out, const void *bias, const void *residual,
                      int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, N * C, false);
    bias_init_f32(c, o, in_f32(c, 1, dt, bias, C), in_f32(c, 2, dt, residual, N * C), N, C);
    out_done(c, dt, out, o, N * C);
}

void ct_cpu_bias_grad(void *ctx, ct_dtype dt, float *dbias, const void *dout, int64_t N,
                      int64_t C) {
    cpu_ctx *c = ctx;
    bias_grad_f32(c, dbias, in_f32(c, 0, dt, dout, N * C), N, C);
}

void ct_cpu_axpy(void *ctx, ct_dtype dt, void *dst, const void *src, float alpha, int64_t n) {
    cpu_ctx *c = ctx;
    float *d = out_f32(c, 0, dt, dst, n, true);
    axpy_f32(c, d, in_f32(c, 1, dt, src, n), alpha, n);
    out_done(c, dt, dst, d, n);
}

void ct_cpu_scale(void *ctx, ct_dtype dt, void *x, float s, int64_t n) {
    cpu_ctx *c = ctx;
    float *f = out_f32(c, 0, dt, x, n, true);
    scale_f32(c, f, s, n);
    out_done(c, dt, x, f, n);
}
