/* common.c — error channel, assertions, small helpers. See common.h. */
#include <ctype.h>
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <isa-l/crc.h>

static _Thread_local char error_message[2048]; /* per thread: a background writer reports its own */
static _Thread_local char error_hint[1024];
static int log_rank;

size_t ct_dtype_size(ct_dtype dtype) {
    switch (dtype) {
    case CT_DTYPE_F32: return 4;
    case CT_DTYPE_BF16: return 2;
    case CT_DTYPE_I32: return 4;
    case CT_DTYPE_I64: return 8;
    case CT_DTYPE_U8: return 1;
    case CT_DTYPE_F64: return 8;
    }
    CT_ASSERTF(0, "unknown dtype %d", (int)dtype);
}

const char *ct_dtype_name(ct_dtype dtype) {
    switch (dtype) {
    case CT_DTYPE_F32: return "f32";
    case CT_DTYPE_BF16: return "bf16";
    case CT_DTYPE_I32: return "i32";
    case CT_DTYPE_I64: return "i64";
    case CT_DTYPE_U8: return "u8";
    case CT_DTYPE_F64: return "f64";
    }
    return "?";
}

ct_status ct_error(ct_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    error_hint[0] = '\0';
    return status;
}

void ct_hint(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_hint, sizeof error_hint, fmt, ap);
    va_end(ap);
}

const char *ct_error_message(void) {
    return error_message;
}
const char *ct_error_hint(void) {
    return error_hint;
}

void ct_error_clear(void) {
    error_message[0] = '\0';
    error_hint[0] = '\0';
}

void ct_error_print(void) {
    if (error_message[0]) fprintf(stderr, "cooktrain: %s\n", error_message);
    if (error_hint[0]) fprintf(stderr, "hint: %s\n", error_hint);
    fflush(stderr);
}

void ct_set_log_rank(int rank) {
    log_rank = rank;
}
int ct_log_rank(void) {
    return log_rank;
}

void ct_assert_fail(const char *expr, const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "cooktrain: internal error on rank %d at %s:%d: assertion `%s` failed",
            log_rank, file, line, expr);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        fputs(": ", stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

void *ct_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    CT_ASSERTF(p != NULL, "out of host memory (%zu bytes)", bytes);
    return p;
}

void *ct_xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    CT_ASSERTF(p != NULL, "out of host memory (%zu x %zu bytes)", count, size);
    return p;
}

char *ct_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = ct_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

ct_status ct_file_publish(const char *tmp, const char *path, bool write_ok, const char *what) {
    if (!write_ok) {
        int err = errno;
        unlink(tmp);
        ct_error(CT_ERR_RUNTIME, "cannot write %s file %s: %s", what, tmp, strerror(err));
        ct_hint("check free disk space and quotas");
        return CT_ERR_RUNTIME;
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        ct_error(CT_ERR_INPUT, "cannot rename %s to %s: %s", tmp, path, strerror(err));
        ct_hint("check that the directory is writable");
        return CT_ERR_INPUT;
    }
    return CT_OK;
}

ct_status ct_mkdir_parents(const char *path) {
    char *dir = ct_xstrdup(path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            ct_error(CT_ERR_INPUT, "cannot create directory '%s' for '%s': %s", dir, path,
                     strerror(errno));
            ct_hint("check the path and its permissions");
            free(dir);
            return CT_ERR_INPUT;
        }
        *p = '/';
    }
    free(dir);
    return CT_OK;
}

int ct_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double ct_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, ct_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint32_t ct_crc32(uint32_t crc, const void *buf, size_t n) {
    /* (crc32_gzip_refl takes a 64-bit length; its seed and result are zlib's) */
    return n ? crc32_gzip_refl(crc, (const unsigned char *)buf, n) : crc;
}

const char *ct_format_bytes(char *buf, size_t n, double bytes) {
    if (bytes >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else
        snprintf(buf, n, "%.1f MiB", bytes / (1024.0 * 1024));
    return buf;
}

double ct_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ct_sleep(double seconds) {
    if (!(seconds > 0)) return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) continue;
}

static void (*idle_hook)(void);

void ct_set_idle_hook(void (*hook)(void)) {
    idle_hook = hook;
}

bool ct_idle_hooked(void) {
    return idle_hook != NULL;
}

void ct_idle(void) {
    if (idle_hook) idle_hook();
}

const char *ct_file_kind(unsigned mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a pipe";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link"; /* from lstat */
    if (S_ISREG(mode)) return "a regular file";
    return "not a regular file";
}

ct_status ct_open_regular(const char *path, const char *what, int *fd, int64_t *size) {
    *fd = -1;
    *size = 0;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) {
        ct_error(CT_ERR_INPUT, "cannot open %s '%s': %s", what, path, strerror(errno));
        ct_hint("check the path and that the file is readable");
        return CT_ERR_INPUT;
    }
    struct stat st;
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        const char *kind = fstat(f, &st) == 0 ? ct_file_kind(st.st_mode) : strerror(errno);
        close(f);
        ct_error(CT_ERR_INPUT, "%s '%s' is %s, not a regular file", what, path, kind);
        ct_hint("point it at the file itself (a FIFO, directory or device is refused)");
        return CT_ERR_INPUT;
    }
    int flags = fcntl(f, F_GETFL);
    if (flags >= 0) fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
    *fd = f;
    *size = (int64_t)st.st_size;
    return CT_OK;
}

ct_status ct_read_regular(const char *path, const char *what, int64_t max_bytes, uint8_t **out,
                          size_t *len) {
    *out = NULL;
    *len = 0;
    int fd;
    int64_t size;
    CT_TRY(ct_open_regular(path, what, &fd, &size));
    if (size > max_bytes) {
        close(fd);
        ct_error(CT_ERR_INPUT, "%s '%s' is %lld bytes, larger than the %lld this reader accepts",
                 what, path, (long long)size, (long long)max_bytes);
        ct_hint("is it the right file? a damaged or foreign file is refused before it is read");
        return CT_ERR_INPUT;
    }
    uint8_t *buf = ct_xmalloc((size_t)size + 1);
    int64_t done = 0;
    while (done < size) {
        ssize_t got = read(fd, buf + done, (size_t)(size - done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        done += got;
    }
    close(fd);
    if (done != size) {
        free(buf);
        ct_error(CT_ERR_INPUT, "%s '%s': short read (%lld of %lld bytes; changed while read?)",
                 what, path, (long long)done, (long long)size);
        ct_hint("check the file system, and that nothing writes the file while cooktrain reads it");
        return CT_ERR_INPUT;
    }
    buf[size] = 0;
    *out = buf;
    *len = (size_t)size;
    return CT_OK;
}

/* Levenshtein distance; names longer than 63 bytes count as far from everything. */
int ct_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 1000;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int best = diag + cost;
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

int64_t ct_gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}
