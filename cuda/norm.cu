/*
 * norm.cu — the norms, LayerNorm and RMSNorm, forward and backward (the slots layernorm_fwd,
 * layernorm_bwd, rmsnorm_fwd, rmsnorm_bwd; one family: they share the backward kernel; the CPU
 * reference is core/backend/cpu/norm.c, whose float formulas these kernels repeat: LayerNorm's
 * two-pass statistics with eps = 1e-5 added to the variance, RMSNorm's mean square plus the
 * caller's eps, rstd = 1/sqrtf). RMSNorm's kernels have LayerNorm's shapes without the mean and the
 * bias.
 *
 * Kernels:
 *   ln_fwd_kernel, rms_fwd_kernel  one warp per row (LN_WARPS rows per block): LayerNorm's sum ->
 *                       mean, sum of squared deviations -> rstd, then out = (x - mean)·rstd·w + b
 *                       (RMSNorm: the mean square -> rstd, out = x·rstd·w). Up to three passes
 *                       over the row (the later ones hit L1/L2); no shared memory, no barrier.
 *                       With a residual, the first pass also makes x = x + residual, rounded to
 *                       the storage type and stored (the residual add fused into the norm that
 *                       reads its sum; the CPU's is ct_axpy's rounding, then the norm).
 *   norm_bwd_kernel     one block per chunk of LN_BWD_ROWS rows, a warp per row at a time: the
 *                       row's two means, dinp += ..., and in the same pass the weight (and bias)
 *                       gradient of the row added into the warp's accumulators in shared memory;
 *                       the block adds its warps' accumulators in order into one partial row per
 *                       chunk in the workspace, and ct_cuda_colsum_add (elementwise.cuh) adds the
 *                       chunks' partials into dst in chunk order. x and dout are read from memory
 *                       once (the second pass over a row hits L1). Every sum runs in an order fixed
 *                       by (N, C) alone: reruns give the same bits (no atomics).
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
#include "cuda/launch.cuh"
#include "cuda/ct_cuda_ctx.h"

#define LN_EPS 1e-5f   /* as the CPU reference */
#define LN_WARPS 8     /* rows (warps) per block of the row kernels */
#define LN_BWD_ROWS 32 /* rows per block of the backward (one partial row of dw, db each) */

/* ---- forward --------------------------------------------------------------------------------- */

/* The first pass's load of VEC elements of a row: x's, or with a residual (res not NULL) the sum
 * x + res rounded to T, stored back into x (the residual stream) and returned as stored. The
 * later passes of the same lane read back what it stored here. */
template <typename T, int VEC>
static __device__ inline void ln_load_sum(T *x, const T *res, float *f) {
    ct_load<T, VEC>(x, f);
    if (!res) return;
    float r[VEC];
    ct_load<T, VEC>(res, r);
    for (int k = 0; k < VEC; k++) f[k] = ct_to_f32(ct_from_f32<T>(f[k] + r[k]));
    ct_put<T, VEC>(x, f);
}

template <typename T, int VEC>
static __global__ void ln_fwd_kernel(T *out, float *mean, float *rstd, T *inp, const T *res,
                                     const T *w, const T *b, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    if (row >= N) return; /* whole warps only; no block barrier below */
    T *x = inp + (int64_t)row * C;
    const T *r = res ? res + (int64_t)row * C : NULL;
    T *o = out + (int64_t)row * C;
    const int nv = C / VEC; /* the launcher picks VEC > 1 only when it divides C */

    float acc = 0.0f;
    for (int v = lane; v < nv; v += 32) {
        float f[VEC];
        ln_load_sum<T, VEC>(x + v * VEC, r ? r + v * VEC : NULL, f);
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

/* ---- RMSNorm --------------------------------------------------------------------------------- */

template <typename T, int VEC>
static __global__ void rms_fwd_kernel(T *out, float *rstd, T *inp, const T *res, const T *w, int N,
                                      int C, float eps) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    if (row >= N) return; /* whole warps only; no block barrier below */
    T *x = inp + (int64_t)row * C;
    const T *r = res ? res + (int64_t)row * C : NULL;
    T *o = out + (int64_t)row * C;
    const int nv = C / VEC;
    float acc = 0.0f;
    for (int v = lane; v < nv; v += 32) {
        float f[VEC];
        ln_load_sum<T, VEC>(x + v * VEC, r ? r + v * VEC : NULL, f);
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

/* ---- backward, both norms ------------------------------------------------------------------ */

/* The warps of a backward block for rows of C columns: as many as keep their weight-gradient
 * accumulators (na rows of C floats each) in 48 KiB, 1 to LN_WARPS. */
static int norm_bwd_warps(int C, int na) {
    const int w = (48 * 1024 / 4) / (na * C);
    return w < 1 ? 1 : w > LN_WARPS ? LN_WARPS : w;
}

/* One pass over a chunk of LN_BWD_ROWS rows: dinp and the chunk's weight (and bias) gradient
 * partials. Warp q of the block's W takes rows r0 + q, r0 + q + W, ... in order, one row at a
 * time:
 *   LayerNorm  mean(g) and mean(g·n) over the row (g = dout·w, n = (x − mean)·rstd), then
 *              dinp += rstd·(g − mean(g) − n·mean(g·n)), dw += dout·n, db += dout;
 *   RMSNorm    dinp += s·g − x·s³·Σ(g·x)/C (s = rstd), dw += dout·x·s.
 * Each lane adds its own columns into its warp's accumulators in shared memory (column v·VEC + k
 * at k·nv + v, so the lanes of a warp hit consecutive banks); then the block adds the warps'
 * accumulators in order and writes partial[chunk] = [dw (C) | db (C)]. Every sum's order is fixed
 * by (N, C). */
template <typename T, int VEC, bool RMS>
static __global__ void __launch_bounds__(32 * LN_WARPS)
    norm_bwd_kernel(T *dinp, float *partial, const T *dout, const T *inp, const T *w,
                    const float *mean, const float *rstd, int N, int C) {
    CT_DYN_SHARED(float, acc); /* (W, na, C): warp q's dw, then (LayerNorm) its db */
    constexpr int na = RMS ? 1 : 2;
    const int lane = threadIdx.x % 32, q = threadIdx.x / 32, W = blockDim.x / 32;
    const int nv = C / VEC; /* the launcher picks VEC > 1 only when it divides C */
    float *aw = acc + (int64_t)q * na * C, *ab = aw + C;
    for (int v = lane; v < nv; v += 32)
        for (int k = 0; k < VEC; k++) {
            aw[k * nv + v] = 0.0f;
            if (!RMS) ab[k * nv + v] = 0.0f;
        }
    const int r0 = blockIdx.x * LN_BWD_ROWS;
    const int r1 = r0 + LN_BWD_ROWS < N ? r0 + LN_BWD_ROWS : N;
    for (int row = r0 + q; row < r1; row += W) {
        const T *x = inp + (int64_t)row * C, *d = dout + (int64_t)row * C;
        T *di = dinp + (int64_t)row * C;
        const float m = RMS ? 0.0f : mean[row], s = rstd[row];
        float acc_g = 0.0f, acc_gn = 0.0f;
        for (int v = lane; v < nv; v += 32) {
            float fx[VEC], fd[VEC], fw[VEC];
            ct_load<T, VEC>(x + v * VEC, fx);
            ct_load<T, VEC>(d + v * VEC, fd);
            ct_load<T, VEC>(w + v * VEC, fw);
            for (int k = 0; k < VEC; k++) {
                if (RMS) {
                    acc_g += fd[k] * fw[k] * fx[k];
                } else {
                    const float n = (fx[k] - m) * s, g = fd[k] * fw[k];
                    acc_g += g;
                    acc_gn += g * n;
                }
            }
        }
        const float sum_g = ct_warp_sum(acc_g);
        const float g_mean = sum_g / (float)C, kk = s * s * s * sum_g / (float)C;
        const float gn_mean = RMS ? 0.0f : ct_warp_sum(acc_gn) / (float)C;
        for (int v = lane; v < nv; v += 32) {
            float fx[VEC], fd[VEC], fw[VEC], fi[VEC];
            ct_load<T, VEC>(x + v * VEC, fx);
            ct_load<T, VEC>(d + v * VEC, fd);
            ct_load<T, VEC>(w + v * VEC, fw);
            ct_load<T, VEC>(di + v * VEC, fi);
            for (int k = 0; k < VEC; k++) {
                if (RMS) {
                    fi[k] += s * fd[k] * fw[k] - fx[k] * kk;
                    aw[k * nv + v] += fd[k] * fx[k] * s;
                } else {
                    const float n = (fx[k] - m) * s, g = fd[k] * fw[k];
                    fi[k] += s * (g - g_mean - n * gn_mean);
                    aw[k * nv + v] += fd[k] * n;
                    ab[k * nv + v] += fd[k];
                }
            }
            ct_put<T, VEC>(di + v * VEC, fi);
        }
    }
    __syncthreads();
    float *prow = partial + (int64_t)blockIdx.x * na * C;
    for (int c = threadIdx.x; c < na * C; c += blockDim.x) {
        const int col = c % C, slot = c - col + col % VEC * nv + col / VEC;
        float t = acc[slot];
        for (int p = 1; p < W; p++) t += acc[(int64_t)p * na * C + slot];
        prow[c] = t;
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
static void ln_fwd(ct_cuda_ctx *cx, void *out, float *mean, float *rstd, void *inp, const void *res,
                   const void *w, const void *b, int N, int C) {
    dim3 grid((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), block(32 * LN_WARPS);
    if (ln_vec_ok<T>(C, out, inp, w, b) && ln_vec_ok<T>(C, res, NULL, NULL, NULL))
        ct_launch(ln_fwd_kernel<T, 16 / sizeof(T)>, grid, block, 0, ct_cuda_stream(cx), (T *)out,
                  mean, rstd, (T *)inp, (const T *)res, (const T *)w, (const T *)b, N, C);
    else
        ct_launch(ln_fwd_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), (T *)out, mean, rstd,
                  (T *)inp, (const T *)res, (const T *)w, (const T *)b, N, C);
    CT_CUDA_CHECK(cudaGetLastError());
}

/* The fused backward (norm_bwd_kernel) over N rows, then dw (and db) += the chunks' partials in
 * chunk order. */
template <typename T, bool RMS>
static void norm_bwd(ct_cuda_ctx *cx, void *dinp, float *dw, float *db, const void *dout,
                     const void *inp, const void *w, const float *mean, const float *rstd, int N,
                     int C) {
    constexpr int na = RMS ? 1 : 2;
    const int W = norm_bwd_warps(C, na), n_chunks = (N + LN_BWD_ROWS - 1) / LN_BWD_ROWS;
    const size_t smem = (size_t)W * na * (size_t)C * sizeof(float);
    CT_ASSERTF(smem <= 227 * 1024, "norm backward: C=%d needs %zu bytes of shared memory", C, smem);
    float *partial = (float *)ct_cuda_workspace(cx, 0, (size_t)n_chunks * na * (size_t)C * 4);
    const bool vec = ln_vec_ok<T>(C, dinp, dout, inp, w);
    auto kernel = vec ? norm_bwd_kernel<T, 16 / sizeof(T), RMS> : norm_bwd_kernel<T, 1, RMS>;
    ct_launch_allow_smem(kernel, smem);
    ct_launch(kernel, dim3((unsigned)n_chunks), dim3(32 * W), smem, ct_cuda_stream(cx), (T *)dinp,
              partial, (const T *)dout, (const T *)inp, (const T *)w, mean, rstd, N, C);
    CT_CUDA_CHECK(cudaGetLastError());
    ct_cuda_colsum_add(cx, dw, partial, n_chunks, C, (int64_t)na * C);
    if (!RMS) ct_cuda_colsum_add(cx, db, partial + C, n_chunks, C, (int64_t)na * C);
}

/* The launchers' argument checks; false when there are no rows (nothing to launch). */
static bool norm_args(const char *op, ct_dtype dt, int64_t N, int64_t C) {
    CT_ASSERTF(N >= 0 && C > 0 && N < INT32_MAX && C < INT32_MAX, "%s N=%lld C=%lld", op,
               (long long)N, (long long)C);
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "%s dtype %d", op, (int)dt);
    return N > 0;
}

extern "C" void ct_cuda_layernorm_fwd(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd,
                                      void *inp, const void *residual, const void *w, const void *b,
                                      int64_t N, int64_t C) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    if (!norm_args("layernorm_fwd", dt, N, C)) return;
    if (dt == CT_DTYPE_BF16)
        ln_fwd<__nv_bfloat16>(cx, out, mean, rstd, inp, residual, w, b, (int)N, (int)C);
    else
        ln_fwd<float>(cx, out, mean, rstd, inp, residual, w, b, (int)N, (int)C);
}

extern "C" void ct_cuda_layernorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, float *db,
                                      const void *dout, const void *inp, const void *w,
                                      const float *mean, const float *rstd, int64_t N, int64_t C) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    if (!norm_args("layernorm_bwd", dt, N, C)) return;
    if (dt == CT_DTYPE_BF16)
        norm_bwd<__nv_bfloat16, false>(cx, dinp, dw, db, dout, inp, w, mean, rstd, (int)N, (int)C);
    else
        norm_bwd<float, false>(cx, dinp, dw, db, dout, inp, w, mean, rstd, (int)N, (int)C);
}

template <typename T>
static void rms_fwd(ct_cuda_ctx *cx, void *out, float *rstd, void *inp, const void *res,
                    const void *w, int N, int C, float eps) {
    dim3 grid((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), block(32 * LN_WARPS);
    if (ln_vec_ok<T>(C, out, inp, w, res))
        ct_launch(rms_fwd_kernel<T, 16 / sizeof(T)>, grid, block, 0, ct_cuda_stream(cx), (T *)out,
                  rstd, (T *)inp, (const T *)res, (const T *)w, N, C, eps);
    else
        ct_launch(rms_fwd_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), (T *)out, rstd,
                  (T *)inp, (const T *)res, (const T *)w, N, C, eps);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_rmsnorm_fwd(void *ctx, ct_dtype dt, void *out, float *rstd, void *inp,
                                    const void *residual, const void *w, int64_t N, int64_t C,
                                    float eps) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    if (!norm_args("rmsnorm_fwd", dt, N, C)) return;
    if (dt == CT_DTYPE_BF16)
        rms_fwd<__nv_bfloat16>(cx, out, rstd, inp, residual, w, (int)N, (int)C, eps);
    else
        rms_fwd<float>(cx, out, rstd, inp, residual, w, (int)N, (int)C, eps);
}

extern "C" void ct_cuda_rmsnorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, const void *dout,
                                    const void *inp, const void *w, const float *rstd, int64_t N,
                                    int64_t C) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    if (!norm_args("rmsnorm_bwd", dt, N, C)) return;
    if (dt == CT_DTYPE_BF16)
        norm_bwd<__nv_bfloat16, true>(cx, dinp, dw, NULL, dout, inp, w, NULL, rstd, (int)N, (int)C);
    else
        norm_bwd<float, true>(cx, dinp, dw, NULL, dout, inp, w, NULL, rstd, (int)N, (int)C);
}
