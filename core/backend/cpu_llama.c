/*
 * cpu_llama.c — the CPU backend's fp32 kernels of the ops Llama-style blocks add (cpu_kernels.h):
 * RMSNorm, rotary position embedding and SwiGLU. The rules of backend_cpu.c hold: sums inside a
 * row use the 16 fixed lanes, sums across rows (rmsnorm_bwd's dw) go through per-chunk partials
 * added in chunk order, so results do not depend on the thread count; σ uses exp_f32.
 */
#include "cpu_kernels.h"

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

void ct_cpu_rmsnorm_fwd(void *ctx, float *out, float *rstd, const float *inp, const float *w,
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
void ct_cpu_rmsnorm_bwd(void *ctx, float *dinp, float *dw, const float *dout, const float *inp,
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

/* ---- rotary position embedding -------------------------------------------------------------- */

void ct_cpu_rope(void *ctx, float *x, const float *cos_sin, int64_t B, int64_t T,
                 int64_t n_rot_head, int64_t head_dim, int64_t ld, int64_t pos_offset,
                 bool inverse) {
    cpu_ctx *c = ctx;
    const float sign = inverse ? -1.0f : 1.0f;
    const int64_t half = head_dim / 2;
    PARALLEL_FOR(threads_for(c, B * T * n_rot_head * head_dim))
    for (int64_t r = 0; r < B * T; r++) {
        const float *cs = cos_sin + (pos_offset + r % T) * head_dim; /* (half, 2) */
        float *row = x + r * ld;
        for (int64_t h = 0; h < n_rot_head; h++) {
            float *v = row + h * head_dim;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float a = v[2 * i], b = v[2 * i + 1], co = cs[2 * i], si = sign * cs[2 * i + 1];
                v[2 * i] = a * co - b * si;
                v[2 * i + 1] = a * si + b * co;
            }
        }
    }
}

/* ---- SwiGLU --------------------------------------------------------------------------------- */

/* σ(a) = 1/(1 + e^-a): e^-a overflows to +inf for a < -88.7, giving 0 as it should. */
static inline float sigmoid_f32(float a) {
    return 1.0f / (1.0f + exp_f32(-a));
}

/* One element of each, shared by the fp32 and the bf16 kernels so both compute the same fp32
 * value (the bf16 kernels only widen before and round after). d silu(a)/da = σ(a)·(1 + a·(1 -
 * σ(a))). */
static inline float swiglu_elem(float a, float u) {
    return a * sigmoid_f32(a) * u;
}
static inline void swiglu_bwd_elem(float a, float u, float d, float *dg, float *du) {
    float s = sigmoid_f32(a);
    *du = d * a * s;
    *dg = d * u * s * (1.0f + a * (1.0f - s));
}

void ct_cpu_swiglu_fwd(void *ctx, float *out, const float *gate, const float *up, int64_t N,
                       int64_t H, int64_t ld) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * H))
    for (int64_t i = 0; i < N; i++) {
        const float *a = gate + i * ld, *u = up + i * ld;
        float *o = out + i * H;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) o[j] = swiglu_elem(a[j], u[j]);
    }
}

void ct_cpu_swiglu_bwd(void *ctx, float *dgate, float *dup, const float *gate, const float *up,
                       const float *dout, int64_t N, int64_t H, int64_t ld) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * H))
    for (int64_t i = 0; i < N; i++) {
        const float *a = gate + i * ld, *u = up + i * ld, *d = dout + i * H;
        float *dg = dgate + i * ld, *du = dup + i * ld;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) swiglu_bwd_elem(a[j], u[j], d[j], &dg[j], &du[j]);
    }
}

/* bf16 storage: read and written in place, no staging (an elementwise op gains nothing from the
 * widened copies and paid three passes over gate|up for them). */
void ct_cpu_swiglu_fwd_bf16(void *ctx, uint16_t *out, const uint16_t *gate, const uint16_t *up,
                            int64_t N, int64_t H, int64_t ld) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * H))
    for (int64_t i = 0; i < N; i++) {
        const uint16_t *a = gate + i * ld, *u = up + i * ld;
        uint16_t *o = out + i * H;
#pragma omp simd
        for (int64_t j = 0; j < H; j++)
            o[j] = ct_f32_to_bf16(swiglu_elem(ct_bf16_to_f32(a[j]), ct_bf16_to_f32(u[j])));
    }
}

void ct_cpu_swiglu_bwd_bf16(void *ctx, uint16_t *dgate, uint16_t *dup, const uint16_t *gate,
                            const uint16_t *up, const uint16_t *dout, int64_t N, int64_t H,
                            int64_t ld) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * H))
    for (int64_t i = 0; i < N; i++) {
        const uint16_t *a = gate + i * ld, *u = up + i * ld, *d = dout + i * H;
        uint16_t *dg = dgate + i * ld, *du = dup + i * ld;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            float g, v;
            swiglu_bwd_elem(ct_bf16_to_f32(a[j]), ct_bf16_to_f32(u[j]), ct_bf16_to_f32(d[j]), &g,
                            &v);
            dg[j] = ct_f32_to_bf16(g);
            du[j] = ct_f32_to_bf16(v);
        }
    }
}
