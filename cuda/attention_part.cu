/*
 * attention_part.cu — one step of ring attention (the slots attention_part_fwd,
 * attention_part_bwd, context parallelism): the local queries against
 * one key/value block of the ring, forward and backward, in fp32 on the tiles of
 * cuda/attention_tile.cuh (64 query rows × 64 keys, 256 threads, register tiles; explained
 * there). bf16
 * inputs are widened on load: no tensor cores yet.
 *
 * The local rows are two chunks of ch = T/2 rows at global chunk indices q0, q1, the block's rows
 * two chunks at k0, k1 (CT_ATT_CHUNKS); query chunk qc meets key chunk kc fully when kc < qc,
 * causally when kc == qc, not at all when kc > qc. Formulas and merge as the CPU reference
 * (core/backend/cpu/attention.c): each attended (query chunk,
 * key chunk) pair is one block (Ob, Lb) by online softmax, merged into the accumulators (O, L) by
 * L' = max(L, Lb) + log1p(e^(−|L − Lb|)), O' = e^(L − L')·O + e^(Lb − L')·Ob, pairs in the order
 * (query chunk, key chunk 0, key chunk 1); the backward recomputes P = exp(s − L) from the final L
 * and adds scale·dS·K to dq_acc and scale·dSᵀ·Q, Pᵀ·dO to dkv_acc.
 *
 * Kernels (the grids' x runs over the tiles of both chunks, chunk-major; shared memory as
 * attention_tile.cuh's steps ask):
 *   part_fwd_kernel   (2·tiles, n_head, B): a query tile; per key chunk it attends, the chunk's
 *                     key tiles (up to the diagonal when causal), then the merge. A half-warp's
 *                     rows are its own, so the read-modify-write of O and L needs no atomics.
 *   part_dkdv_kernel  (2·tiles, n_kv_head, B): a key tile of the block; per query head of the GQA
 *                     group and per query chunk that sees it, the query tiles in order; then
 *                     dkv_acc += its dK, dV (one owner per row: no atomics).
 *   part_dq_kernel    (2·tiles, n_head, B): a query tile; per key chunk it sees, the key tiles in
 *                     order; then dq_acc += its dQ.
 * D = rowsum(dO ⊙ O) comes from attention.cu's row-dot kernel, into workspace 0.
 * Every sum runs in an order fixed by the shapes: reruns give the same bits.
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/ct_cuda_ctx.h"
#include "cuda/attention_tc.cuh"
#include "cuda/attention_tile.cuh"
#include "cuda/launch.cuh"

/* The chunk index i of a packed CT_ATT_CHUNKS (0, 1: query chunks; 2, 3: key chunks). */
static __device__ inline int part_chunk(int64_t chunks, int i) {
    return (int)((chunks >> (16 * i)) & 0x7fff);
}

/* -1: the pair is skipped; 0: full; 1: causal (the same chunk). */
static __device__ inline int part_kind(int64_t chunks, int qa, int ka) {
    const int qc = part_chunk(chunks, qa), kc = part_chunk(chunks, 2 + ka);
    return kc > qc ? -1 : kc == qc;
}

/* The query (or key) tiles of one chunk a step attends: all n_t of a full pair, up to and
 * including tile t of a causal one. */
static __device__ inline int part_tiles(int kind, int t, int n_t) {
    return kind ? t + 1 : n_t;
}

/* ---- forward --------------------------------------------------------------------------------- */

template <typename S, int HD>
static __global__ void __launch_bounds__(AF_THREADS, AF_MINB(HD))
    part_fwd_kernel(float *o_acc, float *lse_acc, const S *qkv, const S *kv, int T, int n_head,
                    int n_kv_head, int hd, int64_t chunks, float scale, bool vec) {
    CT_DYN_SHARED(float, smem); /* af_fwd_smem: the query tile first */
    const int ch = T / 2, n_t = (int)gridDim.x / 2;
    const int qa = (int)blockIdx.x / n_t, qt = (int)blockIdx.x % n_t;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd;
    const int64_t lqkv = cq + 2 * ckv, lkv = 2 * ckv;
    const int64_t q_row = (int64_t)b * T + (int64_t)qa * ch; /* the chunk's first row */
    const int q0 = qt * AF_TILE; /* the tile's first row, in the chunk */

    af_load_tile<S, HD>(smem, qkv + q_row * lqkv + (int64_t)h * hd, lqkv, q0, ch, hd, vec);
    for (int ka = 0; ka < 2; ka++) {
        const int kind = part_kind(chunks, qa, ka);
        if (kind < 0) continue; /* block-uniform */
        const S *kh = kv + ((int64_t)b * T + (int64_t)ka * ch) * lkv + (int64_t)kvh * hd;
        af_fwd_rows<HD> st;
        st.start();
        for (int kt = 0; kt < part_tiles(kind, qt, n_t); kt++)
            af_fwd_tile<S, HD>(st, smem, kh, kh + ckv, lkv, kt * AF_TILE, ch, q0, kind == 1, hd,
                               scale, vec);
        /* merge the pair's (Ob, Lb) into the accumulators of the thread's rows */
        CT_UNROLL
        for (int a = 0; a < AF_RM; a++) {
            const float sum = af_row_sum(st.l[a]);
            const int i = q0 + af_ty() + a * AF_TY;
            const bool live = i < ch; /* the same on the half-warp, which shares the row */
            const float inv = 1.0f / sum, lb = st.m[a] + logf(sum);
            float *orow = o_acc + (q_row + i) * cq + (int64_t)h * hd;
            float *lrow = lse_acc + ((int64_t)b * n_head + h) * T + (int64_t)qa * ch + i;
            const float la = live ? *lrow : 0.0f; /* every lane reads it before one writes it */
            float wa = 0.0f, wb = inv, lnew = lb;
            if (la != -INFINITY) {
                const float mx = fmaxf(la, lb);
                lnew = mx + log1pf(expf(fminf(la, lb) - mx));
                wa = expf(la - lnew), wb = expf(lb - lnew) * inv;
            }
            CT_UNROLL
            for (int n = 0; n < af_shape<HD>::NH; n++) {
                const int d = af_col<HD>(n);
                if (live && d < hd)
                    orow[d] = la == -INFINITY ? st.o[a][n] * inv : wa * orow[d] + wb * st.o[a][n];
            }
            __syncwarp();
            if (live && af_tx() == 0) *lrow = lnew;
            __syncwarp(); /* the next pair's merge reads it */
        }
    }
}

/* ---- backward -------------------------------------------------------------------------------- */

template <typename S, int HD>
static __global__ void __launch_bounds__(AF_THREADS, AF_MINB_DKDV(HD))
    part_dkdv_kernel(float *dkv_acc, const S *dout, const S *qkv, const float *lse, const float *D,
                     const S *kv, int T, int n_head, int n_kv_head, int hd, int64_t chunks,
                     float scale, bool vec) {
    constexpr int NH = af_shape<HD>::NH;
    CT_DYN_SHARED(float, smem); /* af_dkdv_smem: K and V first */
    const int ch = T / 2, n_t = (int)gridDim.x / 2;
    const int ka = (int)blockIdx.x / n_t, kt = (int)blockIdx.x % n_t;
    const int kvh = blockIdx.y, b = blockIdx.z, group = n_head / n_kv_head;
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd;
    const int64_t lqkv = cq + 2 * ckv, lkv = 2 * ckv;
    const int64_t k_row = (int64_t)b * T + (int64_t)ka * ch; /* the key chunk's first row */
    const int k0 = kt * AF_TILE; /* the tile's first key, in the chunk */
    const S *kh = kv + k_row * lkv + (int64_t)kvh * hd;

    af_load_tile<S, HD>(smem, kh, lkv, k0, ch, hd, vec);
    af_load_tile<S, HD>(smem + AF_TILE * af_shape<HD>::LD, kh + ckv, lkv, k0, ch, hd, vec);
    float dk[AF_RM][NH], dv[AF_RM][NH];
    af_zero<HD>(dk);
    af_zero<HD>(dv);
    for (int g = 0; g < group; g++) {
        const int h = kvh * group + g;
        for (int qa = 0; qa < 2; qa++) {
            const int kind = part_kind(chunks, qa, ka);
            if (kind < 0) continue;
            const int64_t q_row = (int64_t)b * T + (int64_t)qa * ch;
            const int64_t lrow = ((int64_t)b * n_head + h) * T + (int64_t)qa * ch;
            /* a causal pair: query tiles from the key tile's own on (the earlier are masked) */
            for (int qt = kind ? kt : 0; qt < n_t; qt++)
                af_dkdv_tile<S, HD>(dk, dv, smem, qkv + q_row * lqkv + (int64_t)h * hd, lqkv,
                                    dout + q_row * cq + (int64_t)h * hd, cq, lse + lrow, D + lrow,
                                    qt * AF_TILE, ch, k0, ch, kind == 1, hd, scale, vec);
        }
    }
    float *dkh = dkv_acc + k_row * lkv + (int64_t)kvh * hd;
    af_store_rows<HD>(dkh, lkv, dk, k0, ch, hd, scale, true);
    af_store_rows<HD>(dkh + ckv, lkv, dv, k0, ch, hd, 1.0f, true);
}

template <typename S, int HD>
static __global__ void __launch_bounds__(AF_THREADS, AF_MINB(HD))
    part_dq_kernel(float *dq_acc, const S *dout, const S *qkv, const float *lse, const float *D,
                   const S *kv, int T, int n_head, int n_kv_head, int hd, int64_t chunks,
                   float scale, bool vec) {
    CT_DYN_SHARED(float, smem); /* af_dq_smem: Q, dO, K, V, dS, lse, D */
    float *ls = af_dq_rows<HD>(smem);
    const int ch = T / 2, n_t = (int)gridDim.x / 2;
    const int qa = (int)blockIdx.x / n_t, qt = (int)blockIdx.x % n_t;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd;
    const int64_t lqkv = cq + 2 * ckv, lkv = 2 * ckv;
    const int64_t q_row = (int64_t)b * T + (int64_t)qa * ch;
    const int64_t lrow = ((int64_t)b * n_head + h) * T + (int64_t)qa * ch;
    const int q0 = qt * AF_TILE;

    af_load_tile<S, HD>(smem, qkv + q_row * lqkv + (int64_t)h * hd, lqkv, q0, ch, hd, vec);
    af_load_tile<S, HD>(smem + AF_TILE * af_shape<HD>::LD, dout + q_row * cq + (int64_t)h * hd, cq,
                        q0, ch, hd, vec);
    af_load_rows(ls, lse + lrow, q0, ch);
    af_load_rows(ls + AF_TILE, D + lrow, q0, ch);
    float dq[AF_RM][af_shape<HD>::NH];
    af_zero<HD>(dq);
    for (int ka = 0; ka < 2; ka++) {
        const int kind = part_kind(chunks, qa, ka);
        if (kind < 0) continue;
        const S *kh = kv + ((int64_t)b * T + (int64_t)ka * ch) * lkv + (int64_t)kvh * hd;
        for (int kt = 0; kt < part_tiles(kind, qt, n_t); kt++)
            af_dq_tile<S, HD>(dq, smem, kh, kh + ckv, lkv, q0, ch, kt * AF_TILE, ch, kind == 1, hd,
                              scale, vec);
    }
    af_store_rows<HD>(dq_acc + q_row * cq + (int64_t)h * hd, cq, dq, q0, ch, hd, scale, true);
}

/* ---- launchers ------------------------------------------------------------------------------- */

static void part_check_dims(const char *op, int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                            int64_t hd) {
    CT_ASSERTF(T % 2 == 0, "%s: T=%lld is two chunks", op, (long long)T);
    CT_ASSERTF(T <= INT32_MAX / 2 - AF_TILE, "%s: T=%lld", op, (long long)T);
    att_check_dims(op, B, T, n_head, n_kv_head, hd);
}

template <typename S, int HD>
static void part_fwd(ct_cuda_ctx *cx, float *o_acc, float *lse_acc, const void *qkv, const void *kv,
                     int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd,
                     int64_t chunks) {
    const size_t smem = af_fwd_smem<HD>();
    const int64_t n_t = (T / 2 + AF_TILE - 1) / AF_TILE;
    const int64_t lkv = 2 * n_kv_head * hd, lqkv = n_head * hd + lkv;
    const bool vec = af_vec_ok<S>(qkv, lqkv, hd) && af_vec_ok<S>(kv, lkv, hd);
    ct_launch_allow_smem(part_fwd_kernel<S, HD>, smem);
    ct_launch(part_fwd_kernel<S, HD>, dim3((unsigned)(2 * n_t), (unsigned)n_head, (unsigned)B),
              dim3(AF_THREADS), smem, ct_cuda_stream(cx), o_acc, lse_acc, (const S *)qkv,
              (const S *)kv, (int)T, (int)n_head, (int)n_kv_head, (int)hd, chunks,
              1.0f / sqrtf((float)hd), vec);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <typename S, int HD>
static void part_bwd(ct_cuda_ctx *cx, float *dq_acc, float *dkv_acc, const void *dout,
                     const void *qkv, const void *out, const float *lse, const void *kv, int64_t B,
                     int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd, int64_t chunks) {
    cudaStream_t st = ct_cuda_stream(cx);
    const int64_t n_t = (T / 2 + AF_TILE - 1) / AF_TILE;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t lkv = 2 * n_kv_head * hd, lqkv = n_head * hd + lkv;
    const bool vec = af_vec_ok<S>(qkv, lqkv, hd) && af_vec_ok<S>(kv, lkv, hd) &&
                     af_vec_ok<S>(dout, n_head * hd, hd);
    float *D = (float *)ct_cuda_workspace(cx, 0, (size_t)(B * n_head * T) * sizeof(float));
    ct_cuda_attention_rowdot(cx, sizeof(S) == 2 ? CT_DTYPE_BF16 : CT_DTYPE_F32, D, dout, out, B, T,
                             n_head, hd);

    const size_t smem_kv = af_dkdv_smem<HD>();
    ct_launch_allow_smem(part_dkdv_kernel<S, HD>, smem_kv);
    ct_launch(part_dkdv_kernel<S, HD>, dim3((unsigned)(2 * n_t), (unsigned)n_kv_head, (unsigned)B),
              dim3(AF_THREADS), smem_kv, st, dkv_acc, (const S *)dout, (const S *)qkv, lse,
              (const float *)D, (const S *)kv, (int)T, (int)n_head, (int)n_kv_head, (int)hd, chunks,
              scale, vec);
    CT_CUDA_CHECK(cudaGetLastError());

    const size_t smem_q = af_dq_smem<HD>();
    ct_launch_allow_smem(part_dq_kernel<S, HD>, smem_q);
    ct_launch(part_dq_kernel<S, HD>, dim3((unsigned)(2 * n_t), (unsigned)n_head, (unsigned)B),
              dim3(AF_THREADS), smem_q, st, dq_acc, (const S *)dout, (const S *)qkv, lse,
              (const float *)D, (const S *)kv, (int)T, (int)n_head, (int)n_kv_head, (int)hd, chunks,
              scale, vec);
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_attention_part_fwd(void *ctx, ct_dtype dt, float *o_acc, float *lse_acc,
                                           const void *qkv, const void *kv, int64_t B, int64_t T,
                                           int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                           int64_t chunks) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "attention_part_fwd dtype %d", (int)dt);
    if (B <= 0 || T <= 0 || n_head <= 0) return;
    part_check_dims("attention_part_fwd", B, T, n_head, n_kv_head, head_dim);
    if (dt == CT_DTYPE_BF16)
        ATT_HD_DISPATCH(part_fwd, __nv_bfloat16, head_dim, cx, o_acc, lse_acc, qkv, kv, B, T,
                        n_head, n_kv_head, head_dim, chunks);
    else
        ATT_HD_DISPATCH(part_fwd, float, head_dim, cx, o_acc, lse_acc, qkv, kv, B, T, n_head,
                        n_kv_head, head_dim, chunks);
}

extern "C" void ct_cuda_attention_part_bwd(void *ctx, ct_dtype dt, float *dq_acc, float *dkv_acc,
                                           const void *dout, const void *qkv, const void *out,
                                           const float *lse, const void *kv, int64_t B, int64_t T,
                                           int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                           int64_t chunks) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "attention_part_bwd dtype %d", (int)dt);
    if (B <= 0 || T <= 0 || n_head <= 0) return;
    part_check_dims("attention_part_bwd", B, T, n_head, n_kv_head, head_dim);
    if (dt == CT_DTYPE_BF16)
        ATT_HD_DISPATCH(part_bwd, __nv_bfloat16, head_dim, cx, dq_acc, dkv_acc, dout, qkv, out, lse,
                        kv, B, T, n_head, n_kv_head, head_dim, chunks);
    else
        ATT_HD_DISPATCH(part_bwd, float, head_dim, cx, dq_acc, dkv_acc, dout, qkv, out, lse, kv, B,
                        T, n_head, n_kv_head, head_dim, chunks);
}
