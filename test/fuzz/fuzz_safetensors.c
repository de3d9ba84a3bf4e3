/*
 * fuzz_safetensors.c — a safetensors file (core/io/safetensors.c): ct_safetensors_open (the
 * header length, the JSON header and every tensor's dtype, shape and offsets checked), then every
 * tensor read as fp32, as import does. Oracle: an opened file's tensors lie inside its data, in
 * order, without overlap. Seeds: small files of F32, BF16 and F16 tensors of 0, 1 and 2
 * dimensions, as cooktrain export and the safetensors library write them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/safetensors.h"
#include "test/fuzz/fuzz.h"

void fuzz_setup(void) {}

static void seed(const char *dir, const char *name, const char *header, size_t data_bytes) {
    size_t h = strlen(header), n = 8 + h + data_bytes;
    uint8_t *buf = calloc(1, n);
    ct_put_le64(buf, h);
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data_bytes; i++) buf[8 + h + i] = (uint8_t)(i * 37 + 11);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fuzz_write(path, buf, n);
    free(buf);
}

void fuzz_seeds(const char *dir) {
    seed(dir, "f32.safetensors",
         "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
         "\"data_offsets\":[0,24]},\"b\":{\"dtype\":\"F32\",\"shape\":[4],"
         "\"data_offsets\":[24,40]}}   ",
         40);
    seed(dir, "bf16-f16.safetensors",
         "{\"x\":{\"dtype\":\"BF16\",\"shape\":[3,2],\"data_offsets\":[0,12]},"
         "\"y\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[12,14]},"
         "\"z\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[14,14]}}",
         14);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *path = fuzz_path("model.safetensors");
    fuzz_write(path, data, n);
    ct_safetensors st;
    if (ct_safetensors_open(path, &st) != CT_OK) {
        ct_error_clear();
        return 0;
    }
    int64_t prev_end = 0;
    for (int i = 0; i < st.n; i++) {
        const ct_st_tensor *t = &st.tensors[i];
        if (t->begin < 0 || t->end > st.data_size || st.data_start + st.data_size != (int64_t)n ||
            (t->begin < prev_end && t->end > t->begin)) {
            fprintf(stderr, "fuzz_safetensors: tensor %s [%lld, %lld) outside or overlapping\n",
                    t->name, (long long)t->begin, (long long)t->end);
            abort();
        }
        if (t->end > t->begin && t->end > prev_end) prev_end = t->end; /* the furthest end */
        if (ct_safetensors_find(&st, t->name) == NULL) abort();
        float *v = malloc((size_t)t->numel * sizeof(float) + 1);
        if (ct_safetensors_read(&st, t, v) != CT_OK) ct_error_clear();
        free(v);
    }
    ct_safetensors_close(&st);
    return 0;
}
