/*
 * check_ops.c — check mode's checker for each op of backend_ops.h (check_ops.h): the buffers the
 * op reads and writes, its shape string, and its tolerance, derived in the comment above it from
 * the rules of check_ops.h ("tolerances"). backend_check.c says how an op is checked.
 */
#include "check_ops.h"

/* ---- memory ops, checked: exact
 * ------------------------------------------------------------------
 */

void ct_check_fill(void *ctx, void *dst, ct_dtype dtype, int64_t n, float value) {
    check_ctx *k = ctx;
    op_check o = {
        .op = "fill", .exact = true, .n_args = 1, .arg = {{"dst", dst, n, dtype, ARG_OUT}}};
    SHAPE(&o, "dtype=%s n=%lld value=%.9g", ct_dtype_name(dtype), LL(n), value);
    run_fill(k, &o, dst, dtype, n, value);
    ct_check_op_end(k, &o);
}

void ct_check_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    check_ctx *k = ctx;
    op_check o = {.op = "copy",
                  .exact = true,
                  .n_args = 2,
                  .arg = {{"dst", dst, (int64_t)bytes, CT_DTYPE_U8, ARG_OUT},
                          {"src", src, (int64_t)bytes, CT_DTYPE_U8, ARG_IN}}};
    SHAPE(&o, "bytes=%zu", bytes);
    run_copy(k, &o, dst, src, bytes);
    ct_check_op_end(k, &o);
}

/* ---- GEMM, bias and vector ops ------------------------------------------------------------------
 */

/* C = alpha·op(A)·op(B) + beta·C, a reduction of K products per element: red_tol(K) relative to
 * |alpha|·Σ|a||b| + |beta||c| (the CPU run on absolute values), plus two roundings (alpha, the
 * beta·C add) per side: ULPS·U. bf16 A and B: products of bf16 values are exact in fp32. */
void ct_check_gemm(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                   void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    check_ctx *k = ctx;
    enum { MAT_A, MAT_B, MAT_C };
    int64_t nA = trans_a ? ct_strided_extent(K, M, lda) : ct_strided_extent(M, K, lda);
    int64_t nB = trans_b ? ct_strided_extent(N, K, ldb) : ct_strided_extent(K, N, ldb);
    op_check o = {.op = "gemm",
                  .n_args = 3,
                  .arg = {{"A", A, nA, ab_dtype, ARG_IN},
                          {"B", B, nB, ab_dtype, ARG_IN},
                          {"C", C, ct_strided_extent(M, N, ldc), c_dtype,
                           beta == 0.0f ? ARG_OUT : ARG_INOUT}}};
    SHAPE(&o,
          "trans_a=%d trans_b=%d M=%lld N=%lld K=%lld alpha=%.9g lda=%lld ldb=%lld beta=%.9g "
          "ldc=%lld ab_dtype=%s c_dtype=%s",
          trans_a, trans_b, LL(M), LL(N), LL(K), alpha, LL(lda), LL(ldb), beta, LL(ldc),
          ct_dtype_name(ab_dtype), ct_dtype_name(c_dtype));
    run_gemm(k, &o, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_dtype,
             c_dtype);
    op_arg *c = &o.arg[MAT_C];
    if (c->region >= 0) {
        void *a_abs = ct_check_cpu_abs_copy(k, &o.arg[MAT_A]),
             *b_abs = ct_check_cpu_abs_copy(k, &o.arg[MAT_B]);
        void *c_abs = ct_check_cpu_abs_copy(k, c);
        CPU(k)->gemm(CPU_CTX(k), trans_a, trans_b, M, N, K, fabsf(alpha), a_abs, lda, b_abs, ldb,
                     fabsf(beta), c_abs, ldc, ab_dtype, c_dtype);
        void *mag_raw = ct_xmalloc(arg_bytes(c));
        CPU(k)->copy_to_host(CPU_CTX(k), mag_raw, c_abs, arg_bytes(c));
        float *mag = ct_check_to_f32(c_dtype, mag_raw, c->n);
        ct_check_tol_add_rel(c->tol, mag, red_tol(K), c->n);
        ct_check_tol_add_rel(c->tol, c->want, ULPS * U, c->n);
        free(mag), free(mag_raw);
        if (a_abs != o.arg[MAT_A].cpu) CPU(k)->free(CPU_CTX(k), a_abs);
        if (b_abs != o.arg[MAT_B].cpu) CPU(k)->free(CPU_CTX(k), b_abs);
        CPU(k)->free(CPU_CTX(k), c_abs);
    }
    ct_check_op_end(k, &o);
}

/* out += bias: one add per element, ULPS·U relative to the terms. */
void ct_check_bias_add(void *ctx, ct_dtype dt, void *out, const void *bias, int64_t N, int64_t C) {
    check_ctx *k = ctx;
    enum { OUT, BIAS };
    op_check o = {.op = "bias_add",
                  .n_args = 2,
                  .arg = {{"out", out, N * C, dt, ARG_INOUT}, {"bias", bias, C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld", ct_dtype_name(dt), LL(N), LL(C));
    run_bias_add(k, &o, dt, out, bias, N, C);
    const op_arg *a = &o.arg[OUT], *b = &o.arg[BIAS];
    for (int64_t i = 0; i < N * C; i++)
        a->tol[i] = (float)(ULPS * U * (fabs(a->x[i]) + fabs(b->x[i % C])));
    ct_check_op_end(k, &o);
}

/* out = bias (+ residual): at most one add per element. */
void ct_check_bias_init(void *ctx, ct_dtype dt, void *out, const void *bias, const void *residual,
                        int64_t N, int64_t C) {
    check_ctx *k = ctx;
    enum { OUT, BIAS, RESIDUAL };
    op_check o = {.op = "bias_init",
                  .n_args = 3,
                  .arg = {{"out", out, N * C, dt, ARG_OUT},
                          {"bias", bias, C, dt, ARG_IN},
                          {"residual", residual, N * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld residual=%s", ct_dtype_name(dt), LL(N), LL(C),
          residual ? "yes" : "NULL");
    run_bias_init(k, &o, dt, out, bias, residual, N, C);
    const op_arg *a = &o.arg[OUT], *b = &o.arg[BIAS], *r = &o.arg[RESIDUAL];
    for (int64_t i = 0; i < N * C; i++)
        a->tol[i] = (float)(ULPS * U * (fabs(b->x[i % C]) + (r->x ? fabs(r->x[i]) : 0.0)));
    ct_check_op_end(k, &o);
}

/* dbias += Σ_rows dout: a reduction of N terms onto the accumulator. */
void ct_check_bias_grad(void *ctx, ct_dtype dt, float *dbias, const void *dout, int64_t N,
                        int64_t C) {
    check_ctx *k = ctx;
    enum { DBIAS, DOUT };
    op_check o = {
        .op = "bias_grad",
        .n_args = 2,
        .arg = {{"dbias", dbias, C, CT_DTYPE_F32, ARG_INOUT}, {"dout", dout, N * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld", ct_dtype_name(dt), LL(N), LL(C));
    run_bias_grad(k, &o, dt, dbias, dout, N, C);
    if (C > 0) {
        double *mag = ct_xcalloc((size_t)C, sizeof *mag);
        const op_arg *d = &o.arg[DBIAS];
        if (N > 0) ct_check_sum_abs_rows(mag, o.arg[DOUT].x, N, C);
        for (int64_t j = 0; j < C; j++) d->tol[j] = (float)(red_tol(N) * (mag[j] + fabs(d->x[j])));
        free(mag);
    }
    ct_check_op_end(k, &o);
}

/* dst += alpha·src: a multiply and an add, fused or not. */
void ct_check_axpy(void *ctx, ct_dtype dt, void *dst, const void *src, float alpha, int64_t n) {
    check_ctx *k = ctx;
    enum { DST, SRC };
    op_check o = {.op = "axpy",
                  .n_args = 2,
                  .arg = {{"dst", dst, n, dt, ARG_INOUT}, {"src", src, n, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s alpha=%.9g n=%lld", ct_dtype_name(dt), alpha, LL(n));
    run_axpy(k, &o, dt, dst, src, alpha, n);
    const op_arg *d = &o.arg[DST], *s = &o.arg[SRC];
    for (int64_t i = 0; i < n; i++)
        d->tol[i] = (float)(ULPS * U * (fabs(d->x[i]) + fabs((double)alpha * s->x[i])));
    ct_check_op_end(k, &o);
}

void ct_check_scale(void *ctx, ct_dtype dt, void *x, float s, int64_t n) {
    check_ctx *k = ctx;
    op_check o = {.op = "scale", .n_args = 1, .arg = {{"x", x, n, dt, ARG_INOUT}}};
    SHAPE(&o, "dt=%s s=%.9g n=%lld", ct_dtype_name(dt), s, LL(n));
    run_scale(k, &o, dt, x, s, n);
    ct_check_tol_add_rel(o.arg[0].tol, o.arg[0].want, ULPS * U, n);
    ct_check_op_end(k, &o);
}

/* ---- embeddings ----------------------------------------------------------------------------- */

/* A row gather: exact. */
void ct_check_embedding_fwd(void *ctx, ct_dtype dt, void *out, const int32_t *tokens,
                            const void *table, int64_t N, int64_t C, int64_t rows,
                            int64_t row_offset) {
    check_ctx *k = ctx;
    op_check o = {.op = "embedding_fwd",
                  .exact = true,
                  .n_args = 3,
                  .arg = {{"out", out, N * C, dt, ARG_OUT},
                          {"tokens", tokens, N, CT_DTYPE_I32, ARG_IN},
                          {"table", table, rows * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld rows=%lld row_offset=%lld", ct_dtype_name(dt), LL(N), LL(C),
          LL(rows), LL(row_offset));
    run_embedding_fwd(k, &o, dt, out, tokens, table, N, C, rows, row_offset);
    ct_check_op_end(k, &o);
}

/* ---- Mixture of Experts' row movements ---------------------------------------------------- */

/* out row i = Σ_j w_j · in[idx[i·k + j]]: a row gather (k 1, no weights) is exact; otherwise a
 * sum of k products, each rounded (fused or not): (red_tol(k) + ULPS·U)·Σ_j |w_j·r_j|. */
void ct_check_gather_rows(void *ctx, ct_dtype dt, void *out, const void *in, const int32_t *idx,
                          const float *w, int64_t N, int64_t slots, int64_t C, int64_t in_rows) {
    check_ctx *kx = ctx;
    const int64_t k = slots;
    enum { OUT, IN, IDX, W };
    op_check o = {.op = "gather_rows",
                  .exact = k == 1 && !w,
                  .n_args = 4,
                  .arg = {{"out", out, N * C, dt, ARG_OUT},
                          {"in", in, in_rows * C, dt, ARG_IN},
                          {"idx", idx, N * k, CT_DTYPE_I32, ARG_IN},
                          {"w", w, N * k, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld k=%lld C=%lld in_rows=%lld w=%s", ct_dtype_name(dt), LL(N), LL(k),
          LL(C), LL(in_rows), w ? "yes" : "NULL");
    run_gather_rows(kx, &o, dt, out, in, idx, w, N, k, C, in_rows);
    const op_arg *a = &o.arg[OUT];
    const int32_t *ix = o.arg[IDX].before;
    const float *wx = o.arg[W].x, *x = o.arg[IN].x;
    for (int64_t i = 0; !o.exact && a->region >= 0 && i < N; i++)
        for (int64_t c = 0; c < C; c++) {
            double mag = 0.0;
            for (int64_t j = 0; j < k; j++)
                mag += fabs((wx ? wx[i * k + j] : 1.0) * x[(int64_t)ix[i * k + j] * C + c]);
            a->tol[i * C + c] = (float)((red_tol(k) + ULPS * U) * mag);
        }
    ct_check_op_end(kx, &o);
}

/* out[r] = Σ_c a[ia[r], c]·b[ib[r], c] in double, rounded once: the two sides' doubles differ far
 * below fp32's spacing, so their roundings differ by at most an ulp or so of Σ|a·b|. */
void ct_check_gather_dot(void *ctx, ct_dtype dt, float *out, const void *a, const int32_t *ia,
                         const void *b, const int32_t *ib, int64_t R, int64_t C, int64_t a_rows,
                         int64_t b_rows) {
    check_ctx *k = ctx;
    enum { OUT, A, IA, B, IB };
    op_check o = {.op = "gather_dot",
                  .n_args = 5,
                  .arg = {{"out", out, R, CT_DTYPE_F32, ARG_OUT},
                          {"a", a, a_rows * C, dt, ARG_IN},
                          {"ia", ia, R, CT_DTYPE_I32, ARG_IN},
                          {"b", b, b_rows * C, dt, ARG_IN},
                          {"ib", ib, R, CT_DTYPE_I32, ARG_IN}}};
    SHAPE(&o, "dt=%s R=%lld C=%lld a_rows=%lld b_rows=%lld", ct_dtype_name(dt), LL(R), LL(C),
          LL(a_rows), LL(b_rows));
    run_gather_dot(k, &o, dt, out, a, ia, b, ib, R, C, a_rows, b_rows);
    const op_arg *d = &o.arg[OUT];
    const int32_t *ra = o.arg[IA].before, *rb = o.arg[IB].before;
    for (int64_t r = 0; d->region >= 0 && r < R; r++) {
        double mag = 0.0;
        for (int64_t c = 0; c < C; c++)
            mag += fabs((double)o.arg[A].x[(int64_t)ra[r] * C + c] *
                        o.arg[B].x[(int64_t)rb[r] * C + c]);
        d->tol[r] = (float)(ULPS * U * mag);
    }
    ct_check_op_end(k, &o);
}

/* dtable[row] += dout of each token of that row: a reduction over the row's tokens. */
void ct_check_embedding_bwd(void *ctx, ct_dtype dt, float *dtable, const void *dout,
                            const int32_t *tokens, int64_t N, int64_t C, int64_t rows,
                            int64_t row_offset) {
    check_ctx *k = ctx;
    enum { DTABLE, DOUT, TOKENS };
    op_check o = {.op = "embedding_bwd",
                  .n_args = 3,
                  .arg = {{"dtable", dtable, rows * C, CT_DTYPE_F32, ARG_INOUT},
                          {"dout", dout, N * C, dt, ARG_IN},
                          {"tokens", tokens, N, CT_DTYPE_I32, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld rows=%lld row_offset=%lld", ct_dtype_name(dt), LL(N), LL(C),
          LL(rows), LL(row_offset));
    run_embedding_bwd(k, &o, dt, dtable, dout, tokens, N, C, rows, row_offset);
    const op_arg *d = &o.arg[DTABLE];
    if (d->region >= 0) {
        double *mag = ct_xcalloc((size_t)(rows * C), sizeof *mag);
        int64_t *count = ct_xcalloc((size_t)rows, sizeof *count);
        const int32_t *tok = o.arg[TOKENS].before;
        for (int64_t i = 0; i < N; i++) {
            int64_t r = (int64_t)tok[i] - row_offset;
            if (r < 0 || r >= rows) continue;
            count[r]++;
            for (int64_t j = 0; j < C; j++) mag[r * C + j] += fabs(o.arg[DOUT].x[i * C + j]);
        }
        for (int64_t i = 0; i < rows * C; i++)
            d->tol[i] = (float)(red_tol(count[i / C]) * (mag[i] + fabs(d->x[i])));
        free(mag), free(count);
    }
    ct_check_op_end(k, &o);
}

/* out(B,T,C) += wpe[pos_offset + t]: one add per element. wpe is read up to row pos_offset + T. */
void ct_check_posemb_fwd(void *ctx, ct_dtype dt, void *out, const void *wpe, int64_t B, int64_t T,
                         int64_t C, int64_t pos_offset) {
    check_ctx *k = ctx;
    enum { OUT, WPE };
    op_check o = {.op = "posemb_fwd",
                  .n_args = 2,
                  .arg = {{"out", out, B * T * C, dt, ARG_INOUT},
                          {"wpe", wpe, (pos_offset + T) * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s B=%lld T=%lld C=%lld pos_offset=%lld", ct_dtype_name(dt), LL(B), LL(T), LL(C),
          LL(pos_offset));
    run_posemb_fwd(k, &o, dt, out, wpe, B, T, C, pos_offset);
    const op_arg *a = &o.arg[OUT], *w = &o.arg[WPE];
    for (int64_t i = 0; i < B * T * C; i++) {
        int64_t t = i / C % T, j = i % C;
        a->tol[i] = (float)(ULPS * U * (fabs(a->x[i]) + fabs(w->x[(pos_offset + t) * C + j])));
    }
    ct_check_op_end(k, &o);
}

/* dwpe[pos_offset + t] += Σ_b dout[b, t]: a reduction of B terms onto the accumulator. */
void ct_check_posemb_bwd(void *ctx, ct_dtype dt, float *dwpe, const void *dout, int64_t B,
                         int64_t T, int64_t C, int64_t pos_offset) {
    check_ctx *k = ctx;
    enum { DWPE, DOUT };
    op_check o = {.op = "posemb_bwd",
                  .n_args = 2,
                  .arg = {{"dwpe", dwpe, (pos_offset + T) * C, CT_DTYPE_F32, ARG_INOUT},
                          {"dout", dout, B * T * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s B=%lld T=%lld C=%lld pos_offset=%lld", ct_dtype_name(dt), LL(B), LL(T), LL(C),
          LL(pos_offset));
    run_posemb_bwd(k, &o, dt, dwpe, dout, B, T, C, pos_offset);
    const op_arg *d = &o.arg[DWPE];
    if (d->region >= 0) {
        int64_t n = (pos_offset + T) * C;
        double *mag = ct_xcalloc((size_t)n, sizeof *mag);
        for (int64_t b = 0; b < B; b++)
            ct_check_sum_abs_rows(mag + pos_offset * C, o.arg[DOUT].x + b * T * C, 1, T * C);
        for (int64_t i = 0; i < n; i++) d->tol[i] = (float)(red_tol(B) * (mag[i] + fabs(d->x[i])));
        free(mag);
    }
    ct_check_op_end(k, &o);
}

/* ---- layernorm ------------------------------------------------------------------------------ */

/*
 * mean = Σx/C: red_tol(C)·L with L = Σ|x|/C.
 * rstd = 1/sqrt(Σ(x - mean)²/C + eps): a sum of C non-negative terms (each with ~3 roundings),
 *   then sqrt and a divide: relative 2(C+8)·U; the mean's error δm ≤ red_tol(C)·L enters the
 *   variance only as δm², relative (δm·rstd)².
 * out = (x - mean)·rstd·w + b: the mean's error times rstd·|w|, the relative error of rstd times
 *   |n·w| (n = (x - mean)·rstd), and ULPS roundings of |n·w| + |b|.
 */
void ct_check_layernorm_fwd(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd, void *inp,
                            const void *residual, const void *w, const void *b, int64_t N,
                            int64_t C) {
    check_ctx *k = ctx;
    enum { OUT, MEAN, RSTD, INP, RESIDUAL, W, B };
    op_check o = {.op = "layernorm_fwd",
                  .n_args = 7,
                  .arg = {{"out", out, N * C, dt, ARG_OUT},
                          {"mean", mean, N, CT_DTYPE_F32, ARG_OUT},
                          {"rstd", rstd, N, CT_DTYPE_F32, ARG_OUT},
                          {"inp", inp, N * C, dt, residual ? ARG_INOUT : ARG_IN},
                          {"residual", residual, N * C, dt, ARG_IN},
                          {"w", w, C, dt, ARG_IN},
                          {"b", b, C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld residual=%s", ct_dtype_name(dt), LL(N), LL(C),
          residual ? "yes" : "NULL");
    run_layernorm_fwd(k, &o, dt, out, mean, rstd, inp, residual, w, b, N, C);
    /* the norm's input: inp, or the sum (rounded once to dt on both sides: exact, tolerance 0) */
    const float *x = residual ? o.arg[INP].want : o.arg[INP].x, *wf = o.arg[W].x, *bf = o.arg[B].x;
    const float *m = o.arg[MEAN].want, *s = o.arg[RSTD].want;
    for (int64_t i = 0; i < N && C > 0; i++) {
        double L = 0.0;
        for (int64_t j = 0; j < C; j++) L += fabs(x[i * C + j]);
        L /= (double)C;
        double dm = red_tol(C) * L, rel_s = 2.0 * (double)(C + 8) * U + (dm * s[i]) * (dm * s[i]);
        o.arg[MEAN].tol[i] = (float)dm;
        o.arg[RSTD].tol[i] = (float)(rel_s * fabs(s[i]));
        for (int64_t j = 0; j < C; j++) {
            double nw = fabs(((double)x[i * C + j] - m[i]) * s[i] * wf[j]);
            o.arg[OUT].tol[i * C + j] =
                (float)(dm * s[i] * fabs(wf[j]) + rel_s * nw + ULPS * U * (nw + fabs(bf[j])));
        }
    }
    ct_check_op_end(k, &o);
}

/*
 * With n = (x - mean)·rstd and g = dout·w (mean and rstd are inputs here, the same on both sides):
 *   dinp += rstd·(g - Σg/C - n·Σ(g·n)/C): two reductions of C terms, red_tol(C + 3) relative to
 *           |dinp| + rstd·(|g| + Σ|g|/C + |n|·Σ|g·n|/C);
 *   dw   += Σ_rows dout·n: red_tol(N + 3) relative to |dw| + Σ|dout·n| (n has ~3 roundings);
 *   db   += Σ_rows dout:   red_tol(N) relative to |db| + Σ|dout|.
 */
void ct_check_layernorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, float *db,
                            const void *dout, const void *inp, const void *w, const float *mean,
                            const float *rstd, int64_t N, int64_t C) {
    check_ctx *k = ctx;
    enum { DINP, DW, DB, DOUT, INP, W, MEAN, RSTD };
    op_check o = {.op = "layernorm_bwd",
                  .n_args = 8,
                  .arg = {{"dinp", dinp, N * C, dt, ARG_INOUT},
                          {"dw", dw, C, CT_DTYPE_F32, ARG_INOUT},
                          {"db", db, C, CT_DTYPE_F32, ARG_INOUT},
                          {"dout", dout, N * C, dt, ARG_IN},
                          {"inp", inp, N * C, dt, ARG_IN},
                          {"w", w, C, dt, ARG_IN},
                          {"mean", mean, N, CT_DTYPE_F32, ARG_IN},
                          {"rstd", rstd, N, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld", ct_dtype_name(dt), LL(N), LL(C));
    run_layernorm_bwd(k, &o, dt, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    if (N > 0 && C > 0) {
        const float *d = o.arg[DOUT].x, *x = o.arg[INP].x, *wf = o.arg[W].x;
        const float *m = o.arg[MEAN].x, *s = o.arg[RSTD].x;
        double *mag_dw = ct_xcalloc((size_t)C, sizeof *mag_dw);
        double *mag_db = ct_xcalloc((size_t)C, sizeof *mag_db);
        for (int64_t i = 0; i < N; i++) {
            double A = 0.0, G = 0.0; /* Σ|g|/C, Σ|g·n|/C */
            for (int64_t j = 0; j < C; j++) {
                double n = ((double)x[i * C + j] - m[i]) * s[i], g = (double)d[i * C + j] * wf[j];
                A += fabs(g), G += fabs(g * n);
                mag_dw[j] += fabs(d[i * C + j] * n);
                mag_db[j] += fabs(d[i * C + j]);
            }
            A /= (double)C, G /= (double)C;
            for (int64_t j = 0; j < C; j++) {
                double n = ((double)x[i * C + j] - m[i]) * s[i], g = (double)d[i * C + j] * wf[j];
                double mag =
                    fabs(o.arg[DINP].x[i * C + j]) + fabs(s[i]) * (fabs(g) + A + fabs(n) * G);
                o.arg[DINP].tol[i * C + j] = (float)(red_tol(C + 3) * mag);
            }
        }
        for (int64_t j = 0; j < C; j++) {
            o.arg[DW].tol[j] = (float)(red_tol(N + 3) * (mag_dw[j] + fabs(o.arg[DW].x[j])));
            o.arg[DB].tol[j] = (float)(red_tol(N) * (mag_db[j] + fabs(o.arg[DB].x[j])));
        }
        free(mag_dw), free(mag_db);
    }
    ct_check_op_end(k, &o);
}

/* ---- GELU ----------------------------------------------------------------------------------- */

/*
 * gelu(x) = x·σ(a), a = 2k(x + 0.044715x³) (k = sqrt(2/π)); the tanh form 0.5x(1 + tanh(a/2)) is
 * the same function. Error sources per side: a is computed with ~4 roundings (relative error
 * 4U·|a|), exp or tanh adds ~2 ulps, and σ's relative error is (1 - σ) times exp's, so gelu's
 * absolute error is ~|x|·σ(1-σ)·(|a| + 2)·4U plus a few roundings of the result; the tanh form
 * loses up to ~U·|x| absolute to the cancellation in 1 + tanh for negative x. Two sides, with
 * margin: 8U·(|gelu| + |x|·(1 + (|a| + 2)·σ(1-σ))).
 * gelu'(x) = σ + q with q = 2x·(da/dx / 2)·σ(1-σ): the same analysis, scaled by |dout|:
 *   8U·(|dinp| + |dout|·(1 + (|a| + 2)·(σ(1-σ) + |q|))).
 * gelu_bwd's dbias += Σ_rows dinp (before dinp's bf16 rounding): red_tol(N) relative to
 *   |dbias| + Σ|dinp|, plus the sum of the dinp tolerances of the column.
 */
#define GELU_K 0.7978845608028654
#define GELU_A 0.044715

static double gelu_arg(double x) {
    return 2.0 * GELU_K * (x + GELU_A * x * x * x);
}

static double sigmoid_slope(double a) { /* σ(a)·(1 - σ(a)) without overflow */
    double e = exp(-fabs(a));
    return e / ((1.0 + e) * (1.0 + e));
}

void ct_check_gelu_fwd(void *ctx, ct_dtype dt, void *out, const void *inp, int64_t n) {
    check_ctx *k = ctx;
    enum { OUT, INP };
    op_check o = {.op = "gelu_fwd",
                  .n_args = 2,
                  .arg = {{"out", out, n, dt, ARG_OUT}, {"inp", inp, n, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s n=%lld", ct_dtype_name(dt), LL(n));
    run_gelu_fwd(k, &o, dt, out, inp, n);
    for (int64_t i = 0; i < n; i++) {
        double x = o.arg[INP].x[i], a = gelu_arg(x);
        o.arg[OUT].tol[i] = (float)(8.0 * U *
                                    (fabs(o.arg[OUT].want[i]) +
                                     fabs(x) * (1.0 + (fabs(a) + 2.0) * sigmoid_slope(a))));
    }
    ct_check_op_end(k, &o);
}

void ct_check_gelu_bwd(void *ctx, ct_dtype dt, void *dinp, float *dbias, const void *inp,
                       const void *dout, int64_t N, int64_t C) {
    check_ctx *k = ctx;
    enum { DINP, DBIAS, INP, DOUT };
    op_check o = {.op = "gelu_bwd",
                  .n_args = 4,
                  .arg = {{"dinp", dinp, N * C, dt, ARG_OUT},
                          {"dbias", dbias, C, CT_DTYPE_F32, ARG_INOUT},
                          {"inp", inp, N * C, dt, ARG_IN},
                          {"dout", dout, N * C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld dbias=%s dinp%sdout", ct_dtype_name(dt), LL(N), LL(C),
          dbias ? "yes" : "NULL", dinp == dout ? "==" : "!=");
    run_gelu_bwd(k, &o, dt, dinp, dbias, inp, dout, N, C);
    const op_arg *di = &o.arg[DINP];
    for (int64_t i = 0; i < N * C; i++) {
        double x = o.arg[INP].x[i], a = gelu_arg(x), sl = sigmoid_slope(a);
        double q = 2.0 * x * GELU_K * (1.0 + 3.0 * GELU_A * x * x) * sl;
        di->tol[i] = (float)(8.0 * U *
                             (fabs(di->want[i]) +
                              fabs(o.arg[DOUT].x[i]) * (1.0 + (fabs(a) + 2.0) * (sl + fabs(q)))));
    }
    const op_arg *db = &o.arg[DBIAS];
    if (db->region >= 0) {
        double *mag = ct_xcalloc((size_t)C, sizeof *mag),
               *sum_tol = ct_xcalloc((size_t)C, sizeof *sum_tol);
        ct_check_sum_abs_rows(mag, di->want, N, C);
        ct_check_sum_abs_rows(sum_tol, di->tol, N, C);
        for (int64_t j = 0; j < C; j++)
            db->tol[j] = (float)(red_tol(N) * (mag[j] + fabs(db->x[j])) + sum_tol[j]);
        free(mag), free(sum_tol);
    }
    ct_check_op_end(k, &o);
}

/* ---- RMSNorm -------------------------------------------------------------------------------- */

/*
 * rstd = 1/sqrt(Σx²/C + eps): a sum of C non-negative terms (relative red_tol(C)), a divide, an
 *   add, a square root and a reciprocal (or one reciprocal square root, 2 ulps on a GPU):
 *   relative rel_s = red_tol(C) + 2·ULPS·U.
 * out = x·rstd·w: rstd's error plus two roundings, relative to |x·rstd·w|.
 */
void ct_check_rmsnorm_fwd(void *ctx, ct_dtype dt, void *out, float *rstd, void *inp,
                          const void *residual, const void *w, int64_t N, int64_t C, float eps) {
    check_ctx *k = ctx;
    enum { OUT, RSTD, INP, RESIDUAL, W };
    op_check o = {.op = "rmsnorm_fwd",
                  .n_args = 5,
                  .arg = {{"out", out, N * C, dt, ARG_OUT},
                          {"rstd", rstd, N, CT_DTYPE_F32, ARG_OUT},
                          {"inp", inp, N * C, dt, residual ? ARG_INOUT : ARG_IN},
                          {"residual", residual, N * C, dt, ARG_IN},
                          {"w", w, C, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld eps=%.9g residual=%s", ct_dtype_name(dt), LL(N), LL(C),
          (double)eps, residual ? "yes" : "NULL");
    run_rmsnorm_fwd(k, &o, dt, out, rstd, inp, residual, w, N, C, eps);
    /* the norm's input, as in layernorm_fwd */
    const float *x = residual ? o.arg[INP].want : o.arg[INP].x, *wf = o.arg[W].x;
    const float *s = o.arg[RSTD].want;
    double rel_s = red_tol(C) + 2.0 * ULPS * U;
    for (int64_t i = 0; i < N; i++) {
        o.arg[RSTD].tol[i] = (float)(rel_s * fabs(s[i]));
        for (int64_t j = 0; j < C; j++)
            o.arg[OUT].tol[i * C + j] =
                (float)((rel_s + ULPS * U) * fabs((double)x[i * C + j] * s[i] * wf[j]));
    }
    ct_check_op_end(k, &o);
}

/*
 * With g = dout·w and s = rstd (an input here, the same on both sides):
 *   dinp += s·g - x·s³·Σ(g·x)/C: one reduction of C terms and a few roundings, red_tol(C + 3)
 *           relative to |dinp| + s·|g| + |x|·s³·Σ|g·x|/C;
 *   dw   += Σ_rows dout·x·s: red_tol(N + 3) relative to |dw| + Σ|dout·x·s|.
 */
void ct_check_rmsnorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, const void *dout,
                          const void *inp, const void *w, const float *rstd, int64_t N, int64_t C) {
    check_ctx *k = ctx;
    enum { DINP, DW, DOUT, INP, W, RSTD };
    op_check o = {.op = "rmsnorm_bwd",
                  .n_args = 6,
                  .arg = {{"dinp", dinp, N * C, dt, ARG_INOUT},
                          {"dw", dw, C, CT_DTYPE_F32, ARG_INOUT},
                          {"dout", dout, N * C, dt, ARG_IN},
                          {"inp", inp, N * C, dt, ARG_IN},
                          {"w", w, C, dt, ARG_IN},
                          {"rstd", rstd, N, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld C=%lld", ct_dtype_name(dt), LL(N), LL(C));
    run_rmsnorm_bwd(k, &o, dt, dinp, dw, dout, inp, w, rstd, N, C);
    if (N > 0 && C > 0) {
        const float *d = o.arg[DOUT].x, *x = o.arg[INP].x, *wf = o.arg[W].x, *s = o.arg[RSTD].x;
        double *mag_dw = ct_xcalloc((size_t)C, sizeof *mag_dw);
        for (int64_t i = 0; i < N; i++) {
            double G = 0.0, s3 = (double)s[i] * s[i] * s[i]; /* Σ|g·x|/C */
            for (int64_t j = 0; j < C; j++) {
                G += fabs((double)d[i * C + j] * wf[j] * x[i * C + j]);
                mag_dw[j] += fabs((double)d[i * C + j] * x[i * C + j] * s[i]);
            }
            G /= (double)C;
            for (int64_t j = 0; j < C; j++) {
                double mag = fabs(o.arg[DINP].x[i * C + j]) +
                             fabs(s[i] * (double)d[i * C + j] * wf[j]) +
                             fabs(x[i * C + j]) * s3 * G;
                o.arg[DINP].tol[i * C + j] = (float)(red_tol(C + 3) * mag);
            }
        }
        for (int64_t j = 0; j < C; j++)
            o.arg[DW].tol[j] = (float)(red_tol(N + 3) * (mag_dw[j] + fabs(o.arg[DW].x[j])));
        free(mag_dw);
    }
    ct_check_op_end(k, &o);
}

/* ---- rotary position embedding -------------------------------------------------------------- */

/*
 * Each rotated element is a·cos ∓ b·sin of two inputs and two table entries (the same bytes on
 * both sides): two products and a sum, fused or not: ULPS·U·(|a| + |b|) (|cos|, |sin| ≤ 1). The
 * columns past the rotated heads must come back unchanged (exact: both sides leave them).
 */
void ct_check_rope(void *ctx, ct_dtype dt, void *x, const float *cos_sin, int64_t B, int64_t T,
                   int64_t n_rot_head, int64_t head_dim, int64_t ld, int64_t pos_offset,
                   bool inverse) {
    check_ctx *k = ctx;
    enum { X, TABLE };
    int64_t rows = B * T, cols = n_rot_head * head_dim;
    op_check o = {.op = "rope",
                  .n_args = 2,
                  .arg = {{"x", x, ct_strided_extent(rows, cols, ld), dt, ARG_INOUT},
                          {"cos_sin", cos_sin, (pos_offset + T) * head_dim, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s B=%lld T=%lld n_rot_head=%lld head_dim=%lld ld=%lld pos_offset=%lld %s",
          ct_dtype_name(dt), LL(B), LL(T), LL(n_rot_head), LL(head_dim), LL(ld), LL(pos_offset),
          inverse ? "inverse" : "forward");
    run_rope(k, &o, dt, x, cos_sin, B, T, n_rot_head, head_dim, ld, pos_offset, inverse);
    const float *v = o.arg[X].x;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j + 1 < cols; j += 2) {
            int64_t e = r * ld + j;
            float tol = (float)(ULPS * U * (fabs(v[e]) + fabs(v[e + 1])));
            o.arg[X].tol[e] = o.arg[X].tol[e + 1] = tol;
        }
    ct_check_op_end(k, &o);
}

/* ---- SwiGLU --------------------------------------------------------------------------------- */

/*
 * σ(a) = 1/(1 + e^-a) from an exact a: the exp's relative error (a GPU's fast exp is within
 * 2 + 1.2|a| ulps) moves σ by σ(1-σ) times it; EXP_REL(a) = 4U·(2 + |a|) bounds it (1 ulp ≤ 2U).
 *   out  = a·σ·u:                 8U·|out| + |a·u|·δσ, δσ = σ(1-σ)·EXP_REL(a);
 *   dup  = dout·a·σ:              8U·|dup| + |dout·a|·δσ;
 *   dgate = dout·u·σ(1 + a(1-σ)):  the factor's slope in σ is 1 + a - 2aσ, and its roundings
 *                                  are bounded by 4U·σ(1 + |a|(1-σ)) without assuming it does not
 *                                  cancel (it crosses 0 near a = -1.28): 8U·|dgate| +
 *                                  |dout·u|·(|1 + a - 2aσ|·δσ + 4U·σ(1 + |a|(1-σ))).
 * dgate and dup may interleave in one buffer (ct_swiglu_bwd's (N, 2H)), so each element's
 * tolerance goes to every output whose extent holds its address.
 */
#define EXP_REL(a) (4.0 * U * (2.0 + fabs(a)))

static double sigmoid_d(double a) {
    return 1.0 / (1.0 + exp(-a));
}

/* Sets the tolerance of the element at inner's address p in every output holding it. */
static void tol_at(op_check *o, const void *p, double tol) {
    for (int i = 0; i < o->n_args; i++) {
        op_arg *a = &o->arg[i];
        if (!(a->role & ARG_OUT) || a->region < 0) continue;
        size_t es = ct_dtype_size(a->dtype);
        uintptr_t lo = (uintptr_t)a->dev, q = (uintptr_t)p;
        if (q >= lo && q < lo + (size_t)a->n * es) a->tol[(q - lo) / es] = (float)tol;
    }
}

void ct_check_swiglu_fwd(void *ctx, ct_dtype dt, void *out, const void *gate, const void *up,
                         int64_t N, int64_t H, int64_t ld) {
    check_ctx *k = ctx;
    enum { OUT, GATE, UP };
    int64_t n = ct_strided_extent(N, H, ld);
    op_check o = {.op = "swiglu_fwd",
                  .n_args = 3,
                  .arg = {{"out", out, N * H, dt, ARG_OUT},
                          {"gate", gate, n, dt, ARG_IN},
                          {"up", up, n, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld H=%lld ld=%lld", ct_dtype_name(dt), LL(N), LL(H), LL(ld));
    run_swiglu_fwd(k, &o, dt, out, gate, up, N, H, ld);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < H; j++) {
            double a = o.arg[GATE].x[i * ld + j], u = o.arg[UP].x[i * ld + j];
            o.arg[OUT].tol[i * H + j] = (float)(8.0 * U * fabs(o.arg[OUT].want[i * H + j]) +
                                                fabs(a * u) * sigmoid_slope(a) * EXP_REL(a));
        }
    ct_check_op_end(k, &o);
}

void ct_check_swiglu_bwd(void *ctx, ct_dtype dt, void *dgate, void *dup, const void *gate,
                         const void *up, const void *dout, int64_t N, int64_t H, int64_t ld) {
    check_ctx *k = ctx;
    enum { DGATE, DUP, GATE, UP, DOUT };
    int64_t n = ct_strided_extent(N, H, ld);
    op_check o = {.op = "swiglu_bwd",
                  .n_args = 5,
                  .arg = {{"dgate", dgate, n, dt, ARG_OUT},
                          {"dup", dup, n, dt, ARG_OUT},
                          {"gate", gate, n, dt, ARG_IN},
                          {"up", up, n, dt, ARG_IN},
                          {"dout", dout, N * H, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld H=%lld ld=%lld", ct_dtype_name(dt), LL(N), LL(H), LL(ld));
    run_swiglu_bwd(k, &o, dt, dgate, dup, gate, up, dout, N, H, ld);
    size_t es = ct_dtype_size(dt);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < H; j++) {
            int64_t e = i * ld + j;
            double a = o.arg[GATE].x[e], u = o.arg[UP].x[e], d = o.arg[DOUT].x[i * H + j];
            double s = sigmoid_d(a), ds = sigmoid_slope(a) * EXP_REL(a);
            double f = s * (1.0 + a * (1.0 - s));
            double tol_up = 8.0 * U * fabs(d * a * s) + fabs(d * a) * ds;
            double tol_gate = 8.0 * U * fabs(d * u * f) +
                              fabs(d * u) * (fabs(1.0 + a - 2.0 * a * s) * ds +
                                             4.0 * U * s * (1.0 + fabs(a) * (1.0 - s)));
            tol_at(&o, (const char *)dgate + e * es, tol_gate);
            tol_at(&o, (const char *)dup + e * es, tol_up);
        }
    ct_check_op_end(k, &o);
}

/* ---- attention ------------------------------------------------------------------------------ */

/* Per (batch, kv column) the largest |value| of the K or V part of a packed qkv, over t:
 * max[b·ckv + c] for the columns at `col0` of each row. */
static float *column_max(const float *qkv, int64_t B, int64_t T, int64_t lqkv, int64_t col0,
                         int64_t ckv) {
    float *mx = ct_xcalloc((size_t)CT_MAX(B * ckv, 1), sizeof *mx);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < ckv; c++) {
                float v = fabsf(qkv[(b * T + t) * lqkv + col0 + c]);
                if (v > mx[b * ckv + c]) mx[b * ckv + c] = v;
            }
    return mx;
}

/* δs = red_tol(hd)·scale·Σ_d |q_d|·Kmax_d: how far a score scale·q·k of the query row q may be
 * off on either side, for any key whose columns are bounded by Kmax (column_max). */
static double score_tol(const float *q, const float *kmax, int64_t hd) {
    double S = 0.0;
    for (int64_t d = 0; d < hd; d++) S += fabs(q[d]) * kmax[d];
    return red_tol(hd) * (1.0 / sqrt((double)hd)) * S;
}

/* R·(|want| + M) for every element of the gradient a (B·T rows of C columns), M the largest
 * |want| of its head slice (batch element, hd columns). */
static void slice_rel_tol(const op_arg *a, int64_t B, int64_t T, int64_t C, int64_t hd, double R) {
    const int64_t n_slices = C / hd;
    float *smax = ct_xcalloc((size_t)CT_MAX(B * n_slices, 1), sizeof *smax);
    for (int64_t i = 0; i < B * T * C; i++) {
        int64_t s = i / (T * C) * n_slices + i % C / hd;
        smax[s] = fmaxf(smax[s], fabsf(a->want[i]));
    }
    for (int64_t i = 0; i < B * T * C; i++)
        a->tol[i] = (float)(R * (fabs(a->want[i]) + smax[i / (T * C) * n_slices + i % C / hd]));
    free(smax);
}

/*
 * Row t of head h (kv head h / group) sees keys 0..t. Its scores s_j = scale·q·k_j are dot
 * products of hd terms, each within red_tol(hd)·scale·Σ|q_d||k_jd| ≤ δs = red_tol(hd)·scale·
 * Σ_d |q_d|·Kmax_d of the other side's (Kmax_d: the largest |k| of column d in the batch element).
 * Perturbing every score by ≤ δs moves lse by ≤ δs and each softmax weight p_j by ≤ 2δs·p_j;
 * the sum of t+1 exponentials adds red_tol(t + 1). So:
 *   lse: δs + red_tol(t + 1) + ULPS·U·|lse|;
 *   out_d = Σ_j p_j·v_jd: (2δs + 3·red_tol(t + 1))·Vmax_d + ULPS·U·|out| (Σ p_j = 1: the weight
 *         errors, the normalisation and the sum of t+1 products are each bounded by Vmax_d).
 * bf16: a backend may round the weights to bf16 for the product P·V (CUDA's tensor cores do, as
 * FlashAttention does), each within BF16_U = 2^-8 relative: BF16_U·Σ_j p_j·|v_jd| ≤ BF16_U·Vmax_d
 * more for out (lse is computed from the fp32 weights).
 */
void ct_check_attention_fwd(void *ctx, ct_dtype dt, void *out, float *lse, const void *qkv,
                            int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                            int64_t head_dim) {
    check_ctx *k = ctx;
    enum { OUT, LSE, QKV };
    const int64_t hd = head_dim, cq = n_head * hd, ckv = n_kv_head * hd, lqkv = cq + 2 * ckv;
    op_check o = {.op = "attention_fwd",
                  .n_args = 3,
                  .arg = {{"out", out, B * T * cq, dt, ARG_OUT},
                          {"lse", lse, B * n_head * T, CT_DTYPE_F32, ARG_OUT},
                          {"qkv", qkv, B * T * lqkv, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s B=%lld T=%lld n_head=%lld n_kv_head=%lld head_dim=%lld", ct_dtype_name(dt),
          LL(B), LL(T), LL(n_head), LL(n_kv_head), LL(hd));
    run_attention_fwd(k, &o, dt, out, lse, qkv, B, T, n_head, n_kv_head, hd);
    if (o.arg[OUT].region >= 0) {
        const float *x = o.arg[QKV].x;
        float *kmax = column_max(x, B, T, lqkv, cq, ckv),
              *vmax = column_max(x, B, T, lqkv, cq + ckv, ckv);
        const int64_t group = n_head / n_kv_head;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < n_head; h++)
                for (int64_t t = 0; t < T; t++) {
                    const int64_t kv = b * ckv + (h / group) * hd;
                    const double ds = score_tol(x + (b * T + t) * lqkv + h * hd, kmax + kv, hd);
                    const double wr = dt == CT_DTYPE_BF16 ? BF16_U : 0.0; /* bf16 weights */
                    int64_t il = (b * n_head + h) * T + t;
                    o.arg[LSE].tol[il] =
                        (float)(ds + red_tol(t + 1) + ULPS * U * fabs(o.arg[LSE].want[il]));
                    for (int64_t d = 0; d < hd; d++) {
                        int64_t io = (b * T + t) * cq + h * hd + d;
                        o.arg[OUT].tol[io] =
                            (float)((2.0 * ds + 3.0 * red_tol(t + 1) + wr) * vmax[kv + d] +
                                    ULPS * U * fabs(o.arg[OUT].want[io]));
                    }
                }
        free(kmax), free(vmax);
    }
    ct_check_op_end(k, &o);
}

/*
 * Decoding: the cache row pos is a copy (exact); the output is attention_fwd's row pos (above)
 * with its n = pos + 1 keys, Kmax and Vmax taken over the cache rows 0..pos of the sequence.
 */
void ct_check_attention_decode(void *ctx, ct_dtype dt, void *out, void *kv, const void *qkv,
                               int64_t B, int64_t T_max, int64_t pos, int64_t n_head,
                               int64_t n_kv_head, int64_t head_dim) {
    check_ctx *k = ctx;
    enum { OUT, KV, QKV };
    const int64_t hd = head_dim, cq = n_head * hd, ckv = n_kv_head * hd, lqkv = cq + 2 * ckv;
    const int64_t n = pos + 1;
    op_check o = {.op = "attention_decode",
                  .n_args = 3,
                  .arg = {{"out", out, B * cq, dt, ARG_OUT},
                          {"kv", kv, B * T_max * 2 * ckv, dt, ARG_INOUT},
                          {"qkv", qkv, B * lqkv, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s B=%lld T_max=%lld pos=%lld n_head=%lld n_kv_head=%lld head_dim=%lld",
          ct_dtype_name(dt), LL(B), LL(T_max), LL(pos), LL(n_head), LL(n_kv_head), LL(hd));
    run_attention_decode(k, &o, dt, out, kv, qkv, B, T_max, pos, n_head, n_kv_head, hd);
    if (o.arg[OUT].region >= 0) {
        const int64_t group = n_head / n_kv_head;
        for (int64_t b = 0; b < B; b++) {
            /* the sequence's cache rows 0..pos (row pos now its own key and value) */
            float *kmax = column_max(o.arg[KV].want + b * T_max * 2 * ckv, 1, n, 2 * ckv, 0, ckv),
                  *vmax = column_max(o.arg[KV].want + b * T_max * 2 * ckv, 1, n, 2 * ckv, ckv, ckv);
            for (int64_t h = 0; h < n_head; h++) {
                const int64_t kvc = (h / group) * hd;
                const double ds = score_tol(o.arg[QKV].x + b * lqkv + h * hd, kmax + kvc, hd);
                const double wr = dt == CT_DTYPE_BF16 ? BF16_U : 0.0; /* bf16 weights */
                for (int64_t d = 0; d < hd; d++) {
                    const int64_t io = b * cq + h * hd + d;
                    o.arg[OUT].tol[io] =
                        (float)((2.0 * ds + 3.0 * red_tol(n) + wr) * vmax[kvc + d] +
                                ULPS * U * fabs(o.arg[OUT].want[io]));
                }
            }
            free(kmax), free(vmax);
        }
    }
    ct_check_op_end(k, &o);
}

/*
 * The one documented rtol/atol pair. A bound like the forward's would need every probability
 * (the op's own cost), so: dqkv's element i of head slice (batch b, part q/k/v, head h) within
 *   R·(|want_i| + M_slice),  R = 4·(T + hd + 8)·U,
 * M_slice the largest |want| of the slice: each gradient is a sum of at most T products of
 * softmax weights with dot products of hd terms (dV = Pᵀ·dO; dS = P ⊙ (dO·Vᵀ - D); dQ, dK =
 * scale·dS·K, dSᵀ·Q), so red_tol(T) + red_tol(hd) relative to the slice's magnitudes, doubled.
 * dbias += Σ_rows dqkv: red_tol(B·T) relative to |dbias| + Σ|dqkv|, plus the column's dqkv
 * tolerances. bf16: a backend may round P and dS to bf16 for their products (dV = Pᵀ·dO; dQ, dK:
 * CUDA's tensor cores), each term within BF16_U = 2^-8 relative; a gradient's terms add up in
 * absolute value to at most Σ_i p_ij ≤ 1 + ln T times the slice's scale (uniform weights 1/(i+1)
 * summed over the rows that see key j), so R grows by 2·(1 + ln T)·BF16_U, doubled as the rest.
 */
void ct_check_attention_bwd(void *ctx, ct_dtype dt, void *dqkv, float *dbias, const void *dout,
                            const void *qkv, const void *out, const float *lse, int64_t B,
                            int64_t T, int64_t n_head, int64_t n_kv_head, int64_t head_dim) {
    check_ctx *k = ctx;
    enum { DQKV, DBIAS, DOUT, QKV, OUT, LSE };
    const int64_t hd = head_dim, cq = n_head * hd, ckv = n_kv_head * hd, lqkv = cq + 2 * ckv;
    op_check o = {.op = "attention_bwd",
                  .n_args = 6,
                  .arg = {{"dqkv", dqkv, B * T * lqkv, dt, ARG_OUT},
                          {"dbias", dbias, lqkv, CT_DTYPE_F32, ARG_INOUT},
                          {"dout", dout, B * T * cq, dt, ARG_IN},
                          {"qkv", qkv, B * T * lqkv, dt, ARG_IN},
                          {"out", out, B * T * cq, dt, ARG_IN},
                          {"lse", lse, B * n_head * T, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s B=%lld T=%lld n_head=%lld n_kv_head=%lld head_dim=%lld dbias=%s",
          ct_dtype_name(dt), LL(B), LL(T), LL(n_head), LL(n_kv_head), LL(hd),
          dbias ? "yes" : "NULL");
    run_attention_bwd(k, &o, dt, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head, hd);
    const op_arg *dq = &o.arg[DQKV];
    if (dq->region >= 0 && hd > 0) {
        const double R = 4.0 * (double)(T + hd + 8) * U +
                         (dt == CT_DTYPE_BF16 ? 2.0 * (1.0 + log((double)T)) * BF16_U : 0.0);
        slice_rel_tol(dq, B, T, lqkv, hd, R); /* head slices: q heads, k heads, v heads */
        const op_arg *db = &o.arg[DBIAS];
        if (db->region >= 0) {
            double *mag = ct_xcalloc((size_t)lqkv, sizeof *mag);
            double *sum_tol = ct_xcalloc((size_t)lqkv, sizeof *sum_tol);
            ct_check_sum_abs_rows(mag, dq->want, B * T, lqkv);
            ct_check_sum_abs_rows(sum_tol, dq->tol, B * T, lqkv);
            for (int64_t j = 0; j < lqkv; j++)
                db->tol[j] = (float)(red_tol(B * T) * (mag[j] + fabs(db->x[j])) + sum_tol[j]);
            free(mag), free(sum_tol);
        }
    }
    ct_check_op_end(k, &o);
}

/* ---- ring attention (context parallelism) ---------------------------------------------------- */

/* A strided copy or conversion: exact (bf16 rounds to nearest even on both sides). */
void ct_check_cast_cols(void *ctx, void *dst, ct_dtype dst_dtype, int64_t ld_dst, const void *src,
                        ct_dtype src_dtype, int64_t ld_src, int64_t rows, int64_t cols) {
    check_ctx *k = ctx;
    op_check o = {.op = "cast_cols",
                  .exact = true,
                  .n_args = 2,
                  .arg = {{"dst", dst, ct_strided_extent(rows, cols, ld_dst), dst_dtype, ARG_OUT},
                          {"src", src, ct_strided_extent(rows, cols, ld_src), src_dtype, ARG_IN}}};
    SHAPE(&o, "%s -> %s rows=%lld cols=%lld ld_dst=%lld ld_src=%lld", ct_dtype_name(src_dtype),
          ct_dtype_name(dst_dtype), LL(rows), LL(cols), LL(ld_dst), LL(ld_src));
    run_cast_cols(k, &o, dst, dst_dtype, ld_dst, src, src_dtype, ld_src, rows, cols);
    ct_check_op_end(k, &o);
}

/* The shape string of a ring step's op: its sizes and its four chunk indices. */
static void part_shape(op_check *o, ct_dtype dt, int64_t B, int64_t T, int64_t n_head,
                       int64_t n_kv_head, int64_t hd, int64_t chunks) {
    SHAPE(o,
          "dt=%s B=%lld T=%lld n_head=%lld n_kv_head=%lld head_dim=%lld chunks=%lld,%lld|%lld,%lld",
          ct_dtype_name(dt), LL(B), LL(T), LL(n_head), LL(n_kv_head), LL(hd),
          LL(CT_ATT_CHUNK(chunks, 0)), LL(CT_ATT_CHUNK(chunks, 1)), LL(CT_ATT_CHUNK(chunks, 2)),
          LL(CT_ATT_CHUNK(chunks, 3)));
}

/* The keys a local row attends in one ring step: query chunk qa's row r (of ch) sees all ch keys
 * of each earlier key chunk and r + 1 of its own. */
static int64_t part_keys(int64_t chunks, int qa, int64_t r, int64_t ch) {
    int64_t n = 0;
    for (int ka = 0; ka < 2; ka++) {
        int64_t qc = CT_ATT_CHUNK(chunks, qa), kc = CT_ATT_CHUNK(chunks, 2 + ka);
        n += kc < qc ? ch : kc == qc ? r + 1 : 0;
    }
    return n;
}

/*
 * One ring step merges at most two blocks (the pairs of its query chunk) into the running (O, L).
 * A block of n keys is the forward's case (attention_fwd above): scores within δs, its
 * log-sum-exp Lb within e_b = δs + red_tol(n + 1), its normalised output within (2δs + 3·red_tol(
 * n + 1))·Vmax_d. A merge L' = max(L, Lb) + log1p(e^(−|L − Lb|)) adds a few roundings of |L'|
 * (ULPS·U·(1 + |L'|)), and its weights e^(L − L') and e^(Lb − L') move by e_L = e_b + ULPS·U·(1 +
 * |L'|) relative each, so O' = w·O + wb·Ob by e_L·(|O| + Vmax_d) each plus Ob's own error. Two
 * merges: twice each. Kmax and Vmax are over the block's rows of the batch element.
 */
void ct_check_attention_part_fwd(void *ctx, ct_dtype dt, float *o_acc, float *lse_acc,
                                 const void *qkv, const void *kv, int64_t B, int64_t T,
                                 int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                 int64_t chunks) {
    check_ctx *k = ctx;
    enum { O, LSE, QKV, KV };
    const int64_t hd = head_dim, cq = n_head * hd, ckv = n_kv_head * hd, lqkv = cq + 2 * ckv;
    op_check o = {.op = "attention_part_fwd",
                  .n_args = 4,
                  .arg = {{"o_acc", o_acc, B * T * cq, CT_DTYPE_F32, ARG_INOUT},
                          {"lse_acc", lse_acc, B * n_head * T, CT_DTYPE_F32, ARG_INOUT},
                          {"qkv", qkv, B * T * lqkv, dt, ARG_IN},
                          {"kv", kv, B * T * 2 * ckv, dt, ARG_IN}}};
    part_shape(&o, dt, B, T, n_head, n_kv_head, hd, chunks);
    run_attention_part_fwd(k, &o, dt, o_acc, lse_acc, qkv, kv, B, T, n_head, n_kv_head, hd, chunks);
    if (o.arg[O].region >= 0 && hd > 0) {
        const float *x = o.arg[QKV].x;
        float *kmax = column_max(o.arg[KV].x, B, T, 2 * ckv, 0, ckv),
              *vmax = column_max(o.arg[KV].x, B, T, 2 * ckv, ckv, ckv);
        const int64_t group = n_head / n_kv_head, ch = T / 2;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < n_head; h++)
                for (int64_t t = 0; t < T; t++) {
                    const int64_t kvc = b * ckv + (h / group) * hd;
                    const double ds = score_tol(x + (b * T + t) * lqkv + h * hd, kmax + kvc, hd);
                    const int64_t n = part_keys(chunks, (int)(t / ch), t % ch, ch);
                    const int64_t il = (b * n_head + h) * T + t;
                    const double e_l =
                        ds + red_tol(n + 1) + ULPS * U * (1.0 + fabs(o.arg[LSE].want[il]));
                    o.arg[LSE].tol[il] = (float)(2.0 * e_l);
                    for (int64_t d = 0; d < hd; d++) {
                        const int64_t io = (b * T + t) * cq + h * hd + d;
                        const double vm = vmax[kvc + d];
                        o.arg[O].tol[io] = (float)(2.0 * ((2.0 * ds + 3.0 * red_tol(n + 1)) * vm +
                                                          e_l * (fabs(o.arg[O].x[io]) + vm)) +
                                                   ULPS * U * fabs(o.arg[O].want[io]));
                    }
                }
        free(kmax), free(vmax);
    }
    ct_check_op_end(k, &o);
}

/*
 * attention_bwd's rtol/atol pair, for the sums of one ring step: dQ adds over at most T keys of
 * the block, dK and dV over the T local rows of each of the group's g query heads, each term a
 * softmax weight times dot products of hd terms, then added to the accumulator: R = 4·(g·T + hd +
 * 8)·U relative to |want| plus its head slice's largest |want|. Both backends keep P and dS in
 * fp32 here (bf16 inputs are widened), so no bf16 allowance.
 */
void ct_check_attention_part_bwd(void *ctx, ct_dtype dt, float *dq_acc, float *dkv_acc,
                                 const void *dout, const void *qkv, const void *out,
                                 const float *lse, const void *kv, int64_t B, int64_t T,
                                 int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                 int64_t chunks) {
    check_ctx *k = ctx;
    enum { DQ, DKV, DOUT, QKV, OUT, LSE, KV };
    const int64_t hd = head_dim, cq = n_head * hd, ckv = n_kv_head * hd, lqkv = cq + 2 * ckv;
    op_check o = {.op = "attention_part_bwd",
                  .n_args = 7,
                  .arg = {{"dq_acc", dq_acc, B * T * cq, CT_DTYPE_F32, ARG_INOUT},
                          {"dkv_acc", dkv_acc, B * T * 2 * ckv, CT_DTYPE_F32, ARG_INOUT},
                          {"dout", dout, B * T * cq, dt, ARG_IN},
                          {"qkv", qkv, B * T * lqkv, dt, ARG_IN},
                          {"out", out, B * T * cq, dt, ARG_IN},
                          {"lse", lse, B * n_head * T, CT_DTYPE_F32, ARG_IN},
                          {"kv", kv, B * T * 2 * ckv, dt, ARG_IN}}};
    part_shape(&o, dt, B, T, n_head, n_kv_head, hd, chunks);
    run_attention_part_bwd(k, &o, dt, dq_acc, dkv_acc, dout, qkv, out, lse, kv, B, T, n_head,
                           n_kv_head, hd, chunks);
    if (o.arg[DQ].region >= 0 && o.arg[DKV].region >= 0 && hd > 0) {
        const double R = 4.0 * (double)(n_head / n_kv_head * T + hd + 8) * U;
        slice_rel_tol(&o.arg[DQ], B, T, cq, hd, R);
        slice_rel_tol(&o.arg[DKV], B, T, 2 * ckv, hd, R);
    }
    ct_check_op_end(k, &o);
}

/* ---- cross-entropy -------------------------------------------------------------------------- */

/* A maximum: exact. */
void ct_check_xent_rowmax(void *ctx, ct_dtype dt, float *rowmax, const void *logits, int64_t N,
                          int64_t V, int64_t n_valid) {
    check_ctx *k = ctx;
    op_check o = {.op = "xent_rowmax",
                  .exact = true,
                  .n_args = 2,
                  .arg = {{"rowmax", rowmax, N, CT_DTYPE_F32, ARG_OUT},
                          {"logits", logits, N * V, dt, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld V=%lld n_valid=%lld", ct_dtype_name(dt), LL(N), LL(V), LL(n_valid));
    run_xent_rowmax(k, &o, dt, rowmax, logits, N, V, n_valid);
    ct_check_op_end(k, &o);
}

/*
 * e_j = exp(x_j - rowmax): the subtraction rounds (relative U of |x_j - rowmax|, which exp turns
 * into a relative error U·|x_j - rowmax| of e_j), exp adds ~2 ulps: per side U·e_j·(|x_j - m| + 4).
 *   keep_exp logits: 2U·e_j·(|x_j - m| + 4) (exact past n_valid: untouched);
 *   sumexp: red_tol(n_valid)·Σe + 2U·Σ e_j·(|x_j - m| + 4);
 *   target_logit: a copy of one logit: exact (zero tolerance).
 */
void ct_check_xent_sumexp(void *ctx, ct_dtype dt, float *sumexp, float *target_logit, void *logits,
                          const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                          int64_t n_valid, int64_t col_offset, bool keep_exp) {
    check_ctx *k = ctx;
    enum { SUMEXP, TARGET_LOGIT, LOGITS, TARGETS, ROWMAX };
    op_check o = {.op = "xent_sumexp",
                  .n_args = 5,
                  .arg = {{"sumexp", sumexp, N, CT_DTYPE_F32, ARG_OUT},
                          {"target_logit", target_logit, N, CT_DTYPE_F32, ARG_OUT},
                          {"logits", logits, N * V, dt, keep_exp ? ARG_INOUT : ARG_IN},
                          {"targets", targets, N, CT_DTYPE_I32, ARG_IN},
                          {"rowmax", rowmax, N, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld V=%lld n_valid=%lld col_offset=%lld keep_exp=%d", ct_dtype_name(dt),
          LL(N), LL(V), LL(n_valid), LL(col_offset), keep_exp);
    run_xent_sumexp(k, &o, dt, sumexp, target_logit, logits, targets, rowmax, N, V, n_valid,
                    col_offset, keep_exp);
    const float *x = o.arg[LOGITS].x, *m = o.arg[ROWMAX].x;
    for (int64_t i = 0; i < N && o.arg[SUMEXP].region >= 0; i++) {
        double sum = 0.0, err = 0.0;
        for (int64_t j = 0; j < n_valid; j++) {
            double y = (double)x[i * V + j] - m[i], e = exp(y);
            sum += e, err += e * (fabs(y) + 4.0);
            if (keep_exp) o.arg[LOGITS].tol[i * V + j] = (float)(2.0 * U * e * (fabs(y) + 4.0));
        }
        o.arg[SUMEXP].tol[i] = (float)(red_tol(n_valid) * sum + 2.0 * U * err);
    }
    ct_check_op_end(k, &o);
}

/*
 * losses = log(sumexp) + rowmax - target_logit: a log (~2 ulps) and two adds: ULPS·U·2 relative
 *   to |log(sumexp)| + |rowmax| + |target_logit|.
 * write_grad: logits_j = e_j·(dloss/sumexp) (- dloss at the target): a divide, a multiply and a
 *   subtract: ULPS·U·(|e_j·dloss/sumexp| + |result|), and ULPS·U·|dloss| at the target; padding
 *   columns are exactly 0.
 */
void ct_check_xent_finish(void *ctx, ct_dtype dt, float *losses, void *logits_to_grad,
                          const int32_t *targets, const float *rowmax, const float *sumexp,
                          const float *target_logit, int64_t N, int64_t V, int64_t n_valid,
                          int64_t col_offset, float dloss, bool write_grad) {
    check_ctx *k = ctx;
    enum { LOSSES, LOGITS, TARGETS, ROWMAX, SUMEXP, TARGET_LOGIT };
    op_check o = {.op = "xent_finish",
                  .n_args = 6,
                  .arg = {{"losses", losses, N, CT_DTYPE_F32, ARG_OUT},
                          {"logits", logits_to_grad, N * V, dt, write_grad ? ARG_INOUT : ARG_IN},
                          {"targets", targets, N, CT_DTYPE_I32, ARG_IN},
                          {"rowmax", rowmax, N, CT_DTYPE_F32, ARG_IN},
                          {"sumexp", sumexp, N, CT_DTYPE_F32, ARG_IN},
                          {"target_logit", target_logit, N, CT_DTYPE_F32, ARG_IN}}};
    SHAPE(&o, "dt=%s N=%lld V=%lld n_valid=%lld col_offset=%lld dloss=%.9g write_grad=%d",
          ct_dtype_name(dt), LL(N), LL(V), LL(n_valid), LL(col_offset), dloss, write_grad);
    run_xent_finish(k, &o, dt, losses, logits_to_grad, targets, rowmax, sumexp, target_logit, N, V,
                    n_valid, col_offset, dloss, write_grad);
    const float *m = o.arg[ROWMAX].x, *se = o.arg[SUMEXP].x, *tl = o.arg[TARGET_LOGIT].x;
    const int32_t *tgt = o.arg[TARGETS].before;
    for (int64_t i = 0; i < N && o.arg[LOSSES].region >= 0; i++) {
        o.arg[LOSSES].tol[i] =
            (float)(2.0 * ULPS * U * (fabs(log(se[i])) + fabs(m[i]) + fabs(tl[i])));
        if (!write_grad) continue;
        const op_arg *l = &o.arg[LOGITS];
        double g = (double)dloss / se[i];
        for (int64_t j = 0; j < n_valid; j++)
            l->tol[i * V + j] =
                (float)(ULPS * U * (fabs(l->x[i * V + j] * g) + fabs(l->want[i * V + j])));
        int64_t t = (int64_t)tgt[i] - col_offset;
        if (t >= 0 && t < n_valid) l->tol[i * V + t] += (float)(ULPS * U * fabs(dloss));
    }
    ct_check_op_end(k, &o);
}

/* ---- optimizer, norms, casts ---------------------------------------------------------------- */

/*
 * Per element (cpu/adamw.c gives the exact operation order), with g = grad·grad_scale:
 *   m' = β1·m + (1-β1)·g:        ULPS·U·(|β1·m| + |(1-β1)·g|)
 *   v' = β2·v + (1-β2)·g²:       ULPS·U·v' (all terms non-negative)
 *   upd = m̂/(sqrt(v̂) + eps) + wd·p, m̂ = m'/bc1, v̂ = v'/bc2: the error of m' divided by the
 *         denominator, plus |m̂|/den times (half v's relative error + ~4 roundings), plus
 *         ULPS roundings of the terms;
 *   p' = p - lr·upd:             ULPS·U·(|p| + lr·|upd|) + lr·(upd's error).
 * param_copy holds p' in its dtype (bf16: rounded, one ulp at the comparison). Elements outside
 * the segments are untouched: exact.
 */
void ct_check_adamw(void *ctx, float *param, const float *grad, float *m, float *v,
                    const ct_adamw_segment *segments, int n_segments, const ct_adamw_hparams *hp,
                    void *param_copy, ct_dtype copy_dtype) {
    check_ctx *k = ctx;
    enum { PARAM, GRAD, M, V, PARAM_COPY };
    int64_t n = 0; /* the flat range ends at the last segment's end (the slot is not told more) */
    for (int s = 0; s < n_segments; s++) n = CT_MAX(n, segments[s].offset + segments[s].count);
    op_check o = {.op = "adamw",
                  .n_args = 5,
                  .arg = {{"param", param, n, CT_DTYPE_F32, ARG_INOUT},
                          {"grad", grad, n, CT_DTYPE_F32, ARG_IN},
                          {"m", m, n, CT_DTYPE_F32, ARG_INOUT},
                          {"v", v, n, CT_DTYPE_F32, ARG_INOUT},
                          {"param_copy", param_copy, n, copy_dtype, ARG_OUT}}};
    SHAPE(&o,
          "n_segments=%d (elements [0, %lld)) lr=%.9g beta1=%.9g beta2=%.9g eps=%.9g step=%lld "
          "grad_scale=%.9g param_copy=%s",
          n_segments, LL(n), hp->lr, hp->beta1, hp->beta2, hp->eps, LL(hp->step), hp->grad_scale,
          param_copy ? ct_dtype_name(copy_dtype) : "NULL");
    run_adamw(k, &o, param, grad, m, v, segments, n_segments, hp, param_copy, copy_dtype);
    const double b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, eps = hp->eps;
    const double bc1 = 1.0 - pow(b1, (double)hp->step), bc2 = 1.0 - pow(b2, (double)hp->step);
    for (int s = 0; s < n_segments && n > 0; s++) {
        const double wd = segments[s].weight_decay;
        for (int64_t i = segments[s].offset; i < segments[s].offset + segments[s].count; i++) {
            double p0 = o.arg[PARAM].x[i], g = (double)o.arg[GRAD].x[i] * hp->grad_scale;
            double tol_m = ULPS * U * (fabs(b1 * o.arg[M].x[i]) + fabs((1.0 - b1) * g));
            double v1 = o.arg[V].want[i], tol_v = ULPS * U * fabs(v1);
            double den = sqrt(fabs(v1) / bc2) + eps, ratio = fabs(o.arg[M].want[i] / bc1) / den;
            double d_upd = tol_m / bc1 / den + ratio * (0.5 * ULPS * U + 4.0 * U) +
                           ULPS * U * (ratio + fabs(wd * p0));
            double tol_p = ULPS * U * (fabs(p0) + lr * (ratio + fabs(wd * p0))) + lr * d_upd;
            o.arg[M].tol[i] = (float)tol_m;
            o.arg[V].tol[i] = (float)tol_v;
            o.arg[PARAM].tol[i] = (float)tol_p;
            if (o.arg[PARAM_COPY].tol) o.arg[PARAM_COPY].tol[i] = (float)tol_p;
        }
    }
    ct_check_op_end(k, &o);
}

/* out[i] = Σ x_i² (in double on the CPU): a reduction of n_i non-negative terms, held to the fp32
 * rule red_tol(n_i)·out[i] (Σ|terms| = out[i]), so a backend may sum in fp32. The backend under
 * test runs all count ranges in one call, as the model makes it; the check is one per range
 * (an op_check holds a bounded number of arguments), every snapshot taken before that call. */
void ct_check_sumsq(void *ctx, float *out, const float *const *x, const int64_t *n, int count) {
    check_ctx *k = ctx;
    enum { OUT, X };
    op_check *o = ct_xcalloc((size_t)CT_MAX(count, 1), sizeof *o);
    for (int i = 0; i < count; i++) {
        o[i] = (op_check){.op = "sumsq",
                          .n_args = 2,
                          .arg = {{"out", out + i, 1, CT_DTYPE_F32, ARG_OUT},
                                  {"x", x[i], n[i], CT_DTYPE_F32, ARG_IN}}};
        SHAPE(&o[i], "range %d of %d, n=%lld", i, count, LL(n[i]));
        ct_check_op_begin(k, &o[i]);
    }
    INNER(k)->sumsq(INNER_CTX(k), out, x, n, count);
    for (int i = 0; i < count; i++) {
        const float *cx = o[i].arg[X].cpu;
        CPU(k)->sumsq(CPU_CTX(k), o[i].arg[OUT].cpu, &cx, &n[i], 1);
        ct_check_op_collect(k, &o[i]);
        ct_check_tol_add_rel(o[i].arg[OUT].tol, o[i].arg[OUT].want, red_tol(n[i]), 1);
        ct_check_op_end(k, &o[i]);
    }
    free(o);
}

/* f32 <-> bf16 round to nearest even, or a copy: exact. */
void ct_check_cast(void *ctx, void *dst, ct_dtype dst_dtype, const void *src, ct_dtype src_dtype,
                   int64_t n) {
    check_ctx *k = ctx;
    op_check o = {.op = "cast",
                  .exact = true,
                  .n_args = 2,
                  .arg = {{"dst", dst, n, dst_dtype, ARG_OUT}, {"src", src, n, src_dtype, ARG_IN}}};
    SHAPE(&o, "%s -> %s n=%lld", ct_dtype_name(src_dtype), ct_dtype_name(dst_dtype), LL(n));
    run_cast(k, &o, dst, dst_dtype, src, src_dtype, n);
    ct_check_op_end(k, &o);
}
