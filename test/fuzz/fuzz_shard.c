/*
 * fuzz_shard.c — a token shard (core/data/data.c): the header checks of ct_dataset_open, then every
 * token checked and a few samples read, shuffled and in file order, as training and eval do.
 * The input is the shard file, written as it is; its bytes 8 and 9 (inside the header: read
 * here, not changed) also pick the model's sequence length (1 to 16) and vocabulary (100, below
 * most shards' own, or 70000).
 * An opened shard must account for every byte of the file: header plus tokens x width. The
 * shard is mapped, and ASan does not watch mapped pages, so a read past a short file's end but
 * inside its last page goes unseen; this oracle catches the missing size check on any length.
 * Seeds: shards that ct_shard_write makes at widths 2 and 4, empty and with a few samples.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/data/data.h"
#include "test/fuzz/fuzz.h"

void fuzz_setup(void) {}

void fuzz_seeds(const char *dir) {
    static const struct {
        const char *name;
        int vocab;
        size_t n;
    } seeds[] = {
        {"w2-small", 123, 40},
        {"w2-one", 50257, 17},
        {"w4", 70000, 33},
        {"empty", 300, 0},
    };
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        int32_t tok[64];
        for (size_t i = 0; i < seeds[s].n; i++)
            tok[i] = (int32_t)((i * 7919u + 3) % (unsigned)seeds[s].vocab);
        char path[512];
        snprintf(path, sizeof path, "%s/%s.bin", dir, seeds[s].name);
        if (ct_shard_write(path, tok, seeds[s].n, seeds[s].vocab) != CT_OK) {
            ct_error_print();
            exit(1);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *path = fuzz_path("shard.bin");
    fuzz_write(path, data, n);
    int64_t seq_len = n > 8 ? 1 + data[8] % 16 : 4;
    int64_t vocab = n > 9 && (data[9] & 1) ? 100 : 70000;
    ct_dataset *ds;
    if (ct_dataset_open(&ds, path, seq_len, vocab, 1234) != CT_OK) {
        ct_error_clear();
        return 0;
    }
    uint32_t width = (uint32_t)data[16] | (uint32_t)data[17] << 8;
    if ((size_t)ct_dataset_n_tokens(ds) * width + CT_SHARD_HEADER_BYTES != n) {
        fprintf(stderr, "fuzz_shard: opened a %zu-byte shard that holds %lld tokens of %u bytes\n",
                n, (long long)ct_dataset_n_tokens(ds), width);
        abort();
    }
    int64_t samples = ct_dataset_n_samples(ds);
    if (ct_dataset_check_tokens(ds) != CT_OK) ct_error_clear();
    int32_t *in = malloc(sizeof(int32_t) * (size_t)(2 * seq_len));
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)(2 * seq_len));
    for (int64_t g = 0; g < 2 * samples + 1 && g < 8; g++) {
        if (ct_dataset_fill(ds, g, 1, in, tg) != CT_OK) ct_error_clear();
        (void)ct_dataset_sample_at(ds, g);
    }
    if (samples >= 2 && ct_dataset_fill_in_order(ds, samples - 2, 2, in, tg) != CT_OK)
        ct_error_clear();
    free(in);
    free(tg);
    ct_dataset_free(ds);
    return 0;
}
