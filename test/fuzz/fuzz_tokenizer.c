/*
 * fuzz_tokenizer.c — a tokenizer file (core/data/tokenizer.c): ct_tokenizer_load, then every
 * token's bytes and every merge read, and a short text encoded and decoded (also ids outside the
 * vocabulary), as prepare, generate and export do. Input: the file. Seeds: tokenizers that
 * ct_tokenizer_train + ct_tokenizer_save make from a few sentences at vocabularies 256 to 400.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/data/tokenizer.h"
#include "test/fuzz/fuzz.h"

static const char text[] =
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs on and on, "
    "and the quick fox jumps again over the lazy, lazy dog. 12345 67890 --- \xc3\xa9t\xc3\xa9";

void fuzz_setup(void) {}

void fuzz_seeds(const char *dir) {
    static const int vocab[] = {256, 270, 400};
    for (size_t i = 0; i < sizeof vocab / sizeof vocab[0]; i++) {
        ct_tokenizer *tok;
        char path[512];
        snprintf(path, sizeof path, "%s/tok-%d.bin", dir, vocab[i]);
        if (ct_tokenizer_train(&tok, (const uint8_t *)text, sizeof text - 1, vocab[i]) != CT_OK ||
            ct_tokenizer_save(tok, path) != CT_OK) {
            ct_error_print();
            exit(1);
        }
        ct_tokenizer_free(tok);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *path = fuzz_path("tokenizer.bin");
    fuzz_write(path, data, n);
    ct_tokenizer *tok;
    if (ct_tokenizer_load(&tok, path) != CT_OK) {
        ct_error_clear();
        return 0;
    }
    int v = ct_tokenizer_vocab_size(tok);
    size_t total = 0;
    for (int32_t t = 0; t < v; t++) {
        size_t len;
        const uint8_t *b = ct_tokenizer_token_bytes(tok, t, &len);
        if (len) total += b[0] + b[len - 1]; /* touch both ends */
    }
    for (int i = 0; i + 256 < v; i++) {
        int32_t l, r;
        ct_tokenizer_merge(tok, i, &l, &r);
    }
    int32_t *ids;
    size_t n_ids = ct_tokenizer_encode(tok, (const uint8_t *)text, sizeof text - 1, &ids);
    size_t n_out;
    uint8_t *back = ct_tokenizer_decode(tok, ids, n_ids, &n_out);
    if (n_out != sizeof text - 1 || memcmp(back, text, n_out) != 0) {
        fprintf(stderr, "fuzz_tokenizer: a loaded tokenizer does not round-trip its text\n");
        abort();
    }
    free(back);
    int32_t odd[3] = {-1, v, INT32_MAX};
    back = ct_tokenizer_decode(tok, odd, 3, &n_out);
    free(back);
    free(ids);
    ct_tokenizer_free(tok);
    return total == (size_t)-1;
}
