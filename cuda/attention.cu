/*
 * attention.cu — causal self-attention, forward and backward (the slots attention_fwd,
 * attention_bwd), FlashAttention-2 style in plain CUDA: the fp32 path (fp32 operands and
 * arithmetic, no tensor cores). bf16 runs on tensor cores (attention_tc.cu), which shares this
 * file's D = rowsum(dO ⊙ O) kernel. The float formulas are those of the CPU reference
 * (core/backend/cpu/attention.c): s = scale·(q·k) with scale = 1/sqrt(hd), p = exp(s − max) / sum,
 * out = (Σ p̃·v)·(1/sum), lse = max + log(sum); backward dP = dO·Vᵀ, D = rowsum(dO ⊙ O),
 * dS = P ⊙ (dP − D), dV = Pᵀ·dO, dQ = scale·dS·K, dK = scale·dSᵀ·Q. What differs is the
 * summation order (online softmax rescaling, tiles) and expf (at most 2 ulp on a GPU): test
 * tolerances. The file ends with one decoding step against a key/value cache (the slot
 * attention_decode, f32 and bf16: "Decoding" below).
 *
 * Tiles: the register tiles of cuda/attention_tile.cuh (64 query rows × 64 keys, 256 threads, 16
 * scores and 4 rows × HD/16 accumulators a thread; explained there), shared with ring attention's
 * step. Rows past T (the last tile's tail) are loaded as zeros and masked: global memory is never
 * read past row T − 1 or column head_dim − 1.
 *
 * Kernels (grid; dynamic shared memory for HD = 32 / 64 / 128, those above 48 KiB after
 * cudaFuncSetAttribute; no static shared memory but the decoding kernel's):
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
 *
 * Decoding (attention_decode; the CPU reference ct_cpu_attention_decode: scores scale·(q·k_j) for
 * j = 0..pos, their max, weights exp(s − max), out = (Σ_j w_j·v_j)·(1/Σ_j w_j), fp32; f32 and bf16
 * storage, no tensor cores):
 *   attn_decode_store_kernel  (ct_launch_rows over B × 2·n_kv_head·hd): each sequence's key and
 *                         value heads, copied word for word into cache row pos.
 *   attn_decode_kernel    (n_head, B), 256 threads, after the copy on the same stream: keys 0..pos
 *                         in tiles of 64 (scores by warp shuffles, online softmax with the running
 *                         max, w·v by ng = 256 / hd thread groups over interleaved keys, added in
 *                         group order at the end), so any pos < T_max fits; hd ≤ 256. 1536
 *                         bytes of static shared memory. Differs from the CPU by summation
 *                         order, the rescales and expf.
 * No float atomics: every sum runs in an order fixed by the shapes, so reruns give the same bits.
 *
 * Registers: a thread keeps 16 scores (32 in dQ: S and dP) and 4 rows × HD/16
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
#include "cuda/ct_cuda_ctx.h"
#include "cuda/attention_tc.cuh"

#include "cuda/attention_tile.cuh"
#include "cuda/elementwise.cuh"
#include "cuda/launch.cuh"

#define ATT_DOT_WARPS 8 /* rows per block of attn_bwd_dot_kernel */

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

/* acc *= mul */
template <int HD>
static __device__ inline void af_scale(float (&acc)[AF_RM][af_shape<HD>::NH], float mul) {
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) CT_UNROLL
    for (int n = 0; n < af_shape<HD>::NH; n++) acc[a][n] *= mul;
}

/* ---- forward --------------------------------------------------------------------------------- */

template <int HD>
static __global__ void __launch_bounds__(AF_THREADS, AF_MINB(HD))
    attn_fwd_kernel(float *out, float *lse, const float *qkv, int T, int n_head, int n_kv_head,
                    int hd, float scale, bool vec) {
    CT_DYN_SHARED(float, smem);                       /* af_fwd_smem: the query tile first */
    const int qt = (int)(gridDim.x - 1 - blockIdx.x); /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const float *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd;
    const int q0 = qt * AF_TILE;

    af_load_tile<float, HD>(smem, qkv + (int64_t)b * T * lqkv + (int64_t)h * hd, lqkv, q0, T, hd,
                            vec);
    af_fwd_rows<HD> st;
    st.start();
    for (int kt = 0; kt <= qt; kt++) /* tiles past the diagonal are fully masked */
        af_fwd_tile<float, HD>(st, smem, kh, kh + ckv, lqkv, kt * AF_TILE, T, q0, true, hd, scale,
                               vec);
    const int64_t lse_row = ((int64_t)b * n_head + h) * T;
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) {
        const float sum = af_row_sum(st.l[a]);
        const int i = q0 + af_ty() + a * AF_TY;
        if (i < T && af_tx() == 0) lse[lse_row + i] = st.m[a] + logf(sum);
        const float inv = 1.0f / sum;
        CT_UNROLL
        for (int n = 0; n < af_shape<HD>::NH; n++) st.o[a][n] *= inv;
    }
    af_store_rows<HD>(out + (int64_t)b * T * cq + (int64_t)h * hd, cq, st.o, q0, T, hd, 1.0f,
                      false);
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

template <int HD>
static __global__ void __launch_bounds__(AF_THREADS, AF_MINB_DKDV(HD))
    attn_bwd_dkdv_kernel(float *dqkv, float *partial, const float *dout, const float *qkv,
                         const float *lse, const float *D, int T, int n_head, int n_kv_head, int hd,
                         float scale, bool vec) {
    constexpr int LD = af_shape<HD>::LD, NH = af_shape<HD>::NH;
    CT_DYN_SHARED(float, smem);                      /* af_dkdv_smem: K and V first */
    const int n_t = (int)gridDim.x, kt = blockIdx.x; /* key tile 0 meets the most query tiles */
    const int kvh = blockIdx.y, b = blockIdx.z, group = n_head / n_kv_head;
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t k_off = (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd, v_off = k_off + ckv;
    const int k0 = kt * AF_TILE;

    af_load_tile<float, HD>(smem, qkv + k_off, lqkv, k0, T, hd, vec);
    af_load_tile<float, HD>(smem + AF_TILE * LD, qkv + v_off, lqkv, k0, T, hd, vec);
    float dk[AF_RM][NH], dv[AF_RM][NH];
    af_zero<HD>(dk);
    af_zero<HD>(dv);
    for (int g = 0; g < group; g++) {
        const int h = kvh * group + g;
        const int64_t lrow = ((int64_t)b * n_head + h) * T;
        for (int qt = kt; qt < n_t; qt++)
            af_dkdv_tile<float, HD>(dk, dv, smem, qkv + (int64_t)b * T * lqkv + (int64_t)h * hd,
                                    lqkv, dout + (int64_t)b * T * cq + (int64_t)h * hd, cq,
                                    lse + lrow, D + lrow, qt * AF_TILE, T, k0, T, true, hd, scale,
                                    vec);
    }
    af_scale<HD>(dk, scale);
    af_store_rows<HD>(dqkv + k_off, lqkv, dk, k0, T, hd, 1.0f, false);
    af_store_rows<HD>(dqkv + v_off, lqkv, dv, k0, T, hd, 1.0f, false);
    if (partial) { /* this key tile's column sums of dK and dV (fp32) */
        float *prow = partial + ((int64_t)b * n_t + kt) * lqkv + cq + (int64_t)kvh * hd;
        float *red = smem + 4 * AF_TILE * LD; /* dSᵀ */
        const int n_rows = T - k0 < AF_TILE ? T - k0 : AF_TILE;
        __syncthreads(); /* dSᵀ, which red overlaps, is no longer read */
        af_colsum_store<HD>(prow, red, dk, n_rows, hd);
        af_colsum_store<HD>(prow + ckv, red + AF_TY * HD, dv, n_rows, hd);
    }
}

template <int HD>
static __global__ void __launch_bounds__(AF_THREADS, AF_MINB(HD))
    attn_bwd_dq_kernel(float *dqkv, float *partial, const float *dout, const float *qkv,
                       const float *lse, const float *D, int T, int n_head, int n_kv_head, int hd,
                       float scale, bool vec) {
    constexpr int LD = af_shape<HD>::LD, NH = af_shape<HD>::NH;
    CT_DYN_SHARED(float, smem); /* af_dq_smem: Q, dO, K, V, dS, lse, D */
    float *ls = af_dq_rows<HD>(smem);
    const int n_t = (int)gridDim.x, qt = n_t - 1 - (int)blockIdx.x; /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (n_head / n_kv_head);
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t q_off = (int64_t)b * T * lqkv + (int64_t)h * hd;
    const float *kh = qkv + (int64_t)b * T * lqkv + cq + (int64_t)kvh * hd;
    const int64_t lrow = ((int64_t)b * n_head + h) * T;
    const int q0 = qt * AF_TILE;

    af_load_tile<float, HD>(smem, qkv + q_off, lqkv, q0, T, hd, vec);
    af_load_tile<float, HD>(smem + AF_TILE * LD, dout + (int64_t)b * T * cq + (int64_t)h * hd, cq,
                            q0, T, hd, vec);
    af_load_rows(ls, lse + lrow, q0, T);
    af_load_rows(ls + AF_TILE, D + lrow, q0, T);
    float dq[AF_RM][NH];
    af_zero<HD>(dq);
    for (int kt = 0; kt <= qt; kt++)
        af_dq_tile<float, HD>(dq, smem, kh, kh + ckv, lqkv, q0, T, kt * AF_TILE, T, true, hd, scale,
                              vec);
    af_scale<HD>(dq, scale);
    af_store_rows<HD>(dqkv + q_off, lqkv, dq, q0, T, hd, 1.0f, false);
    if (partial) { /* this query tile's column sums of dQ (fp32) */
        const int n_rows = T - q0 < AF_TILE ? T - q0 : AF_TILE;
        __syncthreads(); /* dS, which red overlaps, is no longer read */
        af_colsum_store<HD>(partial + ((int64_t)b * n_t + qt) * lqkv + (int64_t)h * hd,
                            smem + 4 * AF_TILE * LD, dq, n_rows, hd);
    }
}

/* ---- launchers ------------------------------------------------------------------------------- */

template <typename S, int HD>
static void att_fwd(ct_cuda_ctx *cx, void *out, float *lse, const void *qkv, int64_t B, int64_t T,
                    int64_t n_head, int64_t n_kv_head, int64_t hd) {
    const size_t smem = af_fwd_smem<HD>();
    const int64_t lqkv = (n_head + 2 * n_kv_head) * hd;
    ct_launch_allow_smem(attn_fwd_kernel<HD>, smem);
    dim3 grid((unsigned)((T + AF_TILE - 1) / AF_TILE), (unsigned)n_head, (unsigned)B);
    ct_launch(attn_fwd_kernel<HD>, grid, dim3(AF_THREADS), smem, ct_cuda_stream(cx), (float *)out,
              lse, (const float *)qkv, (int)T, (int)n_head, (int)n_kv_head, (int)hd,
              1.0f / sqrtf((float)hd), af_vec_ok<S>(qkv, lqkv, hd));
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
    const bool vec = af_vec_ok<S>(qkv, lqkv, hd) && af_vec_ok<S>(dout, n_head * hd, hd);
    float *D = (float *)ct_cuda_workspace(cx, 0, (size_t)n_rows * sizeof(float));
    float *partial =
        dbias ? (float *)ct_cuda_workspace(cx, 1, (size_t)(B * n_t * lqkv) * sizeof(float)) : NULL;

    ct_cuda_attention_rowdot(cx, CT_DTYPE_F32, D, dout, out, B, T, n_head, hd);

    const size_t smem_kv = af_dkdv_smem<HD>();
    ct_launch_allow_smem(attn_bwd_dkdv_kernel<HD>, smem_kv);
    ct_launch(attn_bwd_dkdv_kernel<HD>, dim3((unsigned)n_t, (unsigned)n_kv_head, (unsigned)B),
              dim3(AF_THREADS), smem_kv, st, (S *)dqkv, partial, (const S *)dout, (const S *)qkv,
              lse, (const float *)D, (int)T, (int)n_head, (int)n_kv_head, (int)hd, scale, vec);
    CT_CUDA_CHECK(cudaGetLastError());

    const size_t smem_q = af_dq_smem<HD>();
    ct_launch_allow_smem(attn_bwd_dq_kernel<HD>, smem_q);
    ct_launch(attn_bwd_dq_kernel<HD>, dim3((unsigned)n_t, (unsigned)n_head, (unsigned)B),
              dim3(AF_THREADS), smem_q, st, (S *)dqkv, partial, (const S *)dout, (const S *)qkv,
              lse, (const float *)D, (int)T, (int)n_head, (int)n_kv_head, (int)hd, scale, vec);
    CT_CUDA_CHECK(cudaGetLastError());

    if (dbias) ct_cuda_colsum_add(cx, dbias, partial, B * n_t, lqkv, lqkv);
}

extern "C" void ct_cuda_attention_fwd(void *ctx, ct_dtype dt, void *out, float *lse,
                                      const void *qkv, int64_t B, int64_t T, int64_t n_head,
                                      int64_t n_kv_head, int64_t head_dim) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "attention_fwd dtype %d", (int)dt);
    if (B <= 0 || T <= 0 || n_head <= 0) return;
    att_check_dims("attention_fwd", B, T, n_head, n_kv_head, head_dim);
    if (dt == CT_DTYPE_BF16)
        ct_cuda_attention_fwd_tc(cx, out, lse, qkv, B, T, n_head, n_kv_head, head_dim);
    else
        ATT_HD_DISPATCH(att_fwd, float, head_dim, cx, out, lse, qkv, B, T, n_head, n_kv_head,
                        head_dim);
}

extern "C" void ct_cuda_attention_bwd(void *ctx, ct_dtype dt, void *dqkv, float *dbias,
                                      const void *dout, const void *qkv, const void *out,
                                      const float *lse, int64_t B, int64_t T, int64_t n_head,
                                      int64_t n_kv_head, int64_t head_dim) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
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

/* ---- decoding: one position against the key/value cache -------------------------------------- */

#define ATT_DEC_THREADS 256 /* 8 warps a (sequence, query head) */
#define ATT_DEC_KEYS 64     /* keys a tile: 8 a warp */
#define ATT_DEC_MAX_HD 256
#define ATT_DEC_QR (ATT_DEC_MAX_HD / 32) /* query elements a lane holds */

/* Row pos of each sequence's cache from the key and value heads of its qkv row: lkv words (W the
 * storage dtype's bits, so the copy is exact), sequences by y and columns by x, grid-stride. */
template <typename W>
static __global__ void attn_decode_store_kernel(W *kv, const W *qkv, int64_t B, int64_t T_max,
                                                int64_t pos, int64_t cq, int64_t lkv) {
    for (int64_t b = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; b < B;
         b += (int64_t)gridDim.y * blockDim.y) {
        W *dst = kv + (b * T_max + pos) * lkv;
        const W *src = qkv + b * (cq + lkv) + cq;
        for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < lkv;
             c += (int64_t)gridDim.x * blockDim.x)
            dst[c] = src[c];
    }
}

/* Block (h, b): query head h of sequence b against its cache rows 0..n-1 (kv head h / group), in
 * tiles of ATT_DEC_KEYS keys. Per tile: warp w scores keys w, w + 8, ... (lane l multiplies
 * elements l, l + 32, ..., ct_warp_sum adds the lanes), the tile's max m' (every warp, exactly),
 * the weights exp(s − m) with m the running max, their sum (every warp the same tree), and
 * thread (g, d) of the ng = 256 / hd groups adds w_j·v_jd over the tile's keys j ≡ g (mod ng) in
 * order; the running sum and the accumulators are rescaled by exp(m_old − m) when the max grows.
 * At the end the ng accumulators of column d are added in group order and times 1/sum. */
template <typename T>
static __global__ void __launch_bounds__(ATT_DEC_THREADS)
    attn_decode_kernel(T *out, const T *kv, const T *qkv, int64_t T_max, int n, int n_head,
                       int n_kv_head, int hd, float scale) {
    CT_SHARED(float, sc, ATT_DEC_KEYS);     /* the tile's scores */
    CT_SHARED(float, wt, ATT_DEC_KEYS);     /* their weights */
    CT_SHARED(float, red, ATT_DEC_THREADS); /* the groups' accumulators, at the end */
    const int h = blockIdx.x, b = blockIdx.y, kvh = h / (n_head / n_kv_head);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t cq = (int64_t)n_head * hd, ckv = (int64_t)n_kv_head * hd, lkv = 2 * ckv;
    const T *kh = kv + (int64_t)b * T_max * lkv + (int64_t)kvh * hd, *vh = kh + ckv;
    const T *qh = qkv + (int64_t)b * (cq + lkv) + (int64_t)h * hd;
    float qr[ATT_DEC_QR];
    CT_UNROLL
    for (int i = 0; i < ATT_DEC_QR; i++)
        qr[i] = lane + 32 * i < hd ? ct_to_f32(qh[lane + 32 * i]) : 0.0f;
    const int ng = ATT_DEC_THREADS / hd, g = threadIdx.x / hd, d = threadIdx.x % hd;
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int j0 = 0; j0 < n; j0 += ATT_DEC_KEYS) {
        const int nt = n - j0 < ATT_DEC_KEYS ? n - j0 : ATT_DEC_KEYS;
        for (int jj = warp; jj < nt; jj += ATT_DEC_THREADS / 32) {
            const T *k = kh + (int64_t)(j0 + jj) * lkv;
            float s = 0.0f;
            CT_UNROLL
            for (int i = 0; i < ATT_DEC_QR; i++)
                if (lane + 32 * i < hd) s = fmaf(qr[i], ct_to_f32(k[lane + 32 * i]), s);
            s = ct_warp_sum(s);
            if (lane == 0) sc[jj] = scale * s;
        }
        __syncthreads();
        float tm = -INFINITY;
        for (int jj = lane; jj < nt; jj += 32) tm = fmaxf(tm, sc[jj]);
        const float mn = fmaxf(m, ct_warp_max(tm)), alpha = expf(m - mn); /* 0 at the first */
        m = mn;
        for (int jj = threadIdx.x; jj < nt; jj += ATT_DEC_THREADS) wt[jj] = expf(sc[jj] - mn);
        __syncthreads();
        float ts = 0.0f;
        for (int jj = lane; jj < nt; jj += 32) ts += wt[jj];
        l = l * alpha + ct_warp_sum(ts);
        if (g < ng) {
            float a = acc * alpha;
            for (int jj = g; jj < nt; jj += ng)
                a = fmaf(wt[jj], ct_to_f32(vh[(int64_t)(j0 + jj) * lkv + d]), a);
            acc = a;
        }
        __syncthreads(); /* the next tile rewrites sc and wt */
    }
    if (g < ng) red[g * hd + d] = acc;
    __syncthreads();
    if ((int)threadIdx.x < hd) {
        float o = red[threadIdx.x];
        for (int k = 1; k < ng; k++) o += red[k * hd + threadIdx.x];
        out[(int64_t)b * cq + (int64_t)h * hd + threadIdx.x] = ct_from_f32<T>(o * (1.0f / l));
    }
}

template <typename T, typename W>
static void att_decode(ct_cuda_ctx *cx, void *out, void *kv, const void *qkv, int64_t B,
                       int64_t T_max, int64_t pos, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    cudaStream_t st = ct_cuda_stream(cx);
    const int64_t cq = n_head * hd, lkv = 2 * n_kv_head * hd;
    dim3 grid, block;
    ct_launch_rows(cx, B, lkv, &grid, &block);
    ct_launch(attn_decode_store_kernel<W>, grid, block, 0, st, (W *)kv, (const W *)qkv, B, T_max,
              pos, cq, lkv);
    CT_CUDA_CHECK(cudaGetLastError());
    ct_launch(attn_decode_kernel<T>, dim3((unsigned)n_head, (unsigned)B), dim3(ATT_DEC_THREADS), 0,
              st, (T *)out, (const T *)kv, (const T *)qkv, T_max, (int)(pos + 1), (int)n_head,
              (int)n_kv_head, (int)hd, 1.0f / sqrtf((float)hd));
    CT_CUDA_CHECK(cudaGetLastError());
}

extern "C" void ct_cuda_attention_decode(void *ctx, ct_dtype dt, void *out, void *kv,
                                         const void *qkv, int64_t B, int64_t T_max, int64_t pos,
                                         int64_t n_head, int64_t n_kv_head, int64_t head_dim) {
    ct_cuda_ctx *cx = (ct_cuda_ctx *)ctx;
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "attention_decode dtype %d", (int)dt);
    if (B <= 0 || n_head <= 0) return;
    CT_ASSERTF(n_kv_head > 0 && n_head % n_kv_head == 0 && n_head < INT32_MAX,
               "attention_decode: n_head=%lld n_kv_head=%lld", (long long)n_head,
               (long long)n_kv_head);
    CT_ASSERTF(head_dim > 0 && head_dim <= ATT_DEC_MAX_HD,
               "attention_decode: head_dim=%lld (at most %d)", (long long)head_dim, ATT_DEC_MAX_HD);
    CT_ASSERTF(B <= 65535 && pos >= 0 && pos < T_max && T_max <= INT32_MAX - ATT_DEC_KEYS,
               "attention_decode: B=%lld T_max=%lld pos=%lld", (long long)B, (long long)T_max,
               (long long)pos);
    if (dt == CT_DTYPE_BF16)
        att_decode<__nv_bfloat16, uint16_t>(cx, out, kv, qkv, B, T_max, pos, n_head, n_kv_head,
                                            head_dim);
    else
        att_decode<float, uint32_t>(cx, out, kv, qkv, B, T_max, pos, n_head, n_kv_head, head_dim);
}
