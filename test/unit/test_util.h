/*
 * test_util.h — small helpers shared by the test binaries (header-only so each test stays one
 * file): temporary directories, a byte-level token shard of the test corpus, tiny configs.
 */
#ifndef CT_TEST_UTIL_H
#define CT_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/backend/backend.h"
#include "core/common.h"
#include "core/config/config.h"
#include "core/data/data.h"
#include "core/model/rope.h"
#include "cmd/train/trainer.h"

/* A CPU backend through the registry, so that COOKTRAIN_ASYNC=1 runs the test on the
 * asynchronous stream (core/backend/backend.h). */
static inline ct_backend *test_backend_new(int n_threads) {
    ct_backend *be = NULL;
    char chosen[160];
    if (ct_backend_new(&be, "cpu", n_threads, chosen, sizeof chosen) != CT_OK) abort();
    return be;
}

/* The tests' random inputs: splitmix64 stepping `*state`. Each test file keeps its own state,
 * so its sequence is fixed by its seed alone. */
static inline uint64_t test_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi), from the top 53 bits of a draw. */
static inline float test_urand(uint64_t *state, float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(test_rng_next(state) >> 11) / 9007199254740992.0);
}

/* Runs child(arg) in a forked process whose stderr goes into err (cap bytes, NUL-terminated);
 * returns the child's wait status (waitpid's). child should end the process (_exit or exec);
 * returning from it exits 0. For tests of what a process prints as it dies. */
static inline int test_run_captured(void (*child)(void *arg), void *arg, char *err, size_t cap) {
    int fds[2];
    if (pipe(fds) != 0) abort();
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) abort();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]), close(fds[1]);
        child(arg);
        _exit(0);
    }
    close(fds[1]);
    size_t used = 0;
    ssize_t got;
    while (used + 1 < cap && (got = read(fds[0], err + used, cap - 1 - used)) > 0)
        used += (size_t)got;
    err[used] = '\0';
    close(fds[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) abort();
    return status;
}

/* The ops of a Llama block on backend `be` in precision dt, from inputs of a fixed seed: RMSNorm
 * forward and backward (accumulating into nonzero dinp and dw), RoPE on a packed GQA qkv's q and
 * k heads at a position offset and its inverse on a gradient, SwiGLU forward and backward on a
 * (N, 2H) gate_up. The results go to out[] (TEST_LLAMA_OUTS tensors, the caller frees them, named
 * by test_llama_out_names) — test_backend_async and test_backend_check compare them between two
 * backends. */
enum { TEST_LLAMA_OUTS = 8 };
static const char *const test_llama_out_names[TEST_LLAMA_OUTS] = {
    "rmsnorm out", "rmsnorm rstd", "rmsnorm dinp", "rmsnorm dw",
    "rope qkv",    "rope inverse", "swiglu out",   "swiglu dgate_up"};

static inline ct_tensor *test_llama_tensor(ct_backend *be, ct_dtype dt, int64_t rows, int64_t cols,
                                           uint64_t *rng, float lo, float hi) {
    int64_t shape[2] = {rows, cols};
    ct_tensor *t = ct_tensor_new(be, dt, 2, shape, CT_MEM_ACTS);
    float *h = malloc((size_t)(rows * cols) * sizeof *h);
    for (int64_t i = 0; i < rows * cols; i++) h[i] = rng ? test_urand(rng, lo, hi) : 0.0f;
    ct_tensor_from_host_f32(t, h); /* rounded to dt */
    free(h);
    return t;
}

static inline void test_llama_ops(ct_backend *be, ct_dtype dt, ct_tensor *out[TEST_LLAMA_OUTS]) {
    enum { B = 2, T = 6, N = B * T, C = 24, NH = 4, NKV = 2, HD = C / NH, POS = 3, H = 40 };
    const ct_dtype f32 = CT_DTYPE_F32;
    uint64_t rng = 0x11A3Aull + (uint64_t)dt;
    ct_tensor *x = test_llama_tensor(be, dt, N, C, &rng, -2, 2);
    ct_tensor *w = test_llama_tensor(be, dt, 1, C, &rng, 0.5f, 1.5f);
    ct_tensor *dy = test_llama_tensor(be, dt, N, C, &rng, -1, 1);
    out[0] = test_llama_tensor(be, dt, N, C, NULL, 0, 0);
    out[1] = test_llama_tensor(be, f32, 1, N, NULL, 0, 0);
    out[2] = test_llama_tensor(be, dt, N, C, &rng, -1, 1);
    out[3] = test_llama_tensor(be, f32, 1, C, &rng, -1, 1);
    ct_rmsnorm_fwd(out[0], out[1], x, w, 1e-5f);
    ct_rmsnorm_bwd(out[2], out[3], dy, x, w, out[1]);

    float table_h[(POS + T) * HD];
    ct_rope_table(table_h, POS + T, HD, 10000.0, NULL);
    ct_tensor *table = test_llama_tensor(be, f32, 1, (POS + T) * HD, NULL, 0, 0);
    ct_tensor_from_host_f32(table, table_h);
    out[4] = test_llama_tensor(be, dt, N, (NH + 2 * NKV) * HD, &rng, -1, 1);
    out[5] = test_llama_tensor(be, dt, N, (NH + 2 * NKV) * HD, &rng, -1, 1);
    ct_rope(out[4], table, B, T, NH + NKV, HD, POS, false);
    ct_rope(out[5], table, B, T, NH + NKV, HD, POS, true);

    ct_tensor *gate_up = test_llama_tensor(be, dt, N, 2 * H, &rng, -6, 6);
    ct_tensor *dsw = test_llama_tensor(be, dt, N, H, &rng, -1, 1);
    out[6] = test_llama_tensor(be, dt, N, H, NULL, 0, 0);
    out[7] = test_llama_tensor(be, dt, N, 2 * H, NULL, 0, 0);
    ct_swiglu_fwd(out[6], gate_up);
    ct_swiglu_bwd(out[7], gate_up, dsw);
    ct_tensor_free(x), ct_tensor_free(w), ct_tensor_free(dy), ct_tensor_free(table);
    ct_tensor_free(gate_up), ct_tensor_free(dsw);
}

/* The test corpus: the fortunes text made byte-level by scripts/prepare_corpus.sh --byte-level,
 * which test/run_tests.sh runs before any test (every byte is a token below 123). */
static inline const char *test_corpus_path(void) {
    static char path[1024];
    const char *env = getenv("CT_TEST_CORPUS");
    if (env) return env;
    const char *build = getenv("CT_BUILD");
    snprintf(path, sizeof path, "%s/test-data/bytes/text.txt", build ? build : "build");
    return path;
}

static inline char *test_make_tmpdir(void) {
    char *dir = ct_xstrdup("/tmp/cooktrain-test-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        abort();
    }
    return dir;
}

static inline void test_remove_tree(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Reads up to max_bytes of the test corpus; every byte is a token (all < 123). */
static inline int32_t *test_corpus_tokens(size_t max_bytes, size_t *n_out) {
    const char *path = test_corpus_path();
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr,
                "cannot open the test corpus %s\nhint: run the tests with `make test` or "
                "`bash test/run_tests.sh`, which prepare it (scripts/prepare_corpus.sh "
                "--byte-level), or set CT_TEST_CORPUS\n",
                path);
        abort();
    }
    unsigned char *buf = ct_xmalloc(max_bytes);
    size_t n = fread(buf, 1, max_bytes, f);
    fclose(f);
    int32_t *tokens = ct_xmalloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        if (buf[i] >= 123) {
            fprintf(stderr, "%s: byte %u at %zu is not a token below 123\n", path, buf[i], i);
            abort();
        }
        tokens[i] = buf[i];
    }
    free(buf);
    *n_out = n;
    return tokens;
}

/* Writes a byte-level shard of the first max_bytes of the test corpus to dir/name. */
static inline void test_write_corpus_shard(const char *dir, const char *name, size_t max_bytes,
                                           char *path_out, size_t cap) {
    size_t n;
    int32_t *tokens = test_corpus_tokens(max_bytes, &n);
    snprintf(path_out, cap, "%s/%s", dir, name);
    if (ct_shard_write(path_out, tokens, n, 123) != CT_OK) {
        ct_error_print();
        abort();
    }
    free(tokens);
}

/* A small GPT-2 on byte tokens: vocab 123 padded to 128. */
static inline void test_tiny_config(ct_config *cfg, const char *train_path) {
    ct_config_defaults(cfg);
    cfg->model.vocab_size = 123;
    cfg->model.vocab_pad = 128;
    cfg->model.seq_len = 16;
    cfg->model.n_layer = 2;
    cfg->model.d_model = 32;
    cfg->model.n_head = 4;
    cfg->train.steps = 4;
    cfg->train.global_batch = 4;
    cfg->train.micro_batch = 4;
    cfg->train.lr = 3e-3;
    cfg->train.min_lr = 3e-4;
    cfg->train.warmup_steps = 2;
    cfg->train.eps = 1e-6; /* as the equivalence tests (test/tools/lib_cli.sh says why) */
    cfg->train.eval_interval = 0;
    cfg->log.interval = 1000;
    if (train_path) {
        if (strlen(train_path) >= sizeof cfg->data.train) abort();
        memcpy(cfg->data.train, train_path, strlen(train_path) + 1);
    }
}

/*
 * Two runs of one config that differ only in float summation order (microbatches, threads,
 * layout) must train the same model: test/tools/compare_runs.py derives the tolerance and states why
 * it is right; this is its check for in-process results (ct_train_options.keep_params). Per step
 * the relative error is e = 10·sqrt(2·L·G·T)·2^-24; losses and gradient norms agree within
 * e·step (the norm sees a wrongly scaled gradient that AdamW would hide from the parameters), and
 * every tensor within e·steps of how far it moved,
 *     ||run − ref|| <= e·steps·max(||ref − init||, 0.1·lr·steps·sqrt(n)).
 * NaN or Inf anywhere fails. Prints the worst tensor; returns true when everything matches.
 */
static inline bool test_runs_match(const ct_config *cfg, const ct_train_result *ref,
                                   const ct_train_result *run, const char *what) {
    const double e = 10.0 *
                     sqrt(2.0 * (double)cfg->model.n_layer *
                          (double)(cfg->train.global_batch * cfg->model.seq_len)) *
                     ldexp(1.0, -24);
    const int64_t steps = cfg->train.steps;
    bool ok = ref->steps_done == steps && run->steps_done == steps &&
              ref->n_spans == run->n_spans && ref->n_params == run->n_params && ref->n_spans > 0;
    for (int64_t s = 0; ok && s < steps; s++) {
        double a = ref->losses[s], b = run->losses[s];
        double na = ref->grad_norms[s], nb = run->grad_norms[s];
        ok = isfinite(a) && isfinite(b) && fabs(a - b) <= e * (double)(s + 1) * fabs(a);
        ok = ok && isfinite(na) && isfinite(nb) && fabs(na - nb) <= e * (double)(s + 1) * fabs(na);
        if (!ok)
            printf("%s: step %lld: loss %.9g vs %.9g, gradient norm %.9g vs %.9g\n", what,
                   (long long)s + 1, a, b, na, nb);
    }
    double worst = 0.0;
    const char *worst_name = "";
    for (int i = 0; ok && i < ref->n_spans; i++) {
        const ct_param_span *sp = &ref->spans[i];
        ok = !strcmp(sp->name, run->spans[i].name) && sp->numel == run->spans[i].numel;
        double diff = 0.0, change = 0.0;
        for (int64_t k = sp->offset; ok && k < sp->offset + sp->numel; k++) {
            double a = ref->final_params[k], b = run->final_params[k], i0 = ref->init_params[k];
            ok = isfinite(a) && isfinite(b);
            diff += (a - b) * (a - b);
            change += (a - i0) * (a - i0);
        }
        double scale =
            fmax(sqrt(change), 0.1 * cfg->train.lr * (double)steps * sqrt((double)sp->numel));
        double ratio = sqrt(diff) / (e * (double)steps * scale);
        if (!(ratio <= 1.0)) {
            printf("%s: %s differs: %.2fx the tolerance\n", what, sp->name, ratio);
            ok = false;
        }
        if (ratio > worst) worst = ratio, worst_name = sp->name;
    }
    printf("%s: %s; worst tensor %s at %.1f%% of the tolerance %.2e\n", what,
           ok ? "match" : "MISMATCH", worst_name, 100.0 * worst, e * (double)steps);
    return ok;
}

#endif /* CT_TEST_UTIL_H */
