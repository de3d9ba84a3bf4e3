/*
 * rope.cuh — rotary position embedding on the CUDA backend (the slot rope of
 * core/backend/backend.h): adjacent pairs rotated in place by the angles of the host-built table.
 */
#ifndef CT_CUDA_ROPE_CUH
#define CT_CUDA_ROPE_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

void ct_cuda_rope(ct_cuda_ctx *cx, ct_dtype dt, void *x, const float *cos_sin, int64_t B, int64_t T,
                  int64_t n_rot_head, int64_t head_dim, int64_t ld, int64_t pos_offset,
                  bool inverse);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_ROPE_CUH */
