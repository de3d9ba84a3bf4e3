/*
 * fuzz_ckpt.c — a checkpoint directory (core/io/checkpoint.c), built as two targets:
 *   fuzz_manifest   the input is manifest.bin, re-signed (its last 4 bytes replaced by the crc32
 *                   of the rest, as an attacker who knows the format does), so the fields behind
 *                   the checksum are reached; the rank files are a real checkpoint's;
 *   fuzz_rankfile   (-DFUZZ_RANKFILE) the input is rank-00000.bin under a real manifest.
 * Then ct_ckpt_open, every piece read back through ct_ckpt_read_box (and each whole tensor when
 * it is small), and `cooktrain inspect`'s ct_ckpt_inspect, as a resume and inspect do. The real
 * checkpoint: two rank files, tensors "a" (4 x 6) split by rows and "b" (3 x 5) whole, weights
 * and Adam moments. Seeds: its manifest.bin or rank-00000.bin.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/checkpoint.h"
#include "test/fuzz/fuzz.h"

static ct_ckpt_piece piece(const char *name, int kind, int64_t rows, int64_t cols, int64_t row0,
                           int64_t row1) {
    ct_ckpt_piece p;
    memset(&p, 0, sizeof p);
    snprintf(p.box.name, sizeof p.box.name, "%s", name);
    p.box.kind = kind;
    p.box.rows = rows, p.box.cols = cols;
    p.box.row0 = row0, p.box.row1 = row1, p.box.col0 = 0, p.box.col1 = cols;
    p.box.lo = 0, p.box.hi = (row1 - row0) * cols;
    return p;
}

/* A real checkpoint in dir: rank-00000.bin, rank-00001.bin and manifest.bin. */
static void write_checkpoint(const char *dir) {
    ct_ckpt_piece pieces[] = {
        piece("a", CT_CKPT_WEIGHT, 4, 6, 0, 2), piece("a", CT_CKPT_ADAM_M, 4, 6, 0, 2),
        piece("a", CT_CKPT_WEIGHT, 4, 6, 2, 4), piece("a", CT_CKPT_ADAM_M, 4, 6, 2, 4),
        piece("b", CT_CKPT_WEIGHT, 3, 5, 0, 3), piece("b", CT_CKPT_ADAM_V, 3, 5, 0, 3),
    };
    const int n = (int)(sizeof pieces / sizeof pieces[0]), file_of[] = {0, 0, 1, 1, 1, 1};
    float vals[24];
    for (int i = 0; i < 24; i++) vals[i] = 0.25f * (float)i - 1.0f;
    for (int f = 0; f < 2; f++) {
        ct_ckpt_writer *w;
        if (ct_ckpt_writer_open(&w, dir, f) != CT_OK) goto fail;
        for (int i = 0; i < n; i++)
            if (file_of[i] == f && ct_ckpt_writer_add(w, &pieces[i], vals) != CT_OK) goto fail;
        if (ct_ckpt_writer_close(w) != CT_OK) goto fail;
    }
    ct_ckpt_manifest m;
    memset(&m, 0, sizeof m);
    m.state.step = 2, m.state.samples_seen = 8, m.state.tokens_seen = 64,
    m.state.optimizer_step = 2;
    m.state.global_batch = 4, m.state.seq_len = 8, m.state.world_size = 2, m.state.tp = 1;
    m.state.pp = 1, m.state.dp = 2, m.state.virtual_stages = 1, m.state.format_version = 1;
    m.n_files = 2;
    m.n_pieces = n;
    m.pieces = pieces;
    m.config_text = "model:\n  n_layer: 1\n";
    if (ct_ckpt_manifest_write(dir, &m) == CT_OK) return;
fail:
    ct_error_print();
    abort();
}

static char ckpt[256];

void fuzz_setup(void) {
    snprintf(ckpt, sizeof ckpt, "%s", fuzz_dir());
    write_checkpoint(ckpt);
}

void fuzz_seeds(const char *dir) {
    write_checkpoint(fuzz_dir());
    size_t n;
#ifdef FUZZ_RANKFILE
    const char *name = "rank-00000.bin";
#else
    const char *name = "manifest.bin";
#endif
    uint8_t *bytes = fuzz_read(fuzz_path(name), &n);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fuzz_write(path, bytes, n);
    free(bytes);
}

/* Reads box b into a fresh buffer when it has at most 2^16 elements. */
static void read_back(const ct_ckpt_manifest *m, const ct_ckpt_box *b) {
    if (b->hi - b->lo > (1 << 16)) return;
    float *out = malloc(sizeof(float) * (size_t)(b->hi - b->lo));
    if (ct_ckpt_read_box(ckpt, m, b, out) != CT_OK) ct_error_clear();
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
#ifdef FUZZ_RANKFILE
    fuzz_write(fuzz_path("rank-00000.bin"), data, n);
#else
    uint8_t *signed_copy = malloc(n ? n : 1);
    memcpy(signed_copy, data, n);
    if (n >= 4) ct_put_le32(signed_copy + n - 4, ct_crc32(0, data, (size_t)(n - 4)));
    fuzz_write(fuzz_path("manifest.bin"), signed_copy, n);
    free(signed_copy);
#endif
    ct_ckpt_manifest m;
    memset(&m, 0, sizeof m);
    if (ct_ckpt_open(ckpt, &m) != CT_OK) {
        ct_error_clear();
        ct_ckpt_manifest_release(&m);
        return 0;
    }
    for (int64_t i = 0; i < m.n_pieces && i < 64; i++) {
        ct_ckpt_box whole = m.pieces[i].box;
        read_back(&m, &whole);
        if (whole.rows <= (1 << 8) && whole.cols <= (1 << 8)) {
            whole.row0 = 0, whole.row1 = whole.rows, whole.col0 = 0, whole.col1 = whole.cols;
            whole.lo = 0, whole.hi = whole.rows * whole.cols;
            read_back(&m, &whole);
        }
    }
    FILE *devnull = fopen("/dev/null", "w");
    if (ct_ckpt_inspect(ckpt, devnull) != CT_OK) ct_error_clear();
    fclose(devnull);
    ct_ckpt_manifest_release(&m);
    return 0;
}
