/*
 * moe_rows.cu — Mixture of Experts' row movements (the slots gather_rows, gather_dot). The
 * CPU reference is core/backend/cpu/moe_rows.c (bf16 operands widened to fp32, outputs rounded
 * once).
 *   gather_rows  out[i] = w0·in[idx0] (+ wj·in[idxj] for j = 1.. in slot order), each added term
 *                an explicit fmaf (one rounding: the CPU build, -O3 -march=native in GNU C,
 *                contracts its o += wj·r the same way; a build that does not differs by the
 *                products' roundings, which the tests and check mode allow for). w NULL: weight
 *                1, so slot 0 is a copy and each further slot one exact-then-rounded add; one
 *                slot without weights is an exact row copy.
 *   gather_dot   out[r] = Σ_c a[ia[r], c]·b[ib[r], c]: each product of two floats is exact in
 *                double (48 significant bits), the sum is in double and rounded once to f32. The
 *                order differs from the CPU's column order (lanes, then a butterfly), so results
 *                may differ in the last f32 bit where the double sums straddle a rounding
 *                boundary; the order is fixed by C alone (deterministic).
 *
 * Kernels:
 *   gather_rows_kernel  rows × column vectors (2-D grid-stride, launch.cuh's rows shape), 16-byte
 *                       vectors when C and the pointers allow (an element's value does not depend
 *                       on the path), else element by element.
 *   gather_dot_kernel   one warp a row (grid-stride over rows): lane l sums columns l, l + 32, ...
 *                       in order into a double, DOT_BATCH loads in flight before their adds; then
 *                       a butterfly over the 32 lanes (every lane the same bits), lane 0 stores.
 * No atomics.
 */
#include "cuda/ct_cuda.h"

#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/launch.cuh"
#include "cuda/ct_cuda_ctx.h"

#define DOT_WARPS 8 /* warps (rows in flight) per block of gather_dot */
#define DOT_BATCH 4 /* columns a lane loads before adding them, in order */

/* ---- gather_rows ----------------------------------------------------------------------------- */

/* Row i (y, grid-stride), column vector cv (x, grid-stride) of VEC elements: o = w0·in[idx0],
 * then o = fmaf(wj, in[idxj], o) for j = 1 .. slots - 1; w NULL: every wj = 1. */
template <typename T, int VEC>
static __global__ void gather_rows_kernel(T *out, const T *in, const int32_t *idx, const float *w,
                                          int64_t N, int64_t slots, int64_t C) {
    const int64_t cols = C / VEC;
    for (int64_t i = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; i < N;
         i += (int64_t)gridDim.y * blockDim.y) {
        const int32_t *ix = idx + i * slots;
        const float *wi = w ? w + i * slots : NULL;
        for (int64_t cv = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; cv < cols;
             cv += (int64_t)gridDim.x * blockDim.x) {
            float o[VEC], x[VEC];
            const float w0 = wi ? wi[0] : 1.0f;
            ct_load<T, VEC>(in + (int64_t)ix[0] * C + cv * VEC, x);
            for (int k = 0; k < VEC; k++) o[k] = w0 * x[k];
            for (int64_t j = 1; j < slots; j++) {
                const float wj = wi ? wi[j] : 1.0f;
                ct_load<T, VEC>(in + (int64_t)ix[j] * C + cv * VEC, x);
                for (int k = 0; k < VEC; k++) o[k] = fmaf(wj, x[k], o[k]);
            }
            ct_put<T, VEC>(out + i * C + cv * VEC, o);
        }
    }
}

/* ---- gather_dot ------------------------------------------------------------------------------ */

/* Row r (one warp, grid-stride over the rows; every lane of a warp takes the same rows, so the
 * full-mask shuffles see all 32): out[r] = (float)Σ over lanes of lane l's in-order double sum of
 * a[ia[r], c]·b[ib[r], c] for c = l, l + 32, ..., the lanes added by a butterfly. */
template <typename T>
static __global__ void gather_dot_kernel(float *out, const T *a, const int32_t *ia, const T *b,
                                         const int32_t *ib, int64_t R, int64_t C) {
    const int lane = (int)(threadIdx.x % 32);
    const int64_t stride = (int64_t)gridDim.x * DOT_WARPS;
    for (int64_t r = (int64_t)blockIdx.x * DOT_WARPS + threadIdx.x / 32; r < R; r += stride) {
        const T *x = a + (int64_t)ia[r] * C, *y = b + (int64_t)ib[r] * C;
        double acc = 0.0;
        int64_t c = lane;
        for (; c + 32 * (DOT_BATCH - 1) < C; c += 32 * DOT_BATCH) { /* loads first, adds in order */
            float p[DOT_BATCH], q[DOT_BATCH];
            CT_UNROLL
            for (int u = 0; u < DOT_BATCH; u++) {
                p[u] = ct_to_f32(x[c + 32 * u]);
                q[u] = ct_to_f32(y[c + 32 * u]);
            }
            CT_UNROLL
            for (int u = 0; u < DOT_BATCH; u++) acc += (double)p[u] * (double)q[u];
        }
        for (; c < C; c += 32) acc += (double)ct_to_f32(x[c]) * (double)ct_to_f32(y[c]);
        for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) out[r] = (float)acc;
    }
}

/* ---- launchers ------------------------------------------------------------------------------- */

template <typename T>
static void gather_rows(ct_cuda_ctx *cx, void *out, const void *in, const int32_t *idx,
                        const float *w, int64_t N, int64_t slots, int64_t C) {
    const int vec = 16 / (int)sizeof(T);
    const bool v = C % vec == 0 && ct_launch_aligned(out, 16) && ct_launch_aligned(in, 16);
    dim3 grid, block;
    ct_launch_rows(cx, N, v ? C / vec : C, &grid, &block);
    if (v)
        ct_launch(gather_rows_kernel<T, 16 / sizeof(T)>, grid, block, 0, ct_cuda_stream(cx),
                  (T *)out, (const T *)in, idx, w, N, slots, C);
    else
        ct_launch(gather_rows_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), (T *)out,
                  (const T *)in, idx, w, N, slots, C);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_gather_rows(void *ctx, ct_dtype dt, void *out, const void *in,
                                    const int32_t *idx, const float *w, int64_t N, int64_t slots,
                                    int64_t C, int64_t in_rows) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "gather_rows dtype %d", (int)dt);
    CT_ASSERTF(slots >= 1 && in_rows >= 0, "gather_rows slots=%lld in_rows=%lld", (long long)slots,
               (long long)in_rows);
    if (N <= 0 || C <= 0) return;
    if (dt == CT_DTYPE_BF16)
        gather_rows<__nv_bfloat16>(cx, out, in, idx, w, N, slots, C);
    else
        gather_rows<float>(cx, out, in, idx, w, N, slots, C);
}

template <typename T>
static void gather_dot(ct_cuda_ctx *cx, float *out, const void *a, const int32_t *ia, const void *b,
                       const int32_t *ib, int64_t R, int64_t C) {
    int64_t blocks = (R + DOT_WARPS - 1) / DOT_WARPS;
    if (blocks > ct_launch_cap(cx)) blocks = ct_launch_cap(cx);
    ct_launch(gather_dot_kernel<T>, dim3((unsigned)blocks), dim3(32 * DOT_WARPS), 0,
              ct_cuda_stream(cx), out, (const T *)a, ia, (const T *)b, ib, R, C);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_gather_dot(void *ctx, ct_dtype dt, float *out, const void *a,
                                   const int32_t *ia, const void *b, const int32_t *ib, int64_t R,
                                   int64_t C, int64_t a_rows, int64_t b_rows) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "gather_dot dtype %d", (int)dt);
    CT_ASSERTF(C >= 0 && a_rows >= 0 && b_rows >= 0, "gather_dot C=%lld a_rows=%lld b_rows=%lld",
               (long long)C, (long long)a_rows, (long long)b_rows);
    if (R <= 0) return;
    if (dt == CT_DTYPE_BF16)
        gather_dot<__nv_bfloat16>(cx, out, a, ia, b, ib, R, C);
    else
        gather_dot<float>(cx, out, a, ia, b, ib, R, C);
}
