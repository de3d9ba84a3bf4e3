/* gemm_bench.c — the backend's GEMM rate, measured. See gemm_bench.h. */
#include "gemm_bench.h"

#include <stdlib.h>

/* Times one GEMM of one shape called as `call`, A and B of dtype ab, C of dtype c; returns the
 * best of at least `reps` runs, and of more when they take under 50 ms together (up to 100·reps):
 * the rate the machine reaches when nothing else runs. On a machine busy with other work (a
 * thread of an OpenMP team descheduled for a time slice), a median of a few runs of a small
 * GEMM can be a hundred times too slow. */
static double time_gemm(ct_backend *be, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                        ct_gemm_call call, ct_dtype ab, ct_dtype c, int reps) {
    int64_t a_shape[2] = {ta ? K : M, ta ? M : K}, b_shape[2] = {tb ? N : K, tb ? K : N};
    int64_t c_shape[2] = {M, N};
    ct_tensor *A = ct_tensor_new(be, ab, 2, a_shape, CT_MEM_WORKSPACE);
    ct_tensor *B = ct_tensor_new(be, ab, 2, b_shape, CT_MEM_WORKSPACE);
    ct_tensor *C = ct_tensor_new(be, c, 2, c_shape, CT_MEM_WORKSPACE);
    ct_tensor *bias = call == CT_GEMM_BIAS ? ct_tensor_new_1d(be, ab, N, CT_MEM_WORKSPACE) : NULL;
    if (!A || !B || !C || (call == CT_GEMM_BIAS && !bias)) {
        ct_tensor_free(A), ct_tensor_free(B), ct_tensor_free(C), ct_tensor_free(bias);
        return 0.0;
    }
    CT_ASSERTF(!bias || (!ta && tb && c == ab), "a biased GEMM is a linear forward");
    ct_tensor_fill(A, 0.01f);
    ct_tensor_fill(B, 0.02f);
    ct_tensor_zero(C);
    if (bias) ct_tensor_fill(bias, 0.03f);
    double best = 0.0, total = 0.0;
    for (int r = -1; r < 100 * reps && (r < reps || total < 0.05); r++) {
        /* a first call unmeasured (algorithm choice, caches) */
        double t0 = ct_now();
        if (bias)
            ct_gemm_bias(C, A, B, bias);
        else
            ct_gemm(C, A, B, ta, tb, 1.0f, call == CT_GEMM_ACCUMULATE ? 1.0f : 0.0f);
        ct_backend_sync(be);
        double t = ct_now() - t0;
        if (r < 0) continue;
        total += t;
        if (r == 0 || t < best) best = t;
    }
    ct_tensor_free(A), ct_tensor_free(B), ct_tensor_free(C), ct_tensor_free(bias);
    return best;
}

double ct_gemm_bench_rate(ct_backend *be, int64_t M, int64_t N, int64_t K, ct_dtype dtype,
                          int reps) {
    double t = time_gemm(be, M, N, K, false, true, CT_GEMM_BIAS, dtype, dtype, reps);
    return t > 0 ? 2.0 * (double)M * (double)N * (double)K / t : 0.0;
}

double ct_gemm_bench_linears(ct_backend *be, int64_t rows, const ct_gemm_linear *linears, int n,
                             ct_dtype dt, int reps) {
    double flops = 0.0, seconds = 0.0;
    for (int i = 0; i < n; i++) {
        const int64_t out = linears[i].out, in = linears[i].in;
        const double f = 2.0 * (double)rows * (double)out * (double)in, count = linears[i].count;
        double t =
            time_gemm(be, rows, out, in, false, true, linears[i].fwd, dt, dt, reps)       /* y */
            + time_gemm(be, rows, in, out, false, false, CT_GEMM_OVERWRITE, dt, dt, reps) /* dx */
            + time_gemm(be, out, in, rows, true, false, CT_GEMM_ACCUMULATE, dt, CT_DTYPE_F32,
                        reps); /* dW, accumulated in f32 */
        flops += 3.0 * f * count;
        seconds += t * count;
    }
    return seconds > 0 ? flops / seconds : 0.0;
}
