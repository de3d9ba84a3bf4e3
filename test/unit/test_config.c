/*
 * test_config.c — the configuration module: defaults, YAML loading, --set, validation, derived
 * values, printing (round trip) and the generated key documentation.
 *
 * The error tests are a table (bad_cases): each feeds YAML, then optionally a --set, then
 * validates, and asserts that the first failure is CT_ERR_INPUT with a message naming the field
 * and a non-empty hint. Every row is its own cmocka test, so one can be run by name:
 *     build/test/test_config unknown_key
 * (the argument is a cmocka test filter; `*` wildcards work). CT_TEST_VERBOSE=1 prints each
 * case's message and hint, to review them as a user would read them.
 *
 * The files test/cli/bad_configs/NAME.yaml are the same kind of cases as files, for the end-to-end
 * test of the binary; bad_config_files checks here that each one fails as its `# expect:` line
 * says.
 *
 * Files are found relative to the repository root: $CT_SOURCE_DIR, the current directory, or
 * one or two levels up (build/test/).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/backend/backend.h"
#include "core/config/config.h"

/* ---- helpers --------------------------------------------------------------------------------- */

/* The repository root: the first candidate that holds test/cli/bad_configs. */
static const char *source_dir(void) {
    static char dir[1024];
    if (dir[0]) return dir;
    const char *candidates[] = {getenv("CT_SOURCE_DIR"), ".", "..", "../.."};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        if (!candidates[i]) continue;
        char probe[1200];
        struct stat st;
        snprintf(probe, sizeof probe, "%s/test/cli/bad_configs", candidates[i]);
        if (stat(probe, &st) == 0 && S_ISDIR(st.st_mode)) {
            snprintf(dir, sizeof dir, "%s", candidates[i]);
            return dir;
        }
    }
    fail_msg("cannot find the repository root (test/cli/bad_configs); run from the repo or set "
             "CT_SOURCE_DIR");
    return NULL;
}

static void assert_contains(const char *haystack, const char *needle, const char *what) {
    if (!strstr(haystack, needle))
        fail_msg("%s \"%s\" does not contain \"%s\"", what, haystack, needle);
}

/* The error contract: CT_ERR_INPUT, the field named in the message, a hint. */
static void assert_input_error(ct_status st, const char *field) {
    if (st != CT_ERR_INPUT)
        fail_msg("expected CT_ERR_INPUT, got %d (message: \"%s\")", (int)st, ct_error_message());
    assert_contains(ct_error_message(), field, "message");
    if (!ct_error_hint()[0]) fail_msg("no hint for \"%s\"", ct_error_message());
}

/* print → string (caller frees). */
static char *print_to_string(const ct_config *cfg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    ct_config_print(cfg, f);
    fclose(f);
    return buf;
}

static char *docs_to_string(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    ct_config_write_docs(f);
    fclose(f);
    return buf;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* ---- the table of malformed inputs ----------------------------------------------------------- */

typedef struct bad_case {
    const char *name;
    const char *yaml;   /* loaded first with origin "test.yaml" ("" loads nothing) */
    const char *set;    /* then applied with ct_config_set (NULL: none) */
    int64_t world;      /* then validated with this world size (0 means 1) */
    const char *field;  /* must appear in the message */
    const char *expect; /* must also appear in the message (NULL: no further check) */
    const char *hint;   /* must appear in the hint (NULL: only non-empty) */
} bad_case;

static const bad_case bad_cases[] = {
    /* YAML syntax */
    {"syntax_error_line", "model:\n  n_layer: 4\n d_model: 8\n", NULL, 0,
     "test.yaml:3:", "YAML syntax error", NULL},
    {"syntax_error_tab", "model:\n\tn_layer: 4\n", NULL, 0, "test.yaml:2:", "YAML syntax error",
     NULL},
    {"syntax_error_unclosed_quote", "data:\n  train: \"abc\n", NULL, 0,
     "test.yaml:", "YAML syntax error", NULL},
    {"top_level_list", "- model\n- train\n", NULL, 0, "test.yaml:1:", "top level must be a mapping",
     NULL},
    {"top_level_scalar", "hello\n", NULL, 0, "test.yaml:1:", "top level must be a mapping", NULL},
    {"two_documents", "train:\n  lr: 0.1\n---\ntrain:\n  lr: 0.2\n", NULL, 0,
     "test.yaml:3:", "second YAML document", NULL},
    /* names */
    {"unknown_key", "model:\n  n_layers: 4\n", NULL, 0, "model.n_layers", "unknown key",
     "did you mean model.n_layer?"},
    {"unknown_key_other_section", "train:\n  tp: 2\n", NULL, 0, "train.tp", "unknown key",
     "did you mean parallel.tp?"},
    {"unknown_key_no_suggestion", "log:\n  colour: blue\n", NULL, 0, "log.colour", "unknown key",
     "valid keys in log: interval, metrics, trace, run_dir, profile, device_idle, sample_tokens, "
     "sample_prompt, "
     "flight_recorder"},
    {"unknown_section", "modle:\n  n_layer: 4\n", NULL, 0, "modle", "unknown section",
     "did you mean model?"},
    {"unknown_section_key_at_top", "lr: 0.1\n", NULL, 0, "'lr'", "unknown section",
     "train section"},
    {"unknown_section_far", "optimizer:\n  lr: 0.1\n", NULL, 0, "optimizer", "unknown section",
     "valid sections"},
    /* types */
    {"int_from_word", "model:\n  n_head: eight\n", NULL, 0, "model.n_head",
     "expected an integer, got 'eight'", NULL},
    {"int_from_fraction", "model:\n  n_layer: 1.5\n", NULL, 0, "model.n_layer",
     "expected an integer, got '1.5'", NULL},
    {"int_hex", "model:\n  n_layer: 0x10\n", NULL, 0, "model.n_layer", "expected an integer", NULL},
    {"int_overflow", "train:\n  steps: 99999999999999999999\n", NULL, 0, "train.steps",
     "does not fit in a 64-bit integer", NULL},
    {"int_exponent_overflow", "train:\n  steps: 1e30\n", NULL, 0, "train.steps",
     "does not fit in a 64-bit integer", NULL},
    {"seed_negative", "train:\n  seed: -1\n", NULL, 0, "train.seed",
     "expected a non-negative integer", NULL},
    {"seed_overflow", "train:\n  seed: 18446744073709551616\n", NULL, 0, "train.seed",
     "unsigned integer", NULL},
    {"float_from_word", "train:\n  lr: fast\n", NULL, 0, "train.lr",
     "train.lr: expected a number, got 'fast'", NULL},
    {"float_nan", "train:\n  lr: nan\n", NULL, 0, "train.lr", "finite", NULL},
    {"float_trailing_garbage", "train:\n  lr: 3e-4x\n", NULL, 0, "train.lr", "expected a number",
     NULL},
    {"bad_bool", "parallel:\n  sequence_parallel: maybe\n", NULL, 0, "parallel.sequence_parallel",
     "expected true or false, got 'maybe'", "yes/no"},
    {"bad_enum", "parallel:\n  schedule: zigzag\n", NULL, 0, "parallel.schedule",
     "unknown value 'zigzag'", "1f1b, gpipe, interleaved"},
    {"enum_typo", "parallel:\n  schedule: interleave\n", NULL, 0, "parallel.schedule",
     "unknown value", "did you mean interleaved?"},
    {"bad_precision", "train:\n  precision: fp16\n", NULL, 0, "train.precision", "unknown value",
     "fp32, bf16"},
    {"empty_numeric", "train:\n  lr:\n", NULL, 0, "train.lr", "empty value", NULL},
    {"empty_quoted_numeric", "train:\n  steps: \"\"\n", NULL, 0, "train.steps", "empty value",
     NULL},
    {"nested_mapping", "model:\n  n_layer:\n    value: 4\n", NULL, 0, "model.n_layer",
     "expected a single value, got a mapping", NULL},
    {"sequence_value", "model:\n  n_layer: [1, 2]\n", NULL, 0, "model.n_layer",
     "expected a single value, got a list", NULL},
    {"pp_layers_as_list", "parallel:\n  pp_layers: [2, 2]\n", NULL, 0, "parallel.pp_layers",
     "got a list", "comma-separated"},
    {"alias_value", "train:\n  lr: &x 0.1\n  min_lr: *x\n", NULL, 0, "train.min_lr", "got an alias",
     NULL},
    {"section_is_scalar", "model: 5\n", NULL, 0, "model", "must hold 'key: value' lines", NULL},
    {"section_is_list", "train:\n  - lr\n", NULL, 0, "train", "must hold 'key: value' lines", NULL},
    {"duplicate_key", "train:\n  lr: 0.1\n  lr: 0.2\n", NULL, 0, "train.lr",
     "duplicate key train.lr (first set on line 2)", NULL},
    {"duplicate_section", "train:\n  lr: 0.1\nmodel:\n  n_layer: 2\ntrain:\n  steps: 3\n", NULL, 0,
     "train", "duplicate section", NULL},
    /* per-key ranges */
    {"zero_stage_range", "parallel:\n  zero_stage: 4\n", NULL, 0, "parallel.zero_stage",
     "parallel.zero_stage=4 is out of range: must be in [0, 3]", NULL},
    {"negative_steps", "train:\n  steps: -5\n", NULL, 0, "train.steps",
     "train.steps=-5 is out of range: must be in [1, 100000000]", NULL},
    {"zero_lr", "train:\n  lr: 0\n", NULL, 0, "train.lr", "must be > 0", NULL},
    {"beta2_one", "train:\n  beta2: 1.0\n", NULL, 0, "train.beta2", "must be in [0, 1)", NULL},
    {"zero_d_model", "model:\n  d_model: 0\n", NULL, 0, "model.d_model", "out of range", NULL},
    {"negative_timeout", "parallel:\n  timeout_s: -1\n", NULL, 0, "parallel.timeout_s",
     "out of range", NULL},
    {"empty_resume", "checkpoint:\n  resume: \"\"\n", NULL, 0, "checkpoint.resume", "is empty",
     NULL},
    /* consistency (ct_config_validate) */
    {"d_model_n_head", "model:\n  d_model: 100\n  n_head: 3\n", NULL, 1, "model.d_model",
     "model.d_model=100 is not divisible by model.n_head=3", "1, 2, 4, 5"},
    {"n_kv_head_divides", "model:\n  n_head: 4\n  n_kv_head: 3\n", NULL, 1, "model.n_kv_head",
     "does not divide model.n_head=4", NULL},
    {"grid_mismatch", "parallel:\n  tp: 2\n  pp: 2\n", NULL, 6, "parallel.tp",
     "does not divide the world size 6", "multiple of 4"},
    {"grid_tp_world1", "parallel:\n  tp: 2\n", NULL, 1, "parallel.tp",
     "does not divide the world size 1", NULL},
    {"dp_mismatch", "parallel:\n  dp: 2\n", NULL, 1, "parallel.dp", "but the world size is 1",
     NULL},
    {"n_head_tp", "model:\n  n_head: 4\nparallel:\n  tp: 3\n", NULL, 3, "model.n_head",
     "parallel.tp=3 does not divide model.n_head=4", "valid parallel.tp for this model: 1, 2, 4"},
    {"n_kv_head_tp", "model:\n  n_head: 4\n  n_kv_head: 1\nparallel:\n  tp: 2\n", NULL, 2,
     "model.n_kv_head", "parallel.tp=2", "valid parallel.tp for this model: 1"},
    {"d_ff_tp", "model:\n  d_ff: 1001\nparallel:\n  tp: 2\n", NULL, 2, "model.d_ff",
     "parallel.tp=2", NULL},
    {"vocab_tp", "model:\n  vocab_size: 4097\n  vocab_pad: 1\nparallel:\n  tp: 2\n", NULL, 2,
     "model.vocab_pad", "padded vocabulary 4097", NULL},
    {"seq_len_sp", "model:\n  seq_len: 255\nparallel:\n  tp: 2\n  sequence_parallel: true\n", NULL,
     2, "model.seq_len", "parallel.tp=2", "seq_len"},
    {"layers_over_pp", "model:\n  n_layer: 6\nparallel:\n  pp: 4\n", NULL, 4, "model.n_layer",
     "does not split evenly", "parallel.pp_layers: \"2,2,1,1\""},
    {"too_few_layers", "model:\n  n_layer: 2\nparallel:\n  pp: 4\n", NULL, 4, "model.n_layer",
     "fewer than the 4 pipeline chunks", NULL},
    {"pp_layers_sum", "model:\n  n_layer: 8\nparallel:\n  pp: 2\n  pp_layers: \"3,3\"\n", NULL, 2,
     "parallel.pp_layers", "does not sum to model.n_layer=8", "\"4,4\""},
    {"pp_layers_count", "model:\n  n_layer: 8\nparallel:\n  pp: 2\n  pp_layers: 2,2,4\n", NULL, 2,
     "parallel.pp_layers", "has 3 entries", NULL},
    {"pp_layers_garbage", "model:\n  n_layer: 8\nparallel:\n  pp: 2\n  pp_layers: 4,x\n", NULL, 2,
     "parallel.pp_layers", "entry 2 is not a positive integer", NULL},
    {"pp_layers_zero", "model:\n  n_layer: 8\nparallel:\n  pp: 2\n  pp_layers: 8,0\n", NULL, 2,
     "parallel.pp_layers", "not a positive integer", NULL},
    {"interleaved_v1", "parallel:\n  schedule: interleaved\n", NULL, 1, "parallel.virtual_stages",
     "parallel.schedule=interleaved needs parallel.virtual_stages >= 2", NULL},
    {"zero_bubble_v_one_chunk", "model:\n  n_layer: 8\nparallel:\n  pp: 2\n  schedule: zbv\n", NULL,
     2, "parallel.schedule=zbv", "runs 2 chunks a rank in a V", "parallel.virtual_stages: 2"},
    {"virtual_stages_1f1b", "parallel:\n  virtual_stages: 2\n", NULL, 1, "parallel.virtual_stages",
     "needs parallel.schedule=interleaved", NULL},
    {"interleaved_accum",
     "model:\n  n_layer: 8\nparallel:\n  pp: 2\n  virtual_stages: 2\n  schedule: interleaved\n"
     "train:\n  micro_batch: 8\n",
     NULL, 2, "parallel.pp", "multiple of parallel.pp=2", "1, 2, 4"},
    {"auto_micro_batch_dp", "train:\n  global_batch: 10\n", NULL, 4, "train.global_batch",
     "train.global_batch=10 is not divisible by dp=4", "train.global_batch=12"},
    {"global_batch", "train:\n  global_batch: 10\n  micro_batch: 4\n", NULL, 1,
     "train.global_batch", "train.global_batch=10 is not divisible by train.micro_batch=4",
     "valid train.micro_batch values with dp=1: 1, 2, 5, 10"},
    {"global_batch_dp", "train:\n  global_batch: 10\n  micro_batch: 1\n", NULL, 4,
     "train.global_batch", "dp=4", "try train.global_batch=12"},
    {"min_lr_above_lr", "train:\n  lr: 1e-4\n  min_lr: 1e-3\n", NULL, 1, "train.min_lr",
     "train.min_lr=0.001 is larger than train.lr=0.0001", NULL},
    {"grad_reduce_bf16_fp32", "parallel:\n  grad_reduce_dtype: bf16\n", NULL, 1,
     "parallel.grad_reduce_dtype", "needs bf16 training, but train.precision is fp32",
     "parallel.grad_reduce_dtype"},
    {"grad_reduce_auto", "parallel:\n  grad_reduce_dtype: auto\n", NULL, 1,
     "parallel.grad_reduce_dtype", "unknown value 'auto'", "fp32, bf16"},
    {"llama_odd_head_dim", "model:\n  arch: llama\n  d_model: 72\n  n_head: 8\n", NULL, 1,
     "model.arch=llama", "needs an even head_dim (rotary pairs)", "d_model / n_head is even"},
    /* --set */
    {"set_no_equals", "", "train.lr", 0, "train.lr", "expected section.key=value",
     "--set section.key=value"},
    {"set_no_dot", "", "steps=5", 0, "steps=5", "expected section.key=value", NULL},
    {"set_empty_key", "", ".=5", 0, ".=5", "expected section.key=value", NULL},
    {"set_unknown_key", "", "model.n_layers=4", 0, "model.n_layers", "unknown key",
     "did you mean model.n_layer?"},
    {"set_unknown_section", "", "modle.n_layer=4", 0, "modle", "unknown section",
     "did you mean model.n_layer?"},
    {"set_bad_float", "", "train.lr=abc", 0, "train.lr",
     "--set: train.lr: expected a number, got 'abc'", NULL},
    {"set_out_of_range", "", "parallel.zero_stage=7", 0, "parallel.zero_stage", "out of range",
     NULL},
    {"set_empty_numeric", "", "train.steps=", 0, "train.steps", "empty value", NULL},
    {"set_bad_bool", "", "parallel.sequence_parallel=2", 0, "parallel.sequence_parallel",
     "expected true or false", NULL},
    {"set_then_grid", "", "parallel.tp=2", 1, "parallel.tp", "world size 1", NULL},
};
#define N_BAD_CASES (sizeof bad_cases / sizeof bad_cases[0])

static void run_bad_case(void **state) {
    const bad_case *c = *state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    ct_error_clear();
    ct_status st = ct_config_load_string(&cfg, c->yaml, "test.yaml");
    if (st == CT_OK && c->set) st = ct_config_set(&cfg, c->set);
    if (st == CT_OK) st = ct_config_validate(&cfg, c->world ? c->world : 1);
    if (st == CT_OK) fail_msg("case %s: accepted, expected an error", c->name);
    if (getenv("CT_TEST_VERBOSE")) /* to read the messages as a user would */
        print_message("    %s\n    hint: %s\n", ct_error_message(), ct_error_hint());
    assert_input_error(st, c->field);
    if (c->expect) assert_contains(ct_error_message(), c->expect, "message");
    if (c->hint) assert_contains(ct_error_hint(), c->hint, "hint");
}

/* ---- positive tests -------------------------------------------------------------------------- */

static void defaults_validate_world1(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    const ct_derived_config *d = &cfg.derived;
    assert_int_equal(d->world_size, 1);
    assert_int_equal(d->dp, 1);
    assert_int_equal(d->vocab_padded, 4096);
    assert_int_equal(d->head_dim, 64);
    assert_int_equal(d->d_ff, 1024);
    assert_int_equal(d->n_kv_head, 4);
    assert_int_equal(d->grad_accum, 1);
    assert_int_equal(d->tokens_per_step, 8 * 256);
    /* wte 4096·256 + wpe 256·256 + 4 · 789,760 per layer + final LN 512 */
    assert_int_equal(d->n_params, 1048576 + 65536 + 4 * 789760 + 512);
    /* The defaults configs/README.md documents. */
    assert_int_equal(cfg.model.arch, CT_ARCH_GPT2);
    assert_int_equal(cfg.parallel.schedule, CT_SCHEDULE_1F1B);
    assert_int_equal(cfg.parallel.dp, 0);
    assert_true(cfg.train.lr == 1e-3 && cfg.train.min_lr == 1e-4 && cfg.train.eps == 1e-8);
    assert_true(cfg.train.beta1 == 0.9 && cfg.train.beta2 == 0.95 && cfg.train.grad_clip == 1.0);
    assert_true(cfg.parallel.timeout_s == 300.0);
    assert_int_equal(cfg.train.seed, 1337);
    assert_string_equal(cfg.checkpoint.resume, "auto");
    assert_int_equal(cfg.checkpoint.keep, 3);
    assert_int_equal(cfg.log.interval, 10);
    assert_string_equal(cfg.runtime_backend, "cpu");
}

static void empty_inputs_are_defaults(void **state) {
    (void)state;
    const char *empties[] = {"",           "\n",       "# only a comment\n",     "---\n",
                             "---\n...\n", "model:\n", "data: ~\ntrain: null\n", "{}\n"};
    ct_config ref, cfg;
    ct_config_defaults(&ref);
    for (size_t i = 0; i < sizeof empties / sizeof empties[0]; i++) {
        ct_config_defaults(&cfg);
        ct_status st = ct_config_load_string(&cfg, empties[i], "empty.yaml");
        if (st != CT_OK) fail_msg("\"%s\" rejected: %s", empties[i], ct_error_message());
        assert_memory_equal(&cfg, &ref, sizeof cfg);
    }
}

static void empty_file_is_defaults(void **state) {
    (void)state;
    char path[] = "/tmp/ct_test_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    ct_config ref, cfg;
    ct_config_defaults(&ref);
    ct_config_defaults(&cfg);
    assert_int_equal(ct_config_load_file(&cfg, path), CT_OK);
    assert_memory_equal(&cfg, &ref, sizeof cfg);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    unlink(path);
}

static void missing_file(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    const char *path = "/nonexistent/dir/cooktrain.yaml";
    assert_input_error(ct_config_load_file(&cfg, path), path);
    assert_contains(ct_error_message(), strerror(ENOENT), "message");
}

static void directory_as_file(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_input_error(ct_config_load_file(&cfg, "/"), "'/'");
    assert_contains(ct_error_message(), "is a directory", "message");
}

/* Devices and pipes are refused without reading (/dev/zero never ends, a pipe with no writer
 * never answers), and so is a file over the size cap. */
static void not_a_regular_file(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_input_error(ct_config_load_file(&cfg, "/dev/zero"), "'/dev/zero'");
    assert_contains(ct_error_message(), "a character device", "message");
    char fifo[] = "/tmp/ct_test_fifo_XXXXXX";
    int fd = mkstemp(fifo);
    assert_true(fd >= 0);
    close(fd);
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_input_error(ct_config_load_file(&cfg, fifo), "a pipe");
    unlink(fifo);
    char big[] = "/tmp/ct_test_big_XXXXXX";
    fd = mkstemp(big);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, CT_CONFIG_MAX_BYTES + 1), 0);
    close(fd);
    assert_input_error(ct_config_load_file(&cfg, big), "KiB");
    assert_contains(ct_error_hint(), "right file", "hint");
    /* Exactly at the cap is read (comment lines: a valid, empty config). */
    fd = open(big, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    char line[64];
    memset(line, ' ', sizeof line);
    line[0] = '#';
    line[63] = '\n';
    for (int i = 0; i < CT_CONFIG_MAX_BYTES / 64; i++)
        assert_int_equal(write(fd, line, sizeof line), (ssize_t)sizeof line);
    close(fd);
    assert_int_equal(ct_config_load_file(&cfg, big), CT_OK);
    unlink(big);
}

static void file_errors_carry_path_and_line(void **state) {
    (void)state;
    char path[] = "/tmp/ct_test_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char text[] = "# a comment\nmodel:\n  n_layer: 4\n  n_head: many\n";
    assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    ct_config cfg;
    ct_config_defaults(&cfg);
    char where[64];
    snprintf(where, sizeof where, "%s:4:", path);
    assert_input_error(ct_config_load_file(&cfg, path), "model.n_head");
    assert_contains(ct_error_message(), where, "message");
    unlink(path);
}

static void gpt2_124m_derived(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    const char *yaml = "model:\n  vocab_size: 50257\n  vocab_pad: 128\n  seq_len: 1024\n"
                       "  n_layer: 12\n  d_model: 768\n  n_head: 12\n"
                       "train:\n  global_batch: 8\n  micro_batch: 8\n";
    assert_int_equal(ct_config_load_string(&cfg, yaml, "gpt2.yaml"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(cfg.derived.vocab_padded, 50304);
    assert_int_equal(cfg.derived.head_dim, 64);
    assert_int_equal(cfg.derived.d_ff, 3072);
    assert_int_equal(cfg.derived.n_kv_head, 12);
    assert_int_equal(cfg.derived.tokens_per_step, 8 * 1024);
    assert_int_equal(cfg.derived.n_params, 124475904); /* GPT-2 small with 50304 rows */
    char *text = print_to_string(&cfg);
    assert_contains(text, "#   n_params: 124475904 (124.48M)", "print");
    free(text);
}

static void gqa_params(void **state) {
    (void)state;
    /* C = 256, 4 heads of 64, 2 kv heads → k and v are (128, 256) + bias 128 each. */
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_int_equal(ct_config_set(&cfg, "model.n_kv_head=2"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    int64_t C = 256, kv = 128, F = 1024;
    int64_t layer =
        2 * C + (C * C + C) + 2 * (kv * C + kv) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
    assert_int_equal(cfg.derived.n_kv_head, 2);
    assert_int_equal(cfg.derived.n_params, 4096 * C + 256 * C + 4 * layer + 2 * C);
}

static void grid_derivation(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    const char *yaml = "model:\n  n_layer: 8\nparallel:\n  tp: 2\n  pp: 2\n"
                       "train:\n  global_batch: 16\n  micro_batch: 2\n";
    assert_int_equal(ct_config_load_string(&cfg, yaml, "grid.yaml"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 8), CT_OK);
    assert_int_equal(cfg.derived.dp, 2);
    assert_int_equal(cfg.derived.grad_accum, 4);
    assert_int_equal(cfg.parallel.dp, 0); /* the user's value is kept; derived has the result */
    /* An explicit dp that matches is fine; the same config on 16 ranks gets dp 4. */
    assert_int_equal(ct_config_set(&cfg, "parallel.dp=2"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 8), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "parallel.dp=0"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 16), CT_OK);
    assert_int_equal(cfg.derived.dp, 4);
    assert_int_equal(cfg.derived.grad_accum, 2);
}

static void pipeline_layouts(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    const char *yaml = "model:\n  n_layer: 10\nparallel:\n  pp: 2\n  pp_layers: \" 6, 4 \"\n";
    assert_int_equal(ct_config_load_string(&cfg, yaml, "pp.yaml"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 2), CT_OK);
    /* Interleaved: 16 layers over pp 2 · v 2, 4 microbatches (a multiple of pp). */
    ct_config_defaults(&cfg);
    yaml = "model:\n  n_layer: 16\nparallel:\n  pp: 2\n  virtual_stages: 2\n"
           "  schedule: interleaved\ntrain:\n  global_batch: 8\n  micro_batch: 2\n";
    assert_int_equal(ct_config_load_string(&cfg, yaml, "il.yaml"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 2), CT_OK);
    assert_int_equal(cfg.derived.grad_accum, 4);
}

/* Validates `yaml` (+ one optional --set) for `world` ranks; returns the micro_batch it chose. */
static int64_t auto_choice(const char *yaml, const char *set, int64_t world) {
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_int_equal(ct_config_load_string(&cfg, yaml, "auto.yaml"), CT_OK);
    if (set) assert_int_equal(ct_config_set(&cfg, set), CT_OK);
    if (ct_config_validate(&cfg, world) != CT_OK) fail_msg("%s", ct_error_message());
    assert_true(cfg.train.micro_batch_auto);
    return cfg.train.micro_batch;
}

/* train.micro_batch defaults to auto: the largest divisor of global_batch / dp within 8192
 * tokens, keeping >= 4·pp microbatches with a pipeline, m % pp == 0 when interleaved; an
 * explicit value stays strict; the choice is re-made for another world size and prints as
 * auto. */
static void auto_micro_batch(void **state) {
    (void)state;
    const char *g16 = "train:\n  global_batch: 16\n";
    assert_int_equal(auto_choice(g16, NULL, 1), 16);                  /* 16·256 tokens */
    assert_int_equal(auto_choice(g16, NULL, 4), 4);                   /* 16 / dp 4 */
    assert_int_equal(auto_choice(g16, "model.seq_len=2048", 1), 4);   /* 8192 / 2048 */
    assert_int_equal(auto_choice(g16, "model.seq_len=100000", 1), 1); /* at least 1 */
    assert_int_equal(auto_choice("train:\n  global_batch: 12\n", NULL, 1), 12);
    assert_int_equal(auto_choice("train:\n  global_batch: 24\n", "model.seq_len=1024", 1), 8);
    /* pp 2: at least 8 microbatches of 16 -> 2; interleaved: m a multiple of pp too. */
    const char *pp2 = "model:\n  n_layer: 4\nparallel:\n  pp: 2\ntrain:\n  global_batch: 16\n";
    assert_int_equal(auto_choice(pp2, NULL, 2), 2);
    assert_int_equal(auto_choice(pp2, NULL, 4), 1); /* dp 2: 8 per rank, 8 microbatches */
    const char *il = "model:\n  n_layer: 8\nparallel:\n  pp: 2\n  virtual_stages: 2\n"
                     "  schedule: interleaved\ntrain:\n  global_batch: 12\n";
    assert_int_equal(auto_choice(il, NULL, 2), 1); /* 12 microbatches: >= 8 and even */
    assert_int_equal(auto_choice(il, "train.global_batch=48", 2), 6); /* 8 microbatches of 6 */

    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_int_equal(cfg.train.micro_batch, 0); /* the default is auto */
    assert_int_equal(ct_config_load_string(&cfg, g16, "g16.yaml"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(cfg.train.micro_batch, 16);
    char *text = print_to_string(&cfg);
    assert_contains(text, "  micro_batch: auto", "print");
    assert_contains(text, "#   micro_batch: 16 (auto", "print");
    free(text);
    /* The same config validated again for 8 ranks chooses again. */
    assert_int_equal(ct_config_validate(&cfg, 8), CT_OK);
    assert_int_equal(cfg.train.micro_batch, 2);
    /* An explicit value is kept and strict; auto can be asked for again. */
    assert_int_equal(ct_config_set(&cfg, "train.micro_batch=4"), CT_OK);
    assert_false(cfg.train.micro_batch_auto);
    assert_int_equal(ct_config_validate(&cfg, 8), CT_ERR_INPUT);
    assert_contains(ct_error_message(), "not divisible by train.micro_batch=4", "strict");
    assert_contains(ct_error_hint(), "auto", "hint names auto");
    assert_int_equal(ct_config_validate(&cfg, 2), CT_OK);
    assert_int_equal(cfg.train.micro_batch, 4);
    assert_int_equal(ct_config_set(&cfg, "train.micro_batch=AUTO"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 2), CT_OK);
    assert_int_equal(cfg.train.micro_batch, 8);
    assert_int_equal(ct_config_set(&cfg, "train.micro_batch=0"), CT_ERR_INPUT); /* only "auto" */
}

static ct_backend *no_backend(int n_threads) {
    (void)n_threads;
    return NULL;
}

/* A warmup longer than the run is bounded by it, and the value asked for kept for the note. */
static void warmup_bounded_by_steps(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_int_equal(ct_config_set(&cfg, "train.steps=5"), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "train.warmup_steps=10"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(cfg.train.warmup_steps, 5);
    assert_int_equal(cfg.derived.warmup_asked, 10);
    assert_int_equal(ct_config_set(&cfg, "train.warmup_steps=3"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(cfg.train.warmup_steps, 3);
    assert_int_equal(cfg.derived.warmup_asked, 0);
}

static bool says_native(char *how, size_t cap) {
    snprintf(how, cap, "says so");
    return true;
}

/* train.precision: bf16 and fp32 are taken as given; auto asks the backend that will run
 * (cfg.runtime_backend): the CPU backend says bf16 on a CPU with native bf16 matmul, fp32 on one
 * without (detection forced off and on with COOKTRAIN_CPU_BF16); a registered backend's own
 * answer wins over the CPU's. A bf16 gradient reduction needs bf16 training, however chosen. */
static void precision_auto(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(cfg.derived.precision, CT_PRECISION_FP32); /* the default: fp32 */
    assert_int_equal(ct_config_set(&cfg, "train.precision=bf16"), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "parallel.grad_reduce_dtype=bf16"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(cfg.derived.precision, CT_PRECISION_BF16);

    assert_int_equal(ct_config_set(&cfg, "train.precision=auto"), CT_OK);
    setenv("COOKTRAIN_CPU_BF16", "0", 1);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_ERR_INPUT); /* bf16 reduce, fp32 training */
    assert_int_equal(ct_config_set(&cfg, "parallel.grad_reduce_dtype=fp32"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(cfg.derived.precision, CT_PRECISION_FP32);
    assert_non_null(strstr(cfg.derived.precision_why, "COOKTRAIN_CPU_BF16=0"));
    /* the backend that will run decides, whatever the CPU: one that says it multiplies bf16
     * natively gets bf16, one that leaves native_bf16 NULL gets fp32 */
    static const ct_backend_desc native = {
        .name = "test-native", .create = no_backend, .native_bf16 = says_native};
    static const ct_backend_desc widening = {.name = "test-widening", .create = no_backend};
    ct_backend_register(&native);
    ct_backend_register(&widening);
    snprintf(cfg.runtime_backend, sizeof cfg.runtime_backend, "test-native");
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(cfg.derived.precision, CT_PRECISION_BF16);
    assert_string_equal(cfg.derived.precision_why, "auto: says so");
    setenv("COOKTRAIN_CPU_BF16", "1", 1);
    snprintf(cfg.runtime_backend, sizeof cfg.runtime_backend, "test-widening");
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(cfg.derived.precision, CT_PRECISION_FP32);
    assert_non_null(strstr(cfg.derived.precision_why, "test-widening widens bf16"));
    snprintf(cfg.runtime_backend, sizeof cfg.runtime_backend, "cpu");
    setenv("COOKTRAIN_CPU_BF16", "1", 1);
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(cfg.derived.precision, CT_PRECISION_BF16);
    unsetenv("COOKTRAIN_CPU_BF16");
    /* auto survives a round trip through the printed config */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ct_config_print(&cfg, f);
    fclose(f);
    assert_non_null(strstr(text, "precision: auto"));
    free(text);
}

/* train.cuda_graph: the cuda backend, one process, no MoE, no per-op timing; each refusal names
 * the key and what stands in its way, with a hint. */
static void cuda_graph_rules(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_int_equal(ct_config_set(&cfg, "train.cuda_graph=true"), CT_OK);
    assert_input_error(ct_config_validate(&cfg, 1), "the cpu backend has no graphs");
    snprintf(cfg.runtime_backend, sizeof cfg.runtime_backend, "cuda");
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_input_error(ct_config_validate(&cfg, 2), "the world size is 2");
    assert_int_equal(ct_config_set(&cfg, "model.moe_experts=4"), CT_OK);
    assert_input_error(ct_config_validate(&cfg, 1), "Mixture of Experts");
    assert_int_equal(ct_config_set(&cfg, "model.moe_experts=0"), CT_OK);
    const char *timers[] = {"log.profile=true", "log.device_idle=true", "log.trace=t.json"};
    const char *off[] = {"log.profile=false", "log.device_idle=false", "log.trace=''"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ct_config_set(&cfg, timers[i]), CT_OK);
        assert_input_error(ct_config_validate(&cfg, 1), "time the ops one by one");
        assert_int_equal(ct_config_set(&cfg, off[i]), CT_OK);
    }
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "train.cuda_graph=false"), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "log.profile=true"), CT_OK);
    assert_int_equal(ct_config_validate(&cfg, 2), CT_OK); /* off: none of it matters */
}

static void set_overrides(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_int_equal(ct_config_load_string(&cfg, "train:\n  lr: 0.01\n  steps: 7\n", "a.yaml"),
                     CT_OK);
    assert_int_equal(ct_config_set(&cfg, "train.lr=3e-4"), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "  parallel.tp = 2 "), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "parallel.sequence_parallel=yes"), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "parallel.schedule=GPipe"), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "data.train=/data/shards/train_*.bin"), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "data.val=\"a b=c\""), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "log.metrics=''"), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "checkpoint.resume=never"), CT_OK);
    assert_int_equal(ct_config_set(&cfg, "model.arch=llama"), CT_OK);
    assert_true(cfg.train.lr == 3e-4);
    assert_int_equal(cfg.train.steps, 7); /* untouched by the overrides */
    assert_int_equal(cfg.parallel.tp, 2);
    assert_true(cfg.parallel.sequence_parallel);
    assert_int_equal(cfg.parallel.schedule, CT_SCHEDULE_GPIPE);
    assert_string_equal(cfg.data.train, "/data/shards/train_*.bin");
    assert_string_equal(cfg.data.val, "a b=c");
    assert_string_equal(cfg.log.metrics, "");
    assert_string_equal(cfg.checkpoint.resume, "never");
    assert_int_equal(cfg.model.arch, CT_ARCH_LLAMA);
}

static void value_syntax(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    const char *yaml = "model:\n  n_layer: 8e0\n  seq_len: +512\n  vocab_size: \"1000\"\n"
                       "train:\n  steps: 1e3\n  seed: 18446744073709551615\n  lr: .5\n"
                       "  recompute: FULL\n"
                       "parallel:\n  sequence_parallel: On\n  bucket_mb: 2.5\n"
                       "data:\n  train: ~\n  val: null\n  tokenizer: 'tok: \"x\".bin'\n";
    ct_status st = ct_config_load_string(&cfg, yaml, "syntax.yaml");
    if (st != CT_OK) fail_msg("%s", ct_error_message());
    assert_int_equal(cfg.model.n_layer, 8);
    assert_int_equal(cfg.model.seq_len, 512);
    assert_int_equal(cfg.model.vocab_size, 1000);
    assert_int_equal(cfg.train.steps, 1000);
    assert_true(cfg.train.seed == UINT64_MAX);
    assert_true(cfg.train.lr == 0.5);
    assert_int_equal(cfg.train.recompute, CT_RECOMPUTE_FULL);
    assert_true(cfg.parallel.sequence_parallel);
    assert_true(cfg.parallel.bucket_mb == 2.5);
    assert_string_equal(cfg.data.train, "");
    assert_string_equal(cfg.data.val, "");
    assert_string_equal(cfg.data.tokenizer, "tok: \"x\".bin");
    const char *falses[] = {"false", "no", "off", "FALSE", "No", "oFF"};
    const char *trues[] = {"true", "yes", "on", "TRUE", "Yes", "ON"};
    for (int i = 0; i < 6; i++) {
        char a[80];
        snprintf(a, sizeof a, "parallel.sequence_parallel=%s", falses[i]);
        assert_int_equal(ct_config_set(&cfg, a), CT_OK);
        assert_false(cfg.parallel.sequence_parallel);
        snprintf(a, sizeof a, "parallel.sequence_parallel=%s", trues[i]);
        assert_int_equal(ct_config_set(&cfg, a), CT_OK);
        assert_true(cfg.parallel.sequence_parallel);
    }
}

/* The file and --set share one converter, so they fail the same way. */
static void set_and_file_fail_alike(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_int_equal(ct_config_load_string(&cfg, "train:\n  lr: abc\n", "f.yaml"), CT_ERR_INPUT);
    char from_file[512];
    snprintf(from_file, sizeof from_file, "%s", ct_error_message());
    assert_int_equal(ct_config_set(&cfg, "train.lr=abc"), CT_ERR_INPUT);
    assert_contains(from_file, "train.lr: expected a number, got 'abc'", "file message");
    assert_contains(ct_error_message(), "train.lr: expected a number, got 'abc'", "set message");
}

static void failed_load_leaves_config_untouched(void **state) {
    (void)state;
    ct_config before, cfg;
    ct_config_defaults(&cfg);
    assert_int_equal(ct_config_set(&cfg, "train.steps=42"), CT_OK);
    memcpy(&before, &cfg, sizeof cfg);
    assert_int_equal(ct_config_load_string(&cfg, "train:\n  lr: 0.5\n  steps: x\n", "x.yaml"),
                     CT_ERR_INPUT);
    assert_memory_equal(&cfg, &before, sizeof cfg);
    assert_int_equal(ct_config_set(&cfg, "train.steps=-1"), CT_ERR_INPUT);
    assert_memory_equal(&cfg, &before, sizeof cfg);
}

static void string_too_long(void **state) {
    (void)state;
    char yaml[2048];
    int n = snprintf(yaml, sizeof yaml, "data:\n  train: ");
    memset(yaml + n, 'a', CT_PATH_MAX);
    yaml[n + CT_PATH_MAX] = '\n';
    yaml[n + CT_PATH_MAX + 1] = '\0';
    ct_config cfg;
    ct_config_defaults(&cfg);
    assert_input_error(ct_config_load_string(&cfg, yaml, "long.yaml"), "data.train");
    assert_contains(ct_error_message(), "too long (512 bytes, at most 511)", "message");
    yaml[n + CT_PATH_MAX - 1] = '\n'; /* 511 bytes fit */
    yaml[n + CT_PATH_MAX] = '\0';
    assert_int_equal(ct_config_load_string(&cfg, yaml, "long.yaml"), CT_OK);
    assert_int_equal(strlen(cfg.data.train), CT_PATH_MAX - 1);
}

static void validate_checks_programmatic_values(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    cfg.train.steps = 0;
    assert_input_error(ct_config_validate(&cfg, 1), "train.steps=0");
    ct_config_defaults(&cfg);
    cfg.train.beta1 = 1.0;
    assert_input_error(ct_config_validate(&cfg, 1), "train.beta1=1");
    ct_config_defaults(&cfg);
    cfg.parallel.schedule = CT_SCHEDULE_FORWARD_ONLY; /* not a configurable schedule */
    assert_input_error(ct_config_validate(&cfg, 1), "parallel.schedule");
    assert_int_equal(cfg.derived.world_size, 0); /* not filled on failure */
}

/* Round trip: a config with every kind of value, printed (with derived comments), loads back
 * byte-identical. memcmp is valid because load and defaults zero whole string buffers and the
 * struct (see key_store). */
static void print_roundtrip(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    const char *sets[] = {
        "model.vocab_size=50257",
        "model.seq_len=64",
        "model.n_layer=8",
        "model.d_model=96",
        "model.n_head=6",
        "model.n_kv_head=2",
        "model.d_ff=200",
        "parallel.tp=2",
        "parallel.pp=2",
        "parallel.zero_stage=3",
        "parallel.schedule=interleaved",
        "parallel.virtual_stages=2",
        "parallel.pp_layers=1,3,2,2",
        "parallel.sequence_parallel=true",
        "parallel.bucket_mb=0.1",
        "parallel.timeout_s=12.5",
        "train.steps=1234",
        "train.global_batch=32",
        "train.micro_batch=2",
        "train.lr=3e-4",
        "train.min_lr=3.0000000000000001e-5",
        "train.warmup_steps=0",
        "train.weight_decay=0",
        "train.beta1=0.8999999999999999",
        "train.beta2=0.999",
        "train.eps=1e-12",
        "train.seed=18446744073709551615",
        "train.recompute=full",
        "train.eval_interval=50",
        "train.threads=3",
        "checkpoint.interval=100",
        "checkpoint.keep=1",
        "checkpoint.dir=/scratch/run 1/ckpt",
        "log.interval=1",
        "log.run_dir=runs/x",
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        ct_status st = ct_config_set(&cfg, sets[i]);
        if (st != CT_OK) fail_msg("%s: %s", sets[i], ct_error_message());
    }
    /* Strings that need quoting in YAML, set directly (the loader zeroes whole buffers, so do
     * the same here for the memcmp below). */
#define SET_STRING(field, text) (memset(field, 0, sizeof field), memcpy(field, text, sizeof text))
    SET_STRING(cfg.data.train, "a: \"quoted\" # not a comment\\");
    SET_STRING(cfg.data.val, "  tab\there, newline\n, ctrl\x01, é");
    SET_STRING(cfg.data.tokenizer, "- [list] {map} &anchor *x");
    SET_STRING(cfg.log.metrics, "'single'");
    SET_STRING(cfg.log.trace, "yes");
    SET_STRING(cfg.checkpoint.resume, "~");
#undef SET_STRING
    ct_status st = ct_config_validate(&cfg, 8);
    if (st != CT_OK) fail_msg("%s", ct_error_message());

    char *text = print_to_string(&cfg);
    assert_contains(text, "# derived:", "print");
    assert_contains(text, "#   dp: 2", "print");
    ct_config back;
    ct_config_defaults(&back);
    st = ct_config_load_string(&back, text, "printed.yaml");
    if (st != CT_OK) fail_msg("printed config does not load: %s\n%s", ct_error_message(), text);
    assert_int_equal(ct_config_validate(&back, 8), CT_OK);
    assert_memory_equal(&back, &cfg, sizeof cfg);
    free(text);

    /* And the defaults, printed before validation (no derived values). */
    ct_config_defaults(&cfg);
    text = print_to_string(&cfg);
    assert_contains(text, "not computed", "print");
    ct_config_defaults(&back);
    assert_int_equal(ct_config_set(&back, "train.steps=9"), CT_OK);
    assert_int_equal(ct_config_load_string(&back, text, "printed.yaml"), CT_OK);
    assert_memory_equal(&back, &cfg, sizeof cfg);
    free(text);
}

/* Every key ct_config_print writes has a row in the docs, and the row count matches. */
static void docs_list_every_key(void **state) {
    (void)state;
    ct_config cfg;
    ct_config_defaults(&cfg);
    char *text = print_to_string(&cfg), *docs = docs_to_string();
    char section[32] = "";
    int keys = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        char name[64];
        if (line[0] != ' ') {
            assert_int_equal(sscanf(line, "%31[a-z_]:", section), 1);
        } else if (sscanf(line, " %63[a-z_0-9]:", name) == 1) {
            char cell[128];
            snprintf(cell, sizeof cell, "| `%s.%s` |", section, name);
            assert_contains(docs, cell, "docs");
            keys++;
        }
    }
    int rows = 0;
    for (char *p = docs; (p = strstr(p, "\n| `")); p++) rows++;
    assert_int_equal(rows, keys);
    assert_true(keys >= 48);
    assert_contains(docs,
                    "| `parallel.schedule` | `1f1b` \\| `gpipe` \\| `interleaved` \\| `zbh1` \\| "
                    "`zbv` | `1f1b` |",
                    "docs");
    free(text);
    free(docs);
}

/* configs/README.md embeds the generated table; regenerate it when keys change:
 *     see the instructions at the top of configs/README.md */
static void readme_matches_key_table(void **state) {
    (void)state;
    char path[1200];
    snprintf(path, sizeof path, "%s/configs/README.md", source_dir());
    char *readme = read_text(path), *docs = docs_to_string();
    if (!strstr(readme, docs))
        fail_msg("configs/README.md is out of date with the key table in "
                 "core/config/config_keys.c; regenerate it with test/tools/gen_config_docs.c");
    free(readme);
    free(docs);
}

/* test/cli/bad_configs/NAME.yaml: first line "# expect: SUBSTRING"; the file must fail loading or
 * validation at world size 1 with a message containing SUBSTRING, CT_ERR_INPUT and a hint. */
static void bad_config_files(void **state) {
    (void)state;
    char dir_path[1200];
    snprintf(dir_path, sizeof dir_path, "%s/test/cli/bad_configs", source_dir());
    DIR *dir = opendir(dir_path);
    assert_non_null(dir);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".yaml") != 0) continue;
        char path[2400];
        snprintf(path, sizeof path, "%s/%s", dir_path, e->d_name);
        char *text = read_text(path);
        const char *tag = "# expect: ";
        if (strncmp(text, tag, strlen(tag)) != 0)
            fail_msg("%s: first line must be '# expect: <substring>'", path);
        char expect[256];
        size_t len = strcspn(text + strlen(tag), "\n");
        assert_true(len > 0 && len < sizeof expect);
        memcpy(expect, text + strlen(tag), len);
        expect[len] = '\0';
        free(text);

        ct_config cfg;
        ct_config_defaults(&cfg);
        ct_status st = ct_config_load_file(&cfg, path);
        if (st == CT_OK) st = ct_config_validate(&cfg, 1);
        if (st == CT_OK) fail_msg("%s: accepted, expected \"%s\"", path, expect);
        assert_int_equal(st, CT_ERR_INPUT);
        if (!strstr(ct_error_message(), expect))
            fail_msg("%s: message \"%s\" does not contain \"%s\"", path, ct_error_message(),
                     expect);
        if (!ct_error_hint()[0]) fail_msg("%s: no hint", path);
        files++;
    }
    closedir(dir);
    if (files < 15) fail_msg("only %d files in %s, expected at least 15", files, dir_path);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test(defaults_validate_world1),
        cmocka_unit_test(empty_inputs_are_defaults),
        cmocka_unit_test(empty_file_is_defaults),
        cmocka_unit_test(missing_file),
        cmocka_unit_test(directory_as_file),
        cmocka_unit_test(not_a_regular_file),
        cmocka_unit_test(file_errors_carry_path_and_line),
        cmocka_unit_test(gpt2_124m_derived),
        cmocka_unit_test(gqa_params),
        cmocka_unit_test(grid_derivation),
        cmocka_unit_test(pipeline_layouts),
        cmocka_unit_test(auto_micro_batch),
        cmocka_unit_test(warmup_bounded_by_steps),
        cmocka_unit_test(precision_auto),
        cmocka_unit_test(set_overrides),
        cmocka_unit_test(value_syntax),
        cmocka_unit_test(set_and_file_fail_alike),
        cmocka_unit_test(failed_load_leaves_config_untouched),
        cmocka_unit_test(string_too_long),
        cmocka_unit_test(validate_checks_programmatic_values),
        cmocka_unit_test(print_roundtrip),
        cmocka_unit_test(cuda_graph_rules),
        cmocka_unit_test(docs_list_every_key),
        cmocka_unit_test(readme_matches_key_table),
        cmocka_unit_test(bad_config_files),
    };
    /* One test per bad case, named after it, so a single case can be selected. */
    size_t n_fixed = sizeof fixed / sizeof fixed[0], n = n_fixed + N_BAD_CASES;
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    assert_non_null(tests);
    memcpy(tests, fixed, sizeof fixed);
    for (size_t i = 0; i < N_BAD_CASES; i++) {
        tests[n_fixed + i].name = bad_cases[i].name;
        tests[n_fixed + i].test_func = run_bad_case;
        tests[n_fixed + i].initial_state = (void *)&bad_cases[i];
    }
    int failed = _cmocka_run_group_tests("config", tests, n, NULL, NULL);
    free(tests);
    return failed ? 1 : 0;
}
