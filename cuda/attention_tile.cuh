/*
 * attention_tile.cuh — inside the ring attention step (attention_part.cu, context parallelism):
 * its fp32 tiles in plain CUDA, no tensor cores. (attention.cu, causal attention over one
 * sequence, has register-tiled kernels of its own.) C++ only; include cuda/ct_cuda.h and
 * cuda/ct_cuda_dtype.cuh first.
 *
 * Tiles: ATT_BR = 32 query rows × ATT_BC = 32 keys, blocks of ATT_THREADS = 128 threads (4 warps),
 * each warp owning ATT_RW = 8 rows of the block's tile (query rows in the forward and dQ steps, key
 * rows in the dK/dV step). In a score phase lane l takes the l-th column of the other operand (a
 * key, or in dK/dV a query), so each lane computes 8 scores; the other operand's rows are then
 * read from shared memory by every lane at once (a broadcast) and the lane's own row from a copy
 * padded to a stride of HD + 1 floats (conflict-free). In an accumulation phase lane l owns the
 * head columns l, l + 32, ... (HD/32 of them) of the warp's 8 rows, reading the probabilities the
 * warp just wrote to its own shared slice (ordered by __syncwarp). HD, the compiled head width, is
 * 32, 64 or 128: the smallest that holds head_dim, the columns past head_dim zero in shared memory
 * (they add nothing to a dot product and are never stored). Shared memory of a forward: 4·(32·HD +
 * 32·(HD+1) + 32·HD + 4·8·32) bytes (att_fwd_smem); dK/dV 4·(2·32·HD + 2·32·(HD+1) + 2·4·8·32 +
 * 2·32) (att_dkdv_smem); dQ 4·(2·32·HD + 2·32·(HD+1) + 4·8·32 + 2·32) (att_dq_smem).
 *
 * A tile step is called by the whole block and works on rows and keys numbered from their own
 * origins: query rows [0, n_q) of one sequence piece, keys [0, n_k) of another. Rows and keys past
 * those bounds are loaded as zeros and masked; `causal` masks key j past row i (the two pieces are
 * the same positions); without it every key is visible to every row.
 */
#ifndef CT_CUDA_ATTENTION_TILE_CUH
#define CT_CUDA_ATTENTION_TILE_CUH

#define ATT_BR 32                    /* query rows per tile */
#define ATT_BC 32                    /* keys per tile (== ATT_BR: tile kt meets tiles qt ≥ kt) */
#define ATT_WARPS 4                  /* warps per block */
#define ATT_THREADS (32 * ATT_WARPS) /* threads per block */
#define ATT_RW (ATT_BR / ATT_WARPS)  /* rows (or keys) per warp */
#define ATT_MAX_HD 128               /* widest head */

/* Loops over register arrays are unrolled (CT_UNROLL, cuda/ct_cuda.h): their indices must be
 * constants for the arrays to stay in registers. */

static_assert(ATT_BR == ATT_BC, "the causal tile skipping assumes square tiles");
static_assert(ATT_BR == 32, "a lane takes one row of the other operand's tile");

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

/* ---- forward: shared memory and one key tile --------------------------------------------------
 */

/* qs (BR, HD) the query tile, ks (BC, HD+1) keys, vs (BC, HD) values, ps (WARPS, RW, BC) the
 * warps' probabilities. */
template <int HD> static constexpr size_t att_fwd_smem() {
    return sizeof(float) *
           (size_t)(ATT_BR * HD + ATT_BC * (HD + 1) + ATT_BC * HD + ATT_WARPS * ATT_RW * ATT_BC);
}

/* The running state of the warp's ATT_RW query rows: out o (lane l holds columns l, l + 32, ...),
 * max m (warp-uniform) and the lane's part of the sum l. */
template <int HD> struct att_fwd_rows {
    float o[ATT_RW][HD / 32], m[ATT_RW], l[ATT_RW];
    __device__ void start() {
        CT_UNROLL
        for (int r = 0; r < ATT_RW; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            CT_UNROLL
            for (int c = 0; c < HD / 32; c++) o[r][c] = 0.0f;
        }
    }
};

/* Keys k0 .. k0 + 31 of kh and vh (row stride ld_kv) into the warp's rows row0 .. row0 + 7 (qw:
 * their query rows in shared memory) by online softmax. The first key of the tile must be visible
 * to every row (k0 < n_k, and k0 ≤ row0 when causal), so the tile's max is finite and exp(m_old −
 * m_new) is 0 on the first tile (m_old = −inf), never NaN. */
template <typename S, int HD>
static __device__ inline void att_fwd_tile(att_fwd_rows<HD> &st, float *smem, const S *kh,
                                           const S *vh, int64_t ld_kv, int k0, int n_k, int row0,
                                           bool causal, int hd, float scale) {
    constexpr int NC = HD / 32, KLD = HD + 1;
    float *ks = smem + ATT_BR * HD, *vs = ks + ATT_BC * KLD;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, j = k0 + lane; /* the lane's key */
    const float *qw = smem + w * ATT_RW * HD;
    float *pw = vs + ATT_BC * HD + w * ATT_RW * ATT_BC;
    __syncthreads(); /* the previous tile's K, V and P are no longer read */
    att_load_tile<S, HD>(ks, KLD, kh, ld_kv, k0, n_k, hd);
    att_load_tile<S, HD>(vs, HD, vh, ld_kv, k0, n_k, hd);
    __syncthreads();
    float s[ATT_RW];
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) s[r] = 0.0f;
    att_rows_dot<HD>(s, qw, ks + lane * KLD);
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) {
        const bool live = j < n_k && (!causal || j <= row0 + r);
        const float x = live ? s[r] * scale : -INFINITY;
        const float mn = fmaxf(st.m[r], ct_warp_max(x));
        const float alpha = expf(st.m[r] - mn);
        const float p = expf(x - mn);
        st.l[r] = st.l[r] * alpha + p;
        CT_UNROLL
        for (int c = 0; c < NC; c++) st.o[r][c] *= alpha;
        st.m[r] = mn;
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
            for (int c = 0; c < NC; c++) st.o[r][c] = fmaf(p, v[c], st.o[r][c]);
        }
    }
}

/* ---- backward: dK and dV of a key tile from one query tile -------------------------------------
 */

/* ks, vs (BC, HD) keys and values (the warp's rows, broadcast); qs, dos (BR, HD+1) queries and
 * dO, a lane's own row; ps, dss (WARPS, RW, BR) Pᵀ and dSᵀ; ls, Ds (BR) lse and D. */
template <int HD> static constexpr size_t att_dkdv_smem() {
    return sizeof(float) * (size_t)(2 * ATT_BC * HD + 2 * ATT_BR * (HD + 1) +
                                    2 * ATT_WARPS * ATT_RW * ATT_BR + 2 * ATT_BR);
}

/* The key tile's K and V (keys k0 ..; the caller loads them once into the first two arrays of
 * smem) against query rows q0 .. q0 + 31 of qh and doh (row strides ld_q, ld_do) and their lse
 * and D (lrow, Drow): dv += Pᵀ·dO, dk += dSᵀ·Q (unscaled) for the warp's keys k0 + w·8 ... */
template <typename S, int HD>
static __device__ inline void
att_dkdv_tile(float (&dk)[ATT_RW][HD / 32], float (&dv)[ATT_RW][HD / 32], float *smem, const S *qh,
              int64_t ld_q, const S *doh, int64_t ld_do, const float *lrow, const float *Drow,
              int q0, int n_q, int k0, int n_k, bool causal, int hd, float scale) {
    constexpr int NC = HD / 32, KLD = HD + 1;
    float *ks = smem, *vs = ks + ATT_BC * HD, *qs = vs + ATT_BC * HD, *dos = qs + ATT_BR * KLD;
    float *ps = dos + ATT_BR * KLD, *dss = ps + ATT_WARPS * ATT_RW * ATT_BR;
    float *ls = dss + ATT_WARPS * ATT_RW * ATT_BR, *Ds = ls + ATT_BR;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int i = q0 + lane,
              key0 = k0 + w * ATT_RW; /* the lane's query row; the warp's first key */
    const float *kw = ks + w * ATT_RW * HD, *vw = vs + w * ATT_RW * HD;
    float *pw = ps + w * ATT_RW * ATT_BR, *dsw = dss + w * ATT_RW * ATT_BR;
    __syncthreads(); /* the previous tile's Q, dO, Pᵀ, dSᵀ are no longer read */
    att_load_tile<S, HD>(qs, KLD, qh, ld_q, q0, n_q, hd);
    att_load_tile<S, HD>(dos, KLD, doh, ld_do, q0, n_q, hd);
    att_load_rows(ls, lrow, q0, n_q);
    att_load_rows(Ds, Drow, q0, n_q);
    __syncthreads();
    float s[ATT_RW], dp[ATT_RW];
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) s[r] = dp[r] = 0.0f;
    att_rows_dot<HD>(s, kw, qs + lane * KLD);
    att_rows_dot<HD>(dp, vw, dos + lane * KLD);
    const float li = ls[lane], di = Ds[lane];
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) {
        const int j = key0 + r;
        const bool live = i < n_q && j < n_k && (!causal || j <= i);
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

/* ---- backward: dQ of a query tile from one key tile --------------------------------------------
 */

/* qs, dos (BR, HD) queries and dO (the warp's rows, broadcast); ks, vs (BC, HD+1) keys and values,
 * a lane's own row; dss (WARPS, RW, BC) dS; ls, Ds (BR) lse and D. */
template <int HD> static constexpr size_t att_dq_smem() {
    return sizeof(float) * (size_t)(2 * ATT_BR * HD + 2 * ATT_BC * (HD + 1) +
                                    ATT_WARPS * ATT_RW * ATT_BC + 2 * ATT_BR);
}

/* The query tile's Q, dO, lse and D (rows q0 ..; loaded once by the caller into qs, dos, ls and Ds)
 * against keys k0 .. k0 + 31 of kh and vh (row stride ld_kv): dq += dS·K (unscaled) for the warp's
 * rows q0 + w·8 ... */
template <typename S, int HD>
static __device__ inline void att_dq_tile(float (&dq)[ATT_RW][HD / 32], float *smem, const S *kh,
                                          const S *vh, int64_t ld_kv, int q0, int n_q, int k0,
                                          int n_k, bool causal, int hd, float scale) {
    constexpr int NC = HD / 32, KLD = HD + 1;
    float *qs = smem, *dos = qs + ATT_BR * HD, *ks = dos + ATT_BR * HD, *vs = ks + ATT_BC * KLD;
    float *dss = vs + ATT_BC * KLD, *ls = dss + ATT_WARPS * ATT_RW * ATT_BC, *Ds = ls + ATT_BR;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int j = k0 + lane, row0 = q0 + w * ATT_RW; /* the lane's key; the warp's first row */
    const float *qw = qs + w * ATT_RW * HD, *dow = dos + w * ATT_RW * HD;
    float *dsw = dss + w * ATT_RW * ATT_BC;
    __syncthreads(); /* the previous tile's K, V and dS are no longer read */
    att_load_tile<S, HD>(ks, KLD, kh, ld_kv, k0, n_k, hd);
    att_load_tile<S, HD>(vs, KLD, vh, ld_kv, k0, n_k, hd);
    __syncthreads();
    float s[ATT_RW], dp[ATT_RW];
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) s[r] = dp[r] = 0.0f;
    att_rows_dot<HD>(s, qw, ks + lane * KLD);
    att_rows_dot<HD>(dp, dow, vs + lane * KLD);
    CT_UNROLL
    for (int r = 0; r < ATT_RW; r++) {
        const int i = row0 + r;
        const bool live = i < n_q && j < n_k && (!causal || j <= i);
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

/* ---- launchers' shared pieces ------------------------------------------------------------- */

/* What the kernels assume of the shapes: whole GQA groups, a compiled head width, grid and index
 * ranges. */
static inline void att_check_dims(const char *op, int64_t B, int64_t T, int64_t n_head,
                                  int64_t n_kv_head, int64_t hd) {
    CT_ASSERTF(n_kv_head > 0 && n_head % n_kv_head == 0, "%s: n_head=%lld n_kv_head=%lld", op,
               (long long)n_head, (long long)n_kv_head);
    CT_ASSERTF(hd > 0 && hd <= ATT_MAX_HD, "%s: head_dim=%lld (at most %d)", op, (long long)hd,
               ATT_MAX_HD);
    CT_ASSERTF(B <= 65535 && n_head <= 65535 && T <= INT32_MAX - ATT_BR &&
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
