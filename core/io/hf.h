/*
 * hf.h — Hugging Face models in and out: which of our tensors each Hugging Face tensor holds
 * (export.h describes the names and layouts, GPT-2's and Llama's), config.json, and reading a
 * model (config.json + safetensors) into our tensors for `cooktrain import` and model.init_from.
 *
 * A model is a directory holding config.json and either model.safetensors or
 * model.safetensors.index.json (whose weight_map names the files of a sharded model), or a
 * .safetensors file with config.json beside it. Everything read is checked before use
 * (safetensors.h; config.json below), each failure CT_ERR_INPUT naming the file and the field or
 * tensor: a path longer than CT_HF_PATH_MAX or not there; an index that is not JSON (jansson's
 * reason quoted); config.json's counts describing far more tensors than the files hold (checked
 * before anything is allocated by them); a tensor missing, in two files, or under two names (with
 * and without the state-dict prefix); a tensor of a layer or an expert past config.json's counts
 * (the files hold another, larger model); a shape that is not the one config.json implies; a
 * value that is NaN or infinite. Tensors the model does not use otherwise (lm_head.weight of a
 * tied model, rotary_emb.inv_freq buffers) are left out and named by ct_hf_report_unused;
 * non-float or other than 1- and 2-D tensors (stored causal masks) are left alone silently.
 *
 * config.json, checked: model_type gpt2 or llama. GPT-2: vocab_size, n_positions, n_embd,
 * n_layer, n_head, n_inner (null: 4·n_embd), layer_norm_epsilon 1e-5, activation_function
 * gelu_new, tie_word_embeddings (default true). Llama: vocab_size, max_position_embeddings,
 * hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads
 * (absent: the heads), rms_norm_eps, rope_theta, hidden_act silu, head_dim (if present) hidden_size
 * / heads, no attention or MLP biases, rope_scaling null or of rope_type llama3 (factor,
 * low_freq_factor, high_freq_factor, original_max_position_embeddings), tie_word_embeddings
 * (default false: then the file holds lm_head.weight). Mixtral (model_type mixtral): Llama's keys,
 * plus num_local_experts and num_experts_per_tok, intermediate_size the experts' width,
 * sliding_window null or at least the context; every layer's MLP is then an MoE layer of SwiGLU
 * experts routed by softmax-then-top-k renormalised (model.moe_router topk_softmax, moe_every 1,
 * no shared experts), its tensors model.layers.L.block_sparse_moe.gate.weight (E, C) (our
 * moe.router) and .experts.e.{w1, w3, w2}.weight (our w_gate, w_up, w_down). Sizes must lie within
 * the config keys' bounds.
 */
#ifndef CT_CORE_HF_H
#define CT_CORE_HF_H

#include <stdbool.h>
#include <stdio.h>

#include "core/config/config.h"
#include "core/io/checkpoint.h"
#include "core/io/safetensors.h"

/* One Hugging Face tensor: up to three of ours (checkpoint names) stacked by rows, transposed
 * or not, q/k rows permuted between RoPE conventions or not. */
typedef struct ct_hf_tensor {
    char name[96];
    char src[3][CT_CKPT_NAME];
    int n_src;
    bool transpose;
    int64_t rope_hd;    /* > 0: a q or k projection of heads of this size (export.h) */
    int64_t rows, cols; /* export: the stacked source's kept shape (before transposing) */
    bool vector;        /* export: 1-D in Hugging Face's layout */
} ct_hf_tensor;

/* The tensors of a GPT-2 or Llama model of n_layer layers, in the order export writes them
 * (malloc'd; *count entries); untied: with lm_head.weight (our lm_head); experts > 0 (Llama
 * only): Mixtral's, every layer's MLP that many experts. */
ct_hf_tensor *ct_hf_tensors(ct_arch arch, int64_t n_layer, int64_t head_dim, bool untied,
                            int64_t experts, int *count);

/* What config.json says, in our terms. */
typedef struct ct_hf_config {
    ct_arch arch;
    int64_t vocab_size, max_positions, n_layer, d_model, n_head, n_kv_head, d_ff;
    double norm_eps, rope_theta; /* llama */
    /* llama: rope_scaling of rope_type llama3 (factor 0: none) */
    double rope_factor, rope_low, rope_high;
    int64_t rope_original;
    bool tied; /* tie_word_embeddings */
    /* mixtral: num_local_experts and num_experts_per_tok (0: a dense model); d_ff is then the
     * experts' width */
    int64_t moe_experts, moe_top_k;
    double moe_aux_alpha; /* router_aux_loss_coef (see core/README.md on what it weighs) */
} ct_hf_config;

/* Parses config.json's text (len bytes; `path` names it in messages). */
ct_status ct_hf_config_parse(const char *path, const char *json, size_t len, ct_hf_config *out);

/* One tensor of the model's files. */
typedef struct ct_hf_entry {
    const ct_st_tensor *t;
    int file;  /* index into files */
    bool used; /* one of the model's tensors */
} ct_hf_entry;

typedef struct ct_hf_model {
    char dir[CT_PATH_MAX]; /* where config.json is */
    ct_hf_config config;
    int n_files;
    ct_safetensors *files;
    int n_names;
    ct_hf_tensor *names; /* ct_hf_tensors of this model */
    int64_t n_index;
    ct_hf_entry *index; /* every tensor of the files, sorted by name */
} ct_hf_model;

/* The longest path of a model or of an import's ROOT: room for the names cooktrain adds below
 * it (model.safetensors.index.json, step-00000000.tmp/rank-00000.bin) within CT_PATH_MAX. */
enum { CT_HF_PATH_MAX = CT_PATH_MAX - 64 };
/* CT_ERR_INPUT naming `what` when path is empty or longer than CT_HF_PATH_MAX: a path cut to fit
 * would name another file. */
ct_status ct_hf_check_path(const char *what, const char *path);

/* True when `path` looks like a Hugging Face model rather than a cooktrain checkpoint: a
 * .safetensors file, or a directory with config.json and no manifest.bin. */
bool ct_hf_is_model(const char *path);
ct_status ct_hf_open(const char *path, ct_hf_model *model);
void ct_hf_close(ct_hf_model *model);
/* The file tensors of weights the model does not use (none: prints nothing), as a warning and a
 * hint line to `out`: their count and the first names. */
void ct_hf_report_unused(const ct_hf_model *model, FILE *out);

/* The model keys that describe this model (the rest of *mc untouched; seq_len = max_positions). */
void ct_hf_model_config(const ct_hf_config *hf, ct_model_config *mc);
/* Whether a run's model (validated cfg) is this one: CT_ERR_INPUT naming the first key that
 * differs (GPT-2's seq_len may be below n_positions: the first rows of wpe are read). */
ct_status ct_hf_check_config(const ct_hf_model *model, const ct_config *cfg);

/* Every parameter of cfg's model (validated) against the files' headers: the shape check of
 * ct_hf_read, without reading or allocating values (import runs it before writing anything). */
ct_status ct_hf_check_tensors(const ct_hf_model *model, const ct_config *cfg);

/* Our global tensor `name` (rows x cols, row-major; vocabulary padding rows zero) from the
 * model's files; a value that is not finite is CT_ERR_INPUT. Memory: the Hugging Face tensor that
 * holds it, as fp32, besides out (CT_ERR_RUNTIME when the host has not that much). */
ct_status ct_hf_read(const ct_hf_model *model, const char *name, int64_t rows, int64_t cols,
                     float *out);

/*
 * `cooktrain import SRC --out ROOT [--seq-len N]`: the model at SRC as a cooktrain checkpoint,
 * ROOT/step-00000000 (and ROOT/latest), written atomically as a run's saves are: the weights of
 * one process's layout (any layout loads them), AdamW's moments left out (zero at step 0), the
 * config of a run of this model (defaults elsewhere; seq_len N, else config.json's positions).
 * Prints the model keys of that config to `report`, and the tensors left out to stderr
 * (ct_hf_report_unused). ROOT is trusted with nothing: it must fit CT_HF_PATH_MAX, be a directory
 * or not be there yet, hold no checkpoint entry (latest, step-*, a link or not) and lie outside
 * every checkpoint step (one holding manifest.bin, or a step-N of a root with `latest`); each is
 * CT_ERR_INPUT before anything is written. Every tensor's shape is checked against the headers
 * before anything is allocated or written; a failure after that (a value not finite) removes
 * step-00000000.tmp and the directories import made, and nothing that was there. Memory: one
 * Hugging Face tensor and one of ours at a time.
 */
ct_status ct_hf_import(const char *src, const char *root, int64_t seq_len, FILE *report);

#endif /* CT_CORE_HF_H */
