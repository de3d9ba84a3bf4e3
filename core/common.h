/*
 * common.h — the few things every cooktrain module needs: status codes, the error channel,
 * invariant checks, and dtypes.
 *
 * Two kinds of failure (core/README.md, Errors):
 *   - A broken invariant is a bug: CT_ASSERT prints file:line and rank and aborts. It is never
 *     compiled out.
 *   - A failure caused by the outside world (bad config, missing file, out of memory) returns a
 *     ct_status up to cmd/, which prints the message and picks the exit code. Nothing below cmd/
 *     calls exit(). The message is recorded with ct_error() and an optional ct_hint(), and printed
 *     once by ct_error_print().
 *
 * Exit-code policy (core/README.md, Errors): CT_OK → 0, CT_ERR_INPUT → 2 (usage, config, data,
 * checkpoint), CT_ERR_RUNTIME → 1 (out of memory, device error, collective timeout).
 */
#ifndef CT_COMMON_H
#define CT_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h> /* memcpy in the little-endian helpers */

typedef enum ct_status {
    CT_OK = 0,
    CT_ERR_RUNTIME = 1,
    CT_ERR_INPUT = 2,
} ct_status;

/* Element types of tensors and of communication buffers. */
typedef enum ct_dtype {
    CT_DTYPE_F32 = 0,
    CT_DTYPE_BF16,
    CT_DTYPE_I32,
    CT_DTYPE_I64,
    CT_DTYPE_U8,
    CT_DTYPE_F64, /* communication only (loss and norm sums); no tensor op takes it */
} ct_dtype;

size_t ct_dtype_size(ct_dtype dtype);
const char *ct_dtype_name(ct_dtype dtype);
/*
 * bf16 <-> f32 on the host: round to nearest even; a NaN stays a NaN (its quiet bit set, so that
 * truncating its mantissa cannot make it an infinity). The one host rounding: the CPU backend's
 * bf16 ops, the MPI bf16 reductions, the CUDA fill value, checkpoints and exports all round here,
 * which is what makes them bit-identical to each other. Inline and branch-free so that the CPU
 * backend's conversion loops vectorize; device code rounds with __float2bfloat16_rn, the same
 * rounding (cuda/ct_cuda_dtype.cuh).
 */
static inline uint16_t ct_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

static inline float ct_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/*
 * The error channel. ct_error() records the message (printf-style) and returns `status`, so a
 * failing function can say `return ct_error(CT_ERR_INPUT, "...")`. ct_hint() attaches the one
 * hint line. A later ct_error() replaces an earlier one; ct_error_clear() forgets it.
 */
ct_status ct_error(ct_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ct_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *ct_error_message(void);
const char *ct_error_hint(void);
void ct_error_clear(void);
/* Prints "cooktrain: <message>" and "hint: <hint>" to stderr (if a message is set). */
void ct_error_print(void);

/*
 * The idle hook: what a host that waits for a device should run between polls. The NCCL comm sets
 * it (its watchdog checks its operations there, and under the CUDA emulator it lets the
 * communication streams move on); the CUDA backend's host waits poll and call ct_idle() while it
 * is set, and block in the CUDA runtime otherwise. NULL clears it.
 */
void ct_set_idle_hook(void (*hook)(void));
bool ct_idle_hooked(void);
void ct_idle(void);

/* The rank printed by CT_ASSERT and diagnostics; set once by the parallel layer (0 by default). */
void ct_set_log_rank(int rank);
int ct_log_rank(void);

__attribute__((noreturn)) void ct_assert_fail(const char *expr, const char *file, int line,
                                              const char *fmt, ...);

#define CT_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) ct_assert_fail(#cond, __FILE__, __LINE__, NULL);                              \
    } while (0)
#define CT_ASSERTF(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) ct_assert_fail(#cond, __FILE__, __LINE__, __VA_ARGS__);                       \
    } while (0)

/* Propagates a non-OK status to the caller. */
#define CT_TRY(expr)                                                                               \
    do {                                                                                           \
        ct_status ct_try_status_ = (expr);                                                         \
        if (ct_try_status_ != CT_OK) return ct_try_status_;                                        \
    } while (0)

/* Allocation that treats failure as a bug-level abort: only for small host bookkeeping. Large
 * buffers go through the backend, whose failures are reported as CT_ERR_RUNTIME. */
void *ct_xmalloc(size_t bytes);
void *ct_xcalloc(size_t count, size_t size);
char *ct_xstrdup(const char *s);

/*
 * The last step of writing a file safely: `tmp` was written in full (write_ok says whether every
 * write and the close succeeded); rename it over `path`, or remove it on failure. A reader never
 * sees a half-written `path`. `what` names the file kind in messages ("shard", "tokenizer").
 */
ct_status ct_file_publish(const char *tmp, const char *path, bool write_ok, const char *what);

/* mkdir -p of the directory part of `path` (the file itself is not made); CT_ERR_INPUT with a
 * message naming the directory when one cannot be made. */
ct_status ct_mkdir_parents(const char *path);

/*
 * Reading files that come from outside (checkpoints, shards, tokenizers, configs): every one may
 * be damaged or crafted. ct_open_regular opens `path` without blocking (O_NONBLOCK: a FIFO in
 * place of a file does not hang the open) and refuses anything that is not a regular file (a
 * FIFO, a directory, a device such as /dev/zero) with CT_ERR_INPUT naming `what` and the path;
 * *size is the file's real length (fstat), which callers use as the cap of what they allocate.
 * O_NONBLOCK is cleared once the file is known to be regular. ct_read_regular reads a whole
 * regular file of at most max_bytes (else CT_ERR_INPUT: "larger than ..."), never allocating
 * more than the file holds; *out is malloc'd (one spare byte, zeroed, so text can be terminated).
 */
ct_status ct_open_regular(const char *path, const char *what, int *fd, int64_t *size);
/* What a file is, for messages ("a directory", "a pipe", "a symbolic link" from lstat, "a regular
 * file", ...), from its st_mode. */
const char *ct_file_kind(unsigned mode);
ct_status ct_read_regular(const char *path, const char *what, int64_t max_bytes, uint8_t **out,
                          size_t *len);

/* Overflow-checked arithmetic on counts read from files: false when the exact result does not
 * fit (then *out is unspecified). */
static inline bool ct_mul_i64(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool ct_add_i64(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* Monotonic wall time in seconds. */
double ct_now(void);
/* Sleeps this many seconds (through signals; <= 0: returns at once). */
void ct_sleep(double seconds);

/* qsort's comparison of two doubles, ascending (NaN-free input). */
int ct_cmp_double(const void *a, const void *b);
/* The median of v[0..n) (n > 0; the mean of the middle two when n is even); sorts v. */
double ct_median(double *v, int n);
/* "12.3 MiB" below 1 GiB, "1.23 GiB" from there on, into buf (n bytes); returns buf. */
const char *ct_format_bytes(char *buf, size_t n, double bytes);

/* CRC-32 (IEEE 802.3, reflected: gzip's and zlib's crc32) of n bytes, continuing from `crc`
 * (0 to start): ct_crc32(ct_crc32(0, a, na), b, nb) == ct_crc32(0, ab, na + nb). Every checksum
 * of the file formats (checkpoint pieces and manifests, parameter replicas) is this one. Intel's
 * ISA-L computes it with carry-less multiplication, several times zlib's rate. */
uint32_t ct_crc32(uint32_t crc, const void *buf, size_t n);

/* Levenshtein distance, case-insensitive (the suggestions of "did you mean"); strings longer
 * than 63 bytes count as far (1000) from everything. */
int ct_edit_distance(const char *a, const char *b);
/* The greatest common divisor of a and b (>= 0). */
int64_t ct_gcd64(int64_t a, int64_t b);

/* Little-endian encoding: every file format of the project is little-endian whatever the host
 * (and says so with a byte-order mark); compilers turn these into single loads and stores. */
static inline void ct_put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void ct_put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t ct_get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t ct_get_le64(const uint8_t *p) {
    return (uint64_t)ct_get_le32(p) | (uint64_t)ct_get_le32(p + 4) << 32;
}

/* The program's version: `cooktrain help` prints it and checkpoints record it. */
#define CT_VERSION "0.5.0"

/* Longest path a config or a command line may give. */
#define CT_PATH_MAX 512

/* n f32 values to and from their little-endian bytes (a copy on little-endian hosts). */
static inline void ct_put_le_floats(uint8_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        ct_put_le32(dst + 4 * i, u);
    }
}
static inline void ct_get_le_floats(float *dst, const uint8_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = ct_get_le32(src + 4 * i);
        memcpy(&dst[i], &u, 4);
    }
}

#define CT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CT_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif /* CT_COMMON_H */
