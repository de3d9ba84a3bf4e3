/*
 * attention.c — the CPU backend's causal attention (cpu.h), forward and backward, and the two
 * ops of ring attention's step (attention_part_fwd, attention_part_bwd), parallel over (batch,
 * head) with the query rows in causal blocks of ATT_BLOCK; the slots stage bf16 through fp32.
 */
#include "core/backend/cpu/cpu.h"

#include <cblas.h>

/* ---- attention ---------------------------------------------------------------------------- */

/*
 * Per (batch, head) the T query rows are walked in blocks of ATT_BLOCK rows [r0, r1); a block only
 * needs keys [0, r1) (causal), so S = scale·Q·K^T is computed on the block lower triangle and the
 * GEMMs skip the rest. Head slices are strided views of the (B, T, heads·hd) tensors: leading
 * dimension heads·hd, never copied.
 */

#if defined(__AVX512F__)
/* dst(16, 16) = src(16, 16)ᵀ (row strides ld_dst, ld_src): interleave pairs of rows at 32-bit,
 * then 64-bit granularity, then exchange 128-bit lanes twice. */
static void transpose_16x16(float *dst, int64_t ld_dst, const float *src, int64_t ld_src) {
    __m512 r[16], u[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ld_src);
    for (int i = 0; i < 16; i += 2) {
        u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int j = 0; j < 2; j++) {
            __m512d a = _mm512_castps_pd(u[i + j]), b = _mm512_castps_pd(u[i + j + 2]);
            r[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 4; i++) {
        u[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        u[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        u[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        u[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(u[i], u[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(u[i], u[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_f32x4(u[i + 4], u[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(u[i + 4], u[i + 12], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ld_dst, r[i]);
}
#endif

/* dst(hd, ld_dst) = src(T, hd)ᵀ for a head slice src of row stride ld_src (T ≤ ld_dst). OpenBLAS's
 * small-matrix kernel for A·Bᵀ runs at about half the rate of its A·B kernel at attention's
 * shapes (64x128x64: 86 vs 157 GFLOP/s on one AVX-512 core), so Kᵀ and Vᵀ are made explicit once
 * per head and the score GEMMs run as A·B. */
static void transpose_head(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t T,
                           int64_t hd) {
    int64_t t_done = 0, d_done = 0;
#if defined(__AVX512F__)
    /* whole 16x16 tiles in registers: 4x faster than the element loop below */
    t_done = T - T % 16, d_done = hd - hd % 16;
    for (int64_t t0 = 0; t0 < t_done; t0 += 16)
        for (int64_t d0 = 0; d0 < d_done; d0 += 16)
            transpose_16x16(dst + d0 * ld_dst + t0, ld_dst, src + t0 * ld_src + d0, ld_src);
#endif
    /* the rest: rows past the last whole tile, and columns past it for every row */
    for (int64_t t0 = 0; t0 < T; t0 += 16) {
        int64_t t1 = CT_MIN(t0 + 16, T);
        int64_t d_from = t0 + 16 <= t_done ? d_done : 0;
        for (int64_t d = d_from; d < hd; d++)
            for (int64_t t = t0; t < t1; t++) dst[d * ld_dst + t] = src[t * ld_src + d];
    }
}

/* Sets s[n .. round_up(n, 16)) to -inf with one masked vector write (exp then gives exactly 0
 * there, so a row is processed in whole 16-lane groups without a scalar tail). Returns
 * round_up(n, 16). */
static inline int64_t mask_past_diagonal(float *s, int64_t n) {
    int64_t n16 = (int64_t)round_up((size_t)n, LANES), tail = n16 - LANES;
    if (n16 > n) {
        const vi16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        const vi16 neg_inf = (vi16){0} + (int32_t)0xFF800000; /* bits of -inf */
        vi16 keep = lane < (int32_t)(n - tail);
        vi16 v = (vi16)LOAD16(s + tail);
        v = (v & keep) | (neg_inf & ~keep);
        memcpy(s + tail, &v, sizeof v);
    }
    return n16;
}

/* Row-wise causal softmax of a block S (rows r0..r1-1 of the score matrix, keys 0..r1-1, row stride
 * ld ≥ round_up(r1, LANES)), left unnormalised: S becomes exp(S - rowmax) with 0 past the diagonal,
 * inv_sum[i - r0] = 1/sum and lse[i] = max + log(sum). The caller scales the (hd-wide) output rows
 * by inv_sum instead of the (up to T-wide) probability rows. Each row is processed in whole 16-lane
 * groups: the columns between the diagonal and the next multiple of 16 are set to -inf first (exp
 * gives exactly 0), so there is no scalar tail. */
static void softmax_block(float *S, int64_t ld, int64_t r0, int64_t r1, float *lse,
                          float *inv_sum) {
    for (int64_t i = r0; i < r1; i++) {
        float *s = S + (i - r0) * ld;
        int64_t n = i + 1; /* keys 0..i are visible */
        int64_t n16 = mask_past_diagonal(s, n);
        float mx = row_max(s, n16);
        float acc[LANES] = {0};
        for (int64_t j = 0; j < n16; j += LANES)
            for (int l = 0; l < LANES; l++) {
                float e = exp_f32(s[j + l] - mx);
                s[j + l] = e;
                acc[l] += e;
            }
        if (r1 > n16) memset(s + n16, 0, (size_t)(r1 - n16) * sizeof(float));
        float sum = lane_sum(acc);
        inv_sum[i - r0] = 1.0f / sum;
        lse[i] = mx + logf(sum);
    }
}

static void attention_fwd_f32(void *ctx, float *out, float *lse, const float *qkv, int64_t B,
                              int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    cpu_ctx *c = ctx;
    const int64_t cq = n_head * hd, ckv = n_kv_head * hd, group = n_head / n_kv_head;
    const int64_t lqkv = cq + 2 * ckv; /* row stride of the packed q | k | v */
    const float scale = 1.0f / sqrtf((float)hd);
    /* per-thread scratch: one block of scores (ATT_BLOCK, ld), rows padded to whole lane groups,
     * Kᵀ (hd, ld) and the block's 1/sum (ATT_BLOCK) */
    const int64_t ld = (int64_t)round_up((size_t)T, LANES);
    const size_t s_bytes = round_up((size_t)ATT_BLOCK * (size_t)ld * sizeof(float), 64);
    const size_t kt_bytes = round_up((size_t)hd * (size_t)ld * sizeof(float), 64);
    const size_t per_thread = s_bytes + kt_bytes + round_up(ATT_BLOCK * sizeof(float), 64);
    char *ws = ct_cpu_ws_get(c, per_thread * (size_t)c->n_threads);
    PARALLEL_FOR(c->n_threads)
    for (int64_t bh = 0; bh < B * n_head; bh++) {
        float *S = (float *)(ws + per_thread * (size_t)omp_get_thread_num());
        float *Kt = (float *)((char *)S + s_bytes);
        float *inv = (float *)((char *)Kt + kt_bytes);
        int64_t b = bh / n_head, h = bh % n_head, kvh = h / group;
        const float *qh = qkv + b * T * lqkv + h * hd;              /* (T, hd), stride lqkv */
        const float *kh = qkv + b * T * lqkv + cq + kvh * hd;       /* (T, hd), stride lqkv */
        const float *vh = qkv + b * T * lqkv + cq + ckv + kvh * hd; /* (T, hd), stride lqkv */
        float *oh = out + b * T * cq + h * hd;                      /* (T, hd), stride cq */
        float *lh = lse + bh * T;                                   /* (T) */
        if (bh + 1 < B * n_head) {
            int64_t nb = (bh + 1) / n_head, nh = (bh + 1) % n_head, nkvh = nh / group;
            prefetch_rows(qkv + nb * T * lqkv + nh * hd, T, lqkv, hd);
            prefetch_rows(qkv + nb * T * lqkv + cq + nkvh * hd, T, lqkv, hd);
            prefetch_rows(qkv + nb * T * lqkv + cq + ckv + nkvh * hd, T, lqkv, hd);
            prefetch_rows_w(out + nb * T * cq + nh * hd, T, cq, hd);
        }
        transpose_head(Kt, ld, kh, lqkv, T, hd);
        for (int64_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
            int64_t r1 = CT_MIN(r0 + ATT_BLOCK, T), m = r1 - r0;
            /* S(m, r1) = scale · Q[r0:r1] · Kᵀ[:, 0:r1] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)r1, (int)hd, scale,
                        qh + r0 * lqkv, (int)lqkv, Kt, (int)ld, 0.0f, S, (int)ld);
            softmax_block(S, ld, r0, r1, lh, inv);
            /* O[r0:r1](m, hd) = diag(1/sum) · exp(S - max)(m, r1) · V[0:r1] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)hd, (int)r1, 1.0f,
                        S, (int)ld, vh, (int)lqkv, 0.0f, oh + r0 * cq, (int)cq);
            for (int64_t i = 0; i < m; i++) {
                float *o = oh + (r0 + i) * cq, f = inv[i];
#pragma omp simd
                for (int64_t d = 0; d < hd; d++) o[d] *= f;
            }
        }
    }
}

/*
 * Backward per query block, with P recomputed from the saved lse:
 *   dP = dO·V^T, D_i = rowsum(dO ⊙ O)_i, dS = P ⊙ (dP - D),
 *   dV += P^T·dO, dQ = scale·dS·K, dK += scale·dS^T·Q.
 * Parallel over (batch, kv head): the group's query heads and their blocks are visited in a fixed
 * order and accumulate into the kv head's dk/dv, so GQA needs no atomics and no reduction buffers.
 * dqkv has the packed layout of qkv.
 */
static void attention_bwd_f32(void *ctx, float *dqkv, float *dbias, const float *dout,
                              const float *qkv, const float *out, const float *lse, int64_t B,
                              int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    cpu_ctx *c = ctx;
    const int64_t cq = n_head * hd, ckv = n_kv_head * hd, group = n_head / n_kv_head;
    const int64_t lqkv = cq + 2 * ckv;
    const float scale = 1.0f / sqrtf((float)hd);
    /* per-thread scratch: P and dP/dS blocks (ATT_BLOCK, ldt) each, Kᵀ and Vᵀ (hd, ldt) each, and D
     * (ATT_BLOCK); ldt is T rounded up to whole lane groups */
    const int64_t ldt = (int64_t)round_up((size_t)T, LANES);
    const size_t blk_bytes = round_up((size_t)ATT_BLOCK * (size_t)ldt * sizeof(float), 64);
    const size_t kt_bytes = round_up((size_t)hd * (size_t)ldt * sizeof(float), 64);
    const size_t per_thread =
        2 * blk_bytes + 2 * kt_bytes + round_up(ATT_BLOCK * sizeof(float), 64);
    /* after the threads' scratch: with dbias, each batch element's column sums of dqkv (B, lqkv) */
    const size_t scratch = per_thread * (size_t)c->n_threads;
    char *ws = ct_cpu_ws_get(c, scratch + (dbias ? (size_t)(B * lqkv) * sizeof(float) : 0));
    float *colsums = (float *)(ws + scratch);
    PARALLEL_FOR(c->n_threads)
    for (int64_t bkv = 0; bkv < B * n_kv_head; bkv++) {
        char *mine = ws + per_thread * (size_t)omp_get_thread_num();
        float *P = (float *)mine, *dS = (float *)(mine + blk_bytes);
        float *Kt = (float *)(mine + 2 * blk_bytes),
              *Vt = (float *)(mine + 2 * blk_bytes + kt_bytes);
        float *D = (float *)(mine + 2 * blk_bytes + 2 * kt_bytes);
        int64_t b = bkv / n_kv_head, kvh = bkv % n_kv_head;
        const int64_t k_off = b * T * lqkv + cq + kvh * hd, v_off = k_off + ckv;
        const float *kh = qkv + k_off, *vh = qkv + v_off; /* (T, hd), stride lqkv */
        float *dkh = dqkv + k_off, *dvh = dqkv + v_off;
        if (bkv + 1 < B * n_kv_head) { /* the next item's q, k, v, out and dout slices */
            int64_t nb = (bkv + 1) / n_kv_head, nkvh = (bkv + 1) % n_kv_head;
            const float *row0 = qkv + nb * T * lqkv;
            prefetch_rows(row0 + cq + nkvh * hd, T, lqkv, hd);
            prefetch_rows(row0 + cq + ckv + nkvh * hd, T, lqkv, hd);
            prefetch_rows_w(dqkv + nb * T * lqkv + cq + nkvh * hd, T, lqkv, hd);
            prefetch_rows_w(dqkv + nb * T * lqkv + cq + ckv + nkvh * hd, T, lqkv, hd);
            for (int64_t h = nkvh * group; h < (nkvh + 1) * group; h++) {
                prefetch_rows(row0 + h * hd, T, lqkv, hd);
                prefetch_rows_w(dqkv + nb * T * lqkv + h * hd, T, lqkv, hd);
                prefetch_rows(out + nb * T * cq + h * hd, T, cq, hd);
                prefetch_rows(dout + nb * T * cq + h * hd, T, cq, hd);
            }
        }
        transpose_head(Kt, ldt, kh, lqkv, T, hd);
        transpose_head(Vt, ldt, vh, lqkv, T, hd);
        /* Blocks run last to first: the last block's dK/dV GEMMs cover all T keys, so for the
         * group's first head they overwrite (beta 0) and nothing needs zeroing beforehand. */
        const int64_t last_r0 = (T - 1) / ATT_BLOCK * ATT_BLOCK;
        for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
            const float *qh = qkv + b * T * lqkv + h * hd; /* (T, hd), stride lqkv */
            float *dqh = dqkv + b * T * lqkv + h * hd;
            const float *oh = out + b * T * cq + h * hd; /* (T, hd), stride cq */
            const float *doh = dout + b * T * cq + h * hd;
            const float *lh = lse + (b * n_head + h) * T;
            for (int64_t r0 = last_r0; r0 >= 0; r0 -= ATT_BLOCK) {
                int64_t r1 = CT_MIN(r0 + ATT_BLOCK, T), m = r1 - r0;
                const float kv_beta = h == kvh * group && r0 == last_r0 ? 0.0f : 1.0f;
                /* P(m, r1) = exp(scale·Q[r0:r1]·Kᵀ[:, 0:r1] - lse), 0 past the diagonal */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)r1, (int)hd,
                            scale, qh + r0 * lqkv, (int)lqkv, Kt, (int)ldt, 0.0f, P, (int)ldt);
                for (int64_t i = r0; i < r1; i++) {
                    float *p = P + (i - r0) * ldt;
                    float l = lh[i];
                    int64_t n16 = mask_past_diagonal(p, i + 1);
#pragma omp simd
                    for (int64_t j = 0; j < n16; j++) p[j] = exp_f32(p[j] - l);
                    if (r1 > n16) memset(p + n16, 0, (size_t)(r1 - n16) * sizeof(float));
                    /* D_i = dO_i · O_i */
                    const float *o = oh + i * cq, *d = doh + i * cq;
                    vf16 acc = {0};
                    int64_t hv = hd - hd % LANES;
                    for (int64_t j = 0; j < hv; j += LANES) acc += LOAD16(o + j) * LOAD16(d + j);
                    for (int64_t j = hv; j < hd; j++) acc[j - hv] += o[j] * d[j];
                    D[i - r0] = vf16_sum(&acc);
                }
                /* dP(m, r1) = dO[r0:r1] · Vᵀ[:, 0:r1] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)r1, (int)hd,
                            1.0f, doh + r0 * cq, (int)cq, Vt, (int)ldt, 0.0f, dS, (int)ldt);
                /* dS = P ⊙ (dP - D) */
                for (int64_t i = 0; i < m; i++) {
                    float *ds = dS + i * ldt;
                    const float *p = P + i * ldt;
                    float di = D[i];
#pragma omp simd
                    for (int64_t j = 0; j < r1; j++) ds[j] = p[j] * (ds[j] - di);
                }
                /* dV[0:r1](r1, hd) += P^T · dO[r0:r1] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r1, (int)hd, (int)m, 1.0f,
                            P, (int)ldt, doh + r0 * cq, (int)cq, kv_beta, dvh, (int)lqkv);
                /* dQ[r0:r1](m, hd) = scale · dS · K[0:r1] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)hd, (int)r1,
                            scale, dS, (int)ldt, kh, (int)lqkv, 0.0f, dqh + r0 * lqkv, (int)lqkv);
                /* dK[0:r1](r1, hd) += scale · dS^T · Q[r0:r1] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r1, (int)hd, (int)m,
                            scale, dS, (int)ldt, qh + r0 * lqkv, (int)lqkv, kv_beta, dkh,
                            (int)lqkv);
            }
            /* this head's dq columns are final: their sums over the batch element's rows */
            if (dbias) ct_cpu_sum_rows(colsums + b * lqkv + h * hd, dqh, lqkv, T, hd);
        }
        if (dbias) {
            ct_cpu_sum_rows(colsums + b * lqkv + cq + kvh * hd, dkh, lqkv, T, hd);
            ct_cpu_sum_rows(colsums + b * lqkv + cq + ckv + kvh * hd, dvh, lqkv, T, hd);
        }
    }
    /* the bias gradient: the batch elements' column sums added in batch order */
    if (dbias) ct_cpu_add_chunk_partials(c, dbias, colsums, B, lqkv, lqkv);
}

/* ---- attention of a context-parallel part -------------------------------------------------- */

/*
 * The two ops of ring attention (backend.h, ct_attention_part_fwd): the local query rows against
 * one key/value block, each side two chunks of c = T/2 rows at global chunk indices packed in
 * `chunks` (CT_ATT_CHUNK). A (query chunk, key chunk) pair is skipped when the key chunk comes
 * later in the sequence, causal when it is the same chunk, full when it comes earlier; pairs run
 * in a fixed order (query chunk, then key chunk 0 then 1), each merged into the accumulators as
 * one block. Parallel over (batch, head) forward and (batch, kv head) backward, as above. Head
 * slices are strided views; scratch per thread is a block of ATT_BLOCK query rows by c keys.
 */

/* -1: the pair is skipped; 0: full; 1: causal (the same chunk). */
static int part_kind(int64_t qc, int64_t kc) {
    return kc > qc ? -1 : kc == qc;
}

/* Row i of the block (0 ≤ i < m, query row r0 + i of its chunk) sees keys [0, n): all c keys of
 * an earlier chunk, keys 0 .. r0 + i of its own. */
static inline int64_t part_visible(int kind, int64_t c, int64_t r0, int64_t i) {
    return kind ? r0 + i + 1 : c;
}

/* Row i of a part's score block s (nk columns computed, row stride ≥ round_up(nk, LANES)) as
 * exp(s - mx) over its n visible keys and 0 past them up to nk, in whole lane groups (the masked
 * tail set to -inf first, as softmax_block does); returns the sum of the exponentials. mx: the
 * row's max when *mx is NAN on entry (the forward), else the value to subtract (backward's lse). */
static float part_exp_row(float *s, int64_t n, int64_t nk, float *mx) {
    int64_t n16 = mask_past_diagonal(s, n);
    if (isnan(*mx)) *mx = row_max(s, n16);
    const float m = *mx;
    float acc[LANES] = {0};
    for (int64_t j = 0; j < n16; j += LANES)
        for (int l = 0; l < LANES; l++) {
            float e = exp_f32(s[j + l] - m);
            s[j + l] = e;
            acc[l] += e;
        }
    if (nk > n16) memset(s + n16, 0, (size_t)(nk - n16) * sizeof(float));
    return lane_sum(acc);
}

static void attention_part_fwd_f32(void *ctx, float *o_acc, float *lse_acc, const float *qkv,
                                   const float *kv, int64_t B, int64_t T, int64_t n_head,
                                   int64_t n_kv_head, int64_t hd, int64_t chunks) {
    cpu_ctx *c = ctx;
    const int64_t cq = n_head * hd, ckv = n_kv_head * hd, group = n_head / n_kv_head;
    const int64_t lqkv = cq + 2 * ckv, lkv = 2 * ckv, ch = T / 2;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t ld = (int64_t)round_up((size_t)ch, LANES);
    /* per thread: scores (ATT_BLOCK, ld), Kᵀ of both key chunks (2, hd, ld), the block's output
     * (ATT_BLOCK, hd), 1/sum */
    const size_t s_bytes = round_up((size_t)ATT_BLOCK * (size_t)ld * sizeof(float), 64);
    const size_t kt_bytes = round_up((size_t)hd * (size_t)ld * sizeof(float), 64);
    const size_t o_bytes = round_up((size_t)ATT_BLOCK * (size_t)hd * sizeof(float), 64);
    const size_t per_thread =
        s_bytes + 2 * kt_bytes + o_bytes + round_up(ATT_BLOCK * sizeof(float), 64);
    char *ws = ct_cpu_ws_get(c, per_thread * (size_t)c->n_threads);
    PARALLEL_FOR(c->n_threads)
    for (int64_t bh = 0; bh < B * n_head; bh++) {
        char *mine = ws + per_thread * (size_t)omp_get_thread_num();
        float *S = (float *)mine,
              *Kt[2] = {(float *)(mine + s_bytes), (float *)(mine + s_bytes + kt_bytes)};
        float *Ob = (float *)(mine + s_bytes + 2 * kt_bytes);
        float *inv = (float *)((char *)Ob + o_bytes);
        const int64_t b = bh / n_head, h = bh % n_head, kvh = h / group;
        for (int ka = 0; ka < 2; ka++)
            transpose_head(Kt[ka], ld, kv + (b * T + ka * ch) * lkv + kvh * hd, lkv, ch, hd);
        for (int qa = 0; qa < 2; qa++)
            for (int ka = 0; ka < 2; ka++) {
                const int kind = part_kind(CT_ATT_CHUNK(chunks, qa), CT_ATT_CHUNK(chunks, 2 + ka));
                if (kind < 0) continue;
                const float *qh = qkv + (b * T + qa * ch) * lqkv + h * hd;
                const float *vh = kv + (b * T + ka * ch) * lkv + ckv + kvh * hd;
                float *oh = o_acc + (b * T + qa * ch) * cq + h * hd;
                float *lh = lse_acc + bh * T + qa * ch;
                for (int64_t r0 = 0; r0 < ch; r0 += ATT_BLOCK) {
                    const int64_t m = CT_MIN(ATT_BLOCK, ch - r0);
                    const int64_t nk = part_visible(kind, ch, r0, m - 1); /* the widest row */
                    /* S(m, nk) = scale · Q[r0:r0+m] · Kᵀ[:, 0:nk] */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)nk, (int)hd,
                                scale, qh + r0 * lqkv, (int)lqkv, Kt[ka], (int)ld, 0.0f, S,
                                (int)ld);
                    float lb[ATT_BLOCK];
                    for (int64_t i = 0; i < m; i++) {
                        float mx = NAN;
                        float sum =
                            part_exp_row(S + i * ld, part_visible(kind, ch, r0, i), nk, &mx);
                        inv[i] = 1.0f / sum;
                        lb[i] = mx + logf(sum);
                    }
                    /* Ob(m, hd) = exp(S - max) · V[0:nk] */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)hd, (int)nk,
                                1.0f, S, (int)ld, vh, (int)lkv, 0.0f, Ob, (int)hd);
                    /* merge (O, L) with the block's (Ob / sum, lb) by their log-sum-exps */
                    for (int64_t i = 0; i < m; i++) {
                        float *o = oh + (r0 + i) * cq;
                        const float *ob = Ob + i * hd;
                        const float la = lh[r0 + i], l = lb[i];
                        if (la == -INFINITY) {
                            for (int64_t d = 0; d < hd; d++) o[d] = ob[d] * inv[i];
                            lh[r0 + i] = l;
                            continue;
                        }
                        const float mx = fmaxf(la, l), lnew = mx + log1pf(expf(fminf(la, l) - mx));
                        const float wa = expf(la - lnew), wb = expf(l - lnew) * inv[i];
                        for (int64_t d = 0; d < hd; d++) o[d] = wa * o[d] + wb * ob[d];
                        lh[r0 + i] = lnew;
                    }
                }
            }
    }
}

static void attention_part_bwd_f32(void *ctx, float *dq_acc, float *dkv_acc, const float *dout,
                                   const float *qkv, const float *out, const float *lse,
                                   const float *kv, int64_t B, int64_t T, int64_t n_head,
                                   int64_t n_kv_head, int64_t hd, int64_t chunks) {
    cpu_ctx *c = ctx;
    const int64_t cq = n_head * hd, ckv = n_kv_head * hd, group = n_head / n_kv_head;
    const int64_t lqkv = cq + 2 * ckv, lkv = 2 * ckv, ch = T / 2;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t ld = (int64_t)round_up((size_t)ch, LANES);
    /* per thread: P and dP/dS (ATT_BLOCK, ld) each, Kᵀ and Vᵀ of both key chunks (hd, ld) each,
     * D (ATT_BLOCK) */
    const size_t blk_bytes = round_up((size_t)ATT_BLOCK * (size_t)ld * sizeof(float), 64);
    const size_t kt_bytes = round_up((size_t)hd * (size_t)ld * sizeof(float), 64);
    const size_t per_thread =
        2 * blk_bytes + 4 * kt_bytes + round_up(ATT_BLOCK * sizeof(float), 64);
    char *ws = ct_cpu_ws_get(c, per_thread * (size_t)c->n_threads);
    PARALLEL_FOR(c->n_threads)
    for (int64_t bkv = 0; bkv < B * n_kv_head; bkv++) {
        char *mine = ws + per_thread * (size_t)omp_get_thread_num();
        float *P = (float *)mine, *dS = (float *)(mine + blk_bytes);
        float *Kt[2], *Vt[2];
        for (int ka = 0; ka < 2; ka++) {
            Kt[ka] = (float *)(mine + 2 * blk_bytes + (size_t)(2 * ka) * kt_bytes);
            Vt[ka] = (float *)(mine + 2 * blk_bytes + (size_t)(2 * ka + 1) * kt_bytes);
        }
        float *D = (float *)(mine + 2 * blk_bytes + 4 * kt_bytes);
        const int64_t b = bkv / n_kv_head, kvh = bkv % n_kv_head;
        for (int ka = 0; ka < 2; ka++) {
            const float *kh = kv + (b * T + ka * ch) * lkv + kvh * hd;
            transpose_head(Kt[ka], ld, kh, lkv, ch, hd);
            transpose_head(Vt[ka], ld, kh + ckv, lkv, ch, hd);
        }
        for (int64_t h = kvh * group; h < (kvh + 1) * group; h++)
            for (int qa = 0; qa < 2; qa++)
                for (int ka = 0; ka < 2; ka++) {
                    const int kind =
                        part_kind(CT_ATT_CHUNK(chunks, qa), CT_ATT_CHUNK(chunks, 2 + ka));
                    if (kind < 0) continue;
                    const int64_t q_row = b * T + qa * ch, k_row = b * T + ka * ch;
                    const float *qh = qkv + q_row * lqkv + h * hd;
                    const float *oh = out + q_row * cq + h * hd, *doh = dout + q_row * cq + h * hd;
                    const float *lh = lse + (b * n_head + h) * T + qa * ch;
                    float *dqh = dq_acc + q_row * cq + h * hd;
                    const float *kh = kv + k_row * lkv + kvh * hd;
                    float *dkh = dkv_acc + k_row * lkv + kvh * hd, *dvh = dkh + ckv;
                    for (int64_t r0 = 0; r0 < ch; r0 += ATT_BLOCK) {
                        const int64_t m = CT_MIN(ATT_BLOCK, ch - r0);
                        const int64_t nk = part_visible(kind, ch, r0, m - 1);
                        /* P(m, nk) = exp(scale·Q·Kᵀ - lse), 0 where masked; D = rowsum(dO ⊙ O) */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)nk,
                                    (int)hd, scale, qh + r0 * lqkv, (int)lqkv, Kt[ka], (int)ld,
                                    0.0f, P, (int)ld);
                        for (int64_t i = 0; i < m; i++) {
                            float l = lh[r0 + i];
                            part_exp_row(P + i * ld, part_visible(kind, ch, r0, i), nk, &l);
                            const float *o = oh + (r0 + i) * cq, *d = doh + (r0 + i) * cq;
                            float di = 0.0f;
                            for (int64_t e = 0; e < hd; e++) di += o[e] * d[e];
                            D[i] = di;
                        }
                        /* dP(m, nk) = dO · Vᵀ[:, 0:nk], then dS = P ⊙ (dP - D) */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)nk,
                                    (int)hd, 1.0f, doh + r0 * cq, (int)cq, Vt[ka], (int)ld, 0.0f,
                                    dS, (int)ld);
                        for (int64_t i = 0; i < m; i++) {
                            float *ds = dS + i * ld;
                            const float *p = P + i * ld;
                            const float di = D[i];
#pragma omp simd
                            for (int64_t j = 0; j < nk; j++) ds[j] = p[j] * (ds[j] - di);
                        }
                        /* dV[0:nk] += Pᵀ·dO; dK[0:nk] += scale·dSᵀ·Q; dQ += scale·dS·K[0:nk] */
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, (int)hd,
                                    (int)m, 1.0f, P, (int)ld, doh + r0 * cq, (int)cq, 1.0f, dvh,
                                    (int)lkv);
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, (int)hd,
                                    (int)m, scale, dS, (int)ld, qh + r0 * lqkv, (int)lqkv, 1.0f,
                                    dkh, (int)lkv);
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)hd,
                                    (int)nk, scale, dS, (int)ld, kh, (int)lkv, 1.0f, dqh + r0 * cq,
                                    (int)cq);
                    }
                }
    }
}

void ct_cpu_attention_fwd(void *ctx, ct_dtype dt, void *out, float *lse, const void *qkv, int64_t B,
                          int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    cpu_ctx *c = ctx;
    int64_t n_out = B * T * n_head * hd, n_qkv = B * T * (n_head + 2 * n_kv_head) * hd;
    float *o = out_f32(c, 0, dt, out, n_out, false);
    attention_fwd_f32(c, o, lse, in_f32(c, 1, dt, qkv, n_qkv), B, T, n_head, n_kv_head, hd);
    out_done(c, dt, out, o, n_out);
}

void ct_cpu_attention_bwd(void *ctx, ct_dtype dt, void *dqkv, float *dbias, const void *dout,
                          const void *qkv, const void *out, const float *lse, int64_t B, int64_t T,
                          int64_t n_head, int64_t n_kv_head, int64_t hd) {
    cpu_ctx *c = ctx;
    int64_t n_out = B * T * n_head * hd, n_qkv = B * T * (n_head + 2 * n_kv_head) * hd;
    float *dq = out_f32(c, 0, dt, dqkv, n_qkv, false);
    attention_bwd_f32(c, dq, dbias, in_f32(c, 1, dt, dout, n_out), in_f32(c, 2, dt, qkv, n_qkv),
                      in_f32(c, 3, dt, out, n_out), lse, B, T, n_head, n_kv_head, hd);
    out_done(c, dt, dqkv, dq, n_qkv);
}

/*
 * One position against the cache: its key and value heads copied into cache row pos (bytes, in
 * the storage dtype), then per (sequence, head) the scores of the query against rows 0..pos, their
 * max, the weights exp(s - max) summed in row order, and the weighted value rows added in row
 * order, times 1/sum at the end — the order attention_fwd's row pos follows. Read in the storage
 * dtype and widened element by element: staging the whole cache every step would cost a pass over
 * T_max rows.
 */
static inline float load_dt(ct_dtype dt, const void *p, int64_t i) {
    return dt == CT_DTYPE_F32 ? ((const float *)p)[i] : ct_bf16_to_f32(((const uint16_t *)p)[i]);
}

void ct_cpu_attention_decode(void *ctx, ct_dtype dt, void *out, void *kv, const void *qkv,
                             int64_t B, int64_t T_max, int64_t pos, int64_t n_head,
                             int64_t n_kv_head, int64_t hd) {
    cpu_ctx *c = ctx;
    const int64_t cq = n_head * hd, ckv = n_kv_head * hd, lqkv = cq + 2 * ckv, lkv = 2 * ckv;
    const int64_t group = n_head / n_kv_head, n = pos + 1;
    const size_t es = ct_dtype_size(dt);
    for (int64_t b = 0; b < B; b++)
        memcpy((char *)kv + (size_t)((b * T_max + pos) * lkv) * es,
               (const char *)qkv + (size_t)(b * lqkv + cq) * es, (size_t)lkv * es);
    const float scale = 1.0f / sqrtf((float)hd);
    /* per thread: the scores (n), the query and the output accumulator (hd each) */
    const size_t per_thread = round_up((size_t)(n + 2 * hd) * sizeof(float), 64);
    char *ws = ct_cpu_ws_get(c, per_thread * (size_t)c->n_threads);
    PARALLEL_FOR(threads_for(c, B * n_head * n * hd))
    for (int64_t bh = 0; bh < B * n_head; bh++) {
        float *S = (float *)(ws + per_thread * (size_t)omp_get_thread_num());
        float *q = S + n, *o = q + hd;
        const int64_t b = bh / n_head, h = bh % n_head;
        const int64_t k0 = b * T_max * lkv + (h / group) * hd, v0 = k0 + ckv;
        for (int64_t d = 0; d < hd; d++) q[d] = load_dt(dt, qkv, b * lqkv + h * hd + d);
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (int64_t d = 0; d < hd; d++) s += q[d] * load_dt(dt, kv, k0 + j * lkv + d);
            S[j] = scale * s;
            mx = fmaxf(mx, S[j]);
        }
        float sum = 0.0f;
        for (int64_t d = 0; d < hd; d++) o[d] = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            const float w = expf(S[j] - mx);
            sum += w;
            for (int64_t d = 0; d < hd; d++) o[d] += w * load_dt(dt, kv, v0 + j * lkv + d);
        }
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < hd; d++) {
            const float y = o[d] * inv;
            if (dt == CT_DTYPE_F32)
                ((float *)out)[b * cq + h * hd + d] = y;
            else
                ((uint16_t *)out)[b * cq + h * hd + d] = ct_f32_to_bf16(y);
        }
    }
}

void ct_cpu_attention_part_fwd(void *ctx, ct_dtype dt, float *o_acc, float *lse_acc,
                               const void *qkv, const void *kv, int64_t B, int64_t T,
                               int64_t n_head, int64_t n_kv_head, int64_t hd, int64_t chunks) {
    cpu_ctx *c = ctx;
    int64_t n_qkv = B * T * (n_head + 2 * n_kv_head) * hd, n_kv = B * T * 2 * n_kv_head * hd;
    attention_part_fwd_f32(c, o_acc, lse_acc, in_f32(c, 0, dt, qkv, n_qkv),
                           in_f32(c, 1, dt, kv, n_kv), B, T, n_head, n_kv_head, hd, chunks);
}

void ct_cpu_attention_part_bwd(void *ctx, ct_dtype dt, float *dq_acc, float *dkv_acc,
                               const void *dout, const void *qkv, const void *out, const float *lse,
                               const void *kv, int64_t B, int64_t T, int64_t n_head,
                               int64_t n_kv_head, int64_t hd, int64_t chunks) {
    cpu_ctx *c = ctx;
    int64_t n_out = B * T * n_head * hd, n_qkv = B * T * (n_head + 2 * n_kv_head) * hd,
            n_kv = B * T * 2 * n_kv_head * hd;
    attention_part_bwd_f32(c, dq_acc, dkv_acc, in_f32(c, 0, dt, dout, n_out),
                           in_f32(c, 1, dt, qkv, n_qkv), in_f32(c, 2, dt, out, n_out), lse,
                           in_f32(c, 3, dt, kv, n_kv), B, T, n_head, n_kv_head, hd, chunks);
}
