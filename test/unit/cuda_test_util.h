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
 * The op tests (test_cuda_elementwise.c, test_cuda_norm.c, test_cuda_attention.c) share one
 * fixture, below: the pair P made once per binary (cuda_test_setup, cuda_test_teardown), buffers
 * on both sides (pbuf), the loop over the warp orders (FOR_EACH_ORDER) with the check that the
 * GPU's bits are the same in every order, and bf16's share of the tolerances.
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

/* ---- the op tests' fixture ------------------------------------------------------------------ */

#define F32 CT_DTYPE_F32
#define BF16 CT_DTYPE_BF16
#define E32 (1.0 / 16777216.0) /* fp32 unit roundoff, 2^-24 */
#define U7 (1.0 / 128.0)       /* two bf16 roundings, 2·2^-8 */

/* The CPU backend (the reference) and the CUDA backend, for every test of the binary. */
static cuda_test_pair P;

/* Bytes after every pbuf that nobody writes (0 unless the test sets it before its first buffer):
 * the emulator fills them with NaN, so a kernel that reads past a buffer shows. */
static size_t cuda_test_pad;

/* cmocka's group fixtures: P for the whole binary. */
static inline int cuda_test_setup(void **state) {
    (void)state;
    P = cuda_test_pair_new();
    return P.cpu && P.gpu ? 0 : -1;
}

static inline int cuda_test_teardown(void **state) {
    (void)state;
    cuda_test_pair_free(&P);
    return 0;
}

/* A buffer on both backends: p[0] the CPU's, p[1] the CUDA backend's. */
typedef struct pbuf {
    void *p[2];
    size_t bytes;
} pbuf;

/* `bytes` copied from host on both sides (host NULL: unwritten, NaN on the emulated device),
 * followed by cuda_test_pad unwritten bytes. */
static inline pbuf pb_new(const void *host, size_t bytes) {
    pbuf b = {{cuda_test_upload(P.cpu, NULL, bytes + cuda_test_pad),
               cuda_test_upload(P.gpu, NULL, bytes + cuda_test_pad)},
              bytes};
    if (host)
        for (int s = 0; s < 2; s++) {
            ct_backend *be = s ? P.gpu : P.cpu;
            be->iface->copy_from_host(be->ctx, b.p[s], host, bytes);
        }
    return b;
}

static inline void pb_free(pbuf *b) {
    cuda_test_free(P.cpu, b->p[0]);
    cuda_test_free(P.gpu, b->p[1]);
}

/* The backend of side s of a pbuf. */
static inline ct_backend *side_be(int s) {
    return s ? P.gpu : P.cpu;
}

/* bf16 outputs: both backends compute the same fp32 value up to the fp32 bound D and round it once
 * to nearest even (at most 2^-8 relative each); two values within D can straddle a rounding
 * boundary, so the bf16 bound is D·(1 + 2^-7) + 2^-7·(1 + 2^-7)·|want|. f32 leaves the bound. */
static inline void bf16_tol(ct_dtype dt, double *atol, double *rtol) {
    if (dt != BF16) return;
    *atol *= 1.0 + U7;
    *rtol = (*rtol + U7) * (1.0 + U7);
}

/* bf16 outputs within bf16_tol: the fp32 values agree to ~1e-5 relative or better and a bf16
 * spacing is 2^-7, so a straddle of a rounding midpoint is rare (an element lands within D of a
 * midpoint with probability ~D/2^-7 < 1e-3). Bits that differ in more than 1 + n/64 elements mean
 * a wrong rounding (truncation, ties away from zero), which moves half of all elements. */
static inline bool cuda_test_bf16_bits_close(const char *label, const void *got, const void *want,
                                             int64_t n) {
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++)
        differ += ((const uint16_t *)got)[i] != ((const uint16_t *)want)[i];
    if (differ <= 1 + n / 64) return true;
    fprintf(stderr, "%s: %lld of %lld bf16 elements differ in their bits (allowed %lld)\n", label,
            (long long)differ, (long long)n, (long long)(1 + n / 64));
    return false;
}

/* The warp order the cases run in now (an index of cuda_test_orders), and every GPU output of a
 * test hashed in checking order: order 0 records, orders 1 and 2 must reproduce it bit for bit (the
 * kernels reduce in a fixed order; a float atomic or a race would show). */
enum { CUDA_TEST_MAX_CHECKS = 512 };
static int cur_order;
static int cuda_test_n_checks;
static uint64_t cuda_test_order_hash[CUDA_TEST_MAX_CHECKS];

/* "[order] what": the name of a check, for its messages. */
static inline void cuda_test_label(char *buf, size_t cap, const char *what) {
    snprintf(buf, cap, "[%s] %s", cuda_test_orders[cur_order], what);
}

static inline bool cuda_test_same_in_every_order(const char *label, const void *got, size_t bytes) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < bytes; i++) h = (h ^ ((const uint8_t *)got)[i]) * 0x100000001b3ull;
    if (cuda_test_n_checks >= CUDA_TEST_MAX_CHECKS) {
        fprintf(stderr, "%s: more than %d checks in one test\n", label, CUDA_TEST_MAX_CHECKS);
        return false;
    }
    const int k = cuda_test_n_checks++;
    if (cur_order == 0) {
        cuda_test_order_hash[k] = h;
    } else if (cuda_test_order_hash[k] != h) {
        fprintf(stderr, "%s: the GPU result differs from the %s order's bits\n", label,
                cuda_test_orders[0]);
        return false;
    }
    return true;
}

/* Each test runs its cases in every warp order; a case returns false on any mismatch. */
#define FOR_EACH_ORDER(body)                                                                       \
    do {                                                                                           \
        bool all_ok = true;                                                                        \
        for (cur_order = 0; cur_order < CUDA_TEST_N_ORDERS; cur_order++) {                         \
            cuda_test_set_order(cur_order);                                                        \
            cuda_test_n_checks = 0;                                                                \
            body;                                                                                  \
        }                                                                                          \
        assert_true(all_ok);                                                                       \
    } while (0)

#endif /* CT_TEST_CUDA_TEST_UTIL_H */
