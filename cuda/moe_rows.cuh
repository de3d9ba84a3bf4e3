/*
 * moe_rows.cuh — Mixture of Experts' row movements on the CUDA backend (the slots gather_rows and
 * gather_dot of core/backend/backend.h): rows gathered by index and summed with weights (a token's
 * rows to its experts, the experts' outputs back to their tokens), and dot products of
 * index-selected row pairs (the gradient of the combine weights).
 * Rows are independent in gather_rows; gather_dot sums each row in one fixed order (a warp a row,
 * double accumulators, a fixed butterfly), so both are deterministic (ct_cuda_ctx.h).
 */
#ifndef CT_CUDA_MOE_ROWS_CUH
#define CT_CUDA_MOE_ROWS_CUH

#include "cuda/ct_cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (N, C) row i = Σ_{j<slots} w[i·slots + j] · in[idx[i·slots + j]], the terms added in slot
 * order from slot 0's product, fp32, rounded once to dt; w NULL: every weight 1 (slots 1: an exact
 * row copy). in (in_rows, C) of dt; idx and w (N·slots) i32 and f32. */
void ct_cuda_gather_rows(ct_cuda_ctx *cx, ct_dtype dt, void *out, const void *in,
                         const int32_t *idx, const float *w, int64_t N, int64_t slots, int64_t C,
                         int64_t in_rows);
/* out (R) f32, out[r] = Σ_c a[ia[r]·C + c] · b[ib[r]·C + c], the products summed in double and
 * rounded once; a (a_rows, C) and b (b_rows, C) of dt, ia and ib (R) i32. */
void ct_cuda_gather_dot(ct_cuda_ctx *cx, ct_dtype dt, float *out, const void *a, const int32_t *ia,
                        const void *b, const int32_t *ib, int64_t R, int64_t C, int64_t a_rows,
                        int64_t b_rows);

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_MOE_ROWS_CUH */
