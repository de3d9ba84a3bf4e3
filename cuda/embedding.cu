/*
 * embedding.cu — token and position embeddings, forward and backward (the slots embedding_fwd,
 * embedding_bwd, posemb_fwd, posemb_bwd). The CPU reference is core/backend/cpu/embedding.c; every
 * result here is bit-identical to it: embedding_fwd  out[i] = table[tokens[i] - row_offset], or
 * zeros for a token outside [row_offset, row_offset + rows) (another vocab shard's): a copy, no
 * arithmetic. posemb_fwd     out[b, t] = out[b, t] + wpe[pos_offset + t]  (fp32, rounded once for
 * bf16). embedding_bwd  dtable[r] += dout[i] for each token i with row r = tokens[i] - row_offset
 * inside the slice, in token order (tokens outside are skipped), as the CPU adds them. posemb_bwd
 * dwpe[pos_offset + t] += (dout[0, t] + dout[1, t] + ...), the batch in order.
 *
 * Kernels:
 *   emb_fwd_kernel      rows x column vectors (2-D grid-stride): a copy or zeros per row.
 *   posemb_fwd_kernel   rows x column vectors: one add per element.
 *   embedding_bwd first sorts the tokens inside the slice by row, stably (a counting sort):
 *   emb_count_kernel    cnt[r] = the tokens of row r (integer atomicAdd);
 *   emb_scan_kernel     one block: start[r] = the exclusive prefix sum of cnt;
 *   emb_fill_kernel     each token into its row's bucket at an atomically taken slot (any order);
 *   emb_rank_kernel     each token's rank among its bucket's smaller token indices gives its place,
 *                       so every bucket of `order` is in token order, and head[i] marks a bucket's
 *                       first token. O(N + rows + Σ m²) for buckets of m tokens: the repeats of the
 *                       commonest token bound it (a batch of one token repeated is O(N²) reads).
 *   emb_bwd_kernel      one thread per (head token, column vector) adds its bucket in token order:
 *                       acc = dtable[r]; acc += dout[k] for each k of the bucket; dtable[r] = acc,
 *                       8 rows' loads in flight at a time. Every dtable element is written by one
 *                       thread, with the CPU's additions in the CPU's order: no float atomics,
 *                       and the bits do not depend on the order the integer atomics took.
 *   posemb_bwd_kernel   positions x column vectors: the batch summed in order, then added.
 */
#include "cuda/ct_cuda.h"

#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/ct_cuda_ctx.h"
#include "cuda/launch.cuh"

#define EMB_THREADS 256       /* block of the per-token kernels of embedding_bwd */
#define EMB_SCAN_THREADS 1024 /* the one block of emb_scan_kernel */
#define EMB_BATCH 8           /* rows of dout emb_bwd_kernel loads before adding them */

/* ---- forward --------------------------------------------------------------------------------- */

/* Row i: out[i] = table[tokens[i] - row_offset] or zeros; cols = C / VEC column vectors. */
template <typename T, int VEC>
static __global__ void emb_fwd_kernel(T *out, const int32_t *tokens, const T *table, int64_t N,
                                      int64_t C, int64_t rows, int64_t row_offset) {
    typedef ct_pack<T, VEC> pack;
    const int64_t cols = C / VEC;
    for (int64_t i = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; i < N;
         i += (int64_t)gridDim.y * blockDim.y) {
        const int64_t r = (int64_t)tokens[i] - row_offset;
        const bool inside = r >= 0 && r < rows;
        for (int64_t cv = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; cv < cols;
             cv += (int64_t)gridDim.x * blockDim.x) {
            pack x;
            if (inside) {
                x = *reinterpret_cast<const pack *>(table + r * C + cv * VEC);
            } else {
                for (int k = 0; k < VEC; k++) x.v[k] = ct_from_f32<T>(0.0f);
            }
            *reinterpret_cast<pack *>(out + i * C + cv * VEC) = x;
        }
    }
}

/* Row bt of (B·T): out[bt] = out[bt] + wpe[pos_offset + bt % T]. */
template <typename T, int VEC>
static __global__ void posemb_fwd_kernel(T *out, const T *wpe, int64_t BT, int64_t T_, int64_t C,
                                         int64_t pos_offset) {
    const int64_t cols = C / VEC;
    for (int64_t bt = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; bt < BT;
         bt += (int64_t)gridDim.y * blockDim.y) {
        const T *w = wpe + (pos_offset + bt % T_) * C;
        for (int64_t cv = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; cv < cols;
             cv += (int64_t)gridDim.x * blockDim.x) {
            float o[VEC], x[VEC];
            ct_load<T, VEC>(out + bt * C + cv * VEC, o);
            ct_load<T, VEC>(w + cv * VEC, x);
            for (int k = 0; k < VEC; k++) o[k] = o[k] + x[k];
            ct_put<T, VEC>(out + bt * C + cv * VEC, o);
        }
    }
}

/* ---- backward -------------------------------------------------------------------------------- */

/* Token i (grid-stride): cnt[r] += 1 for a token inside the slice (integer atomics: the counts,
 * not their order, are the result). */
static __global__ void emb_count_kernel(int32_t *cnt, const int32_t *tokens, int32_t N,
                                        int64_t rows, int64_t row_offset) {
    for (int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x); i < N;
         i += (int32_t)(gridDim.x * blockDim.x)) {
        const int64_t r = (int64_t)tokens[i] - row_offset;
        if (r >= 0 && r < rows) atomicAdd(&cnt[r], 1);
    }
}

/* One block: start[r] = cnt[0] + ... + cnt[r - 1] (exclusive scan), cursor[r] = start[r]. Each
 * thread scans a contiguous run of rows; the runs' totals are scanned in shared memory. */
static __global__ void emb_scan_kernel(int32_t *start, int32_t *cursor, const int32_t *cnt,
                                       int64_t rows) {
    CT_SHARED(int32_t, part, EMB_SCAN_THREADS);
    const int64_t per = (rows + EMB_SCAN_THREADS - 1) / EMB_SCAN_THREADS;
    const int64_t lo = (int64_t)threadIdx.x * per;
    const int64_t hi = lo + per < rows ? lo + per : rows;
    int32_t sum = 0;
    for (int64_t r = lo; r < hi; r++) sum += cnt[r];
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int off = 1; off < EMB_SCAN_THREADS; off *= 2) { /* inclusive scan of the run totals */
        const int32_t left = (int)threadIdx.x >= off ? part[threadIdx.x - off] : 0;
        __syncthreads();
        part[threadIdx.x] += left;
        __syncthreads();
    }
    int32_t run = threadIdx.x > 0 ? part[threadIdx.x - 1] : 0;
    for (int64_t r = lo; r < hi; r++) {
        start[r] = run;
        cursor[r] = run;
        run += cnt[r];
    }
}

/* Token i (grid-stride) inside the slice: list[cursor[r]++] = i. The order inside a row's bucket
 * is whatever the atomics give; emb_rank_kernel puts it in token order. */
static __global__ void emb_fill_kernel(int32_t *list, int32_t *cursor, const int32_t *tokens,
                                       int32_t N, int64_t rows, int64_t row_offset) {
    for (int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x); i < N;
         i += (int32_t)(gridDim.x * blockDim.x)) {
        const int64_t r = (int64_t)tokens[i] - row_offset;
        if (r >= 0 && r < rows) list[atomicAdd(&cursor[r], 1)] = i;
    }
}

/* Token i (grid-stride): inside the slice, its rank k = the tokens of its bucket before it, so
 * order[start[r] + k] = i (each bucket in token order) and head[i] = (k == 0); outside, head[i] =
 * 0. A bucket of m tokens costs m reads to each of its m tokens. */
static __global__ void emb_rank_kernel(int32_t *order, uint8_t *head, const int32_t *list,
                                       const int32_t *start, const int32_t *cnt,
                                       const int32_t *tokens, int32_t N, int64_t rows,
                                       int64_t row_offset) {
    for (int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x); i < N;
         i += (int32_t)(gridDim.x * blockDim.x)) {
        const int64_t r = (int64_t)tokens[i] - row_offset;
        if (r < 0 || r >= rows) {
            head[i] = 0;
            continue;
        }
        const int32_t s = start[r], m = cnt[r];
        int32_t k = 0;
        for (int32_t j = s; j < s + m; j++) k += list[j] < i;
        order[s + k] = i;
        head[i] = k == 0;
    }
}

/* Token i (y, grid-stride), column vector cv (x): a head token adds its row's bucket, in token
 * order, into dtable: acc = dtable[r]; acc += dout[k] for each k of order[start[r] ..); dtable[r] =
 * acc. EMB_BATCH rows of dout are loaded before they are added, in the same order. */
template <typename T, int VEC>
static __global__ void emb_bwd_kernel(float *dtable, const T *dout, const int32_t *tokens,
                                      const int32_t *order, const int32_t *start,
                                      const int32_t *cnt, const uint8_t *head, int32_t N, int64_t C,
                                      int64_t row_offset) {
    const int64_t cols = C / VEC;
    for (int32_t i = (int32_t)(blockIdx.y * blockDim.y + threadIdx.y); i < N;
         i += (int32_t)(gridDim.y * blockDim.y)) {
        if (!head[i]) continue;
        const int64_t r = (int64_t)tokens[i] - row_offset;
        const int32_t *ks = order + start[r];
        const int32_t m = cnt[r];
        float *dst = dtable + r * C;
        for (int64_t cv = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; cv < cols;
             cv += (int64_t)gridDim.x * blockDim.x) {
            float acc[VEC];
            ct_load<float, VEC>(dst + cv * VEC, acc);
            int32_t q0 = 0;
            for (; q0 + EMB_BATCH <= m; q0 += EMB_BATCH) {
                float x[EMB_BATCH][VEC];
                CT_UNROLL
                for (int u = 0; u < EMB_BATCH; u++)
                    ct_load<T, VEC>(dout + (int64_t)ks[q0 + u] * C + cv * VEC, x[u]);
                CT_UNROLL
                for (int u = 0; u < EMB_BATCH; u++)
                    for (int q = 0; q < VEC; q++) acc[q] += x[u][q];
            }
            for (; q0 < m; q0++) {
                float x[VEC];
                ct_load<T, VEC>(dout + (int64_t)ks[q0] * C + cv * VEC, x);
                for (int q = 0; q < VEC; q++) acc[q] += x[q];
            }
            ct_put<float, VEC>(dst + cv * VEC, acc);
        }
    }
}

/* Position t (y, grid-stride), column vector cv (x): dwpe[pos_offset + t] += Σ_b dout[b, t], the
 * sum starting from b = 0 and taken in batch order. */
template <typename T, int VEC>
static __global__ void posemb_bwd_kernel(float *dwpe, const T *dout, int64_t B, int64_t T_,
                                         int64_t C, int64_t pos_offset) {
    const int64_t cols = C / VEC;
    for (int64_t t = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; t < T_;
         t += (int64_t)gridDim.y * blockDim.y) {
        float *dst = dwpe + (pos_offset + t) * C;
        for (int64_t cv = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; cv < cols;
             cv += (int64_t)gridDim.x * blockDim.x) {
            float acc[VEC], x[VEC];
            ct_load<T, VEC>(dout + t * C + cv * VEC, acc);
            for (int64_t b = 1; b < B; b++) {
                ct_load<T, VEC>(dout + (b * T_ + t) * C + cv * VEC, x);
                for (int q = 0; q < VEC; q++) acc[q] += x[q];
            }
            ct_load<float, VEC>(dst + cv * VEC, x);
            for (int q = 0; q < VEC; q++) x[q] += acc[q];
            ct_put<float, VEC>(dst + cv * VEC, x);
        }
    }
}

/* ---- launchers ------------------------------------------------------------------------------- */

template <typename T>
static void emb_fwd(ct_cuda_ctx *cx, void *out, const int32_t *tokens, const void *table, int64_t N,
                    int64_t C, int64_t rows, int64_t row_offset) {
    const int vec = 16 / (int)sizeof(T);
    const bool v = C % vec == 0 && ct_launch_aligned(out, 16) && ct_launch_aligned(table, 16);
    dim3 grid, block;
    ct_launch_rows(cx, N, v ? C / vec : C, &grid, &block);
    if (v)
        ct_launch(emb_fwd_kernel<T, 16 / sizeof(T)>, grid, block, 0, ct_cuda_stream(cx), (T *)out,
                  tokens, (const T *)table, N, C, rows, row_offset);
    else
        ct_launch(emb_fwd_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), (T *)out, tokens,
                  (const T *)table, N, C, rows, row_offset);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_embedding_fwd(void *ctx, ct_dtype dt, void *out, const int32_t *tokens,
                                      const void *table, int64_t N, int64_t C, int64_t rows,
                                      int64_t row_offset) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "embedding_fwd dtype %d", (int)dt);
    if (N <= 0 || C <= 0) return;
    if (dt == CT_DTYPE_BF16)
        emb_fwd<__nv_bfloat16>(cx, out, tokens, table, N, C, rows, row_offset);
    else
        emb_fwd<float>(cx, out, tokens, table, N, C, rows, row_offset);
}

/* VEC = 4 for both dtypes: dtable is fp32 (16 bytes), dout 16 or 8 bytes. */
template <typename T>
static void emb_bwd(ct_cuda_ctx *cx, float *dtable, const void *dout, const int32_t *tokens,
                    int64_t N, int64_t C, int64_t rows, int64_t row_offset) {
    cudaStream_t st = ct_cuda_stream(cx);
    const int32_t n = (int32_t)N;
    /* workspace: cnt, start, cursor (rows int32 each) | list, order (N int32 each) | head (N) */
    const size_t rb = (size_t)rows * sizeof(int32_t), nb = (size_t)N * sizeof(int32_t);
    char *ws = (char *)ct_cuda_workspace(cx, 0, 3 * rb + 2 * nb + (size_t)N);
    int32_t *cnt = (int32_t *)ws, *start = (int32_t *)(ws + rb), *cursor = (int32_t *)(ws + 2 * rb);
    int32_t *list = (int32_t *)(ws + 3 * rb), *order = (int32_t *)(ws + 3 * rb + nb);
    uint8_t *head = (uint8_t *)(ws + 3 * rb + 2 * nb);
    CT_CUDA_CHECK(cudaMemsetAsync(cnt, 0, rb, st));
    const dim3 tok_grid((unsigned)((N + EMB_THREADS - 1) / EMB_THREADS));
    ct_launch(emb_count_kernel, tok_grid, dim3(EMB_THREADS), 0, st, cnt, tokens, n, rows,
              row_offset);
    CT_CUDA_CHECK(cudaGetLastError());
    ct_launch(emb_scan_kernel, dim3(1), dim3(EMB_SCAN_THREADS), 0, st, start, cursor,
              (const int32_t *)cnt, rows);
    CT_CUDA_CHECK(cudaGetLastError());
    ct_launch(emb_fill_kernel, tok_grid, dim3(EMB_THREADS), 0, st, list, cursor, tokens, n, rows,
              row_offset);
    CT_CUDA_CHECK(cudaGetLastError());
    ct_launch(emb_rank_kernel, tok_grid, dim3(EMB_THREADS), 0, st, order, head,
              (const int32_t *)list, (const int32_t *)start, (const int32_t *)cnt, tokens, n, rows,
              row_offset);
    CT_CUDA_CHECK(cudaGetLastError());
    const bool v =
        C % 4 == 0 && ct_launch_aligned(dtable, 16) && ct_launch_aligned(dout, 4 * sizeof(T));
    dim3 grid, block;
    ct_launch_rows(cx, N, v ? C / 4 : C, &grid, &block);
    if (v)
        ct_launch(emb_bwd_kernel<T, 4>, grid, block, 0, st, dtable, (const T *)dout, tokens,
                  (const int32_t *)order, (const int32_t *)start, (const int32_t *)cnt,
                  (const uint8_t *)head, n, C, row_offset);
    else
        ct_launch(emb_bwd_kernel<T, 1>, grid, block, 0, st, dtable, (const T *)dout, tokens,
                  (const int32_t *)order, (const int32_t *)start, (const int32_t *)cnt,
                  (const uint8_t *)head, n, C, row_offset);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_embedding_bwd(void *ctx, ct_dtype dt, float *dtable, const void *dout,
                                      const int32_t *tokens, int64_t N, int64_t C, int64_t rows,
                                      int64_t row_offset) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "embedding_bwd dtype %d", (int)dt);
    CT_ASSERTF(N < INT32_MAX - EMB_THREADS, "embedding_bwd: %lld tokens", (long long)N);
    if (N <= 0 || C <= 0) return;
    if (dt == CT_DTYPE_BF16)
        emb_bwd<__nv_bfloat16>(cx, dtable, dout, tokens, N, C, rows, row_offset);
    else
        emb_bwd<float>(cx, dtable, dout, tokens, N, C, rows, row_offset);
}

template <typename T>
static void posemb_fwd(ct_cuda_ctx *cx, void *out, const void *wpe, int64_t B, int64_t T_,
                       int64_t C, int64_t pos_offset) {
    const int vec = 16 / (int)sizeof(T);
    const bool v = C % vec == 0 && ct_launch_aligned(out, 16) && ct_launch_aligned(wpe, 16);
    dim3 grid, block;
    ct_launch_rows(cx, B * T_, v ? C / vec : C, &grid, &block);
    if (v)
        ct_launch(posemb_fwd_kernel<T, 16 / sizeof(T)>, grid, block, 0, ct_cuda_stream(cx),
                  (T *)out, (const T *)wpe, B * T_, T_, C, pos_offset);
    else
        ct_launch(posemb_fwd_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), (T *)out,
                  (const T *)wpe, B * T_, T_, C, pos_offset);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_posemb_fwd(void *ctx, ct_dtype dt, void *out, const void *wpe, int64_t B,
                                   int64_t T, int64_t C, int64_t pos_offset) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "posemb_fwd dtype %d", (int)dt);
    if (B <= 0 || T <= 0 || C <= 0) return;
    if (dt == CT_DTYPE_BF16)
        posemb_fwd<__nv_bfloat16>(cx, out, wpe, B, T, C, pos_offset);
    else
        posemb_fwd<float>(cx, out, wpe, B, T, C, pos_offset);
}

/* VEC = 4 for both dtypes: dwpe is fp32 (16 bytes), dout 16 or 8 bytes. */
template <typename T>
static void posemb_bwd(ct_cuda_ctx *cx, float *dwpe, const void *dout, int64_t B, int64_t T_,
                       int64_t C, int64_t pos_offset) {
    const bool v =
        C % 4 == 0 && ct_launch_aligned(dwpe, 16) && ct_launch_aligned(dout, 4 * sizeof(T));
    dim3 grid, block;
    ct_launch_rows(cx, T_, v ? C / 4 : C, &grid, &block);
    if (v)
        ct_launch(posemb_bwd_kernel<T, 4>, grid, block, 0, ct_cuda_stream(cx), dwpe,
                  (const T *)dout, B, T_, C, pos_offset);
    else
        ct_launch(posemb_bwd_kernel<T, 1>, grid, block, 0, ct_cuda_stream(cx), dwpe,
                  (const T *)dout, B, T_, C, pos_offset);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_posemb_bwd(void *ctx, ct_dtype dt, float *dwpe, const void *dout, int64_t B,
                                   int64_t T, int64_t C, int64_t pos_offset) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "posemb_bwd dtype %d", (int)dt);
    if (B <= 0 || T <= 0 || C <= 0) return;
    if (dt == CT_DTYPE_BF16)
        posemb_bwd<__nv_bfloat16>(cx, dwpe, dout, B, T, C, pos_offset);
    else
        posemb_bwd<float>(cx, dwpe, dout, B, T, C, pos_offset);
}
