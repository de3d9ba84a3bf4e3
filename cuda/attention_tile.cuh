/*
 * attention_tile.cuh — inside the attention ops: the fp32 register tiles (plain CUDA, no tensor
 * cores) that attention.cu's kernels (causal attention over one sequence, the fp32 path) and
 * attention_part.cu's (one step of ring attention, context parallelism, fp32 and bf16 widened)
 * are built from. C++ only; include cuda/ct_cuda.h and cuda/ct_cuda_dtype.cuh first.
 *
 * A block of AF_THREADS = 256 threads works on square tiles of AF_TILE = 64 query rows × 64 keys,
 * the threads in a 16 × 16 grid (tx = threadIdx.x % 16 across, ty = threadIdx.x / 16 down; a
 * half-warp is one ty). Every product of a step is one of two shapes over tiles in shared memory,
 * each thread accumulating its own outputs in registers:
 *   C = A·Bᵀ   (af_mm_nt: scores S = Q·Kᵀ, dP = dO·Vᵀ; in dK/dV Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ): the
 *              thread owns rows ty + 16a and columns tx + 16b (a, b < 4), 16 scores, and per four
 *              head columns reads a float4 of each of its 4 A rows (2 addresses a warp:
 *              broadcasts) and of its 4 B rows: 8 loads for 64 FMAs. Tiles are stored with a row
 *              stride of HD + 4 floats, so the 8 lanes of a quarter-warp read 8 consecutive rows
 *              from 8 different groups of 4 banks: no conflicts.
 *   C += A·B   (af_mm_nn: out += P·V, dQ += dS·K, dV += Pᵀ·dO, dK += dSᵀ·Q), the sum over the
 *              tile's 64 keys (or queries): the thread owns rows ty + 16a and the HD/16 head
 *              columns (u·16 + tx)·VW + e (vectors of VW = 4, or 2 at HD = 32), reading per four
 *              k a float4 of each A row and per k its vectors of the B row (consecutive across
 *              the half-warp): 8 loads for 64 FMAs at HD = 64.
 * P and dS go through shared memory (row stride 80: the two half-warps of a warp write disjoint
 * banks), each row written and read by its own half-warp only, so a __syncwarp orders them. Row
 * maxima and sums are reduced over the 16 lanes of the half-warp (shuffles by 8, 4, 2, 1). HD, the
 * compiled head width, is 32, 64 or 128: the smallest that holds head_dim, the columns past
 * head_dim zero in shared memory (they add nothing to a dot product and are never stored).
 *
 * A step is called by the whole block and works on rows and keys numbered from their own origins:
 * query rows [0, n_q) of one sequence piece, keys [0, n_k) of another. Rows and keys past those
 * bounds are loaded as zeros and masked (global memory is never read past them); `causal` masks
 * key j past row i (the two pieces are the same positions); without it every key is visible to
 * every row. The k loops of the products are not unrolled: at 2, dK/dV spilled under 128
 * registers.
 */
#ifndef CT_CUDA_ATTENTION_TILE_CUH
#define CT_CUDA_ATTENTION_TILE_CUH

#define AF_TILE 64                 /* query rows and keys per tile (square: causal skipping) */
#define AF_TX 16                   /* threads across a tile */
#define AF_TY 16                   /* threads down a tile */
#define AF_THREADS (AF_TX * AF_TY) /* threads per block */
#define AF_RM (AF_TILE / AF_TY)    /* rows per thread: ty, ty + 16, ... */
#define AF_CN (AF_TILE / AF_TX)    /* score columns per thread: tx, tx + 16, ... */
#define AF_PLD (AF_TILE + 16)      /* row stride of the P and dS tiles */
#define AF_MINB(HD) ((HD) <= 64 ? 2 : 1)      /* the launch bounds' blocks per SM */
#define AF_MINB_DKDV(HD) ((HD) == 64 ? 2 : 1) /* dK/dV's: at 32 it spilled under 128 registers */
#define ATT_MAX_HD 128                        /* widest head */

static_assert(AF_TX == 16, "rows are reduced over a half-warp");

/* Loops over register arrays are unrolled (CT_UNROLL, cuda/ct_cuda.h): their indices must be
 * constants for the arrays to stay in registers. */

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

/* Whole vectors of 4 elements can be read from rows of ld elements of S at p (af_load_tile's
 * vec). */
template <typename S> static inline bool af_vec_ok(const void *p, int64_t ld, int64_t hd) {
    return hd % 4 == 0 && ld % 4 == 0 && (uintptr_t)p % (4 * sizeof(S)) == 0;
}

/* dst[r·LD + d] (r < 64, d < HD) = rows r0 + r of a head slice src (row stride ld_src) widened to
 * fp32; zero for rows at or past n and columns at or past hd, which are never read. vec: hd,
 * ld_src and src allow 4-element loads (af_vec_ok). */
template <typename S, int HD>
static __device__ inline void af_load_tile(float *dst, const S *src, int64_t ld_src, int r0, int n,
                                           int hd, bool vec) {
    constexpr int LD = af_shape<HD>::LD;
    if (vec) {
        for (int e = threadIdx.x; e < AF_TILE * HD / 4; e += AF_THREADS) {
            const int r = e / (HD / 4), d = e % (HD / 4) * 4;
            float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (r0 + r < n && d < hd) ct_load<S, 4>(src + (int64_t)(r0 + r) * ld_src + d, x);
            *reinterpret_cast<float4 *>(dst + r * LD + d) = make_float4(x[0], x[1], x[2], x[3]);
        }
        return;
    }
    for (int e = threadIdx.x; e < AF_TILE * HD; e += AF_THREADS) {
        const int r = e / HD, d = e % HD;
        dst[r * LD + d] =
            r0 + r < n && d < hd ? ct_to_f32(src[(int64_t)(r0 + r) * ld_src + d]) : 0.0f;
    }
}

/* dst[r] = src[r0 + r] for the 64 rows of a tile, 0 past n. */
static __device__ inline void af_load_rows(float *dst, const float *src, int r0, int n) {
    if (threadIdx.x < AF_TILE) {
        const int r = (int)threadIdx.x;
        dst[r] = r0 + r < n ? src[r0 + r] : 0.0f;
    }
}

/* acc[a][b] = Σ_{k < K} A[(ty + 16a)·lda + k] · B[(tx + 16b)·ldb + k], k in order. */
template <int K>
static __device__ inline void af_mm_nt(float (&acc)[AF_RM][AF_CN], const float *A, int lda,
                                       const float *B, int ldb) {
    A += af_ty() * lda;
    B += af_tx() * ldb;
    CT_UNROLL
    for (int i = 0; i < AF_RM; i++) CT_UNROLL
    for (int j = 0; j < AF_CN; j++) acc[i][j] = 0.0f;
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

/* The VW floats at p (aligned to VW floats). */
template <int VW> static __device__ inline void af_load_vec(float (&x)[VW], const float *p);
template <> __device__ inline void af_load_vec<4>(float (&x)[4], const float *p) {
    const float4 v = *reinterpret_cast<const float4 *>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}
template <> __device__ inline void af_load_vec<2>(float (&x)[2], const float *p) {
    const float2 v = *reinterpret_cast<const float2 *>(p);
    x[0] = v.x, x[1] = v.y;
}

/* The thread's head column n: (n / VW·16 + tx)·VW + n % VW. */
template <int HD> static __device__ inline int af_col(int n) {
    constexpr int VW = af_shape<HD>::VW;
    return (n / VW * AF_TX + af_tx()) * VW + n % VW;
}

/* acc[a][n] += Σ_{k < 64} A[(ty + 16a)·lda + k] · B[k·ldb + af_col(n)], k in order. */
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

/* acc = 0 */
template <int HD> static __device__ inline void af_zero(float (&acc)[AF_RM][af_shape<HD>::NH]) {
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) CT_UNROLL
    for (int n = 0; n < af_shape<HD>::NH; n++) acc[a][n] = 0.0f;
}

/* dst[(r0 + ty + 16a)·ld + af_col(n)] = (or += with add) mul·acc[a][n], rows < n_rows and columns
 * < hd only. */
template <int HD>
static __device__ inline void af_store_rows(float *dst, int64_t ld,
                                            const float (&acc)[AF_RM][af_shape<HD>::NH], int r0,
                                            int n_rows, int hd, float mul, bool add) {
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) {
        const int i = r0 + af_ty() + a * AF_TY;
        if (i >= n_rows) continue;
        float *row = dst + (int64_t)i * ld;
        CT_UNROLL
        for (int n = 0; n < af_shape<HD>::NH; n++)
            if (af_col<HD>(n) < hd) {
                const float x = acc[a][n] * mul;
                row[af_col<HD>(n)] = add ? row[af_col<HD>(n)] + x : x;
            }
    }
}

/* ---- forward: shared memory and one key tile --------------------------------------------------
 */

/* qs (64, LD) the query tile (loaded by the caller), ks, vs (64, LD) keys and values, ps (64, PLD)
 * the probabilities. */
template <int HD> static constexpr size_t af_fwd_smem() {
    return sizeof(float) * (size_t)(3 * AF_TILE * af_shape<HD>::LD + AF_TILE * AF_PLD);
}

/* The running state of the thread's rows ty + 16a: out o (its head columns), max m (the same on
 * the half-warp) and the thread's part of the sum l (reduced over the half-warp at the end). */
template <int HD> struct af_fwd_rows {
    float o[AF_RM][af_shape<HD>::NH], m[AF_RM], l[AF_RM];
    __device__ void start() {
        af_zero<HD>(o);
        CT_UNROLL
        for (int a = 0; a < AF_RM; a++) m[a] = -INFINITY, l[a] = 0.0f;
    }
};

/* Keys k0 .. k0 + 63 of kh and vh (row stride ld_kv) into the rows q0 + ty + 16a by online
 * softmax. The first key of the tile must be visible to every row (k0 < n_k, and k0 ≤ q0 when
 * causal), so each row's max is finite and exp(m_old − m_new) is 0 on the first tile (m_old =
 * −inf), never NaN. */
template <typename S, int HD>
static __device__ inline void af_fwd_tile(af_fwd_rows<HD> &st, float *smem, const S *kh,
                                          const S *vh, int64_t ld_kv, int k0, int n_k, int q0,
                                          bool causal, int hd, float scale, bool vec) {
    constexpr int LD = af_shape<HD>::LD, NH = af_shape<HD>::NH;
    float *qs = smem, *ks = qs + AF_TILE * LD, *vs = ks + AF_TILE * LD, *ps = vs + AF_TILE * LD;
    const int tx = af_tx(), ty = af_ty();
    __syncthreads(); /* the previous tile's K and V are no longer read */
    af_load_tile<S, HD>(ks, kh, ld_kv, k0, n_k, hd, vec);
    af_load_tile<S, HD>(vs, vh, ld_kv, k0, n_k, hd, vec);
    __syncthreads();
    float s[AF_RM][AF_CN];
    af_mm_nt<HD>(s, qs, LD, ks, LD);
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) {
        const int i = q0 + ty + a * AF_TY;
        float x[AF_CN], mx = -INFINITY;
        CT_UNROLL
        for (int c = 0; c < AF_CN; c++) {
            const int j = k0 + tx + c * AF_TX;
            x[c] = j < n_k && (!causal || j <= i) ? s[a][c] * scale : -INFINITY;
            mx = fmaxf(mx, x[c]);
        }
        const float mn = fmaxf(st.m[a], af_row_max(mx));
        const float alpha = expf(st.m[a] - mn);
        st.l[a] *= alpha;
        CT_UNROLL
        for (int c = 0; c < AF_CN; c++) {
            const float p = expf(x[c] - mn);
            st.l[a] += p;
            ps[(ty + a * AF_TY) * AF_PLD + tx + c * AF_TX] = p;
        }
        CT_UNROLL
        for (int n = 0; n < NH; n++) st.o[a][n] *= alpha;
        st.m[a] = mn;
    }
    __syncwarp(); /* the half-warp's rows of P are written */
    af_mm_nn<HD>(st.o, ps, AF_PLD, vs, LD);
}

/* ---- backward: dK and dV of a key tile from one query tile -------------------------------------
 */

/* ks, vs (64, LD) keys and values (loaded once by the caller), qs, dos (64, LD) queries and dO,
 * ps (64, PLD) Pᵀ, then dSᵀ in place; ls, Ds (64) lse and D. */
template <int HD> static constexpr size_t af_dkdv_smem() {
    return sizeof(float) *
           (size_t)(4 * AF_TILE * af_shape<HD>::LD + AF_TILE * AF_PLD + 2 * AF_TILE);
}

/* The key tile's K and V (keys k0 ..) against query rows q0 .. q0 + 63 of qh and doh (row strides
 * ld_q, ld_do) and their lse and D (lrow, Drow, numbered as the rows): dv += Pᵀ·dO, dk += dSᵀ·Q
 * (unscaled) for the thread's keys k0 + ty + 16a. Pᵀ first, dV += Pᵀ·dO, then dPᵀ, and
 * dSᵀ = Pᵀ ⊙ (dPᵀ − D) over Pᵀ in place (each element read and written by its own thread),
 * dK += dSᵀ·Q: S and dP are never live together and one tile holds both weights. */
template <typename S, int HD>
static __device__ inline void
af_dkdv_tile(float (&dk)[AF_RM][af_shape<HD>::NH], float (&dv)[AF_RM][af_shape<HD>::NH],
             float *smem, const S *qh, int64_t ld_q, const S *doh, int64_t ld_do, const float *lrow,
             const float *Drow, int q0, int n_q, int k0, int n_k, bool causal, int hd, float scale,
             bool vec) {
    constexpr int LD = af_shape<HD>::LD;
    float *ks = smem, *vs = ks + AF_TILE * LD, *qs = vs + AF_TILE * LD, *dos = qs + AF_TILE * LD;
    float *ps = dos + AF_TILE * LD, *ls = ps + AF_TILE * AF_PLD, *Ds = ls + AF_TILE;
    const int tx = af_tx(), ty = af_ty();
    __syncthreads(); /* the previous tile's Q, dO, lse, D and dSᵀ are no longer read */
    af_load_tile<S, HD>(qs, qh, ld_q, q0, n_q, hd, vec);
    af_load_tile<S, HD>(dos, doh, ld_do, q0, n_q, hd, vec);
    af_load_rows(ls, lrow, q0, n_q);
    af_load_rows(Ds, Drow, q0, n_q);
    __syncthreads();
    float s[AF_RM][AF_CN];
    af_mm_nt<HD>(s, ks, LD, qs, LD); /* Sᵀ: keys down, queries across */
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) {
        const int j = k0 + ty + a * AF_TY;
        CT_UNROLL
        for (int c = 0; c < AF_CN; c++) {
            const int ic = tx + c * AF_TX, i = q0 + ic;
            const bool live = i < n_q && j < n_k && (!causal || j <= i);
            ps[(ty + a * AF_TY) * AF_PLD + ic] = live ? expf(s[a][c] * scale - ls[ic]) : 0.0f;
        }
    }
    __syncwarp(); /* the half-warp's rows of Pᵀ are written */
    af_mm_nn<HD>(dv, ps, AF_PLD, dos, LD);
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

/* ---- backward: dQ of a query tile from one key tile --------------------------------------------
 */

/* qs, dos (64, LD) queries and dO, ls, Ds (64) their lse and D (loaded once by the caller);
 * ks, vs (64, LD) keys and values; dss (64, PLD) dS. */
template <int HD> static constexpr size_t af_dq_smem() {
    return sizeof(float) *
           (size_t)(4 * AF_TILE * af_shape<HD>::LD + AF_TILE * AF_PLD + 2 * AF_TILE);
}

/* Where af_dq_tile expects the query tile's lse and D: ls, then Ds = ls + 64. */
template <int HD> static __device__ inline float *af_dq_rows(float *smem) {
    return smem + 4 * AF_TILE * af_shape<HD>::LD + AF_TILE * AF_PLD;
}

/* The query tile's Q, dO, lse and D (rows q0 ..) against keys k0 .. k0 + 63 of kh and vh (row
 * stride ld_kv): dq += dS·K (unscaled) for the thread's rows q0 + ty + 16a. */
template <typename S, int HD>
static __device__ inline void af_dq_tile(float (&dq)[AF_RM][af_shape<HD>::NH], float *smem,
                                         const S *kh, const S *vh, int64_t ld_kv, int q0, int n_q,
                                         int k0, int n_k, bool causal, int hd, float scale,
                                         bool vec) {
    constexpr int LD = af_shape<HD>::LD;
    float *qs = smem, *dos = qs + AF_TILE * LD, *ks = dos + AF_TILE * LD, *vs = ks + AF_TILE * LD;
    float *dss = vs + AF_TILE * LD, *ls = af_dq_rows<HD>(smem), *Ds = ls + AF_TILE;
    const int tx = af_tx(), ty = af_ty();
    __syncthreads(); /* the previous tile's K, V and dS are no longer read */
    af_load_tile<S, HD>(ks, kh, ld_kv, k0, n_k, hd, vec);
    af_load_tile<S, HD>(vs, vh, ld_kv, k0, n_k, hd, vec);
    __syncthreads();
    float s[AF_RM][AF_CN], dp[AF_RM][AF_CN];
    af_mm_nt<HD>(s, qs, LD, ks, LD);
    af_mm_nt<HD>(dp, dos, LD, vs, LD);
    CT_UNROLL
    for (int a = 0; a < AF_RM; a++) {
        const int ir = ty + a * AF_TY, i = q0 + ir;
        CT_UNROLL
        for (int c = 0; c < AF_CN; c++) {
            const int j = k0 + tx + c * AF_TX;
            const bool live = i < n_q && j < n_k && (!causal || j <= i);
            const float p = live ? expf(s[a][c] * scale - ls[ir]) : 0.0f;
            dss[ir * AF_PLD + tx + c * AF_TX] = p * (dp[a][c] - Ds[ir]);
        }
    }
    __syncwarp(); /* the half-warp's rows of dS are written */
    af_mm_nn<HD>(dq, dss, AF_PLD, ks, LD);
}

/* ---- launchers' shared pieces ------------------------------------------------------------- */

/* What the kernels assume of the shapes: whole GQA groups, a compiled head width, grid and index
 * ranges. */
static inline void att_check_dims(const char *op, int64_t B, int64_t T, int64_t n_head,
                                  int64_t n_kv_head, int64_t hd) {
    CT_ASSERTF(n_kv_head > 0 && n_head % n_kv_head == 0, "%s: n_head=%lld n_kv_head=%lld", op,
               (long long)n_head, (long long)n_kv_head);
    CT_ASSERTF(hd > 0 && hd <= ATT_MAX_HD, "%s: head_dim=%lld (at most %d)", op, (long long)hd,
               ATT_MAX_HD);
    CT_ASSERTF(B <= 65535 && n_head <= 65535 && T <= INT32_MAX - AF_TILE &&
                   B * T * (n_head + 2 * n_kv_head) * hd < ((int64_t)1 << 62),
               "%s: B=%lld T=%lld n_head=%lld", op, (long long)B, (long long)T, (long long)n_head);
}

/* fn<S, HD>(...) at the narrowest compiled head width HD that holds hd. */
#define ATT_HD_DISPATCH(fn, S, hd, ...)                                                            \
    do {                                                                                           \
        if ((hd) <= 32)                                                                            \
            fn<S, 32>(__VA_ARGS__);                                                                \
        else if ((hd) <= 64)                                                                       \
            fn<S, 64>(__VA_ARGS__);                                                                \
        else                                                                                       \
            fn<S, 128>(__VA_ARGS__);                                                               \
    } while (0)

#endif /* CT_CUDA_ATTENTION_TILE_CUH */
