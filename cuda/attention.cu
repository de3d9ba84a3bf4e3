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
 * Tiles. ATT_BR = 32 query rows × ATT_BC = 32 keys, blocks of ATT_THREADS = 128 threads (4 warps),
 * each warp owning ATT_RW = 8 rows of the block's tile (query rows in the forward and dQ kernels,
 * key rows in the dK/dV kernel). In a score phase lane l takes the l-th column of the other
 * operand (a key, or in dK/dV a query), so each lane computes 8 scores; the other operand's rows
 * are then read from shared memory by every lane at once (a broadcast) and the lane's own row
 * from a copy padded to a stride of HD + 1 floats (conflict-free). In an accumulation phase lane l
 * owns the head columns l, l + 32, ... (HD/32 of them) of the warp's 8 rows, reading the
 * probabilities the warp just wrote to its own shared slice (ordered by __syncwarp). HD, the
 * compiled head width, is 32, 64 or 128: the smallest that holds head_dim, the columns past
 * head_dim zero in shared memory (they add nothing to a dot product and are never stored).
 * Rows past T (the last tile's tail) are loaded as zeros and masked: global memory is never read
 * past row T − 1 or column head_dim − 1.
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
 *   attn_colsum_kernel    with dbias: dbias[j] += the per-tile column sums of dqkv (workspace 1,
 *                         (B·tiles, lqkv), written by the two kernels above from the fp32 values,
 *                         before bf16 rounding, as backend.h asks) added in (b, tile) order.
 * No float atomics: every sum runs in an order fixed by the shapes, so reruns give the same bits.
 *
 * Registers: a thread keeps 8 rows × HD/32 accumulators (two sets in dK/dV) and 8 scores. The
 * launch bounds ask for 3 resident blocks per SM for the forward and dQ (at most 168 registers;
 * ptxas for sm_90 takes 152-164 and 156-162) and 2 for dK/dV (162-196: HD = 128 spills under
 * 168); with no minimum ptxas capped the forward at 128 registers and spilled. Shared memory
 * allows 3 blocks of the widest kernels per SM on sm_90 (227 KiB), 2 on sm_80 (163 KiB).
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/attention.cuh"
#include "cuda/attention_tc.cuh"

#define ATT_BR 32                    /* query rows per tile */
#define ATT_BC 32                    /* keys per tile (== ATT_BR: tile kt meets tiles qt ≥ kt) */
#define ATT_WARPS 4                  /* warps per block */
#define ATT_THREADS (32 * ATT_WARPS) /* threads per block */
#define ATT_RW (ATT_BR / ATT_WARPS)  /* rows (or keys) per warp */
#define ATT_DOT_WARPS 8              /* rows per block of attn_bwd_dot_kernel */
#define ATT_COLSUM_THREADS 256       /* columns per block of attn_colsum_kernel */
#define ATT_MAX_HD 128               /* widest head */

/* Loops over register arrays are unrolled (CT_UNROLL, cuda/ct_cuda.h): their indices must be
 * constants for the arrays to stay in registers. */

static_assert(ATT_BR == ATT_BC, "the causal tile skipping assumes square tiles");
static_assert(ATT_BR == 32, "a lane takes one row of the other operand's tile");

/* ---- shared helpers -------------------------------------------------------------------------- */

/* dst[r·ld_dst + d] (r < 32, d < HD) = rows r0 + r of a head slice src (row stride ld_src) widened
 * to fp32; zero for rows at or past T and columns at or past hd, which are never read. */
template <typename S, int HD>
static __device__ inline void att_load_tile(float *dst, int ld_dst, const S *src, int64_t ld_src,
                                            int r0, int T, int hd) {
    for (int e = threadIdx.x; e < 32 * HD; e += ATT_THREADS) {
        const int r = e / HD, d = e % HD;
        float x = 0.0f;
        if (r0 + r < T && d < hd) x = ct_to_f32(src[(int64_t)(r0 + r) * ld_src + d]);
        dst[r * ld_dst + d] = x;
    }
}

/* dst[r] = src[r0 + r] for the 32 rows of a tile, 0 past T. */
static __device__ inline void att_load_rows(float *dst, const float *src, int r0, int T) {
    if (threadIdx.x < 32) {
        const int r = (int)threadIdx.x;
        dst[r] = r0 + r < T ? src[r0 + r] : 0.0f;
    }
}

/* acc[r] += Σ_d a[r·HD + d]·b[d] for the warp's ATT_RW rows of a (a broadcast: every lane reads
 * the same row) and the lane's own row b (stride HD + 1). */
template <int HD>
static __device__ inline void att_rows_dot(float (&acc)[ATT_RW], const float *a, const float *b) {
    CT_UNROLL_BY(2)
    for (int d = 0; d < HD; d += 4) {
        const float b0 = b[d], b1 = b[d + 1], b2 = b[d + 2], b3 = b[d + 3];
        CT_UNROLL
        for (int r = 0; r < ATT_RW; r++) {
            const float4 x = *reinterpret_cast<const float4 *>(a + r * HD + d);
            acc[r] = fmaf(x.x, b0, acc[r]);
            acc[r] = fmaf(x.y, b1, acc[r]);
            acc[r] = fmaf(x.z, b2, acc[r]);
            acc[r] = fmaf(x.w, b3, acc[r]);
        }
    }
}

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

template <int HD> static constexpr size_t att_fwd_smem() {
    return sizeof(float) *
           (size_t)(ATT_BR * HD + ATT_BC * (HD + 1) + ATT_BC * HD + ATT_WARPS * ATT_RW * ATT_BC);
}

template <typename S, int HD>
static __global__ void __launch_bounds__(ATT_THREADS, 3)
    attn_fwd_kernel(S *out, float *lse, const S *qkv, int T, int n_head, int n_kv_head, int hd,
                    float scale) {
    constexpr int NC = HD / 32, KLD = HD + 1;
    CT_DYN_SHARED(float, smem);
    float *qs = smem;              /* (BR, HD)    the query tile */
    float *ks = qs + ATT_BR * HD;  /* (BC, HD+1)  keys, a lane's own row */
    float *vs = ks + ATT_BC * KLD; /* (BC, HD)    values */
    float *ps = vs + ATT_BC * HD;  /* (WARPS, RW, BC) probabilities */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int qt = (int)(gridDim.x - 1 - blockIdx.x); /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const S *qh = qkv + (int64_t)b * T * lqkv + (int64_t)h * hd;
    const S *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd;
    const S *vh = kh + ckv;
    const int q0 = qt * ATT_BR, row0 = q0 + w * ATT_RW; /* the warp's first query row */
    const float *qw = qs + w * ATT_RW * HD;
    float *pw = ps + w * ATT_RW * ATT_BC;

    att_load_tile<S, HD>(qs, HD, qh, lqkv, q0, T, hd);
    float o[ATT_RW][NC], m[ATT_RW], l[ATT_RW];
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        CT_UNROLL
        for (int c = 0; c < NC; c++) o[r][c] = 0.0f;
    }
    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * ATT_BC, j = k0 + lane; /* the lane's key */
        __syncthreads(); /* the previous tile's K, V and P are no longer read */
        att_load_tile<S, HD>(ks, KLD, kh, lqkv, k0, T, hd);
        att_load_tile<S, HD>(vs, HD, vh, lqkv, k0, T, hd);
        __syncthreads();
        float s[ATT_RW];
        CT_UNROLL
        for (int r = 0; r < ATT_RW; r++) s[r] = 0.0f;
        att_rows_dot<HD>(s, qw, ks + lane * KLD);
        /* Online softmax. Key k0 ≤ every row of the tile (kt ≤ qt), so the tile's max is finite
         * and exp(m_old − m_new) is 0 on the first tile (m_old = −inf), never NaN. */
        CT_UNROLL
        for (int r = 0; r < ATT_RW; r++) {
            const float x = j <= row0 + r ? s[r] * scale : -INFINITY;
            const float mn = fmaxf(m[r], ct_warp_max(x));
            const float alpha = expf(m[r] - mn);
            const float p = expf(x - mn);
            l[r] = l[r] * alpha + p;
            CT_UNROLL
            for (int c = 0; c < NC; c++) o[r][c] *= alpha;
            m[r] = mn;
            pw[r * ATT_BC + lane] = p;
        }
        __syncwarp(); /* the warp's P is written */
        for (int jj = 0; jj < ATT_BC; jj++) {
            float v[NC];
            CT_UNROLL
            for (int c = 0; c < NC; c++) v[c] = vs[jj * HD + c * 32 + lane];
            CT_UNROLL
            for (int r = 0; r < ATT_RW; r++) {
                const float p = pw[r * ATT_BC + jj];
                CT_UNROLL
                for (int c = 0; c < NC; c++) o[r][c] = fmaf(p, v[c], o[r][c]);
            }
        }
    }
    const int64_t lse_row = ((int64_t)b * n_head + h) * T;
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) {
        const float sum = ct_warp_sum(l[r]);
        const int i = row0 + r;
        if (i >= T) continue;
        const float inv = 1.0f / sum;
        S *orow = out + ((int64_t)b * T + i) * cq + (int64_t)h * hd;
        CT_UNROLL
        for (int c = 0; c < NC; c++)
            if (c * 32 + lane < hd) orow[c * 32 + lane] = ct_from_f32<S>(o[r][c] * inv);
        if (lane == 0) lse[lse_row + i] = m[r] + logf(sum);
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

template <int HD> static constexpr size_t att_dkdv_smem() {
    return sizeof(float) * (size_t)(2 * ATT_BC * HD + 2 * ATT_BR * (HD + 1) +
                                    2 * ATT_WARPS * ATT_RW * ATT_BR + 2 * ATT_BR);
}

template <typename S, int HD>
static __global__ void __launch_bounds__(ATT_THREADS, 2)
    attn_bwd_dkdv_kernel(S *dqkv, float *partial, const S *dout, const S *qkv, const float *lse,
                         const float *D, int T, int n_head, int n_kv_head, int hd, float scale) {
    constexpr int NC = HD / 32, KLD = HD + 1;
    CT_DYN_SHARED(float, smem);
    float *ks = smem;               /* (BC, HD)    keys (the warp's rows, broadcast) */
    float *vs = ks + ATT_BC * HD;   /* (BC, HD)    values */
    float *qs = vs + ATT_BC * HD;   /* (BR, HD+1)  queries, a lane's own row */
    float *dos = qs + ATT_BR * KLD; /* (BR, HD+1)  dO */
    float *ps = dos + ATT_BR * KLD; /* (WARPS, RW, BR) Pᵀ */
    float *dss = ps + ATT_WARPS * ATT_RW * ATT_BR; /* (WARPS, RW, BR) dSᵀ */
    float *ls = dss + ATT_WARPS * ATT_RW * ATT_BR; /* (BR) lse */
    float *Ds = ls + ATT_BR;                       /* (BR) D */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int n_t = (int)gridDim.x, kt = blockIdx.x; /* key tile 0 meets the most query tiles */
    const int kvh = blockIdx.y, b = blockIdx.z, group = n_head / n_kv_head;
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t k_off = (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, v_off = k_off + ckv;
    const int k0 = kt * ATT_BC, key0 = k0 + w * ATT_RW; /* the warp's first key */
    const float *kw = ks + w * ATT_RW * HD, *vw = vs + w * ATT_RW * HD;
    float *pw = ps + w * ATT_RW * ATT_BR, *dsw = dss + w * ATT_RW * ATT_BR;

    att_load_tile<S, HD>(ks, HD, qkv + k_off, lqkv, k0, T, hd);
    att_load_tile<S, HD>(vs, HD, qkv + v_off, lqkv, k0, T, hd);
    float dk[ATT_RW][NC], dv[ATT_RW][NC];
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) CT_UNROLL
    for (int c = 0; c < NC; c++) dk[r][c] = dv[r][c] = 0.0f;
    for (int g = 0; g < group; g++) {
        const int h = kvh * group + g;
        const S *qh = qkv + (int64_t)b * T * lqkv + (int64_t)h * hd;
        const S *doh = dout + (int64_t)b * T * cq + (int64_t)h * hd;
        const int64_t lrow = ((int64_t)b * n_head + h) * T;
        for (int qt = kt; qt < n_t; qt++) {
            const int q0 = qt * ATT_BR, i = q0 + lane; /* the lane's query row */
            __syncthreads(); /* the previous tile's Q, dO, Pᵀ, dSᵀ are no longer read */
            att_load_tile<S, HD>(qs, KLD, qh, lqkv, q0, T, hd);
            att_load_tile<S, HD>(dos, KLD, doh, cq, q0, T, hd);
            att_load_rows(ls, lse + lrow, q0, T);
            att_load_rows(Ds, D + lrow, q0, T);
            __syncthreads();
            float s[ATT_RW], dp[ATT_RW];
            CT_UNROLL
            for (int r = 0; r < ATT_RW; r++) s[r] = dp[r] = 0.0f;
            att_rows_dot<HD>(s, kw, qs + lane * KLD);
            att_rows_dot<HD>(dp, vw, dos + lane * KLD);
            const float li = ls[lane], di = Ds[lane];
            CT_UNROLL
            for (int r = 0; r < ATT_RW; r++) {
                const bool live = i < T && key0 + r <= i;
                const float p = live ? expf(s[r] * scale - li) : 0.0f;
                pw[r * ATT_BR + lane] = p;
                dsw[r * ATT_BR + lane] = p * (dp[r] - di);
            }
            __syncwarp(); /* the warp's Pᵀ and dSᵀ are written */
            for (int ii = 0; ii < ATT_BR; ii++) {
                float qv[NC], dov[NC];
                CT_UNROLL
                for (int c = 0; c < NC; c++) {
                    qv[c] = qs[ii * KLD + c * 32 + lane];
                    dov[c] = dos[ii * KLD + c * 32 + lane];
                }
                CT_UNROLL
                for (int r = 0; r < ATT_RW; r++) {
                    const float p = pw[r * ATT_BR + ii], ds = dsw[r * ATT_BR + ii];
                    CT_UNROLL
                    for (int c = 0; c < NC; c++) {
                        dv[r][c] = fmaf(p, dov[c], dv[r][c]);
                        dk[r][c] = fmaf(ds, qv[c], dk[r][c]);
                    }
                }
            }
        }
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
        __syncthreads(); /* Pᵀ and dSᵀ, which red overlaps, are no longer read */
        att_colsum_store<HD>(prow, ps, dk, n_rows, hd);
        att_colsum_store<HD>(prow + ckv, ps + ATT_WARPS * HD, dv, n_rows, hd);
    }
}

template <int HD> static constexpr size_t att_dq_smem() {
    return sizeof(float) * (size_t)(2 * ATT_BR * HD + 2 * ATT_BC * (HD + 1) +
                                    ATT_WARPS * ATT_RW * ATT_BC + 2 * ATT_BR);
}

template <typename S, int HD>
static __global__ void __launch_bounds__(ATT_THREADS, 3)
    attn_bwd_dq_kernel(S *dqkv, float *partial, const S *dout, const S *qkv, const float *lse,
                       const float *D, int T, int n_head, int n_kv_head, int hd, float scale) {
    constexpr int NC = HD / 32, KLD = HD + 1;
    CT_DYN_SHARED(float, smem);
    float *qs = smem;               /* (BR, HD)    queries (the warp's rows, broadcast) */
    float *dos = qs + ATT_BR * HD;  /* (BR, HD)    dO */
    float *ks = dos + ATT_BR * HD;  /* (BC, HD+1)  keys, a lane's own row */
    float *vs = ks + ATT_BC * KLD;  /* (BC, HD+1)  values, a lane's own row */
    float *dss = vs + ATT_BC * KLD; /* (WARPS, RW, BC) dS */
    float *ls = dss + ATT_WARPS * ATT_RW * ATT_BC; /* (BR) lse */
    float *Ds = ls + ATT_BR;                       /* (BR) D */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int n_t = (int)gridDim.x, qt = n_t - 1 - (int)blockIdx.x; /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t q_off = (int64_t)b * T * lqkv + (int64_t)h * hd;
    const S *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, *vh = kh + ckv;
    const int64_t lrow = ((int64_t)b * n_head + h) * T;
    const int q0 = qt * ATT_BR, row0 = q0 + w * ATT_RW; /* the warp's first query row */
    const float *qw = qs + w * ATT_RW * HD, *dow = dos + w * ATT_RW * HD;
    float *dsw = dss + w * ATT_RW * ATT_BC;

    att_load_tile<S, HD>(qs, HD, qkv + q_off, lqkv, q0, T, hd);
    att_load_tile<S, HD>(dos, HD, dout + (int64_t)b * T * cq + (int64_t)h * hd, cq, q0, T, hd);
    att_load_rows(ls, lse + lrow, q0, T);
    att_load_rows(Ds, D + lrow, q0, T);
    float dq[ATT_RW][NC];
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) CT_UNROLL
    for (int c = 0; c < NC; c++) dq[r][c] = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * ATT_BC, j = k0 + lane; /* the lane's key */
        __syncthreads(); /* the previous tile's K, V and dS are no longer read */
        att_load_tile<S, HD>(ks, KLD, kh, lqkv, k0, T, hd);
        att_load_tile<S, HD>(vs, KLD, vh, lqkv, k0, T, hd);
        __syncthreads();
        float s[ATT_RW], dp[ATT_RW];
        CT_UNROLL
        for (int r = 0; r < ATT_RW; r++) s[r] = dp[r] = 0.0f;
        att_rows_dot<HD>(s, qw, ks + lane * KLD);
        att_rows_dot<HD>(dp, dow, vs + lane * KLD);
        CT_UNROLL
        for (int r = 0; r < ATT_RW; r++) {
            const int i = row0 + r;
            const bool live = i < T && j <= i;
            const float p = live ? expf(s[r] * scale - ls[w * ATT_RW + r]) : 0.0f;
            dsw[r * ATT_BC + lane] = p * (dp[r] - Ds[w * ATT_RW + r]);
        }
        __syncwarp(); /* the warp's dS is written */
        for (int jj = 0; jj < ATT_BC; jj++) {
            float kv[NC];
            CT_UNROLL
            for (int c = 0; c < NC; c++) kv[c] = ks[jj * KLD + c * 32 + lane];
            CT_UNROLL
            for (int r = 0; r < ATT_RW; r++) {
                const float ds = dsw[r * ATT_BC + jj];
                CT_UNROLL
                for (int c = 0; c < NC; c++) dq[r][c] = fmaf(ds, kv[c], dq[r][c]);
            }
        }
    }
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
        att_colsum_store<HD>(partial + ((int64_t)b * n_t + qt) * lqkv + (int64_t)h * hd, dss, dq,
                             n_rows, hd);
    }
}

/* dst[j] += Σ over rows, in order, of partial[row·C + j]. */
static __global__ void attn_colsum_kernel(float *dst, const float *partial, int n_rows, int C) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= C) return;
    float acc = partial[j];
    for (int r = 1; r < n_rows; r++) acc += partial[(int64_t)r * C + j];
    dst[j] += acc;
}

/* ---- launchers ------------------------------------------------------------------------------- */

static void att_check_dims(const char *op, int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                           int64_t hd) {
    CT_ASSERTF(n_kv_head > 0 && n_head % n_kv_head == 0, "%s: n_head=%lld n_kv_head=%lld", op,
               (long long)n_head, (long long)n_kv_head);
    CT_ASSERTF(hd > 0 && hd <= ATT_MAX_HD, "%s: head_dim=%lld (at most %d)", op, (long long)hd,
               ATT_MAX_HD);
    CT_ASSERTF(B <= 65535 && n_head <= 65535 && T <= INT32_MAX - ATT_BR &&
                   B * T * (n_head + 2 * n_kv_head) * hd < ((int64_t)1 << 62),
               "%s: B=%lld T=%lld n_head=%lld", op, (long long)B, (long long)T, (long long)n_head);
}

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

void ct_cuda_attention_colsum(ct_cuda_ctx *cx, float *dst, const float *partial, int64_t n_rows,
                              int64_t C) {
    ct_launch(attn_colsum_kernel,
              dim3((unsigned)((C + ATT_COLSUM_THREADS - 1) / ATT_COLSUM_THREADS)),
              dim3(ATT_COLSUM_THREADS), 0, ct_cuda_stream(cx), dst, partial, (int)n_rows, (int)C);
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

    if (dbias) ct_cuda_attention_colsum(cx, dbias, partial, B * n_t, lqkv);
}

/* The narrowest compiled head width that holds hd. */
template <typename S>
static void att_fwd_dispatch(ct_cuda_ctx *cx, void *out, float *lse, const void *qkv, int64_t B,
                             int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    if (hd <= 32)
        att_fwd<S, 32>(cx, out, lse, qkv, B, T, n_head, n_kv_head, hd);
    else if (hd <= 64)
        att_fwd<S, 64>(cx, out, lse, qkv, B, T, n_head, n_kv_head, hd);
    else
        att_fwd<S, 128>(cx, out, lse, qkv, B, T, n_head, n_kv_head, hd);
}

template <typename S>
static void att_bwd_dispatch(ct_cuda_ctx *cx, void *dqkv, float *dbias, const void *dout,
                             const void *qkv, const void *out, const float *lse, int64_t B,
                             int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    if (hd <= 32)
        att_bwd<S, 32>(cx, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head, hd);
    else if (hd <= 64)
        att_bwd<S, 64>(cx, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head, hd);
    else
        att_bwd<S, 128>(cx, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head, hd);
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
        att_fwd_dispatch<float>(cx, out, lse, qkv, B, T, n_head, n_kv_head, head_dim);
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
        att_bwd_dispatch<float>(cx, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head,
                                head_dim);
}
