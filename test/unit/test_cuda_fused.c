/*
 * test_cuda_fused.c — the CUDA backend's fused slot gemm_bias_gelu (GELU in cuBLASLt's GEMM
 * epilogue, cuda/gemm.c) against the CPU backend, which has no such slot: there ct_gemm_bias_gelu
 * runs its three separate ops (bias_init, gemm with beta = 1, gelu_fwd), the reference. The same
 * slot without GELU (ct_gemm_bias: out NULL, cuBLASLt's BIAS epilogue) against bias_init + gemm.
 * Both go through the public wrapper, on the same bytes, in fp32 and bf16
 * (test/unit/cuda_test_util.h). Also through the asynchronous stream (ct_backend_async_new,
 * COOKTRAIN_ASYNC=1), which must forward the slot and give the plain CUDA backend's bits.
 *
 * Shapes, odd M: 17×96×32 takes the cuBLASLt epilogue in both dtypes (every row stride a multiple
 * of 16 bytes, pre's of 8 elements); the others take the slot's own fallback (bias_init, GEMM,
 * the GELU kernel) — N = 13 and 35 (pre's stride), K = 37 (x's and w's stride in bytes).
 *
 * Tolerance, per element, from test_cuda_gemm.c's derivation (u = 2^-24): each side is within
 *   t_pre = 2·(K + 2)·u·(Σ|x·w| + |b|) (+ 2^-8·|pre| in bf16)
 *   t_out = 1.13·t_pre + 10·u·(|pre| + |out|) (+ 2^-8·|out| in bf16)
 * of the exact values (|gelu'| <= 1.13; GELU's own fp32 error), so the two sides differ by at most
 * twice that; the exact pre is bounded by the float64 sum. A skipped bias or an unwritten pre
 * gives errors of the order of the values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test/unit/cuda_test_util.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static float urand(void) { /* [-1, 1), xorshift64 */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* The values a tensor of dtype dt holds for these floats (bf16 rounds). */
static void quantize(float *v, int64_t n, ct_dtype dt) {
    if (dt == CT_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++) v[i] = ct_bf16_to_f32(ct_f32_to_bf16(v[i]));
}

/* Runs ct_gemm_bias_gelu (gelu) or ct_gemm_bias (pre only) on `be` from host x (M,K), w (N,K),
 * b (N); pre and out (M,N) start as NaN, come back as floats. */
static void run_on(ct_backend *be, bool gelu, ct_dtype dt, int64_t M, int64_t N, int64_t K,
                   const float *x, const float *w, const float *b, float *pre, float *out) {
    ct_tensor *tx = ct_tensor_new_2d(be, dt, M, K, CT_MEM_ACTS);
    ct_tensor *tw = ct_tensor_new_2d(be, dt, N, K, CT_MEM_PARAMS);
    ct_tensor *tb = ct_tensor_new_1d(be, dt, N, CT_MEM_PARAMS);
    ct_tensor *tpre = ct_tensor_new_2d(be, dt, M, N, CT_MEM_ACTS);
    ct_tensor *tout = ct_tensor_new_2d(be, dt, M, N, CT_MEM_ACTS);
    ct_tensor_from_host_f32(tx, x);
    ct_tensor_from_host_f32(tw, w);
    ct_tensor_from_host_f32(tb, b);
    ct_tensor_fill(tpre, NAN);
    ct_tensor_fill(tout, NAN);
    if (gelu)
        ct_gemm_bias_gelu(tpre, tout, tx, tw, tb);
    else
        ct_gemm_bias(tpre, tx, tw, tb);
    ct_tensor_to_host_f32(pre, tpre);
    ct_tensor_to_host_f32(out, tout);
    ct_tensor_free(tx), ct_tensor_free(tw), ct_tensor_free(tb);
    ct_tensor_free(tpre), ct_tensor_free(tout);
}

static void check_case(ct_backend *cpu, ct_backend *gpu, ct_backend *gpu_async, bool gelu,
                       ct_dtype dt, int64_t M, int64_t N, int64_t K) {
    float *x = malloc((size_t)(M * K) * 4), *w = malloc((size_t)(N * K) * 4);
    float *b = malloc((size_t)N * 4);
    for (int64_t i = 0; i < M * K; i++) x[i] = urand();
    for (int64_t i = 0; i < N * K; i++) w[i] = urand();
    for (int64_t i = 0; i < N; i++) b[i] = urand();
    quantize(x, M * K, dt), quantize(w, N * K, dt), quantize(b, N, dt);
    size_t bytes = (size_t)(M * N) * 4;
    float *pre_c = malloc(bytes), *out_c = malloc(bytes), *pre_g = malloc(bytes);
    float *out_g = malloc(bytes), *pre_a = malloc(bytes), *out_a = malloc(bytes);
    run_on(cpu, gelu, dt, M, N, K, x, w, b, pre_c, out_c);
    run_on(gpu, gelu, dt, M, N, K, x, w, b, pre_g, out_g);
    run_on(gpu_async, gelu, dt, M, N, K, x, w, b, pre_a, out_a);

    const double u = ldexp(1.0, -24), u_bf16 = ldexp(1.0, -8);
    const bool bf = dt == CT_DTYPE_BF16;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double abs_sum = fabs((double)b[j]), pre = b[j];
            for (int64_t k = 0; k < K; k++) {
                double p = (double)x[i * K + k] * (double)w[j * K + k];
                pre += p, abs_sum += fabs(p);
            }
            double out =
                0.5 * pre * (1.0 + tanh(0.7978845608028654 * (pre + 0.044715 * pre * pre * pre)));
            double t_pre = 2.0 * (double)(K + 2) * u * abs_sum + (bf ? u_bf16 * fabs(pre) : 0.0);
            double t_out =
                1.13 * t_pre + 10.0 * u * (fabs(pre) + fabs(out)) + (bf ? u_bf16 * fabs(out) : 0.0);
            int64_t at = i * N + j;
            double d_pre = fabs((double)pre_g[at] - (double)pre_c[at]);
            double d_out = fabs((double)out_g[at] - (double)out_c[at]);
            if (!gelu) d_out = 0.0; /* out is not written: NaN on both sides */
            if (!isfinite(pre_g[at]) || (gelu && !isfinite(out_g[at])) || !(d_pre <= 2.0 * t_pre) ||
                !(d_out <= 2.0 * t_out))
                fail_msg("%s%s M=%lld N=%lld K=%lld [%lld][%lld]: cuda pre %.9g out %.9g, cpu pre "
                         "%.9g out %.9g (tolerances %.3g, %.3g)",
                         gelu ? "gemm_bias_gelu " : "gemm_bias ", ct_dtype_name(dt), (long long)M,
                         (long long)N, (long long)K, (long long)i, (long long)j, pre_g[at],
                         out_g[at], pre_c[at], out_c[at], 2.0 * t_pre, 2.0 * t_out);
        }
    /* the asynchronous stream runs the same slot: the same bits */
    assert_memory_equal(pre_a, pre_g, bytes);
    assert_memory_equal(out_a, out_g, bytes);
    free(x), free(w), free(b);
    free(pre_c), free(out_c), free(pre_g), free(out_g), free(pre_a), free(out_a);
}

static void test_gemm_bias_gelu(void **state) {
    (void)state;
    cuda_test_pair p = cuda_test_pair_new();
    ct_backend *async = ct_backend_async_new(ct_cuda_backend_new(0));
    assert_null(p.cpu->iface->gemm_bias_gelu); /* the reference is the three separate ops */
    assert_non_null(p.gpu->iface->gemm_bias_gelu);
    assert_non_null(async->iface->gemm_bias_gelu);
    const int64_t shapes[4][3] = {{17, 96, 32}, {5, 64, 37}, {9, 13, 21}, {33, 35, 48}};
    const ct_dtype dts[2] = {CT_DTYPE_F32, CT_DTYPE_BF16};
    for (int gelu = 0; gelu < 2; gelu++)
        for (int t = 0; t < 2; t++)
            for (int s = 0; s < 4; s++)
                check_case(p.cpu, p.gpu, async, gelu, dts[t], shapes[s][0], shapes[s][1],
                           shapes[s][2]);
    ct_backend_free(async);
    cuda_test_pair_free(&p);
}

/* Check mode hides the slot: the model then runs the three ops, each checked on its own. */
static void test_check_mode_hides_slot(void **state) {
    (void)state;
    ct_backend *checked = ct_backend_check_new(ct_cuda_backend_new(0));
    assert_null(checked->iface->gemm_bias_gelu);
    ct_backend_free(checked);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_bias_gelu),
        cmocka_unit_test(test_check_mode_hides_slot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
