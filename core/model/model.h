/*
 * model.h — the model (GPT-2 or Llama, model.arch: their differences are entries of one table,
 * model_arch.h): parameter registry, flat per-unit buffers, layout-independent initialisation,
 * and forward/backward per chunk on a per-microbatch activation context (core/README.md, The
 * model; model/README.md).
 *
 * Parameters. Every tensor is registered with its global name and shape, its tensor-parallel
 * split, tie, pipeline chunk, FSDP unit, weight-decay flag and init rule. A unit (the embeddings;
 * one or more consecutive transformer layers; the final norm) owns one flat range of the
 * parameter slab and the same range of the gradient slab, padded to a multiple of the
 * data-parallel size and of 16 elements, so gradient reduction and ZeRO sharding work on whole
 * units. Tensors are views into their unit's range, packed in registry order.
 *
 * Units. The unit is the grain of gradient reduction, ZeRO sharding and ZeRO-3 gathering: few
 * large units mean fewer, larger collectives; many small ones mean more overlap and smaller
 * gather buffers. layout.unit_min_bytes (parallel.bucket_mb) is the wrapping policy: the layers
 * of a chunk are merged greedily, in order, into units of at least that many bytes of this
 * rank's parameters (the last unit of a chunk may be smaller). A unit never spans two chunks,
 * since chunks run at different times under pipeline parallelism, and the embedding and head
 * units are never merged with layers (the tied embedding's padding rules, ct_model_new). Merging
 * moves storage only: every parameter keeps its name, its initial values and the arithmetic of
 * its gradient, so on one rank the policy changes no bit (across ranks only the collectives'
 * summation order may change, core/README.md, Determinism).
 *
 * Chunks. A chunk is a contiguous range of layers, plus the embeddings if it is the first chunk
 * and the final norm, tied LM head and loss if it is the last. Forward and backward run per chunk
 * on a ct_acts (one per microbatch alive), so a pipeline can keep several microbatches in flight
 * and a layer can be recomputed. With world size 1 there is one chunk holding everything.
 *
 * Shapes: B micro-batch, T seq_len, C d_model, NH heads, hd head dim, F d_ff, Vp padded vocab.
 * Linear weights are (out, in), row-major.
 */
#ifndef CT_MODEL_H
#define CT_MODEL_H

#include "core/backend/backend.h"
#include "core/comm/comm.h"
#include "core/config/config.h"

#define CT_MAX_CHUNKS CT_MAX_VIRTUAL_STAGES /* chunks one rank holds (config.h) */

typedef enum ct_init_rule {
    CT_INIT_ZEROS = 0,
    CT_INIT_ONES,
    CT_INIT_NORMAL, /* N(0, init_std²) */
} ct_init_rule;

#define CT_PARAM_NO_FIELD ((size_t)-1)

typedef struct ct_param {
    char name[64]; /* global name, e.g. "layers.3.attn.wq" */
    int ndim;      /* 1 or 2 */
    int64_t global_shape[2];
    int64_t local_shape[2]; /* this rank's slice */
    int tp_split_dim;       /* -1 replicated over tp, 0 split by rows, 1 split by columns */
    int64_t tp_offset;      /* start of this rank's slice along the split dim */
    const char *tied_to;    /* name of the tensor this one is tied to, or NULL */
    int layer;              /* transformer layer it belongs to; -1: embeddings, final norm */
    size_t field;           /* offset of the pointer that names it: in ct_layer_params for a
                               layer's tensors, in ct_model for the others (bind_params);
                               CT_PARAM_NO_FIELD: none (an expert's tensors after the first) */
    int expert;             /* the MoE expert it belongs to (global index), -1: none */
    int chunk;              /* pipeline chunk (global index) */
    int unit;               /* FSDP unit (index into ct_model.units) */
    bool decay;             /* weight decay: tensors with >= 2 dims */
    ct_init_rule init;
    float init_std;
    int64_t valid_rows; /* rows that are real; the rest (vocab padding) stay zero */
    int64_t offset;     /* element offset inside its unit's flat range */
    int64_t numel;      /* local elements */
    ct_tensor *value;   /* view into the unit's parameter range */
    ct_tensor *grad;    /* view into the unit's gradient range */
} ct_param;

/* One FSDP unit: a run of consecutive registry entries sharing one flat range. */
typedef struct ct_unit {
    char name[32]; /* "embed", "layer.3" (one layer), "layers.3-5" (merged), "head" */
    int first_param, n_params;
    int first_layer, n_layers; /* the layers it holds; n_layers = 0 for embed and head */
    bool experts;              /* an MoE layer's experts (first_layer; n_layers 0): reduced and
                                  sharded over layout.edp instead of the dp group */
    int64_t numel;             /* sum of its parameters' local elements */
    int64_t padded_numel;      /* multiple of 16·dp */
    int64_t slab_offset;       /* start in the parameter / gradient / optimizer slabs */
    ct_tensor *params;         /* (padded_numel) */
    ct_tensor *grads;          /* (padded_numel) */
} ct_unit;

/* parallel.zero_stage decoded once (ct_zero_layout_of): what each data-parallel rank keeps only
 * its 1/dp shard of. The model reads the storage flags; the data-parallel layer
 * (parallel/data_parallel.h) reads all of it from the model's layout. */
typedef struct ct_zero_layout {
    int stage;        /* 0 replicated, 1 optimizer state sharded, 2 also gradients, 3 also params */
    bool shard_optim; /* stage >= 1: AdamW moments and master weights */
    bool shard_grads; /* stage >= 2 */
    bool shard_params; /* stage == 3 */
} ct_zero_layout;

/* The layout of ZeRO stage `zero_stage` (0-3; the config has checked the range). */
ct_zero_layout ct_zero_layout_of(int64_t zero_stage);

/* Where this rank sits: its tensor-parallel slice and the chunks it holds. */
typedef struct ct_model_layout {
    int tp_rank, tp_size;
    ct_comm *tp; /* tensor-parallel group (size 1 when tp = 1) */
    int dp_size; /* units are padded to a multiple of it */
    /* ZeRO storage (ct_zero_layout_of): with zero.shard_params / zero.shard_grads set, the model
     * allocates no full parameter (ZeRO-3) or gradient (ZeRO-2/3) slab; unit buffers are bound
     * by the data-parallel layer while in use (ct_model_bind_unit_params / _grads), which reads
     * its stage from here too. */
    ct_zero_layout zero;
    /* Sequence parallelism inside the tp group: the residual stream, norms and dropout-free
     * elementwise regions hold T/tp positions of every sequence; each tp allreduce becomes an
     * allgather before a column-parallel layer and a reduce-scatter after a row-parallel one. */
    bool sequence_parallel;
    /* Context parallelism (ring_attention.h): every sequence's positions are spread over the cp
     * group, this rank holding seq_len / cp of them as two chunks (zigzag or contiguous);
     * attention runs as a ring over cp, positions stay global. cp_size 1: none. */
    ct_comm *cp;
    int cp_rank, cp_size;
    bool cp_zigzag;
    /* Mixture of Experts (moe.c): the expert-parallel group (this rank holds experts
     * [ep_rank·E/ep, (ep_rank + 1)·E/ep) of each MoE layer; NULL: ep_size 1, all of them) */
    ct_comm *ep;
    int ep_rank, ep_size;
    /* The ranks holding the same experts (dp·cp / ep of them): the data-parallel group of the
     * expert units (ct_unit.experts); NULL: the dp group itself (ep_size 1) */
    ct_comm *edp;
    /* train.recompute = full: a layer keeps only its input; backward recomputes the rest. */
    bool recompute;
    /* The FSDP wrapping policy (parallel.bucket_mb): merge consecutive layers of a chunk into one
     * unit until it holds at least this many bytes of this rank's parameters (their local
     * elements × 4); 0 = one unit per layer. ct_model_layout_single / _pipeline leave it 0. */
    int64_t unit_min_bytes;
    /* Built only to be measured — parameters, units, activation bytes, FLOPs — and never run
     * (`plan`, which builds thousands in a search): the model skips what only running needs,
     * Llama's RoPE table (seq_len × head_dim sines, most of a build's time). */
    bool measure_only;
    int n_chunks; /* chunks on this rank */
    /* The pipeline's chunks form a V (parallel.schedule: zbv; schedule.h): rank r holds chunks r
     * and 2pp−1−r, so rank 0 holds the embeddings and the LM head; else rank r holds r, r+pp, … */
    bool v_shape;
    struct {
        int index; /* global chunk index */
        int first_layer, n_layers;
        bool has_embed, has_head;
    } chunks[CT_MAX_CHUNKS];
} ct_model_layout;

/* A layer's tensors, those its architecture registers (model_arch.h); the others stay NULL.
 * Llama has no biases (ln1_w and ln2_w are its RMSNorm weights) and a gated MLP: w_gate and w_up,
 * adjacent in the unit's range, form one (2F, C) column-parallel matrix per tp rank
 * (ct_model_mlp_up_weight). */
typedef struct ct_layer_params {
    ct_param *ln1_w, *ln1_b;     /* (C) */
    ct_param *wq, *bq;           /* (NH·hd, C), (NH·hd) column-parallel */
    ct_param *wk, *bk, *wv, *bv; /* (NKV·hd, C), (NKV·hd) column-parallel */
    ct_param *wo, *bo;           /* (C, NH·hd) row-parallel, (C) */
    ct_param *ln2_w, *ln2_b;     /* (C) */
    ct_param *w_gate;            /* llama: (F, C) column-parallel */
    ct_param *w_up, *b_up;       /* (F, C) column-parallel, (F) */
    ct_param *w_down, *b_down;   /* (C, F) row-parallel, (C) */
    /* An MoE layer (ct_moe_layer; no dense MLP then): the router (E, C), replicated, and this
     * rank's experts, ct_model_expert_tensors consecutive registry entries each from
     * moe_experts on (GPT-2: w_up (Fe, C) column-parallel, b_up (Fe), w_down (C, Fe)
     * row-parallel, b_down (C); Llama: w_gate and w_up (Fe, C) column-parallel, w_down) */
    ct_param *moe_router, *moe_experts;
    /* The part after ln2, chosen when the model is built (model_arch.h): the architecture's
     * dense MLP, or the MoE layer (moe_router set) */
    const struct ct_model_mlp *mlp;
} ct_layer_params;

/* The two parts of a split backward (ct_model_backward_input, ct_model_backward_weight):
 * CT_PASS_BACKWARD_INPUT brackets the input part, which reads the unit's parameters and writes
 * some of its gradients; CT_PASS_BACKWARD_WEIGHT the weight part, which writes the rest and reads
 * no parameters. A unit's gradients for the microbatch are complete at the end of the latter. */
typedef enum ct_pass {
    CT_PASS_FORWARD = 0,
    CT_PASS_BACKWARD,
    CT_PASS_BACKWARD_INPUT,
    CT_PASS_BACKWARD_WEIGHT
} ct_pass;
typedef struct ct_wgrad_store ct_wgrad_store; /* model_split.c */

/*
 * How the data-parallel layer follows the model (core/README.md, Layers: the parameter access
 * hook). The model brackets every use of a unit in a pass with unit_begin / unit_end: in a forward
 * pass its parameters are read between them; in a backward pass its parameters are read and its
 * gradients written, and unit_end means the unit's gradients for this microbatch are complete.
 * A unit of several layers is bracketed once per pass around all of them: opened before its
 * first layer in forward order (its last in backward) and closed after the last one it runs.
 * Brackets of different units may nest (the tied embedding stays open from the embedding to the
 * LM head); brackets of layer units never overlap. poll is called between ops so outstanding
 * communication progresses. NULL slots are no-ops (world size 1).
 */
typedef struct ct_model_hooks {
    void *ctx;
    void (*unit_begin)(void *ctx, int unit, ct_pass pass);
    void (*unit_end)(void *ctx, int unit, ct_pass pass);
    void (*poll)(void *ctx);
} ct_model_hooks;

typedef struct ct_model {
    ct_model_config mc; /* a copy of the model section */
    /* T: the positions of a sequence on this rank (seq_len / cp); T_seq: the whole sequence
     * (position table, RoPE table, attention FLOPs) */
    int64_t T, T_seq, C, L, NH, NKV, hd, F, V, Vp;
    uint64_t seed;
    ct_backend *be;
    /* Storage dtype of parameters and activations: f32, or bf16 for train.precision bf16 (then
     * gradients stay f32 and the optimizer keeps fp32 master weights; backend.h). */
    ct_dtype dtype;
    ct_model_layout layout;
    ct_comm *own_tp; /* the one-rank tp group made when layout.tp was NULL (freed with the model) */

    ct_param *params; /* the registry, in unit order */
    int n_params;
    ct_unit *units;
    int n_units;
    ct_tensor *param_slab; /* all units' parameters (model dtype), then the grads (f32) */
    ct_tensor *grad_slab;
    int64_t slab_numel;

    ct_model_hooks hooks;
    int embed_unit, head_unit; /* unit indices, -1 when not on this rank */
    int *layer_unit;           /* [L] unit of each layer (shared by merged layers), -1 when not
                                  on this rank */
    int *expert_unit;          /* [L] the unit of an MoE layer's experts, else -1 */
    int64_t Tl;                /* positions per rank in the residual stream: T/tp with sequence
                                  parallelism, else T */
    /* Sequence-parallel workspace, grown by ct_acts_new to the largest micro-batch: a local
     * (B,T/tp,C), a full (B,T,C) and the rank-major permutation buffer of the same size. */
    ct_tensor *sp_local, *sp_full, *sp_perm;
    int64_t sp_capacity_B;
    /* Recompute workspace: one layer's internals (shared by every activation context) and a
     * (B,Tl,C) output the recomputed forward writes and nobody reads. */
    ct_tensor *recompute_ws, *recompute_out;
    int64_t recompute_B;
    int live_acts; /* activation contexts alive (ct_acts_new / _free) */
    /* The step's per-token losses, [loss_slots] microbatches of loss_slot_len floats, kept on
     * the backend until the step ends (ct_model_begin_losses / ct_model_loss_sum). */
    ct_tensor *step_losses;
    int loss_slots;
    int64_t loss_slot_len;

    ct_param *wte, *wpe;     /* (Vp, C) vocab-parallel by rows, (T, C) (learned positions only) */
    ct_param *lm_head;       /* model.tie_embeddings false: (Vp, C) vocab-parallel; else NULL */
    ct_param *lnf_w, *lnf_b; /* (C) (lnf_b: LayerNorm only) */
    /* model.arch's entry (model_arch.h): GPT-2's LayerNorm, learned positions, biases and GELU, or
     * Llama's RMSNorm, RoPE, SwiGLU without biases */
    const struct ct_model_arch *arch;
    bool tied;                  /* model.tie_embeddings */
    struct ct_ring_ws *ring_ws; /* context parallelism: the ring's buffers (ring_attention.h) */
    ct_tensor *rope_table;      /* llama: (T, hd/2, 2) cos|sin, f32 (ct_rope_table) */
    ct_comm *own_ep;            /* the one-rank ep group made when layout.ep was NULL */
    bool recomputing;           /* backward is rebuilding a layer's internals (recompute) */
    /* Mixture of Experts, this rank's MoE layers over the training forwards since
     * ct_model_moe_stats last read them: the balancing and z-losses as the objective weighs
     * them, summed, and this rank's tokens routed to each expert (n_moe_layers × E). */
    int n_moe_layers; /* MoE layers on this rank */
    double moe_aux_sum, moe_z_sum;
    int64_t *moe_counts;
    float *moe_bias; /* (n_moe_layers × E) selection biases (model.moe_bias_rate) */
    /* Seconds in the MoE layers' routing, permutation, exchange and host copies, and in their
     * experts' GEMMs (with the FLOPs these did), since ct_model_moe_stats last read them: on a
     * backend that runs ops as they are issued (cpu), what each costs; elsewhere the host's
     * waits fall into the routing. */
    double moe_route_seconds, moe_expert_seconds, moe_expert_flops;
    ct_layer_params *layers;        /* [L], entries NULL for layers not on this rank */
    struct ct_model_decode *decode; /* between ct_model_decode_begin and _end, else NULL */
    ct_wgrad_store *wstore;         /* while ct_model_backward_input records, else NULL */
} ct_model;

/* Activations of one microbatch on this rank's chunks. */
typedef struct ct_layer_acts {
    /* RMSNorm (model_arch.h: norm_bias false): the *_mean statistics are NULL */
    ct_tensor *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C), (B·Tl), (B·Tl): with sequence
                                             parallelism ln1 is the gathered full sequence */
    ct_tensor *qkv;                       /* (B,T,(NH + 2·NKV)·hd): q | k | v heads per row */
    ct_tensor *att, *lse;                 /* (B,T,NH·hd), (B,NH,T) */
    ct_tensor *mid;                       /* (B,Tl,C) residual after attention */
    ct_tensor *ln2, *ln2_mean, *ln2_rstd;
    ct_tensor *h, *g;        /* the dense MLP's hidden before / after the activation: (B,T,F) GELU;
                                llama (B,T,2F) gate|up, (B,T,F) SwiGLU (model_arch.h, act.hidden) */
    struct ct_moe_acts *moe; /* an MoE layer's routing and expert activations (moe.c) */
} ct_layer_acts;

typedef struct ct_acts {
    struct ct_model *model;
    int64_t B;
    int mb;       /* the microbatch of the step these activations hold (its loss slot; <0 none) */
    float dloss;  /* the scale of the loss's gradient its last forward was given (0: no backward) */
    int n_layers; /* L (entries of layers not on this rank stay NULL) */
    ct_tensor *slab;
    ct_tensor *tokens, *targets; /* (B·T) i32 */
    ct_tensor **residual;        /* [L+1] (B,Tl,C): residual[l] is the input of layer l */
    ct_layer_acts *layers;       /* [L] */
    ct_tensor *lnf, *lnf_mean, *lnf_rstd;
    ct_tensor *logits; /* (B·T, Vp/tp), becomes dlogits after the loss */
    ct_tensor *rowmax, *sumexp, *target_logit, *losses; /* (B·T) */
    ct_wgrad_store *wstore[CT_MAX_CHUNKS]; /* per local chunk: its input part's record */
} ct_acts;

/* Scratch for backward, shared by all microbatches (backward runs one at a time). */
typedef struct ct_grad_scratch {
    int64_t B;
    ct_tensor *slab;
    ct_tensor *dres;      /* (B,Tl,C) gradient of the residual stream */
    ct_tensor *dln;       /* (B,T,C) gradient of a norm output (full sequence) */
    ct_tensor *dln_local; /* (B,Tl,C) its reduce-scattered part (sequence parallel) */
    ct_tensor *dfull;     /* (B,T,C) dres gathered over the sequence (sequence parallel) */
    ct_tensor *datt;      /* (B,T,NH·hd) */
    ct_tensor *dqkv;      /* (B,T,(NH + 2·NKV)·hd) */
    ct_tensor *dh;        /* (B,T,F) */
    ct_tensor *dgu; /* (B,T,hidden·F) the gradient of a hidden wider than F (llama's gate|up);
                       NULL when it is F wide (gpt2: dh holds it) */
} ct_grad_scratch;

/* Everything on one rank: one chunk with all layers, the embeddings and the head. */
ct_model_layout ct_model_layout_single(const ct_config *cfg);
/* The chunks of pipeline rank pp_rank: chunks pp_rank, pp_rank + pp, ... of the pp·v chunks
 * (parallel.pp_layers or an even split); tp and dp fields as in ct_model_layout_single. */
ct_model_layout ct_model_layout_pipeline(const ct_config *cfg, int pp_rank);

/* The Mixture-of-Experts layers among the layout's chunks (ct_moe_layer). */
int ct_layout_moe_layers(const ct_model_config *mc, const ct_model_layout *layout);

/* The parameters of the model on one rank (names, global shapes, init rules), without
 * allocating them: what `cooktrain import` writes. malloc'd, *count entries. */
ct_param *ct_model_registry(const ct_config *cfg, int *count);
/* Builds the registry and allocates parameters and gradients (params initialised, grads zero). */
ct_status ct_model_new(ct_model **out, const ct_config *cfg, ct_backend *be,
                       const ct_model_layout *layout);
void ct_model_free(ct_model *model);

/* Parameter initialisation from (seed, name, global element index) — layout-independent.
 * ct_model_init_unit writes one unit's parameters into its currently bound buffer. */
void ct_model_init_params(ct_model *model);
void ct_model_init_unit(ct_model *model, int unit);
/* Elements [lo, lo + n) of unit u's flat range as initial fp32 values (padding zero) into host
 * memory (n floats): what fp32 master weights start from, before the parameters' rounding to
 * bf16. Only the tensors the range touches are generated, so a ZeRO shard costs its own size. */
void ct_model_init_range_host(const ct_model *model, int unit, int64_t lo, int64_t n, float *host);
/* Zeroes the gradient slab (no-op when gradients are sharded: the data-parallel layer owns them).
 */
void ct_model_zero_grads(ct_model *model);
/* Points a unit's parameter (gradient) views at `buf` from element `offset` (padded_numel
 * elements must fit); buf NULL unbinds. */
void ct_model_bind_unit_params(ct_model *model, int unit, const ct_tensor *buf, int64_t offset);
void ct_model_bind_unit_grads(ct_model *model, int unit, const ct_tensor *buf, int64_t offset);
ct_param *ct_model_find_param(ct_model *model, const char *name);

/*
 * Accessors: how code outside core/ (the parallel layer) reaches the model, so that it does not
 * depend on the layout of ct_model. Views and pointers returned stay owned by the model.
 */
int ct_model_n_units(const ct_model *model);                   /* units on this rank */
const ct_unit *ct_model_unit(const ct_model *model, int unit); /* unit in [0, n_units) */
int ct_model_unit_chunk(const ct_model *model, int unit);      /* its chunk's global index */
int ct_model_n_params(const ct_model *model);                  /* registry entries on this rank */
const ct_param *ct_model_param(const ct_model *model, int i);  /* entry i, in unit order */
const ct_model_layout *ct_model_layout_of(const ct_model *model); /* where this rank sits */
ct_dtype ct_model_dtype(const ct_model *model);      /* storage dtype of parameters, activations */
ct_backend *ct_model_backend(const ct_model *model); /* where its tensors live */
int ct_model_n_layers(const ct_model *model);        /* L: all layers, not only this rank's */
/*
 * Decoding with a key/value cache (sampling, cmd/generate/sampler.c). Between
 * ct_model_decode_begin and ct_model_decode_end a forward runs one position of one sequence:
 * T = 1 row, at the position set by ct_model_decode_at, whose attention reads the keys and values
 * of the positions before it from a cache of T_seq rows per layer on this rank, and adds its own.
 * Context and sequence parallelism are set aside meanwhile (each rank of a cp group, and every tp
 * rank, holds the whole row; tensor parallelism still splits the heads and the vocabulary), so
 * forwards in any layout give the logits a full forward gives at that row, up to float rounding.
 * Activation contexts and pipelines made inside are for decoding only; free them before _end.
 * Forward only. Out of memory for the cache: CT_ERR_RUNTIME, the model unchanged.
 */
ct_status ct_model_decode_begin(ct_model *model);
/* The next forward's position: 0 <= pos < T_seq, positions 0..pos-1 already run (or the cache's
 * rows there are stale: a smaller pos starts a sequence again). */
void ct_model_decode_at(ct_model *model, int64_t pos);
void ct_model_decode_end(ct_model *model);

int64_t ct_model_seq_len(const ct_model *model);       /* T */
int64_t ct_model_local_seq_len(const ct_model *model); /* Tl: T/tp sequence parallel, else T */
int64_t ct_model_d_model(const ct_model *model);       /* C */
int64_t ct_model_vocab_size(const ct_model *model);    /* V: real tokens (Vp with padding) */
int ct_model_embed_unit(const ct_model *model); /* the embeddings' unit, -1 not on this rank */
int ct_model_head_unit(const ct_model *model);  /* final norm (+ twin) unit, -1 not on this rank */
/* The tied embedding as this rank's LM head or embedding reads it: wte, or its twin head.wte on
 * a last stage without the embedding; NULL on a rank with neither. */
const ct_param *ct_model_wte(const ct_model *model);
/* The LM head's weight on this rank (the last stage): ct_model_wte when tied, else lm_head. */
const ct_param *ct_model_head_weight(const ct_model *model);
/* The data-parallel layer's hooks: the ones installed, and installing new ones ({0}: none). */
const ct_model_hooks *ct_model_hooks_of(const ct_model *model);
/* Backward brackets a unit gets per microbatch: 2 for a tied embedding whose LM head sits in
 * another chunk of this rank (the V: both chunks bracket it), else 1. */
int ct_model_unit_brackets(const ct_model *model, int unit);
void ct_model_set_hooks(ct_model *model, ct_model_hooks hooks);

/*
 * The tied embedding, decided here and nowhere else. wte (Vp, C) is read by the embedding (first
 * chunk) and by the LM head (last chunk), and where it lives depends on the layout:
 *   CT_TIED_LOCAL  both on this rank (one pipeline stage): one tensor, wte, in the embedding
 *                  unit; its brackets span a whole pass (the data-parallel layer gives that unit
 *                  dedicated slots).
 *   CT_TIED_FIRST  first pipeline stage only: wte in the embedding unit, the owner; its twin is
 *                  on the last stage.
 *   CT_TIED_LAST   last pipeline stage only: the twin head.wte (tied_to = "wte": same initial
 *                  bytes, left out of the norm and of parameter dumps) in the head unit.
 *   CT_TIED_ABSENT neither (a middle pipeline stage).
 * In the FIRST and LAST cases wte and its twin sit at offset 0 of their units and both units are
 * padded to the same size (ct_model_new), so every data-parallel shard covers the same elements
 * of the two copies: their gradients are summed shard by shard over the embedding group
 * (ct_dp_sync_tied) and they stay bit-identical (the parameter stream checks it). `unit` (may be
 * NULL) gets the unit holding wte or its twin, -1 when absent.
 */
typedef enum ct_tied_place {
    CT_TIED_ABSENT = 0,
    CT_TIED_LOCAL,
    CT_TIED_FIRST,
    CT_TIED_LAST,
} ct_tied_place;
ct_tied_place ct_model_tied_place(const ct_model *model, int *unit);

ct_status ct_acts_new(ct_acts **out, ct_model *model, int64_t B);
void ct_acts_free(ct_acts *acts);
ct_status ct_grad_scratch_new(ct_grad_scratch **out, ct_model *model, int64_t B);
void ct_grad_scratch_free(ct_grad_scratch *scratch);
size_t ct_acts_bytes(const ct_model *model, int64_t B);
/* What the MoE layers' routed rows will add to the activations at the first step, over every
 * activation context alive (uniform routing: exact without expert parallelism; under ep a rank
 * that receives more rows grows further). 0 without MoE. ct_acts_bytes includes it already. */
size_t ct_acts_moe_first_step_bytes(const ct_model *model, int64_t B);

/* Copies microbatch mb's token ids (host, B·T each) into the context; mb < 0 keeps no loss
 * (the sampler). targets may be NULL. */
void ct_acts_set_batch(ct_acts *acts, int mb, const int32_t *tokens, const int32_t *targets);
/* The same from device memory: tokens and targets (NULL: none) hold B·T int32 each on the
 * model's backend; a device copy, so it can be captured in a graph. */
void ct_acts_set_batch_device(ct_acts *acts, int mb, const ct_tensor *tokens,
                              const ct_tensor *targets);
/* The residual (B,Tl,C) entering / leaving chunk c (index into layout.chunks): what a pipeline
 * receives before the chunk's forward and sends after it. */
ct_tensor *ct_acts_chunk_input(const ct_acts *acts, int c);
ct_tensor *ct_acts_chunk_output(const ct_acts *acts, int c);
/* (B·T, Vp/tp) this rank's columns of the logits after the last chunk's forward (dlogits when
 * it was given a dloss). */
ct_tensor *ct_acts_logits(const ct_acts *acts);
/* (B,Tl,C) the gradient of a chunk's input residual after its backward (ct_model_backward_chunk),
 * or the incoming gradient to put there before it. */
ct_tensor *ct_grad_scratch_dres(const ct_grad_scratch *scratch);

/*
 * The loss of a step reaches the host once, at its end (core/README.md, Ordering: values leave the
 * backend only through an explicit copy, and a copy waits for the stream). ct_model_begin_losses
 * makes room for n_microbatches slots of B·T floats and zeroes them; the forward of the last chunk
 * copies microbatch acts->mb's per-token losses into its slot, on the backend; ct_model_loss_sum
 * copies all slots to the host at once and returns their sum in double, microbatch by
 * microbatch in order, so the value depends neither on threads nor on layout. A rank without the
 * LM head has no slots and returns 0. Forwards of a microbatch without a slot (the sampler's)
 * keep no loss.
 */
void ct_model_begin_losses(ct_model *model, int n_microbatches, int64_t B);
double ct_model_loss_sum(ct_model *model);

/*
 * Forward of chunk `c` (index into layout.chunks). The first chunk embeds acts->tokens; the last
 * computes the loss against acts->targets, and, when dloss != 0, turns the logits into dlogits
 * scaled by dloss (so backward can follow without keeping the logits); the per-token losses go
 * to the step's loss slot acts->mb (ct_model_begin_losses).
 */
void ct_model_forward_chunk(ct_model *model, int c, ct_acts *acts, float dloss);
/* Backward of chunk `c`: accumulates parameter gradients; the gradient of the chunk's input
 * residual is left in scratch->dres (for the previous chunk). The last chunk starts from the
 * dlogits left by forward; any other chunk expects scratch->dres to hold the incoming gradient. */
void ct_model_backward_chunk(ct_model *model, int c, ct_acts *acts, ct_grad_scratch *scratch);

/*
 * The same backward in two parts, for the zero-bubble schedules (parallel/schedule.h).
 * ct_model_backward_input leaves scratch->dres as ct_model_backward_chunk does and writes every
 * gradient but the weight GEMMs of the linear layers (QKV, output, MLP and experts' projections),
 * which it records in `acts` with copies of their output gradients (and of their inputs under
 * recompute, or where the activations do not keep them: the experts'). ct_model_backward_weight
 * runs the record: after both, the gradients are ct_model_backward_chunk's bit for bit, and the
 * data-parallel layer sees each unit's gradients complete at the weight part (the parts' brackets
 * say CT_PASS_BACKWARD_INPUT and CT_PASS_BACKWARD_WEIGHT). The copies are activation memory, kept
 * with `acts` for the next step's record. One input part per chunk between weight parts.
 */
void ct_model_backward_input(ct_model *model, int c, ct_acts *acts, ct_grad_scratch *scratch);
void ct_model_backward_weight(ct_model *model, int c, ct_acts *acts);
/* The bytes a microbatch's input parts record on this rank for its weight parts (every local
 * chunk; the routed experts' rows as split evenly, which they are in total at ep = 1), and the
 * bytes `acts` holds for that now (its buffers grow to the largest record they met). Both are
 * activation memory a split schedule adds per microbatch in flight. */
size_t ct_model_wgrad_stash_bytes(const ct_model *model, int64_t B);
size_t ct_acts_wgrad_bytes(const ct_acts *acts);

/* Whole-model conveniences (all of this rank's chunks in order). ct_model_forward keeps the
 * loss in slot acts->mb like ct_model_forward_chunk; ct_model_forward_loss is the one-microbatch
 * form for tests and tools: one slot, forward, the summed loss read at once. */
void ct_model_forward(ct_model *model, ct_acts *acts, float dloss);
double ct_model_forward_loss(ct_model *model, ct_acts *acts, float dloss);
void ct_model_backward(ct_model *model, ct_acts *acts, ct_grad_scratch *scratch);

/*
 * Vocab-parallel softmax cross-entropy on this rank's columns of the logits (N, Vp/tp), whose
 * first n_valid columns are real and start at global column col_offset: exactly three
 * allreduces of N floats over tp (row max; sum of exponentials; target logit), the logits never
 * gathered. losses (N) gets each row's loss; with dloss != 0 the logits become
 * dloss·(softmax − onehot). rowmax, sumexp, target_logit (N) are scratch.
 */
void ct_vocab_parallel_xent(ct_comm *tp, ct_tensor *losses, ct_tensor *logits,
                            const ct_tensor *targets, ct_tensor *rowmax, ct_tensor *sumexp,
                            ct_tensor *target_logit, int64_t n_valid, int64_t col_offset,
                            float dloss);

/* Registry entries per expert of an MoE layer (model_arch.h, mlp_tensors): 4 for GPT-2 (w_up,
 * b_up, w_down, b_down), 3 for Llama (w_gate, w_up, w_down). */
int ct_model_expert_tensors(const ct_model *model);

/* The Mixture-of-Experts statistics of this rank's MoE layers since the last call, then reset
 * (*z: the router z-losses of this rank's tokens, weighted as in the objective, summed over
 * layers):
 * *aux = the balancing losses of the sequences this rank holds (each whole sequence's, counted
 * once per cp rank), weighted as in the objective (1 / the step's sequences), summed over layers;
 * counts[g·E + e] (ct_moe_layer_count × moe_experts entries, g the model's MoE layers in order)
 * = this rank's tokens routed to expert e in MoE layer g, summed over micro-batches; 0 for layers
 * on other pipeline stages. Training forwards only (dloss != 0, not a recompute). */
void ct_model_moe_stats(ct_model *model, double *aux, double *z, int64_t *counts);

/* Auxiliary-loss-free balancing (model.moe_bias_rate > 0): moves the selection bias of every MoE
 * layer on this rank by the step's counts of that layer, summed over every rank (counts as
 * ct_model_moe_stats lays them out: the whole model's MoE layers). */
void ct_model_moe_update_bias(ct_model *model, const int64_t *counts);

/* Global layer l's selection bias (moe_experts floats, host), or NULL when l is not an MoE layer
 * on this rank: what checkpoints save and load. */
float *ct_model_moe_bias(ct_model *model, int l);

/* Since the last call, then reset: this rank's seconds in its MoE layers' routing, permutation,
 * exchange and host copies (route_s) and in their experts' GEMMs (expert_s, which did
 * expert_flops), training passes only (model.h, moe_route_seconds, says what the clock sees). */
void ct_model_moe_timing(ct_model *model, double *route_s, double *expert_s, double *expert_flops);

/* A digest of the experts every token of `acts`'s last forward was routed to, in every MoE layer
 * (equal digests: the same routing; tests use it to keep finite differences off the routing's
 * discontinuities). */
uint64_t ct_model_moe_routing_digest(const ct_acts *acts);

/* Matmul FLOPs per token for forward+backward (6·N_matmul + 6·L·T·C causal attention). */
double ct_model_flops_per_token(const ct_model *model);

/* The backend's GEMM rate at the model's own shapes (model_gemms.c; the GEMM efficiency's
 * denominator, also scripts/bench_cpu.sh's): every linear layer's forward, input-gradient and
 * weight-gradient GEMM for a microbatch of cfg->train.micro_batch sequences, each called as the
 * model calls it, timed (median of `reps`) and weighted by how often a step runs it, in the dtypes
 * of cfg->derived.precision (ct_gemm_bench_linears). FLOP/s. */
double ct_model_gemm_rate(const ct_config *cfg, ct_backend *be, int reps);
/* The rate of a Mixture-of-Experts layer's expert GEMMs (0 without MoE): one expert's up and
 * down projections at the rows an expert receives from a microbatch under uniform routing
 * (micro_batch · seq_len · moe_top_k / moe_experts). */
double ct_model_expert_gemm_rate(const ct_config *cfg, ct_backend *be, int reps);

#endif /* CT_MODEL_H */
