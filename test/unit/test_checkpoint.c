/*
 * test_checkpoint.c — the two ways a rank file of a checkpoint is written (core/io/checkpoint.h):
 * appended through ct_ckpt_writer (persistent saves), or stored in place through a shared
 * mapping kept from save to save, ct_ckpt_mapped (local saves).
 *
 * The same values written both ways must be the same bytes with the same pieces (file, offset,
 * checksum): compared exactly, since a restore reads either kind with one reader. A mapping is
 * reused only while it is still the file at its path: after its folder is renamed (the local
 * saves' ring) it is; for another size or rank, or once the path holds another file or nothing,
 * it is not, or a save would store its values where no step's folder would find them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/io/checkpoint.h"
#include "test_util.h"

enum { N_PIECES = 3 };
static const int64_t piece_values[N_PIECES] = {1000, 1, 4099};

static void make_pieces(ct_ckpt_piece *p) {
    memset(p, 0, N_PIECES * sizeof *p);
    for (int i = 0; i < N_PIECES; i++) p[i].box.hi = piece_values[i];
}

/* A whole file read back (ct_read_regular), the test failing if it cannot be. */
static uint8_t *read_back(const char *path, size_t *n) {
    uint8_t *b = NULL;
    assert_int_equal(ct_read_regular(path, "rank file", (int64_t)1 << 30, &b, n), CT_OK);
    return b;
}

static void mapped_equals_writer(void **state) {
    (void)state;
    char *dir = test_make_tmpdir();
    int64_t total = 0;
    for (int i = 0; i < N_PIECES; i++) total += piece_values[i];
    float *values = malloc((size_t)total * sizeof *values);
    uint64_t rng = 7;
    for (int64_t i = 0; i < total; i++) values[i] = test_urand(&rng, -3.0f, 3.0f);

    char a[512], b[512];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    assert_int_equal(mkdir(a, 0755), 0);
    assert_int_equal(mkdir(b, 0755), 0);
    ct_ckpt_piece pw[N_PIECES], pm[N_PIECES];
    make_pieces(pw);
    make_pieces(pm);

    ct_ckpt_writer *w;
    assert_int_equal(ct_ckpt_writer_open(&w, a, 3), CT_OK);
    for (int i = 0, at = 0; i < N_PIECES; at += (int)piece_values[i++])
        assert_int_equal(ct_ckpt_writer_add(w, &pw[i], values + at), CT_OK);
    assert_int_equal(ct_ckpt_writer_close(w), CT_OK);

    ct_ckpt_mapped *m;
    assert_int_equal(ct_ckpt_mapped_open(&m, b, 3, total), CT_OK);
    assert_int_equal(ct_ckpt_mapped_count(m), total);
    memcpy(ct_ckpt_mapped_values(m), values, (size_t)total * sizeof *values);
    ct_ckpt_mapped_to_file_order(m);
    for (int i = 0, at = 0; i < N_PIECES; at += (int)piece_values[i++])
        ct_ckpt_mapped_piece(m, &pm[i], at);
    assert_int_equal(ct_ckpt_mapped_sync(m), CT_OK);
    ct_ckpt_mapped_close(m, false);

    for (int i = 0; i < N_PIECES; i++) {
        assert_int_equal(pm[i].file, pw[i].file);
        assert_int_equal(pm[i].offset, pw[i].offset);
        assert_int_equal(pm[i].crc, pw[i].crc);
    }
    char fa[600], fb[600];
    snprintf(fa, sizeof fa, "%s/rank-00003.bin", a);
    snprintf(fb, sizeof fb, "%s/rank-00003.bin", b);
    size_t na, nb;
    uint8_t *ba = read_back(fa, &na), *bb = read_back(fb, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(ba, bb, na);
    free(ba);
    free(bb);
    free(values);
    test_remove_tree(dir);
    free(dir);
}

static void mapped_reused_only_at_its_path(void **state) {
    (void)state;
    char *dir = test_make_tmpdir();
    char x[512], y[512], file[600];
    snprintf(x, sizeof x, "%s/step-00000001.tmp", dir);
    snprintf(y, sizeof y, "%s/step-00000004.tmp", dir);
    assert_int_equal(mkdir(x, 0755), 0);
    ct_ckpt_mapped *m;
    assert_int_equal(ct_ckpt_mapped_open(&m, x, 5, 100), CT_OK);
    ct_ckpt_mapped_values(m)[99] = 42.0f;
    assert_int_equal(rename(x, y), 0); /* the ring takes the oldest step's folder */
    assert_true(ct_ckpt_mapped_reuse(m, y, 5, 100));
    assert_false(ct_ckpt_mapped_reuse(m, y, 5, 101)); /* another size */
    assert_false(ct_ckpt_mapped_reuse(m, y, 6, 100)); /* another rank's */
    assert_false(ct_ckpt_mapped_reuse(m, x, 5, 100)); /* not there any more */
    /* a store through the mapping reaches the file at the new path */
    ct_ckpt_mapped_values(m)[0] = 1.5f;
    assert_int_equal(ct_ckpt_mapped_sync(m), CT_OK);
    snprintf(file, sizeof file, "%s/rank-00005.bin", y);
    size_t n;
    uint8_t *bytes = read_back(file, &n);
    assert_int_equal(n, 32 + 4 * 100);
    float v0;
    memcpy(&v0, bytes + 32, 4);
    assert_true(v0 == 1.5f);
    free(bytes);
    /* the path now holds another file (removed and made again): not the mapping's */
    assert_int_equal(unlink(file), 0);
    FILE *f = fopen(file, "wb");
    assert_non_null(f);
    fclose(f);
    assert_false(ct_ckpt_mapped_reuse(m, y, 5, 100));
    assert_int_equal(truncate(file, 32 + 4 * 100), 0); /* even at the same size */
    assert_false(ct_ckpt_mapped_reuse(m, y, 5, 100));
    ct_ckpt_mapped_close(m, false);
    /* a folder that is not there: refused with the path named */
    snprintf(x, sizeof x, "%s/missing", dir);
    assert_int_equal(ct_ckpt_mapped_open(&m, x, 0, 10), CT_ERR_RUNTIME);
    assert_null(m);
    assert_non_null(strstr(ct_error_message(), "missing/rank-00000.bin"));
    ct_error_clear();
    test_remove_tree(dir);
    free(dir);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mapped_equals_writer),
        cmocka_unit_test(mapped_reused_only_at_its_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
