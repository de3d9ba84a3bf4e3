/*
 * fuzz_config.c — the YAML config and `--set` (core/config/): load, override, validate, print.
 * Input: YAML text, then optionally a NUL byte and NUL-separated `--set` assignments; the
 * input's last byte picks the world size (1 to 8) for validation. Seeds: the repository's
 * YAML configs (configs/NAME.yaml, from the repository root), with and without overrides.
 */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/config.h"
#include "test/fuzz/fuzz.h"

void fuzz_setup(void) {}

void fuzz_seeds(const char *dir) {
    glob_t g;
    if (glob("configs/*.yaml", 0, NULL, &g) != 0) {
        fprintf(stderr, "fuzz_config: no configs/*.yaml here (run from the repository root)\n");
        exit(1);
    }
    static const char sets[] =
        "\0train.steps=3\0parallel.tp=2\0model.n_layer=2\0train.precision=bf16";
    for (size_t i = 0; i < g.gl_pathc; i++) {
        size_t n;
        uint8_t *text = fuzz_read(g.gl_pathv[i], &n);
        char path[512];
        const char *base = strrchr(g.gl_pathv[i], '/') + 1;
        snprintf(path, sizeof path, "%s/%s", dir, base);
        fuzz_write(path, text, n);
        uint8_t *with = malloc(n + sizeof sets + 1);
        memcpy(with, text, n);
        memcpy(with + n, sets, sizeof sets);
        with[n + sizeof sets] = 2; /* world size 3 */
        snprintf(path, sizeof path, "%s/%s.set", dir, base);
        fuzz_write(path, with, n + sizeof sets + 1);
        free(with);
        free(text);
    }
    globfree(&g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    size_t yaml_n = 0;
    while (yaml_n < n && data[yaml_n]) yaml_n++;
    const char *path = fuzz_path("config.yaml");
    fuzz_write(path, data, yaml_n);

    ct_config cfg;
    ct_config_defaults(&cfg);
    if (ct_config_load_file(&cfg, path) != CT_OK) {
        ct_error_clear();
        return 0;
    }
    /* the --set assignments: NUL-terminated copies of what follows the YAML */
    for (size_t i = yaml_n + 1; i < n;) {
        size_t j = i;
        while (j < n && data[j]) j++;
        char *a = malloc(j - i + 1);
        memcpy(a, data + i, j - i);
        a[j - i] = 0;
        ct_status s = ct_config_set(&cfg, a);
        free(a);
        if (s != CT_OK) {
            ct_error_clear();
            return 0;
        }
        i = j + 1;
    }
    int64_t world = n ? 1 + data[n - 1] % 8 : 1;
    if (ct_config_validate(&cfg, world) != CT_OK) {
        ct_error_clear();
        return 0;
    }
    FILE *devnull = fopen("/dev/null", "w");
    ct_config_print(&cfg, devnull);
    fclose(devnull);
    return 0;
}
