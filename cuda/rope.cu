/*
 * rope.cu — rotary position embedding (rope.cuh; the CPU reference is ct_cpu_rope in
 * core/backend/cpu_llama.c, whose float formula this repeats: a·cos - b·sin, a·sin + b·cos with
 * sin negated for the inverse). One thread per pair, grid-stride: each pair is read and written by
 * one thread only, so in place is safe. The angles come from the table (max_pos, head_dim/2, 2),
 * the same fp32 bytes the CPU reads.
 */
#include "cuda/ct_cuda.h"

#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/launch.cuh"
#include "cuda/rope.cuh"

template <typename T>
static __global__ void rope_kernel(T *x, const float *cos_sin, int64_t rows, int T_, int n_rot,
                                   int half, int64_t ld, int64_t pos_offset, float sign) {
    const int64_t n = rows * n_rot * half;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += stride) {
        const int i = (int)(p % half);
        const int64_t rh = p / half;
        const int h = (int)(rh % n_rot);
        const int64_t r = rh / n_rot;
        const float *cs = cos_sin + ((pos_offset + r % T_) * half + i) * 2;
        T *v = x + r * ld + (int64_t)h * 2 * half + 2 * i;
        const float a = ct_to_f32(v[0]), b = ct_to_f32(v[1]), co = cs[0], si = sign * cs[1];
        v[0] = ct_from_f32<T>(a * co - b * si);
        v[1] = ct_from_f32<T>(a * si + b * co);
    }
}

extern "C" void ct_cuda_rope(ct_cuda_ctx *cx, ct_dtype dt, void *x, const float *cos_sin, int64_t B,
                             int64_t T, int64_t n_rot_head, int64_t head_dim, int64_t ld,
                             int64_t pos_offset, bool inverse) {
    CT_ASSERTF(B >= 0 && T >= 0 && T < INT32_MAX && n_rot_head >= 0 && n_rot_head < INT32_MAX &&
                   head_dim > 0 && head_dim % 2 == 0 && head_dim < INT32_MAX,
               "rope B=%lld T=%lld n_rot_head=%lld head_dim=%lld", (long long)B, (long long)T,
               (long long)n_rot_head, (long long)head_dim);
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "rope dtype %d", (int)dt);
    const int64_t rows = B * T, pairs = rows * n_rot_head * (head_dim / 2);
    if (pairs == 0) return;
    const unsigned blocks = ct_launch_blocks(cx, pairs);
    const float sign = inverse ? -1.0f : 1.0f;
    if (dt == CT_DTYPE_BF16)
        ct_launch(rope_kernel<__nv_bfloat16>, dim3(blocks), dim3(CT_LAUNCH_THREADS), 0,
                  ct_cuda_stream(cx), (__nv_bfloat16 *)x, cos_sin, rows, (int)T, (int)n_rot_head,
                  (int)(head_dim / 2), ld, pos_offset, sign);
    else
        ct_launch(rope_kernel<float>, dim3(blocks), dim3(CT_LAUNCH_THREADS), 0, ct_cuda_stream(cx),
                  (float *)x, cos_sin, rows, (int)T, (int)n_rot_head, (int)(head_dim / 2), ld,
                  pos_offset, sign);
    CT_CUDA_CHECK(cudaGetLastError());
}
