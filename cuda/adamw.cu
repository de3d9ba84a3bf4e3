/*
 * adamw.cu — the fused AdamW update over weight-decay segments and the sum of squares of the
 * gradient norm (the slots adamw and sumsq). The CPU reference is core/backend/cpu/adamw.c; both
 * results here are bit-identical to it:
 *
 *   adamw  the CPU's float operations in the CPU's order, every multiply-add an explicit fmaf
 *          (cpu/adamw.c spells the sequence out); the bias corrections bc1, bc2 are computed on
 *          the host in double, 1 - pow(beta, step), then cast to float, by the same expression;
 *          IEEE division and sqrtf (nvcc's defaults, -prec-div / -prec-sqrt). The bf16 copy is the
 *          updated fp32 value rounded to nearest even.
 *   sumsq  double sums with the CPU's partition and order: chunks of SUMSQ_CHUNK (4096) elements;
 *          in a chunk, lane l (of 16) sums the elements j ≡ l (mod 16) in order, the 16 lanes are
 *          combined by the CPU's tree ((l, l+8), then (l, l+4), then (a0+a2) + (a1+a3)), and the
 *          chunk partials are added in chunk order from 0.0, then cast to float. A float's square
 *          is exact in double, so FMA contraction cannot change a bit either.
 *
 * Host memory: `segments` and `hp` may be reused by the caller as soon as the launcher returns, and
 * kernels run later, so everything a kernel needs travels by value in its arguments: segments go
 * in batches of ADAMW_BATCH inside a fixed-size struct, one launch per batch.
 *
 * Kernels:
 *   adamw_kernel        grid-stride over the batch's "units": per segment, the elements before the
 *                       first 4-aligned index (one unit each), 4-element 16-byte vectors, then the
 *                       elements after the last vector (one unit each). Aligned base pointers make
 *                       a 4-aligned index a 16-byte-aligned address; otherwise VEC = 1.
 *   sumsq_chunk_kernel  the chunks of up to 64 ranges (one call's tensors: the model's whole
 *                       gradient norm is one call, so two launches per 64 tensors instead of two
 *                       per tensor), 16 / VEC threads per chunk, each owning VEC consecutive lanes
 *                       (VEC = 4: 16-byte loads when every range is aligned); the lanes are
 *                       gathered to the chunk's first thread by shuffles and combined by the CPU's
 * tree into partial[chunk]. sumsq_total_kernel: block i adds range i's chunk partials in order
 * (a chain of n/4096 double adds: the price of the CPU's exact order), staged through shared
 * memory. Both issue SUMSQ_UNROLL loads before the adds that use them, in the same order: each
 * sum is a serial chain, and with one load per add the chain waited a memory latency per element
 * — on an H200 the gradient norm took 13 ms of a 124M step (ncu); with one thread per range
 * reading its partials from global memory 16 at a time, the largest range (the 38.6M-element
 * embedding: 9,432 partials) still waited ~590 latencies, 0.5 ms a step.
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/ct_cuda_ctx.h"
#include "cuda/launch.cuh"

#define ADAMW_BATCH 32   /* segments per launch (the argument struct stays under 1 KB) */
#define SUMSQ_CHUNK 4096 /* the CPU's SUMSQ_CHUNK */
#define SUMSQ_LANES 16   /* the CPU's LANES */
/* rows of loads in flight per thread (a chunk has 4096 / 16 = 256 rows) */
#define SUMSQ_UNROLL 16

#define SUMSQ_BATCH 64   /* ranges per launch (the argument struct stays under 2 KB) */
#define SUMSQ_STAGE 2048 /* chunk partials in shared memory at a time (16 KB) */

enum { ADAMW_COPY_NONE = 0, ADAMW_COPY_F32 = 1, ADAMW_COPY_BF16 = 2 };

/* Up to SUMSQ_BATCH ranges of one sumsq call, by value; chunk_start[i] = chunks before range i
 * (chunk_start[n] = the batch's total). */
struct sumsq_batch {
    const float *x[SUMSQ_BATCH];
    int64_t count[SUMSQ_BATCH];
    int64_t chunk_start[SUMSQ_BATCH + 1];
    int n;
};

/* The scalars of the update, converted on the host exactly as cpu_adamw converts them. */
struct adamw_scalars {
    float lr, b1, b2, one_b1, one_b2, bc1, bc2, eps, gs;
};

/* Up to ADAMW_BATCH segments; unit_start[s] = units before segment s (unit_start[n] = total). */
struct adamw_batch {
    int64_t offset[ADAMW_BATCH];
    int64_t count[ADAMW_BATCH];
    int64_t unit_start[ADAMW_BATCH + 1];
    float wd[ADAMW_BATCH];
    int n;
};

/* One element, the CPU's operation order. */
static __device__ inline void adamw_step(const adamw_scalars &h, float wd, float &p, float gr,
                                         float &m, float &v) {
    float g = gr * h.gs;
    float mi = fmaf(h.b1, m, h.one_b1 * g);
    float vi = fmaf(h.b2, v, h.one_b2 * (g * g));
    float mhat = mi / h.bc1, vhat = vi / h.bc2;
    float upd = fmaf(wd, p, mhat / (sqrtf(vhat) + h.eps));
    p = fmaf(-h.lr, upd, p);
    m = mi;
    v = vi;
}

/* Segment elements before the first index that is a multiple of VEC (all of them if none). */
template <int VEC> static __host__ __device__ inline int64_t adamw_head(int64_t off, int64_t cnt) {
    int64_t h = (VEC - off % VEC) % VEC;
    return h < cnt ? h : cnt;
}

template <int COPY> static __device__ inline void adamw_copy1(void *copy, int64_t i, float p) {
    if (COPY == ADAMW_COPY_F32) ((float *)copy)[i] = p;
    if (COPY == ADAMW_COPY_BF16) ((__nv_bfloat16 *)copy)[i] = __float2bfloat16_rn(p);
}

template <int VEC, int COPY>
static __global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, void *copy,
                                    adamw_scalars h, adamw_batch b) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t total = b.unit_start[b.n];
    int s = 0;
    for (int64_t u = tid; u < total; u += stride) {
        while (u >= b.unit_start[s + 1]) s++; /* u only grows: the segment only moves forward */
        const int64_t off = b.offset[s], cnt = b.count[s], uu = u - b.unit_start[s];
        const int64_t head = adamw_head<VEC>(off, cnt), groups = (cnt - head) / VEC;
        const float wd = b.wd[s];
        if (VEC == 1) {
            const int64_t i = off + uu;
            float p = param[i], mi = m[i], vi = v[i];
            adamw_step(h, wd, p, grad[i], mi, vi);
            param[i] = p;
            m[i] = mi;
            v[i] = vi;
            adamw_copy1<COPY>(copy, i, p);
        } else if (uu >= head && uu < head + groups) {
            const int64_t i = off + head + (uu - head) * VEC;
            float4 p = *reinterpret_cast<const float4 *>(param + i);
            float4 g = *reinterpret_cast<const float4 *>(grad + i);
            float4 mm = *reinterpret_cast<const float4 *>(m + i);
            float4 vv = *reinterpret_cast<const float4 *>(v + i);
            adamw_step(h, wd, p.x, g.x, mm.x, vv.x);
            adamw_step(h, wd, p.y, g.y, mm.y, vv.y);
            adamw_step(h, wd, p.z, g.z, mm.z, vv.z);
            adamw_step(h, wd, p.w, g.w, mm.w, vv.w);
            *reinterpret_cast<float4 *>(param + i) = p;
            *reinterpret_cast<float4 *>(m + i) = mm;
            *reinterpret_cast<float4 *>(v + i) = vv;
            if (COPY == ADAMW_COPY_F32) *reinterpret_cast<float4 *>((float *)copy + i) = p;
            if (COPY == ADAMW_COPY_BF16) {
                __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y);
                __nv_bfloat162 hi = __floats2bfloat162_rn(p.z, p.w);
                __nv_bfloat162 *c = reinterpret_cast<__nv_bfloat162 *>((__nv_bfloat16 *)copy + i);
                c[0] = lo;
                c[1] = hi;
            }
        } else {
            const int64_t i =
                uu < head ? off + uu : off + head + groups * VEC + (uu - head - groups);
            float p = param[i], mi = m[i], vi = v[i];
            adamw_step(h, wd, p, grad[i], mi, vi);
            param[i] = p;
            m[i] = mi;
            v[i] = vi;
            adamw_copy1<COPY>(copy, i, p);
        }
    }
}

/* Chunk g / TPC of the batch (tensor i: chunks chunk_start[i] .. chunk_start[i + 1] - 1), thread
 * q = g % TPC of it owning lanes q·VEC .. q·VEC + VEC - 1. Every thread of the block reaches the
 * shuffles (threads past the last chunk with zeros), as full masks need. */
template <int VEC> static __global__ void sumsq_chunk_kernel(double *partial, const sumsq_batch b) {
    constexpr int TPC = SUMSQ_LANES / VEC;
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t ch = g / TPC;
    const int q = (int)(g % TPC);
    double acc[VEC];
    for (int k = 0; k < VEC; k++) acc[k] = 0.0;
    if (ch < b.chunk_start[b.n]) {
        int i = 0; /* the tensor of chunk ch: the last one starting at or before it */
        for (int lo = 0, hi = b.n - 1; lo <= hi;) {
            const int mid = (lo + hi) / 2;
            if (b.chunk_start[mid] <= ch)
                i = mid, lo = mid + 1;
            else
                hi = mid - 1;
        }
        const int64_t lc = ch - b.chunk_start[i];
        const float *xc = b.x[i] + lc * SUMSQ_CHUNK;
        const int64_t rest = b.count[i] - lc * SUMSQ_CHUNK;
        const int len = rest < SUMSQ_CHUNK ? (int)rest : SUMSQ_CHUNK;
        int j = q * VEC;
        if constexpr (VEC == 4) {
            /* SUMSQ_UNROLL rows of the lanes' loads issued before their adds (in the same order):
             * one memory latency per SUMSQ_UNROLL rows instead of one per row. */
            for (; j + (SUMSQ_UNROLL - 1) * SUMSQ_LANES + VEC <= len;
                 j += SUMSQ_UNROLL * SUMSQ_LANES) {
                float4 f[SUMSQ_UNROLL];
                CT_UNROLL
                for (int u = 0; u < SUMSQ_UNROLL; u++)
                    f[u] = *reinterpret_cast<const float4 *>(xc + j + u * SUMSQ_LANES);
                CT_UNROLL
                for (int u = 0; u < SUMSQ_UNROLL; u++) {
                    acc[0] += (double)f[u].x * (double)f[u].x;
                    acc[1] += (double)f[u].y * (double)f[u].y;
                    acc[2] += (double)f[u].z * (double)f[u].z;
                    acc[3] += (double)f[u].w * (double)f[u].w;
                }
            }
        }
        for (; j < len; j += SUMSQ_LANES) {
            if constexpr (VEC == 4) {
                if (j + VEC <= len) {
                    const float4 f = *reinterpret_cast<const float4 *>(xc + j);
                    acc[0] += (double)f.x * (double)f.x;
                    acc[1] += (double)f.y * (double)f.y;
                    acc[2] += (double)f.z * (double)f.z;
                    acc[3] += (double)f.w * (double)f.w;
                    continue;
                }
            }
            {
                for (int k = 0; k < VEC; k++)
                    if (j + k < len) acc[k] += (double)xc[j + k] * (double)xc[j + k];
            }
        }
    }
    double a[SUMSQ_LANES];
    for (int l = 0; l < SUMSQ_LANES; l++)
        a[l] = __shfl_sync(0xffffffffu, acc[l % VEC], l / VEC, TPC);
    if (q == 0 && ch < b.chunk_start[b.n]) {
        for (int l = 0; l < 8; l++) a[l] = a[l] + a[l + 8];
        for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
        partial[ch] = (a[0] + a[2]) + (a[1] + a[3]);
    }
}

/* Block i adds range i's chunk partials in order: the block copies them to shared memory
 * SUMSQ_STAGE at a time (coalesced, every load in flight at once) and thread 0 adds each stage
 * in order (a chain of double adds on shared memory: the price of the CPU's exact order). */
static __global__ void sumsq_total_kernel(float *out, const double *all_partials,
                                          const sumsq_batch b) {
    CT_SHARED(double, stage, SUMSQ_STAGE);
    const int i = (int)blockIdx.x;
    const double *partial = all_partials + b.chunk_start[i];
    const int64_t n_chunks = b.chunk_start[i + 1] - b.chunk_start[i];
    double total = 0.0;
    for (int64_t c0 = 0; c0 < n_chunks; c0 += SUMSQ_STAGE) {
        const int len = n_chunks - c0 < SUMSQ_STAGE ? (int)(n_chunks - c0) : SUMSQ_STAGE;
        __syncthreads(); /* thread 0 has added the previous stage */
        for (int k = (int)threadIdx.x; k < len; k += (int)blockDim.x) stage[k] = partial[c0 + k];
        __syncthreads();
        if (threadIdx.x == 0) {
            int k = 0;
            for (; k + SUMSQ_UNROLL <= len; k += SUMSQ_UNROLL) { /* loads first, adds in order */
                double p[SUMSQ_UNROLL];
                CT_UNROLL
                for (int u = 0; u < SUMSQ_UNROLL; u++) p[u] = stage[k + u];
                CT_UNROLL
                for (int u = 0; u < SUMSQ_UNROLL; u++) total += p[u];
            }
            for (; k < len; k++) total += stage[k];
        }
    }
    if (threadIdx.x == 0) out[i] = (float)total;
}

/* ---- launchers ------------------------------------------------------------------------------- */

template <int VEC, int COPY>
static void adamw_launch(ct_cuda_ctx *cx, float *param, const float *grad, float *m, float *v,
                         void *copy, const adamw_scalars &h, const adamw_batch &b) {
    ct_launch(adamw_kernel<VEC, COPY>, dim3(ct_launch_blocks(cx, b.unit_start[b.n])),
              dim3(CT_LAUNCH_THREADS), 0, ct_cuda_stream(cx), param, grad, m, v, copy, h, b);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <int COPY>
static void adamw_batches(ct_cuda_ctx *cx, float *param, const float *grad, float *m, float *v,
                          void *copy, size_t copy_size, const ct_adamw_segment *segments,
                          int n_segments, const adamw_scalars &h) {
    const bool vec = ct_launch_aligned(param, 16) && ct_launch_aligned(grad, 16) &&
                     ct_launch_aligned(m, 16) && ct_launch_aligned(v, 16) &&
                     (COPY == ADAMW_COPY_NONE || ct_launch_aligned(copy, 4 * copy_size));
    for (int s0 = 0; s0 < n_segments; s0 += ADAMW_BATCH) {
        adamw_batch b;
        memset(&b, 0, sizeof b);
        b.n = 0;
        for (int s = s0; s < n_segments && s < s0 + ADAMW_BATCH; s++) {
            const int64_t off = segments[s].offset, cnt = segments[s].count;
            if (cnt <= 0) continue;
            const int64_t head = vec ? adamw_head<4>(off, cnt) : 0;
            const int64_t groups = vec ? (cnt - head) / 4 : 0;
            const int64_t units = vec ? head + groups + (cnt - head - groups * 4) : cnt;
            b.offset[b.n] = off;
            b.count[b.n] = cnt;
            b.wd[b.n] = segments[s].weight_decay;
            b.unit_start[b.n + 1] = b.unit_start[b.n] + units;
            b.n++;
        }
        if (b.n == 0) continue;
        if (vec)
            adamw_launch<4, COPY>(cx, param, grad, m, v, copy, h, b);
        else
            adamw_launch<1, COPY>(cx, param, grad, m, v, copy, h, b);
    }
}

extern "C" void ct_cuda_adamw(void *ctx, float *param, const float *grad, float *m, float *v,
                              const ct_adamw_segment *segments, int n_segments,
                              const ct_adamw_hparams *hp, void *param_copy, ct_dtype copy_dtype) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(!param_copy || copy_dtype == CT_DTYPE_F32 || copy_dtype == CT_DTYPE_BF16,
               "adamw: param copy of dtype %s", ct_dtype_name(copy_dtype));
    adamw_scalars h;
    h.b1 = hp->beta1;
    h.b2 = hp->beta2;
    h.one_b1 = 1.0f - h.b1;
    h.one_b2 = 1.0f - h.b2;
    h.bc1 = (float)(1.0 - pow((double)h.b1, (double)hp->step));
    h.bc2 = (float)(1.0 - pow((double)h.b2, (double)hp->step));
    h.lr = hp->lr;
    h.eps = hp->eps;
    h.gs = hp->grad_scale;
    if (!param_copy)
        adamw_batches<ADAMW_COPY_NONE>(cx, param, grad, m, v, NULL, 0, segments, n_segments, h);
    else if (copy_dtype == CT_DTYPE_BF16)
        adamw_batches<ADAMW_COPY_BF16>(cx, param, grad, m, v, param_copy, 2, segments, n_segments,
                                       h);
    else
        adamw_batches<ADAMW_COPY_F32>(cx, param, grad, m, v, param_copy, 4, segments, n_segments,
                                      h);
}

/* Batches of up to SUMSQ_BATCH consecutive ranges, each two launches (chunks, then totals); the
 * chunk partials of all batches side by side in one workspace (asked for once: it may move when a
 * larger one is asked for). A batch takes 16-byte loads when every one of its ranges is aligned. */
extern "C" void ct_cuda_sumsq(void *ctx, float *out, const float *const *x, const int64_t *n,
                              int count) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    cudaStream_t st = ct_cuda_stream(cx);
    int64_t all_chunks = 0;
    for (int i = 0; i < count; i++)
        all_chunks += n[i] > 0 ? (n[i] + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK : 0;
    double *partial = (double *)ct_cuda_workspace(
        cx, 0, (size_t)(all_chunks > 0 ? all_chunks : 1) * sizeof(double));
    for (int first = 0; first < count; first += SUMSQ_BATCH) {
        sumsq_batch b;
        memset(&b, 0, sizeof b);
        b.n = count - first < SUMSQ_BATCH ? count - first : SUMSQ_BATCH;
        bool aligned = true;
        for (int i = 0; i < b.n; i++) {
            b.x[i] = x[first + i];
            b.count[i] = n[first + i];
            b.chunk_start[i + 1] =
                b.chunk_start[i] +
                (b.count[i] > 0 ? (b.count[i] + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK : 0);
            aligned = aligned && ct_launch_aligned(b.x[i], 16);
        }
        const int64_t n_chunks = b.chunk_start[b.n];
        if (n_chunks > 0) {
            const int64_t threads = n_chunks * (SUMSQ_LANES / (aligned ? 4 : 1));
            const dim3 grid((unsigned)((threads + CT_LAUNCH_THREADS - 1) / CT_LAUNCH_THREADS));
            if (aligned)
                ct_launch(sumsq_chunk_kernel<4>, grid, dim3(CT_LAUNCH_THREADS), 0, st, partial, b);
            else
                ct_launch(sumsq_chunk_kernel<1>, grid, dim3(CT_LAUNCH_THREADS), 0, st, partial, b);
            CT_CUDA_CHECK(cudaGetLastError());
        }
        ct_launch(sumsq_total_kernel, dim3((unsigned)b.n), dim3(CT_LAUNCH_THREADS), 0, st,
                  out + first, (const double *)partial, b);
        CT_CUDA_CHECK(cudaGetLastError());
        partial += n_chunks;
    }
}
