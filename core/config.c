/*
 * config.c — the run configuration: key table, YAML loader, --set, validation, printing.
 *
 * Everything about a key lives in one row of keys[]: section, name, type, where it is stored in
 * ct_config, default, allowed range and one line of documentation. Defaults, the YAML loader,
 * --set, the per-key range checks, ct_config_print and the generated configs/README.md all walk
 * that table, so a key added there is parsed, checked, printed and documented with no other
 * change. The YAML name of a key is the name of its struct field (the KEY macro stringifies it),
 * so the two cannot drift apart. Consistency *between* keys (divisibility, the rank grid, the
 * batch) is ct_config_validate's job, because it needs the world size.
 *
 * Value syntax (the same for the file and for --set):
 *   int     decimal digits with an optional sign; exponent notation (1e3, 2.5e3) is accepted when
 *           the value is a whole number, so "1.5" is rejected and "1e3" is 1000. Values that do
 *           not fit in 64 bits are rejected, never wrapped.
 *   uint64  like int, but no sign (the seed).
 *   float   anything strtod reads in full, finite (no nan/inf, no hex).
 *   bool    true/false, yes/no, on/off, any case.
 *   enum    one of the listed names, any case.
 *   string  any scalar; an empty or null (~, null) value is the empty string.
 * An empty value for a non-string key is an error: silently keeping the default would hide a
 * half-edited file.
 */
#include "config.h"

#include "cpu_gemm.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

/* ---- the key table --------------------------------------------------------------------------- */

typedef enum key_type {
    KEY_INT,    /* int64_t */
    KEY_UINT64, /* uint64_t */
    KEY_FLOAT,  /* double */
    KEY_BOOL,   /* bool */
    KEY_STRING, /* char[size], NUL-terminated */
    KEY_ENUM,   /* a C enum (int-sized); choices[value] is its name */
} key_type;

typedef struct config_key {
    const char *section;
    const char *name;
    key_type type;
    size_t offset;              /* into ct_config */
    size_t size;                /* of the field; for strings the buffer size including the NUL */
    const char *const *choices; /* KEY_ENUM: NULL-terminated, indexed by the enum value */
    const char *def;            /* default as text: it goes through the same parser as the file */
    bool has_min, min_open;     /* min_open: value must be > min instead of >= min */
    bool has_max, max_open;
    double min, max; /* exact for every bound used below (all < 2^53) */
    bool nonempty;   /* KEY_STRING: "" is not allowed */
    bool auto_zero;  /* KEY_INT: the word "auto" is accepted and stored as 0 (resolved by
                        ct_config_validate; see micro_batch_auto in config.h) */
    const char *doc;
} config_key;

#define KEY(sec, key, t)                                                                           \
    .section = #sec, .name = #key, .type = (t), .offset = offsetof(ct_config, sec.key),            \
    .size = sizeof(((ct_config *)0)->sec.key)
#define AT_LEAST(x) .has_min = true, .min = (x)
#define ABOVE(x) .has_min = true, .min = (x), .min_open = true
#define AT_MOST(x) .has_max = true, .max = (x)
#define BELOW(x) .has_max = true, .max = (x), .max_open = true

static const char *const arch_names[] = {"gpt2", "llama", NULL};
static const char *const schedule_names[] = {"1f1b", "gpipe", "interleaved", NULL};
static const char *const precision_names[] = {"fp32", "bf16", "auto", NULL};
static const char *const reduce_dtype_names[] = {"fp32", "bf16", NULL};
static const char *const recompute_names[] = {"none", "full", NULL};

static const char *const sections[] = {"model", "parallel", "train", "data", "checkpoint", "log"};
#define N_SECTIONS ((int)(sizeof sections / sizeof sections[0]))

/*
 * Upper bounds exist so that ct_config_validate's products (parameter count, tp·pp·dp,
 * tokens per step) cannot overflow int64; they are far beyond any real model.
 */
static const config_key keys[] = {
    /* model */
    {KEY(model, arch, KEY_ENUM), .choices = arch_names, .def = "gpt2",
     .doc = "model family (llama is recognised but not implemented yet)"},
    {KEY(model, vocab_size, KEY_INT), .def = "4096", AT_LEAST(1), AT_MOST(2147483647),
     .doc = "tokens the tokenizer can emit (the real vocabulary)"},
    {KEY(model, vocab_pad, KEY_INT), .def = "128", AT_LEAST(1), AT_MOST(1048576),
     .doc = "embedding and LM head rows are vocab_size rounded up to a multiple of this"},
    {KEY(model, seq_len, KEY_INT), .def = "256", AT_LEAST(1), AT_MOST(1048576),
     .doc = "tokens per sequence (context length)"},
    {KEY(model, n_layer, KEY_INT), .def = "4", AT_LEAST(1), AT_MOST(65536),
     .doc = "transformer layers"},
    {KEY(model, d_model, KEY_INT), .def = "256", AT_LEAST(1), AT_MOST(1048576),
     .doc = "hidden size; must be a multiple of n_head"},
    {KEY(model, n_head, KEY_INT), .def = "4", AT_LEAST(1), AT_MOST(65536),
     .doc = "attention (query) heads"},
    {KEY(model, n_kv_head, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(65536),
     .doc = "key/value heads (grouped-query attention), must divide n_head; 0 = n_head"},
    {KEY(model, d_ff, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(16777216),
     .doc = "MLP hidden size; 0 = 4 * d_model"},

    /* parallel */
    {KEY(parallel, tp, KEY_INT), .def = "1", AT_LEAST(1), AT_MOST(1048576),
     .doc = "tensor-parallel degree (a TP group is consecutive ranks)"},
    {KEY(parallel, pp, KEY_INT), .def = "1", AT_LEAST(1), AT_MOST(1048576),
     .doc = "pipeline-parallel stages"},
    {KEY(parallel, dp, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(1048576),
     .doc = "data-parallel degree; 0 = world_size / (tp * pp)"},
    {KEY(parallel, zero_stage, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(3),
     .doc = "ZeRO stage: 0 replicated, 1 shards optimizer state, 2 also gradients, 3 also "
            "parameters (FSDP)"},
    {KEY(parallel, schedule, KEY_ENUM), .choices = schedule_names, .def = "1f1b",
     .doc = "pipeline schedule"},
    {KEY(parallel, virtual_stages, KEY_INT), .def = "1", AT_LEAST(1),
     AT_MOST(CT_MAX_VIRTUAL_STAGES),
     .doc = "model chunks per pipeline rank; the interleaved schedule needs >= 2"},
    {KEY(parallel, pp_layers, KEY_STRING), .def = "",
     .doc = "explicit layers per chunk, comma-separated (pp * virtual_stages counts summing to "
            "n_layer); empty = even split"},
    {KEY(parallel, sequence_parallel, KEY_BOOL), .def = "false",
     .doc = "sequence parallelism inside TP groups (needs seq_len divisible by tp)"},
    {KEY(parallel, bucket_mb, KEY_FLOAT), .def = "0", AT_LEAST(0), AT_MOST(1048576),
     .doc = "merge consecutive layers of a pipeline chunk into one FSDP unit (the grain of "
            "gradient reduction, ZeRO sharding and ZeRO-3 gathering) of at least this many MiB "
            "of a rank's parameters; 0 = one unit per layer"},
    {KEY(parallel, timeout_s, KEY_FLOAT), .def = "300", ABOVE(0),
     .doc = "a collective unfinished after this many seconds aborts the job with a report"},
    {KEY(parallel, grad_reduce_dtype, KEY_ENUM), .choices = reduce_dtype_names, .def = "fp32",
     .doc = "dtype of the data-parallel gradient reduction: bf16 halves its traffic (needs "
            "train.precision bf16)"},

    /* train */
    {KEY(train, steps, KEY_INT), .def = "100", AT_LEAST(1), .doc = "optimizer steps to run"},
    {KEY(train, global_batch, KEY_INT), .def = "8", AT_LEAST(1), AT_MOST(2147483647),
     .doc = "sequences per optimizer step, whatever the layout"},
    {KEY(train, micro_batch, KEY_INT), .def = "auto", AT_LEAST(1), AT_MOST(2147483647),
     .auto_zero = true,
     .doc = "sequences per microbatch on each data-parallel rank; auto = the largest divisor of "
            "global_batch / dp with micro_batch * seq_len <= 8192 tokens (with pp > 1 keeping at "
            "least 4 * pp microbatches where the batch allows)"},
    {KEY(train, lr, KEY_FLOAT), .def = "1e-3", ABOVE(0),
     .doc = "peak learning rate, reached after warmup"},
    {KEY(train, min_lr, KEY_FLOAT), .def = "1e-4", AT_LEAST(0),
     .doc = "learning rate at the end of the decay; <= lr"},
    {KEY(train, warmup_steps, KEY_INT), .def = "10", AT_LEAST(0),
     .doc = "steps of linear warmup; <= steps"},
    {KEY(train, weight_decay, KEY_FLOAT), .def = "0.1", AT_LEAST(0),
     .doc = "AdamW decoupled weight decay (matrices and embeddings; not biases or norms)"},
    {KEY(train, grad_clip, KEY_FLOAT), .def = "1.0", AT_LEAST(0),
     .doc = "clip the global gradient norm to this; 0 disables clipping"},
    {KEY(train, beta1, KEY_FLOAT), .def = "0.9", AT_LEAST(0), BELOW(1),
     .doc = "AdamW first-moment decay"},
    {KEY(train, beta2, KEY_FLOAT), .def = "0.95", AT_LEAST(0), BELOW(1),
     .doc = "AdamW second-moment decay"},
    {KEY(train, eps, KEY_FLOAT), .def = "1e-8", ABOVE(0), .doc = "AdamW epsilon"},
    {KEY(train, seed, KEY_UINT64), .def = "1337",
     .doc = "seed of parameter initialisation and data order"},
    {KEY(train, precision, KEY_ENUM), .choices = precision_names, .def = "fp32",
     .doc = "fp32 everywhere (exact), or bf16 mixed precision: bf16 parameters and activations, "
            "fp32 master weights, optimizer state and accumulation; auto = bf16 where the "
            "hardware multiplies bf16 natively (CPU: AMX or AVX512-BF16), else fp32"},
    {KEY(train, recompute, KEY_ENUM), .choices = recompute_names, .def = "none",
     .doc = "activation recompute: full keeps only each layer's input and recomputes the rest"},
    {KEY(train, eval_interval, KEY_INT), .def = "0", AT_LEAST(0),
     .doc = "evaluate on data.val every this many steps; 0 disables evaluation"},
    {KEY(train, eval_steps, KEY_INT), .def = "4", AT_LEAST(1),
     .doc = "global batches per evaluation"},
    {KEY(train, max_bad_steps, KEY_INT), .def = "5", AT_LEAST(1),
     .doc = "consecutive steps with a NaN/Inf loss or gradient norm before the job aborts"},
    {KEY(train, threads, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(4096),
     .doc = "threads per rank; 0 = cores / ranks on this node"},
    {KEY(train, stop_after, KEY_INT), .def = "0", AT_LEAST(0),
     .doc = "stop after this many steps as if preempted (saving a checkpoint when "
            "checkpoint.dir is set; the schedule still runs to train.steps); 0 = never"},

    /* data */
    {KEY(data, train, KEY_STRING), .def = "", .doc = "training token shards: a path or a glob"},
    {KEY(data, val, KEY_STRING), .def = "", .doc = "validation token shards: a path or a glob"},
    {KEY(data, tokenizer, KEY_STRING), .def = "",
     .doc = "tokenizer file written by `cooktrain prepare`"},

    /* checkpoint */
    {KEY(checkpoint, dir, KEY_STRING), .def = "",
     .doc = "directory of the checkpoints (step-N/ and `latest`); empty = no checkpoints. With "
            "a directory, a checkpoint is also saved after the last step and when stopped"},
    {KEY(checkpoint, interval, KEY_INT), .def = "0", AT_LEAST(0),
     .doc = "save every this many steps; 0 = no periodic saves"},
    {KEY(checkpoint, async, KEY_BOOL), .def = "true",
     .doc = "write checkpoint files on a background thread: training waits only for the copy of "
            "its state to host memory"},
    {KEY(checkpoint, keep, KEY_INT), .def = "3", AT_LEAST(1),
     .doc = "checkpoints kept (the oldest are deleted)"},
    {KEY(checkpoint, resume, KEY_STRING), .def = "auto", .nonempty = true,
     .doc = "auto (the newest checkpoint in dir that loads, if any; older ones are tried when it "
            "does not) | never | PATH of a checkpoint"},

    /* log */
    {KEY(log, interval, KEY_INT), .def = "10", AT_LEAST(1),
     .doc = "print a progress line every this many steps"},
    {KEY(log, metrics, KEY_STRING), .def = "", .doc = "JSON-lines metrics file; empty = none"},
    {KEY(log, trace, KEY_STRING), .def = "", .doc = "Chrome/Perfetto trace file; empty = none"},
    {KEY(log, run_dir, KEY_STRING), .def = "",
     .doc = "directory for this run's outputs: the resolved config.yaml, and metrics.jsonl "
            "unless log.metrics is set; empty = none"},
    {KEY(log, profile, KEY_BOOL), .def = "false",
     .doc = "time ops by category (gemm, attention, norms, ...) and print them per log interval"},
    {KEY(log, sample_tokens, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(1048576),
     .doc = "after training, print this many sampled tokens (needs data.tokenizer); 0 = none"},
    {KEY(log, sample_prompt, KEY_STRING), .def = "",
     .doc = "text the after-training sample continues"},
};
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

/* A converted value, before it is stored (so a failed range check leaves the config as it was). */
typedef struct key_value {
    int64_t i;
    uint64_t u;
    double f;
    bool b;
    int e;
    const char *s; /* KEY_STRING: points into the caller's text */
    bool typed;    /* KEY_INT: converted from digits (so an auto_zero key's 0 is a typed 0,
                      out of range, not the word auto) */
    size_t slen;
} key_value;

/* ---- small helpers --------------------------------------------------------------------------- */

/* Sets the hint and passes the status through: `return with_hint(ct_error(...), "...")`. */
__attribute__((format(printf, 2, 3))) static ct_status with_hint(ct_status st, const char *fmt,
                                                                 ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ct_hint("%s", buf);
    return st;
}

static const char *key_full_name(const config_key *k, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", k->section, k->name);
    return buf;
}

/* A user value made safe to put in a message: printable bytes only, at most ~60 of them, so a
 * stray binary blob or a huge line cannot flood the terminal. */
static const char *shown(const char *text, size_t len, char *buf, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < len && n + 4 < cap; i++) {
        if (n >= 60) {
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
        unsigned char c = (unsigned char)text[i];
        buf[n++] = (c >= 0x20 && c != 0x7f) ? (char)c : '?';
    }
    buf[n] = '\0';
    return buf;
}

/* Shortest of %.15g..%.17g that reads back to the same double, so printed configs round-trip
 * exactly and still show 0.1 rather than 0.10000000000000001. */
static void format_double(double v, char *buf, size_t cap) {
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static void format_count(int64_t n, char *buf, size_t cap) {
    if (n < 1000)
        snprintf(buf, cap, "%lld", (long long)n);
    else if (n < 1000000)
        snprintf(buf, cap, "%.2fK", (double)n / 1e3);
    else if (n < 1000000000)
        snprintf(buf, cap, "%.2fM", (double)n / 1e6);
    else
        snprintf(buf, cap, "%.2fB", (double)n / 1e9);
}

/* Appends printf output to buf (bounded; truncates silently, which only shortens a hint). */
__attribute__((format(printf, 3, 4))) static void append(char *buf, size_t cap, const char *fmt,
                                                         ...) {
    size_t n = strlen(buf);
    if (n + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The divisors of n (n >= 1) in increasing order; returns how many (at most cap). */
static int divisors(int64_t n, int64_t *out, int cap) {
    int count = 0;
    for (int64_t i = 1; i * i <= n && count < cap; i++) {
        if (n % i) continue;
        out[count++] = i;
        if (i != n / i && count < cap) out[count++] = n / i;
    }
    qsort(out, (size_t)count, sizeof *out, cmp_i64);
    return count;
}

/* "1, 2, 4, 8" — the first few divisors of n that `keep` accepts (NULL: all). */
static void list_divisors(int64_t n, bool (*keep)(int64_t d, const void *arg), const void *arg,
                          char *buf, size_t cap) {
    int64_t d[2048];
    int count = divisors(n, d, 2048), shown_count = 0;
    buf[0] = '\0';
    for (int i = 0; i < count; i++) {
        if (keep && !keep(d[i], arg)) continue;
        if (shown_count == 12) {
            append(buf, cap, ", ...");
            break;
        }
        append(buf, cap, "%s%lld", shown_count ? ", " : "", (long long)d[i]);
        shown_count++;
    }
    if (!shown_count) snprintf(buf, cap, "none");
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Levenshtein distance; names longer than 63 bytes count as far from everything. */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 1000;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int best = diag + cost;
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* A suggestion must be close (<= 3 edits) and not a complete rewrite of a short name, or `xy`
 * would "suggest" tp. */
static bool close_enough(int dist, const char *typed) {
    return dist <= 3 && dist < (int)strlen(typed);
}

/* ---- lookups and suggestions ----------------------------------------------------------------- */

static int find_section(const char *name) {
    for (int s = 0; s < N_SECTIONS; s++)
        if (strcmp(sections[s], name) == 0) return s;
    return -1;
}

static const config_key *find_key(const char *section, const char *name) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].section, section) == 0 && strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

/* Nearest key to `name` typed under a known `section`. A key of another section costs one extra
 * edit, so `train.tp` finds parallel.tp while `model.n_layers` stays in model. */
static const config_key *suggest_key(const char *section, const char *name) {
    const config_key *best = NULL;
    int best_score = 1000;
    for (int i = 0; i < N_KEYS; i++) {
        int d = edit_distance(name, keys[i].name);
        if (!close_enough(d, name)) continue;
        int score = d + (strcmp(keys[i].section, section) != 0);
        if (score < best_score) {
            best_score = score;
            best = &keys[i];
        }
    }
    return best_score <= 3 ? best : NULL;
}

/* Nearest key to "section.name" when the section itself is unknown (--set modle.n_layer=4). */
static const config_key *suggest_full_key(const char *section, const char *name) {
    const config_key *best = NULL;
    int best_score = 1000;
    for (int i = 0; i < N_KEYS; i++) {
        int score = edit_distance(section, keys[i].section) + edit_distance(name, keys[i].name);
        if (score < best_score) {
            best_score = score;
            best = &keys[i];
        }
    }
    return best_score <= 3 ? best : NULL;
}

static void list_section_keys(const char *section, char *buf, size_t cap) {
    buf[0] = '\0';
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].section, section) == 0)
            append(buf, cap, "%s%s", buf[0] ? ", " : "", keys[i].name);
}

static void list_choices(const config_key *k, const char *sep, char *buf, size_t cap) {
    buf[0] = '\0';
    for (int c = 0; k->choices[c]; c++) append(buf, cap, "%s%s", c ? sep : "", k->choices[c]);
}

static ct_status unknown_key_error(const char *where, const char *section, const char *name) {
    char show[80];
    ct_error(CT_ERR_INPUT, "%sunknown key %s.%s", where, section,
             shown(name, strlen(name), show, sizeof show));
    const config_key *s = suggest_key(section, name);
    if (s) return with_hint(CT_ERR_INPUT, "did you mean %s.%s?", s->section, s->name);
    char list[1024];
    list_section_keys(section, list, sizeof list);
    return with_hint(CT_ERR_INPUT, "valid keys in %s: %s", section, list);
}

static ct_status unknown_section_error(const char *where, const char *name) {
    char show[80];
    ct_error(CT_ERR_INPUT, "%sunknown section '%s'", where,
             shown(name, strlen(name), show, sizeof show));
    int best = -1, best_d = 1000;
    for (int s = 0; s < N_SECTIONS; s++) {
        int d = edit_distance(name, sections[s]);
        if (close_enough(d, name) && d < best_d) {
            best_d = d;
            best = s;
        }
    }
    if (best >= 0) return with_hint(CT_ERR_INPUT, "did you mean %s?", sections[best]);
    /* A key written at the top level (`lr: 3e-4`) is a common slip: point at its section. */
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            return with_hint(CT_ERR_INPUT, "%s is a key of the %s section: write it under '%s:'",
                             keys[i].name, keys[i].section, keys[i].section);
    return with_hint(CT_ERR_INPUT, "valid sections: model, parallel, train, data, checkpoint, log");
}

/* ---- conversion, range checks, storage ------------------------------------------------------- */

static void describe_range(const config_key *k, char *buf, size_t cap) {
    char lo[40], hi[40];
    /* All bounds are exact in a double and integral for integer keys. */
    format_double(k->min, lo, sizeof lo);
    format_double(k->max, hi, sizeof hi);
    if (k->has_min && k->has_max)
        snprintf(buf, cap, "in %c%s, %s%c", k->min_open ? '(' : '[', lo, hi,
                 k->max_open ? ')' : ']');
    else if (k->has_min)
        snprintf(buf, cap, "%s %s", k->min_open ? ">" : ">=", lo);
    else if (k->has_max)
        snprintf(buf, cap, "%s %s", k->max_open ? "<" : "<=", hi);
    else
        snprintf(buf, cap, "anything");
}

/* Checks a converted value against the key's constraints. `where` prefixes the message. */
static ct_status key_check(const config_key *k, const key_value *v, const char *where) {
    char full[96], val[64], range[96];
    key_full_name(k, full, sizeof full);
    switch (k->type) {
    case KEY_STRING:
        if (k->nonempty && v->slen == 0)
            return with_hint(ct_error(CT_ERR_INPUT, "%s%s is empty", where, full),
                             "%s: %s (default %s)", full, k->doc, k->def);
        return CT_OK;
    case KEY_ENUM: {
        int count = 0;
        while (k->choices[count]) count++;
        if (v->e < 0 || v->e >= count) {
            char list[256];
            list_choices(k, ", ", list, sizeof list);
            return with_hint(ct_error(CT_ERR_INPUT, "%s%s has invalid value %d", where, full, v->e),
                             "allowed values of %s: %s", full, list);
        }
        return CT_OK;
    }
    case KEY_BOOL:
    case KEY_UINT64: return CT_OK;
    case KEY_INT:
    case KEY_FLOAT: break;
    }
    if (k->type == KEY_INT && k->auto_zero && v->i == 0 && !v->typed) return CT_OK; /* auto */
    double x;
    if (k->type == KEY_INT) {
        x = (double)v->i;
        snprintf(val, sizeof val, "%lld", (long long)v->i);
    } else {
        x = v->f;
        format_double(v->f, val, sizeof val);
    }
    bool ok = true;
    if (k->has_min) ok = ok && (k->min_open ? x > k->min : x >= k->min);
    if (k->has_max) ok = ok && (k->max_open ? x < k->max : x <= k->max);
    if (ok) return CT_OK;
    describe_range(k, range, sizeof range);
    return with_hint(
        ct_error(CT_ERR_INPUT, "%s%s=%s is out of range: must be %s", where, full, val, range),
        "%s: %s (default %s)", full, k->doc, k->def);
}

static bool is_null_text(const char *s) {
    return s[0] == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
           strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

/* Reads a whole-number value; *overflow tells "too big" apart from "not a number". */
static bool parse_whole(const char *text, bool is_signed, int64_t *out_i, uint64_t *out_u,
                        bool *overflow) {
    *overflow = false;
    if (strpbrk(text, "xX")) return false; /* no hex: strtod would read 0x10 as 16 */
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    if (!is_signed && *p == '-') return false;
    char *end;
    errno = 0;
    if (is_signed) {
        long long v = strtoll(p, &end, 10);
        if (end != p && *end == '\0') {
            if (errno == ERANGE) *overflow = true;
            *out_i = v;
            return !*overflow;
        }
    } else {
        unsigned long long v = strtoull(p, &end, 10);
        if (end != p && *end == '\0') {
            if (errno == ERANGE) *overflow = true;
            *out_u = v;
            return !*overflow;
        }
    }
    /* Exponent notation: accepted when the value is a whole number (1e3, not 1.5). */
    double d = strtod(p, &end);
    if (end == p || *end != '\0' || !isfinite(d) || d != trunc(d)) return false;
    if (is_signed) {
        if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) {
            *overflow = true;
            return false;
        }
        *out_i = (int64_t)d;
    } else {
        if (d >= 18446744073709551616.0) {
            *overflow = true;
            return false;
        }
        *out_u = (uint64_t)d;
    }
    return true;
}

/*
 * Converts `text` (len bytes, NUL-terminated) for key k into *v and checks its range.
 * `is_null`: the YAML value was a plain empty/~/null scalar. `where` prefixes messages.
 */
static ct_status key_convert(const config_key *k, const char *text, size_t len, bool is_null,
                             const char *where, key_value *v) {
    char full[96], show[80];
    key_full_name(k, full, sizeof full);
    shown(text, len, show, sizeof show);
    memset(v, 0, sizeof *v);
    if (memchr(text, '\0', len))
        return with_hint(ct_error(CT_ERR_INPUT, "%s%s: value contains a NUL byte", where, full),
                         "remove the \\0 escape from the value of %s", full);
    if (k->type == KEY_STRING) {
        if (is_null) len = 0;
        if (len >= k->size)
            return with_hint(ct_error(CT_ERR_INPUT,
                                      "%s%s: value is too long (%zu bytes, at most %zu)", where,
                                      full, len, k->size - 1),
                             "use a shorter value for %s, e.g. a relative path", full);
        v->s = text;
        v->slen = len;
        return key_check(k, v, where);
    }
    if (is_null || len == 0)
        return with_hint(ct_error(CT_ERR_INPUT, "%s%s: empty value", where, full),
                         "give %s a value (default %s) or delete the line", full, k->def);
    bool overflow;
    switch (k->type) {
    case KEY_INT:
    case KEY_UINT64: {
        bool is_signed = k->type == KEY_INT;
        if (k->auto_zero && strcasecmp(text, "auto") == 0) {
            v->i = 0;
            return CT_OK;
        }
        if (parse_whole(text, is_signed, &v->i, &v->u, &overflow)) {
            v->typed = true;
            break;
        }
        if (overflow)
            return with_hint(ct_error(CT_ERR_INPUT, "%s%s: '%s' does not fit in a 64-bit %sinteger",
                                      where, full, show, is_signed ? "" : "unsigned "),
                             "%s: %s (default %s)", full, k->doc, k->def);
        return with_hint(ct_error(CT_ERR_INPUT, "%s%s: expected %s, got '%s'", where, full,
                                  is_signed ? "an integer" : "a non-negative integer", show),
                         "%s takes a whole number%s (%s; default %s)", full,
                         k->auto_zero ? " or auto" : "", k->doc, k->def);
    }
    case KEY_FLOAT: {
        char *end = (char *)text;
        const char *p = text;
        while (isspace((unsigned char)*p)) p++;
        double d = 0;
        if (!strpbrk(p, "xX")) d = strtod(p, &end); /* no hex floats */
        if (end == text || end == p || *end != '\0')
            return with_hint(
                ct_error(CT_ERR_INPUT, "%s%s: expected a number, got '%s'", where, full, show),
                "write a decimal or exponent number, e.g. %s: %s (default)", full, k->def);
        if (!isfinite(d))
            return with_hint(ct_error(CT_ERR_INPUT, "%s%s: expected a finite number, got '%s'",
                                      where, full, show),
                             "%s: %s (default %s)", full, k->doc, k->def);
        v->f = d;
        break;
    }
    case KEY_BOOL: {
        static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no",
                                                                               "off"};
        bool found = false;
        for (int i = 0; i < 3 && !found; i++) {
            if (strcasecmp(text, yes[i]) == 0)
                found = v->b = true;
            else if (strcasecmp(text, no[i]) == 0) {
                found = true;
                v->b = false;
            }
        }
        if (!found)
            return with_hint(
                ct_error(CT_ERR_INPUT, "%s%s: expected true or false, got '%s'", where, full, show),
                "booleans are true/false, yes/no or on/off");
        break;
    }
    case KEY_ENUM: {
        int best = -1, best_d = 1000;
        for (int c = 0; k->choices[c]; c++) {
            if (strcasecmp(text, k->choices[c]) == 0) {
                v->e = c;
                return CT_OK;
            }
            int d = edit_distance(text, k->choices[c]);
            if (close_enough(d, text) && d < best_d) {
                best_d = d;
                best = c;
            }
        }
        char list[256];
        list_choices(k, ", ", list, sizeof list);
        ct_error(CT_ERR_INPUT, "%s%s: unknown value '%s'", where, full, show);
        if (best >= 0)
            return with_hint(CT_ERR_INPUT, "did you mean %s? allowed values of %s: %s",
                             k->choices[best], full, list);
        return with_hint(CT_ERR_INPUT, "allowed values of %s: %s", full, list);
    }
    case KEY_STRING: break; /* handled above */
    }
    return key_check(k, v, where);
}

/* Whether an auto_zero key was resolved from auto by ct_config_validate, so that it prints as
 * auto again. Only train.micro_batch is such a key; its flag is train.micro_batch_auto. */
static bool resolved_from_auto(const ct_config *cfg, const config_key *k) {
    CT_ASSERTF(k->offset == offsetof(ct_config, train.micro_batch), "%s.%s has no auto flag",
               k->section, k->name);
    return cfg->train.micro_batch_auto;
}

static void key_store(ct_config *cfg, const config_key *k, const key_value *v) {
    char *p = (char *)cfg + k->offset;
    /* A value stored now is what the user asked for, not a resolved auto. */
    if (k->auto_zero && resolved_from_auto(cfg, k)) cfg->train.micro_batch_auto = false;
    switch (k->type) {
    case KEY_INT: memcpy(p, &v->i, sizeof v->i); break;
    case KEY_UINT64: memcpy(p, &v->u, sizeof v->u); break;
    case KEY_FLOAT: memcpy(p, &v->f, sizeof v->f); break;
    case KEY_BOOL: memcpy(p, &v->b, sizeof v->b); break;
    case KEY_ENUM: memcpy(p, &v->e, sizeof v->e); break;
    case KEY_STRING:
        /* Zero the whole buffer: configs that hold the same values are then byte-identical,
         * which is what the round-trip test (and anyone hashing a config) relies on. */
        memset(p, 0, k->size);
        memcpy(p, v->s, v->slen);
        break;
    }
}

static key_value key_load(const ct_config *cfg, const config_key *k) {
    const char *p = (const char *)cfg + k->offset;
    key_value v;
    memset(&v, 0, sizeof v);
    switch (k->type) {
    case KEY_INT: memcpy(&v.i, p, sizeof v.i); break;
    case KEY_UINT64: memcpy(&v.u, p, sizeof v.u); break;
    case KEY_FLOAT: memcpy(&v.f, p, sizeof v.f); break;
    case KEY_BOOL: memcpy(&v.b, p, sizeof v.b); break;
    case KEY_ENUM: memcpy(&v.e, p, sizeof v.e); break;
    case KEY_STRING:
        v.s = p;
        v.slen = strnlen(p, k->size);
        break;
    }
    return v;
}

static ct_status key_assign(ct_config *cfg, const config_key *k, const char *text, size_t len,
                            bool is_null, const char *where) {
    key_value v;
    CT_TRY(key_convert(k, text, len, is_null, where, &v));
    key_store(cfg, k, &v);
    return CT_OK;
}

/* The table describes the struct: a row whose size disagrees with its type is a bug in this
 * file, caught on the first ct_config_defaults call rather than as silent memory corruption. */
static void check_table(void) {
    static bool checked;
    if (checked) return;
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &keys[i];
        size_t want = 0;
        switch (k->type) {
        case KEY_INT: want = sizeof(int64_t); break;
        case KEY_UINT64: want = sizeof(uint64_t); break;
        case KEY_FLOAT: want = sizeof(double); break;
        case KEY_BOOL: want = sizeof(bool); break;
        case KEY_ENUM: want = sizeof(int); break;
        case KEY_STRING: want = k->size; break;
        }
        CT_ASSERTF(k->size == want, "config key %s.%s: field size %zu, type wants %zu", k->section,
                   k->name, k->size, want);
        CT_ASSERTF(find_section(k->section) >= 0, "config key %s.%s: unknown section", k->section,
                   k->name);
        CT_ASSERTF(k->type != KEY_ENUM || k->choices, "config key %s.%s: no choices", k->section,
                   k->name);
    }
    checked = true;
}

void ct_config_defaults(ct_config *cfg) {
    check_table();
    /* Zeroing first makes padding bytes deterministic too (see key_store). */
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &keys[i];
        ct_status st = key_assign(cfg, k, k->def, strlen(k->def), false, "default of ");
        CT_ASSERTF(st == CT_OK, "bad default in the config table: %s", ct_error_message());
    }
    cfg->runtime_backend_cuda = false;
}

/* ---- YAML loading ---------------------------------------------------------------------------- */

typedef struct loader {
    yaml_parser_t parser;
    const char *origin;
    ct_config *cfg;                  /* the working copy; committed only on success */
    size_t section_line[N_SECTIONS]; /* line where each section was opened (0 = not seen) */
    size_t key_line[N_KEYS];         /* line where each key was set (0 = not seen) */
} loader;

/* "origin:line:col: " for messages about the element at `mark`. */
static const char *where_at(const loader *ld, yaml_mark_t mark, char *buf, size_t cap) {
    snprintf(buf, cap, "%s:%zu:%zu: ", ld->origin, mark.line + 1, mark.column + 1);
    return buf;
}

static ct_status syntax_error(const loader *ld) {
    const yaml_parser_t *p = &ld->parser;
    const char *problem = p->problem ? p->problem : "malformed YAML";
    if (p->error == YAML_MEMORY_ERROR)
        return ct_error(CT_ERR_RUNTIME, "%s: out of memory while parsing YAML", ld->origin);
    if (p->error == YAML_READER_ERROR)
        return with_hint(ct_error(CT_ERR_INPUT, "%s: cannot read YAML at byte %zu: %s", ld->origin,
                                  p->problem_offset, problem),
                         "a config must be UTF-8 text without control characters");
    size_t line = p->problem_mark.line + 1, col = p->problem_mark.column + 1;
    ct_error(CT_ERR_INPUT, "%s:%zu:%zu: YAML syntax error: %s", ld->origin, line, col, problem);
    if (p->context)
        return with_hint(CT_ERR_INPUT, "%s (line %zu); check indentation and quoting near line %zu",
                         p->context, p->context_mark.line + 1, line);
    return with_hint(CT_ERR_INPUT, "check indentation (spaces, not tabs) and quoting near line %zu",
                     line);
}

static ct_status next_event(loader *ld, yaml_event_t *ev) {
    if (!yaml_parser_parse(&ld->parser, ev)) return syntax_error(ld);
    return CT_OK;
}

static bool event_is_null(const yaml_event_t *ev) {
    return ev->type == YAML_SCALAR_EVENT && ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           is_null_text((const char *)ev->data.scalar.value);
}

static const char *event_kind(const yaml_event_t *ev) {
    switch (ev->type) {
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_ALIAS_EVENT: return "an alias";
    default: return "a value";
    }
}

/* Value of one key: must be a scalar. */
static ct_status load_key_value(loader *ld, const config_key *k, yaml_event_t *ev) {
    char where[CT_PATH_MAX + 64], full[96];
    where_at(ld, ev->start_mark, where, sizeof where);
    key_full_name(k, full, sizeof full);
    if (ev->type == YAML_SCALAR_EVENT)
        return key_assign(ld->cfg, k, (const char *)ev->data.scalar.value, ev->data.scalar.length,
                          event_is_null(ev), where);
    ct_error(CT_ERR_INPUT, "%s%s: expected a single value, got %s", where, full, event_kind(ev));
    if (ev->type == YAML_ALIAS_EVENT)
        return with_hint(CT_ERR_INPUT,
                         "YAML anchors and aliases are not supported; write the value");
    if (k->type == KEY_STRING)
        return with_hint(CT_ERR_INPUT,
                         "write lists as one comma-separated string, e.g. %s: \"4,4\"", full);
    return with_hint(CT_ERR_INPUT, "write '%s: <value>' on one line (%s; default %s)", k->name,
                     k->doc, k->def);
}

/* The keys of one section, after its MAPPING_START. */
static ct_status load_section(loader *ld, int section) {
    const char *sec = sections[section];
    for (;;) {
        yaml_event_t ev;
        CT_TRY(next_event(ld, &ev));
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return CT_OK;
        }
        char where[CT_PATH_MAX + 64];
        where_at(ld, ev.start_mark, where, sizeof where);
        if (ev.type != YAML_SCALAR_EVENT) {
            ct_status st = with_hint(ct_error(CT_ERR_INPUT,
                                              "%sa key of section %s must be a plain name, got %s",
                                              where, sec, event_kind(&ev)),
                                     "write 'key: value' lines under '%s:'", sec);
            yaml_event_delete(&ev);
            return st;
        }
        const char *name = (const char *)ev.data.scalar.value;
        const config_key *k = find_key(sec, name);
        if (!k) {
            ct_status st = unknown_key_error(where, sec, name);
            yaml_event_delete(&ev);
            return st;
        }
        size_t line = ev.start_mark.line + 1;
        yaml_event_delete(&ev);
        int idx = (int)(k - keys);
        if (ld->key_line[idx])
            return with_hint(ct_error(CT_ERR_INPUT, "%sduplicate key %s.%s (first set on line %zu)",
                                      where, sec, k->name, ld->key_line[idx]),
                             "keep one '%s:' line in the %s section", k->name, sec);
        ld->key_line[idx] = line;

        CT_TRY(next_event(ld, &ev));
        ct_status st = load_key_value(ld, k, &ev);
        yaml_event_delete(&ev);
        CT_TRY(st);
    }
}

/* The top-level mapping of section -> mapping, after its MAPPING_START. */
static ct_status load_sections(loader *ld) {
    for (;;) {
        yaml_event_t ev;
        CT_TRY(next_event(ld, &ev));
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return CT_OK;
        }
        char where[CT_PATH_MAX + 64];
        where_at(ld, ev.start_mark, where, sizeof where);
        if (ev.type != YAML_SCALAR_EVENT) {
            ct_status st =
                with_hint(ct_error(CT_ERR_INPUT, "%sa section name must be a plain word, got %s",
                                   where, event_kind(&ev)),
                          "valid sections: model, parallel, train, data, checkpoint, log");
            yaml_event_delete(&ev);
            return st;
        }
        int s = find_section((const char *)ev.data.scalar.value);
        if (s < 0) {
            ct_status st = unknown_section_error(where, (const char *)ev.data.scalar.value);
            yaml_event_delete(&ev);
            return st;
        }
        size_t line = ev.start_mark.line + 1;
        yaml_event_delete(&ev);
        if (ld->section_line[s])
            return with_hint(ct_error(CT_ERR_INPUT,
                                      "%sduplicate section %s (first opened on line %zu)", where,
                                      sections[s], ld->section_line[s]),
                             "merge the two '%s:' blocks into one", sections[s]);
        ld->section_line[s] = line;

        CT_TRY(next_event(ld, &ev));
        ct_status st = CT_OK;
        if (ev.type == YAML_MAPPING_START_EVENT) {
            yaml_event_delete(&ev);
            CT_TRY(load_section(ld, s));
            continue;
        }
        if (!event_is_null(&ev)) { /* `data:` with nothing under it is an empty section */
            char show[80];
            where_at(ld, ev.start_mark, where, sizeof where);
            if (ev.type == YAML_SCALAR_EVENT)
                ct_error(CT_ERR_INPUT, "%ssection %s must hold 'key: value' lines, got '%s'", where,
                         sections[s],
                         shown((const char *)ev.data.scalar.value, ev.data.scalar.length, show,
                               sizeof show));
            else
                ct_error(CT_ERR_INPUT, "%ssection %s must hold 'key: value' lines, got %s", where,
                         sections[s], event_kind(&ev));
            char list[1024];
            list_section_keys(sections[s], list, sizeof list);
            st = with_hint(CT_ERR_INPUT, "indent the keys under '%s:'; its keys: %s", sections[s],
                           list);
        }
        yaml_event_delete(&ev);
        CT_TRY(st);
    }
}

/* One YAML stream: zero documents (empty file) or one whose root is the section mapping. */
static ct_status load_stream(loader *ld) {
    yaml_event_t ev;
    CT_TRY(next_event(ld, &ev)); /* STREAM_START */
    yaml_event_delete(&ev);
    for (int docs = 0;; docs++) {
        CT_TRY(next_event(ld, &ev));
        if (ev.type == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            return CT_OK;
        }
        char where[CT_PATH_MAX + 64];
        where_at(ld, ev.start_mark, where, sizeof where);
        yaml_event_delete(&ev); /* DOCUMENT_START */
        if (docs > 0)
            return with_hint(ct_error(CT_ERR_INPUT,
                                      "%sa second YAML document ('---'); a config is one document",
                                      where),
                             "remove the '---' line and merge the documents");
        CT_TRY(next_event(ld, &ev));
        where_at(ld, ev.start_mark, where, sizeof where);
        if (ev.type == YAML_MAPPING_START_EVENT) {
            yaml_event_delete(&ev);
            CT_TRY(load_sections(ld));
        } else if (event_is_null(&ev)) {
            yaml_event_delete(&ev); /* "---" alone: an empty document */
        } else {
            ct_status st = with_hint(
                ct_error(CT_ERR_INPUT, "%sthe top level must be a mapping of sections, got %s",
                         where, ev.type == YAML_SCALAR_EVENT ? "a plain value" : event_kind(&ev)),
                "start with a section line such as 'model:' and indent its keys below it");
            yaml_event_delete(&ev);
            return st;
        }
        CT_TRY(next_event(ld, &ev)); /* DOCUMENT_END */
        yaml_event_delete(&ev);
    }
}

static ct_status load_buffer(ct_config *cfg, const char *data, size_t len, const char *origin) {
    /* Parse into a copy so that a failure halfway leaves the caller's config untouched. */
    loader *ld = ct_xcalloc(1, sizeof *ld);
    ct_config *work = ct_xmalloc(sizeof *work);
    memcpy(work, cfg, sizeof *work);
    ld->origin = origin ? origin : "<config>";
    ld->cfg = work;
    ct_status st;
    if (!yaml_parser_initialize(&ld->parser)) {
        st = ct_error(CT_ERR_RUNTIME, "%s: cannot initialise the YAML parser (out of memory)",
                      ld->origin);
    } else {
        yaml_parser_set_input_string(&ld->parser, (const unsigned char *)data, len);
        st = load_stream(ld);
        yaml_parser_delete(&ld->parser);
    }
    if (st == CT_OK) memcpy(cfg, work, sizeof *cfg);
    free(work);
    free(ld);
    return st;
}

ct_status ct_config_load_string(ct_config *cfg, const char *yaml, const char *origin) {
    return load_buffer(cfg, yaml, strlen(yaml), origin);
}

/* What a config file is not: named in the message when --config gets something else. */
ct_status ct_config_load_file(ct_config *cfg, const char *path) {
    /* O_NONBLOCK: opening a pipe for reading would otherwise wait for a writer forever. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return with_hint(
            ct_error(CT_ERR_INPUT, "cannot open config file '%s': %s", path, strerror(errno)),
            "check the path given to --config");
    struct stat st_file;
    if (fstat(fd, &st_file) != 0) {
        int err = errno;
        close(fd);
        return with_hint(
            ct_error(CT_ERR_INPUT, "cannot stat config file '%s': %s", path, strerror(err)),
            "check the path given to --config");
    }
    if (!S_ISREG(st_file.st_mode)) {
        close(fd);
        /* A device such as /dev/zero never ends, a pipe may never be written: refuse both. */
        return with_hint(
            ct_error(CT_ERR_INPUT, "config file '%s' is %s%s", path, ct_file_kind(st_file.st_mode),
                     S_ISDIR(st_file.st_mode) ? " (Is a directory)" : ""),
            "--config takes a regular YAML file of at most %d KiB", CT_CONFIG_MAX_BYTES / 1024);
    }
    if (st_file.st_size > CT_CONFIG_MAX_BYTES) {
        close(fd);
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "config file '%s' is %lld bytes, over the %d KiB "
                                  "a config may have",
                                  path, (long long)st_file.st_size, CT_CONFIG_MAX_BYTES / 1024),
                         "--config takes a YAML config; is '%s' the right file?", path);
    }
    /* Read at most the cap plus one byte: a file that grows while we read is still bounded. */
    size_t cap = CT_CONFIG_MAX_BYTES + 1, len = 0;
    char *data = ct_xmalloc(cap);
    int read_errno = 0;
    while (len < cap) {
        ssize_t n = read(fd, data + len, cap - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) read_errno = errno;
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fd);
    if (read_errno || len > CT_CONFIG_MAX_BYTES) {
        free(data);
        return with_hint(
            ct_error(CT_ERR_INPUT, "cannot read config file '%s': %s", path,
                     read_errno ? strerror(read_errno) : "it grew past the size cap while read"),
            "--config takes a YAML file");
    }
    ct_status st = load_buffer(cfg, data, len, path);
    free(data);
    return st;
}

/* ---- --set ----------------------------------------------------------------------------------- */

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

ct_status ct_config_set(ct_config *cfg, const char *assignment) {
    char show[80];
    shown(assignment, strlen(assignment), show, sizeof show);
    char *copy = ct_xstrdup(assignment);
    char *eq = strchr(copy, '=');
    char *dot = eq ? memchr(copy, '.', (size_t)(eq - copy)) : NULL;
    ct_status st = CT_OK;
    if (!eq || !dot) {
        st = with_hint(ct_error(CT_ERR_INPUT, "--set '%s': expected section.key=value", show),
                       "write --set section.key=value, e.g. --set train.lr=3e-4");
        goto done;
    }
    *eq = '\0';
    *dot = '\0';
    char *section = trim(copy), *name = trim(dot + 1), *value = trim(eq + 1);
    if (!section[0] || !name[0]) {
        st = with_hint(ct_error(CT_ERR_INPUT, "--set '%s': expected section.key=value", show),
                       "write --set section.key=value, e.g. --set train.lr=3e-4");
        goto done;
    }
    size_t vlen = strlen(value);
    if (vlen >= 2 && (value[0] == '"' || value[0] == '\'') && value[vlen - 1] == value[0]) {
        value[vlen - 1] = '\0';
        value++;
        vlen -= 2;
    }
    if (find_section(section) < 0) {
        char show_section[80];
        ct_error(CT_ERR_INPUT, "--set: unknown section '%s' in '%s'",
                 shown(section, strlen(section), show_section, sizeof show_section), show);
        const config_key *s = suggest_full_key(section, name);
        if (s)
            st = with_hint(CT_ERR_INPUT, "did you mean %s.%s?", s->section, s->name);
        else
            st = with_hint(CT_ERR_INPUT,
                           "valid sections: model, parallel, train, data, checkpoint, log");
        goto done;
    }
    const config_key *k = find_key(section, name);
    if (!k) {
        st = unknown_key_error("--set: ", section, name);
        goto done;
    }
    st = key_assign(cfg, k, value, vlen, false, "--set: ");
done:
    free(copy);
    return st;
}

/* ---- validation ------------------------------------------------------------------------------ */

typedef struct tp_limits {
    int64_t n_head, n_kv_head, d_ff, vocab_padded, seq_len; /* seq_len 0: no SP constraint */
} tp_limits;

static bool tp_fits(int64_t tp, const void *arg) {
    const tp_limits *l = arg;
    return l->n_head % tp == 0 && l->n_kv_head % tp == 0 && l->d_ff % tp == 0 &&
           l->vocab_padded % tp == 0 && (l->seq_len == 0 || l->seq_len % tp == 0);
}

static ct_status tp_error(const tp_limits *l) {
    char list[256];
    int64_t g = gcd64(gcd64(l->n_head, l->n_kv_head), gcd64(l->d_ff, l->vocab_padded));
    if (l->seq_len) g = gcd64(g, l->seq_len);
    list_divisors(g, tp_fits, l, list, sizeof list);
    return with_hint(CT_ERR_INPUT,
                     "tp must divide n_head, n_kv_head, d_ff and the padded vocabulary%s; valid "
                     "parallel.tp for this model: %s",
                     l->seq_len ? " (and seq_len, with sequence_parallel)" : "", list);
}

/* "4,4,4,4": the even split that an example in a hint can show (empty when it would not fit). */
static void even_split(int64_t n_layer, int64_t chunks, char *buf, size_t cap) {
    buf[0] = '\0';
    if (chunks > 32 || chunks > n_layer) return;
    for (int64_t c = 0; c < chunks; c++)
        append(buf, cap, "%s%lld", c ? "," : "",
               (long long)(n_layer / chunks + (c < n_layer % chunks)));
}

static ct_status check_pp_layers(const ct_config *cfg, int64_t chunks) {
    const char *s = cfg->parallel.pp_layers;
    int64_t n_layer = cfg->model.n_layer, count = 0, sum = 0;
    char example[256], show[80];
    even_split(n_layer, chunks, example, sizeof example);
    shown(s, strlen(s), show, sizeof show);
    for (const char *p = s;;) {
        while (isspace((unsigned char)*p)) p++;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || v <= 0 || errno == ERANGE)
            return with_hint(
                ct_error(CT_ERR_INPUT,
                         "parallel.pp_layers='%s': entry %lld is not a positive integer", show,
                         (long long)count + 1),
                "give one positive layer count per pipeline chunk, comma-separated%s%s%s",
                example[0] ? ", e.g. \"" : "", example, example[0] ? "\"" : "");
        count++;
        /* Saturate: a huge entry must still read as "does not sum to n_layer", not wrap. */
        sum = (v > n_layer || sum > n_layer) ? n_layer + 1 : sum + v;
        p = end;
        while (isspace((unsigned char)*p)) p++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '\0') break;
        return with_hint(
            ct_error(CT_ERR_INPUT, "parallel.pp_layers='%s': unexpected '%c'", show, *p),
            "give layer counts separated by commas%s%s%s", example[0] ? ", e.g. \"" : "", example,
            example[0] ? "\"" : "");
    }
    if (count != chunks)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.pp_layers='%s' has %lld entries, but parallel.pp=%lld x "
                     "parallel.virtual_stages=%lld = %lld pipeline chunks",
                     show, (long long)count, (long long)cfg->parallel.pp,
                     (long long)cfg->parallel.virtual_stages, (long long)chunks),
            "give one layer count per chunk%s%s%s", example[0] ? ", e.g. \"" : "", example,
            example[0] ? "\"" : "");
    if (sum != n_layer)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "parallel.pp_layers='%s' does not sum to model.n_layer=%lld",
                                  show, (long long)n_layer),
                         "the layer counts must add up to n_layer%s%s%s",
                         example[0] ? ", e.g. \"" : "", example, example[0] ? "\"" : "");
    return CT_OK;
}

typedef struct mb_limits {
    int64_t per_rank; /* global_batch / dp */
    int64_t pp;       /* grad_accum must be a multiple of this (1: no constraint) */
} mb_limits;

static bool mb_fits(int64_t mb, const void *arg) {
    const mb_limits *l = arg;
    return l->per_rank % mb == 0 && (l->per_rank / mb) % l->pp == 0;
}

/*
 * train.micro_batch: auto. The largest divisor B of the per-rank batch whose B·seq_len stays
 * within CT_AUTO_MICRO_BATCH_TOKENS (activation memory grows with B·T; 8192 tokens is a few MiB
 * per layer at d_model 256 and keeps GEMMs large). With a pipeline, more microbatches shrink the
 * bubble (p−1)/(m+p−1): B is the largest that still leaves m >= 4·pp microbatches when the batch
 * allows it (then the bubble (p−1)/(5p−1) stays below 20% for any p), and the interleaved
 * schedule's m % pp == 0 always holds. Nothing fits (interleaved with too small a batch): 1, which
 * the checks after it explain.
 */
#define CT_AUTO_MICRO_BATCH_TOKENS 8192

static int64_t auto_micro_batch(int64_t per_rank, int64_t seq_len, int64_t pp, bool interleaved) {
    int64_t d[2048];
    int n = divisors(per_rank, d, 2048);
    const int64_t cap = CT_MAX(1, CT_AUTO_MICRO_BATCH_TOKENS / seq_len);
    const int64_t want_m = pp > 1 ? CT_MIN(4 * pp, per_rank) : 1;
    int64_t best = 0, best_any = 0;
    for (int i = 0; i < n; i++) { /* increasing: the last one accepted is the largest */
        int64_t B = d[i], m = per_rank / B;
        if (B > cap || (interleaved && m % pp)) continue;
        best_any = B;
        if (m >= want_m) best = B;
    }
    return best ? best : best_any ? best_any : 1;
}

/* Parameters of the GPT-2 shape with a tied embedding (see config.h: n_params). The table's
 * upper bounds keep every product below 2^62. */
static int64_t gpt2_params(const ct_model_config *m, const ct_derived_config *d) {
    int64_t C = m->d_model, kv = d->n_kv_head * d->head_dim, F = d->d_ff;
    int64_t layer = 2 * C               /* ln1 weight + bias */
                    + (C * C + C)       /* q */
                    + 2 * (kv * C + kv) /* k, v (n_kv_head heads) */
                    + (C * C + C)       /* attention out */
                    + 2 * C             /* ln2 */
                    + (F * C + F)       /* MLP up */
                    + (C * F + C);      /* MLP down */
    return d->vocab_padded * C          /* wte, tied with the LM head */
           + m->seq_len * C             /* wpe */
           + m->n_layer * layer + 2 * C /* final LN */;
}

/* Checks each key against its own constraints (type, range, allowed values). */
static ct_status check_keys(const ct_config *cfg) {
    /* Per-key constraints again: a caller may have filled the struct without the loader. */
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &keys[i];
        if (k->type == KEY_STRING && !memchr((const char *)cfg + k->offset, '\0', k->size))
            return with_hint(
                ct_error(CT_ERR_INPUT, "%s.%s is not NUL-terminated", k->section, k->name),
                "this is a bug in the caller that filled the config");
        key_value v = key_load(cfg, k);
        CT_TRY(key_check(k, &v, ""));
    }
    return CT_OK;
}

/* Checks that the model architecture is one this trainer implements. */
static ct_status check_arch(const ct_model_config *m) {
    if (m->arch == CT_ARCH_LLAMA)
        return with_hint(ct_error(CT_ERR_INPUT, "model.arch=llama is not implemented yet"),
                         "use model.arch: gpt2 for now (Llama-style blocks are planned)");
    return CT_OK;
}

/* Resolves train.precision (auto: by hardware) and checks grad_reduce_dtype against it. */
static ct_status resolve_precision(const ct_config *cfg, ct_derived_config *d) {
    const ct_parallel_config *p = &cfg->parallel;
    const ct_train_config *t = &cfg->train;
    ct_precision precision = t->precision;
    char precision_why[96];
    snprintf(precision_why, sizeof precision_why, "train.precision: %s",
             precision_names[t->precision]);
    if (precision == CT_PRECISION_AUTO) {
        char what[80];
        bool native = cfg->runtime_backend_cuda || ct_cpu_has_native_bf16(what, sizeof what);
        precision = native ? CT_PRECISION_BF16 : CT_PRECISION_FP32;
        snprintf(precision_why, sizeof precision_why, "auto: %s",
                 cfg->runtime_backend_cuda ? "GPU" : what);
    }
    /* Reducing fp32 gradients in bf16 would only lose precision and break the equality of
     * layouts (core/README.md, Determinism); bf16 reduction is an option of bf16 training. */
    if (p->grad_reduce_dtype == CT_PRECISION_BF16 && precision != CT_PRECISION_BF16)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "parallel.grad_reduce_dtype=bf16 needs bf16 training, but "
                                  "train.precision is fp32 (%s)",
                                  precision_why),
                         "fp32 training reduces gradients in fp32: remove "
                         "parallel.grad_reduce_dtype or set it to fp32");

    d->precision = precision;
    snprintf(d->precision_why, sizeof d->precision_why, "%s", precision_why);
    return CT_OK;
}

/* Derives vocab_padded, n_kv_head, d_ff and head_dim; checks that the heads divide evenly. */
static ct_status check_model(const ct_model_config *m, ct_derived_config *d) {
    char list[256];
    d->vocab_padded = (m->vocab_size + m->vocab_pad - 1) / m->vocab_pad * m->vocab_pad;
    d->n_kv_head = m->n_kv_head ? m->n_kv_head : m->n_head;
    d->d_ff = m->d_ff ? m->d_ff : 4 * m->d_model;

    /* The model on its own. */
    if (m->d_model % m->n_head) {
        list_divisors(m->d_model, NULL, NULL, list, sizeof list);
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "model.d_model=%lld is not divisible by model.n_head=%lld",
                                  (long long)m->d_model, (long long)m->n_head),
                         "head_dim = d_model / n_head must be a whole number; n_head values that "
                         "divide %lld: %s",
                         (long long)m->d_model, list);
    }
    d->head_dim = m->d_model / m->n_head;
    if (d->n_kv_head > m->n_head || m->n_head % d->n_kv_head) {
        list_divisors(m->n_head, NULL, NULL, list, sizeof list);
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "model.n_kv_head=%lld does not divide model.n_head=%lld",
                                  (long long)d->n_kv_head, (long long)m->n_head),
                         "each key/value head serves n_head / n_kv_head query heads; use one of "
                         "%s (0 = n_head)",
                         list);
    }
    return CT_OK;
}

/* Checks that parallel.tp divides every tensor-parallel dimension of the model. */
static ct_status check_tp(const ct_config *cfg, const ct_derived_config *d) {
    const ct_model_config *m = &cfg->model;
    const ct_parallel_config *p = &cfg->parallel;
    /* The model against the tensor-parallel degree: each rank owns whole heads, a slice of the
     * MLP and of the padded vocabulary. */
    tp_limits tl = {m->n_head, d->n_kv_head, d->d_ff, d->vocab_padded,
                    p->sequence_parallel ? m->seq_len : 0};
    long long tp = (long long)p->tp;
    if (m->n_head % p->tp) {
        ct_error(CT_ERR_INPUT, "parallel.tp=%lld does not divide model.n_head=%lld", tp,
                 (long long)m->n_head);
        return tp_error(&tl);
    }
    if (d->n_kv_head % p->tp) {
        ct_error(CT_ERR_INPUT,
                 "parallel.tp=%lld does not divide the key/value heads (model.n_kv_head=%lld)", tp,
                 (long long)d->n_kv_head);
        return tp_error(&tl);
    }
    if (d->d_ff % p->tp) {
        ct_error(CT_ERR_INPUT, "parallel.tp=%lld does not divide the MLP width (model.d_ff=%lld)",
                 tp, (long long)d->d_ff);
        return tp_error(&tl);
    }
    if (d->vocab_padded % p->tp) {
        ct_error(
            CT_ERR_INPUT,
            "parallel.tp=%lld does not divide the padded vocabulary %lld (model.vocab_size=%lld "
            "rounded up to a multiple of model.vocab_pad=%lld)",
            tp, (long long)d->vocab_padded, (long long)m->vocab_size, (long long)m->vocab_pad);
        return tp_error(&tl);
    }
    if (p->sequence_parallel && m->seq_len % p->tp) {
        ct_error(
            CT_ERR_INPUT,
            "parallel.sequence_parallel needs model.seq_len=%lld divisible by parallel.tp=%lld",
            (long long)m->seq_len, tp);
        return tp_error(&tl);
    }
    return CT_OK;
}

/* Checks the pipeline schedule and the split of the layers over its chunks. */
static ct_status check_pipeline(const ct_config *cfg) {
    const ct_model_config *m = &cfg->model;
    const ct_parallel_config *p = &cfg->parallel;
    char list[256];

    /* The layers against the pipeline. */
    int64_t v = p->virtual_stages, chunks = p->pp * v;
    if (p->schedule == CT_SCHEDULE_INTERLEAVED && v < 2)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.schedule=interleaved needs parallel.virtual_stages >= 2 "
                     "(got %lld)",
                     (long long)v),
            "set parallel.virtual_stages: 2 (or more), or use parallel.schedule: 1f1b");
    if (p->schedule == CT_SCHEDULE_INTERLEAVED && p->pp < 2)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.schedule=interleaved needs parallel.pp >= 2 (got %lld)",
                     (long long)p->pp),
            "interleaving spreads chunks over pipeline ranks: use parallel.pp: 2 or more, or "
            "parallel.schedule: 1f1b with parallel.virtual_stages: 1");
    if (p->schedule != CT_SCHEDULE_INTERLEAVED && v > 1)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.virtual_stages=%lld needs parallel.schedule=interleaved "
                     "(got %s)",
                     (long long)v, schedule_names[p->schedule]),
            "only the interleaved schedule runs several chunks per rank: set "
            "parallel.schedule: interleaved or parallel.virtual_stages: 1");
    if (m->n_layer < chunks)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "model.n_layer=%lld is fewer than the %lld pipeline chunks "
                                  "(parallel.pp=%lld x parallel.virtual_stages=%lld)",
                                  (long long)m->n_layer, (long long)chunks, (long long)p->pp,
                                  (long long)v),
                         "every chunk needs at least one layer: lower parallel.pp or "
                         "parallel.virtual_stages");
    if (p->pp_layers[0]) {
        CT_TRY(check_pp_layers(cfg, chunks));
    } else if (m->n_layer % chunks) {
        char example[256];
        even_split(m->n_layer, chunks, example, sizeof example);
        list_divisors(m->n_layer, NULL, NULL, list, sizeof list);
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "model.n_layer=%lld does not split evenly over parallel.pp=%lld x "
                     "parallel.virtual_stages=%lld = %lld pipeline chunks",
                     (long long)m->n_layer, (long long)p->pp, (long long)v, (long long)chunks),
            "use pp * virtual_stages dividing %lld (%s), or give an uneven split "
            "with parallel.pp_layers%s%s%s",
            (long long)m->n_layer, list, example[0] ? ": \"" : "", example, example[0] ? "\"" : "");
    }
    return CT_OK;
}

/* Checks that the tp x pp x dp grid fits the world size, and derives dp. */
static ct_status check_grid(const ct_parallel_config *p, int64_t world_size, ct_derived_config *d) {
    /* The grid against the world: rank = tp_rank + tp·(dp_rank + dp·pp_rank). */
    long long tp = (long long)p->tp;
    int64_t mp = p->tp * p->pp;
    if (p->dp && mp * p->dp != world_size)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.tp=%lld x parallel.pp=%lld x parallel.dp=%lld = %lld "
                     "ranks, but the world size is %lld",
                     tp, (long long)p->pp, (long long)p->dp, (long long)(mp * p->dp),
                     (long long)world_size),
            "launch %lld ranks, or set parallel.dp: 0 so that dp = world_size / (tp * pp)",
            (long long)(mp * p->dp));
    if (world_size % mp)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.tp=%lld x parallel.pp=%lld = %lld ranks per model "
                     "replica does not divide the world size %lld",
                     tp, (long long)p->pp, (long long)mp, (long long)world_size),
            "launch a multiple of %lld ranks (mpirun -np N), or choose tp and pp whose product "
            "divides %lld",
            (long long)mp, (long long)world_size);
    d->dp = world_size / mp;
    return CT_OK;
}

/* Checks the batch against dp (picking micro_batch when auto), and derives grad_accum. */
static ct_status check_batch(ct_config *cfg, ct_derived_config *d) {
    const ct_model_config *m = &cfg->model;
    const ct_parallel_config *p = &cfg->parallel;
    const ct_train_config *t = &cfg->train;
    char list[256];

    /* The batch: global_batch = micro_batch · dp · grad_accum, fixed whatever the layout. */
    if (t->micro_batch == 0 || t->micro_batch_auto) {
        if (t->global_batch % d->dp)
            return with_hint(
                ct_error(CT_ERR_INPUT, "train.global_batch=%lld is not divisible by dp=%lld",
                         (long long)t->global_batch, (long long)d->dp),
                "every data-parallel rank takes global_batch / dp sequences: use a multiple of "
                "%lld, e.g. train.global_batch=%lld",
                (long long)d->dp, (long long)((t->global_batch / d->dp + 1) * d->dp));
        cfg->train.micro_batch = auto_micro_batch(t->global_batch / d->dp, m->seq_len, p->pp,
                                                  p->schedule == CT_SCHEDULE_INTERLEAVED);
        cfg->train.micro_batch_auto = true;
    }
    int64_t per_mb = t->micro_batch * d->dp;
    if (t->global_batch % per_mb) {
        ct_error(
            CT_ERR_INPUT,
            "train.global_batch=%lld is not divisible by train.micro_batch=%lld x dp=%lld = %lld",
            (long long)t->global_batch, (long long)t->micro_batch, (long long)d->dp,
            (long long)per_mb);
        if (t->global_batch % d->dp)
            return with_hint(CT_ERR_INPUT,
                             "global_batch must be a multiple of micro_batch * dp; with "
                             "micro_batch=%lld and dp=%lld try train.global_batch=%lld",
                             (long long)t->micro_batch, (long long)d->dp,
                             (long long)((t->global_batch / per_mb + 1) * per_mb));
        mb_limits ml = {t->global_batch / d->dp, 1};
        list_divisors(ml.per_rank, mb_fits, &ml, list, sizeof list);
        return with_hint(CT_ERR_INPUT,
                         "valid train.micro_batch values with dp=%lld: %s (or "
                         "train.micro_batch: auto, which picks one for any dp)",
                         (long long)d->dp, list);
    }
    d->grad_accum = t->global_batch / per_mb;
    if (p->schedule == CT_SCHEDULE_INTERLEAVED && d->grad_accum % p->pp) {
        mb_limits ml = {t->global_batch / d->dp, p->pp};
        list_divisors(ml.per_rank, mb_fits, &ml, list, sizeof list);
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.schedule=interleaved needs the microbatch count "
                     "(grad_accum=%lld = train.global_batch=%lld / (train.micro_batch=%lld "
                     "x dp=%lld)) to be a multiple of parallel.pp=%lld",
                     (long long)d->grad_accum, (long long)t->global_batch,
                     (long long)t->micro_batch, (long long)d->dp, (long long)p->pp),
            "valid train.micro_batch values for this schedule: %s (or raise "
            "train.global_batch)",
            list);
    }
    return CT_OK;
}

/* Checks that the learning-rate schedule fits: min_lr <= lr, warmup within steps. */
static ct_status check_lr_schedule(const ct_train_config *t) {
    char a[64], b[64];

    /* The optimizer schedule. */
    if (t->min_lr > t->lr) {
        format_double(t->min_lr, a, sizeof a);
        format_double(t->lr, b, sizeof b);
        return with_hint(ct_error(CT_ERR_INPUT, "train.min_lr=%s is larger than train.lr=%s", a, b),
                         "the learning rate decays from lr down to min_lr: lower train.min_lr or "
                         "raise train.lr");
    }
    if (t->warmup_steps > t->steps)
        return with_hint(
            ct_error(CT_ERR_INPUT, "train.warmup_steps=%lld exceeds train.steps=%lld",
                     (long long)t->warmup_steps, (long long)t->steps),
            "warmup must fit in the run: lower train.warmup_steps or raise train.steps");
    return CT_OK;
}

/* Checks that checkpoint settings that need a directory have one. */
static ct_status check_checkpoint(const ct_config *cfg) {
    const ct_checkpoint_config *c = &cfg->checkpoint;
    if (c->dir[0] || c->interval == 0) return CT_OK;
    return with_hint(ct_error(CT_ERR_INPUT,
                              "checkpoint.interval=%lld but checkpoint.dir is not set",
                              (long long)c->interval),
                     "set checkpoint.dir to the directory the checkpoints go to");
}

ct_status ct_config_validate(ct_config *cfg, int64_t world_size) {
    CT_ASSERTF(world_size >= 1, "world size %lld", (long long)world_size);
    memset(&cfg->derived, 0, sizeof cfg->derived);
    CT_TRY(check_keys(cfg));
    CT_TRY(check_arch(&cfg->model));

    ct_derived_config d;
    memset(&d, 0, sizeof d);
    CT_TRY(resolve_precision(cfg, &d));
    d.world_size = world_size;
    CT_TRY(check_model(&cfg->model, &d));
    CT_TRY(check_tp(cfg, &d));
    CT_TRY(check_pipeline(cfg));
    CT_TRY(check_grid(&cfg->parallel, world_size, &d));
    CT_TRY(check_batch(cfg, &d));
    CT_TRY(check_lr_schedule(&cfg->train));
    CT_TRY(check_checkpoint(cfg));

    d.tokens_per_step = cfg->train.global_batch * cfg->model.seq_len;
    d.n_params = gpt2_params(&cfg->model, &d);
    cfg->derived = d;
    return CT_OK;
}

int64_t ct_config_unit_min_bytes(const ct_config *cfg) {
    return (int64_t)(cfg->parallel.bucket_mb * 1024.0 * 1024.0);
}

/* ---- printing -------------------------------------------------------------------------------- */

/* A double-quoted YAML scalar that libyaml reads back byte for byte (for UTF-8 text; a path
 * that is not UTF-8 cannot be written in YAML at all). Returns the characters written. */
static int print_yaml_string(FILE *out, const char *s) {
    int n = 2;
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            n += fprintf(out, "\\%c", *c);
        else if (*c == '\n')
            n += fprintf(out, "\\n");
        else if (*c == '\t')
            n += fprintf(out, "\\t");
        else if (*c < 0x20 || *c == 0x7f)
            n += fprintf(out, "\\x%02x", *c);
        else
            n += fputc(*c, out) != EOF;
    }
    fputc('"', out);
    return n;
}

static void format_value(const ct_config *cfg, const config_key *k, char *buf, size_t cap) {
    key_value v = key_load(cfg, k);
    switch (k->type) {
    case KEY_INT:
        if (k->auto_zero && (v.i == 0 || resolved_from_auto(cfg, k)))
            snprintf(buf, cap, "auto");
        else
            snprintf(buf, cap, "%lld", (long long)v.i);
        break;
    case KEY_UINT64: snprintf(buf, cap, "%llu", (unsigned long long)v.u); break;
    case KEY_FLOAT: format_double(v.f, buf, cap); break;
    case KEY_BOOL: snprintf(buf, cap, "%s", v.b ? "true" : "false"); break;
    case KEY_ENUM: {
        int count = 0;
        while (k->choices[count]) count++;
        snprintf(buf, cap, "%s", v.e >= 0 && v.e < count ? k->choices[v.e] : "?");
        break;
    }
    case KEY_STRING: buf[0] = '\0'; break; /* printed quoted by the caller */
    }
}

void ct_config_print(const ct_config *cfg, FILE *out) {
    fputs("# cooktrain configuration (reload it with --config)\n", out);
    for (int s = 0; s < N_SECTIONS; s++) {
        fprintf(out, "%s:\n", sections[s]);
        for (int i = 0; i < N_KEYS; i++) {
            const config_key *k = &keys[i];
            if (strcmp(k->section, sections[s]) != 0) continue;
            int col = fprintf(out, "  %s: ", k->name);
            if (k->type == KEY_STRING) {
                col += print_yaml_string(out, (const char *)cfg + k->offset);
            } else {
                char val[64];
                format_value(cfg, k, val, sizeof val);
                col += fprintf(out, "%s", val);
            }
            fprintf(out, "%*s# %s\n", col < 34 ? 34 - col : 1, "", k->doc);
        }
    }
    const ct_derived_config *d = &cfg->derived;
    if (d->world_size <= 0) {
        fputs("# derived values: not computed (the config has not been validated)\n", out);
        return;
    }
    char count[32];
    format_count(d->n_params, count, sizeof count);
    fprintf(out,
            "# derived:\n"
            "#   world_size: %lld\n"
            "#   dp: %lld\n"
            "#   vocab_padded: %lld\n"
            "#   head_dim: %lld\n"
            "#   d_ff: %lld\n"
            "#   n_kv_head: %lld\n"
            "#   micro_batch: %lld%s\n"
            "#   grad_accum: %lld\n"
            "#   tokens_per_step: %lld\n"
            "#   n_params: %lld (%s)\n"
            "#   precision: %s (%s)\n",
            (long long)d->world_size, (long long)d->dp, (long long)d->vocab_padded,
            (long long)d->head_dim, (long long)d->d_ff, (long long)d->n_kv_head,
            (long long)cfg->train.micro_batch,
            cfg->train.micro_batch_auto ? " (auto: see train.micro_batch)" : "",
            (long long)d->grad_accum, (long long)d->tokens_per_step, (long long)d->n_params, count,
            d->precision == CT_PRECISION_BF16 ? "bf16" : "fp32", d->precision_why);
}

/* Markdown table cells: a '|' inside a cell would end it. */
static void print_md_cell(FILE *out, const char *s) {
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", out);
        else
            fputc(*s, out);
    }
}

void ct_config_write_docs(FILE *out) {
    fputs("| key | type | default | description |\n", out);
    fputs("|---|---|---|---|\n", out);
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &keys[i];
        char range[96];
        fprintf(out, "| `%s.%s` | ", k->section, k->name);
        switch (k->type) {
        case KEY_INT:
        case KEY_FLOAT:
            fputs(k->type == KEY_INT ? "integer" : "number", out);
            if (k->has_min || k->has_max) {
                describe_range(k, range, sizeof range);
                fprintf(out, ", %s", range);
            }
            if (k->auto_zero) fputs(", or `auto`", out);
            break;
        case KEY_UINT64: fputs("integer, 0 to 2^64-1", out); break;
        case KEY_BOOL: fputs("bool", out); break;
        case KEY_STRING: fputs(k->nonempty ? "string, not empty" : "string", out); break;
        case KEY_ENUM:
            for (int c = 0; k->choices[c]; c++)
                fprintf(out, "%s`%s`", c ? " \\| " : "", k->choices[c]);
            break;
        }
        if (k->type == KEY_STRING && !k->def[0])
            fputs(" | `\"\"` | ", out);
        else
            fprintf(out, " | `%s` | ", k->def);
        print_md_cell(out, k->doc);
        fputs(" |\n", out);
    }
}
