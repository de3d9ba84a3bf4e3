/*
 * test_common.c — the helpers of core/common.h that the file formats rest on: ct_crc32, the
 * checksum of every checkpoint piece, manifest and parameter replica.
 *
 * The reference is the CRC-32 written out bit by bit (reflected polynomial 0xEDB88320, initial
 * and final inversion), the definition itself. Checksums compare exactly: no tolerance.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/common.h"

/* The definition, one bit at a time, continuing from crc like ct_crc32. */
static uint32_t naive_crc32(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = crc & 1 ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
    }
    return ~crc;
}

/* The check value every CRC-32 catalogue lists, and the empty input */
static void crc32_check_value(void **state) {
    (void)state;
    assert_int_equal(ct_crc32(0, "123456789", 9), 0xCBF43926u);
    assert_int_equal(ct_crc32(0, "", 0), 0);
    assert_int_equal(ct_crc32(0x12345678u, "", 0), 0x12345678u);
}

/* Lengths around the fast path's blocks, at every alignment of the start, against the
 * definition; and a buffer checksummed in two parts at every split equals it whole (the writer
 * checksums a piece in chunks, and a file in reads). */
static void crc32_against_definition(void **state) {
    (void)state;
    enum { N = 1 << 12 };
    uint8_t *buf = malloc(N + 64);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < N + 64; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
    const size_t lengths[] = {1, 3, 15, 16, 17, 63, 64, 65, 127, 128, 255, 256, 1000, N};
    for (size_t a = 0; a < 16; a++)
        for (size_t j = 0; j < sizeof lengths / sizeof lengths[0]; j++) {
            const size_t n = lengths[j];
            assert_int_equal(ct_crc32(0, buf + a, n), naive_crc32(0, buf + a, n));
        }
    const uint32_t whole = naive_crc32(0, buf, 1000);
    for (size_t cut = 0; cut <= 1000; cut++)
        assert_int_equal(ct_crc32(ct_crc32(0, buf, cut), buf + cut, 1000 - cut), whole);
    free(buf);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(crc32_check_value),
        cmocka_unit_test(crc32_against_definition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
