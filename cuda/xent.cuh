/*
 * xent.cuh — softmax cross-entropy on the CUDA backend, in the three passes the model runs so
 * that the vocabulary-parallel form needs only two small all-reduces between them (the slots
 * xent_rowmax, xent_sumexp and xent_finish of core/backend/backend.h): the logits are never
 * gathered.
 */
#ifndef CT_CUDA_XENT_CUH
#define CT_CUDA_XENT_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void ct_cuda_xent_rowmax(ct_cuda_ctx *cx, ct_dtype dt, float *rowmax, const void *logits, int64_t N,
                         int64_t V, int64_t n_valid);
void ct_cuda_xent_sumexp(ct_cuda_ctx *cx, ct_dtype dt, float *sumexp, float *target_logit,
                         void *logits, const int32_t *targets, const float *rowmax, int64_t N,
                         int64_t V, int64_t n_valid, int64_t col_offset, bool keep_exp);
void ct_cuda_xent_finish(ct_cuda_ctx *cx, ct_dtype dt, float *losses, void *logits_to_grad,
                         const int32_t *targets, const float *rowmax, const float *sumexp,
                         const float *target_logit, int64_t N, int64_t V, int64_t n_valid,
                         int64_t col_offset, float dloss, bool write_grad);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_XENT_CUH */
