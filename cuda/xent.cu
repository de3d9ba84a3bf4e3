/*
 * xent.cu — softmax cross-entropy in three passes, plain and vocabulary-parallel (the slots
 * xent_rowmax, xent_sumexp, xent_finish, whose semantics are in core/backend/backend.h; the CPU
 * reference is core/backend/cpu/xent.c).
 *
 * One block of XENT_THREADS threads per row for every pass that walks the row; statistics in
 * fp32. A row's sum is each thread's columns added in order, then a butterfly over the warp, then
 * the warps' sums in warp order (xent_block_sum): a fixed tree, so reruns give the same bits.
 *   xent_rowmax_kernel   max over the first n_valid columns (-inf when n_valid = 0), exact.
 *   xent_sumexp_kernel   target_logit (read by thread 0 before anyone may overwrite it),
 *                        sumexp = Σ expf(x - rowmax), with KEEP the logits overwritten by the
 *                        exponentials (bf16: rounded to nearest even; the sum takes the fp32
 *                        values, as on the CPU).
 *   xent_grad_kernel     loss, and the logits overwritten by dloss·(exp/sumexp - onehot), padded
 *                        columns by 0.
 *   xent_loss_kernel     the loss alone (write_grad false), one thread per row.
 * The exponential is expf (at most 2 ulp in CUDA), not __expf, whose error grows with |x|; the
 * CPU's exp_f32 is about 1 ulp. Rows are read with 16-byte vectors when every row starts 16-byte
 * aligned (V a multiple of the vector width, aligned base pointer), the last n_valid % VEC
 * columns element by element.
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/ct_cuda_ctx.h"

#define XENT_THREADS 512
#define XENT_WARPS (XENT_THREADS / 32)
#define XENT_LOSS_THREADS 256

/* ---- block reductions (every thread gets the result) ----------------------------------------- */

/* fmaxf skips a NaN (as the CPU's row_max does) and is commutative, so all lanes agree. */
static __device__ inline float xent_block_max(float v, float *sh) {
    v = ct_warp_max(v);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    return ct_warp_max(lane < XENT_WARPS ? sh[lane] : -INFINITY);
}

/* The butterfly leaves the same bits in every lane (a + b == b + a), and every warp adds the
 * warps' sums in the same tree, so every thread holds the same total. */
static __device__ inline float xent_block_sum(float v, float *sh) {
    v = ct_warp_sum(v);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    return ct_warp_sum(lane < XENT_WARPS ? sh[lane] : 0.0f);
}

/* ---- kernels (block = one row) --------------------------------------------------------------- */

template <typename T, int VEC>
static __global__ void xent_rowmax_kernel(float *rowmax, const T *logits, int64_t V, int n_valid) {
    CT_SHARED(float, sh, XENT_WARPS);
    const T *x = logits + (int64_t)blockIdx.x * V;
    const int nv = n_valid / VEC;
    float m = -INFINITY;
    for (int v = threadIdx.x; v < nv; v += XENT_THREADS) {
        float f[VEC];
        ct_load<T, VEC>(x + v * VEC, f);
        for (int k = 0; k < VEC; k++) m = fmaxf(m, f[k]);
    }
    for (int j = nv * VEC + threadIdx.x; j < n_valid; j += XENT_THREADS)
        m = fmaxf(m, ct_to_f32(x[j]));
    m = xent_block_max(m, sh);
    if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

template <typename T, int VEC, bool KEEP>
static __global__ void xent_sumexp_kernel(float *sumexp, float *target_logit, T *logits,
                                          const int32_t *targets, const float *rowmax, int64_t V,
                                          int n_valid, int64_t col_offset) {
    CT_SHARED(float, sh, XENT_WARPS);
    const int row = blockIdx.x;
    T *x = logits + (int64_t)row * V;
    const float mx = rowmax[row];
    if (threadIdx.x == 0) {
        const int64_t t = (int64_t)targets[row] - col_offset;
        target_logit[row] = t >= 0 && t < n_valid ? ct_to_f32(x[t]) : 0.0f;
    }
    if (KEEP) __syncthreads(); /* x[t] is read before any thread overwrites it */
    const int nv = n_valid / VEC;
    float acc = 0.0f;
    for (int v = threadIdx.x; v < nv; v += XENT_THREADS) {
        float f[VEC];
        ct_load<T, VEC>(x + v * VEC, f);
        for (int k = 0; k < VEC; k++) {
            f[k] = expf(f[k] - mx);
            acc += f[k];
        }
        if (KEEP) ct_put<T, VEC>(x + v * VEC, f);
    }
    for (int j = nv * VEC + threadIdx.x; j < n_valid; j += XENT_THREADS) {
        float e = expf(ct_to_f32(x[j]) - mx);
        if (KEEP) x[j] = ct_from_f32<T>(e);
        acc += e;
    }
    acc = xent_block_sum(acc, sh);
    if (threadIdx.x == 0) sumexp[row] = acc;
}

/* The logits hold exp(logit - rowmax) (sumexp with keep_exp); each becomes dloss/sumexp times it,
 * the target column then minus dloss (by the thread that owns it: no second pass, no barrier). */
template <typename T, int VEC>
static __global__ void xent_grad_kernel(float *losses, T *logits, const int32_t *targets,
                                        const float *rowmax, const float *sumexp,
                                        const float *target_logit, int64_t V, int n_valid,
                                        int64_t col_offset, float dloss) {
    const int row = blockIdx.x;
    T *x = logits + (int64_t)row * V;
    const float se = sumexp[row];
    if (threadIdx.x == 0) losses[row] = logf(se) + rowmax[row] - target_logit[row];
    const float g = dloss / se;
    const int64_t t64 = (int64_t)targets[row] - col_offset;
    const int t = t64 >= 0 && t64 < n_valid ? (int)t64 : -1;
    const int nv = n_valid / VEC;
    for (int v = threadIdx.x; v < nv; v += XENT_THREADS) {
        float f[VEC];
        ct_load<T, VEC>(x + v * VEC, f);
        for (int k = 0; k < VEC; k++) {
            f[k] *= g;
            if (v * VEC + k == t) f[k] -= dloss;
        }
        ct_put<T, VEC>(x + v * VEC, f);
    }
    for (int j = nv * VEC + threadIdx.x; j < n_valid; j += XENT_THREADS) {
        float f = ct_to_f32(x[j]) * g;
        if (j == t) f -= dloss;
        x[j] = ct_from_f32<T>(f);
    }
    for (int64_t j = n_valid + threadIdx.x; j < V; j += XENT_THREADS) x[j] = ct_from_f32<T>(0.0f);
}

static __global__ void xent_loss_kernel(float *losses, const float *rowmax, const float *sumexp,
                                        const float *target_logit, int N) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) losses[i] = logf(sumexp[i]) + rowmax[i] - target_logit[i];
}

/* ---- launchers ------------------------------------------------------------------------------- */

template <typename T> static bool xent_vec_ok(const void *logits, int64_t V) {
    return V % (16 / (int64_t)sizeof(T)) == 0 && ((uintptr_t)logits & 15u) == 0;
}

static void xent_check(const char *what, ct_dtype dt, int64_t N, int64_t V, int64_t n_valid) {
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "%s dtype %d", what, (int)dt);
    CT_ASSERTF(N >= 0 && N < INT32_MAX && n_valid >= 0 && n_valid <= V && V < INT32_MAX,
               "%s N=%lld V=%lld n_valid=%lld", what, (long long)N, (long long)V,
               (long long)n_valid);
}

template <typename T>
static void xent_rowmax(ct_cuda_ctx *cx, float *rowmax, const void *logits, int64_t N, int64_t V,
                        int n_valid) {
    if (xent_vec_ok<T>(logits, V))
        ct_launch(xent_rowmax_kernel<T, 16 / sizeof(T)>, dim3((unsigned)N), dim3(XENT_THREADS), 0,
                  ct_cuda_stream(cx), rowmax, (const T *)logits, V, n_valid);
    else
        ct_launch(xent_rowmax_kernel<T, 1>, dim3((unsigned)N), dim3(XENT_THREADS), 0,
                  ct_cuda_stream(cx), rowmax, (const T *)logits, V, n_valid);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <typename T, int VEC>
static void xent_sumexp_vec(ct_cuda_ctx *cx, float *sumexp, float *target_logit, void *logits,
                            const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                            int n_valid, int64_t col_offset, bool keep_exp) {
    if (keep_exp)
        ct_launch(xent_sumexp_kernel<T, VEC, true>, dim3((unsigned)N), dim3(XENT_THREADS), 0,
                  ct_cuda_stream(cx), sumexp, target_logit, (T *)logits, targets, rowmax, V,
                  n_valid, col_offset);
    else
        ct_launch(xent_sumexp_kernel<T, VEC, false>, dim3((unsigned)N), dim3(XENT_THREADS), 0,
                  ct_cuda_stream(cx), sumexp, target_logit, (T *)logits, targets, rowmax, V,
                  n_valid, col_offset);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
static void xent_sumexp(ct_cuda_ctx *cx, float *sumexp, float *target_logit, void *logits,
                        const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                        int n_valid, int64_t col_offset, bool keep_exp) {
    if (xent_vec_ok<T>(logits, V))
        xent_sumexp_vec<T, 16 / sizeof(T)>(cx, sumexp, target_logit, logits, targets, rowmax, N, V,
                                           n_valid, col_offset, keep_exp);
    else
        xent_sumexp_vec<T, 1>(cx, sumexp, target_logit, logits, targets, rowmax, N, V, n_valid,
                              col_offset, keep_exp);
}

template <typename T>
static void xent_grad(ct_cuda_ctx *cx, float *losses, void *logits, const int32_t *targets,
                      const float *rowmax, const float *sumexp, const float *target_logit,
                      int64_t N, int64_t V, int n_valid, int64_t col_offset, float dloss) {
    if (xent_vec_ok<T>(logits, V))
        ct_launch(xent_grad_kernel<T, 16 / sizeof(T)>, dim3((unsigned)N), dim3(XENT_THREADS), 0,
                  ct_cuda_stream(cx), losses, (T *)logits, targets, rowmax, sumexp, target_logit, V,
                  n_valid, col_offset, dloss);
    else
        ct_launch(xent_grad_kernel<T, 1>, dim3((unsigned)N), dim3(XENT_THREADS), 0,
                  ct_cuda_stream(cx), losses, (T *)logits, targets, rowmax, sumexp, target_logit, V,
                  n_valid, col_offset, dloss);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_xent_rowmax(void *ctx, ct_dtype dt, float *rowmax, const void *logits,
                                    int64_t N, int64_t V, int64_t n_valid) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    xent_check("xent_rowmax", dt, N, V, n_valid);
    if (N == 0) return;
    if (dt == CT_DTYPE_BF16)
        xent_rowmax<__nv_bfloat16>(cx, rowmax, logits, N, V, (int)n_valid);
    else
        xent_rowmax<float>(cx, rowmax, logits, N, V, (int)n_valid);
}

extern "C" void ct_cuda_xent_sumexp(void *ctx, ct_dtype dt, float *sumexp, float *target_logit,
                                    void *logits, const int32_t *targets, const float *rowmax,
                                    int64_t N, int64_t V, int64_t n_valid, int64_t col_offset,
                                    bool keep_exp) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    xent_check("xent_sumexp", dt, N, V, n_valid);
    if (N == 0) return;
    if (dt == CT_DTYPE_BF16)
        xent_sumexp<__nv_bfloat16>(cx, sumexp, target_logit, logits, targets, rowmax, N, V,
                                   (int)n_valid, col_offset, keep_exp);
    else
        xent_sumexp<float>(cx, sumexp, target_logit, logits, targets, rowmax, N, V, (int)n_valid,
                           col_offset, keep_exp);
}

extern "C" void ct_cuda_xent_finish(void *ctx, ct_dtype dt, float *losses, void *logits_to_grad,
                                    const int32_t *targets, const float *rowmax,
                                    const float *sumexp, const float *target_logit, int64_t N,
                                    int64_t V, int64_t n_valid, int64_t col_offset, float dloss,
                                    bool write_grad) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    xent_check("xent_finish", dt, N, V, n_valid);
    if (N == 0) return;
    if (!write_grad) {
        ct_launch(xent_loss_kernel,
                  dim3((unsigned)((N + XENT_LOSS_THREADS - 1) / XENT_LOSS_THREADS)),
                  dim3(XENT_LOSS_THREADS), 0, ct_cuda_stream(cx), losses, rowmax, sumexp,
                  target_logit, (int)N);
        CT_CUDA_CHECK(cudaGetLastError());
    } else if (dt == CT_DTYPE_BF16) {
        xent_grad<__nv_bfloat16>(cx, losses, logits_to_grad, targets, rowmax, sumexp, target_logit,
                                 N, V, (int)n_valid, col_offset, dloss);
    } else {
        xent_grad<float>(cx, losses, logits_to_grad, targets, rowmax, sumexp, target_logit, N, V,
                         (int)n_valid, col_offset, dloss);
    }
}
