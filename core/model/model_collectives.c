/*
 * model_collectives.c — the model's tensor- and sequence-parallel collectives (model.c calls them;
 * see model_collectives.h): the sums over the tp group, the vocab-parallel cross-entropy's
 * reductions, sequence parallelism's moves between (B, T/tp, C) slices and the full sequence, and
 * the "copy" / "reduce" boundaries entering column-parallel and leaving row-parallel blocks with
 * their backward conjugates. With tp = 1 every collective is on a group of one and costs nothing.
 */
#include "model_collectives.h"

/* Sum over the tensor-parallel group (no-op for tp = 1). */
void ct_model_tp_allreduce(ct_model *m, ct_tensor *t, ct_reduce_op op) {
    ct_comm_allreduce(m->layout.tp, t->data, t->numel, t->dtype, op);
}

void ct_vocab_parallel_xent(ct_comm *tp, ct_tensor *losses, ct_tensor *logits,
                            const ct_tensor *targets, ct_tensor *rowmax, ct_tensor *sumexp,
                            ct_tensor *target_logit, int64_t n_valid, int64_t col_offset,
                            float dloss) {
    ct_xent_rowmax(rowmax, logits, n_valid);
    ct_comm_allreduce(tp, rowmax->data, rowmax->numel, CT_DTYPE_F32, CT_REDUCE_MAX);
    ct_xent_sumexp(sumexp, target_logit, logits, targets, rowmax, n_valid, col_offset,
                   dloss != 0.0f);
    ct_comm_allreduce(tp, sumexp->data, sumexp->numel, CT_DTYPE_F32, CT_REDUCE_SUM);
    ct_comm_allreduce(tp, target_logit->data, target_logit->numel, CT_DTYPE_F32, CT_REDUCE_SUM);
    ct_xent_finish(losses, logits, targets, rowmax, sumexp, target_logit, n_valid, col_offset,
                   dloss, dloss != 0.0f);
}

/* ---- sequence parallelism: moving between (B, T/tp, C) slices and the full sequence ------- */

/* A (B, T, C) or (B, T/tp, C) view of one of the sequence-parallel workspaces. */
ct_tensor *ct_model_sp_view(ct_tensor *slab, int64_t B, int64_t T, int64_t C) {
    int64_t shape[3] = {B, T, C};
    return ct_tensor_view(slab, 0, 3, shape);
}

/* Copies a block of n elements between two tensors at element offsets. */
static void copy_block(ct_tensor *dst, int64_t dst_off, const ct_tensor *src, int64_t src_off,
                       int64_t n) {
    ct_tensor *d = ct_tensor_view_1d(dst, dst_off, n);
    ct_tensor *s = ct_tensor_view_1d(src, src_off, n);
    ct_tensor_copy(d, s);
    ct_tensor_free(d);
    ct_tensor_free(s);
}

/* Collectives produce and consume rank-major buffers (tp, B, T/tp, C); the model's layout is
 * (B, T, C) with rank r holding positions [r·T/tp, (r+1)·T/tp) of every sequence. With B = 1
 * the two orders coincide. */
static void seq_permute(ct_model *m, ct_tensor *dst, const ct_tensor *src, int64_t B,
                        bool to_rank_major) {
    int64_t tp = m->layout.tp_size, Tl = m->Tl, C = m->C, block = Tl * C;
    for (int64_t r = 0; r < tp; r++)
        for (int64_t b = 0; b < B; b++) {
            int64_t rank_major = (r * B + b) * block, seq_major = (b * m->T + r * Tl) * C;
            if (to_rank_major)
                copy_block(dst, rank_major, src, seq_major, block);
            else
                copy_block(dst, seq_major, src, rank_major, block);
        }
}

/* full (B,T,C) = every tp rank's slice (B,T/tp,C) gathered along the sequence. */
static void seq_gather(ct_model *m, ct_tensor *full, const ct_tensor *slice) {
    int64_t B = slice->shape[0], n = full->numel;
    if (B == 1) {
        ct_comm_allgather(m->layout.tp, slice->data, full->data, n, slice->dtype);
        return;
    }
    ct_tensor *perm = ct_tensor_view_1d(m->sp_perm, 0, n);
    ct_comm_allgather(m->layout.tp, slice->data, perm->data, n, slice->dtype);
    seq_permute(m, full, perm, B, false);
    ct_tensor_free(perm);
}

/* slice (B,T/tp,C) = this rank's positions of the tp-group sum of full (B,T,C). */
void ct_model_seq_reduce_scatter(ct_model *m, ct_tensor *slice, const ct_tensor *full) {
    int64_t B = slice->shape[0], n = full->numel;
    if (B == 1) {
        ct_comm_reduce_scatter(m->layout.tp, full->data, slice->data, n, slice->dtype,
                               CT_REDUCE_SUM);
        return;
    }
    ct_tensor *perm = ct_tensor_view_1d(m->sp_perm, 0, n);
    seq_permute(m, perm, full, B, true);
    ct_comm_reduce_scatter(m->layout.tp, perm->data, slice->data, n, slice->dtype, CT_REDUCE_SUM);
    ct_tensor_free(perm);
}

/* The sequence-parallel workspaces for microbatches of B sequences (grown, never shrunk). */
ct_status ct_model_sp_reserve(ct_model *m, int64_t B) {
    if (m->layout.sequence_parallel && B > m->sp_capacity_B) {
        ct_tensor_free(m->sp_local), ct_tensor_free(m->sp_full), ct_tensor_free(m->sp_perm);
        m->sp_local = ct_tensor_new_1d(m->be, m->dtype, B * m->Tl * m->C, CT_MEM_WORKSPACE);
        m->sp_full = ct_tensor_new_1d(m->be, m->dtype, B * m->T * m->C, CT_MEM_WORKSPACE);
        m->sp_perm = ct_tensor_new_1d(m->be, m->dtype, B * m->T * m->C, CT_MEM_WORKSPACE);
        m->sp_capacity_B = B;
        if (!m->sp_local || !m->sp_full || !m->sp_perm) return CT_ERR_RUNTIME;
    }
    return CT_OK;
}

/* ---- the boundaries of the tensor-parallel blocks ------------------------------------------- */

/* The "copy" entering a column-parallel block: the norm of the residual slice, gathered to
 * the full sequence under sequence parallelism (else the norm output is already full). */
/* LayerNorm with bias b, or Llama's RMSNorm (b NULL; mean unused); x += residual first when
 * residual is not NULL, in the same pass. */
static void norm_fwd(ct_model *m, ct_tensor *out, ct_tensor *mean, ct_tensor *rstd, ct_tensor *x,
                     const ct_tensor *residual, const ct_param *w, const ct_param *b) {
    if (b)
        ct_layernorm_add_fwd(out, mean, rstd, x, residual, w->value, b->value);
    else
        ct_rmsnorm_add_fwd(out, rstd, x, residual, w->value, (float)m->mc.norm_eps);
}

void ct_model_norm_for_columns(ct_model *m, ct_tensor *out_full, ct_tensor *mean, ct_tensor *rstd,
                               ct_tensor *x, const ct_tensor *residual, const ct_param *w,
                               const ct_param *b) {
    if (!m->layout.sequence_parallel) {
        norm_fwd(m, out_full, mean, rstd, x, residual, w, b);
        return;
    }
    ct_tensor *local = ct_model_sp_view(m->sp_local, x->shape[0], m->Tl, m->C);
    norm_fwd(m, local, mean, rstd, x, residual, w, b);
    seq_gather(m, out_full, local);
    ct_tensor_free(local);
}

/* The "reduce" leaving a row-parallel block: out (B,Tl,C) = Σ_tp x·Wᵀ + bias (added once, after
 * the reduction; with tp = 1 in the GEMM's epilogue where the backend has one), then the residual
 * connection around the block, out += residual, when residual is not NULL (else the caller adds
 * it in the norm that reads out next). The product is rounded to out's dtype before the residual
 * is added, in every layout: a bf16 GEMM into a bf16 output at the library's rate, rather than an
 * accumulating one (which the CUDA backend must round once through an fp32 product). */
void ct_model_row_parallel_out(ct_model *m, ct_tensor *out, const ct_tensor *x, const ct_param *w,
                               const ct_param *b, const ct_tensor *residual) {
    if (m->layout.tp_size == 1) {
        if (b)
            ct_gemm_bias(out, x, w->value, b->value);
        else
            ct_gemm(out, x, w->value, false, true, 1.0f, 0.0f);
    } else {
        if (!m->layout.sequence_parallel) {
            ct_gemm(out, x, w->value, false, true, 1.0f, 0.0f);
            ct_model_tp_allreduce(m, out, CT_REDUCE_SUM);
        } else {
            ct_tensor *full = ct_model_sp_view(m->sp_full, out->shape[0], m->T, m->C);
            ct_gemm(full, x, w->value, false, true, 1.0f, 0.0f);
            ct_model_seq_reduce_scatter(m, out, full);
            ct_tensor_free(full);
        }
        if (b) ct_bias_add(out, b->value);
    }
    if (residual) ct_axpy(out, residual, 1.0f);
}

/* ∂L/∂(residual) over the full sequence: s->dres itself, or gathered under sequence
 * parallelism (the conjugate of the forward reduce-scatter). */
ct_tensor *ct_model_dres_full(ct_model *m, ct_grad_scratch *s) {
    if (!m->layout.sequence_parallel) return s->dres;
    seq_gather(m, s->dfull, s->dres);
    return s->dfull;
}

/* The conjugate of the column-parallel "copy": s->dln (full, partial over tp) summed over the
 * group — in place, or reduce-scattered to this rank's positions. Returns the norm's dout. */
ct_tensor *ct_model_dln_reduced(ct_model *m, ct_grad_scratch *s) {
    if (!m->layout.sequence_parallel) {
        ct_model_tp_allreduce(m, s->dln, CT_REDUCE_SUM);
        return s->dln;
    }
    ct_model_seq_reduce_scatter(m, s->dln_local, s->dln);
    return s->dln_local;
}
