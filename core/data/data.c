/*
 * data.c — token shards (write, memory-map, validate) and the seeded sample order.
 * See data.h for the file format and the order contract.
 *
 * Shards are mapped read-only, so opening a dataset costs no reading and several ranks on one
 * node share the page cache. Everything a header claims is checked against the file before a
 * token is touched: a shard that lies about its length would otherwise turn into a SIGBUS deep
 * inside training.
 *
 * The order is Fisher–Yates driven by a counter-based hash (not a stateful generator), so the
 * permutation of epoch e is a pure function of (seed, e, n_samples): any rank, at any point of
 * a resumed run, computes the same permutation without replaying anything.
 */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_MAGIC "CTSHARD1"
#define SHARD_VERSION 1u
#define SHARD_BOM 0x01020304u
/* Tokens converted per write call when writing a shard. */
#define SHARD_WRITE_BLOCK 65536

typedef struct shard {
    char *path;
    uint8_t *map; /* whole file, read-only */
    size_t map_bytes;
    const uint8_t *tokens; /* map + CT_SHARD_HEADER_BYTES */
    uint32_t width;        /* bytes per token: 2 or 4 */
    uint32_t vocab;        /* vocab_size recorded in the header */
    int64_t n_tokens;
    int64_t n_samples;    /* complete samples of seq_len + 1 tokens inside this shard */
    int64_t first_sample; /* dataset-wide index of this shard's first sample */
} shard;

struct ct_dataset {
    shard *shards;
    int n_shards;
    int64_t seq_len;
    int64_t n_samples;
    int64_t n_tokens;
    uint64_t seed;
    int64_t perm_epoch; /* epoch whose permutation is in perm; -1 = none yet */
    uint32_t *perm;     /* (n_samples,) */
};

/* Token i of a shard; compilers turn these byte loads into one load on little-endian hosts. */
static inline int32_t shard_token(const shard *s, int64_t i) {
    const uint8_t *p = s->tokens + (size_t)i * s->width;
    if (s->width == 2) return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8);
    return (int32_t)ct_get_le32(p);
}

/* ---- writing -------------------------------------------------------------------------------- */

ct_status ct_shard_write(const char *path, const int32_t *tokens, size_t n_tokens, int vocab_size) {
    if (vocab_size < 1) {
        ct_error(CT_ERR_INPUT, "cannot write shard %s: vocab_size=%d must be positive", path,
                 vocab_size);
        ct_hint("pass the tokenizer's vocabulary size");
        return CT_ERR_INPUT;
    }
    for (size_t i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0 || tokens[i] >= vocab_size) {
            ct_error(CT_ERR_INPUT,
                     "cannot write shard %s: token %d at position %zu is outside "
                     "[0, vocab_size=%d)",
                     path, (int)tokens[i], i, vocab_size);
            ct_hint("the tokens and the vocab_size passed must come from the same tokenizer");
            return CT_ERR_INPUT;
        }
    }
    uint32_t width = vocab_size <= 65536 ? 2 : 4;
    uint8_t header[CT_SHARD_HEADER_BYTES] = {0};
    memcpy(header, SHARD_MAGIC, 8);
    ct_put_le32(header + 8, SHARD_VERSION);
    ct_put_le32(header + 12, SHARD_BOM);
    ct_put_le32(header + 16, width);
    ct_put_le32(header + 20, (uint32_t)vocab_size);
    ct_put_le64(header + 24, (uint64_t)n_tokens);

    /* Write PATH.tmp and rename: readers never see a half-written shard under the real name. */
    size_t tmp_len = strlen(path) + 8;
    char *tmp = ct_xmalloc(tmp_len);
    snprintf(tmp, tmp_len, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        ct_error(CT_ERR_INPUT, "cannot create shard file %s: %s", tmp, strerror(errno));
        ct_hint("check that the directory exists and is writable");
        free(tmp);
        return CT_ERR_INPUT;
    }
    bool ok = fwrite(header, 1, sizeof header, f) == sizeof header;
    uint8_t *block = ct_xmalloc((size_t)SHARD_WRITE_BLOCK * width);
    for (size_t i = 0; ok && i < n_tokens; i += SHARD_WRITE_BLOCK) {
        size_t m = CT_MIN((size_t)SHARD_WRITE_BLOCK, n_tokens - i);
        for (size_t k = 0; k < m; k++) {
            uint32_t v = (uint32_t)tokens[i + k];
            uint8_t *p = block + k * width;
            p[0] = (uint8_t)v;
            p[1] = (uint8_t)(v >> 8);
            if (width == 4) {
                p[2] = (uint8_t)(v >> 16);
                p[3] = (uint8_t)(v >> 24);
            }
        }
        ok = fwrite(block, width, m, f) == m;
    }
    free(block);
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    ct_status st = ct_file_publish(tmp, path, ok, "shard");
    free(tmp);
    return st;
}

/* ---- opening -------------------------------------------------------------------------------- */

static ct_status shard_corrupt(const char *path, const char *what) {
    ct_error(CT_ERR_INPUT, "data shard %s is corrupt: %s", path, what);
    ct_hint("re-create it with `cooktrain prepare`, or fix data.train / data.val");
    return CT_ERR_INPUT;
}

/* Maps one shard and checks its header against the file and the model's vocabulary. */
static ct_status shard_open(shard *s, const char *path, int64_t model_vocab) {
    memset(s, 0, sizeof *s);
    s->path = ct_xstrdup(path);
    int fd;
    int64_t file_size;
    if (ct_open_regular(path, "data shard", &fd, &file_size) != CT_OK) {
        ct_hint("data.train and data.val name token shard files (or globs matching them); "
                "`cooktrain prepare` makes them");
        return CT_ERR_INPUT;
    }
    size_t size = (size_t)file_size;
    char what[320];
    if (size < CT_SHARD_HEADER_BYTES) {
        close(fd);
        snprintf(what, sizeof what, "truncated: %zu bytes, shorter than the %d-byte header", size,
                 CT_SHARD_HEADER_BYTES);
        return shard_corrupt(path, what);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED) {
        ct_error(CT_ERR_RUNTIME, "cannot memory-map data shard %s (%zu bytes): %s", path, size,
                 strerror(errno));
        ct_hint("check the address-space limit (ulimit -v)");
        return CT_ERR_RUNTIME;
    }
    s->map = map;
    s->map_bytes = size;
    const uint8_t *h = s->map;
    if (memcmp(h, SHARD_MAGIC, 8) != 0)
        return shard_corrupt(path, "bad magic (expected \"" SHARD_MAGIC "\"); not a token shard");
    uint32_t version = ct_get_le32(h + 8), bom = ct_get_le32(h + 12);
    uint32_t width = ct_get_le32(h + 16), vocab = ct_get_le32(h + 20);
    uint64_t count = ct_get_le64(h + 24);
    if (version != SHARD_VERSION) {
        snprintf(what, sizeof what, "version %u, this build reads version %u", version,
                 SHARD_VERSION);
        return shard_corrupt(path, what);
    }
    if (bom != SHARD_BOM) {
        snprintf(what, sizeof what, "byte-order mark 0x%08x, expected 0x%08x%s", bom, SHARD_BOM,
                 bom == 0x04030201u ? " (written with the other byte order)" : "");
        return shard_corrupt(path, what);
    }
    if (width != 2 && width != 4) {
        snprintf(what, sizeof what, "token width %u bytes, expected 2 or 4", width);
        return shard_corrupt(path, what);
    }
    if (vocab == 0 || vocab > (uint32_t)INT32_MAX || (width == 2 && vocab > 65536)) {
        snprintf(what, sizeof what, "vocab_size %u does not fit token width %u", vocab, width);
        return shard_corrupt(path, what);
    }
    if ((int64_t)vocab > model_vocab) {
        ct_error(
            CT_ERR_INPUT,
            "data shard %s was tokenized with vocab_size %u, larger than model.vocab_size=%lld",
            path, vocab, (long long)model_vocab);
        ct_hint("use shards made with the model's tokenizer (eval, sample), or train a model "
                "whose model.vocab_size is at least %u (the tokenizer's vocabulary size)",
                vocab);
        return CT_ERR_INPUT;
    }
    uint64_t max_count = (uint64_t)(SIZE_MAX - CT_SHARD_HEADER_BYTES) / width;
    if (count > max_count || count > (uint64_t)INT64_MAX / 4) {
        snprintf(what, sizeof what, "token count %llu is impossibly large",
                 (unsigned long long)count);
        return shard_corrupt(path, what);
    }
    size_t expected = CT_SHARD_HEADER_BYTES + (size_t)count * width;
    if (size != expected) {
        snprintf(what, sizeof what,
                 "%s: the header promises %llu tokens x %u bytes, so expected %zu bytes, found "
                 "%zu",
                 size < expected ? "truncated" : "trailing bytes", (unsigned long long)count, width,
                 expected, size);
        return shard_corrupt(path, what);
    }
    s->tokens = s->map + CT_SHARD_HEADER_BYTES;
    s->width = width;
    s->vocab = vocab;
    s->n_tokens = (int64_t)count;
    return CT_OK;
}

static void shard_release(shard *s) {
    if (s->map) munmap(s->map, s->map_bytes);
    free(s->path);
    memset(s, 0, sizeof *s);
}

void ct_dataset_free(ct_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_shards; i++) shard_release(&ds->shards[i]);
    free(ds->shards);
    free(ds->perm);
    free(ds);
}

ct_status ct_dataset_open(ct_dataset **out, const char *pattern, int64_t seq_len,
                          int64_t vocab_size, uint64_t seed) {
    *out = NULL;
    if (seq_len < 1) {
        ct_error(CT_ERR_INPUT, "cannot open dataset %s: seq_len=%lld must be positive", pattern,
                 (long long)seq_len);
        ct_hint("set model.seq_len to a positive number of tokens");
        return CT_ERR_INPUT;
    }
    if (vocab_size < 1) {
        ct_error(CT_ERR_INPUT, "cannot open dataset %s: vocab_size=%lld must be positive", pattern,
                 (long long)vocab_size);
        ct_hint("set model.vocab_size to the tokenizer's vocabulary size");
        return CT_ERR_INPUT;
    }
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g); /* sorted by name unless GLOB_NOSORT */
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        if (rc == 0) globfree(&g);
        ct_error(CT_ERR_INPUT, "no data shard matches '%s'", pattern);
        ct_hint("run `cooktrain prepare --input TEXT --out DIR` to create shards, then point "
                "data.train / data.val at DIR/train.bin and DIR/val.bin");
        return CT_ERR_INPUT;
    }
    if (rc != 0) {
        ct_error(CT_ERR_INPUT, "cannot expand data pattern '%s' (%s)", pattern,
                 rc == GLOB_NOSPACE ? "out of memory" : "read error");
        ct_hint("check that the directories in the pattern exist and are readable");
        return CT_ERR_INPUT;
    }
    if (g.gl_pathc > (size_t)INT32_MAX) {
        globfree(&g);
        ct_error(CT_ERR_INPUT, "data pattern '%s' matches too many files", pattern);
        ct_hint("merge the shards into fewer, larger files");
        return CT_ERR_INPUT;
    }

    ct_dataset *ds = ct_xcalloc(1, sizeof *ds);
    ds->shards = ct_xcalloc(g.gl_pathc, sizeof *ds->shards);
    ds->seq_len = seq_len;
    ds->seed = seed;
    ds->perm_epoch = -1;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        ds->n_shards = (int)i + 1; /* so ct_dataset_free releases this one too on failure */
        ct_status st = shard_open(&ds->shards[i], g.gl_pathv[i], vocab_size);
        if (st != CT_OK) {
            globfree(&g);
            ct_dataset_free(ds);
            return st;
        }
        shard *s = &ds->shards[i];
        /* Samples start every seq_len tokens and need seq_len + 1 of them (the last target). */
        s->n_samples = s->n_tokens > seq_len ? (s->n_tokens - 1) / seq_len : 0;
        s->first_sample = ds->n_samples;
        ds->n_samples += s->n_samples;
        ds->n_tokens += s->n_tokens;
    }
    globfree(&g);
    if (ds->n_samples == 0) {
        ct_error(CT_ERR_INPUT,
                 "data '%s' (%d shard%s, %lld tokens) holds no complete sample of "
                 "seq_len + 1 = %lld tokens",
                 pattern, ds->n_shards, ds->n_shards == 1 ? "" : "s", (long long)ds->n_tokens,
                 (long long)seq_len + 1);
        ct_hint("use more text, or a smaller model.seq_len (samples never cross shard files)");
        ct_dataset_free(ds);
        return CT_ERR_INPUT;
    }
    if (ds->n_samples > (int64_t)UINT32_MAX) {
        ct_error(CT_ERR_INPUT, "data '%s' holds %lld samples; at most %u are supported", pattern,
                 (long long)ds->n_samples, UINT32_MAX);
        ct_hint("use a larger model.seq_len");
        ct_dataset_free(ds);
        return CT_ERR_INPUT;
    }
    *out = ds;
    return CT_OK;
}

int64_t ct_dataset_n_samples(const ct_dataset *ds) {
    return ds->n_samples;
}
int64_t ct_dataset_n_tokens(const ct_dataset *ds) {
    return ds->n_tokens;
}

ct_status ct_dataset_check_tokens(const ct_dataset *ds) {
    for (int i = 0; i < ds->n_shards; i++) {
        const shard *s = &ds->shards[i];
        for (int64_t k = 0; k < s->n_tokens; k++) {
            int32_t t = shard_token(s, k);
            if (t < 0 || (uint32_t)t >= s->vocab) {
                ct_error(CT_ERR_INPUT,
                         "data shard %s is corrupt: token %u at position %lld is "
                         "outside its vocab_size %u",
                         s->path, (uint32_t)t, (long long)k, s->vocab);
                ct_hint("re-create it with `cooktrain prepare`");
                return CT_ERR_INPUT;
            }
        }
    }
    return CT_OK;
}

/* ---- sample order --------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/*
 * The permutation of `epoch`: Fisher–Yates where draw i is a hash of (seed, epoch, i). The
 * index is picked by a 128-bit multiply instead of rejection sampling; the bias is below
 * n / 2^64, and the draw count stays fixed, which keeps the permutation a simple function.
 */
static void dataset_permute(ct_dataset *ds, int64_t epoch) {
    uint64_t n = (uint64_t)ds->n_samples;
    if (!ds->perm) ds->perm = ct_xmalloc(n * sizeof *ds->perm);
    uint64_t key = splitmix64(splitmix64(ds->seed ^ 0x64617461u /* "data" */) ^ (uint64_t)epoch);
    for (uint64_t i = 0; i < n; i++) ds->perm[i] = (uint32_t)i;
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t r = splitmix64(key ^ splitmix64(i));
        uint64_t j = (uint64_t)(((unsigned __int128)r * (i + 1)) >> 64);
        uint32_t tmp = ds->perm[i];
        ds->perm[i] = ds->perm[j];
        ds->perm[j] = tmp;
    }
    ds->perm_epoch = epoch;
}

int64_t ct_dataset_sample_at(ct_dataset *ds, int64_t g) {
    CT_ASSERTF(g >= 0, "global sample index %lld is negative", (long long)g);
    int64_t epoch = g / ds->n_samples;
    if (epoch != ds->perm_epoch) dataset_permute(ds, epoch);
    return ds->perm[g % ds->n_samples];
}

/* Sample `sample` (file order) into in and tg (seq_len each). */
static ct_status read_sample(const ct_dataset *ds, int64_t sample, int32_t *in, int32_t *tg) {
    int64_t L = ds->seq_len;
    /* the last shard whose first sample is <= sample (shards without samples are skipped
     * because the next shard has the same first_sample) */
    int lo = 0, hi = ds->n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ds->shards[mid].first_sample <= sample)
            lo = mid;
        else
            hi = mid - 1;
    }
    const shard *s = &ds->shards[lo];
    CT_ASSERT(sample - s->first_sample < s->n_samples);
    int64_t start = (sample - s->first_sample) * L;
    /* Every token is checked as it is copied (the header's vocab_size is at most the model's,
     * checked at open): a corrupt id would otherwise index past the embedding, or silently read
     * a zero padding row. A compare per token costs nothing next to the step. */
    uint32_t worst = 0;
    int64_t worst_at = 0;
    int32_t prev = shard_token(s, start);
    for (int64_t k = 0; k <= L; k++) {
        int32_t tok = k == 0 ? prev : shard_token(s, start + k);
        if ((uint32_t)tok >= s->vocab && (uint32_t)tok >= worst) {
            worst = (uint32_t)tok;
            worst_at = start + k;
        }
        if (k == 0) continue;
        in[k - 1] = prev;
        tg[k - 1] = tok;
        prev = tok;
    }
    if (worst >= s->vocab) {
        ct_error(CT_ERR_INPUT,
                 "data shard %s is corrupt: token %u at position %lld (sample %lld) is not "
                 "below its vocab_size %u",
                 s->path, worst, (long long)worst_at, (long long)sample, s->vocab);
        ct_hint("re-create the shard with `cooktrain prepare`; `cooktrain` checks every token "
                "as it reads a sample");
        return CT_ERR_INPUT;
    }
    return CT_OK;
}

ct_status ct_dataset_fill(ct_dataset *ds, int64_t first, int64_t n_seq, int32_t *inputs,
                          int32_t *targets) {
    CT_ASSERTF(first >= 0 && n_seq >= 0, "first=%lld n_seq=%lld", (long long)first,
               (long long)n_seq);
    int64_t L = ds->seq_len;
    for (int64_t r = 0; r < n_seq; r++)
        CT_TRY(
            read_sample(ds, ct_dataset_sample_at(ds, first + r), inputs + r * L, targets + r * L));
    return CT_OK;
}

ct_status ct_dataset_fill_in_order(const ct_dataset *ds, int64_t first, int64_t n_seq,
                                   int32_t *inputs, int32_t *targets) {
    CT_ASSERTF(first >= 0 && n_seq >= 0 && first + n_seq <= ds->n_samples, "first=%lld n_seq=%lld",
               (long long)first, (long long)n_seq);
    int64_t L = ds->seq_len;
    for (int64_t r = 0; r < n_seq; r++)
        CT_TRY(read_sample(ds, first + r, inputs + r * L, targets + r * L));
    return CT_OK;
}
