/*
 * test_util.h — small helpers shared by the test binaries (header-only so each test stays one
 * file): temporary directories, a byte-level token shard of tinyshakespeare, tiny configs.
 */
#ifndef CT_TEST_UTIL_H
#define CT_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/config.h"
#include "core/data.h"

/* Where ../shared lives (CI clones the repo with shared/ beside it). */
static inline const char *test_shared_dir(void) {
    const char *env = getenv("CT_SHARED");
    return env ? env : "../shared";
}

static inline char *test_make_tmpdir(void) {
    char *dir = ct_xstrdup("/tmp/cooktrain-test-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        abort();
    }
    return dir;
}

static inline void test_remove_tree(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Reads up to max_bytes of tinyshakespeare; every byte is a token (ASCII, all < 123). */
static inline int32_t *test_shakespeare_tokens(size_t max_bytes, size_t *n_out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/data/tinyshakespeare.txt", test_shared_dir());
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s (set CT_SHARED to the shared/ folder)\n", path);
        abort();
    }
    unsigned char *buf = ct_xmalloc(max_bytes);
    size_t n = fread(buf, 1, max_bytes, f);
    fclose(f);
    int32_t *tokens = ct_xmalloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) tokens[i] = buf[i] < 123 ? buf[i] : ' ';
    free(buf);
    *n_out = n;
    return tokens;
}

/* Writes a byte-level shard of the first max_bytes of tinyshakespeare to dir/name. */
static inline void test_write_shakespeare_shard(const char *dir, const char *name, size_t max_bytes,
                                                char *path_out, size_t cap) {
    size_t n;
    int32_t *tokens = test_shakespeare_tokens(max_bytes, &n);
    snprintf(path_out, cap, "%s/%s", dir, name);
    if (ct_shard_write(path_out, tokens, n, 123) != CT_OK) {
        ct_error_print();
        abort();
    }
    free(tokens);
}

/* A small GPT-2 on byte tokens: vocab 123 padded to 128. */
static inline void test_tiny_config(ct_config *cfg, const char *train_path) {
    ct_config_defaults(cfg);
    cfg->model.vocab_size = 123;
    cfg->model.vocab_pad = 128;
    cfg->model.seq_len = 16;
    cfg->model.n_layer = 2;
    cfg->model.d_model = 32;
    cfg->model.n_head = 4;
    cfg->train.steps = 4;
    cfg->train.global_batch = 4;
    cfg->train.micro_batch = 4;
    cfg->train.lr = 3e-3;
    cfg->train.min_lr = 3e-4;
    cfg->train.warmup_steps = 2;
    cfg->train.eval_interval = 0;
    cfg->log.interval = 1000;
    if (train_path) {
        if (strlen(train_path) >= sizeof cfg->data.train) abort();
        memcpy(cfg->data.train, train_path, strlen(train_path) + 1);
    }
}

#endif /* CT_TEST_UTIL_H */
