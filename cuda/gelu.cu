/*
 * gelu.cu — GELU, tanh form, forward and backward (the slots gelu_fwd, gelu_bwd; the backward
 * also sums the bias gradient of the layer before it when dbias is not NULL). The float formulas
 * are those of the CPU reference (gelu_t / gelu_grad in core/backend/cpu/gelu.c): gelu(x) = x / (1
 * + t) with t = exp(-2u), u = k(x + a x³), the exponent clamped to [-87, 88] as exp_clamped_f32
 * clamps it, and gelu'(x) = s·(1 + 2x·du·t·s) with s = 1/(1 + t), du = k(1 + 3a x²). The only
 * difference is expf (CUDA: at most 2 ulp; the CPU's exp_f32 about 1 ulp).
 *
 * Kernels:
 *   gelu_fwd_kernel        elementwise, grid-stride, 16-byte vectors over the aligned part.
 *   gelu_bwd_kernel        elementwise dinp = gelu'(inp)·dout (dinp may alias dout: each element
 *                          is read before the same thread writes it), used when dbias is NULL.
 *   gelu_bwd_dbias_kernel  the same values, plus the bias gradient: a block of 32 threads x
 *                          GELU_RY row groups owns one chunk of GELU_CHUNK_ROWS rows and 32·VEC
 *                          columns (VEC a 16-byte vector where C allows), each thread sums its
 *                          rows in order, the row groups are combined in order through
 *                          shared memory, one partial row per chunk goes to the workspace;
 * then dbias[j] += the partials added in chunk order (ct_cuda_colsum_add, elementwise.cuh). As
 * backend.h says, dbias sums the fp32 values before dinp is rounded to bf16.
 * No atomics: every sum runs in an order fixed by (N, C).
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/elementwise.cuh"
#include "cuda/ct_cuda_ctx.h"
#include "cuda/launch.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f
#define GELU_BLOCKS_PER_SM 16 /* grid cap, blocks per SM (launch.cuh's default is 8) */
#define GELU_CHUNK_ROWS 64    /* rows per partial sum of dbias */
#define GELU_RY 8             /* row groups per block of gelu_bwd_dbias_kernel */

/* ---- the function and its derivative (the CPU's operation order) ----------------------------- */

/* t = exp(-2u) = exp(x·(-2k - 2ka·x²)), exponent clamped to [-87, 88] (NaN -> -87, like the
 * CPU's clamp; x itself carries the NaN through). */
static __device__ inline float gelu_t(float x) {
    float e = x * fmaf(-2.0f * GELU_K * GELU_A, x * x, -2.0f * GELU_K);
    return expf(fminf(fmaxf(e, -87.0f), 88.0f));
}

static __device__ inline float gelu_val(float x) {
    return x / (1.0f + gelu_t(x));
}

static __device__ inline float gelu_grad(float x) {
    float t = gelu_t(x);
    float s = 1.0f / (1.0f + t);
    float du = fmaf(3.0f * GELU_K * GELU_A, x * x, GELU_K);
    return s * fmaf(2.0f * x * du, t * s, 1.0f);
}

/* ---- kernels --------------------------------------------------------------------------------- */

/* Vectors [0, n/VEC) grid-stride; the last n % VEC elements by the grid's first threads. */
template <typename T, int VEC>
static __global__ void gelu_fwd_kernel(T *out, const T *inp, int64_t n) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t nv = n / VEC;
    for (int64_t v = tid; v < nv; v += stride) {
        float f[VEC];
        ct_load<T, VEC>(inp + v * VEC, f);
        for (int k = 0; k < VEC; k++) f[k] = gelu_val(f[k]);
        ct_put<T, VEC>(out + v * VEC, f);
    }
    const int64_t j = nv * VEC + tid;
    if (j < n) out[j] = ct_from_f32<T>(gelu_val(ct_to_f32(inp[j])));
}

template <typename T, int VEC>
static __global__ void gelu_bwd_kernel(T *dinp, const T *inp, const T *dout, int64_t n) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t nv = n / VEC;
    for (int64_t v = tid; v < nv; v += stride) {
        float fx[VEC], fd[VEC];
        ct_load<T, VEC>(inp + v * VEC, fx);
        ct_load<T, VEC>(dout + v * VEC, fd);
        for (int k = 0; k < VEC; k++) fd[k] = gelu_grad(fx[k]) * fd[k];
        ct_put<T, VEC>(dinp + v * VEC, fd);
    }
    const int64_t j = nv * VEC + tid;
    if (j < n) dinp[j] = ct_from_f32<T>(gelu_grad(ct_to_f32(inp[j])) * ct_to_f32(dout[j]));
}

/* Block (32, GELU_RY): thread x owns the VEC adjacent columns from j0 = (blockIdx.y·32 + x)·VEC
 * (one vector load a row: a warp reads 32·VEC contiguous elements), chunk blockIdx.x. Row group
 * y takes rows r0 + y + GELU_RY·k in order; partial[chunk·C + j] = the groups added in order.
 * Every column's sums are the same whatever VEC: VEC only changes which thread adds them. With
 * VEC > 1, C % VEC == 0 and the rows are 16-byte aligned (the launcher checks). */
template <typename T, int VEC>
static __global__ void gelu_bwd_dbias_kernel(T *dinp, float *partial, const T *inp, const T *dout,
                                             int N, int C) {
    CT_SHARED(float, sh, GELU_RY * 32 * VEC);
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int j0 = (blockIdx.y * 32 + tx) * VEC;
    const int r0 = blockIdx.x * GELU_CHUNK_ROWS;
    const int r1 = r0 + GELU_CHUNK_ROWS < N ? r0 + GELU_CHUNK_ROWS : N;
    float acc[VEC];
    for (int k = 0; k < VEC; k++) acc[k] = 0.0f;
    if (j0 < C) {
        for (int r = r0 + ty; r < r1; r += GELU_RY) {
            const int64_t i = (int64_t)r * C + j0;
            float fx[VEC], fd[VEC];
            ct_load<T, VEC>(inp + i, fx);
            ct_load<T, VEC>(dout + i, fd);
            for (int k = 0; k < VEC; k++) {
                fd[k] = gelu_grad(fx[k]) * fd[k];
                acc[k] += fd[k];
            }
            ct_put<T, VEC>(dinp + i, fd);
        }
    }
    for (int k = 0; k < VEC; k++) sh[(ty * 32 + tx) * VEC + k] = acc[k];
    __syncthreads();
    if (ty == 0 && j0 < C) {
        for (int k = 0; k < VEC; k++) {
            float a = acc[k];
            for (int y = 1; y < GELU_RY; y++) a += sh[(y * 32 + tx) * VEC + k];
            partial[(int64_t)blockIdx.x * C + j0 + k] = a;
        }
    }
}

/* ---- launchers ------------------------------------------------------------------------------- */

template <typename T> static void gelu_fwd(ct_cuda_ctx *cx, void *out, const void *inp, int64_t n) {
    const int vec = 16 / (int)sizeof(T);
    if (ct_launch_aligned(out, 16) && ct_launch_aligned(inp, 16))
        ct_launch(gelu_fwd_kernel<T, 16 / sizeof(T)>,
                  dim3(ct_launch_blocks(cx, n / vec, GELU_BLOCKS_PER_SM)), dim3(CT_LAUNCH_THREADS),
                  0, ct_cuda_stream(cx), (T *)out, (const T *)inp, n);
    else
        ct_launch(gelu_fwd_kernel<T, 1>, dim3(ct_launch_blocks(cx, n, GELU_BLOCKS_PER_SM)),
                  dim3(CT_LAUNCH_THREADS), 0, ct_cuda_stream(cx), (T *)out, (const T *)inp, n);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
static void gelu_bwd(ct_cuda_ctx *cx, void *dinp, float *dbias, const void *inp, const void *dout,
                     int64_t N, int64_t C) {
    cudaStream_t st = ct_cuda_stream(cx);
    const int64_t n = N * C;
    const int vec = 16 / (int)sizeof(T);
    const bool aligned =
        ct_launch_aligned(dinp, 16) && ct_launch_aligned(inp, 16) && ct_launch_aligned(dout, 16);
    if (!dbias) {
        if (aligned)
            ct_launch(gelu_bwd_kernel<T, 16 / sizeof(T)>,
                      dim3(ct_launch_blocks(cx, n / vec, GELU_BLOCKS_PER_SM)),
                      dim3(CT_LAUNCH_THREADS), 0, st, (T *)dinp, (const T *)inp, (const T *)dout,
                      n);
        else
            ct_launch(gelu_bwd_kernel<T, 1>, dim3(ct_launch_blocks(cx, n, GELU_BLOCKS_PER_SM)),
                      dim3(CT_LAUNCH_THREADS), 0, st, (T *)dinp, (const T *)inp, (const T *)dout,
                      n);
        CT_CUDA_CHECK(cudaGetLastError());
        return;
    }
    CT_ASSERTF(N < INT32_MAX && C < INT32_MAX, "gelu_bwd N=%lld C=%lld", (long long)N,
               (long long)C);
    const int n_chunks = (int)((N + GELU_CHUNK_ROWS - 1) / GELU_CHUNK_ROWS);
    float *partial = (float *)ct_cuda_workspace(cx, 0, (size_t)n_chunks * (size_t)C * 4);
    dim3 block(32, GELU_RY);
    if (C % vec == 0 && aligned) {
        dim3 grid((unsigned)n_chunks, (unsigned)((C / vec + 31) / 32));
        ct_launch(gelu_bwd_dbias_kernel<T, 16 / sizeof(T)>, grid, block, 0, st, (T *)dinp, partial,
                  (const T *)inp, (const T *)dout, (int)N, (int)C);
    } else {
        dim3 grid((unsigned)n_chunks, (unsigned)((C + 31) / 32));
        ct_launch(gelu_bwd_dbias_kernel<T, 1>, grid, block, 0, st, (T *)dinp, partial,
                  (const T *)inp, (const T *)dout, (int)N, (int)C);
    }
    CT_CUDA_CHECK(cudaGetLastError());
    ct_cuda_colsum_add(cx, dbias, partial, n_chunks, C, C);
}

extern "C" void ct_cuda_gelu_fwd(void *ctx, ct_dtype dt, void *out, const void *inp, int64_t n) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "gelu_fwd dtype %d", (int)dt);
    if (n <= 0) return;
    if (dt == CT_DTYPE_BF16)
        gelu_fwd<__nv_bfloat16>(cx, out, inp, n);
    else
        gelu_fwd<float>(cx, out, inp, n);
}

extern "C" void ct_cuda_gelu_bwd(void *ctx, ct_dtype dt, void *dinp, float *dbias, const void *inp,
                                 const void *dout, int64_t N, int64_t C) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "gelu_bwd dtype %d", (int)dt);
    if (N <= 0 || C <= 0) return;
    if (dt == CT_DTYPE_BF16)
        gelu_bwd<__nv_bfloat16>(cx, dinp, dbias, inp, dout, N, C);
    else
        gelu_bwd<float>(cx, dinp, dbias, inp, dout, N, C);
}
