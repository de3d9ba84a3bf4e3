/*
 * config_keys.c — the key table, and what works on one key: conversion of a value, its range
 * check, storing it, defaults, lookups and suggestions for unknown names.
 *
 * Everything about a key lives in one row of config_keys[]: section, name, type, where it is
 * stored in ct_config, default, allowed range and one line of documentation. Defaults, the YAML
 * loader, --set, the per-key range checks, ct_config_print and the generated configs/README.md
 * all walk that table, so a key added there is parsed, checked, printed and documented with no
 * other change. The YAML name of a key is the name of its struct field (the KEY macro
 * stringifies it), so the two cannot drift apart. Consistency *between* keys (divisibility, the
 * rank grid, the batch) is ct_config_validate's job (config_validate.c), because it needs the
 * world size.
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
#include "config_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- the key table --------------------------------------------------------------------------- */

#define KEY(sec, key, t)                                                                           \
    .section = #sec, .name = #key, .type = (t), .offset = offsetof(ct_config, sec.key),            \
    .size = sizeof(((ct_config *)0)->sec.key)
#define AT_LEAST(x) .has_min = true, .min = (x)
#define ABOVE(x) .has_min = true, .min = (x), .min_open = true
#define AT_MOST(x) .has_max = true, .max = (x)
#define BELOW(x) .has_max = true, .max = (x), .max_open = true

static const char *const arch_names[] = {"gpt2", "llama", NULL};
const char *const schedule_names[] = {"1f1b", "gpipe", "interleaved", "zbh1", "zbv", NULL};
const char *const precision_names[] = {"fp32", "bf16", "auto", NULL};
static const char *const reduce_dtype_names[] = {"fp32", "bf16", NULL};
static const char *const recompute_names[] = {"none", "full", NULL};
static const char *const cp_sharding_names[] = {"zigzag", "contiguous", NULL};
const char *const ct_moe_router_names[] = {"topk_softmax", "softmax_topk", "sigmoid", NULL};

const char *const config_sections[N_SECTIONS] = {"model", "parallel",   "train",
                                                 "data",  "checkpoint", "log"};

/*
 * Bounds. Every key that a value could make meaningless, or crash later, has its range here and
 * is refused at load (exit 2, naming the key). Upper bounds on the model, grid and batch exist so
 * that ct_config_validate's products (parameter count, tp·pp·dp, tokens per step) cannot
 * overflow int64; they are far beyond any real model. The others:
 *   parallel.timeout_s <= 1e9 s: the watchdog turns it into a time_t deadline (a larger double
 *     overflows the conversion); 1e9 s is 31 years, i.e. no timeout.
 *   train.steps <= 1e8: the run keeps two doubles per step (losses, gradient norms) and reads
 *     sample step·global_batch, which stays below 2^62.
 *   train.eval_steps <= 1e6: evaluation batches of global_batch sequences each.
 *   train.weight_decay <= 1 and train.eps <= 1: AdamW's decoupled decay scales a weight by
 *     1 - lr·weight_decay per step, and an epsilon of 1 outweighs sqrt(v) for any gradient below
 *     1: beyond these, training stalls or destroys the weights.
 * Left open above, on purpose: train.lr (a rate that blows up training is caught at run time by
 * train.max_bad_steps, which test/cli/cli_train.sh reaches with lr 1e30), train.grad_clip (large =
 * no clipping), and the counts whose large values only mean "never" (eval_interval,
 * max_bad_steps, stop_after, checkpoint.interval and keep, log.interval). Consistency between
 * keys (min_lr <= lr, n_kv_head | n_head, ...) is ct_config_validate's.
 */
const config_key config_keys[] = {
    /* model */
    {KEY(model, arch, KEY_ENUM), .choices = arch_names, .def = "gpt2",
     .doc = "model family: gpt2 (LayerNorm, GELU, learned positions, biases) or llama (RMSNorm, "
            "SwiGLU, rotary positions, no biases)"},
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
     .doc = "MLP hidden size; 0 = 4 * d_model (gpt2) or Llama's rule from ffn_dim_multiplier and "
            "multiple_of (llama)"},
    {KEY(model, norm_eps, KEY_FLOAT), .def = "1e-5", ABOVE(0), AT_MOST(1),
     .doc = "llama: RMSNorm's epsilon, added to the mean square (gpt2's LayerNorm uses 1e-5)"},
    {KEY(model, rope_theta, KEY_FLOAT), .def = "10000", ABOVE(1), AT_MOST(1e12),
     .doc = "llama: the base of the rotary frequencies (10000 in Llama 2, 500000 in Llama 3)"},
    {KEY(model, ffn_dim_multiplier, KEY_FLOAT), .def = "0", AT_LEAST(0), AT_MOST(16),
     .doc = "llama with d_ff 0: scales the MLP width 8·d_model/3 before rounding; 0 = none"},
    {KEY(model, multiple_of, KEY_INT), .def = "256", AT_LEAST(1), AT_MOST(1048576),
     .doc = "llama with d_ff 0: the MLP width is rounded up to a multiple of this"},
    {KEY(model, rope_scaling_factor, KEY_FLOAT), .def = "0", AT_LEAST(0), AT_MOST(1024),
     .doc = "llama: Llama 3.1's RoPE frequency scaling (8 in Llama 3.1, 32 in Llama 3.2): "
            "wavelengths past rope_original_max_pos / rope_low_freq_factor are stretched by it, "
            "those below rope_original_max_pos / rope_high_freq_factor kept, those between "
            "blended; 0 = none"},
    {KEY(model, rope_low_freq_factor, KEY_FLOAT), .def = "1", ABOVE(0), AT_MOST(1e6),
     .doc = "llama with rope_scaling_factor: see there (1 in Llama 3.1)"},
    {KEY(model, rope_high_freq_factor, KEY_FLOAT), .def = "4", ABOVE(0), AT_MOST(1e6),
     .doc = "llama with rope_scaling_factor: see there (4 in Llama 3.1); above "
            "rope_low_freq_factor"},
    {KEY(model, rope_original_max_pos, KEY_INT), .def = "8192", AT_LEAST(1), AT_MOST(1048576),
     .doc = "llama with rope_scaling_factor: the context the model was pretrained at (8192)"},
    {KEY(model, tie_embeddings, KEY_BOOL), .def = "true",
     .doc = "the LM head is the token embedding (GPT-2, small Llamas); false: an lm_head of its "
            "own, vocab-parallel like the embedding (Llama 2, Llama 3 8B)"},
    {KEY(model, init_from, KEY_STRING), .def = "",
     .doc = "start from these weights when no checkpoint is resumed: a cooktrain checkpoint "
            "directory (any layout) or a Hugging Face model (a directory with config.json and "
            "safetensors); the model keys must match it; the optimizer starts fresh at step 0"},
    {KEY(model, moe_experts, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(4096),
     .doc = "Mixture of Experts: experts per MoE layer (each an MLP like the dense one); 0 = "
            "dense MLPs, no MoE"},
    {KEY(model, moe_top_k, KEY_INT), .def = "2", AT_LEAST(1), AT_MOST(4096),
     .doc = "MoE: experts each token is routed to (<= moe_experts); dropless, every routed token "
            "is computed"},
    {KEY(model, moe_every, KEY_INT), .def = "1", AT_LEAST(1), AT_MOST(65536),
     .doc = "MoE: every n-th layer is an MoE layer (layers n-1, 2n-1, ...); 1 = every layer"},
    {KEY(model, moe_d_ff, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(16777216),
     .doc = "MoE: each expert's hidden size; 0 = d_ff"},
    {KEY(model, moe_router, KEY_ENUM), .choices = ct_moe_router_names, .def = "topk_softmax",
     .doc = "MoE router, in fp32: topk_softmax (the k largest logits, gates their softmax: "
            "Mixtral), softmax_topk (softmax over all experts, the k largest, not renormalised: "
            "Switch) or sigmoid (sigmoid scores, the k largest, renormalised: DeepSeek-V3); ties "
            "go to the lower expert"},
    {KEY(model, moe_aux_alpha, KEY_FLOAT), .def = "0.01", AT_LEAST(0), AT_MOST(1000),
     .doc = "MoE: weight of the Switch/GShard load-balancing loss (alpha at uniform routing), "
            "counted per sequence and averaged over the batch's sequences, so that no layout "
            "changes it; 0 = none"},

    /* parallel */
    {KEY(parallel, tp, KEY_INT), .def = "1", AT_LEAST(1), AT_MOST(1048576),
     .doc = "tensor-parallel degree (a TP group is consecutive ranks)"},
    {KEY(parallel, pp, KEY_INT), .def = "1", AT_LEAST(1), AT_MOST(1048576),
     .doc = "pipeline-parallel stages"},
    {KEY(parallel, dp, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(1048576),
     .doc = "data-parallel degree; 0 = world_size / (tp * cp * pp)"},
    {KEY(parallel, cp, KEY_INT), .def = "1", AT_LEAST(1), AT_MOST(16384),
     .doc = "context-parallel degree: each sequence's positions split over cp ranks, attention "
            "by ring (needs seq_len divisible by 2 * cp, times tp with sequence_parallel)"},
    {KEY(model, moe_shared, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(64),
     .doc = "MoE: shared experts every token goes through besides its routed ones (DeepSeek-MoE), "
            "as one MLP of width moe_shared * moe_d_ff; 0 = none"},
    {KEY(model, moe_z_alpha, KEY_FLOAT), .def = "0", AT_LEAST(0), AT_MOST(1000),
     .doc = "MoE: weight of the router z-loss (ST-MoE): the mean over tokens of the squared "
            "logsumexp of the router's logits, keeping them small; 0 = none"},
    {KEY(model, moe_bias_rate, KEY_FLOAT), .def = "0", AT_LEAST(0), AT_MOST(1),
     .doc = "MoE: auxiliary-loss-free balancing (DeepSeek-V3): each MoE layer keeps a bias per "
            "expert that is added to the router's selection scores only (never to the gates); "
            "after every step it moves by this much toward balance, down for an expert that got "
            "more than the mean of the step's tokens (counted over every rank) and up for one "
            "that got fewer; saved in checkpoints; 0 = off (DeepSeek-V3 uses 0.001)"},
    {KEY(parallel, ep, KEY_INT), .def = "1", AT_LEAST(1), AT_MOST(4096),
     .doc = "expert-parallel degree (MoE): each expert lives on one of ep consecutive "
            "data-parallel ranks, tokens travel to it by all-to-all; must divide dp and "
            "model.moe_experts"},
    {KEY(parallel, cp_sharding, KEY_ENUM), .choices = cp_sharding_names, .def = "zigzag",
     .doc = "which 2 of a sequence's 2 * cp chunks a cp rank holds: zigzag (r and 2cp-1-r, equal "
            "causal work) or contiguous (2r and 2r+1)"},
    {KEY(parallel, zero_stage, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(3),
     .doc = "ZeRO stage: 0 replicated, 1 shards optimizer state, 2 also gradients, 3 also "
            "parameters (FSDP)"},
    {KEY(parallel, schedule, KEY_ENUM), .choices = schedule_names, .def = "1f1b",
     .doc = "pipeline schedule (zbh1 and zbv split each backward into input and weight parts; zbv "
            "needs virtual_stages: 2)"},
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
    {KEY(parallel, auto_layout, KEY_BOOL), .def = "false",
     .doc = "when the layout does not fit the world size (a restart on fewer or more nodes), "
            "the planner chooses one that does: tp, cp, ep, ZeRO, the schedule and recompute "
            "kept, the pipeline depth, dp and micro_batch the fastest by its estimate on this "
            "hardware, the global batch kept through gradient accumulation; the log says what "
            "was chosen and why"},
    {KEY(parallel, timeout_s, KEY_FLOAT), .def = "300", ABOVE(0), AT_MOST(1e9),
     .doc = "a collective unfinished after this many seconds aborts the job with a report"},
    {KEY(parallel, grad_reduce_dtype, KEY_ENUM), .choices = reduce_dtype_names, .def = "fp32",
     .doc = "dtype of the data-parallel gradient reduction: bf16 halves its traffic (needs "
            "train.precision bf16)"},

    /* train */
    {KEY(train, steps, KEY_INT), .def = "100", AT_LEAST(1), AT_MOST(100000000),
     .doc = "optimizer steps to run"},
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
     .doc = "steps of linear warmup; bounded by train.steps"},
    {KEY(train, weight_decay, KEY_FLOAT), .def = "0.1", AT_LEAST(0), AT_MOST(1),
     .doc = "AdamW decoupled weight decay (matrices and embeddings; not biases or norms)"},
    {KEY(train, grad_clip, KEY_FLOAT), .def = "1.0", AT_LEAST(0),
     .doc = "clip the global gradient norm to this; 0 disables clipping"},
    {KEY(train, beta1, KEY_FLOAT), .def = "0.9", AT_LEAST(0), BELOW(1),
     .doc = "AdamW first-moment decay"},
    {KEY(train, beta2, KEY_FLOAT), .def = "0.95", AT_LEAST(0), BELOW(1),
     .doc = "AdamW second-moment decay"},
    {KEY(train, eps, KEY_FLOAT), .def = "1e-8", ABOVE(0), AT_MOST(1), .doc = "AdamW epsilon"},
    {KEY(train, seed, KEY_UINT64), .def = "1337",
     .doc = "seed of parameter initialisation and data order"},
    {KEY(train, precision, KEY_ENUM), .choices = precision_names, .def = "fp32",
     .doc = "fp32 everywhere (exact), or bf16 mixed precision: bf16 parameters and activations, "
            "fp32 master weights, optimizer state and accumulation; auto = bf16 where the "
            "hardware multiplies bf16 natively (CPU: AMX or AVX512-BF16), else fp32"},
    {KEY(train, recompute, KEY_ENUM), .choices = recompute_names, .def = "none",
     .doc = "activation recompute: full keeps only each layer's input and recomputes the rest"},
    {KEY(train, cuda_graph, KEY_BOOL), .def = "false",
     .doc = "issue each step's forward and backward from a CUDA graph captured at the run's "
            "second step (the cuda backend, one process): the host issues one launch instead "
            "of thousands; the optimizer step stays outside it"},
    {KEY(train, eval_interval, KEY_INT), .def = "0", AT_LEAST(0),
     .doc = "evaluate on data.val every this many steps; 0 disables evaluation"},
    {KEY(train, eval_steps, KEY_INT), .def = "4", AT_LEAST(1), AT_MOST(1000000),
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
    {KEY(checkpoint, local_interval, KEY_INT), .def = "0", AT_LEAST(0),
     .doc = "save every this many steps to node-local storage (checkpoint.local_dir), each "
            "rank's file copied to a partner rank on another host; resume: auto restarts from "
            "the newest step complete there when it is newer than dir's; 0 = none"},
    {KEY(checkpoint, local_dir, KEY_STRING), .def = "/dev/shm/cooktrain", .nonempty = true,
     .doc = "root of the local checkpoints on each node (a folder per checkpoint.dir inside; "
            "\"%h\" is replaced by the rank's host index)"},

    /* log */
    {KEY(log, interval, KEY_INT), .def = "10", AT_LEAST(1),
     .doc = "print a progress line every this many steps"},
    {KEY(log, metrics, KEY_STRING), .def = "", .doc = "JSON-lines metrics file; empty = none"},
    {KEY(log, trace, KEY_STRING), .def = "",
     .doc = "Chrome/Perfetto trace file (with several ranks: PATH.rank<R>.json each, merged "
            "into PATH on one clock); empty = none"},
    {KEY(log, run_dir, KEY_STRING), .def = "",
     .doc = "directory for this run's outputs: the resolved config.yaml, and metrics.jsonl "
            "unless log.metrics is set; empty = none"},
    {KEY(log, profile, KEY_BOOL), .def = "false",
     .doc = "time ops by category (gemm, attention, norms, ...) and print them per log interval"},
    {KEY(log, device_idle, KEY_BOOL), .def = "false",
     .doc = "time on the device's own clock how long it waits between ops (for the host to issue "
            "the next one, or at a sync), by the op that ended each wait, and print it per log "
            "interval: what launch overhead costs a step (not with log.profile)"},
    {KEY(log, sample_tokens, KEY_INT), .def = "0", AT_LEAST(0), AT_MOST(1048576),
     .doc = "after training, print this many sampled tokens (needs data.tokenizer); 0 = none"},
    {KEY(log, sample_prompt, KEY_STRING), .def = "",
     .doc = "text the after-training sample continues"},
    {KEY(log, flight_recorder, KEY_INT), .def = "1024", AT_LEAST(0), AT_MOST(16777216),
     .doc = "collective and point-to-point operations each rank remembers (0 = none); written to "
            "log.run_dir/flight/ (or ./flight/) on a watchdog timeout, an MPI or NCCL error, "
            "SIGTERM or SIGUSR2, for `cooktrain diagnose`"},
    {KEY(log, straggler_pct, KEY_FLOAT), .def = "20", ABOVE(0), AT_MOST(10000),
     .doc = "a rank whose step time outside communication exceeds the ranks' median by more than "
            "this many percent, log.straggler_intervals progress lines in a row, is named a "
            "straggler (the progress line, the metrics, `cooktrain report`)"},
    {KEY(log, straggler_intervals, KEY_INT), .def = "3", AT_LEAST(1), AT_MOST(1000000),
     .doc = "progress lines in a row a rank must be slow to be named a straggler"},
};
const int config_n_keys = (int)(sizeof config_keys / sizeof config_keys[0]);

/* ---- small helpers --------------------------------------------------------------------------- */

/* Sets the hint and passes the status through: `return with_hint(ct_error(...), "...")`. */
__attribute__((format(printf, 2, 3))) ct_status with_hint(ct_status st, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ct_hint("%s", buf);
    return st;
}

const char *key_full_name(const config_key *k, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", k->section, k->name);
    return buf;
}

/* A user value made safe to put in a message: printable bytes only, at most ~60 of them, so a
 * stray binary blob or a huge line cannot flood the terminal. */
const char *shown(const char *text, size_t len, char *buf, size_t cap) {
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
void format_double(double v, char *buf, size_t cap) {
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* Appends printf output to buf (bounded; truncates silently, which only shortens a hint). */
__attribute__((format(printf, 3, 4))) void append(char *buf, size_t cap, const char *fmt, ...) {
    size_t n = strlen(buf);
    if (n + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* A suggestion must be close (<= 3 edits) and not a complete rewrite of a short name, or `xy`
 * would "suggest" tp. */
static bool close_enough(int dist, const char *typed) {
    return dist <= 3 && dist < (int)strlen(typed);
}

/* ---- lookups and suggestions ----------------------------------------------------------------- */

int find_section(const char *name) {
    for (int s = 0; s < N_SECTIONS; s++)
        if (strcmp(config_sections[s], name) == 0) return s;
    return -1;
}

const config_key *find_key(const char *section, const char *name) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(config_keys[i].section, section) == 0 && strcmp(config_keys[i].name, name) == 0)
            return &config_keys[i];
    return NULL;
}

/* Nearest key to `name` typed under a known `section`. A key of another section costs one extra
 * edit, so `train.tp` finds parallel.tp while `model.n_layers` stays in model. */
static const config_key *suggest_key(const char *section, const char *name) {
    const config_key *best = NULL;
    int best_score = 1000;
    for (int i = 0; i < N_KEYS; i++) {
        int d = ct_edit_distance(name, config_keys[i].name);
        if (!close_enough(d, name)) continue;
        int score = d + (strcmp(config_keys[i].section, section) != 0);
        if (score < best_score) {
            best_score = score;
            best = &config_keys[i];
        }
    }
    return best_score <= 3 ? best : NULL;
}

/* Nearest key to "section.name" when the section itself is unknown (--set modle.n_layer=4). */
const config_key *suggest_full_key(const char *section, const char *name) {
    const config_key *best = NULL;
    int best_score = 1000;
    for (int i = 0; i < N_KEYS; i++) {
        int score = ct_edit_distance(section, config_keys[i].section) +
                    ct_edit_distance(name, config_keys[i].name);
        if (score < best_score) {
            best_score = score;
            best = &config_keys[i];
        }
    }
    return best_score <= 3 ? best : NULL;
}

void list_section_keys(const char *section, char *buf, size_t cap) {
    buf[0] = '\0';
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(config_keys[i].section, section) == 0)
            append(buf, cap, "%s%s", buf[0] ? ", " : "", config_keys[i].name);
}

static void list_choices(const config_key *k, const char *sep, char *buf, size_t cap) {
    buf[0] = '\0';
    for (int c = 0; k->choices[c]; c++) append(buf, cap, "%s%s", c ? sep : "", k->choices[c]);
}

ct_status unknown_key_error(const char *where, const char *section, const char *name) {
    char show[80];
    ct_error(CT_ERR_INPUT, "%sunknown key %s.%s", where, section,
             shown(name, strlen(name), show, sizeof show));
    const config_key *s = suggest_key(section, name);
    if (s) return with_hint(CT_ERR_INPUT, "did you mean %s.%s?", s->section, s->name);
    char list[1024];
    list_section_keys(section, list, sizeof list);
    return with_hint(CT_ERR_INPUT, "valid keys in %s: %s", section, list);
}

ct_status unknown_section_error(const char *where, const char *name) {
    char show[80];
    ct_error(CT_ERR_INPUT, "%sunknown section '%s'", where,
             shown(name, strlen(name), show, sizeof show));
    int best = -1, best_d = 1000;
    for (int s = 0; s < N_SECTIONS; s++) {
        int d = ct_edit_distance(name, config_sections[s]);
        if (close_enough(d, name) && d < best_d) {
            best_d = d;
            best = s;
        }
    }
    if (best >= 0) return with_hint(CT_ERR_INPUT, "did you mean %s?", config_sections[best]);
    /* A key written at the top level (`lr: 3e-4`) is a common slip: point at its section. */
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(config_keys[i].name, name) == 0)
            return with_hint(CT_ERR_INPUT, "%s is a key of the %s section: write it under '%s:'",
                             config_keys[i].name, config_keys[i].section, config_keys[i].section);
    return with_hint(CT_ERR_INPUT, "valid sections: model, parallel, train, data, checkpoint, log");
}

/* ---- conversion, range checks, storage ------------------------------------------------------- */

void describe_range(const config_key *k, char *buf, size_t cap) {
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
ct_status key_check(const config_key *k, const key_value *v, const char *where) {
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

bool is_null_text(const char *s) {
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
            int d = ct_edit_distance(text, k->choices[c]);
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
bool resolved_from_auto(const ct_config *cfg, const config_key *k) {
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

key_value key_load(const ct_config *cfg, const config_key *k) {
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

ct_status key_assign(ct_config *cfg, const config_key *k, const char *text, size_t len,
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
    CT_ASSERTF(N_KEYS <= CONFIG_MAX_KEYS, "%d config keys, CONFIG_MAX_KEYS is %d", N_KEYS,
               CONFIG_MAX_KEYS);
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_keys[i];
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
        const config_key *k = &config_keys[i];
        ct_status st = key_assign(cfg, k, k->def, strlen(k->def), false, "default of ");
        CT_ASSERTF(st == CT_OK, "bad default in the config table: %s", ct_error_message());
    }
    snprintf(cfg->runtime_backend, sizeof cfg->runtime_backend, "cpu");
}
