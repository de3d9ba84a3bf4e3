/*
 * backend_cpu.c — the CPU backend: its table, memory, context and hardware peak. Its ops, for fp32
 * and bf16, are in the op files beside this one (cpu.h; "bf16: the slots" there). It is the
 * numerical reference the other backends are tested against, and it is meant to be fast on a few
 * cores:
 *   - GEMMs go to oneDNN's matmul (gemm_onednn.h; bf16: AMX or AVX512-BF16 kernels, fp32
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
 * (cpu.h) is a small vectorisable exp (Cody–Waite reduction + degree-7 Taylor polynomial,
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
#include "core/backend/cpu/cpu.h"

#include "core/backend/cpu/gemm_onednn.h"
#include <omp.h>
#include <stdio.h>

/* Provided by OpenBLAS (declared in its cblas.h as well; repeated here for older headers). */
void openblas_set_num_threads(int num_threads);

/* ---- memory ------------------------------------------------------------------------------- */

/* The workspace, at least `bytes` long. Contents are not preserved across growth. */
void *ct_cpu_ws_get(cpu_ctx *c, size_t bytes) {
    if (bytes > c->ws_bytes) {
        free(c->ws);
        c->ws_bytes = round_up(bytes, 64);
        c->ws = aligned_alloc(64, c->ws_bytes);
        CT_ASSERTF(c->ws != NULL, "cpu backend: out of memory for a %zu-byte workspace",
                   c->ws_bytes);
    }
    return c->ws;
}

static void *cpu_alloc(void *ctx, size_t bytes) {
    /* 64-byte alignment (a cache line, a full AVX-512 vector); not zeroed: callers fill. */
    return aligned_alloc(64, round_up(bytes ? bytes : 1, 64));
}

static void cpu_free(void *ctx, void *ptr) {
    free(ptr);
}

/* Large copies are split into 1 MiB pieces so both cores pull on memory bandwidth. */
void ct_cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    cpu_ctx *c = ctx;
    const size_t piece = (size_t)1 << 20;
    if (bytes < 4 * piece) {
        memcpy(dst, src, bytes);
        return;
    }
    int64_t n_pieces = (int64_t)((bytes + piece - 1) / piece);
    PARALLEL_FOR(c->n_threads)
    for (int64_t p = 0; p < n_pieces; p++) {
        size_t off = (size_t)p * piece;
        memcpy((char *)dst + off, (const char *)src + off, CT_MIN(piece, bytes - off));
    }
}

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

/* The ops come from the list (backend_ops.h): ct_cpu_<op> for every required and feature op, in
 * its op file (cpu.h). The optional ops (gemm_grouped, gemm_bias_gelu) stay NULL: their ct_
 * wrappers run the reference composition. */
#define CPU_SLOT_(...) CT_OP_SLOT(ct_cpu_, __VA_ARGS__)
static const struct ct_backend_i cpu_iface = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_from_host = cpu_copy_host,
    .copy_to_host = cpu_copy_host,
    .event_record = NULL, /* everything runs synchronously on the calling thread's team */
    .event_wait = NULL,
    .sync = NULL,
    .peak_flops = cpu_peak_flops,
    .describe = cpu_describe,
    .free_backend = cpu_free_backend,
    CT_BACKEND_OPS(CPU_SLOT_)};
#undef CPU_SLOT_

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
