/* gemm_bench.c — the backend's GEMM rate, measured. See gemm_bench.h. */
#include "gemm_bench.h"

#include <stdlib.h>

#include "core/model/model_arch.h"

/* How a timed GEMM is called: C = op(A)·op(B) overwriting C (beta 0) or accumulating onto it
 * (beta 1), or a linear layer's forward with its bias, C = A·Bᵀ + b (ct_gemm_bias: on the CPU the
 * bias, then a GEMM accumulating onto it; on the GPU the bias in the epilogue). */
typedef enum { GEMM_OVERWRITE, GEMM_ACCUMULATE, GEMM_BIAS } gemm_call;

/* Times one GEMM of one shape called as `call`, A and B of dtype ab, C of dtype c; returns the
 * median seconds. */
static double time_gemm(ct_backend *be, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                        gemm_call call, ct_dtype ab, ct_dtype c, int reps) {
    int64_t a_shape[2] = {ta ? K : M, ta ? M : K}, b_shape[2] = {tb ? N : K, tb ? K : N};
    int64_t c_shape[2] = {M, N};
    ct_tensor *A = ct_tensor_new(be, ab, 2, a_shape, CT_MEM_WORKSPACE);
    ct_tensor *B = ct_tensor_new(be, ab, 2, b_shape, CT_MEM_WORKSPACE);
    ct_tensor *C = ct_tensor_new(be, c, 2, c_shape, CT_MEM_WORKSPACE);
    ct_tensor *bias = call == GEMM_BIAS ? ct_tensor_new_1d(be, ab, N, CT_MEM_WORKSPACE) : NULL;
    if (!A || !B || !C || (call == GEMM_BIAS && !bias)) {
        ct_tensor_free(A), ct_tensor_free(B), ct_tensor_free(C), ct_tensor_free(bias);
        return 0.0;
    }
    CT_ASSERTF(!bias || (!ta && tb && c == ab), "a biased GEMM is a linear forward");
    ct_tensor_fill(A, 0.01f);
    ct_tensor_fill(B, 0.02f);
    ct_tensor_zero(C);
    if (bias) ct_tensor_fill(bias, 0.03f);
    double *times = ct_xmalloc((size_t)reps * sizeof(double));
    for (int r = -1; r < reps; r++) { /* a first call unmeasured (algorithm choice, caches) */
        double t0 = ct_now();
        if (bias)
            ct_gemm_bias(C, A, B, bias);
        else
            ct_gemm(C, A, B, ta, tb, 1.0f, call == GEMM_ACCUMULATE ? 1.0f : 0.0f);
        ct_backend_sync(be);
        if (r >= 0) times[r] = ct_now() - t0;
    }
    qsort(times, (size_t)reps, sizeof(double), ct_cmp_double);
    double median = times[reps / 2];
    free(times);
    ct_tensor_free(A), ct_tensor_free(B), ct_tensor_free(C), ct_tensor_free(bias);
    return median;
}

double ct_gemm_bench_rate(ct_backend *be, int64_t M, int64_t N, int64_t K, ct_dtype dtype,
                          int reps) {
    double t = time_gemm(be, M, N, K, false, true, GEMM_BIAS, dtype, dtype, reps);
    return t > 0 ? 2.0 * (double)M * (double)N * (double)K / t : 0.0;
}

double ct_gemm_bench_model_rate(const ct_config *cfg, ct_backend *be, int reps) {
    const int64_t N = cfg->train.micro_batch * cfg->model.seq_len, C = cfg->model.d_model;
    const int64_t qdim = cfg->model.n_head * cfg->derived.head_dim;
    const int64_t kvdim = cfg->derived.n_kv_head * cfg->derived.head_dim;
    const int64_t F = cfg->derived.d_ff, L = cfg->model.n_layer, Vp = cfg->derived.vocab_padded;
    /* Activations and weights in the precision's dtype; weight gradients accumulate in f32. */
    const ct_dtype dt = ct_precision_dtype(cfg->derived.precision);
    /* (out, in, times per step, forward call) of every linear layer as the model runs it: q, k
     * and v as one fused projection; the block's layers with their bias (ct_gemm_bias) where the
     * architecture has them (GPT-2; model_arch.h), else (Llama) and the LM head (the tied
     * embedding) overwriting (beta 0). Each GEMM is timed
     * as the model calls it: overwriting costs a BLAS an extra pass over C, an accumulating bf16
     * GEMM the GPU an fp32 product. */
    const ct_model_arch *arch = ct_model_arch_of(cfg->model.arch);
    const gemm_call lin = arch->linear_bias ? GEMM_BIAS : GEMM_OVERWRITE;
    struct {
        int64_t out, in, count;
        gemm_call fwd;
    } linears[] = {
        {qdim + 2 * kvdim, C, L, lin},
        {C, qdim, L, lin},
        {arch->act.hidden * F, C, L, lin}, /* Llama: gate|up as one */
        {C, F, L, lin},
        {Vp, C, 1, GEMM_OVERWRITE},
    };
    double flops = 0.0, seconds = 0.0;
    for (size_t i = 0; i < sizeof linears / sizeof linears[0]; i++) {
        int64_t out = linears[i].out, in = linears[i].in;
        double f = 2.0 * (double)N * (double)out * (double)in, n = (double)linears[i].count;
        double t =
            time_gemm(be, N, out, in, false, true, linears[i].fwd, dt, dt, reps)    /* y */
            + time_gemm(be, N, in, out, false, false, GEMM_OVERWRITE, dt, dt, reps) /* dx = dy·W */
            + time_gemm(be, out, in, N, true, false, GEMM_ACCUMULATE, dt, CT_DTYPE_F32,
                        reps); /* dW */
        flops += 3.0 * f * n;
        seconds += t * n;
    }
    return seconds > 0 ? flops / seconds : 0.0;
}

double ct_gemm_bench_expert_rate(const ct_config *cfg, ct_backend *be, int reps) {
    const int64_t E = cfg->model.moe_experts;
    if (!E) return 0.0;
    /* an expert's rows under uniform routing, its up and down projections as moe.c runs them:
     * forward with the bias in (beta 1), the input gradient (beta 0) and the weight gradient
     * (accumulating, f32) */
    const int64_t rows =
        CT_MAX(1, cfg->train.micro_batch * cfg->model.seq_len * cfg->model.moe_top_k / E);
    const int64_t C = cfg->model.d_model, F = cfg->derived.moe_d_ff / cfg->parallel.tp;
    const ct_dtype dt = ct_precision_dtype(cfg->derived.precision);
    const int64_t up = ct_model_arch_of(cfg->model.arch)->act.hidden * F; /* Llama: gate|up */
    const int64_t shapes[2][2] = {{up, C}, {C, F}};
    double flops = 0.0, seconds = 0.0;
    for (int i = 0; i < 2; i++) {
        const int64_t out = shapes[i][0], in = shapes[i][1];
        seconds +=
            time_gemm(be, rows, out, in, false, true, GEMM_ACCUMULATE, dt, dt, reps) +
            time_gemm(be, rows, in, out, false, false, GEMM_OVERWRITE, dt, dt, reps) +
            time_gemm(be, out, in, rows, true, false, GEMM_ACCUMULATE, dt, CT_DTYPE_F32, reps);
        flops += 3.0 * 2.0 * (double)rows * (double)out * (double)in;
    }
    return seconds > 0 ? flops / seconds : 0.0;
}
