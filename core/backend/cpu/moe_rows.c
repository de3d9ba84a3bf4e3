/*
 * moe_rows.c — Mixture of Experts' row movements on the CPU backend (cpu.h): gather_rows (rows
 * gathered by index, summed with weights in slot order) and gather_dot (dot products of
 * index-selected row pairs, summed in double), each an fp32 kernel and its slot.
 */
#include "core/backend/cpu/cpu.h"

/* Rows independent (each thread its own output rows); a row's k terms in slot order. */
static void gather_rows_f32(void *ctx, float *out, const float *in, const int32_t *idx,
                            const float *w, int64_t N, int64_t k, int64_t C) {
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
static void gather_dot_f32(void *ctx, float *out, const float *a, const int32_t *ia, const float *b,
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

void ct_cpu_gather_rows(void *ctx, ct_dtype dt, void *out, const void *in, const int32_t *idx,
                        const float *w, int64_t N, int64_t k, int64_t C, int64_t in_rows) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, N * C, false);
    gather_rows_f32(c, o, in_f32(c, 1, dt, in, in_rows * C), idx, w, N, k, C);
    out_done(c, dt, out, o, N * C);
}

void ct_cpu_gather_dot(void *ctx, ct_dtype dt, float *out, const void *a, const int32_t *ia,
                       const void *b, const int32_t *ib, int64_t R, int64_t C, int64_t a_rows,
                       int64_t b_rows) {
    cpu_ctx *c = ctx;
    gather_dot_f32(c, out, in_f32(c, 0, dt, a, a_rows * C), ia, in_f32(c, 1, dt, b, b_rows * C), ib,
                   R, C);
}
