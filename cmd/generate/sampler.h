/*
 * sampler.h — text generation from the trained model, in any layout.
 *
 * Every rank runs the sampler in lockstep, because the forward pass is collective: tensor-parallel
 * layers reduce over tp, ZeRO-3 gathers units over dp, and with pipeline parallelism the window
 * travels through the stages on a forward-only schedule of one microbatch of one sequence. While
 * the text fits in seq_len each position runs once, one row against the key/value cache
 * (model.h, ct_model_decode_begin); past it the window of the last seq_len tokens runs whole. Token
 * k is drawn from softmax(logits) over the real vocabulary with the counter-based uniform
 * u_k = rng(seed, k): the first token whose running sum of exp(logit − max), in vocabulary order,
 * reaches u_k times the total. With the vocabulary split over tp each rank reduces over its own
 * rows only — the max and the per-rank sums travel, never the logits — and the rank whose rows
 * hold the crossing point names the token. The running sum is the same sequence of additions as
 * on one rank, so every layout draws the tokens a world-size-1 run draws (core/README.md,
 * Determinism), up to the float rounding of the logits themselves.
 */
#ifndef CT_PARALLEL_SAMPLER_H
#define CT_PARALLEL_SAMPLER_H

#include "core/model/model.h"
#include "core/data/tokenizer.h"
#include "parallel/context.h"
#include "parallel/data_parallel.h"

/* Temperature (> 0; logits divided by it) and top-k (0: the whole vocabulary; else only the k
 * largest logits, ties with the k-th included). NULL means 1 and 0: plain softmax sampling. */
typedef struct ct_sample_options {
    double temperature;
    int64_t top_k;
    /* run the whole window for every token instead of one position against the key/value cache
     * (the same tokens up to float rounding, at the cost the cache saves: for comparison) */
    bool full_windows;
} ct_sample_options;

/*
 * Continues the prompt (n_prompt >= 1 token ids) by n_new tokens. Collective over the world;
 * every rank gets the whole sequence (*out, malloc'd, *n_out = n_prompt + n_new). The context is
 * the last seq_len tokens. Out of memory for the activations is agreed on by every rank
 * (CT_ERR_RUNTIME on all).
 */
ct_status ct_sample_tokens(ct_model *model, ct_dp *dp, ct_pctx *pctx, const int32_t *prompt,
                           int64_t n_prompt, int64_t n_new, uint64_t seed,
                           const ct_sample_options *opt, int32_t **out, int64_t *n_out);

/*
 * The prompt text encoded (an empty one starts from a newline byte) and continued by n_new
 * tokens, printed by world rank 0 between two rules. Collective over the world.
 */
ct_status ct_sample_print(ct_model *model, ct_dp *dp, ct_pctx *pctx, const ct_tokenizer *tok,
                          const char *prompt, int64_t n_new, uint64_t seed,
                          const ct_sample_options *opt);

/*
 * The draw itself, for one row of logits: this rank's columns `logits` (n_valid real ones,
 * global vocabulary index col_offset + i) of a vocabulary split over `tp` in rank order.
 * Collective over tp; every rank of tp returns the token. u in [0, 1).
 */
int32_t ct_sample_draw(ct_comm *tp, const float *logits, int64_t n_valid, int64_t col_offset,
                       int64_t vocab_size, double u, const ct_sample_options *opt);

#endif /* CT_PARALLEL_SAMPLER_H */
