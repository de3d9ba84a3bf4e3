/*
 * embedding.c — the CPU backend's token and position embeddings (cpu.h): embedding_fwd (a row
 * gather, the same for both dtypes), embedding_bwd, posemb_fwd and posemb_bwd, each an fp32
 * kernel and its slot.
 */
#include "core/backend/cpu/cpu.h"

/* A row gather: no arithmetic, so it is the slot for both dtypes (f32 and bf16 rows are copied
 * as they are). */
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
static void embedding_bwd_f32(void *ctx, float *dtable, const float *dout, const int32_t *tokens,
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

static void posemb_fwd_f32(void *ctx, float *out, const float *wpe, int64_t B, int64_t T, int64_t C,
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
static void posemb_bwd_f32(void *ctx, float *dwpe, const float *dout, int64_t B, int64_t T,
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

void ct_cpu_embedding_bwd(void *ctx, ct_dtype dt, float *dtable, const void *dout,
                          const int32_t *tokens, int64_t N, int64_t C, int64_t rows,
                          int64_t row_offset) {
    cpu_ctx *c = ctx;
    embedding_bwd_f32(c, dtable, in_f32(c, 0, dt, dout, N * C), tokens, N, C, rows, row_offset);
}

void ct_cpu_posemb_fwd(void *ctx, ct_dtype dt, void *out, const void *wpe, int64_t B, int64_t T,
                       int64_t C, int64_t pos_offset) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, B * T * C, true);
    posemb_fwd_f32(c, o, in_f32(c, 1, dt, wpe, (pos_offset + T) * C), B, T, C, pos_offset);
    out_done(c, dt, out, o, B * T * C);
}

void ct_cpu_posemb_bwd(void *ctx, ct_dtype dt, float *dwpe, const void *dout, int64_t B, int64_t T,
                       int64_t C, int64_t pos_offset) {
    cpu_ctx *c = ctx;
    posemb_bwd_f32(c, dwpe, in_f32(c, 0, dt, dout, B * T * C), B, T, C, pos_offset);
}
