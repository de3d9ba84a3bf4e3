/*
 * bench_gemm_main.c — GEMM rates at the GPT-2 124M model's shapes (B·T = 1024 tokens, C = 768,
 * F = 3072, padded vocabulary 50304): OpenBLAS cblas_sgemm, oneDNN fp32 and oneDNN bf16 (bf16 in,
 * f32 out) through core/backend/cpu/gemm_onednn.h. Built and run by scripts/bench_gemm.sh, which
 * says what the columns mean.
 *
 * Per shape, the three libraries run round-robin (one call each per round) after one warm-up
 * round, so a drift of the machine's speed over time hits all three alike; each column is the
 * median over the rounds. Then small shapes, timed as batches of calls, show the per-call
 * overhead, and the first (primitive-creating) call is timed against a cached one.
 *
 *   bench_gemm [rounds]     (default 5)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "core/backend/cpu/gemm_onednn.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static float *rand_floats(int64_t n, uint64_t seed) {
    float *x = malloc((size_t)n * sizeof *x);
    if (!x) {
        fprintf(stderr, "bench_gemm: out of memory (%lld floats)\n", (long long)n);
        exit(1);
    }
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / 16777216.0) - 0.5f;
    }
    return x;
}

static uint16_t *to_bf16_copy(const float *x, int64_t n) {
    uint16_t *h = malloc((size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = ct_f32_to_bf16(x[i]);
    return h;
}

typedef struct shape {
    const char *name;
    bool ta, tb;
    int64_t M, N, K;
    float beta;   /* as the model calls it: forward with bias and weight gradients accumulate */
    int per_step; /* calls per training step: 12 layers, or 1 for the lm-head */
} shape;

enum { LIB_BLAS, LIB_F32, LIB_BF16, N_LIBS };

/* One call of library lib on the shape. A and B are stored as the shape's transposes say, dense. */
static void call(int lib, const shape *s, const float *A, const float *B, const uint16_t *Ah,
                 const uint16_t *Bh, float *C) {
    int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    if (lib == LIB_BLAS)
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                    s->tb ? CblasTrans : CblasNoTrans, (int)s->M, (int)s->N, (int)s->K, 1.0f, A,
                    (int)lda, B, (int)ldb, s->beta, C, (int)s->N);
    else if (lib == LIB_F32)
        ct_cpu_gemm_onednn(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, s->beta, C, s->N,
                           CT_DTYPE_F32, CT_DTYPE_F32);
    else
        ct_cpu_gemm_onednn(s->ta, s->tb, s->M, s->N, s->K, 1.0f, Ah, lda, Bh, ldb, s->beta, C, s->N,
                           CT_DTYPE_BF16, CT_DTYPE_F32);
}

/* ||x - y|| / ||y|| */
static double rel_diff(const float *x, const float *y, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        r += (double)y[i] * y[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

/* Times the three libraries on one shape; writes GFLOP/s medians into rate[N_LIBS]. */
static void bench_shape(const shape *s, int rounds, double rate[N_LIBS], double diff[2]) {
    int64_t na = s->M * s->K, nb = s->K * s->N, nc = s->M * s->N;
    float *A = rand_floats(na, 1), *B = rand_floats(nb, 2), *C0 = rand_floats(nc, 3);
    uint16_t *Ah = to_bf16_copy(A, na), *Bh = to_bf16_copy(B, nb);
    float *C[N_LIBS];
    for (int l = 0; l < N_LIBS; l++) {
        C[l] = malloc((size_t)nc * sizeof(float));
        memcpy(C[l], C0, (size_t)nc * sizeof(float));
    }
    /* Warm-up round: primitive creation, page faults, caches. It also gives one result per
     * library from the same C0 to check that the libraries agree. */
    for (int l = 0; l < N_LIBS; l++) call(l, s, A, B, Ah, Bh, C[l]);
    diff[0] = rel_diff(C[LIB_F32], C[LIB_BLAS], nc);
    diff[1] = rel_diff(C[LIB_BF16], C[LIB_BLAS], nc);
    double *t[N_LIBS];
    for (int l = 0; l < N_LIBS; l++) t[l] = malloc((size_t)rounds * sizeof(double));
    for (int r = 0; r < rounds; r++)
        for (int l = 0; l < N_LIBS; l++) {
            double t0 = now();
            call(l, s, A, B, Ah, Bh, C[l]);
            t[l][r] = now() - t0;
        }
    double flop = 2.0 * (double)s->M * (double)s->N * (double)s->K;
    for (int l = 0; l < N_LIBS; l++) {
        rate[l] = flop / median(t[l], rounds) * 1e-9;
        free(t[l]), free(C[l]);
    }
    free(A), free(B), free(C0), free(Ah), free(Bh);
}

/* Microseconds per call on a small square shape, from batches of calls (median of 5 batches). */
static double small_us(int lib, int64_t n, int calls) {
    shape s = {"small", false, true, n, n, n, 0.0f, 1};
    float *A = rand_floats(n * n, 4), *B = rand_floats(n * n, 5), *C = rand_floats(n * n, 6);
    uint16_t *Ah = to_bf16_copy(A, n * n), *Bh = to_bf16_copy(B, n * n);
    for (int i = 0; i < 10; i++) call(lib, &s, A, B, Ah, Bh, C);
    double t[5];
    for (int b = 0; b < 5; b++) {
        double t0 = now();
        for (int i = 0; i < calls; i++) call(lib, &s, A, B, Ah, Bh, C);
        t[b] = (now() - t0) / calls * 1e6;
    }
    free(A), free(B), free(C), free(Ah), free(Bh);
    return median(t, 5);
}

/* What creating the three memory objects per call would cost, against re-pointing cached ones. */
static void memory_object_cost(double *create_us, double *repoint_us) {
    dnnl_engine_t eng;
    dnnl_engine_create(&eng, dnnl_cpu, 0);
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {64, 64}, strides = {64, 1};
    dnnl_memory_desc_init_by_strides(&md, 2, dims, dnnl_f32, strides);
    float buf[2][64 * 64];
    const int n = 100000;
    double t0 = now();
    for (int i = 0; i < n; i++) {
        dnnl_memory_t m[3];
        for (int j = 0; j < 3; j++) dnnl_memory_create(&m[j], &md, eng, buf[i & 1]);
        for (int j = 0; j < 3; j++) dnnl_memory_destroy(m[j]);
    }
    *create_us = (now() - t0) / n * 1e6;
    dnnl_memory_t m[3];
    for (int j = 0; j < 3; j++) dnnl_memory_create(&m[j], &md, eng, DNNL_MEMORY_NONE);
    t0 = now();
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 3; j++) dnnl_memory_set_data_handle(m[j], buf[i & 1]);
    *repoint_us = (now() - t0) / n * 1e6;
    for (int j = 0; j < 3; j++) dnnl_memory_destroy(m[j]);
    dnnl_engine_destroy(eng);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (rounds < 1) {
        fprintf(stderr, "bench_gemm: rounds must be >= 1 (got %s)\n", argv[1]);
        return 2;
    }
    const int64_t T = 1024, C = 768, F = 3072, V = 50304;
    const int L = 12;
    /* Forward y = x·W^T (W is out × in): (T, out, in), no transpose of A, B transposed.
     * Input gradient dx = dy·W: (T, in, out). Weight gradient dW += dy^T·x: (out, in, T). */
    const shape shapes[] = {
        {"fwd qkv", false, true, T, 3 * C, C, 1.0f, L},
        {"fwd attn-out", false, true, T, C, C, 1.0f, L},
        {"fwd mlp-up", false, true, T, F, C, 1.0f, L},
        {"fwd mlp-down", false, true, T, C, F, 1.0f, L},
        {"fwd lm-head", false, true, T, V, C, 0.0f, 1},
        {"dX qkv", false, false, T, C, 3 * C, 0.0f, L},
        {"dX attn-out", false, false, T, C, C, 0.0f, L},
        {"dX mlp-up", false, false, T, C, F, 0.0f, L},
        {"dX mlp-down", false, false, T, F, C, 0.0f, L},
        {"dX lm-head", false, false, T, C, V, 0.0f, 1},
        {"dW qkv", true, false, 3 * C, C, T, 1.0f, L},
        {"dW attn-out", true, false, C, C, T, 1.0f, L},
        {"dW mlp-up", true, false, F, C, T, 1.0f, L},
        {"dW mlp-down", true, false, C, F, T, 1.0f, L},
        {"dW lm-head", true, false, V, C, T, 1.0f, 1},
    };
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    char what[160];
    bool native = ct_cpu_has_native_bf16(what, sizeof what);
    printf("bench_gemm: %d threads (OMP_NUM_THREADS), %d timed rounds after 1 warm-up, medians; "
           "native bf16: %s (%s)\n\n",
           omp_get_max_threads(), rounds, native ? "yes" : "no", what);
    printf("%-13s %-17s %2s %2s %4s | %8s %8s %8s | %6s %6s | %-9s %-9s | %s\n", "GEMM",
           "M x N x K", "tA", "tB", "beta", "OpenBLAS", "dnnl-f32", "dnnl-bf16", "f32/OB",
           "bf16/OB", "diff f32", "diff bf16", "oneDNN impl (f32 ; bf16)");
    double log_f32 = 0, log_bf16 = 0, tot_flop = 0, tot_t[N_LIBS] = {0};
    for (int i = 0; i < n_shapes; i++) {
        const shape *s = &shapes[i];
        double rate[N_LIBS], diff[2];
        bench_shape(s, rounds, rate, diff);
        char dims[32];
        snprintf(dims, sizeof dims, "%lldx%lldx%lld", (long long)s->M, (long long)s->N,
                 (long long)s->K);
        double r_f32 = rate[LIB_F32] / rate[LIB_BLAS], r_bf16 = rate[LIB_BF16] / rate[LIB_BLAS];
        log_f32 += log(r_f32), log_bf16 += log(r_bf16);
        double flop = 2.0 * (double)s->M * (double)s->N * (double)s->K * s->per_step;
        tot_flop += flop;
        for (int l = 0; l < N_LIBS; l++) tot_t[l] += flop / (rate[l] * 1e9);
        printf(
            "%-13s %-17s %2d %2d %4g | %8.1f %8.1f %9.1f | %6.2f %7.2f | %9.1e %9.1e | %s ; %s\n",
            s->name, dims, s->ta, s->tb, (double)s->beta, rate[LIB_BLAS], rate[LIB_F32],
            rate[LIB_BF16], r_f32, r_bf16, diff[0], diff[1],
            ct_cpu_gemm_impl(s->ta, s->tb, s->M, s->N, s->K, CT_DTYPE_F32),
            ct_cpu_gemm_impl(s->ta, s->tb, s->M, s->N, s->K, CT_DTYPE_BF16));
        fflush(stdout);
    }
    printf("%-13s %-17s %2s %2s %4s | %8s %8s %9s | %6.2f %7.2f |\n", "geomean", "", "", "", "", "",
           "", "", exp(log_f32 / n_shapes), exp(log_bf16 / n_shapes));
    printf("%-13s %-17s %2s %2s %4s | %8.1f %8.1f %9.1f | %6.2f %7.2f |   (one training step's "
           "GEMMs: %d layers' and the lm-head's, FLOP / time)\n",
           "step", "", "", "", "", tot_flop / tot_t[LIB_BLAS] * 1e-9,
           tot_flop / tot_t[LIB_F32] * 1e-9, tot_flop / tot_t[LIB_BF16] * 1e-9,
           tot_t[LIB_BLAS] / tot_t[LIB_F32], tot_t[LIB_BLAS] / tot_t[LIB_BF16], L);

    printf("\nsmall shapes (n x n x n, B transposed, beta 0): microseconds per call\n");
    printf("%-6s | %8s %8s %9s\n", "n", "OpenBLAS", "dnnl-f32", "dnnl-bf16");
    const int64_t small[] = {1, 16, 64, 128, 256};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        int64_t n = small[i];
        int calls = n <= 64 ? 20000 : n <= 128 ? 4000 : 500;
        printf("%-6lld | %8.2f %8.2f %9.2f\n", (long long)n, small_us(LIB_BLAS, n, calls),
               small_us(LIB_F32, n, calls), small_us(LIB_BF16, n, calls));
    }
    double create_us, repoint_us;
    memory_object_cost(&create_us, &repoint_us);
    printf("three memory objects per call: create+destroy %.3f us, re-point cached %.3f us\n",
           create_us, repoint_us);
    /* The first call of a shape not seen before (by us or by oneDNN's own primitive cache)
     * creates the primitive. */
    shape s = {"first", false, true, 72, 80, 88, 0.0f, 1};
    float *A = rand_floats(72 * 88, 7), *B = rand_floats(80 * 88, 8), *Cm = rand_floats(72 * 80, 9);
    uint16_t *Ah = to_bf16_copy(A, 72 * 88), *Bh = to_bf16_copy(B, 80 * 88);
    for (int lib = LIB_F32; lib <= LIB_BF16; lib++) {
        double t0 = now();
        call(lib, &s, A, B, Ah, Bh, Cm);
        double first = now() - t0;
        t0 = now();
        call(lib, &s, A, B, Ah, Bh, Cm);
        double second = now() - t0;
        printf("72x80x88 %s: first call (creates the primitive) %.1f us, second %.1f us\n",
               lib == LIB_F32 ? "f32 " : "bf16", first * 1e6, second * 1e6);
    }
    free(A), free(B), free(Cm), free(Ah), free(Bh);
    ct_cpu_gemm_release();
    return 0;
}
