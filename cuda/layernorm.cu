/*
 * layernorm.cu — LayerNorm and RMSNorm, forward and backward (layernorm.cuh; the CPU references
 * are ct_cpu_layernorm_fwd / _bwd in core/backend/cpu_kernels.c and ct_cpu_rmsnorm_fwd / _bwd in
 * core/backend/cpu_llama.c, whose float formulas these kernels repeat: LayerNorm's two-pass
 * statistics with eps = 1e-5 added to the variance, RMSNorm's mean square plus the caller's eps,
 * rstd = 1/sqrtf). RMSNorm's kernels (rms_*) have LayerNorm's shapes without the mean and the
 * bias: rms_fwd_kernel and rms_bwd_dinp_kernel one warp per row, rms_bwd_dw_kernel the column
 * sums of dout·x·rstd per chunk, added by ct_cuda_colsum_add (elementwise.cuh).
 *
 * Kernels:
 *   ln_fwd_kernel       one warp per row (LN_WARPS rows per block): sum -> mean, sum of squared
 *                       deviations -> rstd, then out = (x - mean)·rstd·w + b. Three passes over the
 *                       row (the second and third hit L1/L2); no shared memory, no block barrier.
 *   ln_bwd_dinp_kernel  one warp per row: mean(g) and mean(g·n) over the row (g = dout·w,
 *                       n = (x - mean)·rstd), then dinp += rstd·(g - mean(g) - n·mean(g·n)).
 *   ln_bwd_dwdb_kernel  column sums for dw and db: a block of 32 columns x LN_RY row groups owns
 * one chunk of LN_CHUNK_ROWS rows; each thread sums its rows in order, the row groups are combined
 * in order through shared memory, and the block writes one partial row of (dw | db) per chunk into
 * the workspace; ct_cuda_colsum_add (elementwise.cuh) adds the chunks' partials into dst in chunk
 * order. Every sum runs in an order fixed by (N, C) alone: reruns give the same bits (no atomics).
 *
 * Rows are read with 16-byte vector loads (VEC elements) when every row starts 16-byte aligned (C
 * a multiple of VEC and aligned base pointers), otherwise element by element (VEC = 1): either
 * way VEC divides C, so the row kernels have no tail loop.
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/elementwise.cuh"
#include "cuda/layernorm.cuh"

#define LN_EPS 1e-5f     /* as the CPU reference */
#define LN_WARPS 8       /* rows (warps) per block of the row kernels */
#define LN_CHUNK_ROWS 64 /* rows per partial sum of dw and db */
#define LN_RY 8          /* row groups per block of ln_bwd_dwdb_kernel */

/* ---- forward --------------------------------------------------------------------------------- */

template <typename T, int VEC>
static __global__ void ln_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w,
                                     const T *b, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    if (row >= N) return; /* whole warps only; no block barrier below */
    const T *x = inp + (int64_t)row * C;
    T *o = out + (int64_t)row * C;
    const int nv = C / VEC; /* the launcher picks VEC > 1 only when it divides C */

    float acc = 0.0f;
    for (int v = lane; v < nv; v += 32) {
        float f[VEC];
        ct_load<T, VEC>(x + v * VEC, f);
        for (int k = 0; k < VEC; k++) acc += f[k];
    }
    const float m = ct_warp_sum(acc) / (float)C;

    /* two passes: no cancellation for rows with a large common offset */
    float acc2 = 0.0f;
    for (int v = lane; v < nv; v += 32) {
        float f[VEC];
        ct_load<T, VEC>(x + v * VEC, f);
        for (int k = 0; k < VEC; k++) acc2 += (f[k] - m) * (f[k] - m);
    }
    const float s = 1.0f / sqrtf(ct_warp_sum(acc2) / (float)C + LN_EPS);

    for (int v = lane; v < nv; v += 32) {
        float f[VEC], fw[VEC], fb[VEC];
        ct_load<T, VEC>(x + v * VEC, f);
        ct_load<T, VEC>(w + v * VEC, fw);
        ct_load<T, VEC>(b + v * VEC, fb);
        for (int k = 0; k < VEC; k++) f[k] = (f[k] - m) * s * fw[k] + fb[k];
        ct_put<T, VEC>(o + v * VEC, f);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

/* ---- backward -------------------------------------------------------------------------------- */

template <typename T, int VEC>
static __global__ void ln_bwd_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                          const float *mean, const float *rstd, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    if (row >= N) return;
    const T *x = inp + (int64_t)row * C, *d = dout + (int64_t)row * C;
    T *di = dinp + (int64_t)row * C;
    const float m = mean[row], s = rstd[row];
    const int nv = C / VEC; /* the launcher picks VEC > 1 only when it divides C */

    float acc_g = 0.0f, acc_gn = 0.0f;
    for (int v = lane; v < nv; v += 32) {
        float fx[VEC], fd[VEC], fw[VEC];
        ct_load<T, VEC>(x + v * VEC, fx);
        ct_load<T, VEC>(d + v * VEC, fd);
        ct_load<T, VEC>(w + v * VEC, fw);
        for (int k = 0; k < VEC; k++) {
            float n = (fx[k] - m) * s, g = fd[k] * fw[k];
            acc_g += g;
            acc_gn += g * n;
        }
    }
    const float g_mean = ct_warp_sum(acc_g) / (float)C;
    const float gn_mean = ct_warp_sum(acc_gn) / (float)C;

    for (int v = lane; v < nv; v += 32) {
        float fx[VEC], fd[VEC], fw[VEC], fi[VEC];
        ct_load<T, VEC>(x + v * VEC, fx);
        ct_load<T, VEC>(d + v * VEC, fd);
        ct_load<T, VEC>(w + v * VEC, fw);
        ct_load<T, VEC>(di + v * VEC, fi);
        for (int k = 0; k < VEC; k++) {
            float n = (fx[k] - m) * s, g = fd[k] * fw[k];
            fi[k] += s * (g - g_mean - n * gn_mean);
        }
        ct_put<T, VEC>(di + v * VEC, fi);
    }
}

/* partial[chunk] = [Σ dout·n over the chunk's rows (C) | Σ dout (C)]. Block (32, LN_RY): column
 * j = blockIdx.y·32 + threadIdx.x, chunk blockIdx.x; row group y sums rows r0 + y + LN_RY·k in
 * order, then the groups are added in order y = 0, 1, ... */
template <typename T>
static __global__ void ln_bwd_dwdb_kernel(float *partial, const T *dout, const T *inp,
                                          const float *mean, const float *rstd, int N, int C) {
    CT_SHARED(float, sh_dw, LN_RY * 32);
    CT_SHARED(float, sh_db, LN_RY * 32);
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int j = blockIdx.y * 32 + tx;
    const int r0 = blockIdx.x * LN_CHUNK_ROWS;
    const int r1 = r0 + LN_CHUNK_ROWS < N ? r0 + LN_CHUNK_ROWS : N;
    float dw = 0.0f, db = 0.0f;
    if (j < C) {
        for (int r = r0 + ty; r < r1; r += LN_RY) {
            const int64_t i = (int64_t)r * C + j;
            float d = ct_to_f32(dout[i]);
            float n = (ct_to_f32(inp[i]) - mean[r]) * rstd[r];
            dw += d * n;
            db += d;
        }
    }
    sh_dw[ty * 32 + tx] = dw;
    sh_db[ty * 32 + tx] = db;
    __syncthreads();
    if (ty == 0 && j < C) {
        for (int y = 1; y < LN_RY; y++) {
            dw += sh_dw[y * 32 + tx];
            db += sh_db[y * 32 + tx];
        }
        float *p = partial + (int64_t)blockIdx.x * 2 * C;
        p[j] = dw;
        p[C + j] = db;
    }
}

/* ---- RMSNorm --------------------------------------------------------------------------------- */

template <typename T, int VEC>
static __global__ void rms_fwd_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C,
                                      float eps) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    if (row >= N) return; /* whole warps only; no block barrier below */
    const T *x = inp + (int64_t)row * C;
    T *o = out + (int64_t)row * C;
    const int nv = C / VEC;
    float acc = 0.0f;
    for (int v = lane; v < nv; v += 32) {
        float f[VEC];
        ct_load<T, VEC>(x + v * VEC, f);
        for (int k = 0; k < VEC; k++) acc += f[k] * f[k];
    }
    const float s = 1.0f / sqrtf(ct_warp_sum(acc) / (float)C + eps);
    for (int v = lane; v < nv; v += 32) {
        float f[VEC], fw[VEC];
        ct_load<T, VEC>(x + v * VEC, f);
        ct_load<T, VEC>(w + v * VEC, fw);
        for (int k = 0; k < VEC; k++) f[k] = f[k] * s * fw[k];
        ct_put<T, VEC>(o + v * VEC, f);
    }
    if (lane == 0) rstd[row] = s;
}

/* dinp += s·g - x·s³·Σ(g·x)/C with g = dout·w, s = rstd. */
template <typename T, int VEC>
static __global__ void rms_bwd_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                           const float *rstd, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    if (row >= N) return;
    const T *x = inp + (int64_t)row * C, *d = dout + (int64_t)row * C;
    T *di = dinp + (int64_t)row * C;
    const float s = rstd[row];
    const int nv = C / VEC;
    float acc = 0.0f;
    for (int v = lane; v < nv; v += 32) {
        float fx[VEC], fd[VEC], fw[VEC];
        ct_load<T, VEC>(x + v * VEC, fx);
        ct_load<T, VEC>(d + v * VEC, fd);
        ct_load<T, VEC>(w + v * VEC, fw);
        for (int k = 0; k < VEC; k++) acc += fd[k] * fw[k] * fx[k];
    }
    const float kk = s * s * s * ct_warp_sum(acc) / (float)C;
    for (int v = lane; v < nv; v += 32) {
        float fx[VEC], fd[VEC], fw[VEC], fi[VEC];
        ct_load<T, VEC>(x + v * VEC, fx);
        ct_load<T, VEC>(d + v * VEC, fd);
        ct_load<T, VEC>(w + v * VEC, fw);
        ct_load<T, VEC>(di + v * VEC, fi);
        for (int k = 0; k < VEC; k++) fi[k] += s * fd[k] * fw[k] - fx[k] * kk;
        ct_put<T, VEC>(di + v * VEC, fi);
    }
}

/* partial[chunk] = Σ dout·x·rstd over the chunk's rows (C); the block shape of
 * ln_bwd_dwdb_kernel. */
template <typename T>
static __global__ void rms_bwd_dw_kernel(float *partial, const T *dout, const T *inp,
                                         const float *rstd, int N, int C) {
    CT_SHARED(float, sh_dw, LN_RY * 32);
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int j = blockIdx.y * 32 + tx;
    const int r0 = blockIdx.x * LN_CHUNK_ROWS;
    const int r1 = r0 + LN_CHUNK_ROWS < N ? r0 + LN_CHUNK_ROWS : N;
    float dw = 0.0f;
    if (j < C)
        for (int r = r0 + ty; r < r1; r += LN_RY) {
            const int64_t i = (int64_t)r * C + j;
            dw += ct_to_f32(dout[i]) * ct_to_f32(inp[i]) * rstd[r];
        }
    sh_dw[ty * 32 + tx] = dw;
    __syncthreads();
    if (ty == 0 && j < C) {
        for (int y = 1; y < LN_RY; y++) dw += sh_dw[y * 32 + tx];
        partial[(int64_t)blockIdx.x * C + j] = dw;
    }
}

/* ---- launchers ------------------------------------------------------------------------------- */

/* VEC elements per 16-byte load when every row of every pointer starts 16-byte aligned. */
template <typename T>
static bool ln_vec_ok(int64_t C, const void *p0, const void *p1, const void *p2, const void *p3) {
    const int vec = 16 / (int)sizeof(T);
    const uintptr_t mis = ((uintptr_t)p0 | (uintptr_t)p1 | (uintptr_t)p2 | (uintptr_t)p3) & 15u;
    return C % vec == 0 && mis == 0;
}

template <typename T>
static void ln_fwd(ct_cuda_ctx *cx, void *out, float *mean, float *rstd, const void *inp,
                   const void *w, const void *b, int N, int C) {
    dim3 grid((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), block(32 * LN_WARPS);
    if (ln_vec_ok<T>(C, out, inp, w, b))
        ct_launch(ln_fwd_kernel<T, 16 / sizeof(T)>, grid, block, 0, ct_cuda_stream(cx), (T *)out,
                  mean, rstd, (const T *)inp, (const T *)w, (const T *)b, N, C);
    else
        ct_launch(ln_fwd_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), (T *)out, mean, rstd,
                  (const T *)inp, (const T *)w, (const T *)b, N, C);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
static void ln_bwd(ct_cuda_ctx *cx, void *dinp, float *dw, float *db, const void *dout,
                   const void *inp, const void *w, const float *mean, const float *rstd, int N,
                   int C) {
    cudaStream_t st = ct_cuda_stream(cx);
    dim3 grid((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), block(32 * LN_WARPS);
    if (ln_vec_ok<T>(C, dinp, dout, inp, w))
        ct_launch(ln_bwd_dinp_kernel<T, 16 / sizeof(T)>, grid, block, 0, st, (T *)dinp,
                  (const T *)dout, (const T *)inp, (const T *)w, mean, rstd, N, C);
    else
        ct_launch(ln_bwd_dinp_kernel<T, 1>, grid, block, 0, st, (T *)dinp, (const T *)dout,
                  (const T *)inp, (const T *)w, mean, rstd, N, C);
    CT_CUDA_CHECK(cudaGetLastError());

    const int n_chunks = (N + LN_CHUNK_ROWS - 1) / LN_CHUNK_ROWS;
    float *partial = (float *)ct_cuda_workspace(cx, 0, (size_t)n_chunks * 2 * (size_t)C * 4);
    dim3 grid2((unsigned)n_chunks, (unsigned)((C + 31) / 32)), block2(32, LN_RY);
    ct_launch(ln_bwd_dwdb_kernel<T>, grid2, block2, 0, st, partial, (const T *)dout, (const T *)inp,
              mean, rstd, N, C);
    CT_CUDA_CHECK(cudaGetLastError());

    ct_cuda_colsum_add(cx, dw, partial, n_chunks, C, (int64_t)2 * C);
    ct_cuda_colsum_add(cx, db, partial + C, n_chunks, C, (int64_t)2 * C);
}

/* The launchers' argument checks; false when there are no rows (nothing to launch). */
static bool norm_args(const char *op, ct_dtype dt, int64_t N, int64_t C) {
    CT_ASSERTF(N >= 0 && C > 0 && N < INT32_MAX && C < INT32_MAX, "%s N=%lld C=%lld", op,
               (long long)N, (long long)C);
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "%s dtype %d", op, (int)dt);
    return N > 0;
}

extern "C" void ct_cuda_layernorm_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, float *mean,
                                      float *rstd, const void *inp, const void *w, const void *b,
                                      int64_t N, int64_t C) {
    if (!norm_args("layernorm_fwd", dt, N, C)) return;
    if (dt == CT_DTYPE_BF16)
        ln_fwd<__nv_bfloat16>(cx, out, mean, rstd, inp, w, b, (int)N, (int)C);
    else
        ln_fwd<float>(cx, out, mean, rstd, inp, w, b, (int)N, (int)C);
}

extern "C" void ct_cuda_layernorm_bwd(ct_cuda_ctx *cx, ct_dtype dt, void *dinp, float *dw,
                                      float *db, const void *dout, const void *inp, const void *w,
                                      const float *mean, const float *rstd, int64_t N, int64_t C) {
    if (!norm_args("layernorm_bwd", dt, N, C)) return;
    if (dt == CT_DTYPE_BF16)
        ln_bwd<__nv_bfloat16>(cx, dinp, dw, db, dout, inp, w, mean, rstd, (int)N, (int)C);
    else
        ln_bwd<float>(cx, dinp, dw, db, dout, inp, w, mean, rstd, (int)N, (int)C);
}

template <typename T>
static void rms_fwd(ct_cuda_ctx *cx, void *out, float *rstd, const void *inp, const void *w, int N,
                    int C, float eps) {
    dim3 grid((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), block(32 * LN_WARPS);
    if (ln_vec_ok<T>(C, out, inp, w, NULL))
        ct_launch(rms_fwd_kernel<T, 16 / sizeof(T)>, grid, block, 0, ct_cuda_stream(cx), (T *)out,
                  rstd, (const T *)inp, (const T *)w, N, C, eps);
    else
        ct_launch(rms_fwd_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), (T *)out, rstd,
                  (const T *)inp, (const T *)w, N, C, eps);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
static void rms_bwd(ct_cuda_ctx *cx, void *dinp, float *dw, const void *dout, const void *inp,
                    const void *w, const float *rstd, int N, int C) {
    cudaStream_t st = ct_cuda_stream(cx);
    dim3 grid((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), block(32 * LN_WARPS);
    if (ln_vec_ok<T>(C, dinp, dout, inp, w))
        ct_launch(rms_bwd_dinp_kernel<T, 16 / sizeof(T)>, grid, block, 0, st, (T *)dinp,
                  (const T *)dout, (const T *)inp, (const T *)w, rstd, N, C);
    else
        ct_launch(rms_bwd_dinp_kernel<T, 1>, grid, block, 0, st, (T *)dinp, (const T *)dout,
                  (const T *)inp, (const T *)w, rstd, N, C);
    CT_CUDA_CHECK(cudaGetLastError());

    const int n_chunks = (N + LN_CHUNK_ROWS - 1) / LN_CHUNK_ROWS;
    float *partial = (float *)ct_cuda_workspace(cx, 0, (size_t)n_chunks * (size_t)C * 4);
    dim3 grid2((unsigned)n_chunks, (unsigned)((C + 31) / 32)), block2(32, LN_RY);
    ct_launch(rms_bwd_dw_kernel<T>, grid2, block2, 0, st, partial, (const T *)dout, (const T *)inp,
              rstd, N, C);
    CT_CUDA_CHECK(cudaGetLastError());
    ct_cuda_colsum_add(cx, dw, partial, n_chunks, C, C);
}

extern "C" void ct_cuda_rmsnorm_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, float *rstd,
                                    const void *inp, const void *w, int64_t N, int64_t C,
                                    float eps) {
    if (!norm_args("rmsnorm_fwd", dt, N, C)) return;
    if (dt == CT_DTYPE_BF16)
        rms_fwd<__nv_bfloat16>(cx, out, rstd, inp, w, (int)N, (int)C, eps);
    else
        rms_fwd<float>(cx, out, rstd, inp, w, (int)N, (int)C, eps);
}

extern "C" void ct_cuda_rmsnorm_bwd(ct_cuda_ctx *cx, ct_dtype dt, void *dinp, float *dw,
                                    const void *dout, const void *inp, const void *w,
                                    const float *rstd, int64_t N, int64_t C) {
    if (!norm_args("rmsnorm_bwd", dt, N, C)) return;
    if (dt == CT_DTYPE_BF16)
        rms_bwd<__nv_bfloat16>(cx, dinp, dw, dout, inp, w, rstd, (int)N, (int)C);
    else
        rms_bwd<float>(cx, dinp, dw, dout, inp, w, rstd, (int)N, (int)C);
}
