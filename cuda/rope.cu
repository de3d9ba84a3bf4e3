/*
 * rope.cu — rotary position embedding (the slot rope; the CPU reference is
 * core/backend/cpu/rope.c, whose float formula this repeats: a·cos - b·sin, a·sin + b·cos with
 * sin negated for the inverse). One thread per two adjacent pairs (or per pair where rows or table
 * are not aligned for the vector loads), rows by pairs, grid-stride: each pair is read and written
 * by one thread only, so in place is safe; no 64-bit division per element. The angles come from the
 * table (max_pos, head_dim/2, 2), the same fp32 bytes the CPU reads.
 */
#include "cuda/ct_cuda.h"

#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/launch.cuh"
#include "cuda/ct_cuda_ctx.h"

/* Row r (y, grid-stride) of the packed activations, P adjacent pairs c·P .. c·P + P − 1 of its
 * rotated heads (x, grid-stride): pair j is elements 2j, 2j + 1 of the row (head j / half, pair
 * j % half of it). P = 2 loads the 4 elements and their 4 table floats as one vector each;
 * P = 1 reads element by element, as no alignment is known. */
template <typename T, int P>
static __global__ void rope_kernel(T *x, const float *cos_sin, int64_t rows, int T_, int n_rot,
                                   int half, int64_t ld, int64_t pos_offset, float sign) {
    constexpr int W = P == 1 ? 1 : 2 * P; /* elements a load */
    const int cols = n_rot * half / P;
    for (int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; r < rows;
         r += (int64_t)gridDim.y * blockDim.y) {
        const float *cs_row = cos_sin + (pos_offset + r % T_) * half * 2;
        T *row = x + r * ld;
        for (int c = (int)(blockIdx.x * blockDim.x + threadIdx.x); c < cols;
             c += (int)(gridDim.x * blockDim.x)) {
            const int j = c * P, i = j % half;
            float v[2 * P], cs[2 * P];
            for (int e = 0; e < 2 * P; e += W) {
                ct_load<T, W>(row + 2 * (int64_t)j + e, v + e);
                ct_load<float, W>(cs_row + 2 * i + e, cs + e);
            }
            for (int q = 0; q < P; q++) {
                const float a = v[2 * q], b = v[2 * q + 1], co = cs[2 * q],
                            si = sign * cs[2 * q + 1];
                v[2 * q] = a * co - b * si;
                v[2 * q + 1] = a * si + b * co;
            }
            for (int e = 0; e < 2 * P; e += W) ct_put<T, W>(row + 2 * (int64_t)j + e, v + e);
        }
    }
}

/* P pairs a thread: 2 when the rows, the pairs and the table allow the wider loads. */
template <typename T>
static void rope(ct_cuda_ctx *cx, T *x, const float *cos_sin, int64_t rows, int T_, int n_rot,
                 int half, int64_t ld, int64_t pos_offset, float sign) {
    const bool wide = half % 2 == 0 && ld % 4 == 0 && ct_launch_aligned(x, 4 * sizeof(T)) &&
                      ct_launch_aligned(cos_sin, 16);
    dim3 grid, block;
    ct_launch_rows(cx, rows, (int64_t)n_rot * half / (wide ? 2 : 1), &grid, &block);
    if (wide)
        ct_launch(rope_kernel<T, 2>, grid, block, 0, ct_cuda_stream(cx), x, cos_sin, rows, T_,
                  n_rot, half, ld, pos_offset, sign);
    else
        ct_launch(rope_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), x, cos_sin, rows, T_,
                  n_rot, half, ld, pos_offset, sign);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_rope(void *ctx, ct_dtype dt, void *x, const float *cos_sin, int64_t B,
                             int64_t T, int64_t n_rot_head, int64_t head_dim, int64_t ld,
                             int64_t pos_offset, bool inverse) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(B >= 0 && T >= 0 && T < INT32_MAX && n_rot_head >= 0 && n_rot_head < INT32_MAX &&
                   head_dim > 0 && head_dim % 2 == 0 && head_dim < INT32_MAX,
               "rope B=%lld T=%lld n_rot_head=%lld head_dim=%lld", (long long)B, (long long)T,
               (long long)n_rot_head, (long long)head_dim);
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "rope dtype %d", (int)dt);
    const int64_t rows = B * T;
    CT_ASSERTF(n_rot_head * (head_dim / 2) < INT32_MAX, "rope: %lld pairs a row",
               (long long)(n_rot_head * (head_dim / 2)));
    if (rows == 0 || n_rot_head == 0) return;
    const float sign = inverse ? -1.0f : 1.0f;
    if (dt == CT_DTYPE_BF16)
        rope<__nv_bfloat16>(cx, (__nv_bfloat16 *)x, cos_sin, rows, (int)T, (int)n_rot_head,
                            (int)(head_dim / 2), ld, pos_offset, sign);
    else
        rope<float>(cx, (float *)x, cos_sin, rows, (int)T, (int)n_rot_head, (int)(head_dim / 2), ld,
                    pos_offset, sign);
}
