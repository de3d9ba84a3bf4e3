/* checkpoint.c — the checkpoint format and its directory. See checkpoint.h. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define DATA_MAGIC "CTCKDATA"
#define MANIFEST_MAGIC "CTCKPTMF"
#define CKPT_VERSION 1u
#define CKPT_BOM 0x01020304u
#define HOST_IS_LE (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
enum {
    DATA_HEADER = 32,
    MANIFEST_HEADER = 64,
    PIECE_RECORD = 152,
    MAX_FILES = 1 << 20,    /* rank files a manifest may name (a million ranks) */
    CHUNK_FLOATS = 1 << 20, /* values read or converted at a time: 4 MiB (CT_CKPT_READ_BUFFER_BYTES
                               counts its two buffers) */
};

const char *const ct_ckpt_state_names[] = {
    "step",
    "samples_seen",
    "tokens_seen",
    "optimizer_step",
    "seed",
    "global_batch",
    "arch",
    "vocab_size",
    "vocab_pad",
    "seq_len",
    "n_layer",
    "d_model",
    "n_head",
    "n_kv_head",
    "d_ff",
    "world_size",
    "tp",
    "pp",
    "dp",
    "zero_stage",
    "virtual_stages",
    "precision",
    "format_version",
    "tokenizer_crc",
};
_Static_assert(sizeof ct_ckpt_state_names / sizeof ct_ckpt_state_names[0] == CT_CKPT_STATE_FIELDS,
               "a name for every state field");

const char *ct_ckpt_kind_name(ct_ckpt_kind kind) {
    switch (kind) {
    case CT_CKPT_WEIGHT: return "weight";
    case CT_CKPT_ADAM_M: return "adam_m";
    case CT_CKPT_ADAM_V: return "adam_v";
    default: return "?";
    }
}

void ct_ckpt_manifest_release(ct_ckpt_manifest *m) {
    free(m->pieces);
    free(m->config_text);
    memset(m, 0, sizeof *m);
}

static ct_status io_error(const char *what, const char *path) {
    ct_error(CT_ERR_RUNTIME, "checkpoint: cannot %s '%s': %s", what, path, strerror(errno));
    ct_hint("check free space and permissions where checkpoint.dir points");
    return CT_ERR_RUNTIME;
}

static ct_status corrupt(const char *path, const char *what) {
    ct_error(CT_ERR_INPUT, "checkpoint file '%s' is corrupt: %s", path, what);
    ct_hint("use another checkpoint (checkpoint.resume: PATH, or remove this one) or start over "
            "with checkpoint.resume: never");
    return CT_ERR_INPUT;
}

static ct_status fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return io_error("open for fsync", path);
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? CT_OK : io_error("fsync", path);
}

static int64_t box_width(const ct_ckpt_box *b) {
    return b->col1 - b->col0;
}

/* ---- writing ------------------------------------------------------------------------------ */

struct ct_ckpt_writer {
    FILE *f;
    char path[CT_PATH_MAX + 32];
    int rank;
    int64_t offset;
    uint8_t *buf; /* CHUNK_FLOATS values as bytes: big-endian hosts convert through it */
    bool failed;
};

static void rank_file(char *buf, size_t n, const char *dir, int rank) {
    snprintf(buf, n, "%s/rank-%05d.bin", dir, rank);
}

static void put_data_header(uint8_t *h, int rank) {
    memset(h, 0, DATA_HEADER);
    memcpy(h, DATA_MAGIC, 8);
    ct_put_le32(h + 8, CKPT_VERSION);
    ct_put_le32(h + 12, CKPT_BOM);
    ct_put_le32(h + 16, (uint32_t)rank);
}

ct_status ct_ckpt_writer_open(ct_ckpt_writer **out, const char *dir, int rank) {
    ct_ckpt_writer *w = ct_xcalloc(1, sizeof *w);
    rank_file(w->path, sizeof w->path, dir, rank);
    w->rank = rank;
    w->f = fopen(w->path, "wb");
    if (!w->f) {
        ct_status st = io_error("create", w->path);
        free(w);
        *out = NULL;
        return st;
    }
    uint8_t h[DATA_HEADER];
    put_data_header(h, rank);
    w->failed = fwrite(h, 1, sizeof h, w->f) != sizeof h;
    w->offset = DATA_HEADER;
    if (!HOST_IS_LE) w->buf = ct_xmalloc((size_t)CHUNK_FLOATS * 4);
    *out = w;
    return CT_OK;
}

ct_status ct_ckpt_writer_add(ct_ckpt_writer *w, ct_ckpt_piece *piece, const float *data) {
    const int64_t n = piece->box.hi - piece->box.lo;
    uint32_t crc = 0;
    /* On a little-endian host the values are their own file bytes: checksummed and written
     * straight from the caller's buffer, in large writes (one copy fewer; measured on the 124M
     * model: 376 MB/s through 4 MiB conversions, 479-592 MB/s this way = 0.85-1.00x the disk's
     * write of new data). Elsewhere they go through the conversion buffer. */
    const int64_t step = HOST_IS_LE ? (int64_t)1 << 26 : (int64_t)CHUNK_FLOATS;
    for (int64_t done = 0; done < n && !w->failed;) {
        int64_t c = CT_MIN(n - done, step);
        const uint8_t *bytes = (const uint8_t *)(data + done);
        if (!HOST_IS_LE) {
            ct_put_le_floats(w->buf, data + done, c);
            bytes = w->buf;
        }
        crc = ct_crc32(crc, bytes, (size_t)(4 * c));
        w->failed = fwrite(bytes, 4, (size_t)c, w->f) != (size_t)c;
        done += c;
    }
    if (w->failed) return io_error("write", w->path);
    piece->file = w->rank;
    piece->offset = w->offset;
    piece->crc = crc;
    w->offset += 4 * n;
    return CT_OK;
}

ct_status ct_ckpt_writer_close(ct_ckpt_writer *w) {
    if (!w) return CT_OK;
    bool ok = !w->failed && fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
    int err = errno;
    ok = fclose(w->f) == 0 && ok;
    errno = err;
    ct_status st = ok ? CT_OK : io_error("write", w->path);
    free(w->buf);
    free(w);
    return st;
}

struct ct_ckpt_mapped {
    char path[CT_PATH_MAX + 32];
    int fd, rank;
    uint8_t *map;
    int64_t values;
    size_t bytes;
    dev_t dev;
    ino_t ino;
};

ct_status ct_ckpt_mapped_open(ct_ckpt_mapped **out, const char *dir, int rank, int64_t values) {
    *out = NULL;
    ct_ckpt_mapped *m = ct_xcalloc(1, sizeof *m);
    rank_file(m->path, sizeof m->path, dir, rank);
    m->rank = rank;
    m->values = values;
    m->bytes = DATA_HEADER + 4 * (size_t)values;
    m->fd = open(m->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (m->fd < 0) {
        ct_status st = io_error("create", m->path);
        free(m);
        return st;
    }
    struct stat sb;
    int err = posix_fallocate(m->fd, 0, (off_t)m->bytes);
    if (err == 0 && fstat(m->fd, &sb) != 0) err = errno;
    if (err == 0) {
        m->map = mmap(NULL, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, m->fd, 0);
        if (m->map == MAP_FAILED) err = errno, m->map = NULL;
    }
    if (err != 0) {
        errno = err;
        ct_status st = io_error(m->map ? "map" : "reserve space for", m->path);
        ct_hint("a local checkpoint keeps this rank's state and its partners' in "
                "checkpoint.local_dir, three steps of them: give it room (or point it elsewhere)");
        close(m->fd);
        unlink(m->path);
        free(m);
        return st;
    }
    m->dev = sb.st_dev;
    m->ino = sb.st_ino;
    put_data_header(m->map, rank);
    *out = m;
    return CT_OK;
}

bool ct_ckpt_mapped_reuse(ct_ckpt_mapped *m, const char *dir, int rank, int64_t values) {
    char path[CT_PATH_MAX + 32];
    rank_file(path, sizeof path, dir, rank);
    struct stat sb;
    if (m->rank != rank || m->values != values || stat(path, &sb) != 0 || sb.st_dev != m->dev ||
        sb.st_ino != m->ino || (size_t)sb.st_size != m->bytes)
        return false;
    snprintf(m->path, sizeof m->path, "%s", path);
    put_data_header(m->map, rank);
    return true;
}

float *ct_ckpt_mapped_values(ct_ckpt_mapped *m) {
    return (float *)(m->map + DATA_HEADER); /* 32 bytes into a page: aligned for floats */
}

int64_t ct_ckpt_mapped_count(const ct_ckpt_mapped *m) {
    return m->values;
}

int ct_ckpt_mapped_rank(const ct_ckpt_mapped *m) {
    return m->rank;
}

void ct_ckpt_mapped_to_file_order(ct_ckpt_mapped *m) {
    if (HOST_IS_LE) return;
    float *v = ct_ckpt_mapped_values(m);
    for (int64_t i = 0; i < m->values; i++) {
        const float x = v[i];
        ct_put_le_floats((uint8_t *)&v[i], &x, 1);
    }
}

void ct_ckpt_mapped_piece(const ct_ckpt_mapped *m, ct_ckpt_piece *piece, int64_t at) {
    const int64_t n = piece->box.hi - piece->box.lo;
    CT_ASSERT(at >= 0 && at + n <= m->values);
    piece->file = m->rank;
    piece->offset = DATA_HEADER + 4 * at;
    piece->crc = ct_crc32(0, m->map + piece->offset, (size_t)(4 * n));
}

ct_status ct_ckpt_mapped_sync(ct_ckpt_mapped *m) {
    if (msync(m->map, m->bytes, MS_SYNC) != 0 || fsync(m->fd) != 0)
        return io_error("write", m->path);
    return CT_OK;
}

void ct_ckpt_mapped_close(ct_ckpt_mapped *m, bool remove) {
    if (!m) return;
    munmap(m->map, m->bytes);
    close(m->fd);
    if (remove) unlink(m->path);
    free(m);
}

static void put_box(uint8_t *p, const ct_ckpt_box *b) {
    memset(p, 0, CT_CKPT_NAME);
    memcpy(p, b->name, strnlen(b->name, CT_CKPT_NAME - 1));
    ct_put_le32(p + 64, (uint32_t)b->kind);
    const int64_t v[] = {b->rows, b->cols, b->row0, b->row1, b->col0, b->col1, b->lo, b->hi};
    for (int i = 0; i < 8; i++) ct_put_le64(p + 72 + 8 * i, (uint64_t)v[i]);
}

static void get_box(const uint8_t *p, ct_ckpt_box *b) {
    memset(b, 0, sizeof *b);
    memcpy(b->name, p, CT_CKPT_NAME - 1);
    b->kind = (int32_t)ct_get_le32(p + 64);
    int64_t *v[] = {&b->rows, &b->cols, &b->row0, &b->row1, &b->col0, &b->col1, &b->lo, &b->hi};
    for (int i = 0; i < 8; i++) *v[i] = (int64_t)ct_get_le64(p + 72 + 8 * i);
}

ct_status ct_ckpt_manifest_write(const char *dir, const ct_ckpt_manifest *m) {
    const size_t config_bytes = m->config_text ? strlen(m->config_text) : 0;
    const size_t state_bytes = 8 * (size_t)CT_CKPT_STATE_FIELDS;
    const size_t total =
        MANIFEST_HEADER + state_bytes + (size_t)m->n_pieces * PIECE_RECORD + config_bytes + 4;
    uint8_t *buf = ct_xcalloc(1, total), *p = buf;
    memcpy(p, MANIFEST_MAGIC, 8);
    ct_put_le32(p + 8, CKPT_VERSION);
    ct_put_le32(p + 12, CKPT_BOM);
    ct_put_le32(p + 16, (uint32_t)m->n_files);
    ct_put_le32(p + 20, (uint32_t)config_bytes);
    ct_put_le64(p + 24, (uint64_t)m->n_pieces);
    ct_put_le32(p + 32, (uint32_t)CT_CKPT_STATE_FIELDS);
    _Static_assert(sizeof CT_VERSION - 1 <= 16, "the manifest holds 16 bytes of version");
    memcpy(p + 40, CT_VERSION, sizeof CT_VERSION - 1);
    p += MANIFEST_HEADER;
    const int64_t *state = (const int64_t *)&m->state;
    for (int i = 0; i < CT_CKPT_STATE_FIELDS; i++, p += 8) ct_put_le64(p, (uint64_t)state[i]);
    for (int64_t i = 0; i < m->n_pieces; i++, p += PIECE_RECORD) {
        const ct_ckpt_piece *pc = &m->pieces[i];
        put_box(p, &pc->box);
        ct_put_le32(p + 68, (uint32_t)pc->file);
        ct_put_le64(p + 136, (uint64_t)pc->offset);
        ct_put_le32(p + 144, pc->crc);
    }
    memcpy(p, m->config_text, config_bytes);
    p += config_bytes;
    ct_put_le32(p, ct_crc32(0, buf, (size_t)(total - 4)));

    char path[CT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/manifest.bin", dir);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(buf);
        return io_error("create", path);
    }
    bool ok = fwrite(buf, 1, total, f) == total && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    free(buf);
    return ok ? CT_OK : io_error("write", path);
}

/* ---- the directory ------------------------------------------------------------------------ */

void ct_ckpt_crash_point(const char *point, int64_t step) {
    const char *want = getenv("COOKTRAIN_CKPT_CRASH");
    if (!want) return;
    size_t len = strlen(point);
    if (strncmp(want, point, len) != 0) return;
    if (want[len] == '@' ? strtoll(want + len + 1, NULL, 10) == step : want[len] == '\0')
        raise(SIGKILL);
}

void ct_ckpt_step_path(char *buf, size_t n, const char *root, int64_t step, bool tmp) {
    snprintf(buf, n, "%s/step-%08lld%s", root, (long long)step, tmp ? ".tmp" : "");
}

/* rm -r of a checkpoint directory: its files, then itself (they hold no subdirectories). The
 * directory is opened without following a symbolic link, and its entries are removed through
 * that descriptor: a step-N.tmp or step-N.old that someone made a link to another directory is
 * refused, never emptied (what it points to is not ours to delete), and a link inside it is
 * removed as a link. */
static ct_status remove_dir(const char *dir) {
    struct stat sb;
    if (lstat(dir, &sb) != 0) return errno == ENOENT ? CT_OK : io_error("stat", dir);
    if (!S_ISDIR(sb.st_mode)) {
        ct_error(CT_ERR_INPUT,
                 "checkpoint: '%s' is %s, not a directory a save left; refusing to "
                 "remove it",
                 dir, S_ISLNK(sb.st_mode) ? "a symbolic link" : ct_file_kind(sb.st_mode));
        ct_hint("a save writes and replaces step-N.tmp and step-N.old itself: move that entry "
                "out of the checkpoint directory");
        return CT_ERR_INPUT;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return io_error("open directory", dir);
    }
    struct dirent *e;
    char path[CT_PATH_MAX + 300];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(fd, e->d_name, 0) != 0) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            closedir(d);
            return io_error("remove", path);
        }
    }
    closedir(d);
    return rmdir(dir) == 0 ? CT_OK : io_error("remove directory", dir);
}

ct_status ct_ckpt_begin(const char *root, int64_t step) {
    char tmp[CT_PATH_MAX + 32], probe[CT_PATH_MAX + 48];
    snprintf(probe, sizeof probe, "%s/x", root);
    CT_TRY(ct_mkdir_parents(probe));
    ct_ckpt_step_path(tmp, sizeof tmp, root, step, true);
    CT_TRY(remove_dir(tmp));
    if (mkdir(tmp, 0755) != 0) return io_error("create directory", tmp);
    return CT_OK;
}

void ct_ckpt_discard(const char *root, int64_t step) {
    char tmp[CT_PATH_MAX + 32];
    ct_ckpt_step_path(tmp, sizeof tmp, root, step, true);
    if (remove_dir(tmp) != CT_OK) ct_error_clear();
}

ct_status ct_ckpt_publish(const char *root, int64_t step) {
    char tmp[CT_PATH_MAX + 32], final[CT_PATH_MAX + 32], latest[CT_PATH_MAX + 32];
    char latest_tmp[CT_PATH_MAX + 32];
    ct_ckpt_step_path(tmp, sizeof tmp, root, step, true);
    ct_ckpt_step_path(final, sizeof final, root, step, false);
    CT_TRY(fsync_path(tmp));
    /* A checkpoint of this step already there (a run resumed from it and saving at the same
     * step) is replaced: it stays complete until the rename of the new one. */
    char old[CT_PATH_MAX + 40];
    snprintf(old, sizeof old, "%s.old", final);
    CT_TRY(remove_dir(old));
    if (rename(final, old) != 0 && errno != ENOENT) return io_error("rename", final);
    if (rename(tmp, final) != 0) return io_error("rename", tmp);
    CT_TRY(fsync_path(root));
    ct_ckpt_crash_point("before-latest", step);
    snprintf(latest, sizeof latest, "%s/latest", root);
    snprintf(latest_tmp, sizeof latest_tmp, "%s/latest.tmp", root);
    FILE *f = fopen(latest_tmp, "w");
    if (!f) return io_error("create", latest_tmp);
    bool ok =
        fprintf(f, "step-%08lld\n", (long long)step) > 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok) return io_error("write", latest_tmp);
    if (rename(latest_tmp, latest) != 0) return io_error("rename", latest_tmp);
    CT_TRY(fsync_path(root));
    return remove_dir(old);
}

int ct_ckpt_steps(const char *root, int64_t **steps) {
    *steps = NULL;
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        if (strncmp(e->d_name, "step-", 5) != 0) continue;
        long long s = strtoll(e->d_name + 5, &end, 10);
        if (end == e->d_name + 5 || *end) continue; /* .tmp, .old and foreign names */
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            *steps = realloc(*steps, (size_t)cap * sizeof **steps);
            CT_ASSERT(*steps != NULL);
        }
        (*steps)[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of entries */
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            int64_t t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return n;
}

/* The step `latest` names, or -1. */
static int64_t latest_step(const char *root) {
    char path[CT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/latest", root);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long s = -1;
    if (fscanf(f, "step-%lld", &s) != 1) s = -1;
    fclose(f);
    return s;
}

ct_ckpt_state ct_ckpt_state_of(const ct_config *cfg, int64_t step, int64_t optimizer_step) {
    const ct_model_config *mc = &cfg->model;
    return (ct_ckpt_state){
        .step = step,
        .samples_seen = step * cfg->train.global_batch,
        .tokens_seen = step * cfg->train.global_batch * mc->seq_len,
        .optimizer_step = optimizer_step,
        .seed = (int64_t)cfg->train.seed,
        .global_batch = cfg->train.global_batch,
        .arch = mc->arch,
        .vocab_size = mc->vocab_size,
        .vocab_pad = mc->vocab_pad,
        .seq_len = mc->seq_len,
        .n_layer = mc->n_layer,
        .d_model = mc->d_model,
        .n_head = mc->n_head,
        .n_kv_head = cfg->derived.n_kv_head,
        .d_ff = cfg->derived.d_ff,
        .world_size = 1,
        .tp = 1,
        .pp = 1,
        .dp = 1,
        .zero_stage = cfg->parallel.zero_stage,
        .virtual_stages = cfg->parallel.virtual_stages,
        .precision = cfg->derived.precision,
        .format_version = 1,
    };
}

ct_status ct_ckpt_model_config(const char *dir, const ct_ckpt_manifest *m, ct_model_config *out) {
    ct_config cfg;
    ct_config_defaults(&cfg);
    if (!m->config_text || ct_config_load_string(&cfg, m->config_text, dir) != CT_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", m->config_text ? ct_error_message() : "none");
        ct_error_clear();
        ct_error(CT_ERR_INPUT, "checkpoint '%s': its config does not parse (%s)", dir, why);
        ct_hint("`cooktrain inspect DIR` shows a checkpoint's config; use one this cooktrain "
                "wrote");
        return CT_ERR_INPUT;
    }
    *out = cfg.model;
    return CT_OK;
}

void ct_ckpt_resolve(const char *path, char *out, size_t n) {
    char file[CT_PATH_MAX + 32];
    struct stat sb;
    snprintf(out, n, "%s", path);
    snprintf(file, sizeof file, "%s/manifest.bin", path);
    if (stat(file, &sb) == 0) return;
    snprintf(file, sizeof file, "%s/latest", path);
    uint8_t *text;
    size_t len;
    long long step = -1;
    if (stat(file, &sb) != 0 || ct_read_regular(file, "latest", 64, &text, &len) != CT_OK) {
        ct_error_clear();
        return;
    }
    if (sscanf((const char *)text, "step-%lld", &step) == 1 && step >= 0)
        ct_ckpt_step_path(out, n, path, step, false);
    free(text);
}

ct_status ct_ckpt_prune(const char *root, int64_t keep) {
    int64_t *steps;
    int n = ct_ckpt_steps(root, &steps);
    const int64_t latest = latest_step(root);
    ct_status st = CT_OK;
    char path[CT_PATH_MAX + 32];
    for (int i = 0; i + keep < n && st == CT_OK; i++) {
        if (steps[i] == latest) continue;
        ct_ckpt_step_path(path, sizeof path, root, steps[i], false);
        st = remove_dir(path);
    }
    free(steps);
    return st;
}

/* ---- reading ------------------------------------------------------------------------------ */

/* The largest manifest read: its size is the cap of everything allocated from it, and a real one
 * (152 bytes a piece) stays far below. */
#define MANIFEST_MAX_BYTES ((int64_t)256 << 20)

static ct_status read_file(const char *path, uint8_t **out, size_t *len) {
    ct_status st = ct_read_regular(path, "checkpoint manifest", MANIFEST_MAX_BYTES, out, len);
    if (st != CT_OK)
        ct_hint("a checkpoint directory holds manifest.bin and rank-*.bin files; is it complete? "
                "(`cooktrain inspect DIR` checks one)");
    return st;
}

/* Magic, version and byte-order mark of a header. */
static ct_status check_header(const char *path, const uint8_t *h, size_t len, const char *magic,
                              size_t header_bytes) {
    char what[160];
    if (len < header_bytes) {
        snprintf(what, sizeof what, "%zu bytes, shorter than its %zu-byte header", len,
                 header_bytes);
        return corrupt(path, what);
    }
    if (memcmp(h, magic, 8) != 0) {
        snprintf(what, sizeof what, "bad magic (expected \"%s\")", magic);
        return corrupt(path, what);
    }
    uint32_t version = ct_get_le32(h + 8), bom = ct_get_le32(h + 12);
    if (bom != CKPT_BOM) {
        snprintf(what, sizeof what, "byte-order mark 0x%08x, expected 0x%08x%s", bom, CKPT_BOM,
                 bom == 0x04030201u ? " (written with the other byte order)" : "");
        return corrupt(path, what);
    }
    if (version != CKPT_VERSION) {
        snprintf(what, sizeof what, "format version %u; this cooktrain reads version %u", version,
                 CKPT_VERSION);
        return corrupt(path, what);
    }
    return CT_OK;
}

static ct_status parse_manifest(const char *path, const uint8_t *buf, size_t len,
                                ct_ckpt_manifest *m) {
    char what[200];
    CT_TRY(check_header(path, buf, len, MANIFEST_MAGIC, MANIFEST_HEADER + 4));
    uint32_t stored = ct_get_le32(buf + len - 4);
    if (ct_crc32(0, buf, (size_t)(len - 4)) != stored)
        return corrupt(path, "checksum mismatch (the file was changed or cut short)");
    const uint32_t n_files = ct_get_le32(buf + 16);
    const int64_t config_bytes = ct_get_le32(buf + 20);
    m->n_pieces = (int64_t)ct_get_le64(buf + 24);
    const uint32_t n_state = ct_get_le32(buf + 32);
    memcpy(m->version, buf + 40, 16);
    m->version[16] = '\0';
    if (n_files < 1 || n_files > MAX_FILES) {
        snprintf(what, sizeof what, "field n_files is %u (1 to %d rank files)", n_files, MAX_FILES);
        return corrupt(path, what);
    }
    m->n_files = (int)n_files;
    /* need = header + 8·n_state + n_pieces·PIECE_RECORD + config + crc, every step checked: a
     * piece count chosen to wrap the product around 2^64 must not pass. */
    int64_t need = 0, records = 0;
    bool fits =
        m->n_pieces >= 0 && ct_mul_i64(m->n_pieces, PIECE_RECORD, &records) &&
        ct_add_i64(MANIFEST_HEADER + 8 * (int64_t)n_state + config_bytes + 4, records, &need);
    if (n_state != CT_CKPT_STATE_FIELDS || !fits || need != (int64_t)len) {
        snprintf(what, sizeof what,
                 "fields n_state %u, n_pieces %lld and config_bytes %lld do not fit its %zu bytes",
                 n_state, (long long)m->n_pieces, (long long)config_bytes, len);
        return corrupt(path, what);
    }
    const uint8_t *p = buf + MANIFEST_HEADER;
    int64_t *state = (int64_t *)&m->state;
    for (int i = 0; i < CT_CKPT_STATE_FIELDS; i++, p += 8) state[i] = (int64_t)ct_get_le64(p);
    m->pieces = ct_xcalloc((size_t)CT_MAX(m->n_pieces, 1), sizeof *m->pieces);
    for (int64_t i = 0; i < m->n_pieces; i++, p += PIECE_RECORD) {
        ct_ckpt_piece *pc = &m->pieces[i];
        get_box(p, &pc->box);
        pc->file = (int32_t)ct_get_le32(p + 68);
        pc->offset = (int64_t)ct_get_le64(p + 136);
        pc->crc = ct_get_le32(p + 144);
        const ct_ckpt_box *b = &pc->box;
        int64_t cells = 0, end = 0;
        bool ok = b->kind >= 0 && b->kind < CT_CKPT_KIND_COUNT && pc->file >= 0 &&
                  pc->file < m->n_files && 0 <= b->row0 && b->row0 < b->row1 &&
                  b->row1 <= b->rows && 0 <= b->col0 && b->col0 < b->col1 && b->col1 <= b->cols &&
                  ct_mul_i64(b->row1 - b->row0, box_width(b), &cells) && 0 <= b->lo &&
                  b->lo < b->hi && b->hi <= cells && pc->offset >= DATA_HEADER &&
                  ct_mul_i64(b->hi - b->lo, 4, &end) && ct_add_i64(pc->offset, end, &end);
        if (!ok) {
            snprintf(what, sizeof what, "piece %lld (%s) has an impossible box or file",
                     (long long)i, b->name);
            return corrupt(path, what);
        }
    }
    m->config_text = ct_xmalloc(config_bytes + 1);
    memcpy(m->config_text, p, config_bytes);
    m->config_text[config_bytes] = '\0';
    return CT_OK;
}

/* Opens rank file `file` of DIR and checks its header; its length into *len. */
static ct_status open_rank_file(const char *dir, int file, int *fd, int64_t *len) {
    char path[CT_PATH_MAX + 32];
    rank_file(path, sizeof path, dir, file);
    if (ct_open_regular(path, "checkpoint rank file", fd, len) != CT_OK) {
        ct_hint("a checkpoint needs every rank's file, each a regular file; use another "
                "checkpoint (checkpoint.resume: PATH) or checkpoint.resume: never");
        return CT_ERR_INPUT;
    }
    uint8_t h[DATA_HEADER];
    ssize_t got = pread(*fd, h, sizeof h, 0);
    ct_status s = check_header(path, h, got < 0 ? 0 : (size_t)got, DATA_MAGIC, DATA_HEADER);
    if (s == CT_OK && ct_get_le32(h + 16) != (uint32_t)file)
        s = corrupt(path, "header names another rank");
    if (s != CT_OK) close(*fd);
    return s;
}

static const ct_ckpt_piece *sort_pieces; /* qsort's context (one thread opens at a time) */

static int by_file_offset(const void *a, const void *b) {
    const ct_ckpt_piece *x = &sort_pieces[*(const int64_t *)a],
                        *y = &sort_pieces[*(const int64_t *)b];
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* No two pieces may share bytes of a rank file: each piece's bytes are its own values. */
static ct_status check_no_shared_bytes(const char *dir, const ct_ckpt_manifest *m) {
    int64_t *order = ct_xmalloc((size_t)CT_MAX(m->n_pieces, 1) * sizeof *order);
    for (int64_t i = 0; i < m->n_pieces; i++) order[i] = i;
    sort_pieces = m->pieces;
    qsort(order, (size_t)m->n_pieces, sizeof *order, by_file_offset);
    ct_status st = CT_OK;
    for (int64_t i = 1; i < m->n_pieces && st == CT_OK; i++) {
        const ct_ckpt_piece *a = &m->pieces[order[i - 1]], *b = &m->pieces[order[i]];
        if (a->file == b->file && a->offset + 4 * (a->box.hi - a->box.lo) > b->offset) {
            char path[CT_PATH_MAX + 32], what[200];
            snprintf(path, sizeof path, "%s/manifest.bin", dir);
            snprintf(
                what, sizeof what, "pieces %lld (%s) and %lld (%s) share bytes of rank file %d",
                (long long)order[i - 1], a->box.name, (long long)order[i], b->box.name, a->file);
            st = corrupt(path, what);
        }
    }
    free(order);
    return st;
}

ct_status ct_ckpt_open_manifest(const char *dir, ct_ckpt_manifest *m) {
    memset(m, 0, sizeof *m);
    char path[CT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/manifest.bin", dir);
    uint8_t *buf;
    size_t len;
    CT_TRY(read_file(path, &buf, &len));
    ct_status st = parse_manifest(path, buf, len, m);
    free(buf);
    if (st != CT_OK) ct_ckpt_manifest_release(m);
    return st;
}

ct_status ct_ckpt_open(const char *dir, ct_ckpt_manifest *m) {
    char path[CT_PATH_MAX + 32];
    CT_TRY(ct_ckpt_open_manifest(dir, m));
    ct_status st = CT_OK;
    /* Every rank file: present, its header right, long enough for the pieces it holds. */
    int64_t *need = ct_xcalloc((size_t)CT_MAX(m->n_files, 1), sizeof *need);
    for (int64_t i = 0; st == CT_OK && i < m->n_pieces; i++) {
        const ct_ckpt_piece *pc = &m->pieces[i];
        need[pc->file] = CT_MAX(need[pc->file], pc->offset + 4 * (pc->box.hi - pc->box.lo));
    }
    for (int f = 0; st == CT_OK && f < m->n_files; f++) {
        int fd;
        int64_t flen;
        st = open_rank_file(dir, f, &fd, &flen);
        if (st != CT_OK) break;
        close(fd);
        if (flen < need[f]) {
            char what[160];
            rank_file(path, sizeof path, dir, f);
            snprintf(what, sizeof what, "truncated: %lld bytes, its pieces need %lld",
                     (long long)flen, (long long)need[f]);
            st = corrupt(path, what);
        }
    }
    free(need);
    if (st == CT_OK) st = check_no_shared_bytes(dir, m);
    if (st != CT_OK) ct_ckpt_manifest_release(m);
    return st;
}

static bool same_tensor(const ct_ckpt_box *a, const ct_ckpt_box *b) {
    return a->kind == b->kind && !strncmp(a->name, b->name, CT_CKPT_NAME);
}

/* qsort order of box pointers: by name, then kind (same_tensor's pieces end up adjacent). */
static int by_tensor(const void *pa, const void *pb) {
    const ct_ckpt_box *a = *(const ct_ckpt_box *const *)pa, *b = *(const ct_ckpt_box *const *)pb;
    int c = strncmp(a->name, b->name, CT_CKPT_NAME);
    return c ? c : (a->kind > b->kind) - (a->kind < b->kind);
}

/* Copies the values of a piece's flat range [f0, f0 + n) (in `vals`) that `want` needs into
 * out, marking them in seen (one byte per element of want); returns how many it copied, or -1
 * when one was already there (two pieces cover the same element). Walks the piece's rows: each
 * row's run of columns, clipped to want's box, is one contiguous run of want's row-major order,
 * clipped again to [lo, hi). */
static int64_t scatter(const ct_ckpt_box *have, int64_t f0, const float *vals, int64_t n,
                       const ct_ckpt_box *want, float *out, uint8_t *seen) {
    const int64_t hw = box_width(have), ww = box_width(want);
    int64_t copied = 0;
    for (int64_t f = f0; f < f0 + n;) {
        const int64_t row = have->row0 + f / hw, col = have->col0 + f % hw;
        const int64_t run = CT_MIN(f0 + n, (f / hw + 1) * hw) - f; /* to the end of the row */
        if (row >= want->row0 && row < want->row1) {
            int64_t c0 = CT_MAX(col, want->col0), c1 = CT_MIN(col + run, want->col1);
            int64_t w0 = (row - want->row0) * ww + (c0 - want->col0);
            int64_t a = CT_MAX(w0, want->lo), b = CT_MIN(w0 + (c1 - c0), want->hi);
            if (b > a) {
                for (int64_t e = a - want->lo; e < b - want->lo; e++) {
                    if (seen[e]) return -1;
                    seen[e] = 1;
                }
                memcpy(out + (a - want->lo), vals + (f - f0) + (c0 - col) + (a - w0),
                       (size_t)(b - a) * sizeof(float));
                copied += b - a;
            }
        }
        f += run;
    }
    return copied;
}

/* Whether a piece can hold any of want's elements (their boxes meet). */
static bool boxes_meet(const ct_ckpt_box *a, const ct_ckpt_box *b) {
    return a->row0 < b->row1 && b->row0 < a->row1 && a->col0 < b->col1 && b->col0 < a->col1;
}

/* Reads one piece whole, in chunks, checking its checksum; scatters what `want` needs. */
/* Reads piece pc whole, `chunk` values at a time through bytes (and vals, when want is given),
 * checking its checksum; with want, scatters what falls inside it into out. */
static ct_status read_piece(const char *dir, const ct_ckpt_piece *pc, const ct_ckpt_box *want,
                            float *out, uint8_t *seen, int64_t *copied, int64_t chunk,
                            uint8_t *bytes, float *vals) {
    char path[CT_PATH_MAX + 32];
    rank_file(path, sizeof path, dir, pc->file);
    int fd;
    int64_t flen;
    CT_TRY(open_rank_file(dir, pc->file, &fd, &flen));
    const int64_t n = pc->box.hi - pc->box.lo;
    uint32_t crc = 0;
    ct_status st = CT_OK;
    for (int64_t done = 0; done < n;) {
        int64_t c = CT_MIN(n - done, chunk);
        ssize_t got = pread(fd, bytes, (size_t)(4 * c), (off_t)(pc->offset + 4 * done));
        if (got != (ssize_t)(4 * c)) {
            st = corrupt(path, "short read (truncated?)");
            break;
        }
        crc = ct_crc32(crc, bytes, (size_t)(4 * c));
        if (want) {
            ct_get_le_floats(vals, bytes, c);
            int64_t k = scatter(&pc->box, pc->box.lo + done, vals, c, want, out, seen);
            if (k < 0) {
                st = corrupt(path, "two pieces of its manifest cover the same elements");
                break;
            }
            *copied += k;
        }
        done += c;
    }
    close(fd);
    if (st == CT_OK && crc != pc->crc) {
        ct_error(CT_ERR_INPUT,
                 "checkpoint file '%s' is corrupt: the checksum of tensor %s (%s) does not match",
                 path, pc->box.name, ct_ckpt_kind_name((ct_ckpt_kind)pc->box.kind));
        ct_hint("use another checkpoint (checkpoint.resume: PATH) or start over with "
                "checkpoint.resume: never");
        st = CT_ERR_INPUT;
    }
    return st;
}

/* The chunk for reading pieces of at most n values: CHUNK_FLOATS, or less for small pieces. */
static int64_t chunk_for(int64_t n) {
    return CT_MAX(CT_MIN(n, (int64_t)CHUNK_FLOATS), 1);
}

ct_status ct_ckpt_read_box(const char *dir, const ct_ckpt_manifest *m, const ct_ckpt_box *want,
                           float *out) {
    int64_t largest = 0; /* the buffers fit the largest piece read, up to CHUNK_FLOATS */
    for (int64_t i = 0; i < m->n_pieces; i++)
        if (same_tensor(&m->pieces[i].box, want) && boxes_meet(&m->pieces[i].box, want))
            largest = CT_MAX(largest, m->pieces[i].box.hi - m->pieces[i].box.lo);
    const int64_t chunk = chunk_for(largest);
    uint8_t *bytes = ct_xmalloc((size_t)chunk * 4);
    float *vals = ct_xmalloc((size_t)chunk * sizeof(float));
    int64_t copied = 0;
    bool shape_ok = true;
    ct_status st = CT_OK;
    uint8_t *seen = ct_xcalloc((size_t)CT_MAX(want->hi - want->lo, 1), 1);
    for (int64_t i = 0; i < m->n_pieces && st == CT_OK; i++) {
        const ct_ckpt_piece *pc = &m->pieces[i];
        if (!same_tensor(&pc->box, want)) continue;
        if (pc->box.rows != want->rows || pc->box.cols != want->cols) {
            shape_ok = false;
            break;
        }
        if (boxes_meet(&pc->box, want))
            st = read_piece(dir, pc, want, out, seen, &copied, chunk, bytes, vals);
    }
    free(seen);
    free(bytes);
    free(vals);
    if (st != CT_OK) return st;
    if (!shape_ok || copied != want->hi - want->lo) {
        ct_error(CT_ERR_INPUT,
                 "checkpoint '%s' does not hold tensor %s (%s) as this run needs it: %s", dir,
                 want->name, ct_ckpt_kind_name((ct_ckpt_kind)want->kind),
                 shape_ok ? "elements are missing" : "its shape differs");
        ct_hint("the checkpoint comes from another model or is incomplete; use another one or "
                "checkpoint.resume: never");
        return CT_ERR_INPUT;
    }
    return CT_OK;
}

int ct_ckpt_candidates(const char *root, const char *resume, char ***out) {
    *out = NULL;
    if (!strcmp(resume, "never")) return 0;
    if (strcmp(resume, "auto") != 0) {
        *out = ct_xcalloc(1, sizeof **out);
        (*out)[0] = ct_xstrdup(resume);
        return 1;
    }
    if (!root[0]) return 0;
    /* Every complete checkpoint, newest first: a step-N directory exists only once its save
     * finished (the rename is the last step of a save but for `latest`, which a crash can leave
     * naming the one before). */
    int64_t *steps;
    int count = ct_ckpt_steps(root, &steps);
    *out = ct_xcalloc((size_t)CT_MAX(count, 1), sizeof **out);
    char path[CT_PATH_MAX + 32];
    for (int i = 0; i < count; i++) {
        ct_ckpt_step_path(path, sizeof path, root, steps[count - 1 - i], false);
        (*out)[i] = ct_xstrdup(path);
    }
    free(steps);
    return count;
}

ct_status ct_ckpt_verify_file(const char *dir, const ct_ckpt_manifest *m, int file) {
    int64_t largest = 0;
    for (int64_t i = 0; i < m->n_pieces; i++)
        if (m->pieces[i].file == file)
            largest = CT_MAX(largest, m->pieces[i].box.hi - m->pieces[i].box.lo);
    const int64_t chunk = chunk_for(largest);
    uint8_t *bytes = ct_xmalloc((size_t)chunk * 4);
    ct_status st = CT_OK;
    int64_t copied = 0;
    for (int64_t i = 0; i < m->n_pieces && st == CT_OK; i++)
        if (m->pieces[i].file == file)
            st = read_piece(dir, &m->pieces[i], NULL, NULL, NULL, &copied, chunk, bytes, NULL);
    free(bytes);
    return st;
}

ct_status ct_ckpt_inspect(const char *dir, FILE *out) {
    ct_ckpt_manifest m;
    CT_TRY(ct_ckpt_open(dir, &m));
    fprintf(out, "checkpoint %s: format %u, written by cooktrain %s, %d rank files, %lld pieces\n",
            dir, CKPT_VERSION, m.version, m.n_files, (long long)m.n_pieces);
    const int64_t *state = (const int64_t *)&m.state;
    for (int i = 0; i < CT_CKPT_STATE_FIELDS; i++) {
        /* the enumerations also by name */
        const int64_t v = state[i];
        const char *name = "";
        if (&state[i] == &m.state.arch)
            name = v == CT_ARCH_GPT2 ? " (gpt2)" : v == CT_ARCH_LLAMA ? " (llama)" : " (unknown)";
        else if (&state[i] == &m.state.precision)
            name = v == CT_PRECISION_FP32   ? " (fp32)"
                   : v == CT_PRECISION_BF16 ? " (bf16)"
                                            : " (unknown)";
        else if (&state[i] == &m.state.dp)
            name = " (replicas: dp x cp)";
        fprintf(out, "  %-15s %lld%s\n", ct_ckpt_state_names[i], (long long)v, name);
    }
    /* Tensors: distinct (name, kind) with their elements over all pieces; counted after a
     * sort (n log n: a hostile manifest may name millions of pieces). */
    int64_t elems[CT_CKPT_KIND_COUNT] = {0}, tensors = 0;
    const ct_ckpt_box **boxes = ct_xmalloc(sizeof *boxes * (size_t)CT_MAX(m.n_pieces, 1));
    for (int64_t i = 0; i < m.n_pieces; i++) {
        boxes[i] = &m.pieces[i].box;
        elems[boxes[i]->kind] += boxes[i]->hi - boxes[i]->lo;
    }
    qsort(boxes, (size_t)m.n_pieces, sizeof *boxes, by_tensor);
    for (int64_t i = 0; i < m.n_pieces; i++)
        tensors += i == 0 || !same_tensor(boxes[i - 1], boxes[i]);
    free(boxes);
    fprintf(out, "  %lld tensors;", (long long)tensors);
    for (int k = 0; k < CT_CKPT_KIND_COUNT; k++)
        fprintf(out, " %s %lld values%s", ct_ckpt_kind_name((ct_ckpt_kind)k), (long long)elems[k],
                k + 1 < CT_CKPT_KIND_COUNT ? "," : "\n");
    int64_t largest = 0;
    for (int64_t i = 0; i < m.n_pieces; i++)
        largest = CT_MAX(largest, m.pieces[i].box.hi - m.pieces[i].box.lo);
    const int64_t chunk = chunk_for(largest);
    uint8_t *bytes = ct_xmalloc((size_t)chunk * 4);
    ct_status st = CT_OK;
    int64_t copied = 0;
    for (int64_t i = 0; i < m.n_pieces && st == CT_OK; i++)
        st = read_piece(dir, &m.pieces[i], NULL, NULL, NULL, &copied, chunk, bytes, NULL);
    free(bytes);
    if (st == CT_OK)
        fprintf(out, "  every checksum verified (%lld pieces)\n", (long long)m.n_pieces);
    ct_ckpt_manifest_release(&m);
    return st;
}
