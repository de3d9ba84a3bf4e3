/*
 * adamw.c — the optimizer's ops on the CPU backend (cpu.h): AdamW over flat segments of the
 * parameters (the bf16 copy written from the updated fp32 master weights) and the gradients'
 * sums of squares in double.
 */
#include "core/backend/cpu/cpu.h"

/*
 * AdamW, decoupled weight decay. The exact float operation order (the CUDA backend repeats it;
 * every multiply-add is an explicit fmaf so compiler contraction cannot change it):
 *   bc1 = (float)(1 - (double)beta1^step),  bc2 = (float)(1 - (double)beta2^step)   (host, double)
 *   g    = grad · grad_scale
 *   m    = fmaf(beta1, m, (1 - beta1)·g)
 *   v    = fmaf(beta2, v, (1 - beta2)·(g·g))
 *   mhat = m / bc1,  vhat = v / bc2
 *   upd  = fmaf(wd, param, mhat / (sqrtf(vhat) + eps))
 *   param = fmaf(-lr, upd, param)
 * (1 - beta1) and (1 - beta2) are computed in float.
 */
void ct_cpu_adamw(void *ctx, float *param, const float *grad, float *m, float *v,
                  const ct_adamw_segment *segments, int n_segments, const ct_adamw_hparams *hp,
                  void *param_copy, ct_dtype copy_dtype) {
    cpu_ctx *c = ctx;
    const float b1 = hp->beta1, b2 = hp->beta2, one_b1 = 1.0f - b1, one_b2 = 1.0f - b2;
    const float bc1 = (float)(1.0 - pow((double)b1, (double)hp->step));
    const float bc2 = (float)(1.0 - pow((double)b2, (double)hp->step));
    const float lr = hp->lr, eps = hp->eps, gs = hp->grad_scale;
    for (int s = 0; s < n_segments; s++) {
        const int64_t off = segments[s].offset, n = segments[s].count;
        const float wd = segments[s].weight_decay;
        float *p = param + off, *ms = m + off, *vs = v + off;
        const float *gr = grad + off;
        CT_PRAGMA(omp parallel for simd schedule(static) num_threads(threads_for(c, n)))
        for (int64_t i = 0; i < n; i++) {
            float g = gr[i] * gs;
            float mi = fmaf(b1, ms[i], one_b1 * g);
            float vi = fmaf(b2, vs[i], one_b2 * (g * g));
            float mhat = mi / bc1, vhat = vi / bc2;
            float upd = fmaf(wd, p[i], mhat / (sqrtf(vhat) + eps));
            p[i] = fmaf(-lr, upd, p[i]);
            ms[i] = mi;
            vs[i] = vi;
        }
        /* The bf16 parameters the model computes with: the updated master weights, rounded. */
        if (param_copy && copy_dtype == CT_DTYPE_BF16) {
            uint16_t *pc = (uint16_t *)param_copy + off;
            CT_PRAGMA(omp parallel for simd schedule(static) num_threads(threads_for(c, n)))
            for (int64_t i = 0; i < n; i++) pc[i] = ct_f32_to_bf16(p[i]);
        } else if (param_copy) {
            CT_ASSERTF(copy_dtype == CT_DTYPE_F32, "adamw: param copy of dtype %s",
                       ct_dtype_name(copy_dtype));
            memcpy((float *)param_copy + off, p, (size_t)n * sizeof(float));
        }
    }
}

/* out = sum x² in double: chunks of SUMSQ_CHUNK elements (16 double lanes each), chunk partials
 * added in chunk order. */
static void cpu_sumsq_one(cpu_ctx *c, float *out, const float *x, int64_t n) {
    int64_t n_chunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double *partial = ct_cpu_ws_get(c, (size_t)(n_chunks ? n_chunks : 1) * sizeof(double));
    PARALLEL_FOR(threads_for(c, n))
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        const float *xc = x + ch * SUMSQ_CHUNK;
        int64_t len = CT_MIN((int64_t)SUMSQ_CHUNK, n - ch * SUMSQ_CHUNK);
        int64_t lv = len - len % LANES;
        double acc[LANES] = {0};
        for (int64_t j = 0; j < lv; j += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += (double)xc[j + l] * (double)xc[j + l];
        for (int64_t j = lv; j < len; j++) acc[j - lv] += (double)xc[j] * (double)xc[j];
        double a[8];
        for (int l = 0; l < 8; l++) a[l] = acc[l] + acc[l + 8];
        for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
        partial[ch] = (a[0] + a[2]) + (a[1] + a[3]);
    }
    double total = 0.0;
    for (int64_t ch = 0; ch < n_chunks; ch++) total += partial[ch];
    *out = (float)total;
}

void ct_cpu_sumsq(void *ctx, float *out, const float *const *x, const int64_t *n, int count) {
    for (int i = 0; i < count; i++) cpu_sumsq_one(ctx, out + i, x[i], n[i]);
}
