/*
 * moe_dispatch.h — moving tokens to their experts and back over an expert-parallel group: the
 * dispatch and combine of a Mixture-of-Experts layer, forward and backward, on the backend's
 * memory: the rows are gathered and scattered by ct_gather_rows with index arrays the plan builds
 * on the host, and travel by the ep group's all_to_all_v (MPI on the CPU backend, grouped NCCL
 * sends and receives of device buffers on CUDA). Dropless: every (token, slot) assignment
 * travels.
 *
 * The group's P ranks hold E experts, E / P consecutive ones each (expert e on rank e / (E/P)).
 * Each rank brings N tokens routed k ways (ids (N, k), from the router). Assignment (i, j) is
 * token i's slot j. Send order: the assignments sorted by expert, then token, then slot (stable),
 * so the rows for each destination rank are contiguous and grouped by its experts. At an expert
 * side the rows arrive by source rank; they are regrouped expert-major: local expert l's rows are
 * those from source rank 0 first, then rank 1, ..., each source's in its token order — with the
 * ranks of a dp group holding consecutive samples, the order of the global batch.
 *
 * Counts are exchanged once, in ct_moe_plan_new (an all_to_all of E int64 per rank, counted as
 * all_to_all), and every later all_to_all_v uses those agreed counts, so a disagreement cannot
 * leave a receive waiting. The rows travel by all_to_all_v (counted as the bytes sent).
 *
 * Sums are in a fixed order: combine adds a token's k contributions in slot order, starting
 * from slot 0's term; the gate gradient is a dot product over the row, summed in double and
 * rounded once (ct_gather_dot). Nothing depends on P beyond where the rows are, so the results
 * are the same bits for every ep size when the experts compute each row alone.
 */
#ifndef CT_MOE_DISPATCH_H
#define CT_MOE_DISPATCH_H

#include <stdint.h>

#include "core/backend/backend.h"
#include "core/comm/comm.h"

typedef struct ct_moe_plan ct_moe_plan;

/* The plan for this rank's N tokens routed k ways (ids (N, k), each in [0, E)) over `ep`
 * (E % ep->size == 0). Collective over `ep`: exchanges the per-expert counts. */
ct_moe_plan *ct_moe_plan_new(ct_comm *ep, const int32_t *ids, int64_t N, int k, int E);
void ct_moe_plan_free(ct_moe_plan *p); /* accepts NULL */

/* Rows this rank's experts receive: in all, and local expert l's (0 <= l < E / P), which start
 * at row ct_moe_plan_expert_offset(p, l) of the expert-major buffers. */
int64_t ct_moe_plan_rows(const ct_moe_plan *p);
int64_t ct_moe_plan_expert_rows(const ct_moe_plan *p, int l);
int64_t ct_moe_plan_expert_offset(const ct_moe_plan *p, int l);
/* Assignments this rank routed to expert e (0 <= e < E): its part of the expert load. */
int64_t ct_moe_plan_sent_to(const ct_moe_plan *p, int e);

/* The backend buffers of the dispatch (the plan's index arrays, uploaded once per plan, and
 * the rows in flight), kept by the caller from one plan to the next and grown as needed. */
typedef struct ct_moe_scratch ct_moe_scratch;
ct_moe_scratch *ct_moe_scratch_new(struct ct_backend *be);
void ct_moe_scratch_free(ct_moe_scratch *s); /* accepts NULL */

/* The four movements, on tensors of one backend (s's), rows of C values in x's dtype; the ep
 * group must be bound to that backend (ct_comm_set_stream) when it is not host memory.
 * Forward dispatch: x (N, C) → xe (rows, C), expert-major. Collective over the plan's group. */
void ct_moe_dispatch(ct_moe_plan *p, ct_moe_scratch *s, const ct_tensor *x, ct_tensor *xe);

/* Forward combine: the experts' outputs ye (rows, C) back to their tokens. ys (N·k, C), the
 * caller's, receives them in send order and is kept for the backward; y (N, C) = Σ_j
 * gates[i, j] · (the row of assignment (i, j)), slot order (gates (N·k) f32). Collective. */
void ct_moe_combine(ct_moe_plan *p, ct_moe_scratch *s, const ct_tensor *ye, const ct_tensor *gates,
                    ct_tensor *ys, ct_tensor *y);

/* Backward of combine, from dy (N, C): dgates (N·k, f32) = dy[i] · row(i, j) (from ys, summed
 * in double), and the experts' output gradients dye (rows, C) = gates[i, j] · dy[i],
 * expert-major. Collective. */
void ct_moe_combine_bwd(ct_moe_plan *p, ct_moe_scratch *s, const ct_tensor *dy, const ct_tensor *ys,
                        const ct_tensor *gates, ct_tensor *dgates, ct_tensor *dye);

/* Backward of dispatch: dxe (rows, C), expert-major, → dx (N, C) = Σ_j (row of (i, j)), slot
 * order. Collective. */
void ct_moe_dispatch_bwd(ct_moe_plan *p, ct_moe_scratch *s, const ct_tensor *dxe, ct_tensor *dx);

#endif /* CT_MOE_DISPATCH_H */
