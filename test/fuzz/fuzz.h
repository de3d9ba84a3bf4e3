/*
 * fuzz.h — what the libFuzzer targets of test/fuzz/ share (test/fuzz/README.md says how they
 * run). Each target is one file that defines
 *
 *   void fuzz_seeds(const char *dir);   writes its seed inputs (valid files made by cooktrain's
 *                                       own writers) into dir, one file each
 *   int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);
 *
 * and the input reaches the parser as a file, through the same open and read path a user's file
 * takes (ct_open_regular, ct_read_regular): a target writes it into its private directory first.
 * Run with CT_FUZZ_SEEDS=DIR, a target writes its seeds into DIR and exits 0 instead of fuzzing.
 */
#ifndef CT_TEST_FUZZ_H
#define CT_TEST_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* The target's private directory (made on first use, removed at exit). */
const char *fuzz_dir(void);
/* fuzz_dir()/name, in a static buffer (valid until the next call). */
const char *fuzz_path(const char *name);
/* Writes n bytes to path (replacing it); aborts on an I/O error, which is the harness's fault. */
void fuzz_write(const char *path, const uint8_t *data, size_t n);
/* Reads a whole file that fuzz_seeds or a setup wrote (aborts on error); *n its size. */
uint8_t *fuzz_read(const char *path, size_t *n);

void fuzz_seeds(const char *dir);
/* Optional one-time setup before the first input (files every input needs); may be NULL-bodied. */
void fuzz_setup(void);

#endif
