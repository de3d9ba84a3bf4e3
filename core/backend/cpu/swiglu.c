/*
 * swiglu.c — SwiGLU on the CPU backend (cpu.h): out = silu(gate)·up and its backward, fp32 and
 * bf16 (read and written in place, no staging: elementwise, it gains nothing from widened copies);
 * σ uses exp_f32.
 */
#include "core/backend/cpu/cpu.h"

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

static void swiglu_fwd_f32(void *ctx, float *out, const float *gate, const float *up, int64_t N,
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

static void swiglu_bwd_f32(void *ctx, float *dgate, float *dup, const float *gate, const float *up,
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
static void swiglu_fwd_bf16(void *ctx, uint16_t *out, const uint16_t *gate, const uint16_t *up,
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

static void swiglu_bwd_bf16(void *ctx, uint16_t *dgate, uint16_t *dup, const uint16_t *gate,
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

/* SwiGLU is elementwise: bf16 is read and written in place (above), no staging. */
void ct_cpu_swiglu_fwd(void *ctx, ct_dtype dt, void *out, const void *gate, const void *up,
                       int64_t N, int64_t H, int64_t ld) {
    if (dt == CT_DTYPE_BF16)
        swiglu_fwd_bf16(ctx, out, gate, up, N, H, ld);
    else
        swiglu_fwd_f32(ctx, out, gate, up, N, H, ld);
}

void ct_cpu_swiglu_bwd(void *ctx, ct_dtype dt, void *dgate, void *dup, const void *gate,
                       const void *up, const void *dout, int64_t N, int64_t H, int64_t ld) {
    if (dt == CT_DTYPE_BF16)
        swiglu_bwd_bf16(ctx, dgate, dup, gate, up, dout, N, H, ld);
    else
        swiglu_bwd_f32(ctx, dgate, dup, gate, up, dout, N, H, ld);
}
