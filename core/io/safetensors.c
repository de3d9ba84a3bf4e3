/* safetensors.c — reading a safetensors file, every field checked. See safetensors.h. */
#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEADER_MAX ((int64_t)100 << 20)
#define DIM_MAX ((int64_t)1 << 31)

static ct_status bad(const char *path, const char *what, const char *name) {
    ct_error(CT_ERR_INPUT, "safetensors '%s': %s%s%s", path, name ? "tensor " : "",
             name ? name : "", what);
    ct_hint("the file is damaged or not a safetensors file this reader supports (dtypes F32, "
            "BF16, F16; at most two dimensions)");
    return CT_ERR_INPUT;
}

static int by_begin(const void *a, const void *b) {
    const ct_st_tensor *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Every dtype of the format, with its element size: a tensor of one this reader does not convert
 * (a causal-mask buffer of bool, an int64 position table) is still checked, but refused only if
 * it is read. */
static ct_status parse_dtype(const char *path, const char *name, json_t *v, ct_st_tensor *t,
                             int64_t *esize) {
    static const struct {
        const char *name;
        ct_st_dtype dtype;
        int size;
    } dtypes[] = {
        {"F32", CT_ST_F32, 4},    {"BF16", CT_ST_BF16, 2},     {"F16", CT_ST_F16, 2},
        {"F64", CT_ST_OTHER, 8},  {"I64", CT_ST_OTHER, 8},     {"U64", CT_ST_OTHER, 8},
        {"I32", CT_ST_OTHER, 4},  {"U32", CT_ST_OTHER, 4},     {"I16", CT_ST_OTHER, 2},
        {"U16", CT_ST_OTHER, 2},  {"I8", CT_ST_OTHER, 1},      {"U8", CT_ST_OTHER, 1},
        {"BOOL", CT_ST_OTHER, 1}, {"F8_E4M3", CT_ST_OTHER, 1}, {"F8_E5M2", CT_ST_OTHER, 1}};
    const char *s = json_string_value(v);
    for (size_t i = 0; s && i < CT_ARRAY_LEN(dtypes); i++)
        if (!strcmp(s, dtypes[i].name)) {
            t->dtype = dtypes[i].dtype;
            snprintf(t->dtype_name, sizeof t->dtype_name, "%s", s);
            *esize = dtypes[i].size;
            return CT_OK;
        }
    char what[96];
    snprintf(what, sizeof what, ": dtype %.32s is not a safetensors dtype",
             s ? s : "(not a string)");
    return bad(path, what, name);
}

/* A JSON integer in [lo, hi]. */
static bool int_in(json_t *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return false;
    *out = (int64_t)x;
    return true;
}

static ct_status parse_tensor(const char *path, const char *name, json_t *v, int64_t data_size,
                              ct_st_tensor *t) {
    memset(t, 0, sizeof *t);
    if (strlen(name) >= CT_ST_NAME) return bad(path, ": name longer than 127 bytes", NULL);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!json_is_object(v)) return bad(path, " is not a JSON object", name);
    int64_t esize;
    CT_TRY(parse_dtype(path, name, json_object_get(v, "dtype"), t, &esize));
    json_t *shape = json_object_get(v, "shape"), *offsets = json_object_get(v, "data_offsets");
    if (!json_is_array(shape) || json_array_size(shape) > 8)
        return bad(path, ": shape is not an array of at most eight dimensions", name);
    t->ndim = (int)json_array_size(shape);
    t->shape[0] = t->shape[1] = 1;
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        int64_t n;
        if (!int_in(json_array_get(shape, (size_t)d), 0, DIM_MAX - 1, &n) ||
            !ct_mul_i64(t->numel, n, &t->numel))
            return bad(path,
                       ": a dimension is not an integer in [0, 2^31), or their product "
                       "overflows",
                       name);
        if (d < 2) t->shape[d] = n;
    }
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 ||
        !int_in(json_array_get(offsets, 0), 0, data_size, &t->begin) ||
        !int_in(json_array_get(offsets, 1), t->begin, data_size, &t->end))
        return bad(path, ": data_offsets is not [begin, end] with begin <= end inside the data",
                   name);
    int64_t bytes;
    if (!ct_mul_i64(t->numel, esize, &bytes) || bytes != t->end - t->begin)
        return bad(path, ": data_offsets do not span its shape times its element size", name);
    return CT_OK;
}

ct_status ct_safetensors_parse(const char *path, const char *json, size_t len, int64_t data_size,
                               ct_safetensors *st) {
    memset(st, 0, sizeof *st);
    st->fd = -1;
    snprintf(st->path, sizeof st->path, "%s", path);
    st->data_size = data_size;
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!root || !json_is_object(root)) {
        char what[256];
        snprintf(what, sizeof what, "the header is not a JSON object (%s)",
                 root ? "another JSON value" : err.text);
        json_decref(root);
        return bad(path, what, NULL);
    }
    const size_t cap = json_object_size(root);
    st->tensors = ct_xcalloc(cap ? cap : 1, sizeof *st->tensors);
    const char *key;
    json_t *v;
    ct_status status = CT_OK;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) status = bad(path, "__metadata__ is not an object", NULL);
        } else {
            status = parse_tensor(path, key, v, data_size, &st->tensors[st->n]);
            if (status == CT_OK) st->n++;
        }
        if (status != CT_OK) break;
    }
    json_decref(root);
    if (status == CT_OK) {
        /* In order of begin, each tensor that holds bytes must start at or after the furthest
         * end so far, not only the previous tensor's: an empty tensor between two others (its
         * end its begin) must not hide their overlap. */
        qsort(st->tensors, (size_t)st->n, sizeof *st->tensors, by_begin);
        int furthest = -1; /* the tensor of bytes that ends last so far */
        for (int i = 0; i < st->n && status == CT_OK; i++) {
            const ct_st_tensor *t = &st->tensors[i];
            if (t->begin == t->end) continue;
            if (furthest >= 0 && t->begin < st->tensors[furthest].end) {
                char what[CT_ST_NAME + 96];
                snprintf(what, sizeof what, ": its bytes [%lld, %lld) overlap tensor %s's",
                         (long long)t->begin, (long long)t->end, st->tensors[furthest].name);
                status = bad(path, what, t->name);
            }
            if (furthest < 0 || t->end > st->tensors[furthest].end) furthest = i;
        }
    }
    if (status != CT_OK) ct_safetensors_close(st);
    return status;
}

ct_status ct_safetensors_open(const char *path, ct_safetensors *st) {
    memset(st, 0, sizeof *st);
    st->fd = -1;
    int fd;
    int64_t size;
    CT_TRY(ct_open_regular(path, "safetensors", &fd, &size));
    uint8_t len8[8];
    int64_t n = -1;
    if (size >= 8 && pread(fd, len8, 8, 0) == 8) n = (int64_t)CT_MIN(ct_get_le64(len8), 1ull << 62);
    if (n < 2 || n > HEADER_MAX || n > size - 8) {
        close(fd);
        return bad(path, "the header length is outside [2, min(100 MiB, file size - 8)]", NULL);
    }
    char *json = ct_xmalloc((size_t)n);
    ssize_t got = pread(fd, json, (size_t)n, 8);
    ct_status status = got == n ? ct_safetensors_parse(path, json, (size_t)n, size - 8 - n, st)
                                : bad(path, "short read of the header", NULL);
    free(json);
    if (status != CT_OK) {
        close(fd);
        return status;
    }
    st->fd = fd;
    st->data_start = 8 + n;
    return CT_OK;
}

const ct_st_tensor *ct_safetensors_find(const ct_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

float ct_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) { /* inf, NaN */
        bits = sign | 0x7f800000u | mant << 13;
    } else if (exp) { /* normal */
        bits = sign | (exp + 112) << 23 | mant << 13;
    } else if (mant) { /* subnormal: mant · 2^-24, normalised */
        int e = -1;
        do {
            mant <<= 1;
            e++;
        } while (!(mant & 0x400));
        bits = sign | (uint32_t)(112 - e) << 23 | (mant & 0x3ff) << 13;
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

ct_status ct_safetensors_read(const ct_safetensors *st, const ct_st_tensor *t, float *out) {
    if (t->dtype == CT_ST_OTHER || t->ndim > 2) {
        ct_error(CT_ERR_INPUT,
                 "safetensors '%s': tensor %s is %s of %d dimensions; cooktrain reads "
                 "F32, BF16 and F16 tensors of at most two",
                 st->path, t->name, t->dtype_name, t->ndim);
        ct_hint("the model's weights must be floating point (convert the file, e.g. with "
                "transformers' save_pretrained)");
        return CT_ERR_INPUT;
    }
    const int64_t bytes = t->end - t->begin;
    uint8_t *buf = t->dtype == CT_ST_F32 ? (uint8_t *)out : ct_xmalloc((size_t)bytes + 1);
    int64_t done = 0;
    while (done < bytes) {
        ssize_t got = pread(st->fd, buf + done, (size_t)(bytes - done),
                            (off_t)(st->data_start + t->begin + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        done += got;
    }
    if (done != bytes) {
        if (buf != (uint8_t *)out) free(buf);
        ct_error(CT_ERR_RUNTIME, "safetensors '%s': short read of tensor %s (%lld of %lld bytes)",
                 st->path, t->name, (long long)done, (long long)bytes);
        ct_hint("check the file system, and that nothing writes the file while it is read");
        return CT_ERR_RUNTIME;
    }
    if (t->dtype == CT_ST_F32) {
        ct_get_le_floats(out, buf, t->numel); /* in place: the same bytes, host order */
        return CT_OK;
    }
    for (int64_t i = 0; i < t->numel; i++) {
        uint16_t h = (uint16_t)(buf[2 * i] | buf[2 * i + 1] << 8);
        out[i] = t->dtype == CT_ST_BF16 ? ct_bf16_to_f32(h) : ct_f16_to_f32(h);
    }
    free(buf);
    return CT_OK;
}

void ct_safetensors_close(ct_safetensors *st) {
    if (st->fd >= 0) close(st->fd);
    free(st->tensors);
    st->tensors = NULL;
    st->n = 0;
    st->fd = -1;
}
