/*
 * hf.h — Hugging Face models in and out: which of our tensors each Hugging Face tensor holds
 * (export.h describes the names and layouts, GPT-2's and Llama's), config.json, and reading a
 * model (config.json + safetensors) into our tensors for `cooktrain import` and model.init_from.
 *
 * A model is a directory holding config.json and either model.safetensors or
 * model.safetensors.index.json (whose weight_map names the files of a sharded model), or a
 * .safetensors file with config.json beside it. Everything read is checked before use
 * (safetensors.h; config.json below); a tensor that is missing, or whose shape is not the one
 * config.json implies, is CT_ERR_INPUT naming it.
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

typedef struct ct_hf_model {
    char dir[CT_PATH_MAX]; /* where config.json is */
    ct_hf_config config;
    int n_files;
    ct_safetensors *files;
    int n_names;
    ct_hf_tensor *names; /* ct_hf_tensors of this model */
} ct_hf_model;

/* True when `path` looks like a Hugging Face model rather than a cooktrain checkpoint: a
 * .safetensors file, or a directory with config.json and no manifest.bin. */
bool ct_hf_is_model(const char *path);
ct_status ct_hf_open(const char *path, ct_hf_model *model);
void ct_hf_close(ct_hf_model *model);

/* The model keys that describe this model (the rest of *mc untouched; seq_len = max_positions). */
void ct_hf_model_config(const ct_hf_config *hf, ct_model_config *mc);
/* Whether a run's model (validated cfg) is this one: CT_ERR_INPUT naming the first key that
 * differs (GPT-2's seq_len may be below n_positions: the first rows of wpe are read). */
ct_status ct_hf_check_config(const ct_hf_model *model, const ct_config *cfg);

/* Our global tensor `name` (rows x cols, row-major; vocabulary padding rows zero) from the
 * model's files. Memory: the Hugging Face tensor that holds it, as fp32, besides out. */
ct_status ct_hf_read(const ct_hf_model *model, const char *name, int64_t rows, int64_t cols,
                     float *out);

/*
 * `cooktrain import SRC --out ROOT [--seq-len N]`: the model at SRC as a cooktrain checkpoint,
 * ROOT/step-00000000 (and ROOT/latest), written atomically as a run's saves are: the weights of
 * one process's layout (any layout loads them), AdamW's moments left out (zero at step 0), the
 * config of a run of this model (defaults elsewhere; seq_len N, else config.json's positions).
 * Prints the model keys of that config to `report`. Refuses a ROOT that already holds a
 * checkpoint. Memory: one Hugging Face tensor and one of ours at a time.
 */
ct_status ct_hf_import(const char *src, const char *root, int64_t seq_len, FILE *report);

#endif /* CT_CORE_HF_H */
