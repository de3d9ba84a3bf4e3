/*
 * swiglu.cu — SwiGLU forward and backward (swiglu.cuh; the CPU reference is ct_cpu_swiglu_fwd /
 * _bwd in core/backend/cpu_llama.c, whose float formulas these repeat: σ(a) = 1/(1 + e^-a),
 * out = a·σ·u, dup = dout·a·σ, dgate = dout·u·σ·(1 + a(1 - σ))). One thread per element (N rows of
 * H at row stride ld for gate, up, dgate and dup; out and dout dense), grid-stride. expf, not the
 * fast __expf, so σ stays within a few ulps for large |a|.
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/launch.cuh"
#include "cuda/swiglu.cuh"

static __device__ inline float sigmoid(float a) {
    return 1.0f / (1.0f + expf(-a));
}

template <typename T>
static __global__ void swiglu_fwd_kernel(T *out, const T *gate, const T *up, int64_t N, int H,
                                         int64_t ld) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < N * H; e += stride) {
        const int64_t i = e / H, g = i * ld + e % H;
        const float a = ct_to_f32(gate[g]), u = ct_to_f32(up[g]);
        out[e] = ct_from_f32<T>(a * sigmoid(a) * u);
    }
}

template <typename T>
static __global__ void swiglu_bwd_kernel(T *dgate, T *dup, const T *gate, const T *up,
                                         const T *dout, int64_t N, int H, int64_t ld) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < N * H; e += stride) {
        const int64_t i = e / H, g = i * ld + e % H;
        const float a = ct_to_f32(gate[g]), u = ct_to_f32(up[g]), d = ct_to_f32(dout[e]);
        const float s = sigmoid(a);
        dup[g] = ct_from_f32<T>(d * a * s);
        dgate[g] = ct_from_f32<T>(d * u * s * (1.0f + a * (1.0f - s)));
    }
}

static void swiglu_check(const char *op, ct_dtype dt, int64_t N, int64_t H, int64_t ld) {
    CT_ASSERTF(N >= 0 && H >= 0 && H < INT32_MAX && (N <= 1 || ld >= H), "%s N=%lld H=%lld ld=%lld",
               op, (long long)N, (long long)H, (long long)ld);
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "%s dtype %d", op, (int)dt);
}

extern "C" void ct_cuda_swiglu_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, const void *gate,
                                   const void *up, int64_t N, int64_t H, int64_t ld) {
    swiglu_check("swiglu_fwd", dt, N, H, ld);
    if (N * H == 0) return;
    const dim3 grid(ct_launch_blocks(cx, N * H)), block(CT_LAUNCH_THREADS);
    if (dt == CT_DTYPE_BF16)
        ct_launch(swiglu_fwd_kernel<__nv_bfloat16>, grid, block, 0, ct_cuda_stream(cx),
                  (__nv_bfloat16 *)out, (const __nv_bfloat16 *)gate, (const __nv_bfloat16 *)up, N,
                  (int)H, ld);
    else
        ct_launch(swiglu_fwd_kernel<float>, grid, block, 0, ct_cuda_stream(cx), (float *)out,
                  (const float *)gate, (const float *)up, N, (int)H, ld);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_swiglu_bwd(ct_cuda_ctx *cx, ct_dtype dt, void *dgate, void *dup,
                                   const void *gate, const void *up, const void *dout, int64_t N,
                                   int64_t H, int64_t ld) {
    swiglu_check("swiglu_bwd", dt, N, H, ld);
    if (N * H == 0) return;
    const dim3 grid(ct_launch_blocks(cx, N * H)), block(CT_LAUNCH_THREADS);
    if (dt == CT_DTYPE_BF16)
        ct_launch(swiglu_bwd_kernel<__nv_bfloat16>, grid, block, 0, ct_cuda_stream(cx),
                  (__nv_bfloat16 *)dgate, (__nv_bfloat16 *)dup, (const __nv_bfloat16 *)gate,
                  (const __nv_bfloat16 *)up, (const __nv_bfloat16 *)dout, N, (int)H, ld);
    else
        ct_launch(swiglu_bwd_kernel<float>, grid, block, 0, ct_cuda_stream(cx), (float *)dgate,
                  (float *)dup, (const float *)gate, (const float *)up, (const float *)dout, N,
                  (int)H, ld);
    CT_CUDA_CHECK(cudaGetLastError());
}
