/*
 * attention_tc.cu — causal self-attention in bf16 on tensor cores (attention_tc.cuh): the bf16
 * path of the slots attention_fwd and attention_bwd, FlashAttention-2 style, with warp-level
 * mma.sync m16n8k16 (bf16 operands, fp32 accumulators) and ldmatrix through cuda/ct_mma.cuh, whose
 * emulated versions implement the PTX fragment layouts (cuda/emu/mma_emu.cc). fp32 keeps the
 * plain kernels of attention.cu.
 *
 * The formulas are attention.cu's (and the CPU reference's): s = scale·q·k, p = exp(s − m)/l,
 * lse = m + log l; dP = dO·Vᵀ, D = rowsum(dO ⊙ O), dS = P ⊙ (dP − D), dV = Pᵀ·dO, dQ = scale·dS·K,
 * dK = scale·dSᵀ·Q. Exponentials are exp2 of log2(e)-scaled arguments, each weight one FFMA and
 * one ct_exp2 (ct_mma.cuh: ex2.approx.ftz, so weights below 2^-126 are 0). What differs from the
 * fp32 path, and so from the CPU reference in bf16, beyond summation order: the weights P (forward
 * and dV) and dS (dQ, dK) are rounded to bf16 to enter the second product, each within 2^-8
 * relative (test/unit/test_cuda_attention.c states the tolerance this adds).
 *
 * Tiles: blocks of TC_THREADS = 128 threads (4 warps); a warp owns 16 rows of the block's
 * TC_BM = 64 (query rows in the forward and dQ kernels, keys in dK/dV) and loops over the other
 * operand in steps of TC_BN keys (forward: 64) or TC_STEP(HD) (backward: 64, 32 for head width
 * 128, which keeps dK, dV and two score fragments in registers). Shared tiles are bf16 rows of
 * HD + 8 elements (16 bytes of padding: the eight 16-byte rows an ldmatrix reads fall in distinct
 * banks). HD, the compiled head width, is 32, 64 or 128: the smallest that holds head_dim, the
 * columns past head_dim zero in shared memory. Rows past T load as zeros and are masked; global
 * memory is never read past row T − 1 or column head_dim − 1.
 *
 * Fragments (ct_mma.cuh): a warp's scores S (16 rows x 8 keys per n-tile) are mma accumulators
 * whose lane (g, t) holds rows g and g + 8, keys 2t and 2t + 1; rounded to bf16 in pairs they are
 * directly the A operand of the next product (16 rows x 16 keys: n-tiles 2k and 2k + 1), as in
 * FlashAttention-2. B operands come from shared memory by ldmatrix: K (or Q, dO, V in the
 * backward) as "col" operands untransposed, V (or dO, Q, K) as row-major operands with .trans.
 *
 * Pipelining: the operand that streams (K and V in the forward and dQ kernels; Q, dO, lse and D
 * in dK/dV) has two shared buffers; step i + 1's tiles are copied by cp.async (cuda/ct_async.cuh)
 * into one while step i is computed from the other, then a wait for step i's group and a barrier
 * make it visible to every warp, and a second barrier after the step frees its buffer for step
 * i + 2's copies. Rows past T and columns past head_dim arrive as zeros (src-size 0). Masks are
 * computed only in the steps that meet the diagonal (or run past T): a template flag.
 *
 * Kernels (grid; dynamic shared memory bytes for HD = 32 / 64 / 128):
 *   tc_fwd_kernel   (query tiles, n_head, B), heaviest first. Q tile in shared memory (its A
 *                   fragments read a k-step at a time);
 *                   per key tile kt ≤ qt: S = Q·Kᵀ (n-tiles past a warp's last row skipped on
 *                   the diagonal), online softmax per row (running max shared by the 4 lanes of
 *                   a row, a per-lane running sum reduced at the end), O += P·V.
 *                   (64 + 2·2·64)·(HD + 8)·2: 25600 / 46080 / 87040.
 *   tc_dkdv_kernel  (key tiles, n_kv_head, B). K and V tile once; for each query head of the GQA
 *                   group in order and each query step at or after the tile: Q, dO, lse, D;
 *                   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, Pᵀ and dSᵀ; dV += Pᵀ·dO, dK += dSᵀ·Q in registers.
 *                   One owner per (b, kv head, key tile): no atomics, a fixed order.
 *                   2·64·(HD + 8)·2 + 2·(2·S·(HD + 8)·2 + 2·S·4) (S = TC_STEP):
 *                   31744 / 56320 / 70144.
 *   tc_dq_kernel    (query tiles, n_head, B). Q and dO tile; per key step up to the diagonal:
 *                   S, dP, dS; dQ += dS·K in registers (lse and D of its rows in registers).
 *                   (2·64 + 2·2·S)·(HD + 8)·2: 30720 / 55296 / 69632.
 * D = rowsum(dO ⊙ O) comes from attention.cu's kernel (ct_cuda_attention_rowdot), the dbias column
 * sums from ct_cuda_colsum_add (elementwise.cuh) over per-tile partials written here from the fp32
 * accumulators, before bf16 rounding.
 *
 * On Hopper, at head width 64 and with CT_CUDA_ATTENTION=wgmma: wg_fwd_kernel, wg_dkdv_kernel and
 * wg_dq_kernel, the same three with the warpgroup's products on wgmma (cuda/ct_wgmma.cuh; the
 * section before the launchers says how their tiles are laid out). The softmax, the weights of the
 * backward and the stores are the same functions as above. The forward and dQ keep two groups of
 * products in flight (the next tile's scores while O += P·V or dQ += dS·K runs: FlashAttention-3's
 * overlap within a warpgroup). dK/dV, which a second pair of score tiles would take past 255
 * registers, overlaps within its step: dPᵀ's product runs while Pᵀ is made, dV's while dSᵀ is.
 */
#include "cuda/ct_cuda.h"

#include <math.h>
#include <stdint.h>

#include "cuda/ct_async.cuh"
#include "cuda/ct_cuda_dtype.cuh"
#include "cuda/ct_mma.cuh"
#include "cuda/ct_wgmma.cuh"
#include "cuda/attention_tc.cuh"
#include "cuda/elementwise.cuh"
#include "cuda/launch.cuh"

typedef __nv_bfloat16 bf16;

#define TC_WARPS 4
#define TC_THREADS (32 * TC_WARPS)
#define TC_BM 64 /* rows per block: 16 per warp */
#define TC_BN 64 /* keys per forward step (== TC_BM: tile kt meets query tiles qt >= kt) */
#define TC_LOG2E 1.4426950408889634f

/* keys (or queries) per backward step for head width HD; at 64 and below TC_STEP_NARROW (a build
 * may set it to 32 to compare) */
#ifndef TC_STEP_NARROW
#define TC_STEP_NARROW 64
#endif
#define TC_STEP(HD) ((HD) > 64 ? 32 : TC_STEP_NARROW)
/* resident blocks per SM the dK/dV kernel asks for: 3 where 32-row steps leave it the registers */
#define TC_DKDV_MINB(HD) ((HD) > 64 || TC_STEP(HD) > 32 ? 2 : 3)
/* resident blocks per SM the launch bounds ask for (registers: 65536 / (128·MB)); at head width
 * 64 and below TC_MINB_NARROW (a build may set it to 4 to compare) */
#ifndef TC_MINB_NARROW
#define TC_MINB_NARROW 3
#endif
#define TC_MINB(HD) ((HD) > 64 ? 2 : TC_MINB_NARROW)

static_assert(TC_BM == 16 * TC_WARPS, "a warp owns 16 rows (one mma M)");
static_assert(TC_BN == TC_BM, "causal tile skipping assumes square forward tiles");

/* ---- shared helpers -------------------------------------------------------------------------- */

/* dst[r·(HD + 8) + c] (r < rows, c < HD) = row r0 + r, column c of a head slice src (row stride
 * ld); zero for rows at or past T and columns at or past hd. vec: 16-byte loads (hd % 8 == 0, ld
 * % 8 == 0 and src 16-byte aligned, checked by the launcher). */
template <int HD>
static __device__ inline void tc_load(bf16 *dst, const bf16 *src, int64_t ld, int r0, int rows,
                                      int T, int hd, bool vec) {
    constexpr int LD = HD + 8;
    if (vec) {
        for (int e = threadIdx.x; e < rows * (HD / 8); e += TC_THREADS) {
            const int r = e / (HD / 8), c = e % (HD / 8) * 8;
            uint4 x = make_uint4(0, 0, 0, 0);
            if (r0 + r < T && c < hd)
                x = *reinterpret_cast<const uint4 *>(src + (int64_t)(r0 + r) * ld + c);
            *reinterpret_cast<uint4 *>(dst + r * LD + c) = x;
        }
    } else {
        for (int e = threadIdx.x; e < rows * HD; e += TC_THREADS) {
            const int r = e / HD, c = e % HD;
            bf16 x = __float2bfloat16_rn(0.0f);
            if (r0 + r < T && c < hd) x = src[(int64_t)(r0 + r) * ld + c];
            dst[r * LD + c] = x;
        }
    }
}

/* tc_load's tile, issued as 16-byte cp.async copies (zeros past T and hd) when vec, for the
 * caller to commit and wait for; plain stores otherwise, visible after the caller's barrier. */
template <int HD>
static __device__ inline void tc_load_async(bf16 *dst, const bf16 *src, int64_t ld, int r0,
                                            int rows, int T, int hd, bool vec) {
    constexpr int LD = HD + 8, CPR = HD / 8, RSTEP = TC_THREADS / CPR; /* CPR: copies a row */
    static_assert(TC_THREADS % CPR == 0, "a thread copies the same columns of every RSTEP-th row");
    if (!vec) {
        tc_load<HD>(dst, src, ld, r0, rows, T, hd, false);
        return;
    }
    /* the thread's column and first row, then its pointers stepped by RSTEP rows: no index
     * arithmetic per copy */
    const int c = (int)threadIdx.x % CPR * 8;
    const bool c_in = c < hd;
    int r = (int)threadIdx.x / CPR;
    const bf16 *s = src + (int64_t)(r0 + r) * ld + c;
    bf16 *d = dst + r * LD + c;
    for (; r < rows; r += RSTEP, s += (int64_t)RSTEP * ld, d += RSTEP * LD) {
        const bool in = c_in && r0 + r < T;
        ct_cp_async<16>(d, in ? s : src, in);
    }
}

/* dst[r] = src[r0 + r] for r < n, 0 past T, as 4-byte cp.async copies. */
static __device__ inline void tc_load_rows_async(float *dst, const float *src, int r0, int n,
                                                 int T) {
    for (int r = threadIdx.x; r < n; r += TC_THREADS) {
        const bool in = r0 + r < T;
        ct_cp_async<4>(dst + r, in ? src + r0 + r : src, in);
    }
}

/* K and V rows r0 .. r0 + ROWS − 1 of the head (kh, vh: row stride ld) into kv, V ROWS·(HD + 8)
 * elements after K, as one copy group. */
template <int HD, int ROWS>
static __device__ inline void tc_load_kv(bf16 *kv, const bf16 *kh, const bf16 *vh, int64_t ld,
                                         int r0, int T, int hd, bool vec) {
    tc_load_async<HD>(kv, kh, ld, r0, ROWS, T, hd, vec);
    tc_load_async<HD>(kv + ROWS * (HD + 8), vh, ld, r0, ROWS, T, hd, vec);
    ct_cp_async_commit();
}

/* The A fragments of k-step kk (columns 16kk .. 16kk + 15) of rows m0 .. m0 + 15 of a shared tile
 * (row stride LD): matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
 * (rows 8-15, cols 8-15), lane 8i + j giving row j of matrix i. */
template <int LD>
static __device__ inline void tc_frag_a(uint32_t (&a)[4], const bf16 *tile, int m0, int kk) {
    const int lane = threadIdx.x & 31, i = lane >> 3, j = lane & 7;
    ct_ldmatrix_x4(a, tile + (m0 + j + 8 * (i & 1)) * LD + 16 * kk + 8 * (i >> 1));
}

/* The B fragments ("col": B[k][n] = tile[n0 + n][16kk + k]) of n-tiles n0 .. n0 + 7 (r[0], r[1])
 * and n0 + 8 .. n0 + 15 (r[2], r[3]) for k-step kk: a tile whose rows are B's columns. */
template <int LD>
static __device__ inline void tc_frag_bt(uint32_t (&r)[4], const bf16 *tile, int n0, int kk) {
    const int lane = threadIdx.x & 31, i = lane >> 3, j = lane & 7;
    ct_ldmatrix_x4(r, tile + (n0 + j + 8 * (i >> 1)) * LD + 16 * kk + 8 * (i & 1));
}

/* The B fragments (B[k][n] = tile[k0 + k][c0 + n], k < 16) of n-tiles c0 .. c0 + 7 (r[0], r[1])
 * and c0 + 8 .. c0 + 15 (r[2], r[3]): a row-major tile, transposed by ldmatrix. */
template <int LD>
static __device__ inline void tc_frag_b(uint32_t (&r)[4], const bf16 *tile, int k0, int c0) {
    const int lane = threadIdx.x & 31, i = lane >> 3, j = lane & 7;
    ct_ldmatrix_x4_trans(r, tile + (k0 + j + 8 * (i & 1)) * LD + c0 + 8 * (i >> 1));
}

/* Accumulator n-tiles 2k and 2k + 1 (16 rows x 16 columns) as the A operand of a product over
 * those 16 columns, rounded to bf16. */
static __device__ inline void tc_acc_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                          const float (&hi)[4]) {
    a[0] = ct_pack_bf16x2(lo[0], lo[1]);
    a[1] = ct_pack_bf16x2(lo[2], lo[3]);
    a[2] = ct_pack_bf16x2(hi[0], hi[1]);
    a[3] = ct_pack_bf16x2(hi[2], hi[3]);
}

/* acc (the warp's 16 rows x HD) += the accumulator n-tiles lo and hi (16 rows x 16 columns: n-tiles
 * 2kp and 2kp + 1, rounded to bf16 as the A operand) times rows 16kp .. 16kp + 15 of a row-major
 * shared tile: O += P·V, dQ += dS·K, dV += Pᵀ·dO, dK += dSᵀ·Q. */
template <int HD>
static __device__ inline void tc_acc_product(float (&acc)[HD / 8][4], const float (&lo)[4],
                                             const float (&hi)[4], int kp, const bf16 *tile) {
    constexpr int LD = HD + 8, DT = HD / 8;
    uint32_t a[4];
    tc_acc_to_a(a, lo, hi);
    CT_UNROLL
    for (int cp = 0; cp < DT / 2; cp++) {
        uint32_t r[4];
        tc_frag_b<LD>(r, tile, 16 * kp, 16 * cp);
        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
        ct_mma_bf16(acc[2 * cp], a, b0);
        ct_mma_bf16(acc[2 * cp + 1], a, b1);
    }
}

/* Stores the warp's 16 rows (row0 + g, row0 + g + 8) of accumulators acc[n] (columns 8n + 2t,
 * + 1), times mul, to dst (row stride ld), rows below T and columns below hd. */
template <int NT>
static __device__ inline void tc_store(bf16 *dst, int64_t ld, const float (&acc)[NT][4], int row0,
                                       int T, int hd, float mul0, float mul1) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    CT_UNROLL
    for (int h = 0; h < 2; h++) {
        const int row = row0 + g + 8 * h;
        if (row >= T) continue;
        const float mul = h ? mul1 : mul0;
        bf16 *d = dst + (int64_t)row * ld;
        CT_UNROLL
        for (int n = 0; n < NT; n++) {
            const int c = 8 * n + 2 * t;
            if (c + 1 < hd && !(hd & 1)) {
                *reinterpret_cast<__nv_bfloat162 *>(d + c) =
                    __floats2bfloat162_rn(acc[n][2 * h] * mul, acc[n][2 * h + 1] * mul);
            } else {
                if (c < hd) d[c] = __float2bfloat16_rn(acc[n][2 * h] * mul);
                if (c + 1 < hd) d[c + 1] = __float2bfloat16_rn(acc[n][2 * h + 1] * mul);
            }
        }
    }
}

/* Column sums (fp32) of the block's 64 rows of accumulators (each warp's acc: its 16 rows), in a
 * fixed order (the 8 row groups of a warp by butterfly, then the warps in order), times mul,
 * stored to dst[c] for c < hd. red: TC_WARPS·HD floats of shared memory no warp still reads.
 * Called by the whole block. */
template <int HD>
static __device__ inline void tc_colsum_store(float *dst, float *red, const float (&acc)[HD / 8][4],
                                              int hd, float mul) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, t = lane & 3;
    CT_UNROLL
    for (int n = 0; n < HD / 8; n++) {
        float c0 = acc[n][0] + acc[n][2], c1 = acc[n][1] + acc[n][3];
        for (int off = 4; off < 32; off *= 2) {
            c0 += __shfl_xor_sync(0xffffffffu, c0, off);
            c1 += __shfl_xor_sync(0xffffffffu, c1, off);
        }
        if (lane < 4) {
            red[w * HD + 8 * n + 2 * t] = c0;
            red[w * HD + 8 * n + 2 * t + 1] = c1;
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < hd; c += TC_THREADS) {
        float s = red[c];
        for (int k = 1; k < TC_WARPS; k++) s += red[k * HD + c];
        dst[c] = s * mul;
    }
}

/* The sum of a value over the 4 lanes of a fragment row (lanes 4g .. 4g + 3), on every one. */
static __device__ inline float tc_row_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
static __device__ inline float tc_row_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

/* ---- forward --------------------------------------------------------------------------------- */

template <int HD> static constexpr size_t tc_fwd_smem() {
    return sizeof(bf16) * (size_t)((TC_BM + 4 * TC_BN) * (HD + 8));
}

/* The online softmax of one key tile for a warp's 16 rows (row0 ..), all but O: the scores s
 * (keys k0 .., 8 per n-tile) become the weights p = 2^(s·sl2 − m·sl2), the running maximum m and
 * sum l move to the new maximum, and alpha is the factor O's rows take to it (tc_rescale). m is
 * the row's running maximum of the raw scores q·k (sl2 > 0 keeps the order), so each weight is
 * one FFMA and one exp2. Key k0 <= every row of the block (kt <= qt), so a row's running max is
 * finite from the first tile on and exp2((m_old − m_new)·sl2) is never NaN. MASK: the diagonal
 * tile, whose keys past a row (or past T) get weight 0. */
template <int NT, bool MASK>
static __device__ inline void tc_softmax_step(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                              float (&alpha)[2], int k0, int row0, int T,
                                              float sl2) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float mx[2] = {-INFINITY, -INFINITY};
    CT_UNROLL
    for (int n = 0; n < NT; n++) CT_UNROLL
    for (int e = 0; e < 4; e++) {
        if (MASK) {
            const int row = row0 + g + 8 * (e >> 1), key = k0 + 8 * n + 2 * t + (e & 1);
            if (!(key <= row && key < T)) s[n][e] = -INFINITY;
        }
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
    }
    float ms[2]; /* −m·sl2: the exponent's offset */
    CT_UNROLL
    for (int hh = 0; hh < 2; hh++) {
        const float mn = fmaxf(m[hh], tc_row_max(mx[hh]));
        alpha[hh] = ct_exp2((m[hh] - mn) * sl2);
        m[hh] = mn;
        ms[hh] = -mn * sl2;
        l[hh] *= alpha[hh];
    }
    CT_UNROLL
    for (int n = 0; n < NT; n++) CT_UNROLL
    for (int e = 0; e < 4; e++) {
        const float p = ct_exp2(fmaf(s[n][e], sl2, ms[e >> 1]));
        s[n][e] = p;
        l[e >> 1] += p;
    }
}

/* O's rows (DT n-tiles of the accumulator layout) times their softmax step's alpha. */
template <int DT>
static __device__ inline void tc_rescale(float (&o)[DT][4], const float (&alpha)[2]) {
    CT_UNROLL
    for (int n = 0; n < DT; n++) CT_UNROLL
    for (int e = 0; e < 4; e++) o[n][e] *= alpha[e >> 1];
}

/* The whole online softmax step: tc_softmax_step, then O rescaled. */
template <int DT, int NT, bool MASK>
static __device__ inline void tc_online_softmax(float (&s)[NT][4], float (&o)[DT][4], float (&m)[2],
                                                float (&l)[2], int k0, int row0, int T, float sl2) {
    float alpha[2];
    tc_softmax_step<NT, MASK>(s, m, l, alpha, k0, row0, T, sl2);
    tc_rescale<DT>(o, alpha);
}

/* The forward's end for a warp's rows: out = o / l (rows below T), lse = m·scale + log l (out_h,
 * lse_h: the head's slices). */
template <int DT>
static __device__ inline void
tc_fwd_finish(bf16 *out_h, int64_t cq, float *lse_h, const float (&o)[DT][4], const float (&m)[2],
              const float (&l)[2], int row0, int T, int hd, float scale) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float sum0 = tc_row_sum(l[0]), sum1 = tc_row_sum(l[1]);
    tc_store<DT>(out_h, cq, o, row0, T, hd, 1.0f / sum0, 1.0f / sum1);
    if (t == 0) {
        if (row0 + g < T) lse_h[row0 + g] = m[0] * scale + logf(sum0);
        if (row0 + g + 8 < T) lse_h[row0 + g + 8] = m[1] * scale + logf(sum1);
    }
}

/* One key tile of the forward for a warp's 16 rows (row0 .. row0 + 15; qr0 in the shared Q tile):
 * S = Q·Kᵀ, the online softmax, O += P·V. MASK: the diagonal tile (the only one with keys past a
 * row, or past T); elsewhere every key of the tile is at or before every row of the block. The Q
 * fragments come from shared memory a k-step at a time (kept in registers across tiles they
 * cost 4·HD/16 registers the products would rather have). */
template <int HD, bool MASK>
static __device__ inline void tc_fwd_tile(float (&o)[HD / 8][4], float (&m)[2], float (&l)[2],
                                          const bf16 *qs, int qr0, const bf16 *ks, const bf16 *vs,
                                          int k0, int row0, int T, float sl2) {
    constexpr int LD = HD + 8, KS = HD / 16, NT = TC_BN / 8, DT = HD / 8;
    /* keys of the tile this warp needs: up to its last row (all but on the diagonal) */
    const int need = MASK ? row0 + 16 - k0 : TC_BN;
    float s[NT][4];
    CT_UNROLL
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    CT_UNROLL
    for (int kk = 0; kk < KS; kk++) {
        uint32_t qf[4];
        tc_frag_a<LD>(qf, qs, qr0, kk);
        CT_UNROLL
        for (int np = 0; np < NT / 2; np++) {
            if (16 * np >= need) continue; /* warp-uniform: keys past every row of the warp */
            uint32_t r[4];
            tc_frag_bt<LD>(r, ks, 16 * np, kk);
            const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            ct_mma_bf16(s[2 * np], qf, b0);
            ct_mma_bf16(s[2 * np + 1], qf, b1);
        }
    }
    tc_online_softmax<DT, NT, MASK>(s, o, m, l, k0, row0, T, sl2);
    CT_UNROLL
    for (int kp = 0; kp < NT / 2; kp++)
        if (16 * kp < need)
            tc_acc_product<HD>(o, s[2 * kp], s[2 * kp + 1], kp, vs); /* P is 0 past need */
}

template <int HD>
static __global__ void __launch_bounds__(TC_THREADS, TC_MINB(HD))
    tc_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv, int T, int n_head, int n_kv_head, int hd,
                  float scale, bool vec) {
    constexpr int LD = HD + 8, DT = HD / 8;
    CT_DYN_SHARED(bf16, smem);
    bf16 *qs = smem, *kvs = qs + TC_BM * LD; /* K and V of tile kt at kvs + (kt & 1)·2·TC_BN·LD */
    const int w = threadIdx.x >> 5;
    const int qt = (int)(gridDim.x - 1 - blockIdx.x); /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const bf16 *qh = qkv + (int64_t)b * T * lqkv + (int64_t)h * hd;
    const bf16 *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, *vh = kh + ckv;
    const int qr = 16 * w, q0 = qt * TC_BM, row0 = q0 + qr; /* the warp's first query row */
    const float sl2 = scale * TC_LOG2E;

    /* Two copy groups in flight: the tile computed on and the next one landing. */
    tc_load_async<HD>(qs, qh, lqkv, q0, TC_BM, T, hd, vec);
    ct_cp_async_commit();
    tc_load_kv<HD, TC_BN>(kvs, kh, vh, lqkv, 0, T, hd, vec);
    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    CT_UNROLL
    for (int n = 0; n < DT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        if (kt < qt) { /* tile kt + 1 into the buffer tile kt − 1 left (freed by its barrier) */
            tc_load_kv<HD, TC_BN>(kvs + ((kt + 1) & 1) * 2 * TC_BN * LD, kh, vh, lqkv,
                                  (kt + 1) * TC_BN, T, hd, vec);
            ct_cp_async_wait<1>();
        } else {
            ct_cp_async_wait<0>();
        }
        __syncthreads(); /* tile kt (and Q) have landed for every thread */
        const bf16 *ks = kvs + (kt & 1) * 2 * TC_BN * LD, *vs = ks + TC_BN * LD;
        if (kt == qt)
            tc_fwd_tile<HD, true>(o, m, l, qs, qr, ks, vs, kt * TC_BN, row0, T, sl2);
        else
            tc_fwd_tile<HD, false>(o, m, l, qs, qr, ks, vs, kt * TC_BN, row0, T, sl2);
        __syncthreads(); /* tile kt's buffer is no longer read */
    }
    tc_fwd_finish<DT>(out + (int64_t)b * T * cq + (int64_t)h * hd, cq,
                      lse + ((int64_t)b * n_head + h) * T, o, m, l, row0, T, hd, scale);
}

/* ---- backward: dK and dV --------------------------------------------------------------------- */

/* One buffer of the query steps: Q and dO (S rows each), lse and D (S floats each). */
template <int HD> static __host__ __device__ constexpr size_t tc_qstep_bytes() {
    return sizeof(bf16) * (size_t)(2 * TC_STEP(HD) * (HD + 8)) +
           sizeof(float) * (size_t)(2 * TC_STEP(HD));
}
template <int HD> static constexpr size_t tc_dkdv_smem() {
    return sizeof(bf16) * (size_t)(2 * TC_BM * (HD + 8)) + 2 * tc_qstep_bytes<HD>();
}
template <int HD> static constexpr size_t tc_dq_smem() {
    return sizeof(bf16) * (size_t)((2 * TC_BM + 4 * TC_STEP(HD)) * (HD + 8));
}

/* The two score products of a backward step for the warp's 16 rows (16w .. 16w + 15 of a1 and
 * a2) against the step's NT·8 rows of b1 and b2: s = a1·b1ᵀ and dp = a2·b2ᵀ (dK/dV: Sᵀ = K·Qᵀ,
 * dPᵀ = V·dOᵀ; dQ: S = Q·Kᵀ, dP = dO·Vᵀ), from zero, fp32 accumulators. */
template <int HD, int NT>
static __device__ inline void tc_score_pair(float (&s)[NT][4], float (&dp)[NT][4], const bf16 *a1,
                                            const bf16 *a2, const bf16 *b1, const bf16 *b2) {
    constexpr int LD = HD + 8, KS = HD / 16;
    const int w = threadIdx.x >> 5;
    CT_UNROLL
    for (int n = 0; n < NT; n++) CT_UNROLL
    for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
    CT_UNROLL_BY(1) /* kk only moves addresses: one k-step's fragments live at a time */
    for (int kk = 0; kk < KS; kk++) {
        uint32_t fa1[4], fa2[4];
        tc_frag_a<LD>(fa1, a1, 16 * w, kk);
        tc_frag_a<LD>(fa2, a2, 16 * w, kk);
        CT_UNROLL
        for (int np = 0; np < NT / 2; np++) {
            uint32_t r[4];
            tc_frag_bt<LD>(r, b1, 16 * np, kk);
            const uint32_t b10[2] = {r[0], r[1]}, b11[2] = {r[2], r[3]};
            ct_mma_bf16(s[2 * np], fa1, b10);
            ct_mma_bf16(s[2 * np + 1], fa1, b11);
            tc_frag_bt<LD>(r, b2, 16 * np, kk);
            const uint32_t b20[2] = {r[0], r[1]}, b21[2] = {r[2], r[3]};
            ct_mma_bf16(dp[2 * np], fa2, b20);
            ct_mma_bf16(dp[2 * np + 1], fa2, b21);
        }
    }
}

/* A dK/dV step's weights for the warp's 16 keys (rows, key0 ..) against the step's NT·8 queries
 * (columns, i0 ..), in two halves: tc_dkdv_p makes Sᵀ in s into Pᵀ, tc_dkdv_ds dPᵀ in dp into
 * dSᵀ = Pᵀ ⊙ (dPᵀ − D) (the wgmma kernel runs products between them). ls, Ds: the step's lse
 * (natural log) and D, read per lane column 8n + 2t + c (c = e & 1) and serving both of the lane's
 * rows. MASK: a step that meets the diagonal or runs past T; elsewhere every query of the step is
 * at or after every key of the block. */
template <int NT, bool MASK>
static __device__ inline void tc_dkdv_p(float (&s)[NT][4], const float *ls, int i0, int key0, int T,
                                        float sl2) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    CT_UNROLL
    for (int n = 0; n < NT; n++) {
        float nl[2];
        CT_UNROLL
        for (int c = 0; c < 2; c++) nl[c] = -ls[8 * n + 2 * t + c] * TC_LOG2E;
        CT_UNROLL
        for (int e = 0; e < 4; e++) {
            float p = ct_exp2(fmaf(s[n][e], sl2, nl[e & 1]));
            if (MASK) {
                const int qi = 8 * n + 2 * t + (e & 1), key = key0 + g + 8 * (e >> 1);
                p = i0 + qi < T && key <= i0 + qi ? p : 0.0f;
            }
            s[n][e] = p;
        }
    }
}
template <int NT>
static __device__ inline void tc_dkdv_ds(const float (&p)[NT][4], float (&dp)[NT][4],
                                         const float *Ds) {
    const int t = threadIdx.x & 3;
    CT_UNROLL
    for (int n = 0; n < NT; n++) {
        float dd[2];
        CT_UNROLL
        for (int c = 0; c < 2; c++) dd[c] = Ds[8 * n + 2 * t + c];
        CT_UNROLL
        for (int e = 0; e < 4; e++) dp[n][e] = p[n][e] * (dp[n][e] - dd[e & 1]);
    }
}
template <int NT, bool MASK>
static __device__ inline void tc_dkdv_weights(float (&s)[NT][4], float (&dp)[NT][4],
                                              const float *ls, const float *Ds, int i0, int key0,
                                              int T, float sl2) {
    tc_dkdv_p<NT, MASK>(s, ls, i0, key0, T, sl2);
    tc_dkdv_ds<NT>(s, dp, Ds);
}

/* A dQ step's weights for the warp's 16 rows (row0 ..) against the step's NT·8 keys (j0 ..): dP
 * in dp becomes dS = P ⊙ (dP − D), P from the scores s. lr, dr: −lse·log2(e) and the D of the
 * lane's rows g and g + 8. MASK: a step that meets the diagonal (the keys past T are there too);
 * elsewhere every key of the step is at or before every row of the block. */
template <int NT, bool MASK>
static __device__ inline void tc_dq_weights(const float (&s)[NT][4], float (&dp)[NT][4],
                                            const float (&lr)[2], const float (&dr)[2], int j0,
                                            int row0, int T, float sl2) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    CT_UNROLL
    for (int n = 0; n < NT; n++) CT_UNROLL
    for (int e = 0; e < 4; e++) {
        float p = ct_exp2(fmaf(s[n][e], sl2, lr[e >> 1]));
        if (MASK) {
            const int row = row0 + g + 8 * (e >> 1), key = j0 + 8 * n + 2 * t + (e & 1);
            p = row < T && key <= row ? p : 0.0f;
        }
        dp[n][e] = p * (dp[n][e] - dr[e >> 1]);
    }
}

/* One query step of a warp's 16 keys: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, Pᵀ and dSᵀ, dV += Pᵀ·dO,
 * dK += dSᵀ·Q. ls: the step's lse (natural log), Ds: its D. MASK: a step that meets the diagonal
 * or runs past T; elsewhere every query of the step is at or after every key of the block. */
template <int HD, bool MASK>
static __device__ inline void tc_dkdv_step(float (&dk)[HD / 8][4], float (&dv)[HD / 8][4],
                                           const bf16 *ks, const bf16 *vs, const bf16 *qs,
                                           const bf16 *dos, const float *ls, const float *Ds,
                                           int i0, int key0, int T, float sl2) {
    constexpr int S = TC_STEP(HD), NT = S / 8;
    float s[NT][4], dp[NT][4];
    tc_score_pair<HD, NT>(s, dp, ks, vs, qs, dos);
    tc_dkdv_weights<NT, MASK>(s, dp, ls, Ds, i0, key0, T, sl2);
    CT_UNROLL
    for (int kp = 0; kp < NT / 2; kp++) {
        tc_acc_product<HD>(dv, s[2 * kp], s[2 * kp + 1], kp, dos);
        tc_acc_product<HD>(dk, dp[2 * kp], dp[2 * kp + 1], kp, qs);
    }
}

template <int HD>
static __global__ void __launch_bounds__(TC_THREADS, TC_DKDV_MINB(HD))
    tc_dkdv_kernel(bf16 *dqkv, float *partial, const bf16 *dout, const bf16 *qkv, const float *lse,
                   const float *D, int T, int n_head, int n_kv_head, int hd, float scale,
                   bool vec) {
    constexpr int LD = HD + 8, S = TC_STEP(HD), DT = HD / 8;
    CT_DYN_SHARED(bf16, smem);
    bf16 *ks = smem, *vs = ks + TC_BM * LD;
    unsigned char *steps = reinterpret_cast<unsigned char *>(vs + TC_BM * LD); /* two buffers */
    const int w = threadIdx.x >> 5;
    const int n_t = (int)gridDim.x, kt = (int)blockIdx.x; /* the most query steps first */
    const int kvh = blockIdx.y, b = blockIdx.z, group = n_head / n_kv_head;
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t k_off = (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, v_off = k_off + ckv;
    const int k0 = kt * TC_BM, key0 = k0 + 16 * w; /* the warp's first key */
    const float sl2 = scale * TC_LOG2E;

    /* Step st is query head kvh·group + st / n_i, queries i0 = k0 + (st % n_i)·S onward; its Q,
     * dO, lse and D go to buffer st & 1, the next step's landing while this one is computed. */
    const int n_i = (T - k0 + S - 1) / S, n_steps = group * n_i;
    auto buffer = [&](int st, bf16 *&qs, bf16 *&dos, float *&ls, float *&Ds) {
        qs = reinterpret_cast<bf16 *>(steps + (st & 1) * tc_qstep_bytes<HD>());
        dos = qs + S * LD;
        ls = reinterpret_cast<float *>(dos + S * LD);
        Ds = ls + S;
    };
    auto load_step = [&](int st) {
        const int h = kvh * group + st / n_i, i0 = k0 + st % n_i * S;
        const int64_t lrow = ((int64_t)b * n_head + h) * T;
        bf16 *qs, *dos;
        float *ls, *Ds;
        buffer(st, qs, dos, ls, Ds);
        tc_load_async<HD>(qs, qkv + (int64_t)b * T * lqkv + (int64_t)h * hd, lqkv, i0, S, T, hd,
                          vec);
        tc_load_async<HD>(dos, dout + (int64_t)b * T * cq + (int64_t)h * hd, cq, i0, S, T, hd, vec);
        tc_load_rows_async(ls, lse + lrow, i0, S, T);
        tc_load_rows_async(Ds, D + lrow, i0, S, T);
        ct_cp_async_commit();
    };

    tc_load_async<HD>(ks, qkv + k_off, lqkv, k0, TC_BM, T, hd, vec);
    tc_load_async<HD>(vs, qkv + v_off, lqkv, k0, TC_BM, T, hd, vec);
    ct_cp_async_commit();
    load_step(0);
    float dk[DT][4], dv[DT][4];
    CT_UNROLL
    for (int n = 0; n < DT; n++) CT_UNROLL
    for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    for (int st = 0; st < n_steps; st++) {
        if (st + 1 < n_steps) { /* into the buffer step st − 1 left (freed by its barrier) */
            load_step(st + 1);
            ct_cp_async_wait<1>();
        } else {
            ct_cp_async_wait<0>();
        }
        __syncthreads(); /* step st (and K, V) have landed for every thread */
        const int i0 = k0 + st % n_i * S;
        if (i0 + S > key0) { /* warp-uniform: else every query is before the warp's keys */
            bf16 *qs, *dos;
            float *ls, *Ds;
            buffer(st, qs, dos, ls, Ds);
            if (i0 < k0 + TC_BM || i0 + S > T)
                tc_dkdv_step<HD, true>(dk, dv, ks, vs, qs, dos, ls, Ds, i0, key0, T, sl2);
            else
                tc_dkdv_step<HD, false>(dk, dv, ks, vs, qs, dos, ls, Ds, i0, key0, T, sl2);
        }
        __syncthreads(); /* step st's buffer is no longer read */
    }
    tc_store<DT>(dqkv + k_off, lqkv, dk, key0, T, hd, scale, scale);
    tc_store<DT>(dqkv + v_off, lqkv, dv, key0, T, hd, 1.0f, 1.0f);
    if (partial) { /* this key tile's column sums of dK and dV (fp32, before any rounding) */
        float *prow = partial + ((int64_t)b * n_t + kt) * lqkv + cq + (int64_t)kvh * hd;
        float *red = reinterpret_cast<float *>(steps); /* the loop's last barrier freed it */
        tc_colsum_store<HD>(prow, red, dk, hd, scale);
        __syncthreads(); /* red is read before it is written again */
        tc_colsum_store<HD>(prow + ckv, red, dv, hd, 1.0f);
    }
}

/* ---- backward: dQ ---------------------------------------------------------------------------- */

/* One key step of a warp's 16 query rows: S, dP, dS; dQ += dS·K. lr, dr: −lse·log2(e) and
 * the D of the lane's rows g and g + 8. MASK: a step that meets the diagonal (the keys past T are
 * there too); elsewhere every key of the step is at or before every row of the block. */
template <int HD, bool MASK>
static __device__ inline void tc_dq_step(float (&dq)[HD / 8][4], const bf16 *qs, const bf16 *dos,
                                         const bf16 *ks, const bf16 *vs, const float (&lr)[2],
                                         const float (&dr)[2], int j0, int row0, int T, float sl2) {
    constexpr int S = TC_STEP(HD), NT = S / 8;
    float s[NT][4], dp[NT][4];
    tc_score_pair<HD, NT>(s, dp, qs, dos, ks, vs);
    tc_dq_weights<NT, MASK>(s, dp, lr, dr, j0, row0, T, sl2);
    CT_UNROLL
    for (int kp = 0; kp < NT / 2; kp++) tc_acc_product<HD>(dq, dp[2 * kp], dp[2 * kp + 1], kp, ks);
}

template <int HD>
static __global__ void __launch_bounds__(TC_THREADS, TC_MINB(HD))
    tc_dq_kernel(bf16 *dqkv, float *partial, const bf16 *dout, const bf16 *qkv, const float *lse,
                 const float *D, int T, int n_head, int n_kv_head, int hd, float scale, bool vec) {
    constexpr int LD = HD + 8, S = TC_STEP(HD), DT = HD / 8;
    CT_DYN_SHARED(bf16, smem);
    /* K and V of key step js at kvs + (js & 1)·2·S·LD */
    bf16 *qs = smem, *dos = qs + TC_BM * LD, *kvs = dos + TC_BM * LD;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2;
    const int n_t = (int)gridDim.x, qt = n_t - 1 - (int)blockIdx.x; /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t q_off = (int64_t)b * T * lqkv + (int64_t)h * hd;
    const bf16 *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, *vh = kh + ckv;
    const int64_t lrow = ((int64_t)b * n_head + h) * T;
    const int q0 = qt * TC_BM, row0 = q0 + 16 * w; /* the warp's first query row */
    const float sl2 = scale * TC_LOG2E;

    tc_load_async<HD>(qs, qkv + q_off, lqkv, q0, TC_BM, T, hd, vec);
    tc_load_async<HD>(dos, dout + (int64_t)b * T * cq + (int64_t)h * hd, cq, q0, TC_BM, T, hd, vec);
    ct_cp_async_commit();
    tc_load_kv<HD, S>(kvs, kh, vh, lqkv, 0, T, hd, vec);
    float lr[2], dr[2]; /* −lse·log2(e) and D of the lane's rows g and g + 8 */
    CT_UNROLL
    for (int hh = 0; hh < 2; hh++) {
        const int row = row0 + g + 8 * hh;
        lr[hh] = row < T ? -lse[lrow + row] * TC_LOG2E : 0.0f;
        dr[hh] = row < T ? D[lrow + row] : 0.0f;
    }
    float dq[DT][4];
    CT_UNROLL
    for (int n = 0; n < DT; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    const int k_end = q0 + TC_BM < T ? q0 + TC_BM : T; /* keys past the tile's last row: none */
    const int n_steps = (k_end + S - 1) / S;
    for (int js = 0; js < n_steps; js++) {
        if (js + 1 < n_steps) { /* step js + 1 into the buffer step js − 1 left */
            tc_load_kv<HD, S>(kvs + ((js + 1) & 1) * 2 * S * LD, kh, vh, lqkv, (js + 1) * S, T, hd,
                              vec);
            ct_cp_async_wait<1>();
        } else {
            ct_cp_async_wait<0>();
        }
        __syncthreads(); /* step js (and Q, dO) have landed for every thread */
        const int j0 = js * S;
        if (j0 <= row0 + 15) { /* warp-uniform: else every key is after the warp's rows */
            const bf16 *ks = kvs + (js & 1) * 2 * S * LD, *vs = ks + S * LD;
            if (j0 + S > q0)
                tc_dq_step<HD, true>(dq, qs, dos, ks, vs, lr, dr, j0, row0, T, sl2);
            else
                tc_dq_step<HD, false>(dq, qs, dos, ks, vs, lr, dr, j0, row0, T, sl2);
        }
        __syncthreads(); /* step js's buffer is no longer read */
    }
    tc_store<DT>(dqkv + q_off, lqkv, dq, row0, T, hd, scale, scale);
    if (partial) /* this query tile's column sums of dQ (fp32, before any rounding); K and V,
                  * which red overlaps, are no longer read (the loop's last barrier) */
        tc_colsum_store<HD>(partial + ((int64_t)b * n_t + qt) * lqkv + (int64_t)h * hd,
                            reinterpret_cast<float *>(kvs), dq, hd, scale);
}

/* ---- Hopper: the same three kernels on wgmma (head width 64) ----------------------------------
 */

/* The wgmma kernels (cuda/ct_wgmma.cuh) for head width 64: the mma.sync kernels' algorithm, step
 * sizes and fragments, with the warpgroup's products as m64n64k16 instructions (4 k-steps each)
 * reading their operands from shared memory. A warp's accumulators are the mma.sync layout of its
 * 16 rows, so the softmax and dS code is the same (s[n][e] is d[4n + e]), and an accumulator pair
 * rounded by tc_acc_to_a is wgmma's A in registers. Every tile is 64 rows of 64 bf16 (128-byte
 * rows), stored row-major with the 128-byte swizzle (a row's 16-byte chunk c at c ^ (row % 8)) on
 * a 1024-byte boundary. One layout serves both ways a tile is read: K-major (the k of a score
 * product is the row's columns: SBO 1024 between 8-row atoms, the start stepped 32 bytes a k-step)
 * and MN-major (the k of an accumulating product is the rows: the start stepped 16 rows, 2048
 * bytes, a k-step; the 64 columns one atom wide, so LBO and SBO are both 1024, which reads the same
 * under either reading of the MN-major offsets, ct_wgmma.cuh). Not for head widths other than 64,
 * unaligned rows (the launcher checks) or GPUs before Hopper: the nvcc pass for any other
 * architecture compiles their bodies to a trap. Chosen by CT_CUDA_ATTENTION=wgmma (the launchers
 * below). */
#if defined(__CUDACC__) && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_NO_WGMMA 1 /* a device pass for an architecture without wgmma */
#endif

#define WG_TILE 8192u /* bytes of a 64 x 64 bf16 tile */

#ifndef WG_NO_WGMMA /* the helpers, where the kernels have bodies */

/* The byte of 16-byte chunk ch of row r in a swizzled tile. */
static __device__ inline uint32_t wg_chunk(int r, int ch) {
    return (uint32_t)r * 128u + ((uint32_t)(ch ^ (r & 7)) << 4);
}

/* Rows r0 .. r0 + 63 of a head slice (row stride ld) into a swizzled tile as 16-byte cp.async
 * copies (zeros past T), for the caller to commit. */
static __device__ inline void wg_load(unsigned char *tile, const bf16 *src, int64_t ld, int r0,
                                      int T) {
    for (int e = (int)threadIdx.x; e < 64 * 8; e += TC_THREADS) {
        const int r = e >> 3, ch = e & 7;
        const bool in = r0 + r < T;
        ct_cp_async<16>(tile + wg_chunk(r, ch), in ? src + (int64_t)(r0 + r) * ld + ch * 8 : src,
                        in);
    }
}

/* Descriptors of a swizzled tile at shared address a: read K-major at k-step kk (columns
 * 16kk ..), or MN-major at k-step kk (rows 16kk ..). */
static __device__ inline uint64_t wg_kmajor(uint32_t a, int kk) {
    return ct_wgmma_desc(a + 32u * (uint32_t)kk, 16, 1024, CT_WGMMA_SWIZZLE_128B);
}
static __device__ inline uint64_t wg_mnmajor(uint32_t a, int kk) {
    return ct_wgmma_desc(a + 2048u * (uint32_t)kk, 1024, 1024, CT_WGMMA_SWIZZLE_128B);
}

/* After a wait: the results in d may be read from here on (ct_wgmma_fence_operand). */
static __device__ inline void wg_pin(float (&d)[8][4]) {
    ct_wgmma_fence_operand(reinterpret_cast<float(&)[32]>(d));
}

/* The next step's tiles become this step's (the pipelined kernels' scores, once waited for). */
static __device__ inline void wg_move(float (&to)[8][4], const float (&from)[8][4]) {
    CT_UNROLL
    for (int n = 0; n < 8; n++) CT_UNROLL
    for (int e = 0; e < 4; e++) to[n][e] = from[n][e];
}

/* The block's dynamic shared memory from its first 1024-byte boundary: pointer and address. */
static __device__ inline unsigned char *wg_smem(uint32_t &addr) {
    CT_DYN_SHARED(unsigned char, raw);
    const uint32_t a = ct_smem_u32(raw), pad = (1024u - a % 1024u) % 1024u;
    addr = a + pad;
    return raw + pad;
}

/* d = a·bᵀ over the 64 columns of two K-major tiles (the warpgroup's 64 rows of a against 64 rows
 * of b), from zero; issued after a wgmma.fence (d's registers were read since its last product),
 * for the caller to commit. */
static __device__ inline void wg_scores(float (&d)[TC_BN / 8][4], uint32_t a, uint32_t b) {
    float(&f)[32] = reinterpret_cast<float(&)[32]>(d);
    ct_wgmma_fence();
    CT_UNROLL
    for (int kk = 0; kk < 4; kk++)
        ct_wgmma_m64n64k16_ss<0, 0>(f, wg_kmajor(a, kk), wg_kmajor(b, kk), kk);
}

/* acc += (the accumulator tiles of p, rounded to bf16) · the MN-major tile at b: O += P·V,
 * dV += Pᵀ·dO, dK += dSᵀ·Q, dQ += dS·K; for the caller to commit. The four A fragments are made
 * first (a wgmma in flight still reads its A registers, which a later fragment must not reuse),
 * then the wgmma.fence that orders those register writes (and acc's) before the products. */
static __device__ inline void wg_accumulate(float (&acc)[8][4], const float (&p)[8][4],
                                            uint32_t b) {
    float(&f)[32] = reinterpret_cast<float(&)[32]>(acc);
    uint32_t a[4][4];
    CT_UNROLL
    for (int kp = 0; kp < 4; kp++) tc_acc_to_a(a[kp], p[2 * kp], p[2 * kp + 1]);
    ct_wgmma_fence();
    CT_UNROLL
    for (int kp = 0; kp < 4; kp++) ct_wgmma_m64n64k16_rs<1>(f, a[kp], wg_mnmajor(b, kp), 1);
}

/* The wait at the top of a step: the step's copies landed (the next step's group, issued when
 * `next`, may still be in flight), made visible to wgmma's reads (the async proxy), then the
 * block's barrier. */
static __device__ inline void wg_landed(bool next) {
    if (next)
        ct_cp_async_wait<1>();
    else
        ct_cp_async_wait<0>();
    ct_fence_async_proxy();
    __syncthreads();
}

#endif /* WG_NO_WGMMA */

static constexpr size_t WG_FWD_SMEM = 1024 + 7 * WG_TILE;                /* Q, 3 x (K, V) */
static constexpr size_t WG_STEP = 2 * WG_TILE + 1024;                    /* Q, dO, lse, D */
static constexpr size_t WG_DKDV_SMEM = 1024 + 2 * WG_TILE + 2 * WG_STEP; /* K, V, 2 steps */
static constexpr size_t WG_DQ_SMEM = 1024 + 8 * WG_TILE;                 /* Q, dO, 3 x (K, V) */

/* The forward, pipelined within the warpgroup: while the products O += P·V of key tile kt run, the
 * scores of tile kt + 1 are already in flight, and the softmax of those overlaps the first
 * (wait<1> completes the scores, the older group; wait<0> O). So a step holds the weights P of
 * its tile (s) and the next tile's scores (sn), and O is rescaled to the next tile's maximum only
 * once its own products are done. The key and value tiles stream through three slots: tile kt + 2
 * is copied into the slot of tile kt − 1 during step kt, whose K and V were last read by products
 * waited for before step kt's barrier. The last tile's step is peeled off the loop: with the
 * scores issued under a condition, ptxas (CUDA 13) cannot tell which group wait<1> completes, and
 * it serializes every wgmma of the kernel (its C7514 "Potential Performance Loss" note). */
static __global__ void __launch_bounds__(TC_THREADS, 2)
    wg_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv, int T, int n_head, int n_kv_head,
                  float scale) {
#ifdef WG_NO_WGMMA
    __trap();
#else
    constexpr int hd = 64;
    uint32_t sa;
    unsigned char *sm = wg_smem(sa); /* Q, then K and V of tile kt at 1 + 2·(kt % 3) tiles on */
    const int w = threadIdx.x >> 5;
    const int qt = (int)(gridDim.x - 1 - blockIdx.x);
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const bf16 *qh = qkv + (int64_t)b * T * lqkv + (int64_t)h * hd;
    const bf16 *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, *vh = kh + ckv;
    const int q0 = qt * TC_BM, row0 = q0 + 16 * w;
    const float sl2 = scale * TC_LOG2E;
    auto slot = [&](int kt) { return (uint32_t)(kt % 3) * 2u * WG_TILE + WG_TILE; };
    auto load_tile = [&](int kt) {
        if (kt <= qt) {
            wg_load(sm + slot(kt), kh, lqkv, kt * TC_BN, T);
            wg_load(sm + slot(kt) + WG_TILE, vh, lqkv, kt * TC_BN, T);
        }
        ct_cp_async_commit();
    };

    wg_load(sm, qh, lqkv, q0, T);
    load_tile(0); /* one group: Q and tile 0 */
    load_tile(1);
    wg_landed(true);
    float o[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, s[8][4], sn[8][4], al[2];
    /* the softmax step of tile kt's scores; the diagonal tile masks */
    auto softmax = [&](float(&sc)[8][4], int kt) {
        if (kt == qt)
            tc_softmax_step<8, true>(sc, m, l, al, kt * TC_BN, row0, T, sl2);
        else
            tc_softmax_step<8, false>(sc, m, l, al, kt * TC_BN, row0, T, sl2);
    };
    CT_UNROLL
    for (int n = 0; n < 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    wg_scores(s, sa, sa + slot(0));
    ct_wgmma_commit();
    ct_wgmma_wait<0>();
    wg_pin(s);
    softmax(s, 0);
    for (int kt = 0; kt < qt; kt++) { /* s: the weights of tile kt; O: rescaled to its max */
        wg_landed(false);             /* tile kt + 1 (every earlier product waited for) */
        load_tile(kt + 2);
        wg_scores(sn, sa, sa + slot(kt + 1));
        ct_wgmma_commit();
        wg_accumulate(o, s, sa + slot(kt) + WG_TILE);
        ct_wgmma_commit();
        ct_wgmma_wait<1>(); /* the scores */
        wg_pin(sn);
        softmax(sn, kt + 1);
        ct_wgmma_wait<0>(); /* O */
        wg_pin(o);
        tc_rescale<8>(o, al);
        wg_move(s, sn);
    }
    wg_landed(false); /* the last tile, qt: its products alone */
    wg_accumulate(o, s, sa + slot(qt) + WG_TILE);
    ct_wgmma_commit();
    ct_wgmma_wait<0>();
    wg_pin(o);
    tc_fwd_finish<8>(out + (int64_t)b * T * cq + (int64_t)h * hd, cq,
                     lse + ((int64_t)b * n_head + h) * T, o, m, l, row0, T, hd, scale);
#endif
}

static __global__ void __launch_bounds__(TC_THREADS, 2)
    wg_dkdv_kernel(bf16 *dqkv, float *partial, const bf16 *dout, const bf16 *qkv, const float *lse,
                   const float *D, int T, int n_head, int n_kv_head, float scale) {
#ifdef WG_NO_WGMMA
    __trap();
#else
    constexpr int hd = 64, S = 64;
    uint32_t sa;
    unsigned char *sm = wg_smem(sa); /* K, V, then two step buffers of Q, dO, lse, D */
    const int w = threadIdx.x >> 5;
    const int n_t = (int)gridDim.x, kt = (int)blockIdx.x;
    const int kvh = blockIdx.y, b = blockIdx.z, group = n_head / n_kv_head;
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t k_off = (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, v_off = k_off + ckv;
    const int k0 = kt * TC_BM, key0 = k0 + 16 * w;
    const float sl2 = scale * TC_LOG2E;
    const int n_i = (T - k0 + S - 1) / S, n_steps = group * n_i;
    auto step = [&](int st) { return sm + 2 * WG_TILE + (size_t)(st & 1) * WG_STEP; };
    auto load_step = [&](int st) {
        const int h = kvh * group + st / n_i, i0 = k0 + st % n_i * S;
        const int64_t lrow = ((int64_t)b * n_head + h) * T;
        unsigned char *buf = step(st);
        wg_load(buf, qkv + (int64_t)b * T * lqkv + (int64_t)h * hd, lqkv, i0, T);
        wg_load(buf + WG_TILE, dout + (int64_t)b * T * cq + (int64_t)h * hd, cq, i0, T);
        tc_load_rows_async(reinterpret_cast<float *>(buf + 2 * WG_TILE), lse + lrow, i0, S, T);
        tc_load_rows_async(reinterpret_cast<float *>(buf + 2 * WG_TILE) + S, D + lrow, i0, S, T);
        ct_cp_async_commit();
    };
    wg_load(sm, qkv + k_off, lqkv, k0, T);
    wg_load(sm + WG_TILE, qkv + v_off, lqkv, k0, T);
    ct_cp_async_commit();
    load_step(0);
    float dk[8][4], dv[8][4], s[8][4], dp[8][4];
    CT_UNROLL
    for (int n = 0; n < 8; n++) CT_UNROLL
    for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    for (int st = 0; st < n_steps; st++) {
        if (st + 1 < n_steps) load_step(st + 1);
        wg_landed(st + 1 < n_steps);
        const int i0 = k0 + st % n_i * S;
        const uint32_t qa = sa + 2 * WG_TILE + (uint32_t)(st & 1) * (uint32_t)WG_STEP;
        const uint32_t doa = qa + WG_TILE;
        const float *ls = reinterpret_cast<const float *>(step(st) + 2 * WG_TILE), *Ds = ls + S;
        wg_scores(s, sa, qa); /* Sᵀ = K·Qᵀ */
        ct_wgmma_commit();
        wg_scores(dp, sa + WG_TILE, doa); /* dPᵀ = V·dOᵀ, while Pᵀ is made */
        ct_wgmma_commit();
        ct_wgmma_wait<1>();
        wg_pin(s);
        if (i0 < k0 + TC_BM || i0 + S > T)
            tc_dkdv_p<8, true>(s, ls, i0, key0, T, sl2);
        else
            tc_dkdv_p<8, false>(s, ls, i0, key0, T, sl2);
        wg_accumulate(dv, s, doa); /* dV += Pᵀ·dO, while dSᵀ is made */
        ct_wgmma_commit();
        ct_wgmma_wait<1>();
        wg_pin(dp);
        tc_dkdv_ds<8>(s, dp, Ds);
        wg_accumulate(dk, dp, qa); /* dK += dSᵀ·Q */
        ct_wgmma_commit();
        ct_wgmma_wait<0>();
        wg_pin(dv);
        wg_pin(dk);
        __syncthreads();
    }
    tc_store<8>(dqkv + k_off, lqkv, dk, key0, T, hd, scale, scale);
    tc_store<8>(dqkv + v_off, lqkv, dv, key0, T, hd, 1.0f, 1.0f);
    if (partial) {
        float *prow = partial + ((int64_t)b * n_t + kt) * lqkv + cq + (int64_t)kvh * hd;
        float *red = reinterpret_cast<float *>(step(0));
        tc_colsum_store<64>(prow, red, dk, hd, scale);
        __syncthreads();
        tc_colsum_store<64>(prow + ckv, red, dv, hd, 1.0f);
    }
#endif
}

/* dQ, pipelined as the forward: step js + 1's scores S and dP (and then its weights) overlap
 * step js's dQ += dS·K, and K and V stream through three slots, the last step peeled off. */
static __global__ void __launch_bounds__(TC_THREADS, 2)
    wg_dq_kernel(bf16 *dqkv, float *partial, const bf16 *dout, const bf16 *qkv, const float *lse,
                 const float *D, int T, int n_head, int n_kv_head, float scale) {
#ifdef WG_NO_WGMMA
    __trap();
#else
    constexpr int hd = 64, S = 64;
    uint32_t sa;
    unsigned char *sm = wg_smem(sa); /* Q, dO, then K and V of step js at 2 + 2·(js % 3) tiles */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2;
    const int n_t = (int)gridDim.x, qt = n_t - 1 - (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t q_off = (int64_t)b * T * lqkv + (int64_t)h * hd;
    const bf16 *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, *vh = kh + ckv;
    const int64_t lrow = ((int64_t)b * n_head + h) * T;
    const int q0 = qt * TC_BM, row0 = q0 + 16 * w;
    const float sl2 = scale * TC_LOG2E;
    const int k_end = q0 + TC_BM < T ? q0 + TC_BM : T;
    const int n_steps = (k_end + S - 1) / S;
    float lr[2], dr[2];
    CT_UNROLL
    for (int hh = 0; hh < 2; hh++) {
        const int row = row0 + g + 8 * hh;
        lr[hh] = row < T ? -lse[lrow + row] * TC_LOG2E : 0.0f;
        dr[hh] = row < T ? D[lrow + row] : 0.0f;
    }

    auto slot = [&](int js) { return (uint32_t)(js % 3) * 2u * WG_TILE + 2u * WG_TILE; };
    auto load_step = [&](int js) {
        if (js < n_steps) {
            wg_load(sm + slot(js), kh, lqkv, js * S, T);
            wg_load(sm + slot(js) + WG_TILE, vh, lqkv, js * S, T);
        }
        ct_cp_async_commit();
    };
    auto weights = [&](float(&s_)[8][4], float(&dp_)[8][4], int js) {
        if (js * S + S > q0)
            tc_dq_weights<8, true>(s_, dp_, lr, dr, js * S, row0, T, sl2);
        else
            tc_dq_weights<8, false>(s_, dp_, lr, dr, js * S, row0, T, sl2);
    };
    /* S = Q·Kᵀ and dP = dO·Vᵀ of step js, for the caller to commit */
    auto scores = [&](float(&s_)[8][4], float(&dp_)[8][4], int js) {
        wg_scores(s_, sa, sa + slot(js));
        wg_scores(dp_, sa + WG_TILE, sa + slot(js) + WG_TILE);
    };

    wg_load(sm, qkv + q_off, lqkv, q0, T);
    wg_load(sm + WG_TILE, dout + (int64_t)b * T * cq + (int64_t)h * hd, cq, q0, T);
    load_step(0); /* one group: Q, dO and step 0 */
    load_step(1);
    float dq[8][4], s[8][4], dp[8][4], s2[8][4], dp2[8][4];
    CT_UNROLL
    for (int n = 0; n < 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    wg_landed(true);
    scores(s, dp, 0);
    ct_wgmma_commit();
    ct_wgmma_wait<0>();
    wg_pin(s);
    wg_pin(dp);
    weights(s, dp, 0);
    for (int js = 0; js + 1 < n_steps; js++) { /* dp: dS of step js */
        wg_landed(false);                      /* step js + 1 (every earlier product waited for) */
        load_step(js + 2);
        scores(s2, dp2, js + 1);
        ct_wgmma_commit();
        wg_accumulate(dq, dp, sa + slot(js)); /* dQ += dS·K */
        ct_wgmma_commit();
        ct_wgmma_wait<1>(); /* the scores */
        wg_pin(s2);
        wg_pin(dp2);
        weights(s2, dp2, js + 1);
        ct_wgmma_wait<0>(); /* dQ */
        wg_pin(dq);
        wg_move(dp, dp2);
    }
    wg_landed(false); /* the last step's products alone */
    wg_accumulate(dq, dp, sa + slot(n_steps - 1));
    ct_wgmma_commit();
    ct_wgmma_wait<0>();
    wg_pin(dq);
    tc_store<8>(dqkv + q_off, lqkv, dq, row0, T, hd, scale, scale);
    if (partial)
        tc_colsum_store<64>(partial + ((int64_t)b * n_t + qt) * lqkv + (int64_t)h * hd,
                            reinterpret_cast<float *>(sm + 2 * WG_TILE), dq, hd, scale);
#endif
}

/* The wgmma kernels apply: asked for, head width 64, 16-byte rows, a Hopper GPU. */
static bool wg_applies(const ct_cuda_ctx *cx, int64_t hd, bool vec) {
    return ct_cuda_wgmma_attention_asked() && hd == 64 && vec && ct_cuda_cc_major(cx) == 9;
}

/* ---- launchers ------------------------------------------------------------------------------- */

/* 16-byte loads when every row of every slice starts on a 16-byte boundary. */
static bool tc_vec_ok(int64_t hd, int64_t ld_a, int64_t ld_b, const void *p, const void *q) {
    return hd % 8 == 0 && ld_a % 8 == 0 && ld_b % 8 == 0 && (uintptr_t)p % 16 == 0 &&
           (uintptr_t)q % 16 == 0;
}

template <int HD>
static void tc_fwd(ct_cuda_ctx *cx, void *out, float *lse, const void *qkv, int64_t B, int64_t T,
                   int64_t n_head, int64_t n_kv_head, int64_t hd) {
    const size_t smem = tc_fwd_smem<HD>();
    const int64_t lqkv = (n_head + 2 * n_kv_head) * hd;
    const bool vec = tc_vec_ok(hd, lqkv, lqkv, qkv, qkv);
    dim3 grid((unsigned)((T + TC_BM - 1) / TC_BM), (unsigned)n_head, (unsigned)B);
    if (wg_applies(cx, hd, vec)) {
        ct_launch_allow_smem(wg_fwd_kernel, WG_FWD_SMEM);
        ct_launch(wg_fwd_kernel, grid, dim3(TC_THREADS), WG_FWD_SMEM, ct_cuda_stream(cx),
                  (bf16 *)out, lse, (const bf16 *)qkv, (int)T, (int)n_head, (int)n_kv_head,
                  1.0f / sqrtf((float)hd));
        CT_CUDA_CHECK(cudaGetLastError());
        return;
    }
    ct_launch_allow_smem(tc_fwd_kernel<HD>, smem);
    ct_launch(tc_fwd_kernel<HD>, grid, dim3(TC_THREADS), smem, ct_cuda_stream(cx), (bf16 *)out, lse,
              (const bf16 *)qkv, (int)T, (int)n_head, (int)n_kv_head, (int)hd,
              1.0f / sqrtf((float)hd), vec);
    CT_CUDA_CHECK(cudaGetLastError());
}

template <int HD>
static void tc_bwd(ct_cuda_ctx *cx, void *dqkv, float *dbias, const void *dout, const void *qkv,
                   const void *out, const float *lse, int64_t B, int64_t T, int64_t n_head,
                   int64_t n_kv_head, int64_t hd) {
    cudaStream_t st = ct_cuda_stream(cx);
    const int64_t n_rows = B * n_head * T, n_t = (T + TC_BM - 1) / TC_BM;
    const int64_t lqkv = (n_head + 2 * n_kv_head) * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const bool vec = tc_vec_ok(hd, lqkv, n_head * hd, qkv, dout);
    float *D = (float *)ct_cuda_workspace(cx, 0, (size_t)n_rows * sizeof(float));
    float *partial =
        dbias ? (float *)ct_cuda_workspace(cx, 1, (size_t)(B * n_t * lqkv) * sizeof(float)) : NULL;

    ct_cuda_attention_rowdot(cx, CT_DTYPE_BF16, D, dout, out, B, T, n_head, hd);

    if (wg_applies(cx, hd, vec)) {
        ct_launch_allow_smem(wg_dkdv_kernel, WG_DKDV_SMEM);
        ct_launch(wg_dkdv_kernel, dim3((unsigned)n_t, (unsigned)n_kv_head, (unsigned)B),
                  dim3(TC_THREADS), WG_DKDV_SMEM, st, (bf16 *)dqkv, partial, (const bf16 *)dout,
                  (const bf16 *)qkv, lse, (const float *)D, (int)T, (int)n_head, (int)n_kv_head,
                  scale);
        CT_CUDA_CHECK(cudaGetLastError());
        ct_launch_allow_smem(wg_dq_kernel, WG_DQ_SMEM);
        ct_launch(wg_dq_kernel, dim3((unsigned)n_t, (unsigned)n_head, (unsigned)B),
                  dim3(TC_THREADS), WG_DQ_SMEM, st, (bf16 *)dqkv, partial, (const bf16 *)dout,
                  (const bf16 *)qkv, lse, (const float *)D, (int)T, (int)n_head, (int)n_kv_head,
                  scale);
        CT_CUDA_CHECK(cudaGetLastError());
        if (dbias) ct_cuda_colsum_add(cx, dbias, partial, B * n_t, lqkv, lqkv);
        return;
    }
    ct_launch_allow_smem(tc_dkdv_kernel<HD>, tc_dkdv_smem<HD>());
    ct_launch(tc_dkdv_kernel<HD>, dim3((unsigned)n_t, (unsigned)n_kv_head, (unsigned)B),
              dim3(TC_THREADS), tc_dkdv_smem<HD>(), st, (bf16 *)dqkv, partial, (const bf16 *)dout,
              (const bf16 *)qkv, lse, (const float *)D, (int)T, (int)n_head, (int)n_kv_head,
              (int)hd, scale, vec);
    CT_CUDA_CHECK(cudaGetLastError());

    ct_launch_allow_smem(tc_dq_kernel<HD>, tc_dq_smem<HD>());
    ct_launch(tc_dq_kernel<HD>, dim3((unsigned)n_t, (unsigned)n_head, (unsigned)B),
              dim3(TC_THREADS), tc_dq_smem<HD>(), st, (bf16 *)dqkv, partial, (const bf16 *)dout,
              (const bf16 *)qkv, lse, (const float *)D, (int)T, (int)n_head, (int)n_kv_head,
              (int)hd, scale, vec);
    CT_CUDA_CHECK(cudaGetLastError());

    if (dbias) ct_cuda_colsum_add(cx, dbias, partial, B * n_t, lqkv, lqkv);
}

void ct_cuda_attention_fwd_tc(ct_cuda_ctx *cx, void *out, float *lse, const void *qkv, int64_t B,
                              int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    if (hd <= 32)
        tc_fwd<32>(cx, out, lse, qkv, B, T, n_head, n_kv_head, hd);
    else if (hd <= 64)
        tc_fwd<64>(cx, out, lse, qkv, B, T, n_head, n_kv_head, hd);
    else
        tc_fwd<128>(cx, out, lse, qkv, B, T, n_head, n_kv_head, hd);
}

void ct_cuda_attention_bwd_tc(ct_cuda_ctx *cx, void *dqkv, float *dbias, const void *dout,
                              const void *qkv, const void *out, const float *lse, int64_t B,
                              int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    if (hd <= 32)
        tc_bwd<32>(cx, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head, hd);
    else if (hd <= 64)
        tc_bwd<64>(cx, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head, hd);
    else
        tc_bwd<128>(cx, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head, hd);
}
