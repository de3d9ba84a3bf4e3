/*
 * backend_cpu.c — the CPU backend: every slot of struct ct_backend_i, for fp32 and bf16 (see
 * "bf16: the slots" near the end). It is the numerical reference the other backends are tested
 * against, and it is meant to be fast on a few cores:
 *   - GEMMs go to oneDNN's matmul (cpu_gemm.h; bf16: AMX or AVX512-BF16 kernels, fp32
 *     accumulation), fp32 ones as fixed tiles each on one thread (ct_cpu_gemm), or to OpenBLAS's
 *     cblas_sgemm with COOKTRAIN_CPU_SGEMM=openblas; transposes are passed as flags;
 *   - every other op is an OpenMP loop over rows / elements with vectorisable inner loops;
 *   - one thread pool: OpenMP for our loops and the OpenMP build of OpenBLAS. A cblas call made
 *     inside one of our parallel regions runs single-threaded, which is what attention wants.
 *
 * Determinism: results are bit-identical for any thread count. Work is split over threads only
 * along dimensions whose elements are computed independently; every reduction runs in an order
 * fixed by the data shape alone:
 *   - sums inside a row (layernorm, softmax, cross-entropy) use 16 lane accumulators combined by
 *     a fixed tree (lane_sum), so they do not depend on vectoriser peeling or on alignment;
 *   - sums across rows (bias_grad, layernorm_bwd dw/db, gelu_bwd's dbias) use chunks of
 *     CHUNK_ROWS rows whose partials are combined in chunk order (add_chunk_partials); sumsq uses
 *     chunks of SUMSQ_CHUNK elements in double;
 *   - posemb_bwd sums the batch in order for each position; embedding_bwd is parallel over
 *     channel blocks and adds tokens in order (no atomics);
 *   - attention is parallel over (batch, head) — over (batch, kv head) in backward, where the
 *     query heads of a group are visited in order and accumulate into the shared dk/dv.
 *
 * Transcendentals: expf/tanhf from libm do not vectorise without -ffast-math, so exp_f32
 * (cpu_kernels.h) is a small vectorisable exp (Cody–Waite reduction + degree-7 Taylor polynomial,
 * about 1 ulp over the range that matters) used by softmax, cross-entropy and GELU (written with
 * the logistic function, which equals the tanh form and keeps its accuracy for negative inputs).
 *
 * Memory: on a few cores most non-GEMM ops are bound by memory bandwidth (~24 GB/s on the
 * development VM), so the ops are shaped to touch each tensor as few times as possible: linear
 * outputs start as their bias and the GEMM accumulates (bias_init), the residual add is done in
 * the pass of the norm that reads the sum, gelu_bwd sums the bias gradient of the layer before
 * it, the cross-entropy keeps its exponentials for the gradient, and attention prefetches the
 * next head's slices. Explicit AVX-512 appears only where the compiler cannot find it (a 16x16
 * transpose), with a plain-C path beside it.
 *
 * The context keeps one workspace (partial sums, attention scratch), grown on demand and owned by
 * the backend; it is not counted in the per-category accounting of backend.c. Ops on one backend
 * must be issued from one thread at a time.
 */
#include "cpu_kernels.h"

#include "cpu_gemm.h"
#include <omp.h>
#include <stdio.h>

/* Provided by OpenBLAS (declared in its cblas.h as well; repeated here for older headers). */
void openblas_set_num_threads(int num_threads);

/* ---- bf16: the slots ------------------------------------------------------------------------
 *
 * Each slot takes the storage dtype of its activations and parameters (backend.h). fp32 goes
 * straight to the kernels (cpu_kernels.c, cpu_attention.c). bf16 runs the same kernels on fp32
 * copies: every bf16 operand is widened into a staging buffer (exact: a bf16 value is an fp32
 * value), the kernel runs in fp32, and every output is rounded back to nearest even. So the bf16
 * path computes exactly what the fp32 reference computes on the rounded inputs, rounded once at the
 * end — the numerics mixed precision promises (fp32 arithmetic and accumulation, bf16 storage) — at
 * the price of one extra pass over each operand. GEMMs are the exception: oneDNN reads bf16
 * directly (cpu_gemm.h).
 */

/* Staging buffer k, at least n floats. */
static float *stage_buf(cpu_ctx *c, int k, int64_t n) {
    size_t bytes = (size_t)CT_MAX(n, 1) * sizeof(float);
    if (bytes > c->stage_bytes[k]) {
        free(c->stage[k]);
        c->stage_bytes[k] = round_up(bytes, 64);
        c->stage[k] = aligned_alloc(64, c->stage_bytes[k]);
        CT_ASSERTF(c->stage[k] != NULL, "cpu backend: out of memory for a %zu-byte bf16 stage",
                   c->stage_bytes[k]);
    }
    return c->stage[k];
}

static void widen(cpu_ctx *c, float *dst, const uint16_t *src, int64_t n) {
    CT_PRAGMA(omp parallel for simd schedule(static) num_threads(threads_for(c, n)))
    for (int64_t i = 0; i < n; i++) dst[i] = ct_bf16_to_f32(src[i]);
}

static void narrow(cpu_ctx *c, uint16_t *dst, const float *src, int64_t n) {
    CT_PRAGMA(omp parallel for simd schedule(static) num_threads(threads_for(c, n)))
    for (int64_t i = 0; i < n; i++) dst[i] = ct_f32_to_bf16(src[i]);
}

/* An input operand as fp32: the pointer itself for f32, else widened into staging buffer k. */
static const float *in_f32(cpu_ctx *c, int k, ct_dtype dt, const void *p, int64_t n) {
    if (dt == CT_DTYPE_F32 || !p) return p;
    float *f = stage_buf(c, k, n);
    widen(c, f, p, n);
    return f;
}

/* An output operand as fp32: the pointer itself for f32, else staging buffer k — holding the
 * widened current values when the op reads them (accumulates or updates in place). */
static float *out_f32(cpu_ctx *c, int k, ct_dtype dt, void *p, int64_t n, bool reads) {
    if (dt == CT_DTYPE_F32) return p;
    float *f = stage_buf(c, k, n);
    if (reads) widen(c, f, p, n);
    return f;
}

/* Stores an output obtained from out_f32 (bf16: rounded to nearest even). */
static void out_done(cpu_ctx *c, ct_dtype dt, void *p, const float *f, int64_t n) {
    if (dt != CT_DTYPE_F32) narrow(c, p, f, n);
}

static void slot_bias_add(void *ctx, ct_dtype dt, void *out, const void *bias, int64_t N,
                          int64_t C) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, N * C, true);
    ct_cpu_bias_add(c, o, in_f32(c, 1, dt, bias, C), N, C);
    out_done(c, dt, out, o, N * C);
}

static void slot_bias_init(void *ctx, ct_dtype dt, void *out, const void *bias,
                           const void *residual, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, N * C, false);
    ct_cpu_bias_init(c, o, in_f32(c, 1, dt, bias, C), in_f32(c, 2, dt, residual, N * C), N, C);
    out_done(c, dt, out, o, N * C);
}

static void slot_gather_rows(void *ctx, ct_dtype dt, void *out, const void *in, const int32_t *idx,
                             const float *w, int64_t N, int64_t k, int64_t C, int64_t in_rows) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, N * C, false);
    ct_cpu_gather_rows(c, o, in_f32(c, 1, dt, in, in_rows * C), idx, w, N, k, C);
    out_done(c, dt, out, o, N * C);
}

static void slot_gather_dot(void *ctx, ct_dtype dt, float *out, const void *a, const int32_t *ia,
                            const void *b, const int32_t *ib, int64_t R, int64_t C, int64_t a_rows,
                            int64_t b_rows) {
    cpu_ctx *c = ctx;
    ct_cpu_gather_dot(c, out, in_f32(c, 0, dt, a, a_rows * C), ia, in_f32(c, 1, dt, b, b_rows * C),
                      ib, R, C);
}

static void slot_bias_grad(void *ctx, ct_dtype dt, float *dbias, const void *dout, int64_t N,
                           int64_t C) {
    cpu_ctx *c = ctx;
    ct_cpu_bias_grad(c, dbias, in_f32(c, 0, dt, dout, N * C), N, C);
}

static void slot_axpy(void *ctx, ct_dtype dt, void *dst, const void *src, float alpha, int64_t n) {
    cpu_ctx *c = ctx;
    float *d = out_f32(c, 0, dt, dst, n, true);
    ct_cpu_axpy(c, d, in_f32(c, 1, dt, src, n), alpha, n);
    out_done(c, dt, dst, d, n);
}

static void slot_scale(void *ctx, ct_dtype dt, void *x, float s, int64_t n) {
    cpu_ctx *c = ctx;
    float *f = out_f32(c, 0, dt, x, n, true);
    ct_cpu_scale(c, f, s, n);
    out_done(c, dt, x, f, n);
}

static void slot_embedding_bwd(void *ctx, ct_dtype dt, float *dtable, const void *dout,
                               const int32_t *tokens, int64_t N, int64_t C, int64_t rows,
                               int64_t row_offset) {
    cpu_ctx *c = ctx;
    ct_cpu_embedding_bwd(c, dtable, in_f32(c, 0, dt, dout, N * C), tokens, N, C, rows, row_offset);
}

static void slot_posemb_fwd(void *ctx, ct_dtype dt, void *out, const void *wpe, int64_t B,
                            int64_t T, int64_t C, int64_t pos_offset) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, B * T * C, true);
    ct_cpu_posemb_fwd(c, o, in_f32(c, 1, dt, wpe, (pos_offset + T) * C), B, T, C, pos_offset);
    out_done(c, dt, out, o, B * T * C);
}

static void slot_posemb_bwd(void *ctx, ct_dtype dt, float *dwpe, const void *dout, int64_t B,
                            int64_t T, int64_t C, int64_t pos_offset) {
    cpu_ctx *c = ctx;
    ct_cpu_posemb_bwd(c, dwpe, in_f32(c, 0, dt, dout, B * T * C), B, T, C, pos_offset);
}

static void slot_layernorm_fwd(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd,
                               void *inp, const void *residual, const void *w, const void *b,
                               int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    if (residual) slot_axpy(c, dt, inp, residual, 1.0f, N * C); /* the sum, rounded and stored */
    float *o = out_f32(c, 0, dt, out, N * C, false);
    ct_cpu_layernorm_fwd(c, o, mean, rstd, in_f32(c, 1, dt, inp, N * C), in_f32(c, 2, dt, w, C),
                         in_f32(c, 3, dt, b, C), N, C);
    out_done(c, dt, out, o, N * C);
}

static void slot_layernorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, float *db,
                               const void *dout, const void *inp, const void *w, const float *mean,
                               const float *rstd, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    float *di = out_f32(c, 0, dt, dinp, N * C, true); /* accumulates */
    ct_cpu_layernorm_bwd(c, di, dw, db, in_f32(c, 1, dt, dout, N * C), in_f32(c, 2, dt, inp, N * C),
                         in_f32(c, 3, dt, w, C), mean, rstd, N, C);
    out_done(c, dt, dinp, di, N * C);
}

static void slot_gelu_fwd(void *ctx, ct_dtype dt, void *out, const void *inp, int64_t n) {
    cpu_ctx *c = ctx;
    float *o = out_f32(c, 0, dt, out, n, false);
    ct_cpu_gelu_fwd(c, o, in_f32(c, 1, dt, inp, n), n);
    out_done(c, dt, out, o, n);
}

static void slot_gelu_bwd(void *ctx, ct_dtype dt, void *dinp, float *dbias, const void *inp,
                          const void *dout, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    const float *dO = in_f32(c, 1, dt, dout, N * C); /* before dinp's stage: they may alias */
    float *di = out_f32(c, 0, dt, dinp, N * C, false);
    ct_cpu_gelu_bwd(c, di, dbias, in_f32(c, 2, dt, inp, N * C), dO, N, C);
    out_done(c, dt, dinp, di, N * C);
}

static void slot_rmsnorm_fwd(void *ctx, ct_dtype dt, void *out, float *rstd, void *inp,
                             const void *residual, const void *w, int64_t N, int64_t C, float eps) {
    cpu_ctx *c = ctx;
    if (residual) slot_axpy(c, dt, inp, residual, 1.0f, N * C);
    float *o = out_f32(c, 0, dt, out, N * C, false);
    ct_cpu_rmsnorm_fwd(c, o, rstd, in_f32(c, 1, dt, inp, N * C), in_f32(c, 2, dt, w, C), N, C, eps);
    out_done(c, dt, out, o, N * C);
}

static void slot_rmsnorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, const void *dout,
                             const void *inp, const void *w, const float *rstd, int64_t N,
                             int64_t C) {
    cpu_ctx *c = ctx;
    float *di = out_f32(c, 0, dt, dinp, N * C, true); /* accumulates */
    ct_cpu_rmsnorm_bwd(c, di, dw, in_f32(c, 1, dt, dout, N * C), in_f32(c, 2, dt, inp, N * C),
                       in_f32(c, 3, dt, w, C), rstd, N, C);
    out_done(c, dt, dinp, di, N * C);
}

/* out_done for `rows` rows of `cols` at row stride ld: only those elements are stored, so the
 * columns between (another operand's, or untouched) keep their bytes. */
static void out_done_rows(cpu_ctx *c, ct_dtype dt, void *p, const float *f, int64_t rows,
                          int64_t cols, int64_t ld) {
    if (dt == CT_DTYPE_F32) return;
    PARALLEL_FOR(threads_for(c, rows * cols))
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++)
            ((uint16_t *)p)[r * ld + j] = ct_f32_to_bf16(f[r * ld + j]);
}

static void slot_rope(void *ctx, ct_dtype dt, void *x, const float *cos_sin, int64_t B, int64_t T,
                      int64_t n_rot_head, int64_t head_dim, int64_t ld, int64_t pos_offset,
                      bool inverse) {
    cpu_ctx *c = ctx;
    int64_t cols = n_rot_head * head_dim;
    float *xf = out_f32(c, 0, dt, x, ct_strided_extent(B * T, cols, ld), true); /* in place */
    ct_cpu_rope(c, xf, cos_sin, B, T, n_rot_head, head_dim, ld, pos_offset, inverse);
    out_done_rows(c, dt, x, xf, B * T, cols, ld);
}

/* SwiGLU is elementwise: bf16 is read and written in place (cpu_llama.c), no staging. */
static void slot_swiglu_fwd(void *ctx, ct_dtype dt, void *out, const void *gate, const void *up,
                            int64_t N, int64_t H, int64_t ld) {
    if (dt == CT_DTYPE_BF16)
        ct_cpu_swiglu_fwd_bf16(ctx, out, gate, up, N, H, ld);
    else
        ct_cpu_swiglu_fwd(ctx, out, gate, up, N, H, ld);
}

static void slot_swiglu_bwd(void *ctx, ct_dtype dt, void *dgate, void *dup, const void *gate,
                            const void *up, const void *dout, int64_t N, int64_t H, int64_t ld) {
    if (dt == CT_DTYPE_BF16)
        ct_cpu_swiglu_bwd_bf16(ctx, dgate, dup, gate, up, dout, N, H, ld);
    else
        ct_cpu_swiglu_bwd(ctx, dgate, dup, gate, up, dout, N, H, ld);
}

static void slot_attention_fwd(void *ctx, ct_dtype dt, void *out, float *lse, const void *qkv,
                               int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                               int64_t hd) {
    cpu_ctx *c = ctx;
    int64_t n_out = B * T * n_head * hd, n_qkv = B * T * (n_head + 2 * n_kv_head) * hd;
    float *o = out_f32(c, 0, dt, out, n_out, false);
    ct_cpu_attention_fwd(c, o, lse, in_f32(c, 1, dt, qkv, n_qkv), B, T, n_head, n_kv_head, hd);
    out_done(c, dt, out, o, n_out);
}

static void slot_attention_bwd(void *ctx, ct_dtype dt, void *dqkv, float *dbias, const void *dout,
                               const void *qkv, const void *out, const float *lse, int64_t B,
                               int64_t T, int64_t n_head, int64_t n_kv_head, int64_t hd) {
    cpu_ctx *c = ctx;
    int64_t n_out = B * T * n_head * hd, n_qkv = B * T * (n_head + 2 * n_kv_head) * hd;
    float *dq = out_f32(c, 0, dt, dqkv, n_qkv, false);
    ct_cpu_attention_bwd(c, dq, dbias, in_f32(c, 1, dt, dout, n_out), in_f32(c, 2, dt, qkv, n_qkv),
                         in_f32(c, 3, dt, out, n_out), lse, B, T, n_head, n_kv_head, hd);
    out_done(c, dt, dqkv, dq, n_qkv);
}

static void slot_attention_part_fwd(void *ctx, ct_dtype dt, float *o_acc, float *lse_acc,
                                    const void *qkv, const void *kv, int64_t B, int64_t T,
                                    int64_t n_head, int64_t n_kv_head, int64_t hd, int64_t chunks) {
    cpu_ctx *c = ctx;
    int64_t n_qkv = B * T * (n_head + 2 * n_kv_head) * hd, n_kv = B * T * 2 * n_kv_head * hd;
    ct_cpu_attention_part_fwd(c, o_acc, lse_acc, in_f32(c, 0, dt, qkv, n_qkv),
                              in_f32(c, 1, dt, kv, n_kv), B, T, n_head, n_kv_head, hd, chunks);
}

static void slot_attention_part_bwd(void *ctx, ct_dtype dt, float *dq_acc, float *dkv_acc,
                                    const void *dout, const void *qkv, const void *out,
                                    const float *lse, const void *kv, int64_t B, int64_t T,
                                    int64_t n_head, int64_t n_kv_head, int64_t hd, int64_t chunks) {
    cpu_ctx *c = ctx;
    int64_t n_out = B * T * n_head * hd, n_qkv = B * T * (n_head + 2 * n_kv_head) * hd,
            n_kv = B * T * 2 * n_kv_head * hd;
    ct_cpu_attention_part_bwd(c, dq_acc, dkv_acc, in_f32(c, 0, dt, dout, n_out),
                              in_f32(c, 1, dt, qkv, n_qkv), in_f32(c, 2, dt, out, n_out), lse,
                              in_f32(c, 3, dt, kv, n_kv), B, T, n_head, n_kv_head, hd, chunks);
}

static void slot_xent_rowmax(void *ctx, ct_dtype dt, float *rowmax, const void *logits, int64_t N,
                             int64_t V, int64_t n_valid) {
    cpu_ctx *c = ctx;
    if (dt == CT_DTYPE_BF16) {
        ct_cpu_xent_rowmax_bf16(c, rowmax, logits, N, V, n_valid);
        return;
    }
    ct_cpu_xent_rowmax(c, rowmax, logits, N, V, n_valid);
}

static void slot_xent_sumexp(void *ctx, ct_dtype dt, float *sumexp, float *target_logit,
                             void *logits, const int32_t *targets, const float *rowmax, int64_t N,
                             int64_t V, int64_t n_valid, int64_t col_offset, bool keep_exp) {
    cpu_ctx *c = ctx;
    if (dt == CT_DTYPE_BF16)
        ct_cpu_xent_sumexp_bf16(c, sumexp, target_logit, logits, targets, rowmax, N, V, n_valid,
                                col_offset, keep_exp);
    else
        ct_cpu_xent_sumexp(c, sumexp, target_logit, logits, targets, rowmax, N, V, n_valid,
                           col_offset, keep_exp);
}

static void slot_xent_finish(void *ctx, ct_dtype dt, float *losses, void *logits,
                             const int32_t *targets, const float *rowmax, const float *sumexp,
                             const float *target_logit, int64_t N, int64_t V, int64_t n_valid,
                             int64_t col_offset, float dloss, bool write_grad) {
    cpu_ctx *c = ctx;
    if (dt == CT_DTYPE_BF16)
        ct_cpu_xent_finish_bf16(c, losses, logits, targets, rowmax, sumexp, target_logit, N, V,
                                n_valid, col_offset, dloss, write_grad);
    else
        ct_cpu_xent_finish(c, losses, logits, targets, rowmax, sumexp, target_logit, N, V, n_valid,
                           col_offset, dloss, write_grad);
}

/* ---- the backend ---------------------------------------------------------------------------- */

static void cpu_copy_host(void *ctx, void *dst, const void *src, size_t bytes) {
    ct_cpu_copy(ctx, dst, src, bytes);
}

/* ---- the hardware peak: a fused multiply-add loop ------------------------------------------
 *
 * MFU's denominator is the machine's peak in the model's dtype, measured rather than looked up.
 * fp32 (and the pattern of the bf16 loop below): each thread runs
 * CHAINS independent dependency chains of vector FMAs on registers (no memory traffic), enough
 * to cover the FMA latency on every FMA port, and the best of a few short runs is taken. This
 * is what the cores really deliver at the vector width the compiler targets (AVX-512 clocks
 * included), i.e. cores × FMA ports × lanes × 2 × the clock under load. */
#if defined(__AVX512F__)
#define PEAK_VECTOR_BYTES 64
#elif defined(__AVX__)
#define PEAK_VECTOR_BYTES 32
#else
#define PEAK_VECTOR_BYTES 16
#endif
typedef float peak_vec __attribute__((vector_size(PEAK_VECTOR_BYTES)));
#define PEAK_LANES ((int)(PEAK_VECTOR_BYTES / sizeof(float)))
#define PEAK_CHAINS 16

/* Where fma_loop leaves its result, so the loop cannot be optimised away. */
static volatile float peak_sink;

/* FLOPs done by one thread: `iters` rounds of CHAINS FMAs of LANES lanes. */
static double fma_loop(int64_t iters) {
    peak_vec acc[PEAK_CHAINS], mul, add;
    for (int l = 0; l < PEAK_LANES; l++) mul[l] = 0.999999f, add[l] = 1e-7f;
    for (int c = 0; c < PEAK_CHAINS; c++)
        for (int l = 0; l < PEAK_LANES; l++) acc[c][l] = (float)(c + l);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = acc[c] * mul + add; /* contracted to FMA */
    peak_vec sum = acc[0];
    for (int c = 1; c < PEAK_CHAINS; c++) sum += acc[c];
    peak_sink = sum[0];
    return 2.0 * PEAK_LANES * PEAK_CHAINS * (double)iters;
}

/* FLOPs done by one thread with AVX512-BF16: `iters` rounds of CHAINS vdpbf16ps, each 16 fp32
 * lanes += two bf16 products (4 FLOPs per lane). */
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bf16"))) static double dpbf16_loop(int64_t iters) {
    __m512 acc[PEAK_CHAINS];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __m512 sum = acc[0];
    for (int c = 1; c < PEAK_CHAINS; c++) sum = _mm512_add_ps(sum, acc[c]);
    peak_sink = _mm512_reduce_add_ps(sum);
    return 4.0 * 16 * PEAK_CHAINS * (double)iters;
}
#endif

/* Best of 3 runs of `loop` on every thread, in FLOP/s. */
static double best_loop_rate(const cpu_ctx *c, double (*loop)(int64_t), int64_t iters) {
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        double flops = 0.0, t0 = ct_now();
#pragma omp parallel num_threads(c->n_threads) reduction(+ : flops)
        flops += loop(iters);
        double rate = flops / (ct_now() - t0);
        if (rate > best) best = rate;
    }
    return best;
}

/*
 * The bf16 peak. AVX512-BF16 without AMX: the vdpbf16ps loop above, the vector units' bf16 rate
 * (twice fp32's on the same ports). With AMX the tiles outrun any vector loop and their rate is
 * reached only through a tiled kernel, so the peak is oneDNN's best bf16 matmul at a large square
 * shape, measured. Without native bf16 (forced on by COOKTRAIN_CPU_BF16=1), oneDNN emulates bf16
 * on the fp32 units: the fp32 peak stands.
 */
static double cpu_peak_bf16(cpu_ctx *c, char *how, size_t how_cap) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512bf16") && !__builtin_cpu_supports("amx-bf16")) {
        double rate = best_loop_rate(c, dpbf16_loop, 1000000);
        snprintf(how, how_cap, "measured: 16-lane bf16 dot-product (vdpbf16ps) loop on %d thread%s",
                 c->n_threads, c->n_threads == 1 ? "" : "s");
        return rate;
    }
    if (__builtin_cpu_supports("amx-bf16")) {
        enum { S = 1024 };
        uint16_t *a = calloc((size_t)S * S, 2), *b = calloc((size_t)S * S, 2);
        float *out = malloc((size_t)S * S * sizeof(float));
        CT_ASSERT(a && b && out);
        if (omp_get_max_threads() != c->n_threads) omp_set_num_threads(c->n_threads);
        double best = 0.0;
        for (int rep = 0; rep < 4; rep++) { /* the first call builds the primitive */
            double t0 = ct_now();
            ct_cpu_gemm_onednn(false, false, S, S, S, 1.0f, a, S, b, S, 0.0f, out, S, CT_DTYPE_BF16,
                               CT_DTYPE_F32);
            double rate = 2.0 * S * S * S / (ct_now() - t0);
            if (rep > 0 && rate > best) best = rate;
        }
        free(a), free(b), free(out);
        snprintf(how, how_cap, "measured: oneDNN bf16 matmul %dx%dx%d on AMX tiles, %d thread%s", S,
                 S, S, c->n_threads, c->n_threads == 1 ? "" : "s");
        return best;
    }
#endif
    double rate = best_loop_rate(c, fma_loop, 2000000);
    snprintf(how, how_cap,
             "measured: %d-lane fp32 FMA loop on %d thread%s (no native bf16: "
             "bf16 GEMMs run on the fp32 units)",
             PEAK_LANES, c->n_threads, c->n_threads == 1 ? "" : "s");
    return rate;
}

static double cpu_peak_flops(void *ctx, ct_dtype dt, char *how, size_t how_cap) {
    cpu_ctx *c = ctx;
    if (dt == CT_DTYPE_BF16) return cpu_peak_bf16(c, how, how_cap);
    const double rate = best_loop_rate(c, fma_loop, 2000000); /* ~20 ms per thread */
    snprintf(how, how_cap, "measured: %d-lane fp32 FMA loop on %d thread%s", PEAK_LANES,
             c->n_threads, c->n_threads == 1 ? "" : "s");
    return rate;
}

static void cpu_describe(void *ctx, char *buf, size_t cap) {
    const cpu_ctx *c = ctx;
    snprintf(buf, cap, "%d thread%s", c->n_threads, c->n_threads == 1 ? "" : "s");
}

static void cpu_free_backend(void *ctx) {
    cpu_ctx *c = ctx;
    free(c->ws);
    for (int k = 0; k < N_STAGE; k++) free(c->stage[k]);
    free(c);
}

static const struct ct_backend_i cpu_iface = {
    .name = "cpu",
    .alloc = ct_cpu_alloc,
    .free = ct_cpu_free,
    .fill = ct_cpu_fill,
    .copy_from_host = cpu_copy_host,
    .copy_to_host = cpu_copy_host,
    .copy = ct_cpu_copy,
    .gemm = ct_cpu_gemm,
    .bias_add = slot_bias_add,
    .bias_init = slot_bias_init,
    .bias_grad = slot_bias_grad,
    .axpy = slot_axpy,
    .scale = slot_scale,
    .gather_rows = slot_gather_rows,
    .gather_dot = slot_gather_dot,
    .embedding_fwd = ct_cpu_embedding_fwd,
    .embedding_bwd = slot_embedding_bwd,
    .posemb_fwd = slot_posemb_fwd,
    .posemb_bwd = slot_posemb_bwd,
    .layernorm_fwd = slot_layernorm_fwd,
    .layernorm_bwd = slot_layernorm_bwd,
    .gelu_fwd = slot_gelu_fwd,
    .gelu_bwd = slot_gelu_bwd,
    .rmsnorm_fwd = slot_rmsnorm_fwd,
    .rmsnorm_bwd = slot_rmsnorm_bwd,
    .rope = slot_rope,
    .swiglu_fwd = slot_swiglu_fwd,
    .swiglu_bwd = slot_swiglu_bwd,
    .attention_fwd = slot_attention_fwd,
    .attention_bwd = slot_attention_bwd,
    .cast_cols = ct_cpu_cast_cols,
    .attention_part_fwd = slot_attention_part_fwd,
    .attention_part_bwd = slot_attention_part_bwd,
    .xent_rowmax = slot_xent_rowmax,
    .xent_sumexp = slot_xent_sumexp,
    .xent_finish = slot_xent_finish,
    .adamw = ct_cpu_adamw,
    .sumsq = ct_cpu_sumsq,
    .cast = ct_cpu_cast,
    .event_record = NULL, /* everything runs synchronously on the calling thread's team */
    .event_wait = NULL,
    .sync = NULL,
    .peak_flops = cpu_peak_flops,
    .describe = cpu_describe,
    .free_backend = cpu_free_backend,
};

/* Whether fp32 GEMMs run in oneDNN (the default) or OpenBLAS (COOKTRAIN_CPU_SGEMM=openblas, or
 * when oneDNN cannot start). oneDNN's single-thread fp32 matmul was the faster of the two at the
 * tiles of the tiny models' GEMMs on an AVX-512 EPYC (scripts/README.md, "fp32 GEMMs"). */
static bool sgemm_onednn_chosen(void) {
    const char *env = getenv("COOKTRAIN_CPU_SGEMM");
    if (env && !strcmp(env, "openblas")) return false;
    if (env && env[0] && strcmp(env, "onednn"))
        fprintf(stderr, "cooktrain: ignoring COOKTRAIN_CPU_SGEMM='%s' (onednn or openblas)\n", env);
    if (ct_cpu_gemm_init()) return true;
    ct_error_print();
    fprintf(stderr, "cooktrain: fp32 GEMMs fall back to OpenBLAS\n");
    return false;
}

ct_backend *ct_backend_cpu_new(int n_threads) {
    if (n_threads <= 0) n_threads = omp_get_max_threads();
    cpu_ctx *c = ct_xcalloc(1, sizeof *c);
    c->n_threads = n_threads;
    /* One pool, ours: our loops pass num_threads explicitly, and OpenBLAS never threads on its
     * own — every sgemm runs on the thread that calls it (the fp32 GEMM spreads fixed tiles
     * over the threads; attention calls it per head inside its own loop). Left to itself,
     * OpenBLAS opens a nested team whenever it is called from a one-thread region (an op too
     * small to split), and under libgomp's default spin-wait those short-lived nested threads
     * and the idle pool's spinning workers fight over the cores: measured on 2 cores, a 2-thread
     * test-tiny step took 3.3 s instead of 33 ms. */
    omp_set_num_threads(n_threads);
    openblas_set_num_threads(1);
    c->sgemm_onednn = sgemm_onednn_chosen();
    ct_backend *be = ct_xcalloc(1, sizeof *be);
    be->iface = &cpu_iface;
    be->ctx = c;
    ct_backend_apply_env(be);
    return be;
}
