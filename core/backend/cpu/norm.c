/*
 * norm.c — the CPU backend's norms (cpu.h): LayerNorm and RMSNorm, forward (with the residual
 * add fused: inp += residual first, the sum rounded and stored) and backward. Sums inside a row
 * use the 16 fixed lanes; the weight gradients go through per-chunk partials added in chunk
 * order, so results do not depend on the thread count.
 */
#include "core/backend/cpu/cpu.h"

/* ---- layernorm ---------------------------------------------------------------------------- */

#define LN_EPS 1e-5f

static void layernorm_fwd_f32(void *ctx, float *out, float *mean, float *rstd, const float *inp,
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
static void layernorm_bwd_f32(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, const float *mean,
                              const float *rstd, int64_t N, int64_t C) {
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

/* ---- RMSNorm -------------------------------------------------------------------------------- */

/* Σ x_j² of one row in the 16 fixed lanes. */
static inline float row_sumsq(const float *x, int64_t C) {
    int64_t cv = C - C % LANES;
    vf16 acc = {0};
    for (int64_t j = 0; j < cv; j += LANES) {
        vf16 v = LOAD16(x + j);
        acc += v * v;
    }
    for (int64_t j = cv; j < C; j++) acc[j - cv] += x[j] * x[j];
    return vf16_sum(&acc);
}

static void rmsnorm_fwd_f32(void *ctx, float *out, float *rstd, const float *inp, const float *w,
                            int64_t N, int64_t C, float eps) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C;
        float s = 1.0f / sqrtf(row_sumsq(x, C) / (float)C + eps);
        float *o = out + i * C;
#pragma omp simd
        for (int64_t j = 0; j < C; j++) o[j] = x[j] * s * w[j];
        rstd[i] = s;
    }
}

/*
 * With g = dout·w and s = rstd (saved by forward): dinp += s·g - x·s³·Σ(g·x)/C, and
 * dw += sum_rows dout·x·s through per-chunk partials like layernorm_bwd's.
 */
static void rmsnorm_bwd_f32(void *ctx, float *dinp, float *dw, const float *dout, const float *inp,
                            const float *w, const float *rstd, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    int64_t n_chunks = (N + CHUNK_ROWS - 1) / CHUNK_ROWS;
    if (n_chunks == 0) return;
    float *partial = ct_cpu_ws_get(c, (size_t)n_chunks * (size_t)C * sizeof(float));
    PARALLEL_FOR(threads_for(c, N * C))
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        float *pdw = partial + ch * C;
        memset(pdw, 0, (size_t)C * sizeof(float));
        int64_t r0 = ch * CHUNK_ROWS, r1 = CT_MIN(r0 + CHUNK_ROWS, N);
        int64_t cv = C - C % LANES;
        for (int64_t i = r0; i < r1; i++) {
            const float *x = inp + i * C, *d = dout + i * C;
            float s = rstd[i];
            vf16 acc = {0};
            for (int64_t j = 0; j < cv; j += LANES)
                acc += LOAD16(d + j) * LOAD16(w + j) * LOAD16(x + j);
            for (int64_t j = cv; j < C; j++) acc[j - cv] += d[j] * w[j] * x[j];
            float k = s * s * s * vf16_sum(&acc) / (float)C;
            float *di = dinp + i * C;
#pragma omp simd
            for (int64_t j = 0; j < C; j++) {
                di[j] += s * d[j] * w[j] - x[j] * k;
                pdw[j] += d[j] * x[j] * s;
            }
        }
    }
    ct_cpu_add_chunk_partials(c, dw, partial, n_chunks, C, C);
}

void ct_cpu_layernorm_fwd(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd, void *inp,
                          const void *residual, const void *w, const void *b, int64_t N,
                          int64_t C) {
    cpu_ctx *c = ctx;
    if (residual) ct_cpu_axpy(c, dt, inp, residual, 1.0f, N * C); /* the sum, rounded and stored */
    float *o = out_f32(c, 0, dt, out, N * C, false);
    layernorm_fwd_f32(c, o, mean, rstd, in_f32(c, 1, dt, inp, N * C), in_f32(c, 2, dt, w, C),
                      in_f32(c, 3, dt, b, C), N, C);
    out_done(c, dt, out, o, N * C);
}

void ct_cpu_layernorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, float *db,
                          const void *dout, const void *inp, const void *w, const float *mean,
                          const float *rstd, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    float *di = out_f32(c, 0, dt, dinp, N * C, true); /* accumulates */
    layernorm_bwd_f32(c, di, dw, db, in_f32(c, 1, dt, dout, N * C), in_f32(c, 2, dt, inp, N * C),
                      in_f32(c, 3, dt, w, C), mean, rstd, N, C);
    out_done(c, dt, dinp, di, N * C);
}

void ct_cpu_rmsnorm_fwd(void *ctx, ct_dtype dt, void *out, float *rstd, void *inp,
                        const void *residual, const void *w, int64_t N, int64_t C, float eps) {
    cpu_ctx *c = ctx;
    if (residual) ct_cpu_axpy(c, dt, inp, residual, 1.0f, N * C);
    float *o = out_f32(c, 0, dt, out, N * C, false);
    rmsnorm_fwd_f32(c, o, rstd, in_f32(c, 1, dt, inp, N * C), in_f32(c, 2, dt, w, C), N, C, eps);
    out_done(c, dt, out, o, N * C);
}

void ct_cpu_rmsnorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, const void *dout,
                        const void *inp, const void *w, const float *rstd, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    float *di = out_f32(c, 0, dt, dinp, N * C, true); /* accumulates */
    rmsnorm_bwd_f32(c, di, dw, in_f32(c, 1, dt, dout, N * C), in_f32(c, 2, dt, inp, N * C),
                    in_f32(c, 3, dt, w, C), rstd, N, C);
    out_done(c, dt, dinp, di, N * C);
}
