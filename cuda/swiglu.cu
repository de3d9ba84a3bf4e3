/*
 * swiglu.cu — SwiGLU forward and backward (the slots swiglu_fwd, swiglu_bwd; the CPU reference is
 * core/backend/cpu/swiglu.c, whose float formulas these repeat: σ(a) = 1/(1 + e^-a),
 * out = a·σ·u, dup = dout·a·σ, dgate = dout·u·σ·(1 + a(1 - σ))). Rows by column vectors (N rows of
 * H at row stride ld for gate, up, dgate and dup; out and dout dense), grid-stride, 16 bytes a load
 * where the widths and pointers allow, else element by element. expf, not the fast __expf, so σ
 * stays within a few ulps for large |a|.
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/launch.cuh"
#include "cuda/ct_cuda_ctx.h"

static __device__ inline float sigmoid(float a) {
    return 1.0f / (1.0f + expf(-a));
}

/* Row i (y, grid-stride), column vector cv (x, grid-stride) of VEC elements: gate and up at
 * row stride ld, out dense. VEC > 1 loads and stores 16 bytes at a time. */
template <typename T, int VEC>
static __global__ void swiglu_fwd_kernel(T *out, const T *gate, const T *up, int64_t N, int H,
                                         int64_t ld) {
    const int cols = H / VEC;
    for (int64_t i = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; i < N;
         i += (int64_t)gridDim.y * blockDim.y)
        for (int cv = (int)(blockIdx.x * blockDim.x + threadIdx.x); cv < cols;
             cv += (int)(gridDim.x * blockDim.x)) {
            const int64_t g = i * ld + (int64_t)cv * VEC;
            float a[VEC], u[VEC], o[VEC];
            ct_load<T, VEC>(gate + g, a);
            ct_load<T, VEC>(up + g, u);
            for (int k = 0; k < VEC; k++) o[k] = a[k] * sigmoid(a[k]) * u[k];
            ct_put<T, VEC>(out + i * H + (int64_t)cv * VEC, o);
        }
}

template <typename T, int VEC>
static __global__ void swiglu_bwd_kernel(T *dgate, T *dup, const T *gate, const T *up,
                                         const T *dout, int64_t N, int H, int64_t ld) {
    const int cols = H / VEC;
    for (int64_t i = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; i < N;
         i += (int64_t)gridDim.y * blockDim.y)
        for (int cv = (int)(blockIdx.x * blockDim.x + threadIdx.x); cv < cols;
             cv += (int)(gridDim.x * blockDim.x)) {
            const int64_t g = i * ld + (int64_t)cv * VEC;
            float a[VEC], u[VEC], d[VEC], du[VEC], dg[VEC];
            ct_load<T, VEC>(gate + g, a);
            ct_load<T, VEC>(up + g, u);
            ct_load<T, VEC>(dout + i * H + (int64_t)cv * VEC, d);
            for (int k = 0; k < VEC; k++) {
                const float s = sigmoid(a[k]);
                du[k] = d[k] * a[k] * s;
                dg[k] = d[k] * u[k] * s * (1.0f + a[k] * (1.0f - s));
            }
            ct_put<T, VEC>(dup + g, du);
            ct_put<T, VEC>(dgate + g, dg);
        }
}

static void swiglu_check(const char *op, ct_dtype dt, int64_t N, int64_t H, int64_t ld) {
    CT_ASSERTF(N >= 0 && H >= 0 && H < INT32_MAX && (N <= 1 || ld >= H), "%s N=%lld H=%lld ld=%lld",
               op, (long long)N, (long long)H, (long long)ld);
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "%s dtype %d", op, (int)dt);
}

/* 16 bytes a load (VEC = 16 / sizeof(T)) where the widths, strides and pointers allow; else one
 * element a thread. */
template <typename T>
static int swiglu_vec(int64_t H, int64_t ld, const void *p0, const void *p1, const void *p2,
                      const void *p3, const void *p4) {
    const int vec = 16 / (int)sizeof(T);
    const bool ok = H % vec == 0 && ld % vec == 0 && ct_launch_aligned(p0, 16) &&
                    ct_launch_aligned(p1, 16) && ct_launch_aligned(p2, 16) &&
                    ct_launch_aligned(p3, 16) && ct_launch_aligned(p4, 16);
    return ok ? vec : 1;
}

template <typename T>
static void swiglu_fwd(ct_cuda_ctx *cx, T *out, const T *gate, const T *up, int64_t N, int H,
                       int64_t ld) {
    const int vec = swiglu_vec<T>(H, ld, out, gate, up, out, out);
    dim3 grid, block;
    ct_launch_rows(cx, N, H / vec, &grid, &block);
    if (vec > 1)
        ct_launch(swiglu_fwd_kernel<T, 16 / sizeof(T)>, grid, block, 0, ct_cuda_stream(cx), out,
                  gate, up, N, H, ld);
    else
        ct_launch(swiglu_fwd_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), out, gate, up, N, H,
                  ld);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
static void swiglu_bwd(ct_cuda_ctx *cx, T *dgate, T *dup, const T *gate, const T *up, const T *dout,
                       int64_t N, int H, int64_t ld) {
    const int vec = swiglu_vec<T>(H, ld, dgate, dup, gate, up, dout);
    dim3 grid, block;
    ct_launch_rows(cx, N, H / vec, &grid, &block);
    if (vec > 1)
        ct_launch(swiglu_bwd_kernel<T, 16 / sizeof(T)>, grid, block, 0, ct_cuda_stream(cx), dgate,
                  dup, gate, up, dout, N, H, ld);
    else
        ct_launch(swiglu_bwd_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), dgate, dup, gate, up,
                  dout, N, H, ld);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_swiglu_fwd(void *ctx, ct_dtype dt, void *out, const void *gate,
                                   const void *up, int64_t N, int64_t H, int64_t ld) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    swiglu_check("swiglu_fwd", dt, N, H, ld);
    if (N * H == 0) return;
    if (dt == CT_DTYPE_BF16)
        swiglu_fwd<__nv_bfloat16>(cx, (__nv_bfloat16 *)out, (const __nv_bfloat16 *)gate,
                                  (const __nv_bfloat16 *)up, N, (int)H, ld);
    else
        swiglu_fwd<float>(cx, (float *)out, (const float *)gate, (const float *)up, N, (int)H, ld);
}

extern "C" void ct_cuda_swiglu_bwd(void *ctx, ct_dtype dt, void *dgate, void *dup, const void *gate,
                                   const void *up, const void *dout, int64_t N, int64_t H,
                                   int64_t ld) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    swiglu_check("swiglu_bwd", dt, N, H, ld);
    if (N * H == 0) return;
    if (dt == CT_DTYPE_BF16)
        swiglu_bwd<__nv_bfloat16>(cx, (__nv_bfloat16 *)dgate, (__nv_bfloat16 *)dup,
                                  (const __nv_bfloat16 *)gate, (const __nv_bfloat16 *)up,
                                  (const __nv_bfloat16 *)dout, N, (int)H, ld);
    else
        swiglu_bwd<float>(cx, (float *)dgate, (float *)dup, (const float *)gate, (const float *)up,
                          (const float *)dout, N, (int)H, ld);
}
