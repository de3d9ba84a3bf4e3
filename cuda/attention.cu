/*
 * attention.cu — causal self-attention, forward and backward (attention.cuh), FlashAttention-2
 * style in plain CUDA: the fp32 path (fp32 operands, no tensor cores). bf16 runs on tensor cores
 * (attention_tc.cu), which shares this file's D = rowsum(dO ⊙ O) and dbias column-sum kernels. The
 * float formulas are those of the CPU reference (ct_cpu_attention_fwd / _bwd in
 * core/backend/cpu_attention.c): s = scale·(q·k) with scale = 1/sqrt(hd), p = exp(s − max) / sum,
 * out = (Σ p̃·v)·(1/sum), lse = max + log(sum); backward dP = dO·Vᵀ, D = rowsum(dO ⊙ O),
 * dS = P ⊙ (dP − D), dV = Pᵀ·dO, dQ = scale·dS·K, dK = scale·dSᵀ·Q. What differs is the
 * summation order (online softmax rescaling, tiles) and expf (at most 2 ulp on a GPU): test
 * tolerances.
 *
 * Tiles (cuda/attention_tile.cuh, shared with ring attention's attention_part.cu). ATT_BR = 32
 * query rows × ATT_BC = 32 keys, blocks of ATT_THREADS = 128 threads (4 warps), each warp owning
 * ATT_RW = 8 rows of the block's tile (query rows in the forward and dQ kernels, key rows in the
 * dK/dV kernel). In a score phase lane l takes the l-th column of the other operand (a key, or in
 * dK/dV a query), so each lane computes 8 scores; the other operand's rows are then read from
 * shared memory by every lane at once (a broadcast) and the lane's own row from a copy padded to a
 * stride of HD + 1 floats (conflict-free). In an accumulation phase lane l owns the head columns l,
 * l + 32, ... (HD/32 of them) of the warp's 8 rows, reading the probabilities the warp just wrote
 * to its own shared slice (ordered by __syncwarp). HD, the compiled head width, is 32, 64 or 128:
 * the smallest that holds head_dim, the columns past head_dim zero in shared memory (they add
 * nothing to a dot product and are never stored). Rows past T (the last tile's tail) are loaded as
 * zeros and masked: global memory is never read past row T − 1 or column head_dim − 1.
 *
 * Kernels (grid; dynamic shared memory for HD = 32 / 64 / 128, those above 48 KiB after
 * cudaFuncSetAttribute; no static shared memory):
 *   attn_fwd_kernel       (query tiles, n_head, B), heaviest tile first. Q tile, then per key
 *                         tile kt ≤ qt (tiles past the diagonal are fully masked and skipped) K
 *                         (padded) and V, scores, online softmax with the running max m (one per
 *                         row, warp-uniform) and a per-lane running sum (reduced once at the end),
 *                         out and lse. 4·(32·HD + 32·(HD+1) + 32·HD + 4·8·32) bytes:
 *                         16512 / 28800 / 53376.
 *   attn_bwd_dot_kernel   one warp per (b, h, row): D = dO·O (fp32) into workspace 0.
 *   attn_bwd_dkdv_kernel  (key tiles, n_kv_head, B). K and V tile once; then for each query head
 *                         of the GQA group in order and each query tile qt ≥ kt in order: Q and
 *                         dO (padded), lse, D; Pᵀ and dSᵀ recomputed; dV += Pᵀ·dO, dK += dSᵀ·Q in
 *                         registers. Every (b, kv head, key tile) has one owner, so the group's
 *                         heads accumulate without atomics, in a fixed order.
 *                         4·(2·32·HD + 2·32·(HD+1) + 2·4·8·32 + 2·32) bytes: 25088 / 41472 /
 *                         74240.
 *   attn_bwd_dq_kernel    (query tiles, n_head, B). Q, dO tile, lse, D; per key tile kt ≤ qt K, V
 *                         (padded); dS recomputed; dQ += dS·K in registers.
 *                         4·(2·32·HD + 2·32·(HD+1) + 4·8·32 + 2·32) bytes: 20992 / 37376 / 70144.
 * With dbias, dbias[j] += the per-tile column sums of dqkv (workspace 1, (B·tiles, lqkv), written
 * by the two kernels above from the fp32 values, before bf16 rounding, as backend.h asks) added in
 * (b, tile) order by ct_cuda_colsum_add (elementwise.cuh).
 * No float atomics: every sum runs in an order fixed by the shapes, so reruns give the same bits.
 *
 * Registers: a thread keeps 8 rows × HD/32 accumulators (two sets in dK/dV) and 8 scores. The
 * launch bounds ask for 3 resident blocks per SM for the forward and dQ (at most 168 registers;
 * ptxas for sm_90 takes 154-168 and 158-164) and 2 for dK/dV (154-196: HD = 128 spills under
 * 168); with no minimum ptxas capped the forward at 128 registers and spilled. Shared memory
 * allows 3 blocks of the widest kernels per SM on sm_90 (227 KiB), 2 on sm_80 (163 KiB).
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/attention.cuh"
#include "cuda/attention_tc.cuh"

#include "cuda/attention_tile.cuh"
#include "cuda/elementwise.cuh"

#define ATT_DOT_WARPS 8 /* rows per block of attn_bwd_dot_kernel */

/* ---- shared helpers -------------------------------------------------------------------------- */

/* Column sums of the warp's rows (acc[r][c]: row r, column c·32 + lane; rows at or past n_rows
 * left out), then of the warps in order, stored to dst[d] for d < hd. red: ATT_WARPS·HD floats of
 * shared memory. Called by the whole block, after the last read of whatever red overlaps. */
template <int HD>
static __device__ inline void
att_colsum_store(float *dst, float *red, const float (&acc)[ATT_RW][HD / 32], int n_rows, int hd) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    CT_UNROLL
    for (int c = 0; c < HD / 32; c++) {
        float s = 0.0f;
        CT_UNROLL
        for (int r = 0; r < ATT_RW; r++)
            if (w * ATT_RW + r < n_rows) s += acc[r][c];
        red[w * HD + c * 32 + lane] = s;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += ATT_THREADS) {
        float s = red[d];
        for (int k = 1; k < ATT_WARPS; k++) s += red[k * HD + d];
        dst[d] = s;
    }
}

/* ---- forward --------------------------------------------------------------------------------- */

template <typename S, int HD>
static __global__ void __launch_bounds__(ATT_THREADS, 3)
    attn_fwd_kernel(S *out, float *lse, const S *qkv, int T, int n_head, int n_kv_head, int hd,
                    float scale) {
    constexpr int NC = HD / 32;
    CT_DYN_SHARED(float, smem); /* att_fwd_smem: the query tile first */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int qt = (int)(gridDim.x - 1 - blockIdx.x); /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const S *qh = qkv + (int64_t)b * T * lqkv + (int64_t)h * hd;
    const S *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd;
    const int q0 = qt * ATT_BR, row0 = q0 + w * ATT_RW; /* the warp's first query row */

    att_load_tile<S, HD>(smem, HD, qh, lqkv, q0, T, hd);
    att_fwd_rows<HD> st;
    st.start();
    for (int kt = 0; kt <= qt; kt++) /* tiles past the diagonal are fully masked */
        att_fwd_tile<S, HD>(st, smem, kh, kh + ckv, lqkv, kt * ATT_BC, T, row0, true, hd, scale);
    const int64_t lse_row = ((int64_t)b * n_head + h) * T;
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) {
        const float sum = ct_warp_sum(st.l[r]);
        const int i = row0 + r;
        if (i >= T) continue;
        const float inv = 1.0f / sum;
        S *orow = out + ((int64_t)b * T + i) * cq + (int64_t)h * hd;
        CT_UNROLL
        for (int c = 0; c < NC; c++)
            if (c * 32 + lane < hd) orow[c * 32 + lane] = ct_from_f32<S>(st.o[r][c] * inv);
        if (lane == 0) lse[lse_row + i] = st.m[r] + logf(sum);
    }
}

/* ---- backward -------------------------------------------------------------------------------- */

/* D[(b·n_head + h)·T + i] = dO_i · O_i for head h (one warp per row). */
template <typename S>
static __global__ void __launch_bounds__(32 * ATT_DOT_WARPS)
    attn_bwd_dot_kernel(float *D, const S *dout, const S *out, int T, int n_head, int hd,
                        int64_t n_rows) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * ATT_DOT_WARPS + (threadIdx.x >> 5);
    if (row >= n_rows) return; /* the whole warp */
    const int64_t i = row % T, bh = row / T, h = bh % n_head, b = bh / n_head;
    const int64_t at = (b * T + i) * ((int64_t)n_head * hd) + h * hd;
    float acc = 0.0f;
    for (int d = lane; d < hd; d += 32)
        acc = fmaf(ct_to_f32(dout[at + d]), ct_to_f32(out[at + d]), acc);
    acc = ct_warp_sum(acc);
    if (lane == 0) D[row] = acc;
}

template <typename S, int HD>
static __global__ void __launch_bounds__(ATT_THREADS, 2)
    attn_bwd_dkdv_kernel(S *dqkv, float *partial, const S *dout, const S *qkv, const float *lse,
                         const float *D, int T, int n_head, int n_kv_head, int hd, float scale) {
    constexpr int NC = HD / 32;
    CT_DYN_SHARED(float, smem); /* att_dkdv_smem: K and V first */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int n_t = (int)gridDim.x, kt = blockIdx.x; /* key tile 0 meets the most query tiles */
    const int kvh = blockIdx.y, b = blockIdx.z, group = n_head / n_kv_head;
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t k_off = (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, v_off = k_off + ckv;
    const int k0 = kt * ATT_BC, key0 = k0 + w * ATT_RW; /* the warp's first key */

    att_load_tile<S, HD>(smem, HD, qkv + k_off, lqkv, k0, T, hd);
    att_load_tile<S, HD>(smem + ATT_BC * HD, HD, qkv + v_off, lqkv, k0, T, hd);
    float dk[ATT_RW][NC], dv[ATT_RW][NC];
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) CT_UNROLL
    for (int c = 0; c < NC; c++) dk[r][c] = dv[r][c] = 0.0f;
    for (int g = 0; g < group; g++) {
        const int h = kvh * group + g;
        const int64_t lrow = ((int64_t)b * n_head + h) * T;
        for (int qt = kt; qt < n_t; qt++)
            att_dkdv_tile<S, HD>(dk, dv, smem, qkv + (int64_t)b * T * lqkv + (int64_t)h * hd, lqkv,
                                 dout + (int64_t)b * T * cq + (int64_t)h * hd, cq, lse + lrow,
                                 D + lrow, qt * ATT_BR, T, k0, T, true, hd, scale);
    }
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) {
        CT_UNROLL
        for (int c = 0; c < NC; c++) dk[r][c] *= scale;
        const int j = key0 + r;
        if (j >= T) continue;
        S *dkr = dqkv + k_off + (int64_t)j * lqkv, *dvr = dqkv + v_off + (int64_t)j * lqkv;
        CT_UNROLL
        for (int c = 0; c < NC; c++)
            if (c * 32 + lane < hd) {
                dkr[c * 32 + lane] = ct_from_f32<S>(dk[r][c]);
                dvr[c * 32 + lane] = ct_from_f32<S>(dv[r][c]);
            }
    }
    if (partial) { /* this key tile's column sums of dK and dV (fp32, before any rounding) */
        float *prow = partial + ((int64_t)b * n_t + kt) * lqkv + cq + (int64_t)kvh * hd;
        const int n_rows = T - k0 < ATT_BC ? T - k0 : ATT_BC;
        float *red = smem + 2 * ATT_BC * HD + 2 * ATT_BR * (HD + 1); /* Pᵀ and dSᵀ */
        __syncthreads(); /* Pᵀ and dSᵀ, which red overlaps, are no longer read */
        att_colsum_store<HD>(prow, red, dk, n_rows, hd);
        att_colsum_store<HD>(prow + ckv, red + ATT_WARPS * HD, dv, n_rows, hd);
    }
}

template <typename S, int HD>
static __global__ void __launch_bounds__(ATT_THREADS, 3)
    attn_bwd_dq_kernel(S *dqkv, float *partial, const S *dout, const S *qkv, const float *lse,
                       const float *D, int T, int n_head, int n_kv_head, int hd, float scale) {
    constexpr int NC = HD / 32, KLD = HD + 1;
    CT_DYN_SHARED(float, smem); /* att_dq_smem: Q, dO, K, V, dS, lse, D */
    float *ls = smem + 2 * ATT_BR * HD + 2 * ATT_BC * KLD + ATT_WARPS * ATT_RW * ATT_BC;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int n_t = (int)gridDim.x, qt = n_t - 1 - (int)blockIdx.x; /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t q_off = (int64_t)b * T * lqkv + (int64_t)h * hd;
    const S *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd;
    const int64_t lrow = ((int64_t)b * n_head + h) * T;
    const int q0 = qt * ATT_BR, row0 = q0 + w * ATT_RW; /* the warp's first query row */

    att_load_tile<S, HD>(smem, HD, qkv + q_off, lqkv, q0, T, hd);
    att_load_tile<S, HD>(smem + ATT_BR * HD, HD, dout + (int64_t)b * T * cq + (int64_t)h * hd, cq,
                         q0, T, hd);
    att_load_rows(ls, lse + lrow, q0, T);
    att_load_rows(ls + ATT_BR, D + lrow, q0, T);
    float dq[ATT_RW][NC];
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) CT_UNROLL
    for (int c = 0; c < NC; c++) dq[r][c] = 0.0f;
    for (int kt = 0; kt <= qt; kt++)
        att_dq_tile<S, HD>(dq, smem, kh, kh + ckv, lqkv, q0, T, kt * ATT_BC, T, true, hd, scale);
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) {
        CT_UNROLL
        for (int c = 0; c < NC; c++) dq[r][c] *= scale;
        const int i = row0 + r;
        if (i >= T) continue;
        S *dqr = dqkv + q_off + (int64_t)i * lqkv;
        CT_UNROLL
        for (int c = 0; c < NC; c++)
            if (c * 32 + lane < hd) dqr[c * 32 + lane] = ct_from_f32<S>(dq[r][c]);
    }
    if (partial) { /* this query tile's column sums of dQ (fp32, before any rounding) */
        const int n_rows = T - q0 < ATT_BR ? T - q0 : ATT_BR;
        __syncthreads(); /* dS, which red overlaps, is no longer read */
        att_colsum_store<HD>(partial + ((int64_t)b * n_t + qt) * lqkv + (int64_t)h * hd,
                             smem + 2 * ATT_BR * HD + 2 * ATT_BC * KLD, dq, n_rows, hd);
    }
}

/* ---- launchers ------------------------------------------------------------------------------- */

template <typename S, int HD>
static void att_fwd(ct_cuda_ctx *cx, void *out, float *lse, const void *qkv, int64_t B, int64_t T,
                    int64_t n_head, int64_t n_kv_head, int64_t hd) {
    const size_t smem = att_fwd_smem<HD>();
    att_allow_smem(attn_fwd_kernel<S, HD>, smem);
    dim3 grid((unsigned)((T + ATT_BR - 1) / ATT_BR), (unsigned)n_head, (unsigned)B);
    ct_launch(attn_fwd_kernel<S, HD>, grid, dim3(ATT_THREADS), smem, ct_cuda_stream(cx), (S *)out,
              lse, (const S *)qkv, (int)T, (int)n_head, (int)n_kv_head, (int)hd,
              1.0f / sqrtf((float)hd));
    CT_CUDA_CHECK(cudaGetLastError());
}

void ct_cuda_attention_rowdot(ct_cuda_ctx *cx, ct_dtype dt, float *D, const void *dout,
                              const void *out, int64_t B, int64_t T, int64_t n_head, int64_t hd) {
    const int64_t n_rows = B * n_head * T;
    const dim3 grid((unsigned)((n_rows + ATT_DOT_WARPS - 1) / ATT_DOT_WARPS));
    if (dt == CT_DTYPE_BF16)
        ct_launch(attn_bwd_dot_kernel<__nv_bfloat16>, grid, dim3(32 * ATT_DOT_WARPS), 0,
                  ct_cuda_stream(cx), D, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)out,
                  (int)T, (int)n_head, (int)hd, n_rows);
    else
        ct_launch(attn_bwd_dot_kernel<float>, grid, dim3(32 * ATT_DOT_WARPS), 0, ct_cuda_stream(cx),
                  D, (const float *)dout, (const float *)out, (int)T, (int)n_head, (int)hd, n_rows);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <typename S, int HD>
static void att_bwd(ct_cuda_ctx *cx, void *dqkv, float *dbias, const void *dout, const void *qkv,
                    const void *out, const float *lse, int64_t B, int64_t T, int64_t n_head,
                    int64_t n_kv_head, int64_t hd) {
    cudaStream_t st = ct_cuda_stream(cx);
    const int64_t n_rows = B * n_head * T, n_t = (T + ATT_BR - 1) / ATT_BR;
    const int64_t lqkv = (n_head + 2 * n_kv_head) * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *D = (float *)ct_cuda_workspace(cx, 0, (size_t)n_rows * sizeof(float));
    float *partial =
        dbias ? (float *)ct_cuda_workspace(cx, 1, (size_t)(B * n_t * lqkv) * sizeof(float)) : NULL;

    ct_cuda_attention_rowdot(cx, sizeof(S) == 2 ? CT_DTYPE_BF16 : CT_DTYPE_F32, D, dout, out, B, T,
                             n_head, hd);

    const size_t smem_kv = att_dkdv_smem<HD>();
    att_allow_smem(attn_bwd_dkdv_kernel<S, HD>, smem_kv);
    ct_launch(attn_bwd_dkdv_kernel<S, HD>, dim3((unsigned)n_t, (unsigned)n_kv_head, (unsigned)B),
              dim3(ATT_THREADS), smem_kv, st, (S *)dqkv, partial, (const S *)dout, (const S *)qkv,
              lse, (const float *)D, (int)T, (int)n_head, (int)n_kv_head, (int)hd, scale);
    CT_CUDA_CHECK(cudaGetLastError());

    const size_t smem_q = att_dq_smem<HD>();
    att_allow_smem(attn_bwd_dq_kernel<S, HD>, smem_q);
    ct_launch(attn_bwd_dq_kernel<S, HD>, dim3((unsigned)n_t, (unsigned)n_head, (unsigned)B),
              dim3(ATT_THREADS), smem_q, st, (S *)dqkv, partial, (const S *)dout, (const S *)qkv,
              lse, (const float *)D, (int)T, (int)n_head, (int)n_kv_head, (int)hd, scale);
    CT_CUDA_CHECK(cudaGetLastError());

    if (dbias) ct_cuda_colsum_add(cx, dbias, partial, B * n_t, lqkv, lqkv);
}

extern "C" void ct_cuda_attention_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, float *lse,
                                      const void *qkv, int64_t B, int64_t T, int64_t n_head,
                                      int64_t n_kv_head, int64_t head_dim) {
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "attention_fwd dtype %d", (int)dt);
    if (B <= 0 || T <= 0 || n_head <= 0) return;
    att_check_dims("attention_fwd", B, T, n_head, n_kv_head, head_dim);
    if (dt == CT_DTYPE_BF16)
        ct_cuda_attention_fwd_tc(cx, out, lse, qkv, B, T, n_head, n_kv_head, head_dim);
    else
        ATT_HD_DISPATCH(att_fwd, float, head_dim, cx, out, lse, qkv, B, T, n_head, n_kv_head,
                        head_dim);
}

extern "C" void ct_cuda_attention_bwd(ct_cuda_ctx *cx, ct_dtype dt, void *dqkv, float *dbias,
                                      const void *dout, const void *qkv, const void *out,
                                      const float *lse, int64_t B, int64_t T, int64_t n_head,
                                      int64_t n_kv_head, int64_t head_dim) {
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "attention_bwd dtype %d", (int)dt);
    if (B <= 0 || T <= 0 || n_head <= 0) return;
    att_check_dims("attention_bwd", B, T, n_head, n_kv_head, head_dim);
    if (dt == CT_DTYPE_BF16)
        ct_cuda_attention_bwd_tc(cx, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head,
                                 head_dim);
    else
        ATT_HD_DISPATCH(att_bwd, float, head_dim, cx, dqkv, dbias, dout, qkv, out, lse, B, T,
                        n_head, n_kv_head, head_dim);
}
