/*
 * gemm_onednn.c — oneDNN (2.x C API) matmul behind a cblas-like row-major GEMM, with a primitive
 * cache, and CPUID detection of native bf16 (gemm_onednn.h has the contract).
 *
 * Each cache entry owns one primitive and three memory objects created without storage
 * (DNNL_MEMORY_NONE); a call re-points them at the caller's buffers with
 * dnnl_memory_set_data_handle, which for a plain CPU layout without padding is a pointer store.
 */
#include "core/backend/cpu/gemm_onednn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* ---- checks --------------------------------------------------------------------------------- */

__attribute__((noreturn)) static void dnnl_check_fail(const char *call, dnnl_status_t status,
                                                      const char *file, int line) {
    fprintf(stderr,
            "cooktrain: internal error on rank %d at %s:%d: oneDNN call `%s` failed: %s\n"
            "hint: run with ONEDNN_VERBOSE=1 to see what oneDNN tried\n",
            ct_log_rank(), file, line, call, dnnl_status2str(status));
    fflush(stderr);
    abort();
}

#define CT_DNNL_CHECK(call)                                                                        \
    do {                                                                                           \
        dnnl_status_t ct_dnnl_rc_ = (call);                                                        \
        if (ct_dnnl_rc_ != dnnl_success) dnnl_check_fail(#call, ct_dnnl_rc_, __FILE__, __LINE__);  \
    } while (0)

/* ---- state and cache ------------------------------------------------------------------------ */

/* Everything that defines a primitive. Built with memset first so padding bytes are zero and
 * keys compare and hash as bytes (alpha and beta bitwise, with beta -0 folded into +0). */
typedef struct gemm_key {
    int64_t M, N, K, lda, ldb, ldc;
    int32_t trans_a, trans_b, ab_dtype, c_dtype, n_threads;
    int32_t serial; /* for ct_cpu_gemm_serial: one thread, user scratchpad */
    float alpha, beta;
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    uint64_t hash;
    dnnl_primitive_t prim;
    dnnl_memory_t mem_a, mem_b, mem_c; /* no storage of their own: re-pointed every call */
    char impl[64];                     /* dnnl_query_impl_info_str, copied */
    /* serial entries: each call makes its own memory objects from these, and gives the primitive
     * a scratchpad of scratch_bytes (0: none) */
    dnnl_memory_desc_t a_md, b_md, c_md, scratch_md;
    size_t scratch_bytes;
    struct gemm_entry *next;
} gemm_entry;

/* A training run has a few dozen distinct shapes: chains stay short. */
#define GEMM_CACHE_BUCKETS 128
/* Threads of a parallel region that may call ct_cpu_gemm_serial at once (omp_get_thread_num). */
#define GEMM_MAX_THREADS 1024

static struct {
    dnnl_engine_t engine; /* NULL until ct_cpu_gemm_init */
    dnnl_stream_t stream;
    gemm_entry *buckets[GEMM_CACHE_BUCKETS];
    int count;
    struct {
        void *p; /* 64-byte aligned, grown by its own thread only */
        size_t bytes;
    } scratch[GEMM_MAX_THREADS]; /* ct_cpu_gemm_serial's scratchpads, one per thread number */
} g;

bool ct_cpu_gemm_init(void) {
    if (g.engine) return true;
    dnnl_status_t st = dnnl_engine_create(&g.engine, dnnl_cpu, 0);
    if (st != dnnl_success) {
        g.engine = NULL;
        ct_error(CT_ERR_RUNTIME, "oneDNN could not create its CPU engine: %s", dnnl_status2str(st));
        ct_hint("check that libdnnl2 is installed and works: ONEDNN_VERBOSE=1 prints details");
        return false;
    }
    st = dnnl_stream_create(&g.stream, g.engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        dnnl_engine_destroy(g.engine);
        g.engine = NULL;
        g.stream = NULL;
        ct_error(CT_ERR_RUNTIME, "oneDNN could not create a CPU stream: %s", dnnl_status2str(st));
        ct_hint("ONEDNN_VERBOSE=1 prints details");
        return false;
    }
    return true;
}

void ct_cpu_gemm_release(void) {
    for (int b = 0; b < GEMM_CACHE_BUCKETS; b++) {
        gemm_entry *e = g.buckets[b];
        while (e) {
            gemm_entry *next = e->next;
            dnnl_memory_destroy(e->mem_a);
            dnnl_memory_destroy(e->mem_b);
            dnnl_memory_destroy(e->mem_c);
            dnnl_primitive_destroy(e->prim);
            free(e);
            e = next;
        }
        g.buckets[b] = NULL;
    }
    g.count = 0;
    for (int t = 0; t < GEMM_MAX_THREADS; t++) {
        free(g.scratch[t].p);
        g.scratch[t].p = NULL, g.scratch[t].bytes = 0;
    }
    if (g.stream) dnnl_stream_destroy(g.stream);
    if (g.engine) dnnl_engine_destroy(g.engine);
    g.stream = NULL;
    g.engine = NULL;
}

int ct_cpu_gemm_cache_size(void) {
    return g.count;
}

static uint64_t key_hash(const gemm_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static dnnl_data_type_t dnnl_type(ct_dtype dtype) {
    return dtype == CT_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
}

/* Creates the primitive and memory objects for key k (engine initialised). */
static gemm_entry *entry_new(const gemm_key *k) {
    const int64_t M = k->M, N = k->N, K = k->K;
    /* Logical dims are op(A) (M,K), op(B) (K,N), C (M,N); a transpose is the stride swap. */
    dnnl_dims_t a_dims = {M, K}, b_dims = {K, N}, c_dims = {M, N};
    dnnl_dims_t a_strides = {k->lda, 1}, b_strides = {k->ldb, 1}, c_strides = {k->ldc, 1};
    if (k->trans_a) a_strides[0] = 1, a_strides[1] = k->lda;
    if (k->trans_b) b_strides[0] = 1, b_strides[1] = k->ldb;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_data_type_t ab_t = dnnl_type((ct_dtype)k->ab_dtype), c_t = dnnl_type((ct_dtype)k->c_dtype);
    CT_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, ab_t, a_strides));
    CT_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, ab_t, b_strides));
    CT_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, c_t, c_strides));
    dnnl_matmul_desc_t desc;
    CT_DNNL_CHECK(dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md));

    dnnl_primitive_attr_t attr;
    CT_DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    /* A serial entry runs on several threads at once, each with its own scratchpad: oneDNN's
     * own (library mode) is per thread and must not move between threads. */
    if (k->serial)
        CT_DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    /* fp32 stays fp32 even if DNNL_DEFAULT_FPMATH_MODE asks oneDNN to down-convert. */
    if (k->ab_dtype == CT_DTYPE_F32)
        CT_DNNL_CHECK(dnnl_primitive_attr_set_fpmath_mode(attr, dnnl_fpmath_mode_strict));
    if (k->alpha != 1.0f)
        CT_DNNL_CHECK(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha));
    if (k->beta != 0.0f) {
        /* dst = alpha·acc + beta·dst: output scales apply to the accumulator, sum adds after. */
        dnnl_post_ops_t po;
        CT_DNNL_CHECK(dnnl_post_ops_create(&po));
        CT_DNNL_CHECK(dnnl_post_ops_append_sum(po, k->beta));
        CT_DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
        CT_DNNL_CHECK(dnnl_post_ops_destroy(po));
    }
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, g.engine, NULL);
    CT_ASSERTF(st == dnnl_success,
               "oneDNN has no matmul for M=%lld N=%lld K=%lld trans_a=%d trans_b=%d lda=%lld "
               "ldb=%lld ldc=%lld %s x %s -> %s alpha=%g beta=%g: %s (ONEDNN_VERBOSE=1 says why)",
               (long long)M, (long long)N, (long long)K, k->trans_a, k->trans_b, (long long)k->lda,
               (long long)k->ldb, (long long)k->ldc, ct_dtype_name((ct_dtype)k->ab_dtype),
               ct_dtype_name((ct_dtype)k->ab_dtype), ct_dtype_name((ct_dtype)k->c_dtype),
               (double)k->alpha, (double)k->beta, dnnl_status2str(st));
    CT_DNNL_CHECK(dnnl_primitive_attr_destroy(attr));

    gemm_entry *e = ct_xcalloc(1, sizeof *e);
    e->key = *k;
    e->hash = key_hash(k);
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl)
        impl = "unknown";
    snprintf(e->impl, sizeof e->impl, "%s", impl);
    if (k->serial) {
        e->a_md = a_md, e->b_md = b_md, e->c_md = c_md;
        const dnnl_memory_desc_t *smd =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        if (smd) e->scratch_md = *smd, e->scratch_bytes = dnnl_memory_desc_get_size(smd);
    }
    CT_DNNL_CHECK(dnnl_primitive_create(&e->prim, pd));
    CT_DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    CT_DNNL_CHECK(dnnl_memory_create(&e->mem_a, &a_md, g.engine, DNNL_MEMORY_NONE));
    CT_DNNL_CHECK(dnnl_memory_create(&e->mem_b, &b_md, g.engine, DNNL_MEMORY_NONE));
    CT_DNNL_CHECK(dnnl_memory_create(&e->mem_c, &c_md, g.engine, DNNL_MEMORY_NONE));
    return e;
}

/* The cached entry for key k, created on first use. */
static gemm_entry *entry_get(const gemm_key *k) {
    uint64_t h = key_hash(k);
    gemm_entry **head = &g.buckets[h % GEMM_CACHE_BUCKETS];
    for (gemm_entry *e = *head; e; e = e->next)
        if (e->hash == h && memcmp(&e->key, k, sizeof *k) == 0) return e;
    gemm_entry *e = entry_new(k);
    e->next = *head;
    *head = e;
    g.count++;
    return e;
}

static void key_init(gemm_key *k, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     float alpha, int64_t lda, int64_t ldb, float beta, int64_t ldc,
                     ct_dtype ab_dtype, ct_dtype c_dtype) {
    memset(k, 0, sizeof *k);
    k->M = M, k->N = N, k->K = K, k->lda = lda, k->ldb = ldb, k->ldc = ldc;
    k->trans_a = trans_a, k->trans_b = trans_b;
    k->ab_dtype = (int32_t)ab_dtype, k->c_dtype = (int32_t)c_dtype;
    k->n_threads = omp_get_max_threads();
    k->alpha = alpha;
    k->beta = beta == 0.0f ? 0.0f : beta;
}

/* ---- GEMM ----------------------------------------------------------------------------------- */

/* The dtype pairs both GEMMs take: fp32 or bf16 A and B; fp32 C, or bf16 C from bf16 inputs. */
static void check_dtypes(ct_dtype ab_dtype, ct_dtype c_dtype) {
    CT_ASSERTF(ab_dtype == CT_DTYPE_F32 || ab_dtype == CT_DTYPE_BF16, "A/B dtype %s",
               ct_dtype_name(ab_dtype));
    CT_ASSERTF(c_dtype == CT_DTYPE_F32 || (c_dtype == CT_DTYPE_BF16 && ab_dtype == CT_DTYPE_BF16),
               "C dtype %s with A/B dtype %s", ct_dtype_name(c_dtype), ct_dtype_name(ab_dtype));
}

/* C = beta·C without A·B (K == 0 or alpha == 0, as BLAS defines them); beta == 0 writes zeros. */
static void scale_c(int64_t M, int64_t N, float beta, void *C, int64_t ldc, ct_dtype c_dtype) {
    for (int64_t i = 0; i < M; i++) {
        if (c_dtype == CT_DTYPE_F32) {
            float *c = (float *)C + i * ldc;
            for (int64_t j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        } else {
            uint16_t *c = (uint16_t *)C + i * ldc;
            for (int64_t j = 0; j < N; j++)
                c[j] = beta == 0.0f ? 0 : ct_f32_to_bf16(beta * ct_bf16_to_f32(c[j]));
        }
    }
}

void ct_cpu_gemm_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C,
                        int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    check_dtypes(ab_dtype, c_dtype);
    CT_ASSERTF(M >= 0 && N >= 0 && K >= 0, "M=%lld N=%lld K=%lld", (long long)M, (long long)N,
               (long long)K);
    if (M == 0 || N == 0) return;
    CT_ASSERTF(C && ldc >= N, "ldc=%lld < N=%lld", (long long)ldc, (long long)N);
    if (K == 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc, c_dtype);
        return;
    }
    CT_ASSERTF(A && lda >= (trans_a ? M : K), "lda=%lld for %s A with M=%lld K=%lld",
               (long long)lda, trans_a ? "transposed" : "plain", (long long)M, (long long)K);
    CT_ASSERTF(B && ldb >= (trans_b ? K : N), "ldb=%lld for %s B with K=%lld N=%lld",
               (long long)ldb, trans_b ? "transposed" : "plain", (long long)K, (long long)N);
    if (!ct_cpu_gemm_init()) {
        ct_error_print();
        CT_ASSERTF(false, "oneDNN is unusable (message above)");
    }

    gemm_key key;
    key_init(&key, trans_a, trans_b, M, N, K, alpha, lda, ldb, beta, ldc, ab_dtype, c_dtype);
    gemm_entry *e = entry_get(&key);
    CT_DNNL_CHECK(dnnl_memory_set_data_handle(e->mem_a, (void *)A)); /* oneDNN only reads src */
    CT_DNNL_CHECK(dnnl_memory_set_data_handle(e->mem_b, (void *)B));
    CT_DNNL_CHECK(dnnl_memory_set_data_handle(e->mem_c, C));
    const dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, e->mem_a},
        {DNNL_ARG_WEIGHTS, e->mem_b},
        {DNNL_ARG_DST, e->mem_c},
    };
    CT_DNNL_CHECK(dnnl_primitive_execute(e->prim, g.stream, 3, args));
    CT_DNNL_CHECK(dnnl_stream_wait(g.stream));
}

void ct_cpu_gemm_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C,
                        int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    CT_ASSERTF(M > 0 && N > 0 && K > 0 && alpha != 0.0f, "M=%lld N=%lld K=%lld alpha=%g",
               (long long)M, (long long)N, (long long)K, (double)alpha);
    CT_ASSERTF(g.engine, "ct_cpu_gemm_serial before ct_cpu_gemm_init");
    /* The scratchpad is chosen by thread number, which is unique only in the outermost team. */
    CT_ASSERTF(omp_get_level() <= 1, "ct_cpu_gemm_serial from a nested parallel region (level %d)",
               omp_get_level());
    const int tid = omp_get_thread_num();
    CT_ASSERTF(tid < GEMM_MAX_THREADS, "thread %d of a region wider than %d", tid,
               GEMM_MAX_THREADS);
    /* oneDNN blocks the work for the thread count it sees at creation: one, here, on every
     * thread (inside a parallel region this sets the count of this thread's task only). */
    const int outer = omp_get_max_threads();
    if (outer != 1) omp_set_num_threads(1);
    gemm_key key;
    check_dtypes(ab_dtype, c_dtype);
    key_init(&key, trans_a, trans_b, M, N, K, alpha, lda, ldb, beta, ldc, ab_dtype, c_dtype);
    key.serial = 1;
    gemm_entry *e;
#pragma omp critical(ct_cpu_gemm_cache)
    e = entry_get(&key);
    if (g.scratch[tid].bytes < e->scratch_bytes) {
        free(g.scratch[tid].p);
        g.scratch[tid].bytes = (e->scratch_bytes + 63) & ~(size_t)63;
        g.scratch[tid].p = aligned_alloc(64, g.scratch[tid].bytes);
        CT_ASSERTF(g.scratch[tid].p, "out of memory for a %zu-byte GEMM scratchpad",
                   g.scratch[tid].bytes);
    }
    /* Memory objects and a stream of this call's own: creating them costs ~0.1 us each, against
     * tens of microseconds for a tile. */
    dnnl_memory_t ma, mb, mc, ms = NULL;
    dnnl_stream_t stream;
    CT_DNNL_CHECK(dnnl_memory_create(&ma, &e->a_md, g.engine, (void *)A));
    CT_DNNL_CHECK(dnnl_memory_create(&mb, &e->b_md, g.engine, (void *)B));
    CT_DNNL_CHECK(dnnl_memory_create(&mc, &e->c_md, g.engine, C));
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, ma},
        {DNNL_ARG_WEIGHTS, mb},
        {DNNL_ARG_DST, mc},
    };
    int n_args = 3;
    if (e->scratch_bytes) {
        CT_DNNL_CHECK(dnnl_memory_create(&ms, &e->scratch_md, g.engine, g.scratch[tid].p));
        args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, ms};
    }
    CT_DNNL_CHECK(dnnl_stream_create(&stream, g.engine, dnnl_stream_default_flags));
    CT_DNNL_CHECK(dnnl_primitive_execute(e->prim, stream, n_args, args));
    CT_DNNL_CHECK(dnnl_stream_wait(stream));
    CT_DNNL_CHECK(dnnl_stream_destroy(stream));
    CT_DNNL_CHECK(dnnl_memory_destroy(ma));
    CT_DNNL_CHECK(dnnl_memory_destroy(mb));
    CT_DNNL_CHECK(dnnl_memory_destroy(mc));
    if (ms) CT_DNNL_CHECK(dnnl_memory_destroy(ms));
    if (outer != 1) omp_set_num_threads(outer);
}

const char *ct_cpu_gemm_impl(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                             ct_dtype ab_dtype) {
    if (M <= 0 || N <= 0 || K <= 0 || !ct_cpu_gemm_init()) return "unavailable";
    CT_ASSERTF(ab_dtype == CT_DTYPE_F32 || ab_dtype == CT_DTYPE_BF16, "A/B dtype %s",
               ct_dtype_name(ab_dtype));
    gemm_key key;
    key_init(&key, trans_a, trans_b, M, N, K, 1.0f, trans_a ? M : K, trans_b ? K : N, 0.0f, N,
             ab_dtype, CT_DTYPE_F32);
    return entry_get(&key)->impl;
}

/* ---- native bf16 detection ------------------------------------------------------------------ */

#if defined(__x86_64__) || defined(__i386__)
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

/* CPUID and XCR0 only, no environment. */
static bool detect_native_bf16(char *what, size_t cap) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    bool osxsave = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27));
    bool amx_bf16 = false, avx512_bf16 = false;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        unsigned max_subleaf = a;
        amx_bf16 = (d >> 22) & 1u;
        if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
            avx512_bf16 = (a >> 5) & 1u;
    }
    if (!amx_bf16 && !avx512_bf16) {
        snprintf(what, cap, "no native bf16 (avx512_bf16/amx_bf16 absent)");
        return false;
    }
    /* XMM, YMM (1, 2), opmask, ZMM0-15 upper halves, ZMM16-31 (5, 6, 7); AMX TILECFG and
     * TILEDATA (17, 18). XGETBV faults unless the OS set OSXSAVE. */
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool avx512_state = (xcr0 & 0xe6u) == 0xe6u;
    bool amx_state = avx512_state && (xcr0 & (3u << 17)) == (3u << 17);
    bool amx = amx_bf16 && amx_state, avx = avx512_bf16 && avx512_state;
    if (amx && avx)
        snprintf(what, cap, "amx_bf16 + avx512_bf16");
    else if (amx)
        snprintf(what, cap, "amx_bf16");
    else if (avx)
        snprintf(what, cap, "avx512_bf16");
    else
        snprintf(what, cap,
                 "%s present but the OS has not enabled its register state (XCR0=0x%llx)",
                 avx512_bf16 ? "avx512_bf16" : "amx_bf16", (unsigned long long)xcr0);
    return amx || avx;
#else
    snprintf(what, cap, "no native bf16 (not an x86 CPU)");
    return false;
#endif
}

bool ct_cpu_has_native_bf16(char *what, size_t cap) {
    char scratch[160];
    if (!what || cap == 0) what = scratch, cap = sizeof scratch;
    const char *env = getenv("COOKTRAIN_CPU_BF16");
    if (env && strcmp(env, "0") == 0) {
        snprintf(what, cap, "forced off by COOKTRAIN_CPU_BF16=0");
        return false;
    }
    bool native = detect_native_bf16(what, cap);
    if (env && strcmp(env, "1") == 0) {
        char detected[160];
        snprintf(detected, sizeof detected, "%s", what);
        snprintf(what, cap, "forced on by COOKTRAIN_CPU_BF16=1 (detected: %s)", detected);
        return true;
    }
    return native;
}
