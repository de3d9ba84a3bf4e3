/*
 * cuda_test_util.h — what the CUDA op tests (test/test_cuda_*.c) share: the CPU backend (the
 * reference) and the CUDA backend side by side, device buffers made from host arrays, the warp
 * orders of the emulator, and a comparator that fails on NaN/Inf.
 *
 * The tests are linked with the emulated CUDA build (cuda/emu/: the same .cu files compiled by
 * g++, each CUDA thread a fiber) and run on a machine without a GPU; on a GPU machine the same
 * source links against the real runtime. Each op runs on both backends from the same inputs
 * (their own copies: an op that writes its input must not leak into the other run), and the
 * outputs are compared element by element with |got − want| <= atol + rtol·|want|.
 *
 * Header-only, so each test stays one file.
 */
#ifndef CT_TEST_CUDA_TEST_UTIL_H
#define CT_TEST_CUDA_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "cuda/backend_cuda.h"

/* The warp orders every kernel test runs in (cuda/emu/README.md): a missing barrier shows in
 * only some of them. Set through the environment the emulator reads at every launch. */
static const char *const cuda_test_orders[] = {"ascending", "descending", "random:12345"};
enum { CUDA_TEST_N_ORDERS = 3 };

static inline void cuda_test_set_order(int i) {
    setenv("CUEMU_ORDER", cuda_test_orders[i], 1);
}

typedef struct cuda_test_pair {
    ct_backend *cpu, *gpu;
} cuda_test_pair;

static inline cuda_test_pair cuda_test_pair_new(void) {
    cuda_test_pair p = {ct_backend_cpu_new(1), ct_cuda_backend_new(0)};
    return p;
}

static inline void cuda_test_pair_free(cuda_test_pair *p) {
    ct_backend_free(p->cpu);
    ct_backend_free(p->gpu);
}

/* Backend memory holding a copy of `bytes` host bytes (host may be NULL: left uninitialised,
 * which on the emulated device means NaN-poisoned). */
static inline void *cuda_test_upload(ct_backend *be, const void *host, size_t bytes) {
    void *d = be->iface->alloc(be->ctx, bytes);
    if (!d) abort();
    if (host) be->iface->copy_from_host(be->ctx, d, host, bytes);
    return d;
}

/* A host copy (malloc'd) of `bytes` backend bytes; waits for the backend's stream. */
static inline void *cuda_test_download(ct_backend *be, const void *dev, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    be->iface->copy_to_host(be->ctx, h, dev, bytes);
    return h;
}

static inline void cuda_test_free(ct_backend *be, void *dev) {
    be->iface->free(be->ctx, dev);
}

/* The tests' random inputs: splitmix64 from a state set by cuda_test_seed, so each case's data is
 * fixed by its own seed values, whatever ran before it. */
static uint64_t cuda_test_rng_state;

static inline void cuda_test_seed(uint64_t a, uint64_t b, uint64_t c) {
    cuda_test_rng_state = 0x6A09E667F3BCC909ull ^ (a * 0x9E3779B97F4A7C15ull) ^
                          (b * 0xC2B2AE3D27D4EB4Full) ^ (c * 0x165667B19E3779F9ull);
}

static inline uint64_t cuda_test_rng_next(void) {
    uint64_t z = (cuda_test_rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi), from the top 53 bits of a draw. */
static inline float cuda_test_urand(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(cuda_test_rng_next() >> 11) / 9007199254740992.0);
}

/* n uniform values in [lo, hi) (malloc'd). */
static inline float *cuda_test_fvec(int64_t n, float lo, float hi) {
    float *f = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = cuda_test_urand(lo, hi);
    return f;
}

/* The bytes of one element of dtype dt. */
static inline size_t cuda_test_dsize(ct_dtype dt) {
    return ct_dtype_size(dt);
}

/* n values as dtype dt (F32 or BF16; malloc'd); f is rounded in place to what is stored (bf16:
 * core/common.h's round to nearest even), so that a reference computed from f sees the inputs
 * the op sees. */
static inline void *cuda_test_pack(ct_dtype dt, float *f, int64_t n) {
    void *p = malloc((size_t)(n ? n : 1) * cuda_test_dsize(dt));
    if (!p) abort();
    for (int64_t i = 0; i < n; i++) {
        if (dt == CT_DTYPE_BF16) {
            uint16_t h = ct_f32_to_bf16(f[i]);
            f[i] = ct_bf16_to_f32(h);
            ((uint16_t *)p)[i] = h;
        } else {
            ((float *)p)[i] = f[i];
        }
    }
    return p;
}

/* Element i of a host array of dtype dt (F32 or BF16) as a float. */
static inline float cuda_test_get(const void *p, ct_dtype dt, int64_t i) {
    return dt == CT_DTYPE_BF16 ? ct_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/*
 * Compares n values of dtype dt: |got − want| <= atol + rtol·|want| for every element; any
 * NaN or Inf in either fails. Prints the worst element (and, with CUDA_TEST_VERBOSE=1 set, the
 * fraction of the tolerance used on success). Returns true when all are close.
 */
static inline bool cuda_test_close(const char *what, const void *got, const void *want, ct_dtype dt,
                                   int64_t n, double atol, double rtol) {
    int64_t worst = -1, bad = 0;
    double worst_ratio = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = cuda_test_get(got, dt, i), w = cuda_test_get(want, dt, i);
        double tol = atol + rtol * fabs(w);
        double ratio =
            isfinite(g) && isfinite(w) ? fabs(g - w) / (tol > 0 ? tol : 1e-300) : INFINITY;
        if (!(ratio <= 1.0)) bad++;
        if (!(ratio <= worst_ratio)) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    if (bad) {
        double g = cuda_test_get(got, dt, worst), w = cuda_test_get(want, dt, worst);
        fprintf(stderr,
                "%s: %lld of %lld elements differ; worst [%lld] got %.9g want %.9g "
                "(|diff| %.3g, tolerance %.3g)\n",
                what, (long long)bad, (long long)n, (long long)worst, g, w, fabs(g - w),
                atol + rtol * fabs(w));
        return false;
    }
    if (getenv("CUDA_TEST_VERBOSE"))
        fprintf(stderr, "%s: ok, %.0f%% of the tolerance used\n", what, 100.0 * worst_ratio);
    return true;
}

#endif /* CT_TEST_CUDA_TEST_UTIL_H */
