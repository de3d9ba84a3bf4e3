/*
 * rope.c — rotary position embedding on the CPU backend (cpu.h): adjacent pairs of the first
 * n_rot_head heads of each row rotated in place by the angles of the host-built table (its
 * inverse, sin negated, is the backward).
 */
#include "core/backend/cpu/cpu.h"

/* ---- rotary position embedding -------------------------------------------------------------- */

static void rope_f32(void *ctx, float *x, const float *cos_sin, int64_t B, int64_t T,
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

/* out_done for `rows` rows of `cols` at row stride ld: only those elements are stored, so the
 * columns between (another operand's, or untouched) keep their bytes. */
static void out_done_rows(cpu_ctx *c, ct_dtype dt, void *p, const float *f, int64_t rows,
                          int64_t cols, int64_t ld) {
    if (dt == CT_DTYPE_F32) return;
    PARALLEL_FOR(threads_for(c, rows * cols))
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++)
            ((uint16_t *)p)[r * ld + j] = ct_f32_to_bf16(f[r * ld + j]);
}

void ct_cpu_rope(void *ctx, ct_dtype dt, void *x, const float *cos_sin, int64_t B, int64_t T,
                 int64_t n_rot_head, int64_t head_dim, int64_t ld, int64_t pos_offset,
                 bool inverse) {
    cpu_ctx *c = ctx;
    int64_t cols = n_rot_head * head_dim;
    float *xf = out_f32(c, 0, dt, x, ct_strided_extent(B * T, cols, ld), true); /* in place */
    rope_f32(c, xf, cos_sin, B, T, n_rot_head, head_dim, ld, pos_offset, inverse);
    out_done_rows(c, dt, x, xf, B * T, cols, ld);
}
