/*
 * test_tokenizer.c — byte-level BPE: round trips, determinism, agreement with a naive
 * reference trainer, compression on English, the file format and its corruption checks.
 *
 *   test_tokenizer [FILTER]     FILTER is a cmocka test-name pattern (wildcards allowed)
 *
 * English text comes from $CT_TEST_TEXT or the fortunes corpus (scripts/setup.sh installs it),
 * and otherwise from a generator of English-like sentences, so the tests always run.
 */
#define _GNU_SOURCE
#include <dirent.h>
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

#include "core/data/tokenizer.h"

#include "test_util.h"

/* ---- fixtures ------------------------------------------------------------------------------- */

static uint64_t test_rng_state = 0x1234567887654321ull;

static uint64_t test_rand(void) {
    return test_rng_next(&test_rng_state);
}

static uint8_t *read_whole(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    size_t r;
    while ((r = fread(buf + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    *n = len;
    return buf;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The fortune files (names without '.'), joined, up to `limit` bytes. */
static uint8_t *read_fortunes(size_t limit, size_t *n) {
    const char *dir = "/usr/share/games/fortunes";
    DIR *d = opendir(dir);
    if (!d) return NULL;
    char *names[256];
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && k < 256)
        if (!strchr(e->d_name, '.')) names[k++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)k, sizeof *names, cmp_str);
    uint8_t *buf = malloc(limit);
    size_t len = 0;
    for (int i = 0; i < k; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        size_t m;
        uint8_t *f = read_whole(path, &m);
        if (f && len < limit) {
            size_t take = m < limit - len ? m : limit - len;
            memcpy(buf + len, f, take);
            len += take;
        }
        free(f);
        free(names[i]);
    }
    *n = len;
    if (len == 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* English-like text: Zipf-ish draws from a small word list, with punctuation and newlines. */
static uint8_t *generate_english(size_t target, size_t *n) {
    static const char *words[] = {
        "the",   "of",      "and",     "to",    "a",     "in",    "that",   "is",   "was",
        "he",    "for",     "it",      "with",  "as",    "his",   "on",     "be",   "at",
        "by",    "I",       "this",    "had",   "not",   "are",   "but",    "from", "or",
        "have",  "an",      "they",    "which", "one",   "you",   "were",   "her",  "all",
        "she",   "there",   "would",   "their", "we",    "him",   "been",   "has",  "when",
        "who",   "will",    "more",    "no",    "if",    "out",   "so",     "said", "what",
        "up",    "its",     "about",   "into",  "than",  "them",  "can",    "only", "other",
        "new",   "some",    "could",   "time",  "these", "two",   "may",    "then", "do",
        "first", "any",     "my",      "now",   "such",  "like",  "our",    "over", "man",
        "me",    "even",    "most",    "made",  "after", "also",  "did",    "many", "before",
        "must",  "through", "back",    "years", "where", "much",  "your",   "way",  "well",
        "down",  "should",  "because", "each",  "just",  "those", "people", "king", "lord",
        "good",  "night",   "heart",   "love",  "death", "world"};
    size_t n_words = sizeof words / sizeof *words;
    uint8_t *buf = malloc(target + 64);
    size_t len = 0;
    int in_sentence = 0;
    while (len < target) {
        /* min of two uniforms favours the front of the list */
        size_t a = test_rand() % n_words, b = test_rand() % n_words;
        const char *w = words[a < b ? a : b];
        if (in_sentence) buf[len++] = ' ';
        size_t wl = strlen(w);
        memcpy(buf + len, w, wl);
        if (!in_sentence && buf[len] >= 'a') buf[len] = (uint8_t)(buf[len] - 32);
        len += wl;
        in_sentence++;
        uint64_t r = test_rand() % 16;
        if (r == 0) buf[len++] = ',';
        if (in_sentence > 6 && r < 3) {
            buf[len++] = r == 1 ? '?' : '.';
            buf[len++] = (test_rand() % 3 == 0) ? '\n' : ' ';
            in_sentence = 0;
        }
    }
    *n = len;
    return buf;
}

static uint8_t *english_text(size_t *n) {
    const char *env = getenv("CT_TEST_TEXT");
    uint8_t *t = NULL;
    if (env) t = read_whole(env, n);
    if (!t) t = read_fortunes(1 << 20, n);
    if (!t) t = generate_english(1 << 20, n);
    return t;
}

typedef struct fixture {
    uint8_t *text;
    size_t n;
    char dir[64];
} fixture;

static int setup(void **state) {
    fixture *fx = calloc(1, sizeof *fx);
    fx->text = english_text(&fx->n);
    strcpy(fx->dir, "/tmp/ct_test_tok_XXXXXX");
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
    free(fx->text);
    free(fx);
    return 0;
}

static void assert_roundtrip(const ct_tokenizer *tok, const uint8_t *text, size_t n) {
    int32_t *toks = NULL;
    size_t nt = ct_tokenizer_encode(tok, text, n, &toks);
    for (size_t i = 0; i < nt; i++) {
        assert_true(toks[i] >= 0);
        assert_true(toks[i] < ct_tokenizer_vocab_size(tok));
    }
    size_t nd;
    uint8_t *dec = ct_tokenizer_decode(tok, toks, nt, &nd);
    assert_int_equal(nd, n);
    assert_memory_equal(dec, text, n);
    free(dec);
    free(toks);
}

static void assert_same_merges(const ct_tokenizer *a, const ct_tokenizer *b) {
    assert_int_equal(ct_tokenizer_vocab_size(a), ct_tokenizer_vocab_size(b));
    for (int i = 0; i < ct_tokenizer_vocab_size(a) - 256; i++) {
        int32_t al, ar, bl, br;
        ct_tokenizer_merge(a, i, &al, &ar);
        ct_tokenizer_merge(b, i, &bl, &br);
        assert_int_equal(al, bl);
        assert_int_equal(ar, br);
    }
}

/* ---- round trips ---------------------------------------------------------------------------- */

static void test_roundtrip_random_bytes(void **state) {
    fixture *fx = *state;
    ct_tokenizer *tok;
    assert_int_equal(ct_tokenizer_train(&tok, fx->text, fx->n < 200000 ? fx->n : 200000, 600),
                     CT_OK);
    uint8_t buf[3000];
    for (int trial = 0; trial < 300; trial++) {
        size_t n = test_rand() % sizeof buf;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = test_rand();
            /* a mix of text, NULs, invalid UTF-8 and arbitrary bytes */
            switch (r % 6) {
            case 0: buf[i] = 0x00; break;
            case 1: buf[i] = (uint8_t)(0x80 + (r >> 8) % 64); break; /* lone continuation */
            case 2: buf[i] = (uint8_t)(0xf8 + (r >> 8) % 8); break;  /* never valid UTF-8 */
            case 3: buf[i] = (uint8_t)(r >> 8); break;
            default: buf[i] = fx->text[(r >> 8) % fx->n]; break;
            }
        }
        assert_roundtrip(tok, buf, n);
    }
    static const uint8_t edge[] = {0x00, 0xc0, 0x80, 0xed, 0xa0, 0x80, 0xff, 0xfe, ' ',
                                   ' ',  '\n', 0x00, 't',  'h',  'e',  ' ',  0xe2, 0x82};
    assert_roundtrip(tok, edge, sizeof edge);
    assert_roundtrip(tok, edge, 0);
    ct_tokenizer_free(tok);

    /* and a tokenizer trained on random bytes with repeats (merges of non-text bytes) */
    size_t n = 100000;
    uint8_t *rnd = malloc(n);
    for (size_t i = 0; i < n; i++) rnd[i] = (uint8_t)(test_rand() % 24 * 11);
    assert_int_equal(ct_tokenizer_train(&tok, rnd, n, 800), CT_OK);
    assert_true(ct_tokenizer_vocab_size(tok) > 256);
    assert_roundtrip(tok, rnd, n);
    assert_roundtrip(tok, fx->text, fx->n < 50000 ? fx->n : 50000);
    ct_tokenizer_free(tok);
    free(rnd);
}

static void test_roundtrip_text(void **state) {
    fixture *fx = *state;
    ct_tokenizer *tok;
    assert_int_equal(ct_tokenizer_train(&tok, fx->text, fx->n, 1024), CT_OK);
    /* real corpora fill all 1024; the generated fallback has too few distinct words to */
    assert_true(ct_tokenizer_vocab_size(tok) > 600 && ct_tokenizer_vocab_size(tok) <= 1024);
    assert_roundtrip(tok, fx->text, fx->n);
    ct_tokenizer_free(tok);
}

static void test_compresses_english(void **state) {
    fixture *fx = *state;
    ct_tokenizer *tok;
    assert_int_equal(ct_tokenizer_train(&tok, fx->text, fx->n, 1024), CT_OK);
    int32_t *toks;
    size_t nt = ct_tokenizer_encode(tok, fx->text, fx->n, &toks);
    double ratio = (double)fx->n / (double)nt;
    /* GPT-2-style BPE at 1K tokens reaches ~2.4 bytes/token on English prose; 2 leaves room
     * for other English corpora while still catching a tokenizer that barely merges. */
    assert_true(ratio > 2.0);
    free(toks);
    ct_tokenizer_free(tok);
}

/* ---- training ------------------------------------------------------------------------------- */

static void test_deterministic(void **state) {
    fixture *fx = *state;
    ct_tokenizer *a, *b;
    assert_int_equal(ct_tokenizer_train(&a, fx->text, fx->n, 2048), CT_OK);
    assert_int_equal(ct_tokenizer_train(&b, fx->text, fx->n, 2048), CT_OK);
    assert_same_merges(a, b);
    ct_tokenizer_free(a);
    ct_tokenizer_free(b);
}

/*
 * The reference: recount every pair of every chunk occurrence from scratch before each merge
 * (dense table), pick the highest count, ties to the smallest (left, right), stop below 2.
 * The fast trainer must produce exactly these merges, and encoding must reproduce the
 * reference's merged chunks.
 */
static void test_matches_naive_reference(void **state) {
    fixture *fx = *state;
    const int vocab = 420;
    size_t n = fx->n < 40000 ? fx->n : 40000;
    const uint8_t *text = fx->text;
    int32_t *seq = malloc(n * sizeof *seq);
    size_t *starts = malloc((n + 1) * sizeof *starts);
    size_t *lens = malloc((n + 1) * sizeof *lens);
    size_t n_chunks = 0;
    for (size_t i = 0; i < n;) {
        size_t len = ct_tokenizer_chunk_len(text, n, i);
        assert_true(len >= 1 && i + len <= n);
        starts[n_chunks] = i;
        lens[n_chunks++] = len;
        for (size_t k = 0; k < len; k++) seq[i + k] = text[i + k];
        i += len;
    }
    int64_t *counts = malloc((size_t)vocab * vocab * sizeof *counts);
    int32_t ref_left[vocab], ref_right[vocab];
    int n_ref = 0;
    while (256 + n_ref < vocab) {
        memset(counts, 0, (size_t)vocab * vocab * sizeof *counts);
        for (size_t c = 0; c < n_chunks; c++) {
            const int32_t *s = seq + starts[c];
            for (size_t k = 0; k + 1 < lens[c]; k++) counts[(size_t)s[k] * vocab + s[k + 1]]++;
        }
        int64_t best = 0;
        size_t best_idx = 0;
        for (size_t p = 0; p < (size_t)vocab * vocab; p++)
            if (counts[p] > best) best = counts[p], best_idx = p;
        if (best < 2) break;
        int32_t l = (int32_t)(best_idx / vocab), r = (int32_t)(best_idx % vocab);
        int32_t z = 256 + n_ref;
        ref_left[n_ref] = l;
        ref_right[n_ref++] = r;
        for (size_t c = 0; c < n_chunks; c++) {
            int32_t *s = seq + starts[c];
            size_t o = 0;
            for (size_t k = 0; k < lens[c];) {
                if (k + 1 < lens[c] && s[k] == l && s[k + 1] == r)
                    s[o++] = z, k += 2;
                else
                    s[o++] = s[k++];
            }
            lens[c] = o;
        }
    }
    ct_tokenizer *tok;
    assert_int_equal(ct_tokenizer_train(&tok, text, n, vocab), CT_OK);
    assert_int_equal(ct_tokenizer_vocab_size(tok), 256 + n_ref);
    for (int i = 0; i < n_ref; i++) {
        int32_t l, r;
        ct_tokenizer_merge(tok, i, &l, &r);
        assert_int_equal(l, ref_left[i]);
        assert_int_equal(r, ref_right[i]);
    }
    int32_t *toks;
    size_t nt = ct_tokenizer_encode(tok, text, n, &toks);
    size_t pos = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        for (size_t k = 0; k < lens[c]; k++) {
            assert_true(pos < nt);
            assert_int_equal(toks[pos++], seq[starts[c] + k]);
        }
    }
    assert_int_equal(pos, nt);
    free(toks);
    ct_tokenizer_free(tok);
    free(counts);
    free(seq);
    free(starts);
    free(lens);
}

static void test_tokens_stay_inside_chunks(void **state) {
    fixture *fx = *state;
    ct_tokenizer *tok;
    assert_int_equal(ct_tokenizer_train(&tok, fx->text, fx->n, 1024), CT_OK);
    for (int32_t t = 0; t < ct_tokenizer_vocab_size(tok); t++) {
        size_t len;
        const uint8_t *b = ct_tokenizer_token_bytes(tok, t, &len);
        assert_true(len >= 1);
        /* a token is a piece of one chunk, so the splitter sees it as one chunk */
        assert_int_equal(ct_tokenizer_chunk_len(b, len, 0), len);
        if (t >= 256) {
            int32_t l, r;
            size_t ll, rl;
            ct_tokenizer_merge(tok, t - 256, &l, &r);
            assert_true(l < t && r < t);
            const uint8_t *lb = ct_tokenizer_token_bytes(tok, l, &ll);
            const uint8_t *rb = ct_tokenizer_token_bytes(tok, r, &rl);
            assert_int_equal(ll + rl, len);
            assert_memory_equal(b, lb, ll);
            assert_memory_equal(b + ll, rb, rl);
        }
    }
    ct_tokenizer_free(tok);
}

static void test_chunking_rules(void **state) {
    (void)state;
    const char *s = "Hello, world  foo\n\nbar's 42x";
    const size_t n = strlen(s);
    const char *want[] = {"Hello", ",", " world", " ", " foo", "\n\n", "bar", "'", "s", " 42x"};
    size_t i = 0, k = 0;
    while (i < n) {
        size_t len = ct_tokenizer_chunk_len((const uint8_t *)s, n, i);
        assert_true(k < sizeof want / sizeof *want);
        assert_int_equal(len, strlen(want[k]));
        assert_memory_equal(s + i, want[k], len);
        i += len, k++;
    }
    assert_int_equal(k, sizeof want / sizeof *want);
    /* long runs are cut at 128 bytes */
    uint8_t run[300];
    memset(run, '=', sizeof run);
    assert_int_equal(ct_tokenizer_chunk_len(run, sizeof run, 0), 128);
    assert_int_equal(ct_tokenizer_chunk_len(run, sizeof run, 256), 44);
}

static void test_small_and_degenerate(void **state) {
    (void)state;
    ct_tokenizer *tok;
    assert_int_equal(ct_tokenizer_train(&tok, (const uint8_t *)"", 0, 1000), CT_OK);
    assert_int_equal(ct_tokenizer_vocab_size(tok), 256);
    int32_t *toks;
    assert_int_equal(ct_tokenizer_encode(tok, (const uint8_t *)"", 0, &toks), 0);
    free(toks);
    const uint8_t abc[] = {'a', 0, 0xff};
    assert_int_equal(ct_tokenizer_encode(tok, abc, 3, &toks), 3);
    assert_int_equal(toks[0], 'a');
    assert_int_equal(toks[1], 0);
    assert_int_equal(toks[2], 0xff);
    free(toks);
    ct_tokenizer_free(tok);

    /* a corpus that repeats few pairs yields fewer tokens than asked for */
    const char *rep = "abab abab abab";
    assert_int_equal(ct_tokenizer_train(&tok, (const uint8_t *)rep, strlen(rep), 5000), CT_OK);
    assert_true(ct_tokenizer_vocab_size(tok) > 256);
    assert_true(ct_tokenizer_vocab_size(tok) < 270);
    assert_int_equal(ct_tokenizer_encode(tok, (const uint8_t *)" abab", 5, &toks), 1);
    free(toks);
    assert_int_equal(ct_tokenizer_vocab_size(tok), 259);

    /* ids a larger model vocabulary can sample decode to U+FFFD rather than aborting */
    const int32_t odd[] = {'x', 259, -1, 100000, 'y'};
    size_t nd;
    uint8_t *dec = ct_tokenizer_decode(tok, odd, 5, &nd);
    assert_int_equal(nd, 1 + 3 + 3 + 3 + 1);
    assert_memory_equal(dec, "x\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdy", nd);
    free(dec);
    ct_tokenizer_free(tok);

    /* vocab 256 means no merges at all */
    assert_int_equal(ct_tokenizer_train(&tok, (const uint8_t *)rep, strlen(rep), 256), CT_OK);
    assert_int_equal(ct_tokenizer_vocab_size(tok), 256);
    ct_tokenizer_free(tok);

    ct_error_clear();
    tok = (ct_tokenizer *)1;
    assert_int_equal(ct_tokenizer_train(&tok, (const uint8_t *)rep, strlen(rep), 255),
                     CT_ERR_INPUT);
    assert_null(tok);
    assert_non_null(strstr(ct_error_message(), "255"));
    assert_true(ct_error_hint()[0] != '\0');
}

/* ---- file format ---------------------------------------------------------------------------- */

static void path_in(const fixture *fx, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", fx->dir, name);
}

static void test_save_load_roundtrip(void **state) {
    fixture *fx = *state;
    ct_tokenizer *tok, *back;
    assert_int_equal(ct_tokenizer_train(&tok, fx->text, fx->n, 1500), CT_OK);
    char path[256];
    path_in(fx, "tok.bin", path, sizeof path);
    assert_int_equal(ct_tokenizer_save(tok, path), CT_OK);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, 24 + 8 * (ct_tokenizer_vocab_size(tok) - 256));
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0); /* renamed into place */
    assert_int_equal(ct_tokenizer_load(&back, path), CT_OK);
    assert_same_merges(tok, back);
    size_t n = fx->n < 100000 ? fx->n : 100000;
    int32_t *a, *b;
    size_t na = ct_tokenizer_encode(tok, fx->text, n, &a);
    size_t nb = ct_tokenizer_encode(back, fx->text, n, &b);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    free(a);
    free(b);
    ct_tokenizer_free(tok);
    ct_tokenizer_free(back);
}

/* Saves a small valid tokenizer and returns its bytes for the corruption cases to edit. */
static uint8_t *valid_file_bytes(fixture *fx, size_t *n) {
    ct_tokenizer *tok;
    assert_int_equal(ct_tokenizer_train(&tok, fx->text, fx->n < 50000 ? fx->n : 50000, 300), CT_OK);
    assert_int_equal(ct_tokenizer_vocab_size(tok), 300);
    char path[256];
    path_in(fx, "valid.bin", path, sizeof path);
    assert_int_equal(ct_tokenizer_save(tok, path), CT_OK);
    ct_tokenizer_free(tok);
    uint8_t *bytes = read_whole(path, n);
    assert_non_null(bytes);
    assert_int_equal(*n, 24 + 8 * 44);
    return bytes;
}

static void write_bytes(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void assert_load_rejected(fixture *fx, const uint8_t *b, size_t n, const char *name,
                                 const char *phrase) {
    char path[256];
    path_in(fx, name, path, sizeof path);
    write_bytes(path, b, n);
    ct_error_clear();
    ct_tokenizer *tok = (ct_tokenizer *)1;
    assert_int_equal(ct_tokenizer_load(&tok, path), CT_ERR_INPUT);
    assert_null(tok);
    if (!strstr(ct_error_message(), path) || !strstr(ct_error_message(), phrase))
        fail_msg("message for %s lacks the path or '%s': %s", name, phrase, ct_error_message());
    assert_true(ct_error_hint()[0] != '\0');
}

static void test_corrupt_files_rejected(void **state) {
    fixture *fx = *state;
    size_t n;
    uint8_t *good = valid_file_bytes(fx, &n);
    uint8_t *b = malloc(n + 8);

    memcpy(b, good, n);
    b[0] = 'X';
    assert_load_rejected(fx, b, n, "bad_magic.bin", "magic");

    memcpy(b, good, n);
    put32(b + 8, 99);
    assert_load_rejected(fx, b, n, "bad_version.bin", "version 99");

    memcpy(b, good, n);
    put32(b + 12, 0x04030201u);
    assert_load_rejected(fx, b, n, "bad_bom.bin", "byte order");

    assert_load_rejected(fx, good, n - 3, "truncated.bin", "truncated");
    assert_load_rejected(fx, good, 10, "tiny.bin", "header");
    assert_load_rejected(fx, good, 0, "empty.bin", "header");

    memcpy(b, good, n);
    b[n] = 0;
    assert_load_rejected(fx, b, n + 1, "trailing.bin", "trailing");

    memcpy(b, good, n);
    put32(b + 16, 301); /* vocab_size disagrees with n_merges */
    assert_load_rejected(fx, b, n, "bad_vocab.bin", "vocab_size 301");

    memcpy(b, good, n);
    put32(b + 24 + 8 * 5, 256 + 5); /* merge 5 refers to itself (token 261) */
    assert_load_rejected(fx, b, n, "self_ref.bin", "merge 5");

    memcpy(b, good, n);
    put32(b + 24 + 8 * 10 + 4, 290); /* merge 10 refers to the later token 290 */
    assert_load_rejected(fx, b, n, "later_ref.bin", "merge 10");

    /* a chain of self-merges doubling the token length past any sane size */
    size_t nm = 40, nb = 24 + 8 * nm;
    uint8_t *chain = calloc(1, nb);
    memcpy(chain, "CTTOKNZR", 8);
    put32(chain + 8, 1);
    put32(chain + 12, 0x01020304u);
    put32(chain + 16, 256 + (uint32_t)nm);
    put32(chain + 20, (uint32_t)nm);
    for (size_t i = 0; i < nm; i++) {
        uint32_t t = i == 0 ? 'a' : 256 + (uint32_t)i - 1;
        put32(chain + 24 + 8 * i, t);
        put32(chain + 24 + 8 * i + 4, t);
    }
    assert_load_rejected(fx, chain, nb, "explode.bin", "longer than");
    free(chain);

    /* a missing file and a directory */
    char path[256];
    path_in(fx, "missing.bin", path, sizeof path);
    ct_tokenizer *tok;
    assert_int_equal(ct_tokenizer_load(&tok, path), CT_ERR_INPUT);
    assert_non_null(strstr(ct_error_message(), path));
    assert_int_equal(ct_tokenizer_load(&tok, fx->dir), CT_ERR_INPUT);
    assert_non_null(strstr(ct_error_message(), fx->dir));

    /* the untouched bytes still load */
    path_in(fx, "good_again.bin", path, sizeof path);
    write_bytes(path, good, n);
    assert_int_equal(ct_tokenizer_load(&tok, path), CT_OK);
    assert_int_equal(ct_tokenizer_vocab_size(tok), 300);
    ct_tokenizer_free(tok);
    free(b);
    free(good);
}

static void test_save_to_bad_path(void **state) {
    fixture *fx = *state;
    ct_tokenizer *tok;
    assert_int_equal(ct_tokenizer_train(&tok, (const uint8_t *)"aa aa", 5, 300), CT_OK);
    char path[256];
    path_in(fx, "no/such/dir/tok.bin", path, sizeof path);
    assert_int_equal(ct_tokenizer_save(tok, path), CT_ERR_INPUT);
    assert_non_null(strstr(ct_error_message(), "no/such/dir/tok.bin"));
    ct_tokenizer_free(tok);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_random_bytes),
        cmocka_unit_test(test_roundtrip_text),
        cmocka_unit_test(test_compresses_english),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_matches_naive_reference),
        cmocka_unit_test(test_tokens_stay_inside_chunks),
        cmocka_unit_test(test_chunking_rules),
        cmocka_unit_test(test_small_and_degenerate),
        cmocka_unit_test(test_save_load_roundtrip),
        cmocka_unit_test(test_corrupt_files_rejected),
        cmocka_unit_test(test_save_to_bad_path),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, setup, teardown);
}
