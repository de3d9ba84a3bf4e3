/*
 * test_data.c — token shards, the dataset and its sample order, and `cooktrain prepare`.
 *
 *   test_data [FILTER]     FILTER is a cmocka test-name pattern (wildcards allowed)
 *
 * Shards hold tokens that encode their own position (token = base + index), so every sample
 * read back says where it came from: that is how the tests check alignment, the target shift
 * and that no sample crosses a shard boundary.
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/data/data.h"
#include "core/data/prepare.h"
#include "core/data/tokenizer.h"

/* ---- fixtures ------------------------------------------------------------------------------- */

typedef struct fixture {
    char dir[64];
} fixture;

static int setup(void **state) {
    fixture *fx = calloc(1, sizeof *fx);
    strcpy(fx->dir, "/tmp/ct_test_data_XXXXXX");
    if (!mkdtemp(fx->dir)) return -1;
    *state = fx;
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int teardown(void **state) {
    fixture *fx = *state;
    nftw(fx->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(fx);
    return 0;
}

static char *path_in(const fixture *fx, const char *name) {
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", fx->dir, name);
    return p;
}

/* Writes tokens base, base + step, ... (n of them) as a shard. */
static void write_ramp(const char *path, size_t n, int32_t base, int32_t step, int vocab) {
    int32_t *t = malloc((n + 1) * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = base + (int32_t)i * step;
    assert_int_equal(ct_shard_write(path, t, n, vocab), CT_OK);
    free(t);
}

static void patch32(const char *path, long offset, uint32_t v) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    fseek(f, offset, SEEK_SET);
    assert_int_equal(fwrite(b, 1, 4, f), 4);
    fclose(f);
}

static void assert_open_rejected(const char *pattern, int64_t seq_len, int64_t vocab,
                                 const char *must_contain, const char *phrase) {
    ct_error_clear();
    ct_dataset *ds = (ct_dataset *)1;
    assert_int_equal(ct_dataset_open(&ds, pattern, seq_len, vocab, 1), CT_ERR_INPUT);
    assert_null(ds);
    if (!strstr(ct_error_message(), must_contain) || !strstr(ct_error_message(), phrase))
        fail_msg("message lacks '%s' or '%s': %s", must_contain, phrase, ct_error_message());
    assert_true(ct_error_hint()[0] != '\0');
}

static int64_t file_size(const char *path) {
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return (int64_t)sb.st_size;
}

/* ---- shards --------------------------------------------------------------------------------- */

/* Reads every sample of epoch 0 and checks it is seq_len + 1 consecutive ramp tokens starting
 * at a multiple of seq_len: inputs are the first seq_len, targets the same shifted by one. */
static void check_ramp_samples(ct_dataset *ds, int64_t L, int32_t base, int32_t step) {
    int64_t n = ct_dataset_n_samples(ds);
    int32_t *in = malloc((size_t)(n * L) * sizeof *in), *tg = malloc((size_t)(n * L) * sizeof *tg);
    ct_dataset_fill(ds, 0, n, in, tg);
    char *seen = calloc((size_t)n, 1);
    for (int64_t r = 0; r < n; r++) {
        int64_t start = (in[r * L] - base) / step;
        assert_int_equal(start % L, 0);
        assert_true(start / L < n);
        seen[start / L]++;
        for (int64_t k = 0; k < L; k++) {
            assert_int_equal(in[r * L + k], base + (int32_t)(start + k) * step);
            assert_int_equal(tg[r * L + k], base + (int32_t)(start + k + 1) * step);
        }
    }
    for (int64_t s = 0; s < n; s++) assert_int_equal(seen[s], 1);
    free(seen);
    free(in);
    free(tg);
}

static void test_shard_roundtrip_width2(void **state) {
    fixture *fx = *state;
    char *path = path_in(fx, "w2.bin");
    size_t n = 65536; /* tokens up to 65535 exercise the high byte */
    write_ramp(path, n, 0, 1, 65536);
    assert_int_equal(file_size(path), CT_SHARD_HEADER_BYTES + 2 * (int64_t)n);
    ct_dataset *ds;
    assert_int_equal(ct_dataset_open(&ds, path, 16, 65536, 7), CT_OK);
    assert_int_equal(ct_dataset_n_tokens(ds), n);
    assert_int_equal(ct_dataset_n_samples(ds), (n - 1) / 16);
    assert_int_equal(ct_dataset_check_tokens(ds), CT_OK);
    check_ramp_samples(ds, 16, 0, 1);
    ct_dataset_free(ds);
}

static void test_shard_roundtrip_width4(void **state) {
    fixture *fx = *state;
    char *path = path_in(fx, "w4.bin");
    size_t n = 30001;
    write_ramp(path, n, 999999, -7, 1000000); /* descending, well above 65535 */
    assert_int_equal(file_size(path), CT_SHARD_HEADER_BYTES + 4 * (int64_t)n);
    ct_dataset *ds;
    assert_int_equal(ct_dataset_open(&ds, path, 100, 1000000, 3), CT_OK);
    assert_int_equal(ct_dataset_n_samples(ds), 300);
    assert_int_equal(ct_dataset_check_tokens(ds), CT_OK);
    check_ramp_samples(ds, 100, 999999, -7);
    ct_dataset_free(ds);
}

static void test_shard_write_rejects_bad_tokens(void **state) {
    fixture *fx = *state;
    char *path = path_in(fx, "bad_tokens.bin");
    int32_t t[3] = {1, 50, 2};
    ct_error_clear();
    assert_int_equal(ct_shard_write(path, t, 3, 50), CT_ERR_INPUT);
    assert_non_null(strstr(ct_error_message(), path));
    assert_non_null(strstr(ct_error_message(), "position 1"));
    t[1] = -1;
    assert_int_equal(ct_shard_write(path, t, 3, 50), CT_ERR_INPUT);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(ct_shard_write(path_in(fx, "no/dir/x.bin"), t, 0, 50), CT_ERR_INPUT);
    assert_non_null(strstr(ct_error_message(), "no/dir/x.bin"));
}

static void test_corrupt_shards_rejected(void **state) {
    fixture *fx = *state;
    const int V = 1000;
    char *p;

    p = path_in(fx, "magic.bin");
    write_ramp(p, 100, 0, 1, V);
    patch32(p, 0, 0x58585858u);
    assert_open_rejected(p, 8, V, p, "magic");

    p = path_in(fx, "version.bin");
    write_ramp(p, 100, 0, 1, V);
    patch32(p, 8, 7);
    assert_open_rejected(p, 8, V, p, "version 7");

    p = path_in(fx, "bom.bin");
    write_ramp(p, 100, 0, 1, V);
    patch32(p, 12, 0x04030201u);
    assert_open_rejected(p, 8, V, p, "byte order");

    p = path_in(fx, "width.bin");
    write_ramp(p, 100, 0, 1, V);
    patch32(p, 16, 3);
    assert_open_rejected(p, 8, V, p, "width 3");

    p = path_in(fx, "truncated.bin");
    write_ramp(p, 100, 0, 1, V);
    assert_int_equal(truncate(p, CT_SHARD_HEADER_BYTES + 2 * 100 - 1), 0);
    /* names what the header promises and what is there */
    assert_open_rejected(p, 8, V, p, "truncated");
    assert_non_null(strstr(ct_error_message(), "264"));
    assert_non_null(strstr(ct_error_message(), "263"));

    p = path_in(fx, "short_header.bin");
    write_ramp(p, 100, 0, 1, V);
    assert_int_equal(truncate(p, 20), 0);
    assert_open_rejected(p, 8, V, p, "header");

    p = path_in(fx, "trailing.bin");
    write_ramp(p, 100, 0, 1, V);
    assert_int_equal(truncate(p, CT_SHARD_HEADER_BYTES + 2 * 100 + 2), 0);
    assert_open_rejected(p, 8, V, p, "trailing");

    /* a shard from a bigger tokenizer than the model: both numbers and the fix */
    p = path_in(fx, "big_vocab.bin");
    write_ramp(p, 100, 0, 1, 5000);
    assert_open_rejected(p, 8, 4096, p, "5000");
    assert_non_null(strstr(ct_error_message(), "4096"));
    assert_non_null(strstr(ct_error_hint(), "model.vocab_size"));

    /* a bad shard among good ones is still found, and named */
    write_ramp(path_in(fx, "multi_0.bin"), 100, 0, 1, V);
    p = path_in(fx, "multi_1.bin");
    write_ramp(p, 100, 0, 1, V);
    patch32(p, 8, 2);
    assert_open_rejected(path_in(fx, "multi_*.bin"), 8, V, p, "version 2");

    /* the model's own vocabulary may be larger than the shard's */
    ct_dataset *ds;
    assert_int_equal(ct_dataset_open(&ds, path_in(fx, "multi_0.bin"), 8, 50257, 1), CT_OK);
    ct_dataset_free(ds);
}

static void test_missing_and_empty(void **state) {
    fixture *fx = *state;
    char *pattern = path_in(fx, "nothing_*.bin");
    assert_open_rejected(pattern, 8, 100, pattern, "no data shard");
    assert_non_null(strstr(ct_error_hint(), "cooktrain prepare"));
    char *plain = path_in(fx, "absent.bin");
    assert_open_rejected(plain, 8, 100, plain, "no data shard");

    /* seq_len tokens make no sample: one more is needed for the last target */
    char *p = path_in(fx, "short.bin");
    write_ramp(p, 8, 0, 1, 100);
    assert_open_rejected(p, 8, 100, p, "no complete sample");
    write_ramp(p, 9, 0, 1, 100);
    ct_dataset *ds;
    assert_int_equal(ct_dataset_open(&ds, p, 8, 100, 1), CT_OK);
    assert_int_equal(ct_dataset_n_samples(ds), 1);
    ct_dataset_free(ds);

    assert_open_rejected(p, 0, 100, p, "seq_len=0");
}

/* A ramp shard (token i at position i, vocab 100) whose token 40 is 150, opened with seq_len 8:
 * the header is sound, so it opens; the token is out of range. */
static ct_dataset *open_bad_token_shard(fixture *fx, const char *name, char **path) {
    *path = path_in(fx, name);
    write_ramp(*path, 100, 0, 1, 100);
    patch32(*path, CT_SHARD_HEADER_BYTES + 2 * 40, 150 | (41u << 16)); /* token 40 → 150 */
    ct_dataset *ds;
    assert_int_equal(ct_dataset_open(&ds, *path, 8, 100, 1), CT_OK);
    return ds;
}

static void test_check_tokens_finds_bad_token(void **state) {
    char *p;
    ct_dataset *ds = open_bad_token_shard(*state, "badtok.bin", &p);
    ct_error_clear();
    assert_int_equal(ct_dataset_check_tokens(ds), CT_ERR_INPUT);
    assert_non_null(strstr(ct_error_message(), p));
    assert_non_null(strstr(ct_error_message(), "position 40"));
    ct_dataset_free(ds);
}

/* Training reads samples with ct_dataset_fill, which checks each token it copies: exactly the two
 * samples that hold the bad token (position 40 ends sample 4 and starts sample 5) are refused,
 * with the file and position named; the others read as before. */
static void test_fill_rejects_bad_token(void **state) {
    char *p;
    ct_dataset *ds = open_bad_token_shard(*state, "badfill.bin", &p);
    int32_t in[8], tg[8];
    int refused = 0;
    for (int64_t g = 0; g < ct_dataset_n_samples(ds); g++) {
        int64_t sample = ct_dataset_sample_at(ds, g);
        ct_error_clear();
        ct_status st = ct_dataset_fill(ds, g, 1, in, tg);
        if (sample == 4 || sample == 5) {
            assert_int_equal(st, CT_ERR_INPUT);
            assert_non_null(strstr(ct_error_message(), p));
            assert_non_null(strstr(ct_error_message(), "token 150 at position 40"));
            refused++;
        } else {
            assert_int_equal(st, CT_OK);
            assert_int_equal(in[0], (int32_t)(sample * 8)); /* the ramp: token i at position i */
        }
    }
    assert_int_equal(refused, 2);
    ct_dataset_free(ds);
}

/* ---- sample order --------------------------------------------------------------------------- */

static ct_dataset *open_ramp(fixture *fx, const char *name, size_t n_tokens, int64_t L,
                             uint64_t seed) {
    char *p = path_in(fx, name);
    if (access(p, F_OK) != 0) write_ramp(p, n_tokens, 0, 1, (int)n_tokens);
    ct_dataset *ds;
    assert_int_equal(ct_dataset_open(&ds, p, L, (int64_t)n_tokens, seed), CT_OK);
    return ds;
}

static void test_order_depends_on_seed_only(void **state) {
    fixture *fx = *state;
    ct_dataset *a = open_ramp(fx, "order.bin", 4001, 4, 42);
    ct_dataset *b = open_ramp(fx, "order.bin", 4001, 4, 42);
    ct_dataset *c = open_ramp(fx, "order.bin", 4001, 4, 43);
    int64_t n = ct_dataset_n_samples(a);
    assert_int_equal(n, 1000);
    int64_t differ = 0, moved = 0;
    for (int64_t g = 0; g < 3 * n; g++) {
        int64_t sa = ct_dataset_sample_at(a, g);
        assert_int_equal(sa, ct_dataset_sample_at(b, g));
        differ += sa != ct_dataset_sample_at(c, g);
        moved += sa != g % n;
    }
    /* two independent permutations of 1000 agree in about 1 place per epoch */
    assert_true(differ > 3 * n - 30);
    assert_true(moved > 3 * n - 30); /* and the order is not the identity */
    ct_dataset_free(a);
    ct_dataset_free(b);
    ct_dataset_free(c);
}

static void test_each_epoch_is_a_permutation(void **state) {
    fixture *fx = *state;
    ct_dataset *ds = open_ramp(fx, "perm.bin", 2 * 1237 + 1, 2, 5);
    int64_t n = ct_dataset_n_samples(ds);
    assert_int_equal(n, 1237);
    int64_t *prev = malloc((size_t)n * sizeof *prev);
    int *seen = malloc((size_t)n * sizeof *seen);
    for (int64_t e = 0; e < 4; e++) {
        memset(seen, 0, (size_t)n * sizeof *seen);
        int64_t same_as_prev = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t s = ct_dataset_sample_at(ds, e * n + i);
            assert_true(s >= 0 && s < n);
            seen[s]++;
            if (e > 0) same_as_prev += s == prev[i];
            prev[i] = s;
        }
        for (int64_t s = 0; s < n; s++) assert_int_equal(seen[s], 1);
        if (e > 0) assert_true(same_as_prev < 20); /* a fresh permutation each epoch */
    }
    /* a one-sample dataset is visited once per epoch */
    ct_dataset *one = open_ramp(fx, "one.bin", 5, 4, 5);
    assert_int_equal(ct_dataset_n_samples(one), 1);
    for (int64_t g = 0; g < 5; g++) assert_int_equal(ct_dataset_sample_at(one, g), 0);
    ct_dataset_free(one);
    free(prev);
    free(seen);
    ct_dataset_free(ds);
}

static void test_random_access_matches_sequential(void **state) {
    fixture *fx = *state;
    const int64_t L = 8;
    ct_dataset *seq = open_ramp(fx, "ra.bin", 8 * 301 + 1, L, 11);
    int64_t n = ct_dataset_n_samples(seq), total = 3 * n + 17;
    int32_t *in = malloc((size_t)(total * L) * sizeof *in);
    int32_t *tg = malloc((size_t)(total * L) * sizeof *tg);
    /* sequential: the way training walks, in batches that straddle epoch boundaries */
    for (int64_t g = 0; g < total; g += 64) {
        int64_t m = CT_MIN(64, total - g);
        ct_dataset_fill(seq, g, m, in + g * L, tg + g * L);
    }
    /* random access from a fresh dataset (as after a resume), jumping across epochs */
    ct_dataset *ra = open_ramp(fx, "ra.bin", 8 * 301 + 1, L, 11);
    int32_t row_in[8], row_tg[8];
    uint64_t x = 12345;
    for (int i = 0; i < 2000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int64_t g = (int64_t)((x >> 33) % (uint64_t)total);
        ct_dataset_fill(ra, g, 1, row_in, row_tg);
        assert_memory_equal(row_in, in + g * L, sizeof row_in);
        assert_memory_equal(row_tg, tg + g * L, sizeof row_tg);
        /* inputs and targets: the same window shifted by one token */
        for (int64_t k = 0; k + 1 < L; k++) assert_int_equal(row_tg[k], row_in[k + 1]);
        assert_int_equal(row_tg[L - 1], row_in[L - 1] + 1);
    }
    /* a dataset filled from a later g first, then an earlier one, gives the same rows */
    ct_dataset_fill(ra, 2 * n + 5, 1, row_in, row_tg);
    assert_memory_equal(row_in, in + (2 * n + 5) * L, sizeof row_in);
    ct_dataset_fill(ra, 3, 1, row_in, row_tg);
    assert_memory_equal(row_in, in + 3 * L, sizeof row_in);
    free(in);
    free(tg);
    ct_dataset_free(seq);
    ct_dataset_free(ra);
}

static void test_glob_multiple_shards(void **state) {
    fixture *fx = *state;
    const int64_t L = 8;
    /* shard s holds tokens s·1000 + i; the middle one is too short for any sample */
    write_ramp(path_in(fx, "part_002.bin"), 57, 2000, 1, 4000);
    write_ramp(path_in(fx, "part_000.bin"), 100, 0, 1, 4000);
    write_ramp(path_in(fx, "part_001.bin"), 5, 1000, 1, 4000);
    write_ramp(path_in(fx, "other.bin"), 1000, 3000, 1, 4000); /* not matched */
    ct_dataset *ds;
    assert_int_equal(ct_dataset_open(&ds, path_in(fx, "part_*.bin"), L, 4000, 9), CT_OK);
    assert_int_equal(ct_dataset_n_tokens(ds), 162);
    int64_t n = ct_dataset_n_samples(ds);
    assert_int_equal(n, 99 / 8 + 0 + 56 / 8);
    int32_t in[19 * 8], tg[19 * 8];
    ct_dataset_fill(ds, n, n, in, tg); /* epoch 1 */
    int per_shard[3] = {0};
    char seen[3][16] = {{0}};
    for (int64_t r = 0; r < n; r++) {
        int shard = in[r * L] / 1000;
        int64_t start = in[r * L] % 1000;
        assert_true(shard == 0 || shard == 2);
        assert_int_equal(start % L, 0);
        per_shard[shard]++;
        seen[shard][start / L]++;
        for (int64_t k = 0; k < L; k++) {
            /* every token of the window, targets included, comes from the same shard */
            assert_int_equal(in[r * L + k], shard * 1000 + start + k);
            assert_int_equal(tg[r * L + k], shard * 1000 + start + k + 1);
        }
    }
    assert_int_equal(per_shard[0], 12);
    assert_int_equal(per_shard[1], 0);
    assert_int_equal(per_shard[2], 7);
    for (int s = 0; s < 12; s++) assert_int_equal(seen[0][s], 1);
    for (int s = 0; s < 7; s++) assert_int_equal(seen[2][s], 1);
    /* shards are taken in name order: sample index 12 is the first window of part_002 */
    int64_t g12 = -1;
    for (int64_t g = 0; g < n; g++)
        if (ct_dataset_sample_at(ds, g) == 12) g12 = g;
    ct_dataset_fill(ds, g12, 1, in, tg);
    assert_int_equal(in[0], 2000);
    ct_dataset_free(ds);
}

/* ---- prepare -------------------------------------------------------------------------------- */

/* The tokens of a shard file, read directly (independent of ct_dataset). */
static int32_t *read_shard(const char *path, size_t *n, uint32_t *vocab) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t h[CT_SHARD_HEADER_BYTES];
    assert_int_equal(fread(h, 1, sizeof h, f), sizeof h);
    assert_memory_equal(h, "CTSHARD1", 8);
    uint32_t width = h[16] | (uint32_t)h[17] << 8;
    *vocab = h[20] | (uint32_t)h[21] << 8 | (uint32_t)h[22] << 16;
    uint64_t count = 0;
    for (int i = 7; i >= 0; i--) count = count << 8 | h[24 + i];
    int32_t *t = malloc((count + 1) * sizeof *t);
    for (uint64_t i = 0; i < count; i++) {
        uint8_t b[4] = {0};
        assert_int_equal(fread(b, 1, width, f), width);
        t[i] = (int32_t)(b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16);
    }
    fclose(f);
    *n = count;
    return t;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_prepare_end_to_end(void **state) {
    fixture *fx = *state;
    char *in_dir = path_in(fx, "corpus");
    assert_int_equal(mkdir(in_dir, 0777), 0);
    /* the directory input takes "alpha" and "beta" (name order) and skips names with a '.' */
    char buf[512];
    char *alpha = malloc(20000), *beta = malloc(20000);
    alpha[0] = beta[0] = '\0';
    for (int i = 0; i < 300; i++) {
        snprintf(buf, sizeof buf, "line %d: the quick brown fox jumps over the lazy dog.\n", i);
        strcat(i < 150 ? alpha : beta, buf);
    }
    snprintf(buf, sizeof buf, "%s/beta", in_dir);
    write_text(buf, beta);
    snprintf(buf, sizeof buf, "%s/alpha", in_dir);
    write_text(buf, alpha);
    snprintf(buf, sizeof buf, "%s/alpha.dat", in_dir);
    write_text(buf, "IGNORED BINARY INDEX");
    snprintf(buf, sizeof buf, "%s/.hidden", in_dir);
    write_text(buf, "IGNORED HIDDEN");
    char *extra = path_in(fx, "extra.txt"); /* a file named directly is always read */
    write_text(extra, "tail file\n");

    char out_dir[256];
    snprintf(out_dir, sizeof out_dir, "%s/out/nested", fx->dir);
    const char *inputs[] = {in_dir, extra};
    ct_prepare_options o = {.inputs = inputs,
                            .n_inputs = 2,
                            .out_dir = out_dir,
                            .vocab_size = 300,
                            .val_fraction = 0.25};
    assert_int_equal(ct_prepare_run(&o), CT_OK);

    snprintf(buf, sizeof buf, "%s/tokenizer.bin", out_dir);
    ct_tokenizer *tok;
    assert_int_equal(ct_tokenizer_load(&tok, buf), CT_OK);
    assert_int_equal(ct_tokenizer_vocab_size(tok), 300);
    uint32_t vt, vv;
    size_t nt, nv;
    snprintf(buf, sizeof buf, "%s/train.bin", out_dir);
    int32_t *tt = read_shard(buf, &nt, &vt);
    snprintf(buf, sizeof buf, "%s/val.bin", out_dir);
    int32_t *tv = read_shard(buf, &nv, &vv);
    assert_int_equal(vt, 300);
    assert_int_equal(vv, 300);
    size_t bt, bv;
    uint8_t *dt = ct_tokenizer_decode(tok, tt, nt, &bt);
    uint8_t *dv = ct_tokenizer_decode(tok, tv, nv, &bv);
    /* joined with one '\n' between files; the val part is the last quarter, cut after a line */
    size_t total = strlen(alpha) + 1 + strlen(beta) + 1 + strlen("tail file\n");
    char *joined = malloc(total + 1);
    snprintf(joined, total + 1, "%s\n%s\n%s", alpha, beta, "tail file\n");
    assert_int_equal(bt + bv, total);
    assert_memory_equal(dt, joined, bt);
    assert_memory_equal(dv, joined + bt, bv);
    assert_int_equal(dt[bt - 1], '\n');
    assert_true(bv <= total - (size_t)(0.75 * (double)total) && bv + 80 > total / 4);
    assert_null(strstr((char *)dv, "IGNORED"));
    /* the shards open as a dataset for a model of this vocabulary */
    ct_dataset *ds;
    snprintf(buf, sizeof buf, "%s/train.bin", out_dir);
    assert_int_equal(ct_dataset_open(&ds, buf, 32, 300, 1), CT_OK);
    assert_int_equal(ct_dataset_n_tokens(ds), nt);
    assert_int_equal(ct_dataset_check_tokens(ds), CT_OK);
    ct_dataset_free(ds);

    free(joined);
    free(dt);
    free(dv);
    free(tt);
    free(tv);
    free(alpha);
    free(beta);
    ct_tokenizer_free(tok);
}

/* The options are refused with a message containing `phrase` and a hint. (The command line's
 * own errors, an unknown option or a value that is not a number, are cmd/'s: cli_errors.sh.) */
static void assert_prepare_rejected(const char *input, const char *out, int vocab, double val,
                                    const char *phrase) {
    ct_error_clear();
    ct_prepare_options o = CT_PREPARE_DEFAULTS;
    o.inputs = &input, o.n_inputs = input ? 1 : 0, o.out_dir = out;
    if (vocab) o.vocab_size = vocab;
    if (val >= 0) o.val_fraction = val;
    assert_int_equal(ct_prepare_run(&o), CT_ERR_INPUT);
    if (!strstr(ct_error_message(), phrase))
        fail_msg("message lacks '%s': %s", phrase, ct_error_message());
    assert_true(ct_error_hint()[0] != '\0');
}

static void test_prepare_bad_arguments(void **state) {
    fixture *fx = *state;
    char *text = path_in(fx, "t.txt");
    write_text(text, "some text\n");
    char *out = path_in(fx, "o");
    char *missing = path_in(fx, "missing.txt");
    assert_prepare_rejected(NULL, out, 0, -1, "--input");
    assert_prepare_rejected(text, NULL, 0, -1, "--out");
    assert_prepare_rejected(text, out, 100, -1, "'100'");
    assert_prepare_rejected(text, out, 0, 1.0, "--val-fraction");
    assert_prepare_rejected(missing, out, 0, -1, missing);
    assert_prepare_rejected(text, text, 0, -1, text); /* --out names a file */
    assert_int_not_equal(access(out, F_OK), 0);       /* nothing written on failure */
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_shard_roundtrip_width2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shard_roundtrip_width4, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shard_write_rejects_bad_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_shards_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_and_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fill_rejects_bad_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_tokens_finds_bad_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_depends_on_seed_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_each_epoch_is_a_permutation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_access_matches_sequential, setup, teardown),
        cmocka_unit_test_setup_teardown(test_glob_multiple_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prepare_end_to_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prepare_bad_arguments, setup, teardown),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
