/*
 * attention.cu — causal self-attention, forward and backward (attention.cuh), FlashAttention-2
 * style in plain CUDA: the fp32 path (fp32 operands and arithmetic, no tensor cores). bf16 runs on
 * tensor cores (attention_tc.cu), which shares this file's D = rowsum(dO ⊙ O) kernel. The float
 * formulas are those of the CPU reference (ct_cpu_attention_fwd / _bwd in
 * core/backend/cpu_attention.c): s = scale·(q·k) with scale = 1/sqrt(hd), p = exp(s − max) / sum,
 * out = (Σ p̃·v)·(1/sum), lse = max + log(sum); backward dP = dO·Vᵀ, D = rowsum(dO ⊙ O),
 * dS = P ⊙ (dP − D), dV = Pᵀ·dO, dQ = scale·dS·K, dK = scale·dSᵀ·Q. What differs is the
 * summation order (online softmax rescaling, tiles) and expf (at most 2 ulp on a GPU): test
 * tolerances.
 *
 * Register tiles. A block of AF_THREADS = 256 threads works on square tiles of AF_TILE = 64 query
 * rows × 64 keys, the threads in a 16 × 16 grid (tx = threadIdx.x % 16 across, ty = threadIdx.x
 * / 16 down; a half-warp is one ty). Every product of the step is one of two shapes over tiles in
 * shared memory, each thread accumulating its own outputs in registers (af_mm_nt, af_mm_nn):
 *   C = A·Bᵀ   (scores S = Q·Kᵀ, dP = dO·Vᵀ; in dK/dV Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ): the thread owns
 *              rows ty + 16a and columns tx + 16b (a, b < 4), 16 scores, and per four head
 *              columns reads a float4 of each of its 4 A rows (2 addresses a warp: broadcasts)
 *              and of its 4 B rows: 8 loads for 64 FMAs. Tiles are stored with a row stride of
 *              HD + 4 floats, so the 8 lanes of a quarter-warp read 8 consecutive rows from 8
 *              different groups of 4 banks: no conflicts.
 *   C += A·B   (out += P·V, dQ += dS·K, dV += Pᵀ·dO, dK += dSᵀ·Q), the sum over the tile's 64
 *              keys (or queries): the thread owns rows ty + 16a and the HD/16 head columns
 *              (u·16 + tx)·VW + e (vectors of VW = 4, or 2 at HD = 32), reading per four k a
 *              float4 of each A row and per k its vectors of the B row (consecutive across the
 *              half-warp): 8 loads for 64 FMAs at HD = 64.
 * P and dS go through shared memory (row stride 80: the two half-warps of a warp write disjoint
 * banks), each row written and read by its own half-warp only, so a __syncwarp orders them. Row
 * maxima and sums are reduced over the 16 lanes of the half-warp (shuffles by 8, 4, 2, 1). HD, the
 * compiled head width, is 32, 64 or 128: the smallest that holds head_dim, the columns past
 * head_dim zero in shared memory (they add nothing to a dot product and are never stored). Rows
 * past T (the last tile's tail) are loaded as zeros and masked: global memory is never read past
 * row T − 1 or column head_dim − 1.
 *
 * Kernels (grid; dynamic shared memory for HD = 32 / 64 / 128, those above 48 KiB after
 * cudaFuncSetAttribute; no static shared memory):
 *   attn_fwd_kernel       (query tiles, n_head, B), heaviest tile first. Q tile, then per key
 *                         tile kt ≤ qt (tiles past the diagonal are fully masked and skipped) K
 *                         and V, scores, online softmax with the running max m (one per row,
 *                         reduced over the half-warp) and a per-thread running sum (reduced once at
 *                         the end), out and lse. Q, K, V and P: 48128 / 72704 / 121856 bytes.
 *   attn_bwd_dot_kernel   one warp per (b, h, row): D = dO·O (fp32) into workspace 0.
 *   attn_bwd_dkdv_kernel  (key tiles, n_kv_head, B). K and V tile once; then for each query head
 *                         of the GQA group in order and each query tile qt ≥ kt in order: Q, dO,
 *                         lse and D; Pᵀ recomputed, dV += Pᵀ·dO, dPᵀ, dSᵀ over Pᵀ in place,
 *                         dK += dSᵀ·Q in registers. Every (b, kv head, key tile) has one owner, so
 *                         the group's heads accumulate without atomics, in a fixed order.
 *                         K, V, Q, dO, Pᵀ/dSᵀ, lse, D: 57856 / 90624 / 156160 bytes.
 *   attn_bwd_dq_kernel    (query tiles, n_head, B). Q, dO, lse, D; per key tile kt ≤ qt K, V;
 *                         S, dP, dS recomputed; dQ += dS·K in registers. 57856 / 90624 / 156160.
 * With dbias, dbias[j] += the per-tile column sums of dqkv (workspace 1, (B·tiles, lqkv), written
 * by the two kernels above from the fp32 values, as backend.h asks) added in (b, tile) order by
 * ct_cuda_colsum_add (elementwise.cuh).
 * No float atomics: every sum runs in an order fixed by the shapes, so reruns give the same bits.
 *
 * Registers: a thread keeps 16 scores (32 in the backward: S and dP) and 4 rows × HD/16
 * accumulators (two sets in dK/dV). The launch bounds ask for 2 resident blocks per SM at HD ≤ 64
 * (at most 128 registers: the k loops of the products are not unrolled, which at 2 spilled dK/dV)
 * and 1 at HD = 128 (dK/dV holds 64 accumulators there). Shared memory holds 2 blocks of each
 * kernel per SM at HD ≤ 64 on sm_90 (227 KiB), of the forward only on sm_80 (163 KiB); every
 * kernel fits one block on both at HD = 128.
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>

#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/attention.cuh"
#include "cuda/attention_tc.cuh"

#include "cuda/attention_tile.cuh"
#include "cuda/elementwise.cuh"
#include "cuda/launch.cuh"

#define ATT_DOT_WARPS 8 /* rows per block of attn_bwd_dot_kernel */

#define AF_TILE 64                 /* query rows and keys per tile (square: causal skipping) */
#define AF_TX 16                   /* threads across a tile */
#define AF_TY 16                   /* threads down a tile */
#define AF_THREADS (AF_TX * AF_TY) /* threads per block */
#define AF_RM (AF_TILE / AF_TY)    /* rows per thread: ty, ty + 16, ... */
#define AF_CN (AF_TILE / AF_TX)    /* score columns per thread: tx, tx + 16, ... */
#define AF_PLD (AF_TILE + 16)      /* row stride of the P and dS tiles */
#define AF_MINB(HD) ((HD) <= 64 ? 2 : 1) /* the launch bounds' blocks per SM */

static_assert(AF_TX == 16, "rows are reduced over a half-warp");

/* The tiles of head width HD: Q, K, V and dO rows in shared memory with stride LD; a thread's NH
 * head columns in NG vectors of VW floats, vector u at column (u·16 + tx)·VW. */
template <int HD> struct af_shape {
    static constexpr int LD = HD + 4;
    static constexpr int NH = HD / AF_TX;
    static constexpr int VW = NH < 4 ? NH : 4;
    static constexpr int NG = NH / VW;
};

static __device__ inline int af_tx() {
    return (int)threadIdx.x % AF_TX;
}
static __device__ inline int af_ty() {
    return (int)threadIdx.x / AF_TX;
}

/* The max and the sum over the 16 lanes of the half-warp (every lane gets the result). */
static __device__ inline float af_row_max(float v) {
    for (int off = AF_TX / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
static __device__ inline float af_row_sum(float v) {
    for (int off = AF_TX / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* dst[r·LD + d] (r < 64, d < HD) = rows r0 + r of a head slice src (row stride ld_src); zero for
 * rows at or past T and columns at or past hd, which are never read. vec: hd % 4 == 0 and src,
 * ld_src 16-byte aligned, so whole float4s are read. */
template <int HD>
static __device__ inline void af_load_tile(float *dst, const float *src, int64_t ld_src, int r0,
                                           int T, int hd, bool vec) {
    constexpr int LD = af_shape<HD>::LD;
    if (vec) {
        for (int e = threadIdx.x; e < AF_TILE * HD / 4; e += AF_THREADS) {
            const int r = e / (HD / 4), d = e % (HD / 4) * 4;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r0 + r < T && d < hd)
                x = *reinterpret_cast<const float4 *>(src + (int64_t)(r0 + r) * ld_src + d);
            *reinterpret_cast<float4 *>(dst + r * LD + d) = x;
        }
        return;
    }
    for (int e = threadIdx.x; e < AF_TILE * HD; e += AF_THREADS) {
        const int r = e / HD, d = e % HD;
        dst[r * LD + d] = r0 + r < T && d < hd ? src[(int64_t)(r0 + r) * ld_src + d] : 0.0f;
    }
}

/* dst[r] = src[r0 + r] for the 64 rows of a tile, 0 past T. */
static __device__ inline void af_load_rows(float *dst, const float *src, int r0, int T) {
    if (threadIdx.x < AF_TILE) {
        const int r = (int)threadIdx.x;
        dst[r] = r0 + r < T ? src[r0 + r] : 0.0f;
    }
}

/* acc[a][b] += Σ_{k < K} A[(ty + 16a)·lda + k] · B[(tx + 16b)·ldb + k], k in order. */
template <int K>
static __device__ inline void af_mm_nt(float (&acc)[AF_RM][AF_CN], const float *A, int lda,
                                       const float *B, int ldb) {
    A += af_ty() * lda;
    B += af_tx() * ldb;
    CT_UNROLL_BY(1)
    for (int k = 0; k < K; k += 4) {
        float4 a[AF_RM], b[AF_CN];
        CT_UNROLL
        for (int i = 0; i < AF_RM; i++)
            a[i] = *reinterpret_cast<const float4 *>(A + i * AF_TY * lda + k);
        CT_UNROLL
        for (int j = 0; j < AF_CN; j++)
            b[j] = *reinterpret_cast<const float4 *>(B + j * AF_TX * ldb + k);
        CT_UNROLL
        for (int i = 0; i < AF_RM; i++) CT_UNROLL
        for (int j = 0; j < AF_CN; j++) {
            acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
            acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
            acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
            acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
        }
    }
}

/* The thread's VW floats of row p at vector u. */
template <int VW> static __device__ inline void af_load_vec(float (&x)[VW], const float *p);
template <> __device__ inline void af_load_vec<4>(float (&x)[4], const float *p) {
    const float4 v = *reinterpret_cast<const float4 *>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}
template <> __device__ inline void af_load_vec<2>(float (&x)[2], const float *p) {
    const float2 v = *reinterpret_cast<const float2 *>(p);
    x[0] = v.x, x[1] = v.y;
}

/* acc[a][n] += Σ_{k < 64} A[(ty + 16a)·lda + k] · B[k·ldb + column n], k in order; column n of
 * the thread: (n / VW·16 + tx)·VW + n % VW. */
template <int HD>
static __device__ inline void af_mm_nn(float (&acc)[AF_RM][af_shape<HD>::NH], const float *A,
                                       int lda, const float *B, int ldb) {
    constexpr int VW = af_shape<HD>::VW, NG = af_shape<HD>::NG;
    A += af_ty() * lda;
    B += af_tx() * VW;
    CT_UNROLL_BY(1)
    for (int k = 0; k < AF_TILE; k += 4) {
        float a[AF_RM][4];
        CT_UNROLL
        for (int i = 0; i < AF_RM; i++) af_load_vec<4>(a[i], A + i * AF_TY * lda + k);
        CT_UNROLL
        for (int kk = 0; kk < 4; kk++) {
            float b[NG][VW];
            CT_UNROLL
            for (int u = 0; u < NG; u++) af_load_vec<VW>(b[u], B + (k + kk) * ldb + u * AF_TX * VW);
            CT_UNROLL
            for (int i = 0; i < AF_RM; i++) CT_UNROLL
            for (int u = 0; u < NG; u++) CT_UNROLL
            for (int e = 0; e < VW; e++)
                acc[i][u * VW + e] = fmaf(a[i][kk], b[u][e], acc[i][u * VW + e]);
        }
    }
}

template <int HD> static __device__ inline int af_col(int n) {
    constexpr int VW = af_shape<HD>::VW;
    return (n / VW * AF_TX + af_tx()) * VW + n % VW;
}

/* Stores rows r0 + ty + 16a (< T) of acc (the thread's head columns, those < hd), times mul, to
 * dst (row stride ld). */
template <int HD>
static __device__ inline void af_store_rows(float *dst, int64_t ld,
                                            const float (&acc)[AF_RM][af_shape<HD>::NH], int r0,
                                            int T, int hd, float mul) {
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) {
        const int i = r0 + af_ty() + a * AF_TY;
        if (i >= T) continue;
        CT_UNROLL
        for (int n = 0; n < af_shape<HD>::NH; n++)
            if (af_col<HD>(n) < hd) dst[(int64_t)i * ld + af_col<HD>(n)] = acc[a][n] * mul;
    }
}

/* Column sums of the thread's rows (rows ty + 16a at or past n_rows left out), then of the 16 row
 * groups in order, stored to dst[d] for d < hd. red: 16·HD floats of shared memory. Called by the
 * whole block, after a barrier past the last read of whatever red overlaps. */
template <int HD>
static __device__ inline void af_colsum_store(float *dst, float *red,
                                              const float (&acc)[AF_RM][af_shape<HD>::NH],
                                              int n_rows, int hd) {
    CT_UNROLL
    for (int n = 0; n < af_shape<HD>::NH; n++) {
        float s = 0.0f;
        CT_UNROLL
        for (int a = 0; a < AF_RM; a++)
            if (af_ty() + a * AF_TY < n_rows) s += acc[a][n];
        red[af_ty() * HD + af_col<HD>(n)] = s;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += AF_THREADS) {
        float s = red[d];
        for (int k = 1; k < AF_TY; k++) s += red[k * HD + d];
        dst[d] = s;
    }
}

/* ---- forward --------------------------------------------------------------------------------- */

template <int HD> static constexpr size_t af_fwd_smem() {
    return sizeof(float) * (size_t)(3 * AF_TILE * af_shape<HD>::LD + AF_TILE * AF_PLD);
}

template <int HD>
static __global__ void __launch_bounds__(AF_THREADS, AF_MINB(HD))
    attn_fwd_kernel(float *out, float *lse, const float *qkv, int T, int n_head, int n_kv_head,
                    int hd, float scale, bool vec) {
    constexpr int LD = af_shape<HD>::LD, NH = af_shape<HD>::NH;
    CT_DYN_SHARED(float, smem); /* af_fwd_smem */
    float *qs = smem, *ks = qs + AF_TILE * LD, *vs = ks + AF_TILE * LD, *ps = vs + AF_TILE * LD;
    const int tx = af_tx(), ty = af_ty();
    const int qt = (int)(gridDim.x - 1 - blockIdx.x); /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const float *qh = qkv + (int64_t)b * T * lqkv + (int64_t)h * hd;
    const float *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd;
    const int q0 = qt * AF_TILE;

    af_load_tile<HD>(qs, qh, lqkv, q0, T, hd, vec);
    float o[AF_RM][NH], m[AF_RM], l[AF_RM];
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) {
        m[a] = -INFINITY, l[a] = 0.0f;
        CT_UNROLL
        for (int n = 0; n < NH; n++) o[a][n] = 0.0f;
    }
    for (int kt = 0; kt <= qt; kt++) { /* tiles past the diagonal are fully masked */
        const int k0 = kt * AF_TILE;
        __syncthreads(); /* the previous tile's K and V are no longer read */
        af_load_tile<HD>(ks, kh, lqkv, k0, T, hd, vec);
        af_load_tile<HD>(vs, kh + ckv, lqkv, k0, T, hd, vec);
        __syncthreads();
        float s[AF_RM][AF_CN];
        CT_UNROLL
        for (int a = 0; a < AF_RM; a++) CT_UNROLL
        for (int c = 0; c < AF_CN; c++) s[a][c] = 0.0f;
        af_mm_nt<HD>(s, qs, LD, ks, LD);
        /* Key k0 is visible to every row of the tile (k0 ≤ q0), so each row's max is finite and
         * exp(m_old − m_new) is 0 on the first tile (m_old = −inf), never NaN. */
        CT_UNROLL
        for (int a = 0; a < AF_RM; a++) {
            const int i = q0 + ty + a * AF_TY;
            float x[AF_CN], mx = -INFINITY;
            CT_UNROLL
            for (int c = 0; c < AF_CN; c++) {
                const int j = k0 + tx + c * AF_TX;
                x[c] = j < T && j <= i ? s[a][c] * scale : -INFINITY;
                mx = fmaxf(mx, x[c]);
            }
            const float mn = fmaxf(m[a], af_row_max(mx));
            const float alpha = expf(m[a] - mn);
            l[a] *= alpha;
            CT_UNROLL
            for (int c = 0; c < AF_CN; c++) {
                const float p = expf(x[c] - mn);
                l[a] += p;
                ps[(ty + a * AF_TY) * AF_PLD + tx + c * AF_TX] = p;
            }
            CT_UNROLL
            for (int n = 0; n < NH; n++) o[a][n] *= alpha;
            m[a] = mn;
        }
        __syncwarp(); /* the half-warp's rows of P are written */
        af_mm_nn<HD>(o, ps, AF_PLD, vs, LD);
    }
    const int64_t lse_row = ((int64_t)b * n_head + h) * T;
    float *oh = out + (int64_t)b * T * cq + (int64_t)h * hd;
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) {
        const float sum = af_row_sum(l[a]);
        const int i = q0 + ty + a * AF_TY;
        if (i >= T) continue;
        const float inv = 1.0f / sum;
        CT_UNROLL
        for (int n = 0; n < NH; n++)
            if (af_col<HD>(n) < hd) oh[(int64_t)i * cq + af_col<HD>(n)] = o[a][n] * inv;
        if (tx == 0) lse[lse_row + i] = m[a] + logf(sum);
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

/* K, V, Q, dO (64, LD); Pᵀ, then dSᵀ (64, PLD); lse, D (64). */
template <int HD> static constexpr size_t af_dkdv_smem() {
    return sizeof(float) *
           (size_t)(4 * AF_TILE * af_shape<HD>::LD + AF_TILE * AF_PLD + 2 * AF_TILE);
}

template <int HD>
static __global__ void __launch_bounds__(AF_THREADS, AF_MINB(HD))
    attn_bwd_dkdv_kernel(float *dqkv, float *partial, const float *dout, const float *qkv,
                         const float *lse, const float *D, int T, int n_head, int n_kv_head, int hd,
                         float scale, bool vec) {
    constexpr int LD = af_shape<HD>::LD, NH = af_shape<HD>::NH;
    CT_DYN_SHARED(float, smem); /* af_dkdv_smem */
    float *ks = smem, *vs = ks + AF_TILE * LD, *qs = vs + AF_TILE * LD, *dos = qs + AF_TILE * LD;
    float *ps = dos + AF_TILE * LD, *ls = ps + AF_TILE * AF_PLD;
    float *Ds = ls + AF_TILE;
    const int tx = af_tx(), ty = af_ty();
    const int n_t = (int)gridDim.x, kt = blockIdx.x; /* key tile 0 meets the most query tiles */
    const int kvh = blockIdx.y, b = blockIdx.z, group = n_head / n_kv_head;
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t k_off = (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, v_off = k_off + ckv;
    const int k0 = kt * AF_TILE;

    af_load_tile<HD>(ks, qkv + k_off, lqkv, k0, T, hd, vec);
    af_load_tile<HD>(vs, qkv + v_off, lqkv, k0, T, hd, vec);
    float dk[AF_RM][NH], dv[AF_RM][NH];
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) CT_UNROLL
    for (int n = 0; n < NH; n++) dk[a][n] = dv[a][n] = 0.0f;
    for (int g = 0; g < group; g++) {
        const int h = kvh * group + g;
        const int64_t lrow = ((int64_t)b * n_head + h) * T;
        const float *qh = qkv + (int64_t)b * T * lqkv + (int64_t)h * hd;
        const float *doh = dout + (int64_t)b * T * cq + (int64_t)h * hd;
        for (int qt = kt; qt < n_t; qt++) {
            const int q0 = qt * AF_TILE;
            __syncthreads(); /* the previous tile's Q, dO, lse and D are no longer read */
            af_load_tile<HD>(qs, qh, lqkv, q0, T, hd, vec);
            af_load_tile<HD>(dos, doh, cq, q0, T, hd, vec);
            af_load_rows(ls, lse + lrow, q0, T);
            af_load_rows(Ds, D + lrow, q0, T);
            __syncthreads();
            /* Pᵀ, dV += Pᵀ·dO, then dPᵀ, and dSᵀ = Pᵀ ⊙ (dPᵀ − D) over Pᵀ in place (each element
             * read and written by its own thread), dK += dSᵀ·Q: S and dP are never live together
             * and one tile holds both weights. */
            float s[AF_RM][AF_CN];
            CT_UNROLL
            for (int a = 0; a < AF_RM; a++) CT_UNROLL
            for (int c = 0; c < AF_CN; c++) s[a][c] = 0.0f;
            af_mm_nt<HD>(s, ks, LD, qs, LD); /* Sᵀ: keys down, queries across */
            CT_UNROLL
            for (int a = 0; a < AF_RM; a++) {
                const int j = k0 + ty + a * AF_TY;
                CT_UNROLL
                for (int c = 0; c < AF_CN; c++) {
                    const int ic = tx + c * AF_TX, i = q0 + ic;
                    const bool live = i < T && j < T && j <= i;
                    ps[(ty + a * AF_TY) * AF_PLD + ic] =
                        live ? expf(s[a][c] * scale - ls[ic]) : 0.0f;
                }
            }
            __syncwarp(); /* the half-warp's rows of Pᵀ are written */
            af_mm_nn<HD>(dv, ps, AF_PLD, dos, LD);
            CT_UNROLL
            for (int a = 0; a < AF_RM; a++) CT_UNROLL
            for (int c = 0; c < AF_CN; c++) s[a][c] = 0.0f;
            af_mm_nt<HD>(s, vs, LD, dos, LD); /* dPᵀ */
            /* the half-warp's rows of Pᵀ are read (dV above) before dSᵀ overwrites them */
            __syncwarp();
            CT_UNROLL
            for (int a = 0; a < AF_RM; a++) CT_UNROLL
            for (int c = 0; c < AF_CN; c++) {
                const int at = (ty + a * AF_TY) * AF_PLD + tx + c * AF_TX;
                ps[at] *= s[a][c] - Ds[tx + c * AF_TX];
            }
            __syncwarp(); /* the half-warp's rows of dSᵀ are written */
            af_mm_nn<HD>(dk, ps, AF_PLD, qs, LD);
        }
    }
    af_store_rows<HD>(dqkv + k_off, lqkv, dk, k0, T, hd, scale);
    af_store_rows<HD>(dqkv + v_off, lqkv, dv, k0, T, hd, 1.0f);
    if (partial) { /* this key tile's column sums of dK and dV (fp32) */
        CT_UNROLL
        for (int a = 0; a < AF_RM; a++) CT_UNROLL
        for (int n = 0; n < NH; n++) dk[a][n] *= scale;
        float *prow = partial + ((int64_t)b * n_t + kt) * lqkv + cq + (int64_t)kvh * hd;
        const int n_rows = T - k0 < AF_TILE ? T - k0 : AF_TILE;
        __syncthreads(); /* dSᵀ, which red overlaps, is no longer read */
        af_colsum_store<HD>(prow, ps, dk, n_rows, hd);
        af_colsum_store<HD>(prow + ckv, ps + AF_TY * HD, dv, n_rows, hd);
    }
}

/* Q, dO, K, V (64, LD); dS (64, PLD); lse, D (64). */
template <int HD> static constexpr size_t af_dq_smem() {
    return sizeof(float) *
           (size_t)(4 * AF_TILE * af_shape<HD>::LD + AF_TILE * AF_PLD + 2 * AF_TILE);
}

template <int HD>
static __global__ void __launch_bounds__(AF_THREADS, AF_MINB(HD))
    attn_bwd_dq_kernel(float *dqkv, float *partial, const float *dout, const float *qkv,
                       const float *lse, const float *D, int T, int n_head, int n_kv_head, int hd,
                       float scale, bool vec) {
    constexpr int LD = af_shape<HD>::LD, NH = af_shape<HD>::NH;
    CT_DYN_SHARED(float, smem); /* af_dq_smem */
    float *qs = smem, *dos = qs + AF_TILE * LD, *ks = dos + AF_TILE * LD, *vs = ks + AF_TILE * LD;
    float *dss = vs + AF_TILE * LD, *ls = dss + AF_TILE * AF_PLD, *Ds = ls + AF_TILE;
    const int tx = af_tx(), ty = af_ty();
    const int n_t = (int)gridDim.x, qt = n_t - 1 - (int)blockIdx.x; /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t q_off = (int64_t)b * T * lqkv + (int64_t)h * hd;
    const float *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd;
    const int64_t lrow = ((int64_t)b * n_head + h) * T;
    const int q0 = qt * AF_TILE;

    af_load_tile<HD>(qs, qkv + q_off, lqkv, q0, T, hd, vec);
    af_load_tile<HD>(dos, dout + (int64_t)b * T * cq + (int64_t)h * hd, cq, q0, T, hd, vec);
    af_load_rows(ls, lse + lrow, q0, T);
    af_load_rows(Ds, D + lrow, q0, T);
    float dq[AF_RM][NH];
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) CT_UNROLL
    for (int n = 0; n < NH; n++) dq[a][n] = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * AF_TILE;
        __syncthreads(); /* the previous tile's K and V are no longer read */
        af_load_tile<HD>(ks, kh, lqkv, k0, T, hd, vec);
        af_load_tile<HD>(vs, kh + ckv, lqkv, k0, T, hd, vec);
        __syncthreads();
        float s[AF_RM][AF_CN], dp[AF_RM][AF_CN];
        CT_UNROLL
        for (int a = 0; a < AF_RM; a++) CT_UNROLL
        for (int c = 0; c < AF_CN; c++) s[a][c] = dp[a][c] = 0.0f;
        af_mm_nt<HD>(s, qs, LD, ks, LD);
        af_mm_nt<HD>(dp, dos, LD, vs, LD);
        CT_UNROLL
        for (int a = 0; a < AF_RM; a++) {
            const int ir = ty + a * AF_TY, i = q0 + ir;
            CT_UNROLL
            for (int c = 0; c < AF_CN; c++) {
                const int j = k0 + tx + c * AF_TX;
                const bool live = i < T && j < T && j <= i;
                const float p = live ? expf(s[a][c] * scale - ls[ir]) : 0.0f;
                dss[ir * AF_PLD + tx + c * AF_TX] = p * (dp[a][c] - Ds[ir]);
            }
        }
        __syncwarp(); /* the half-warp's rows of dS are written */
        af_mm_nn<HD>(dq, dss, AF_PLD, ks, LD);
    }
    af_store_rows<HD>(dqkv + q_off, lqkv, dq, q0, T, hd, scale);
    if (partial) { /* this query tile's column sums of dQ (fp32) */
        CT_UNROLL
        for (int a = 0; a < AF_RM; a++) CT_UNROLL
        for (int n = 0; n < NH; n++) dq[a][n] *= scale;
        const int n_rows = T - q0 < AF_TILE ? T - q0 : AF_TILE;
        __syncthreads(); /* dS, which red overlaps, is no longer read */
        af_colsum_store<HD>(partial + ((int64_t)b * n_t + qt) * lqkv + (int64_t)h * hd, dss, dq,
                            n_rows, hd);
    }
}

/* ---- launchers ------------------------------------------------------------------------------- */

/* Whole float4s can be read from rows of ld floats at p. */
static bool af_vec_ok(const void *p, int64_t ld, int64_t hd) {
    return hd % 4 == 0 && ld % 4 == 0 && ct_launch_aligned(p, 16);
}

template <typename S, int HD>
static void att_fwd(ct_cuda_ctx *cx, void *out, float *lse, const void *qkv, int64_t B, int64_t T,
                    int64_t n_head, int64_t n_kv_head, int64_t hd) {
    const size_t smem = af_fwd_smem<HD>();
    const int64_t lqkv = (n_head + 2 * n_kv_head) * hd;
    att_allow_smem(attn_fwd_kernel<HD>, smem);
    dim3 grid((unsigned)((T + AF_TILE - 1) / AF_TILE), (unsigned)n_head, (unsigned)B);
    ct_launch(attn_fwd_kernel<HD>, grid, dim3(AF_THREADS), smem, ct_cuda_stream(cx), (float *)out,
              lse, (const float *)qkv, (int)T, (int)n_head, (int)n_kv_head, (int)hd,
              1.0f / sqrtf((float)hd), af_vec_ok(qkv, lqkv, hd));
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
    const int64_t n_rows = B * n_head * T, n_t = (T + AF_TILE - 1) / AF_TILE;
    const int64_t lqkv = (n_head + 2 * n_kv_head) * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const bool vec = af_vec_ok(qkv, lqkv, hd) && af_vec_ok(dout, n_head * hd, hd);
    float *D = (float *)ct_cuda_workspace(cx, 0, (size_t)n_rows * sizeof(float));
    float *partial =
        dbias ? (float *)ct_cuda_workspace(cx, 1, (size_t)(B * n_t * lqkv) * sizeof(float)) : NULL;

    ct_cuda_attention_rowdot(cx, CT_DTYPE_F32, D, dout, out, B, T, n_head, hd);

    const size_t smem_kv = af_dkdv_smem<HD>();
    att_allow_smem(attn_bwd_dkdv_kernel<HD>, smem_kv);
    ct_launch(attn_bwd_dkdv_kernel<HD>, dim3((unsigned)n_t, (unsigned)n_kv_head, (unsigned)B),
              dim3(AF_THREADS), smem_kv, st, (S *)dqkv, partial, (const S *)dout, (const S *)qkv,
              lse, (const float *)D, (int)T, (int)n_head, (int)n_kv_head, (int)hd, scale, vec);
    CT_CUDA_CHECK(cudaGetLastError());

    const size_t smem_q = af_dq_smem<HD>();
    att_allow_smem(attn_bwd_dq_kernel<HD>, smem_q);
    ct_launch(attn_bwd_dq_kernel<HD>, dim3((unsigned)n_t, (unsigned)n_head, (unsigned)B),
              dim3(AF_THREADS), smem_q, st, (S *)dqkv, partial, (const S *)dout, (const S *)qkv,
              lse, (const float *)D, (int)T, (int)n_head, (int)n_kv_head, (int)hd, scale, vec);
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
