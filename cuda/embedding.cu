/*
 * embedding.cu — token and position embeddings, forward and backward (embedding.cuh). The CPU
 * reference is ct_cpu_embedding_fwd / _bwd and ct_cpu_posemb_fwd / _bwd in
 * core/backend/cpu_kernels.c with their bf16 slots (backend_cpu.c); every result here is
 * bit-identical to it: embedding_fwd  out[i] = table[tokens[i] - row_offset], or zeros for a token
 * outside [row_offset, row_offset + rows) (another vocab shard's): a copy, no arithmetic.
 *   posemb_fwd     out[b, t] = out[b, t] + wpe[pos_offset + t]  (fp32, rounded once for bf16).
 *   embedding_bwd  dtable[r] += dout[i] for each token i with row r = tokens[i] - row_offset inside
 *                  the slice, in token order (tokens outside are skipped), as the CPU adds them.
 *   posemb_bwd     dwpe[pos_offset + t] += (dout[0, t] + dout[1, t] + ...), the batch in order.
 *
 * Kernels:
 *   emb_fwd_kernel      rows x column vectors (2-D grid-stride): a copy or zeros per row.
 *   posemb_fwd_kernel   rows x column vectors: one add per element.
 *   emb_chain_kernel    embedding_bwd, step 1: for every token i inside the slice, next[i] = the
 *                       first later token with the same id (N if none) and head[i] = 1 when no
 *                       earlier token has its id. A block compares its 256 tokens against all N,
 *                       tile by tile through shared memory, and stops once each of its threads has
 *                       found its answer. O(N²) comparisons, N a microbatch's tokens: ~N/256 tiles
 *                       of shared-memory reads per thread, cheap beside the dout traffic.
 *   emb_bwd_kernel      embedding_bwd, step 2: one thread per (head token, column vector) walks
 *                       its id's chain in token order: acc = dtable[r]; acc += dout[k] for each k
 *                       of the chain; dtable[r] = acc. Every dtable element is written by one
 *                       thread, with the CPU's additions in the CPU's order: no atomics.
 *   posemb_bwd_kernel   positions x column vectors: the batch summed in order, then added.
 */
#include "cuda/ct_cuda.h"

#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/embedding.cuh"
#include "cuda/launch.cuh"

#define EMB_TILE 256 /* tokens per shared-memory tile of emb_chain_kernel (= its block) */

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

/* Token i = this thread. For a token inside the slice: head[i] = no earlier token has its id;
 * next[i] = the first later token with its id, or N. Outside the slice: head[i] = 0 (next unset).
 * The loop runs while any thread of the block still searches; its barrier (the _or) also keeps a
 * tile from being overwritten while a thread still reads it. */
static __global__ void emb_chain_kernel(int32_t *next, uint8_t *head, const int32_t *tokens,
                                        int32_t N, int64_t rows, int64_t row_offset) {
    CT_SHARED(int32_t, tile, EMB_TILE);
    const int32_t i = (int32_t)(blockIdx.x * EMB_TILE + threadIdx.x);
    const int32_t tok = i < N ? tokens[i] : 0;
    const int64_t r = (int64_t)tok - row_offset;
    const bool inside = i < N && r >= 0 && r < rows;
    bool first = inside, done = !inside;
    int32_t nxt = N;
    for (int32_t t0 = 0; __syncthreads_or(!done) && t0 < N; t0 += EMB_TILE) {
        if (t0 + (int32_t)threadIdx.x < N) tile[threadIdx.x] = tokens[t0 + threadIdx.x];
        __syncthreads();
        const int32_t len = N - t0 < EMB_TILE ? N - t0 : EMB_TILE;
        for (int32_t q = 0; q < len && !done; q++) {
            if (tile[q] != tok) continue;
            const int32_t k = t0 + q;
            if (k < i) {
                first = false;
            } else if (k > i) {
                nxt = k;
                done = true;
            }
        }
    }
    if (i < N) {
        head[i] = first ? 1 : 0;
        if (inside) next[i] = nxt;
    }
}

/* Token i (y, grid-stride), column vector cv (x): a head token adds its id's chain into dtable. */
template <typename T, int VEC>
static __global__ void emb_bwd_kernel(float *dtable, const T *dout, const int32_t *tokens,
                                      const int32_t *next, const uint8_t *head, int32_t N,
                                      int64_t C, int64_t row_offset) {
    const int64_t cols = C / VEC;
    for (int32_t i = (int32_t)(blockIdx.y * blockDim.y + threadIdx.y); i < N;
         i += (int32_t)(gridDim.y * blockDim.y)) {
        if (!head[i]) continue;
        float *dst = dtable + ((int64_t)tokens[i] - row_offset) * C;
        for (int64_t cv = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; cv < cols;
             cv += (int64_t)gridDim.x * blockDim.x) {
            float acc[VEC], x[VEC];
            ct_load<float, VEC>(dst + cv * VEC, acc);
            for (int32_t k = i; k < N; k = next[k]) {
                ct_load<T, VEC>(dout + (int64_t)k * C + cv * VEC, x);
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

extern "C" void ct_cuda_embedding_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out,
                                      const int32_t *tokens, const void *table, int64_t N,
                                      int64_t C, int64_t rows, int64_t row_offset) {
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
    /* workspace: next (N int32) | head (N bytes) */
    char *ws = (char *)ct_cuda_workspace(cx, 0, (size_t)N * (sizeof(int32_t) + 1));
    int32_t *next = (int32_t *)ws;
    uint8_t *head = (uint8_t *)(ws + (size_t)N * sizeof(int32_t));
    ct_launch(emb_chain_kernel, dim3((unsigned)((N + EMB_TILE - 1) / EMB_TILE)), dim3(EMB_TILE), 0,
              st, next, head, tokens, n, rows, row_offset);
    CT_CUDA_CHECK(cudaGetLastError());
    const bool v =
        C % 4 == 0 && ct_launch_aligned(dtable, 16) && ct_launch_aligned(dout, 4 * sizeof(T));
    dim3 grid, block;
    ct_launch_rows(cx, N, v ? C / 4 : C, &grid, &block);
    if (v)
        ct_launch(emb_bwd_kernel<T, 4>, grid, block, 0, st, dtable, (const T *)dout, tokens,
                  (const int32_t *)next, (const uint8_t *)head, n, C, row_offset);
    else
        ct_launch(emb_bwd_kernel<T, 1>, grid, block, 0, st, dtable, (const T *)dout, tokens,
                  (const int32_t *)next, (const uint8_t *)head, n, C, row_offset);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_embedding_bwd(ct_cuda_ctx *cx, ct_dtype dt, float *dtable, const void *dout,
                                      const int32_t *tokens, int64_t N, int64_t C, int64_t rows,
                                      int64_t row_offset) {
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "embedding_bwd dtype %d", (int)dt);
    CT_ASSERTF(N < INT32_MAX - EMB_TILE, "embedding_bwd: %lld tokens", (long long)N);
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

extern "C" void ct_cuda_posemb_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, const void *wpe,
                                   int64_t B, int64_t T, int64_t C, int64_t pos_offset) {
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

extern "C" void ct_cuda_posemb_bwd(ct_cuda_ctx *cx, ct_dtype dt, float *dwpe, const void *dout,
                                   int64_t B, int64_t T, int64_t C, int64_t pos_offset) {
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "posemb_bwd dtype %d", (int)dt);
    if (B <= 0 || T <= 0 || C <= 0) return;
    if (dt == CT_DTYPE_BF16)
        posemb_bwd<__nv_bfloat16>(cx, dwpe, dout, B, T, C, pos_offset);
    else
        posemb_bwd<float>(cx, dwpe, dout, B, T, C, pos_offset);
}
