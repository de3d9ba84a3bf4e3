/*
 * embedding.cuh — token and position embeddings on the CUDA backend (the slots embedding_fwd,
 * embedding_bwd, posemb_fwd, posemb_bwd of core/backend/backend.h). The backward adds rows in token
 * order without float atomics (deterministic, ct_cuda_ctx.h): a counting sort by row (integer
 * atomics, then each token placed by its rank) and one thread per row and column vector.
 */
#ifndef CT_CUDA_EMBEDDING_CUH
#define CT_CUDA_EMBEDDING_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void ct_cuda_embedding_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, const int32_t *tokens,
                           const void *table, int64_t N, int64_t C, int64_t rows,
                           int64_t row_offset);
void ct_cuda_embedding_bwd(ct_cuda_ctx *cx, ct_dtype dt, float *dtable, const void *dout,
                           const int32_t *tokens, int64_t N, int64_t C, int64_t rows,
                           int64_t row_offset);
void ct_cuda_posemb_fwd(ct_cuda_ctx *cx, ct_dtype dt, void *out, const void *wpe, int64_t B,
                        int64_t T, int64_t C, int64_t pos_offset);
void ct_cuda_posemb_bwd(ct_cuda_ctx *cx, ct_dtype dt, float *dwpe, const void *dout, int64_t B,
                        int64_t T, int64_t C, int64_t pos_offset);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_EMBEDDING_CUH */
