/*
 * safetensors.h — reading a safetensors file, which may come from anywhere (a model hub, a
 * colleague): every field is checked before it is used.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON (an object mapping each
 * tensor's name to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
 * "__metadata__" object of strings), then the data; a tensor's bytes are [begin, end) of the
 * data, row-major, little-endian.
 *
 * Checked at open, each a CT_ERR_INPUT naming the file and the tensor or field: the file is
 * regular; 2 <= N <= 100 MiB and 8 + N <= its size; the header is one JSON object (no duplicate
 * keys); each tensor has a dtype of the format, at most eight dimensions (every one in
 * [0, 2^31)), end - begin = elements x element size (overflow-checked), end inside the data; no
 * two tensors share a byte; names are shorter than CT_ST_NAME. Reading converts F32, BF16 and F16
 * tensors of at most two dimensions (others, such as a stored causal mask, may be present and
 * are left alone). Nothing is
 * allocated beyond what the file holds.
 */
#ifndef CT_CORE_SAFETENSORS_H
#define CT_CORE_SAFETENSORS_H

#include <stdint.h>

#include "core/common.h"

enum { CT_ST_NAME = 128 };

/* The dtypes this reader converts; CT_ST_OTHER: one of the format's others (element size known,
 * so its bytes are checked, but ct_safetensors_read refuses it). */
typedef enum ct_st_dtype { CT_ST_F32 = 0, CT_ST_BF16, CT_ST_F16, CT_ST_OTHER } ct_st_dtype;

typedef struct ct_st_tensor {
    char name[CT_ST_NAME];
    ct_st_dtype dtype;
    char dtype_name[12];
    int ndim;           /* 0 (a scalar) to 8; read only when at most 2 */
    int64_t shape[2];   /* the first two dimensions; unused ones 1 */
    int64_t numel;      /* the product of every dimension */
    int64_t begin, end; /* bytes of the data section */
} ct_st_tensor;

typedef struct ct_safetensors {
    char path[CT_PATH_MAX];
    int fd; /* -1: parsed from memory only */
    int64_t data_start, data_size;
    int n;
    ct_st_tensor *tensors; /* sorted by begin */
} ct_safetensors;

/* Opens and checks `path` (see above). */
ct_status ct_safetensors_open(const char *path, ct_safetensors *st);
/* The header check alone, on `len` bytes of JSON, for a file of `data_size` data bytes (what the
 * open does after reading them; the fuzz target calls it directly). st->fd is -1. */
ct_status ct_safetensors_parse(const char *path, const char *json, size_t len, int64_t data_size,
                               ct_safetensors *st);
const ct_st_tensor *ct_safetensors_find(const ct_safetensors *st, const char *name);
/* A tensor's values as fp32 (exact for every dtype read), numel floats into out. */
ct_status ct_safetensors_read(const ct_safetensors *st, const ct_st_tensor *t, float *out);
void ct_safetensors_close(ct_safetensors *st);

/* IEEE half to float, exact. */
float ct_f16_to_f32(uint16_t h);

#endif /* CT_CORE_SAFETENSORS_H */
