/*
 * xent.c — the cross-entropy's three passes on the CPU backend (cpu.h): the row maximum, the sum
 * of exponentials (keeping them for the gradient) with the target's logit, and the losses with
 * the gradient written over the logits; plain and as one vocabulary shard (col_offset). bf16
 * logits go a row at a time through a per-thread fp32 row.
 */
#include "core/backend/cpu/cpu.h"

static void xent_rowmax_f32(void *ctx, float *rowmax, const float *logits, int64_t N, int64_t V,
                            int64_t n_valid) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * n_valid))
    for (int64_t i = 0; i < N; i++) {
        const float *x = logits + i * V;
        rowmax[i] = row_max(x, n_valid); /* -inf for a shard made only of padding */
    }
}

/* One row of each step, shared by the fp32 kernels and the bf16 ones (which run them on a
 * widened copy of the row, so both compute the same fp32 values). */
static float sumexp_row(float *x, float mx, int64_t n_valid, bool keep_exp) {
    float acc[LANES] = {0};
    int64_t nv = n_valid - n_valid % LANES;
    for (int64_t j = 0; j < nv; j += LANES) {
        if (j + 512 < n_valid) __builtin_prefetch(x + j + 512); /* see prefetch_floats */
        if (keep_exp) {
            for (int l = 0; l < LANES; l++) {
                float e = exp_f32(x[j + l] - mx);
                x[j + l] = e;
                acc[l] += e;
            }
        } else {
            for (int l = 0; l < LANES; l++) acc[l] += exp_f32(x[j + l] - mx);
        }
    }
    for (int64_t j = nv; j < n_valid; j++) {
        float e = exp_f32(x[j] - mx);
        if (keep_exp) x[j] = e;
        acc[j - nv] += e;
    }
    return lane_sum(acc);
}

/* x holds exp(logit - rowmax) in [0, n_valid): becomes dloss·softmax - dloss·onehot(t), padding
 * [n_valid, V) zero. */
static void grad_row(float *x, float se, int64_t V, int64_t n_valid, int64_t t, float dloss) {
    float g = dloss / se; /* dloss·softmax = dloss/sumexp · exp(logit - rowmax) */
#pragma omp simd
    for (int64_t j = 0; j < n_valid; j++) x[j] *= g;
    for (int64_t j = n_valid; j < V; j++) x[j] = 0.0f; /* vocabulary padding */
    if (t >= 0 && t < n_valid) x[t] -= dloss;
}

static void xent_sumexp_f32(void *ctx, float *sumexp, float *target_logit, float *logits,
                            const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                            int64_t n_valid, int64_t col_offset, bool keep_exp) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, N * n_valid))
    for (int64_t i = 0; i < N; i++) {
        float *x = logits + i * V;
        int64_t t = (int64_t)targets[i] - col_offset;
        target_logit[i] = (t >= 0 && t < n_valid) ? x[t] : 0.0f; /* before keep_exp writes */
        sumexp[i] = sumexp_row(x, rowmax[i], n_valid, keep_exp);
    }
}

static void xent_finish_f32(void *ctx, float *losses, float *logits, const int32_t *targets,
                            const float *rowmax, const float *sumexp, const float *target_logit,
                            int64_t N, int64_t V, int64_t n_valid, int64_t col_offset, float dloss,
                            bool write_grad) {
    cpu_ctx *c = ctx;
    PARALLEL_FOR(threads_for(c, write_grad ? N * V : N))
    for (int64_t i = 0; i < N; i++) {
        losses[i] = logf(sumexp[i]) + rowmax[i] - target_logit[i];
        if (write_grad)
            grad_row(logits + i * V, sumexp[i], V, n_valid, (int64_t)targets[i] - col_offset,
                     dloss);
    }
}

/* bf16 logits, a row at a time through a per-thread fp32 row (no (N, V) staging copy, and the
 * row stays in cache between widening, the step and rounding back). */
#define BF16_ROWS(c, work, V, body)                                                                \
    CT_PRAGMA(omp parallel num_threads(threads_for(c, work))) {                                    \
        float *row = ct_xmalloc((size_t)CT_MAX(V, 1) * sizeof(float));                             \
        CT_PRAGMA(omp for schedule(static))                                                        \
        for (int64_t i = 0; i < N; i++) {                                                          \
            body                                                                                   \
        }                                                                                          \
        free(row);                                                                                 \
    }

static void widen_row(float *dst, const uint16_t *src, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) dst[j] = ct_bf16_to_f32(src[j]);
}

static void narrow_row(uint16_t *dst, const float *src, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) dst[j] = ct_f32_to_bf16(src[j]);
}

static void xent_rowmax_bf16(void *ctx, float *rowmax, const uint16_t *logits, int64_t N, int64_t V,
                             int64_t n_valid) {
    cpu_ctx *c = ctx;
    BF16_ROWS(c, N * n_valid, V, {
        widen_row(row, logits + i * V, n_valid);
        rowmax[i] = row_max(row, n_valid);
    })
}

static void xent_sumexp_bf16(void *ctx, float *sumexp, float *target_logit, uint16_t *logits,
                             const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                             int64_t n_valid, int64_t col_offset, bool keep_exp) {
    cpu_ctx *c = ctx;
    BF16_ROWS(c, N * n_valid, V, {
        uint16_t *x = logits + i * V;
        int64_t t = (int64_t)targets[i] - col_offset;
        widen_row(row, x, n_valid);
        target_logit[i] = (t >= 0 && t < n_valid) ? row[t] : 0.0f;
        sumexp[i] = sumexp_row(row, rowmax[i], n_valid, keep_exp);
        if (keep_exp) narrow_row(x, row, n_valid);
    })
}

static void xent_finish_bf16(void *ctx, float *losses, uint16_t *logits, const int32_t *targets,
                             const float *rowmax, const float *sumexp, const float *target_logit,
                             int64_t N, int64_t V, int64_t n_valid, int64_t col_offset, float dloss,
                             bool write_grad) {
    cpu_ctx *c = ctx;
    BF16_ROWS(c, write_grad ? N * V : N, V, {
        losses[i] = logf(sumexp[i]) + rowmax[i] - target_logit[i];
        if (write_grad) {
            uint16_t *x = logits + i * V;
            widen_row(row, x, n_valid);
            grad_row(row, sumexp[i], V, n_valid, (int64_t)targets[i] - col_offset, dloss);
            narrow_row(x, row, V);
        }
    })
}

void ct_cpu_xent_rowmax(void *ctx, ct_dtype dt, float *rowmax, const void *logits, int64_t N,
                        int64_t V, int64_t n_valid) {
    cpu_ctx *c = ctx;
    if (dt == CT_DTYPE_BF16) {
        xent_rowmax_bf16(c, rowmax, logits, N, V, n_valid);
        return;
    }
    xent_rowmax_f32(c, rowmax, logits, N, V, n_valid);
}

void ct_cpu_xent_sumexp(void *ctx, ct_dtype dt, float *sumexp, float *target_logit, void *logits,
                        const int32_t *targets, const float *rowmax, int64_t N, int64_t V,
                        int64_t n_valid, int64_t col_offset, bool keep_exp) {
    cpu_ctx *c = ctx;
    if (dt == CT_DTYPE_BF16)
        xent_sumexp_bf16(c, sumexp, target_logit, logits, targets, rowmax, N, V, n_valid,
                         col_offset, keep_exp);
    else
        xent_sumexp_f32(c, sumexp, target_logit, logits, targets, rowmax, N, V, n_valid, col_offset,
                        keep_exp);
}

void ct_cpu_xent_finish(void *ctx, ct_dtype dt, float *losses, void *logits, const int32_t *targets,
                        const float *rowmax, const float *sumexp, const float *target_logit,
                        int64_t N, int64_t V, int64_t n_valid, int64_t col_offset, float dloss,
                        bool write_grad) {
    cpu_ctx *c = ctx;
    if (dt == CT_DTYPE_BF16)
        xent_finish_bf16(c, losses, logits, targets, rowmax, sumexp, target_logit, N, V, n_valid,
                         col_offset, dloss, write_grad);
    else
        xent_finish_f32(c, losses, logits, targets, rowmax, sumexp, target_logit, N, V, n_valid,
                        col_offset, dloss, write_grad);
}
