/*
 * gelu.c — GELU (tanh approximation, GPT-2) on the CPU backend (cpu.h): forward, and backward
 * with the bias gradient of the layer before it summed in the same pass.
 */
#include "core/backend/cpu/cpu.h"

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

static void gelu_fwd_f32(void *ctx, float *out, const float *inp, int64_t n) {
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
static void gelu_bwd_f32(void *ctx, float *dinp, float *dbias, const float *inp, const float *dout,
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

void ct_cpu_gelu_fwd(void *ctx, ct_dtype dt, void *out, const void *inp, int64_t n) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, n, false);
    gelu_fwd_f32(c, o, in_f32(c, 1, dt, inp, n), n);
    out_done(c, dt, out, o, n);
}

void ct_cpu_gelu_bwd(void *ctx, ct_dtype dt, void *dinp, float *dbias, const void *inp,
                     const void *dout, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    const float *dO = in_f32(c, 1, dt, dout, N * C); /* before dinp's stage: they may alias */
    float *di = out_f32(c, 0, dt, dinp, N * C, false);
    gelu_bwd_f32(c, di, dbias, in_f32(c, 2, dt, inp, N * C), dO, N, C);
    out_done(c, dt, dinp, di, N * C);
}
