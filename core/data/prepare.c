/*
 * prepare.c — `cooktrain prepare`: text files → tokenizer.bin, train.bin, val.bin.
 * See prepare.h for the options and what lands where.
 *
 * Everything is held in memory (the text, then its tokens): the corpora this is meant for are
 * megabytes to a few gigabytes, and one pass each for training and encoding keeps it simple.
 */
#include "prepare.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data.h"
#include "tokenizer.h"

/* The options, checked: byte-level caps the vocabulary at the 256 bytes. */
static ct_status check_options(ct_prepare_options *a) {
    if (a->n_inputs == 0) {
        ct_error(CT_ERR_INPUT, "prepare: no --input given");
        ct_hint("give the text to read: --input FILE|DIR...");
        return CT_ERR_INPUT;
    }
    if (!a->out_dir || !a->out_dir[0]) {
        ct_error(CT_ERR_INPUT, "prepare: no --out directory given");
        ct_hint("give the directory to write tokenizer.bin, train.bin and val.bin into: --out DIR");
        return CT_ERR_INPUT;
    }
    if (!a->byte_level && a->vocab_size < 256) {
        ct_error(CT_ERR_INPUT, "--vocab-size '%d' is below 256, the number of byte tokens",
                 a->vocab_size);
        ct_hint("use --vocab-size >= 256, or --byte-level for a byte vocabulary without merges");
        return CT_ERR_INPUT;
    }
    if (a->replace_unknown && !a->byte_level) {
        ct_error(CT_ERR_INPUT, "prepare: --replace-unknown is an option of --byte-level");
        ct_hint("add --byte-level (a BPE vocabulary holds every byte already)");
        return CT_ERR_INPUT;
    }
    if (!(a->val_fraction >= 0.0 && a->val_fraction < 1.0)) {
        ct_error(CT_ERR_INPUT, "--val-fraction '%g' is not a number in [0, 1)", a->val_fraction);
        ct_hint("e.g. --val-fraction 0.05 keeps the last 5%% of the text for validation");
        return CT_ERR_INPUT;
    }
    if (a->byte_level && a->vocab_size > 256) a->vocab_size = 256;
    return CT_OK;
}

/* ---- reading the corpus --------------------------------------------------------------------- */

typedef struct text_buf {
    uint8_t *data;
    size_t n, cap;
    int n_files;
} text_buf;

static void text_reserve(text_buf *t, size_t extra) {
    if (t->n + extra <= t->cap) return;
    size_t cap = t->cap ? t->cap : 1 << 20;
    while (cap < t->n + extra) cap *= 2;
    t->data = realloc(t->data, cap);
    CT_ASSERTF(t->data, "out of host memory (%zu bytes of text)", cap);
    t->cap = cap;
}

static ct_status read_file(text_buf *t, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ct_error(CT_ERR_INPUT, "cannot open input %s: %s", path, strerror(errno));
        ct_hint("check the path given to --input");
        return CT_ERR_INPUT;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        fclose(f);
        ct_error(CT_ERR_INPUT, "cannot stat input %s: %s", path, strerror(errno));
        ct_hint("check the path given to --input");
        return CT_ERR_INPUT;
    }
    if (t->n_files > 0) {
        text_reserve(t, 1);
        t->data[t->n++] = '\n';
    }
    /* The size is a hint (the file may grow or be a pipe-like special file); read to EOF. */
    text_reserve(t, (size_t)sb.st_size + 1);
    for (;;) {
        text_reserve(t, 1 << 16);
        size_t r = fread(t->data + t->n, 1, t->cap - t->n, f);
        t->n += r;
        if (r == 0) break;
    }
    bool failed = ferror(f) != 0;
    fclose(f);
    if (failed) {
        ct_error(CT_ERR_INPUT, "read error on input %s", path);
        ct_hint("check that the file is readable");
        return CT_ERR_INPUT;
    }
    t->n_files++;
    return CT_OK;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads every regular file in dir whose name has no '.', in name order. */
static ct_status read_dir(text_buf *t, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        ct_error(CT_ERR_INPUT, "cannot open input directory %s: %s", dir, strerror(errno));
        ct_hint("check the path given to --input");
        return CT_ERR_INPUT;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strchr(e->d_name, '.')) continue; /* ".", "..", hidden files, x.dat, x.u8, x.txt */
        size_t plen = strlen(dir) + strlen(e->d_name) + 2;
        char *path = ct_xmalloc(plen);
        snprintf(path, plen, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            free(path);
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            names = realloc(names, cap * sizeof *names);
            CT_ASSERTF(names, "out of host memory");
        }
        names[n++] = path;
    }
    closedir(d);
    if (n == 0) {
        free(names);
        ct_error(CT_ERR_INPUT, "input directory %s holds no file without a '.' in its name", dir);
        ct_hint("name the text files directly with --input FILE..., or rename them");
        return CT_ERR_INPUT;
    }
    qsort(names, n, sizeof *names, compare_names);
    ct_status st = CT_OK;
    for (size_t i = 0; i < n; i++) {
        if (st == CT_OK) st = read_file(t, names[i]);
        free(names[i]);
    }
    free(names);
    return st;
}

/* ---- output --------------------------------------------------------------------------------- */

static ct_status make_dirs(const char *dir) {
    char *p = ct_xstrdup(dir);
    ct_status st = CT_OK;
    for (char *s = p + 1;; s++) {
        bool end = *s == '\0';
        if (*s == '/' || end) {
            char saved = *s;
            *s = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                ct_error(CT_ERR_INPUT, "cannot create output directory %s: %s", p, strerror(errno));
                ct_hint("choose a writable --out directory");
                st = CT_ERR_INPUT;
                break;
            }
            *s = saved;
        }
        if (end) break;
    }
    free(p);
    if (st != CT_OK) return st;
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        ct_error(CT_ERR_INPUT, "--out %s exists and is not a directory", dir);
        ct_hint("choose another --out directory");
        return CT_ERR_INPUT;
    }
    return CT_OK;
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = ct_xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Where train ends: the nominal cut moved to just after a newline, so no line is split. */
static size_t split_point(const uint8_t *text, size_t n, double val_fraction) {
    if (val_fraction <= 0.0 || n == 0) return n;
    size_t cut = (size_t)((1.0 - val_fraction) * (double)n);
    if (cut >= n) cut = n - 1;
    for (size_t p = cut; p + 1 < n; p++)
        if (text[p] == '\n') return p + 1;
    for (size_t p = cut; p > 0; p--)
        if (text[p - 1] == '\n') return p;
    return cut;
}

/* --byte-level: shards whose tokens are the bytes themselves; vocab_size must exceed every
 * byte of the text, or with --replace-unknown those that do not become spaces. The tokenizer
 * written beside them is the 256 bytes without merges, for `sample` and `eval`. */
static ct_status prepare_bytes(const ct_prepare_options *a, text_buf *text, size_t n_train) {
    if (a->replace_unknown) {
        size_t replaced = 0;
        for (size_t i = 0; i < text->n; i++) {
            uint8_t b = text->data[i];
            if (b == '\t' || b == '\n' || (b >= ' ' && b < a->vocab_size)) continue;
            text->data[i] = ' ';
            replaced++;
        }
        printf("prepare: %zu of %zu bytes outside tab, newline and 32..%d replaced by a space\n",
               replaced, text->n, a->vocab_size - 1);
    }
    int max_byte = 0;
    for (size_t i = 0; i < text->n; i++) max_byte = CT_MAX(max_byte, (int)text->data[i]);
    if (max_byte >= a->vocab_size) {
        ct_error(CT_ERR_INPUT, "--byte-level: the text holds byte %d but --vocab-size is %d",
                 max_byte, a->vocab_size);
        ct_hint("raise --vocab-size to at least %d, or add --replace-unknown to make such bytes "
                "spaces",
                max_byte + 1);
        return CT_ERR_INPUT;
    }
    int32_t *tokens = ct_xmalloc((text->n + 1) * sizeof(int32_t));
    for (size_t i = 0; i < text->n; i++) tokens[i] = text->data[i];
    char *train_path = join_path(a->out_dir, "train.bin");
    char *val_path = join_path(a->out_dir, "val.bin");
    char *tok_path = join_path(a->out_dir, "tokenizer.bin");
    ct_tokenizer *tok = NULL;
    ct_status st = ct_tokenizer_train(&tok, NULL, 0, 256); /* the bytes, no merges */
    if (st == CT_OK) st = ct_tokenizer_save(tok, tok_path);
    ct_tokenizer_free(tok);
    free(tok_path);
    if (st == CT_OK) st = ct_shard_write(train_path, tokens, n_train, a->vocab_size);
    if (st == CT_OK)
        st = ct_shard_write(val_path, tokens + n_train, text->n - n_train, a->vocab_size);
    if (st == CT_OK)
        printf("prepare: byte-level, vocab %d: train %zu tokens, val %zu tokens -> %s\n",
               a->vocab_size, n_train, text->n - n_train, a->out_dir);
    free(tokens);
    free(train_path);
    free(val_path);
    return st;
}

ct_status ct_prepare_run(const ct_prepare_options *options) {
    ct_prepare_options a = *options;
    ct_status st = check_options(&a);
    if (st != CT_OK) return st;

    double t_read = ct_now();
    text_buf text = {0};
    for (int i = 0; i < a.n_inputs && st == CT_OK; i++) {
        struct stat sb;
        if (stat(a.inputs[i], &sb) != 0) {
            ct_error(CT_ERR_INPUT, "input %s: %s", a.inputs[i], strerror(errno));
            ct_hint("check the path given to --input");
            st = CT_ERR_INPUT;
        } else if (S_ISDIR(sb.st_mode)) {
            st = read_dir(&text, a.inputs[i]);
        } else {
            st = read_file(&text, a.inputs[i]);
        }
    }
    if (st == CT_OK && text.n == 0) {
        ct_error(CT_ERR_INPUT, "the inputs hold no text (0 bytes in %d file%s)", text.n_files,
                 text.n_files == 1 ? "" : "s");
        ct_hint("give --input files that contain text");
        st = CT_ERR_INPUT;
    }
    if (st == CT_OK) st = make_dirs(a.out_dir);
    if (st != CT_OK) {
        free(text.data);
        return st;
    }
    t_read = ct_now() - t_read;

    size_t n_train = split_point(text.data, text.n, a.val_fraction);
    if (a.byte_level) {
        st = prepare_bytes(&a, &text, n_train);
        free(text.data);
        return st;
    }
    double t_train = ct_now();
    ct_tokenizer *tok = NULL;
    st = ct_tokenizer_train(&tok, text.data, n_train, a.vocab_size);
    t_train = ct_now() - t_train;
    char *tok_path = join_path(a.out_dir, "tokenizer.bin");
    char *train_path = join_path(a.out_dir, "train.bin");
    char *val_path = join_path(a.out_dir, "val.bin");
    if (st == CT_OK) st = ct_tokenizer_save(tok, tok_path);

    int32_t *train_tokens = NULL, *val_tokens = NULL;
    size_t n_train_tok = 0, n_val_tok = 0;
    double t_encode = 0.0;
    if (st == CT_OK) {
        t_encode = ct_now();
        n_train_tok = ct_tokenizer_encode(tok, text.data, n_train, &train_tokens);
        n_val_tok = ct_tokenizer_encode(tok, text.data + n_train, text.n - n_train, &val_tokens);
        t_encode = ct_now() - t_encode;
        int vocab = ct_tokenizer_vocab_size(tok);
        st = ct_shard_write(train_path, train_tokens, n_train_tok, vocab);
        if (st == CT_OK) st = ct_shard_write(val_path, val_tokens, n_val_tok, vocab);
    }
    if (st == CT_OK) {
        int vocab = ct_tokenizer_vocab_size(tok);
        size_t n_tok = n_train_tok + n_val_tok;
        printf("prepare: read %zu bytes from %d file%s in %.2f s\n", text.n, text.n_files,
               text.n_files == 1 ? "" : "s", t_read);
        printf("prepare: tokenizer: %d tokens (asked %d) trained on %zu bytes in %.2f s -> %s\n",
               vocab, a.vocab_size, n_train, t_train, tok_path);
        if (vocab < a.vocab_size)
            printf("prepare: note: the text repeats too few pairs for %d tokens; set "
                   "model.vocab_size >= %d\n",
                   a.vocab_size, vocab);
        printf("prepare: tokens: train %zu, val %zu; %.3f bytes/token; encoded in %.2f s "
               "(%.1f MB/s)\n",
               n_train_tok, n_val_tok, n_tok ? (double)text.n / (double)n_tok : 0.0, t_encode,
               t_encode > 0 ? (double)text.n / t_encode / 1e6 : 0.0);
        printf("prepare: wrote %s and %s\n", train_path, val_path);
    }
    free(train_tokens);
    free(val_tokens);
    free(tok_path);
    free(train_path);
    free(val_path);
    ct_tokenizer_free(tok);
    free(text.data);
    return st;
}
