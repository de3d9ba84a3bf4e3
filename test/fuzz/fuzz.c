/* fuzz.c — the harness under every target of test/fuzz/ (fuzz.h). */
#define _GNU_SOURCE
#include "test/fuzz/fuzz.h"

#include "core/common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static void remove_dir(void) {
    if (!dir[0]) return;
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", dir);
}

const char *fuzz_dir(void) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/ct-fuzz-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(remove_dir);
    }
    return dir;
}

const char *fuzz_path(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", fuzz_dir(), name);
    return buf;
}

void fuzz_write(const char *path, const uint8_t *data, size_t n) {
    /* a new file each time: ext4 flushes a file truncated and rewritten at its close (for the
     * sake of programs that replace a file in place), which costs milliseconds an input */
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        perror(path);
        abort();
    }
    for (size_t done = 0; done < n;) {
        ssize_t w = write(fd, data + done, n - done);
        if (w <= 0) {
            perror(path);
            abort();
        }
        done += (size_t)w;
    }
    close(fd);
}

uint8_t *fuzz_read(const char *path, size_t *n) {
    uint8_t *buf;
    if (ct_read_regular(path, "fuzz seed", INT64_MAX, &buf, n) != CT_OK) {
        ct_error_print();
        abort();
    }
    return buf;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *seeds = getenv("CT_FUZZ_SEEDS");
    if (seeds && seeds[0]) {
        fuzz_seeds(seeds);
        exit(0);
    }
    fuzz_setup();
    return 0;
}
