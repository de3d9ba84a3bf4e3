/*
 * export.h — a checkpoint as one unsharded safetensors file with Hugging Face GPT-2, Llama or
 * Mixtral names (`cooktrain export DIR --out FILE [--dtype fp32|bf16]`), plus FILE's directory's
 * config.json that transformers' GPT2Config or LlamaConfig reads.
 *
 * Llama (LlamaForCausalLM's state dict; nn.Linear weights (out, in), as ours, not transposed):
 *   model.embed_tokens.weight (V, C)                           wte without the padding rows
 *   model.layers.L.input_layernorm.weight, post_attention_layernorm.weight   ln1, ln2
 *   model.layers.L.self_attn.{q,k,v,o}_proj.weight             wq, wk, wv, wo; q and k permuted
 *   model.layers.L.mlp.{gate,up,down}_proj.weight              w_gate, w_up, w_down
 *   model.norm.weight                                          lnf
 * with tie_word_embeddings (no lm_head.weight). A Mixture-of-Experts Llama of Mixtral's form (every
 * layer's MLP sparse, the topk_softmax router, no shared experts, no selection biases) writes
 * Mixtral (MixtralForCausalLM): model.layers.L.block_sparse_moe.gate.weight for moe.router and
 * .experts.e.{w1, w3, w2}.weight for its experts' w_gate, w_up, w_down (hf.h); other MoE models
 * are refused by name. The permutation: our RoPE rotates adjacent pairs
 * (2i, 2i+1) of a head, Hugging Face's pairs (i, i + hd/2), so within each head HF's row
 * j·hd/2 + i is our row 2i + j — applied here to q and k and nowhere else.
 *
 * The format, and GPT-2's names:
 *
 * safetensors: an 8-byte little-endian header length, a JSON header mapping each name to its
 * dtype ("F32" or "BF16"), shape and [begin, end) byte offsets into the data that follows, then
 * the data, row-major, little-endian. Names and layouts follow the `gpt2` checkpoints on the
 * Hugging Face hub (GPT2Model's state dict, no "transformer." prefix):
 *   wte.weight (V, C)            our wte without the vocabulary padding rows
 *   wpe.weight (T, C)
 *   h.L.ln_1.weight/bias (C)     ln1
 *   h.L.attn.c_attn.weight (C, 3C), .bias (3C)   [wq; wk; wv] transposed, [bq; bk; bv]
 *   h.L.attn.c_proj.weight (C, C), .bias         wo transposed
 *   h.L.ln_2.weight/bias (C)     ln2
 *   h.L.mlp.c_fc.weight (C, F), .bias (F)        w_up transposed
 *   h.L.mlp.c_proj.weight (F, C), .bias (C)      w_down transposed
 *   ln_f.weight/bias (C)         lnf
 * HF's Conv1D stores a linear layer as (in, out) where ours (like torch.nn.Linear) is
 * (out, in): every projection matrix is transposed on the way out. The LM head is tied to
 * wte, as in GPT-2 (tie_word_embeddings). GELU is the tanh form ("gelu_new"), LayerNorm eps 1e-5.
 */
#ifndef CT_CORE_EXPORT_H
#define CT_CORE_EXPORT_H

#include "core/common.h"

/* Reads checkpoint directory `dir` (every piece's checksum checked) and writes `out` and
 * config.json beside it, atomically (a temporary file renamed into place). dtype: F32 or BF16.
 * Memory: the largest tensor (c_attn: three of them) at a time. */
ct_status ct_export_safetensors(const char *dir, const char *out, ct_dtype dtype);

#endif /* CT_CORE_EXPORT_H */
