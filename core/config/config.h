/*
 * config.h — the run configuration: YAML file (libyaml) + `--set section.key=value` overrides,
 * validated as a whole, with the derived values computed once (configs/README.md).
 *
 * Every field has a default (ct_config_defaults) and is documented in the key table of
 * config_keys.c, which is also what --print-config, unknown-key suggestions and
 * configs/README.md follow. The implementation is in four rooms: config_keys.c (the table, one
 * key's conversion and range), config_load.c (YAML, --set), config_validate.c (between keys,
 * derived values) and config_print.c.
 * Loading never exits: it returns CT_ERR_INPUT with a message naming the field and the value and
 * a hint (common.h). Validation that needs the world size (the grid) happens in
 * ct_config_validate, which every rank runs on the same input and so reaches the same verdict.
 */
#ifndef CT_CONFIG_H
#define CT_CONFIG_H

#include "core/common.h"

#include <stdio.h>

/* Most model chunks one pipeline rank holds (parallel.virtual_stages); the model's layout keeps
 * them in a fixed array (model.h, CT_MAX_CHUNKS). */
#define CT_MAX_VIRTUAL_STAGES 16

typedef enum ct_arch { CT_ARCH_GPT2 = 0, CT_ARCH_LLAMA } ct_arch;
/* parallel.schedule, and what the pipeline's generators build (parallel/schedule.h): one enum
 * for both. The configurable schedules come first, in the order of their names in the config;
 * FORWARD_ONLY (evaluation and sampling) is never chosen by a config. */
typedef enum ct_schedule_kind {
    CT_SCHEDULE_1F1B = 0,
    CT_SCHEDULE_GPIPE,
    CT_SCHEDULE_INTERLEAVED,
    CT_SCHEDULE_ZBH1,
    CT_SCHEDULE_ZBV,
    CT_SCHEDULE_FORWARD_ONLY,
} ct_schedule_kind;
/* train.precision (AUTO is resolved into derived.precision by ct_config_validate, which asks the
 * backend that will run: ct_backend_native_bf16) and parallel.grad_reduce_dtype (FP32 or BF16
 * only). */
typedef enum ct_precision {
    CT_PRECISION_FP32 = 0,
    CT_PRECISION_BF16,
    CT_PRECISION_AUTO
} ct_precision;
typedef enum ct_recompute { CT_RECOMPUTE_NONE = 0, CT_RECOMPUTE_FULL } ct_recompute;
/* parallel.cp_sharding: which two of the 2·cp chunks of a sequence a context-parallel rank holds
 * (core/model/ring_attention.h). */
typedef enum ct_cp_sharding { CT_CP_ZIGZAG = 0, CT_CP_CONTIGUOUS } ct_cp_sharding;
/* model.moe_router: how a Mixture-of-Experts layer picks its experts (core/model/moe_router.h) */
typedef enum ct_moe_router {
    CT_MOE_TOPK_SOFTMAX = 0, /* the k largest logits, gates = softmax over those k (Mixtral) */
    CT_MOE_SOFTMAX_TOPK,     /* softmax over all experts, the k largest, not renormalised */
    CT_MOE_SIGMOID,          /* sigmoid scores, the k largest, renormalised (DeepSeek-V3) */
} ct_moe_router;

typedef struct ct_model_config {
    ct_arch arch;
    int64_t vocab_size; /* real vocabulary (tokens the tokenizer can emit) */
    int64_t vocab_pad;  /* padded vocabulary is a multiple of this (default 128) */
    int64_t seq_len;
    int64_t n_layer;
    int64_t d_model;
    int64_t n_head;
    int64_t n_kv_head; /* 0 in the file means = n_head */
    int64_t d_ff;      /* 0 in the file means 4·d_model (gpt2), Llama's rule (llama) */
    /* Llama (arch llama; gpt2 ignores them): RMSNorm's eps, RoPE's base, and the MLP width rule
     * when d_ff is 0 (ct_llama_ffn_dim) */
    double norm_eps;
    double rope_theta;
    double ffn_dim_multiplier; /* 0: none */
    int64_t multiple_of;
    /* Llama 3.1's RoPE frequency scaling (core/model/rope.h, ct_rope_scaling): factor 0 = none */
    double rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_pos;
    /* weights to start from when no checkpoint is resumed: a cooktrain checkpoint (any layout) or
     * a Hugging Face model (core/io/hf.h); "" = initialise from train.seed */
    char init_from[CT_PATH_MAX];
    bool tie_embeddings; /* the LM head reads the embedding (else its own lm_head (Vp, C)) */
    /* Mixture of Experts (core/model/moe.h): moe_experts 0 = dense MLPs everywhere; else every
     * moe_every-th layer (ct_moe_layer) routes each token to moe_top_k of moe_experts MLPs of
     * width moe_d_ff (0 = d_ff), with the Switch/GShard balancing loss weighted moe_aux_alpha */
    int64_t moe_experts, moe_top_k, moe_every, moe_d_ff;
    ct_moe_router moe_router;
    double moe_aux_alpha;
    double moe_z_alpha; /* the router z-loss's weight (0: none) */
    int64_t moe_shared; /* shared experts: an MLP of width moe_shared·moe_d_ff every token meets */
    /* auxiliary-loss-free balancing: the per-expert selection bias's step (0: off, bias 0) */
    double moe_bias_rate;
} ct_model_config;

/* model.moe_router's names, in enum order (NULL-terminated). */
extern const char *const ct_moe_router_names[];

/* Whether layer l (from 0) is a Mixture-of-Experts layer: layers moe_every - 1, 2·moe_every - 1,
 * ... (every layer with moe_every 1). */
static inline bool ct_moe_layer(const ct_model_config *m, int64_t l) {
    return m->moe_experts > 0 && (l + 1) % m->moe_every == 0;
}

/* The model's Mixture-of-Experts layers (0 without experts). */
static inline int64_t ct_moe_layer_count(const ct_model_config *m) {
    return m->moe_experts > 0 ? m->n_layer / m->moe_every : 0;
}

/* Llama's MLP width: h = floor(2·4·d/3), then floor(ffn_dim_multiplier·h) when the multiplier is
 * positive, then rounded up to a multiple of multiple_of. Llama 2 7B: (4096, 0, 256) -> 11008;
 * Llama 3 8B: (4096, 1.3, 1024) -> 14336. */
int64_t ct_llama_ffn_dim(int64_t d_model, double ffn_dim_multiplier, int64_t multiple_of);

typedef struct ct_parallel_config {
    int64_t tp, pp, dp; /* dp 0 means world / (tp·cp·pp) */
    int64_t cp;         /* context-parallel degree */
    int64_t ep;         /* expert-parallel degree, inside dp (ep | dp) */
    ct_cp_sharding cp_sharding;
    int64_t zero_stage;
    ct_schedule_kind schedule;
    int64_t virtual_stages;
    char pp_layers[256]; /* comma-separated explicit split, "" = even */
    bool sequence_parallel;
    double bucket_mb;
    double timeout_s;
    ct_precision grad_reduce_dtype; /* fp32 or bf16 */
    bool auto_layout;               /* a world size the layout does not fit: choose one that does */
} ct_parallel_config;

typedef struct ct_train_config {
    int64_t steps;
    int64_t global_batch;  /* sequences per optimizer step */
    int64_t micro_batch;   /* sequences per microbatch per dp rank; 0 (or "auto" in a file) =
                              chosen by ct_config_validate, which stores the choice here */
    bool micro_batch_auto; /* not a key: micro_batch was resolved from auto by validate (so
                              it prints as auto and is chosen again for another world size) */
    double lr, min_lr;
    int64_t warmup_steps;
    double weight_decay;
    double grad_clip; /* 0 disables clipping */
    double beta1, beta2, eps;
    uint64_t seed;
    ct_precision precision;
    ct_recompute recompute;
    bool cuda_graph;       /* the step's forward and backward replayed from a CUDA graph */
    int64_t eval_interval; /* 0 disables evaluation */
    int64_t eval_steps;
    int64_t max_bad_steps;
    int64_t threads;    /* threads per rank; 0 = cores / ranks on this node */
    int64_t stop_after; /* stop (as if preempted) after this many steps; 0 = never */
} ct_train_config;

typedef struct ct_data_config {
    char train[CT_PATH_MAX]; /* shard path or glob */
    char val[CT_PATH_MAX];
    char tokenizer[CT_PATH_MAX];
} ct_data_config;

typedef struct ct_checkpoint_config {
    char dir[CT_PATH_MAX];
    int64_t interval;
    int64_t keep;
    bool async;                  /* files written on a background thread */
    char resume[CT_PATH_MAX];    /* auto | never | PATH */
    int64_t local_interval;      /* node-local checkpoints every this many steps (0: none) */
    char local_dir[CT_PATH_MAX]; /* their root on each node ("%h": the rank's host index) */
} ct_checkpoint_config;

typedef struct ct_log_config {
    int64_t interval;
    char metrics[CT_PATH_MAX];
    char trace[CT_PATH_MAX];
    char run_dir[CT_PATH_MAX];
    bool profile;                    /* time every op by category and print it per log interval */
    bool device_idle;                /* the device's time between ops, per log interval */
    int64_t sample_tokens;           /* print this many sampled tokens after training (0: none) */
    char sample_prompt[CT_PATH_MAX]; /* text the sample continues */
    int64_t flight_recorder;         /* operations each rank's flight recorder keeps (0: off) */
    double straggler_pct;            /* slower than the median by more than this: a straggler */
    int64_t straggler_intervals;     /* ... this many progress lines in a row */
} ct_log_config;

/* Values computed from the others (never set by the user). */
typedef struct ct_derived_config {
    int64_t world_size;
    int64_t dp;              /* resolved */
    int64_t vocab_padded;    /* vocab_size rounded up to a multiple of vocab_pad */
    int64_t n_kv_head;       /* resolved */
    int64_t d_ff;            /* resolved */
    int64_t moe_d_ff;        /* resolved (0 without MoE) */
    int64_t head_dim;        /* d_model / n_head */
    int64_t grad_accum;      /* global_batch / (micro_batch · dp) */
    int64_t n_params;        /* parameters of the model (tied embedding once, padding included) */
    ct_precision precision;  /* train.precision resolved: FP32 or BF16 (never AUTO) */
    char precision_why[96];  /* how it was chosen, e.g. "auto: the CPU has avx512_bf16" */
    int64_t tokens_per_step; /* global_batch · seq_len */
    int64_t warmup_asked;    /* train.warmup_steps as set when it exceeded train.steps (it is
                                then bounded to steps); 0 otherwise */
    char layout_chosen[512]; /* parallel.auto_layout's choice and why (parallel/plan_search.h,
                                ct_plan_choose_layout); "" when none was made */
} ct_derived_config;

typedef struct ct_config {
    ct_model_config model;
    ct_parallel_config parallel;
    ct_train_config train;
    ct_data_config data;
    ct_checkpoint_config checkpoint;
    ct_log_config log;
    ct_derived_config derived;
    /* Not a YAML key: the registered backend that will run (ct_backend_resolve of --backend),
     * set by cmd before ct_config_validate, whose train.precision=auto asks that backend whether
     * it multiplies bf16 natively (ct_backend_native_bf16). Default "cpu". */
    char runtime_backend[32];
} ct_config;

/* Fills every field with its default. */
void ct_config_defaults(ct_config *cfg);

/* A config file larger than this is refused (a config is a few KiB; a bigger file is the wrong
 * one). */
#define CT_CONFIG_MAX_BYTES (1024 * 1024)

/* Parses a YAML file into cfg (on top of what is there). Syntax errors quote the line. Only a
 * regular file of at most CT_CONFIG_MAX_BYTES is read: a device (/dev/zero), pipe or directory
 * is refused with CT_ERR_INPUT, never read forever. The file
 * is one mapping of section -> mapping of key -> scalar; an empty file changes nothing. On any
 * error cfg is left exactly as it was. Messages start with "path:line:col: ". */
ct_status ct_config_load_file(ct_config *cfg, const char *path);
/* Parses YAML text (for tests); `origin` names it in messages. Same rules as the file. */
ct_status ct_config_load_string(ct_config *cfg, const char *yaml, const char *origin);
/* Applies one "section.key=value" override with the same conversion and range checks as the
 * file. Whitespace around key and value is ignored; one pair of matching outer quotes around the
 * value is removed (so `--set 'data.val=""'` gives an empty string). cfg is untouched on error. */
ct_status ct_config_set(ct_config *cfg, const char *assignment);

/* Checks ranges and consistency and fills cfg->derived for a job of world_size ranks. */
ct_status ct_config_validate(ct_config *cfg, int64_t world_size);

/* parallel.bucket_mb as bytes: the smallest FSDP unit of merged layers (model.h). */
int64_t ct_config_unit_min_bytes(const ct_config *cfg);

/* Writes the resolved config as YAML (loadable again), then the derived values as comments. */
void ct_config_print(const ct_config *cfg, FILE *out);

/* Writes a Markdown table of every key (section.key, type and allowed values, default, meaning),
 * straight from the key table; configs/README.md embeds it (test/tools/gen_config_docs.c prints
 * it). */
void ct_config_write_docs(FILE *out);

/* The storage dtype of parameters and activations for a resolved precision (FP32 or BF16). */
static inline ct_dtype ct_precision_dtype(ct_precision precision) {
    return precision == CT_PRECISION_BF16 ? CT_DTYPE_BF16 : CT_DTYPE_F32;
}

#endif /* CT_CONFIG_H */
