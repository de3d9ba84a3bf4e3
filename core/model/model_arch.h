/*
 * model_arch.h — the model's architectures (model.arch) side by side behind one table: what GPT-2
 * and Llama do differently, and nothing else. Each architecture is one entry, ct_model_arch_gpt2
 * (model_gpt2.c) and ct_model_arch_llama (model_llama.c); ct_model_arch_of finds it and the
 * model keeps it in ct_model.arch. The driver (model.c: the registry, forward and backward over
 * chunks), the activations (model_acts.c), the Mixture-of-Experts layer (moe.c), the GEMM
 * shapes (model_gemms.c) and the Hugging Face names (io/hf.c) read an architecture
 * only through its entry; none of them tests which one it is.
 *
 * A layer is the architecture's block (layer_forward / layer_backward: norms, attention, the
 * residual connections) around an MLP part chosen per layer when the model is built
 * (ct_layer_params.mlp): the architecture's dense MLP, or the Mixture of Experts
 * (ct_model_moe_mlp), whose experts are MLPs of the architecture's kind (mlp_tensors, act).
 */
#ifndef CT_MODEL_ARCH_H
#define CT_MODEL_ARCH_H

#include "model.h"

/* The part of a layer after its second norm, ln2 (B,T,C), chosen per layer at build. */
typedef struct ct_model_mlp {
    /* out (B,Tl,C) = mid + MLP(ln2), reading la->ln2 and la->mid of layer l */
    void (*forward)(ct_model *m, int l, ct_acts *a, ct_tensor *out);
    /* From s->dres = ∂L/∂out: accumulates the parameter gradients and returns ∂L/∂ln2 summed
     * over tp (ct_model_dln_reduced), for the ln2 backward. */
    ct_tensor *(*backward)(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s);
} ct_model_mlp;

/* The Mixture-of-Experts layer (moe.c): router, dispatch, the architecture's MLP per expert,
 * combine. */
extern const ct_model_mlp ct_model_moe_mlp;

/* A dimension of a layer's tensor, resolved when it is registered. */
typedef enum ct_arch_dim {
    CT_DIM_ONE = 0, /* 1: the columns of a vector */
    CT_DIM_MODEL,   /* C, d_model */
    CT_DIM_Q,       /* NH·hd: the query heads */
    CT_DIM_KV,      /* NKV·hd: the key (or value) heads */
    CT_DIM_WIDTH,   /* the MLP's width: d_ff for the dense MLP, moe_d_ff for a routed expert,
                       moe_shared·moe_d_ff for the shared experts */
} ct_arch_dim;

/* One tensor a layer registers (ct_param), in registry order. */
typedef struct ct_arch_tensor {
    const char *name;       /* after "layers.L." ("attn.wq"); an MLP's after its prefix, "mlp.",
                               "moe.shared." or "moe.experts.E." ("w_up") */
    size_t field;           /* offsetof(ct_layer_params, ...): the pointer that names it */
    int ndim;               /* 1 or 2 */
    ct_arch_dim rows, cols; /* cols CT_DIM_ONE for a vector */
    int split;              /* tp: 0 rows (column-parallel), 1 columns (row-parallel), -1 none */
    ct_init_rule init;
    bool residual; /* N(0, 0.02/sqrt(2L)): a projection into the residual stream (else 0.02) */
} ct_arch_tensor;

/* The activation between an MLP's two projections, the same in the dense MLP, the shared and the
 * routed experts. The up projection is the MLP's first `hidden` tensors (mlp_tensors), (width, C)
 * each and adjacent in their unit, so one GEMM makes the whole hidden (ct_model_mlp_up_weight). */
typedef struct ct_arch_act {
    int hidden;  /* the hidden before the activation, in MLP widths: 1 (h), 2 (gate|up) */
    int matmuls; /* weight matrices of one MLP, for FLOPs: up, down (2); gate, up, down (3) */
    /* g (rows, width) = act(h (rows, hidden·width)) */
    void (*fwd)(ct_tensor *g, const ct_tensor *h);
    /* dh (h's shape) from dg; db_up (NULL when the MLP has no b_up) accumulates Σ dh */
    void (*bwd)(ct_tensor *dh, ct_tensor *db_up, const ct_tensor *h, const ct_tensor *dg);
} ct_arch_act;

/* One Hugging Face tensor of every layer: up to three of ours (names after "layers.L.") stacked by
 * rows, transposed (GPT-2's Conv1D stores (in, out)) or not, a q or k projection whose rows
 * export permutes between the RoPE conventions (export.h) or not. */
typedef struct ct_arch_hf_tensor {
    const char *hf; /* after the layer's prefix */
    const char *src[3];
    bool transpose, rope;
} ct_arch_hf_tensor;

/* The architecture's names in Hugging Face's layout (io/hf.c builds the list from them). */
typedef struct ct_arch_hf {
    const char *state_prefix;  /* also accepted before every name on import (GPT2LMHeadModel's
                                  "transformer."); NULL: none */
    const char *layer;         /* a layer's prefix, printf of its index (long long): "h.%lld." */
    const char *wte, *wpe;     /* the embedding, the learned positions (NULL: none) */
    const char *lnf_w, *lnf_b; /* the final norm's weight and bias (NULL: none) */
    const ct_arch_hf_tensor *layer_tensors; /* a layer's, in the order export writes them */
    int n_layer_tensors;
    /* An MoE layer, in place of the tensors of the layer's MLP (src "mlp.*"): the router (after
     * the layer's prefix; ours moe.router), then per expert its prefix (after the layer's,
     * printf of the expert's index) and its tensors (one source each, a kind of mlp_tensors).
     * router NULL: the architecture's experts have no Hugging Face layout. */
    const char *router, *expert;
    const ct_arch_hf_tensor *expert_tensors;
    int n_expert_tensors;
} ct_arch_hf;

typedef struct ct_model_arch {
    /* The parameter registry (model.c). A layer registers layer_tensors, then its MLP part:
     * mlp_tensors under "mlp." (the dense MLP), or the router, the shared experts (mlp_tensors
     * under "moe.shared.", moe_shared·moe_d_ff wide, bound to the dense MLP's fields) and, in a
     * unit of their own, each expert's mlp_tensors under "moe.experts.E." (moe_d_ff wide). The
     * embedding unit holds wte, and wpe (T_seq, C) with learned_positions; the head unit
     * [lm_head or the tied twin,] lnf.weight, and lnf.bias with norm_bias. */
    const ct_arch_tensor *layer_tensors;
    int n_layer_tensors;
    const ct_arch_tensor *mlp_tensors;
    int n_mlp_tensors;
    bool learned_positions;
    bool norm_bias;   /* LayerNorm: weight and bias, a mean kept per row; else RMSNorm: weight */
    bool linear_bias; /* the block's linear layers carry biases (ct_gemm_bias) */
    ct_arch_act act;  /* the MLPs' activation, and the shapes it implies */

    /* What the architecture builds beside its parameters once the model is laid out (Llama:
     * RoPE's table); CT_ERR_RUNTIME when out of memory. NULL: nothing. */
    ct_status (*setup)(ct_model *m, const ct_config *cfg);
    /* Layer l's block: forward on residual[l] into `out` (residual[l+1], or a scratch when
     * backward recomputes the internals), writing its internals into a->layers[l]; backward from
     * s->dres = ∂L/∂residual[l+1] to ∂L/∂residual[l], accumulating its parameters' gradients.
     * The MLP part is reached through m->layers[l].mlp. */
    void (*layer_forward)(ct_model *m, int l, ct_acts *a, ct_tensor *out);
    void (*layer_backward)(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s);
    ct_model_mlp dense_mlp; /* the MLP part of a layer that is not an MoE layer */

    ct_arch_hf hf;
} ct_model_arch;

extern const ct_model_arch ct_model_arch_gpt2;  /* model_gpt2.c */
extern const ct_model_arch ct_model_arch_llama; /* model_llama.c */

/* The entry of model.arch `arch` (a valid ct_arch: the config has checked it). */
const ct_model_arch *ct_model_arch_of(ct_arch arch);

#endif /* CT_MODEL_ARCH_H */
