/*
 * moe_router.h — the router of a Mixture-of-Experts layer, in fp32 on the host: which k of E
 * experts each token goes to, with which gate weights, the backward of the gates into the
 * router's logits, and the Switch/GShard load-balancing loss. The layer (moe.c), dispatch and
 * expert parallelism (moe_dispatch.h) stand on it.
 *
 * Kinds (z = the token's E logits, computed in fp32):
 *   SOFTMAX_TOPK  p = softmax(z) over all E; the k largest p; gates = those p, not renormalised
 *                 (Switch, Megatron's pre-softmax);
 *   TOPK_SOFTMAX  the k largest z; gates = softmax over those k logits, which is p renormalised
 *                 over the chosen (Mixtral);
 *   SIGMOID       s = sigmoid(z); the k largest s + bias (the bias, one per expert, only ranks:
 *                 DeepSeek-V3's auxiliary-loss-free balancing); gates = s / (sum of the chosen s).
 * Ties go to the lower expert index, and the chosen are listed by descending key, the lower index
 * first among equals: every rank that holds the same logits picks the same experts in the same
 * order.
 *
 * probs, the per-token distribution over E that the balancing loss averages: p for the softmax
 * kinds, s / sum(s) for SIGMOID. Everything is summed in double and rounded once to fp32.
 */
#ifndef CT_MOE_ROUTER_H
#define CT_MOE_ROUTER_H

#include <stdint.h>

typedef enum { CT_ROUTER_SOFTMAX_TOPK, CT_ROUTER_TOPK_SOFTMAX, CT_ROUTER_SIGMOID } ct_router_kind;

/* For N tokens (logits (N, E)): probs (N, E), ids (N, k) and gates (N, k). bias: E values added
 * to the selection key (NULL: none). 1 <= k <= E. */
void ct_router_fwd(ct_router_kind kind, const float *logits, const float *bias, int64_t N, int E,
                   int k, float *probs, int32_t *ids, float *gates);

/* dlogits (N, E) = the gradient of the loss through the gates, given dgates (N, k); logits and ids
 * as the forward had them (the gates are recomputed from the logits in double, as the forward
 * computed them before rounding). Overwrites dlogits. */
void ct_router_bwd(ct_router_kind kind, const float *logits, const int32_t *ids,
                   const float *dgates, int64_t N, int E, int k, float *dlogits);

/* The Switch/GShard load-balancing loss over T tokens routed k ways:
 *   L = alpha · E · sum_i f_i · P_i,  f_i = counts[i] / (T·k),  P_i = psum[i] / T,
 * counts[i] the tokens sent to expert i, psum[i] the tokens' probs for expert i summed. T counts
 * the tokens of the whole (global) micro-batch, so L does not depend on how the tokens are split
 * over ranks once counts and psum are summed over them. Uniform routing gives alpha; every token
 * to one expert with k = 1 gives alpha·E. */
double ct_router_aux_loss(const int64_t *counts, const double *psum, int64_t T, int E, int k,
                          double alpha);

/* Adds scale · dL/dlogits of that loss for the N local tokens into dlogits (N, E): f_i is a
 * constant (counts have no gradient), so dL/dprobs[t][i] = alpha·E·counts[i] / (k·T²) for every
 * token, taken back through the softmax (or the sigmoid and its normalisation). */
void ct_router_aux_bwd(ct_router_kind kind, const float *logits, const int64_t *counts, int64_t T,
                       int64_t N, int E, int k, double alpha, double scale, float *dlogits);

/* Auxiliary-loss-free balancing (DeepSeek-V3): after a step whose tokens went counts[i] to expert
 * i (summed over every rank, so every rank moves the same bias the same way),
 *   bias[i] += rate · sign(mean − counts[i]),  mean = (sum of counts) / E,
 * the sign taken on integers (E·counts[i] against the sum), so no rounding decides it: an expert
 * that got more than its share becomes less likely to be chosen, one that got fewer more likely;
 * a balanced expert keeps its bias. */
void ct_router_bias_update(const int64_t *counts, int E, float rate, float *bias);

#endif /* CT_MOE_ROUTER_H */
