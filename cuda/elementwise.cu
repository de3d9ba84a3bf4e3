/*
 * elementwise.cu — fill, bias and residual adds, the bias gradient, axpy, scale and dtype casts
 * (the slots fill, bias_add, bias_init, bias_grad, axpy, scale, cast, cast_cols), and the helpers
 * other kernel files share (elementwise.cuh). The CPU reference is core/backend/cpu/elementwise.c;
 * each kernel computes the same fp32 expression per element (bf16 widened on load, rounded to
 * nearest even on store), so every result here is bit-identical to the CPU's:
 *   bias_add   out = out + bias
 *   bias_init  out = bias, or residual + bias
 *   axpy       dst = fmaf(alpha, src, dst)   (the CPU build, -O3 -march=native in GNU C, contracts
 *              its dst += alpha·src into the same single-rounding FMA)
 *   scale      x = x·s
 *   cast       f32 <-> bf16, same dtype: a device copy
 *   accumulate_rounded   C = bf16(fmaf(beta, C, prod)): a bf16 GEMM's accumulation (no CPU slot:
 *              the CPU's GEMM rounds once, and this is how the CUDA gemm slot does the same)
 *   bias_grad  dbias(C) += Σ rows of dout, in the CPU's order: rows summed in order inside chunks
 *              of EW_CHUNK_ROWS (= the CPU's CHUNK_ROWS) starting from the chunk's first row, the
 *              chunk partials added in chunk order starting from chunk 0, then added to dbias.
 *
 * Kernels:
 *   ew_fill_kernel        16-byte stores of a replicated pattern over the aligned part,
 *                         grid-stride.
 *   ew_bias_kernel        rows x column vectors (2-D grid-stride): out = [residual +] bias [+ out].
 *   ew_colsum_kernel      bias_grad phase 1: one thread per (chunk, column vector) sums the
 *                         chunk's rows in order; with a single chunk it adds straight into dbias.
 *   ew_partials_kernel    bias_grad phase 2 (ct_cuda_colsum_add, which the norms, GELU and
 *                         attention call for their bias and weight gradients too): a block per 32
 *                         columns stages the chunk partials through shared memory, and a lane per
 *                         column adds them in chunk order, then into the destination.
 *   ew_axpy_kernel, ew_scale_kernel, ew_cast_kernel   flat grid-stride, 16-byte vectors (cast:
 *                         4 elements) over the aligned part, the n % VEC tail by the grid's first
 *                         threads.
 *   ew_cast_cols_kernel   cast_cols: one grid-stride walk over the rows × cols elements of the
 *                         column range, each converted as by cast (same dtype: the same bits).
 * Vector paths are taken only when every pointer involved is aligned to the vector's size (and,
 * for row kernels, C is a multiple of the vector width, so every row starts aligned); otherwise the
 * same kernels run with VEC = 1. No atomics anywhere.
 */
#include "cuda/ct_cuda.h"

#include <stdint.h>
#include <string.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/elementwise.cuh"
#include "cuda/launch.cuh"

#define EW_CHUNK_ROWS 64  /* rows per partial of bias_grad: the CPU's CHUNK_ROWS */
#define EW_ROW_BATCH 8    /* rows of bias_grad's loads in flight before their adds */
#define EW_PART_COLS 32   /* columns per block of ew_partials_kernel: a warp's lanes */
#define EW_PART_STAGE 256 /* partial rows it stages in shared memory at a time (32 KB) */
#define EW_PART_BATCH 16  /* staged rows a lane reads before adding them, in order */

/* ---- fill ------------------------------------------------------------------------------------ */

/* W is an unsigned word of the element's size holding its bit pattern; VEC words make 16 bytes. */
template <typename W, int VEC> static __global__ void ew_fill_kernel(W *dst, W value, int64_t n) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t nv = n / VEC;
    ct_pack<W, VEC> x;
    for (int k = 0; k < VEC; k++) x.v[k] = value;
    for (int64_t v = tid; v < nv; v += stride)
        *reinterpret_cast<ct_pack<W, VEC> *>(dst + v * VEC) = x;
    const int64_t j = nv * VEC + tid;
    if (j < n) dst[j] = value;
}

/* ---- bias ------------------------------------------------------------------------------------ */

enum { EW_BIAS_ADD = 0, EW_BIAS_INIT = 1, EW_BIAS_INIT_RESIDUAL = 2 };

/* Row r, column vector cv (C / VEC of them): out = bias (+ out | + residual). Block (x, y): x over
 * column vectors, y over rows, both grid-stride. */
template <typename T, int VEC>
static __global__ void ew_bias_kernel(T *out, const T *bias, const T *residual, int64_t N,
                                      int64_t C, int mode) {
    const int64_t cols = C / VEC;
    for (int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; r < N;
         r += (int64_t)gridDim.y * blockDim.y) {
        for (int64_t cv = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; cv < cols;
             cv += (int64_t)gridDim.x * blockDim.x) {
            const int64_t i = r * C + cv * VEC;
            float b[VEC], o[VEC];
            ct_load<T, VEC>(bias + cv * VEC, b);
            if (mode == EW_BIAS_ADD) {
                ct_load<T, VEC>(out + i, o);
                for (int k = 0; k < VEC; k++) o[k] = o[k] + b[k];
            } else if (mode == EW_BIAS_INIT_RESIDUAL) {
                ct_load<T, VEC>(residual + i, o);
                for (int k = 0; k < VEC; k++) o[k] = o[k] + b[k];
            } else {
                for (int k = 0; k < VEC; k++) o[k] = b[k];
            }
            ct_put<T, VEC>(out + i, o);
        }
    }
}

/* bias_grad phase 1. Chunk ch (y, grid-stride) = rows [ch·64, min(ch·64 + 64, N)); column vector
 * cv (x). acc = the chunk's first row, then each further row added in order (the CPU's sum_rows).
 * direct (one chunk): dst is dbias and gets dbias += acc; else dst is partial(n_chunks, C). */
template <typename T, int VEC>
static __global__ void ew_colsum_kernel(float *dst, const T *dout, int64_t N, int64_t C,
                                        int64_t n_chunks, int direct) {
    const int64_t cols = C / VEC;
    for (int64_t ch = blockIdx.y; ch < n_chunks; ch += gridDim.y) {
        const int64_t r0 = ch * EW_CHUNK_ROWS;
        const int64_t r1 = r0 + EW_CHUNK_ROWS < N ? r0 + EW_CHUNK_ROWS : N;
        for (int64_t cv = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; cv < cols;
             cv += (int64_t)gridDim.x * blockDim.x) {
            float acc[VEC], x[EW_ROW_BATCH][VEC];
            ct_load<T, VEC>(dout + r0 * C + cv * VEC, acc);
            int64_t r = r0 + 1;
            for (; r + EW_ROW_BATCH <= r1; r += EW_ROW_BATCH) { /* loads first, adds in order */
                CT_UNROLL
                for (int u = 0; u < EW_ROW_BATCH; u++)
                    ct_load<T, VEC>(dout + (r + u) * C + cv * VEC, x[u]);
                CT_UNROLL
                for (int u = 0; u < EW_ROW_BATCH; u++)
                    for (int k = 0; k < VEC; k++) acc[k] += x[u][k];
            }
            for (; r < r1; r++) {
                ct_load<T, VEC>(dout + r * C + cv * VEC, x[0]);
                for (int k = 0; k < VEC; k++) acc[k] += x[0][k];
            }
            if (direct) {
                float d[VEC];
                ct_load<float, VEC>(dst + cv * VEC, d);
                for (int k = 0; k < VEC; k++) d[k] += acc[k];
                ct_put<float, VEC>(dst + cv * VEC, d);
            } else {
                ct_put<float, VEC>(dst + ch * C + cv * VEC, acc);
            }
        }
    }
}

/* ct_cuda_colsum_add: dst[j] += (partial[j] + partial[stride + j] + ...), the n rows in order
 * (bias_grad's phase 2, the CPU's add_chunk_partials). A block owns EW_PART_COLS columns: all its
 * threads copy EW_PART_STAGE partial rows of them to shared memory at once (coalesced, every load
 * in flight), then its first warp adds them, a lane a column, in row order. One thread a column
 * reading global memory 16 rows at a time waited n/16 memory latencies with 24 blocks in flight
 * (C = 768): ~10 µs a call at B·T = 16384, four times that at 65536, 98 calls a GPT-2 step. */
static __global__ void ew_partials_kernel(float *dst, const float *partial, int64_t n, int64_t C,
                                          int64_t stride) {
    CT_SHARED(float, stage, EW_PART_STAGE *EW_PART_COLS);
    const int64_t c0 = (int64_t)blockIdx.x * EW_PART_COLS;
    const int cols = C - c0 < EW_PART_COLS ? (int)(C - c0) : EW_PART_COLS;
    const int lane = (int)threadIdx.x;
    float acc = 0.0f;
    for (int64_t r0 = 0; r0 < n; r0 += EW_PART_STAGE) {
        const int rows = n - r0 < EW_PART_STAGE ? (int)(n - r0) : EW_PART_STAGE;
        __syncthreads(); /* the first warp has added the previous stage */
        for (int k = (int)threadIdx.x; k < rows * EW_PART_COLS; k += (int)blockDim.x) {
            const int r = k / EW_PART_COLS, c = k % EW_PART_COLS;
            if (c < cols) stage[k] = partial[(r0 + r) * stride + c0 + c];
        }
        __syncthreads();
        if (lane < cols) {
            int r = 0;
            if (r0 == 0) acc = stage[lane], r = 1; /* the sum starts as row 0, as the CPU's */
            for (; r + EW_PART_BATCH <= rows; r += EW_PART_BATCH) { /* loads first, adds in order */
                float v[EW_PART_BATCH];
                CT_UNROLL
                for (int u = 0; u < EW_PART_BATCH; u++) v[u] = stage[(r + u) * EW_PART_COLS + lane];
                CT_UNROLL
                for (int u = 0; u < EW_PART_BATCH; u++) acc += v[u];
            }
            for (; r < rows; r++) acc += stage[r * EW_PART_COLS + lane];
        }
    }
    if (lane < cols) dst[c0 + lane] += acc;
}

/* ---- flat element-wise ----------------------------------------------------------------------- */

/* dst = fmaf(alpha, src, dst): one rounding, as the CPU's contracted dst += alpha·src. */
template <typename T, int VEC>
static __global__ void ew_axpy_kernel(T *dst, const T *src, float alpha, int64_t n) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t nv = n / VEC;
    for (int64_t v = tid; v < nv; v += stride) {
        float d[VEC], s[VEC];
        ct_load<T, VEC>(dst + v * VEC, d);
        ct_load<T, VEC>(src + v * VEC, s);
        for (int k = 0; k < VEC; k++) d[k] = fmaf(alpha, s[k], d[k]);
        ct_put<T, VEC>(dst + v * VEC, d);
    }
    const int64_t j = nv * VEC + tid;
    if (j < n) dst[j] = ct_from_f32<T>(fmaf(alpha, ct_to_f32(src[j]), ct_to_f32(dst[j])));
}

/* C[r·ldc + j] = bf16(fmaf(beta, C, prod[r·N + j])): flat grid-stride over the M·N elements. */
static __global__ void ew_accumulate_rounded_kernel(__nv_bfloat16 *C, int64_t ldc,
                                                    const float *prod, float beta, int64_t M,
                                                    int64_t N) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < M * N; i += stride) {
        __nv_bfloat16 *c = C + (i / N) * ldc + i % N;
        *c = ct_from_f32<__nv_bfloat16>(fmaf(beta, ct_to_f32(*c), prod[i]));
    }
}

template <typename T, int VEC> static __global__ void ew_scale_kernel(T *x, float s, int64_t n) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t nv = n / VEC;
    for (int64_t v = tid; v < nv; v += stride) {
        float f[VEC];
        ct_load<T, VEC>(x + v * VEC, f);
        for (int k = 0; k < VEC; k++) f[k] = f[k] * s;
        ct_put<T, VEC>(x + v * VEC, f);
    }
    const int64_t j = nv * VEC + tid;
    if (j < n) x[j] = ct_from_f32<T>(ct_to_f32(x[j]) * s);
}

/* dst = src converted (bf16 -> f32 is exact; f32 -> bf16 rounds to nearest even). */
template <typename D, typename S, int VEC>
static __global__ void ew_cast_kernel(D *dst, const S *src, int64_t n) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t nv = n / VEC;
    for (int64_t v = tid; v < nv; v += stride) {
        float f[VEC];
        ct_load<S, VEC>(src + v * VEC, f);
        ct_put<D, VEC>(dst + v * VEC, f);
    }
    const int64_t j = nv * VEC + tid;
    if (j < n) dst[j] = ct_from_f32<D>(ct_to_f32(src[j]));
}

/* Rows of a column range: dst[r·ld_dst + c] = src[r·ld_src + c] converted, r < rows, c < cols
 * (one grid-stride walk over the rows·cols elements). */
template <typename D, typename S>
static __global__ void ew_cast_cols_kernel(D *dst, int64_t ld_dst, const S *src, int64_t ld_src,
                                           int64_t rows, int64_t cols) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * cols; e += stride) {
        const int64_t r = e / cols, c = e % cols;
        dst[r * ld_dst + c] = ct_from_f32<D>(ct_to_f32(src[r * ld_src + c]));
    }
}

/* ---- launchers ------------------------------------------------------------------------------- */

template <typename W> static void ew_fill(ct_cuda_ctx *cx, void *dst, W value, int64_t n) {
    const int vec = 16 / (int)sizeof(W);
    if (ct_launch_aligned(dst, 16))
        ct_launch(ew_fill_kernel<W, 16 / sizeof(W)>, dim3(ct_launch_blocks(cx, n / vec)),
                  dim3(CT_LAUNCH_THREADS), 0, ct_cuda_stream(cx), (W *)dst, value, n);
    else
        ct_launch(ew_fill_kernel<W, 1>, dim3(ct_launch_blocks(cx, n)), dim3(CT_LAUNCH_THREADS), 0,
                  ct_cuda_stream(cx), (W *)dst, value, n);
    CT_CUDA_CHECK(cudaGetLastError());
}

/* The element values are converted on the host exactly as cpu_fill converts them. */
extern "C" void ct_cuda_fill(void *ctx, void *dst, ct_dtype dtype, int64_t n, float value) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    if (n <= 0) return;
    switch (dtype) {
    case CT_DTYPE_F32: {
        uint32_t u;
        memcpy(&u, &value, 4);
        ew_fill<uint32_t>(cx, dst, u, n);
        break;
    }
    case CT_DTYPE_BF16: ew_fill<uint16_t>(cx, dst, ct_f32_to_bf16(value), n); break;
    case CT_DTYPE_I32: ew_fill<uint32_t>(cx, dst, (uint32_t)(int32_t)value, n); break;
    case CT_DTYPE_I64: ew_fill<uint64_t>(cx, dst, (uint64_t)(int64_t)value, n); break;
    case CT_DTYPE_U8: ew_fill<uint8_t>(cx, dst, (uint8_t)(int)value, n); break;
    case CT_DTYPE_F64: {
        double d = value;
        uint64_t u;
        memcpy(&u, &d, 8);
        ew_fill<uint64_t>(cx, dst, u, n);
        break;
    }
    default: CT_ASSERTF(0, "cuda fill: dtype %d", (int)dtype);
    }
}

template <typename T>
static void ew_bias(ct_cuda_ctx *cx, void *out, const void *bias, const void *residual, int64_t N,
                    int64_t C, int mode) {
    const int vec = 16 / (int)sizeof(T);
    const bool v = C % vec == 0 && ct_launch_aligned(out, 16) && ct_launch_aligned(bias, 16) &&
                   (!residual || ct_launch_aligned(residual, 16));
    dim3 grid, block;
    ct_launch_rows(cx, N, v ? C / vec : C, &grid, &block);
    if (v)
        ct_launch(ew_bias_kernel<T, 16 / sizeof(T)>, grid, block, 0, ct_cuda_stream(cx), (T *)out,
                  (const T *)bias, (const T *)residual, N, C, mode);
    else
        ct_launch(ew_bias_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), (T *)out,
                  (const T *)bias, (const T *)residual, N, C, mode);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_bias_add(void *ctx, ct_dtype dt, void *out, const void *bias, int64_t N,
                                 int64_t C) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "bias_add dtype %d", (int)dt);
    if (N <= 0 || C <= 0) return;
    if (dt == CT_DTYPE_BF16)
        ew_bias<__nv_bfloat16>(cx, out, bias, NULL, N, C, EW_BIAS_ADD);
    else
        ew_bias<float>(cx, out, bias, NULL, N, C, EW_BIAS_ADD);
}

extern "C" void ct_cuda_bias_init(void *ctx, ct_dtype dt, void *out, const void *bias,
                                  const void *residual, int64_t N, int64_t C) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "bias_init dtype %d", (int)dt);
    if (N <= 0 || C <= 0) return;
    const int mode = residual ? EW_BIAS_INIT_RESIDUAL : EW_BIAS_INIT;
    if (dt == CT_DTYPE_BF16)
        ew_bias<__nv_bfloat16>(cx, out, bias, residual, N, C, mode);
    else
        ew_bias<float>(cx, out, bias, residual, N, C, mode);
}

/* VEC = 4 for both dtypes: the partials and dbias are fp32 (16 bytes), dout 16 or 8 bytes. */
template <typename T>
static void ew_bias_grad(ct_cuda_ctx *cx, float *dbias, const void *dout, int64_t N, int64_t C) {
    cudaStream_t st = ct_cuda_stream(cx);
    const int64_t n_chunks = (N + EW_CHUNK_ROWS - 1) / EW_CHUNK_ROWS;
    const int direct = n_chunks == 1;
    float *partial = direct ? dbias : (float *)ct_cuda_workspace(cx, 0, (size_t)(n_chunks * C) * 4);
    const bool v = C % 4 == 0 && ct_launch_aligned(dbias, 16) && ct_launch_aligned(partial, 16) &&
                   ct_launch_aligned(dout, 4 * sizeof(T));
    const int64_t cols = v ? C / 4 : C;
    dim3 block(CT_LAUNCH_THREADS);
    int64_t gx = (cols + CT_LAUNCH_THREADS - 1) / CT_LAUNCH_THREADS, gy = n_chunks;
    if (gx > ct_launch_cap(cx)) gx = ct_launch_cap(cx);
    if (gy > ct_launch_cap(cx) / gx) gy = ct_launch_cap(cx) / gx;
    if (gy < 1) gy = 1;
    dim3 grid((unsigned)gx, (unsigned)gy);
    if (v)
        ct_launch(ew_colsum_kernel<T, 4>, grid, block, 0, st, partial, (const T *)dout, N, C,
                  n_chunks, direct);
    else
        ct_launch(ew_colsum_kernel<T, 1>, grid, block, 0, st, partial, (const T *)dout, N, C,
                  n_chunks, direct);
    CT_CUDA_CHECK(cudaGetLastError());
    if (direct) return;
    ct_cuda_colsum_add(cx, dbias, partial, n_chunks, C, C);
}

extern "C" void ct_cuda_colsum_add(ct_cuda_ctx *cx, float *dst, const float *partial, int64_t n,
                                   int64_t C, int64_t stride) {
    CT_ASSERTF(n >= 1 && C >= 0 && stride >= C, "colsum_add n=%lld C=%lld stride=%lld",
               (long long)n, (long long)C, (long long)stride);
    if (C == 0) return;
    ct_launch(ew_partials_kernel, dim3((unsigned)((C + EW_PART_COLS - 1) / EW_PART_COLS)),
              dim3(CT_LAUNCH_THREADS), 0, ct_cuda_stream(cx), dst, partial, n, C, stride);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_bias_grad(void *ctx, ct_dtype dt, float *dbias, const void *dout, int64_t N,
                                  int64_t C) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "bias_grad dtype %d", (int)dt);
    if (N <= 0 || C <= 0) return;
    if (dt == CT_DTYPE_BF16)
        ew_bias_grad<__nv_bfloat16>(cx, dbias, dout, N, C);
    else
        ew_bias_grad<float>(cx, dbias, dout, N, C);
}

template <typename T>
static void ew_axpy(ct_cuda_ctx *cx, void *dst, const void *src, float alpha, int64_t n) {
    const int vec = 16 / (int)sizeof(T);
    if (ct_launch_aligned(dst, 16) && ct_launch_aligned(src, 16))
        ct_launch(ew_axpy_kernel<T, 16 / sizeof(T)>, dim3(ct_launch_blocks(cx, n / vec)),
                  dim3(CT_LAUNCH_THREADS), 0, ct_cuda_stream(cx), (T *)dst, (const T *)src, alpha,
                  n);
    else
        ct_launch(ew_axpy_kernel<T, 1>, dim3(ct_launch_blocks(cx, n)), dim3(CT_LAUNCH_THREADS), 0,
                  ct_cuda_stream(cx), (T *)dst, (const T *)src, alpha, n);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_axpy(void *ctx, ct_dtype dt, void *dst, const void *src, float alpha,
                             int64_t n) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "axpy dtype %d", (int)dt);
    if (n <= 0) return;
    if (dt == CT_DTYPE_BF16)
        ew_axpy<__nv_bfloat16>(cx, dst, src, alpha, n);
    else
        ew_axpy<float>(cx, dst, src, alpha, n);
}

extern "C" void ct_cuda_accumulate_rounded(ct_cuda_ctx *cx, void *C, int64_t ldc, const float *prod,
                                           float beta, int64_t M, int64_t N) {
    CT_ASSERTF(M >= 0 && N >= 0 && ldc >= N, "accumulate_rounded M=%lld N=%lld ldc=%lld",
               (long long)M, (long long)N, (long long)ldc);
    if (M == 0 || N == 0) return;
    ct_launch(ew_accumulate_rounded_kernel, dim3(ct_launch_blocks(cx, M * N)),
              dim3(CT_LAUNCH_THREADS), 0, ct_cuda_stream(cx), (__nv_bfloat16 *)C, ldc, prod, beta,
              M, N);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <typename T> static void ew_scale(ct_cuda_ctx *cx, void *x, float s, int64_t n) {
    const int vec = 16 / (int)sizeof(T);
    if (ct_launch_aligned(x, 16))
        ct_launch(ew_scale_kernel<T, 16 / sizeof(T)>, dim3(ct_launch_blocks(cx, n / vec)),
                  dim3(CT_LAUNCH_THREADS), 0, ct_cuda_stream(cx), (T *)x, s, n);
    else
        ct_launch(ew_scale_kernel<T, 1>, dim3(ct_launch_blocks(cx, n)), dim3(CT_LAUNCH_THREADS), 0,
                  ct_cuda_stream(cx), (T *)x, s, n);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_scale(void *ctx, ct_dtype dt, void *x, float s, int64_t n) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "scale dtype %d", (int)dt);
    if (n <= 0) return;
    if (dt == CT_DTYPE_BF16)
        ew_scale<__nv_bfloat16>(cx, x, s, n);
    else
        ew_scale<float>(cx, x, s, n);
}

/* 4 elements per vector: 16 bytes of f32 and 8 of bf16. */
template <typename D, typename S>
static void ew_cast(ct_cuda_ctx *cx, void *dst, const void *src, int64_t n) {
    if (ct_launch_aligned(dst, 4 * sizeof(D)) && ct_launch_aligned(src, 4 * sizeof(S)))
        ct_launch(ew_cast_kernel<D, S, 4>, dim3(ct_launch_blocks(cx, n / 4)),
                  dim3(CT_LAUNCH_THREADS), 0, ct_cuda_stream(cx), (D *)dst, (const S *)src, n);
    else
        ct_launch(ew_cast_kernel<D, S, 1>, dim3(ct_launch_blocks(cx, n)), dim3(CT_LAUNCH_THREADS),
                  0, ct_cuda_stream(cx), (D *)dst, (const S *)src, n);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_cast(void *ctx, void *dst, ct_dtype dst_dtype, const void *src,
                             ct_dtype src_dtype, int64_t n) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    if (n <= 0) return;
    if (dst_dtype == src_dtype) {
        CT_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * ct_dtype_size(dst_dtype),
                                      cudaMemcpyDeviceToDevice, ct_cuda_stream(cx)));
    } else if (dst_dtype == CT_DTYPE_BF16 && src_dtype == CT_DTYPE_F32) {
        ew_cast<__nv_bfloat16, float>(cx, dst, src, n);
    } else if (dst_dtype == CT_DTYPE_F32 && src_dtype == CT_DTYPE_BF16) {
        ew_cast<float, __nv_bfloat16>(cx, dst, src, n);
    } else {
        CT_ASSERTF(0, "cuda cast: %s -> %s is not supported", ct_dtype_name(src_dtype),
                   ct_dtype_name(dst_dtype));
    }
}

template <typename D, typename S>
static void ew_cast_cols(ct_cuda_ctx *cx, void *dst, int64_t ld_dst, const void *src,
                         int64_t ld_src, int64_t rows, int64_t cols) {
    ct_launch(ew_cast_cols_kernel<D, S>, dim3(ct_launch_blocks(cx, rows * cols)),
              dim3(CT_LAUNCH_THREADS), 0, ct_cuda_stream(cx), (D *)dst, ld_dst, (const S *)src,
              ld_src, rows, cols);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_cast_cols(void *ctx, void *dst, ct_dtype dst_dtype, int64_t ld_dst,
                                  const void *src, ct_dtype src_dtype, int64_t ld_src, int64_t rows,
                                  int64_t cols) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    if (rows <= 0 || cols <= 0) return;
    /* same dtype: widening and rounding back give the same bits */
    if (dst_dtype == CT_DTYPE_F32 && src_dtype == CT_DTYPE_F32) {
        ew_cast_cols<float, float>(cx, dst, ld_dst, src, ld_src, rows, cols);
    } else if (dst_dtype == CT_DTYPE_BF16 && src_dtype == CT_DTYPE_BF16) {
        ew_cast_cols<__nv_bfloat16, __nv_bfloat16>(cx, dst, ld_dst, src, ld_src, rows, cols);
    } else if (dst_dtype == CT_DTYPE_BF16 && src_dtype == CT_DTYPE_F32) {
        ew_cast_cols<__nv_bfloat16, float>(cx, dst, ld_dst, src, ld_src, rows, cols);
    } else if (dst_dtype == CT_DTYPE_F32 && src_dtype == CT_DTYPE_BF16) {
        ew_cast_cols<float, __nv_bfloat16>(cx, dst, ld_dst, src, ld_src, rows, cols);
    } else {
        CT_ASSERTF(0, "cuda cast_cols: %s -> %s is not supported", ct_dtype_name(src_dtype),
                   ct_dtype_name(dst_dtype));
    }
}
