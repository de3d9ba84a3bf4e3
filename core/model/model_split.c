/*
 * model_split.c — the backward in two parts for the zero-bubble pipeline schedules (model.h,
 * ct_model_backward_input and ct_model_backward_weight). While a chunk's input part runs, the
 * weight GEMMs of its linear layers are recorded instead of run (ct_model_weight_grad), each with
 * a copy of its output gradient and, where the activations will not keep it, of its input; so are
 * the brackets of the units the part opens and closes. The weight part replays the record: the
 * same GEMMs on the same bytes, in the same order, between the same brackets — now with the pass
 * that tells the data-parallel layer a unit's gradients are complete and its parameters unread — so
 * the gradients are the whole backward's, bit for bit, only computed later.
 */
#include "model_layer.h"

#include <stdlib.h>

typedef enum item_kind { ITEM_BEGIN, ITEM_END, ITEM_GEMM } item_kind;

typedef struct wgrad_item {
    item_kind kind;
    int unit;                  /* BEGIN, END */
    int n;                     /* GEMM: n products */
    bool grouped;              /* as one grouped GEMM (the experts'), else n = 1 and ct_gemm */
    ct_tensor **dw, **dy, **x; /* [n], views the item owns */
} wgrad_item;

struct ct_wgrad_store {
    wgrad_item *items;
    int n_items, cap_items;
    /* the copies' memory, taken in recording order and kept for the next step's same record */
    ct_tensor **bufs;
    int n_bufs, next_buf;
    size_t bytes; /* held in bufs (activation memory) */
};

static wgrad_item *push(ct_wgrad_store *st, item_kind kind) {
    if (st->n_items == st->cap_items) {
        st->cap_items = st->cap_items ? 2 * st->cap_items : 64;
        st->items = realloc(st->items, (size_t)st->cap_items * sizeof *st->items);
        CT_ASSERT(st->items != NULL);
    }
    wgrad_item *it = &st->items[st->n_items++];
    *it = (wgrad_item){.kind = kind, .unit = -1};
    return it;
}

/* A copy of t in the store's next buffer (grown when this record outgrew it). Out of memory
 * mid-step cannot be agreed on with the other ranks: it ends the run, naming the size. */
static ct_tensor *copy_of(ct_model *m, ct_wgrad_store *st, const ct_tensor *t) {
    if (st->next_buf == st->n_bufs) {
        st->bufs = realloc(st->bufs, (size_t)(st->n_bufs + 1) * sizeof *st->bufs);
        CT_ASSERT(st->bufs != NULL);
        st->bufs[st->n_bufs++] = NULL;
    }
    ct_tensor **buf = &st->bufs[st->next_buf++];
    if (*buf && ((*buf)->dtype != t->dtype || (*buf)->numel < t->numel)) {
        st->bytes -= ct_tensor_bytes(*buf);
        ct_tensor_free(*buf);
        *buf = NULL;
    }
    if (!*buf) {
        *buf = ct_tensor_new_1d(m->be, t->dtype, t->numel, CT_MEM_ACTS);
        CT_ASSERTF(*buf, "out of memory for a %lld-element copy the weight gradients wait on",
                   (long long)t->numel);
        st->bytes += ct_tensor_bytes(*buf);
    }
    ct_tensor *v = ct_tensor_view(*buf, 0, t->ndim, t->shape);
    ct_tensor_copy(v, t);
    return v;
}

static void weight_grads(ct_model *m, int n, bool grouped, ct_tensor *const *dw,
                         const ct_tensor *const *dy, const ct_tensor *const *x, bool x_kept) {
    ct_wgrad_store *st = m->wstore;
    if (!st) {
        if (grouped)
            ct_gemm_grouped(n, dw, dy, x, true, false, 1.0f, 1.0f);
        else
            ct_gemm(dw[0], dy[0], x[0], true, false, 1.0f, 1.0f);
        return;
    }
    /* under recompute the layer's activations are the shared workspace, rebuilt by the next
     * layer's backward: copy x too */
    x_kept = x_kept && !m->layout.recompute;
    wgrad_item *it = push(st, ITEM_GEMM);
    it->n = n;
    it->grouped = grouped;
    it->dw = ct_xcalloc((size_t)n, sizeof *it->dw);
    it->dy = ct_xcalloc((size_t)n, sizeof *it->dy);
    it->x = ct_xcalloc((size_t)n, sizeof *it->x);
    for (int i = 0; i < n; i++) {
        it->dw[i] = ct_tensor_view(dw[i], 0, dw[i]->ndim, dw[i]->shape);
        it->dy[i] = copy_of(m, st, dy[i]);
        it->x[i] = x_kept ? ct_tensor_view(x[i], 0, x[i]->ndim, x[i]->shape) : copy_of(m, st, x[i]);
    }
}

void ct_model_weight_grad(ct_model *m, ct_tensor *dw, const ct_tensor *dy, const ct_tensor *x,
                          bool x_kept) {
    weight_grads(m, 1, false, &dw, &dy, &x, x_kept);
}

void ct_model_weight_grads_grouped(ct_model *m, int n, ct_tensor *const *dw,
                                   const ct_tensor *const *dy, const ct_tensor *const *x,
                                   bool x_kept) {
    weight_grads(m, n, true, dw, dy, x, x_kept);
}

void ct_wgrad_bracket(ct_wgrad_store *st, int unit, bool begin) {
    push(st, begin ? ITEM_BEGIN : ITEM_END)->unit = unit;
}

ct_wgrad_store *ct_wgrad_store_new(void) {
    return ct_xcalloc(1, sizeof(ct_wgrad_store));
}

static void clear_items(ct_wgrad_store *st) {
    for (int i = 0; i < st->n_items; i++) {
        wgrad_item *it = &st->items[i];
        for (int j = 0; j < it->n; j++) {
            ct_tensor_free(it->dw[j]);
            ct_tensor_free(it->dy[j]);
            ct_tensor_free(it->x[j]);
        }
        free(it->dw), free(it->dy), free(it->x);
    }
    st->n_items = 0;
    st->next_buf = 0;
}

bool ct_wgrad_store_empty(const ct_wgrad_store *st) {
    return !st || st->n_items == 0;
}

void ct_wgrad_replay(ct_model *m, ct_wgrad_store *st) {
    CT_ASSERTF(!m->wstore, "a weight part runs while an input part records");
    for (int i = 0; i < st->n_items; i++) {
        wgrad_item *it = &st->items[i];
        switch (it->kind) {
        case ITEM_BEGIN: ct_model_unit_begin(m, it->unit, CT_PASS_BACKWARD_WEIGHT); break;
        case ITEM_END: ct_model_unit_end(m, it->unit, CT_PASS_BACKWARD_WEIGHT); break;
        case ITEM_GEMM:
            weight_grads(m, it->n, it->grouped, it->dw, (const ct_tensor *const *)it->dy,
                         (const ct_tensor *const *)it->x, true);
            ct_model_poll(m);
            break;
        }
    }
    clear_items(st);
}

size_t ct_wgrad_store_bytes(const ct_wgrad_store *st) {
    return st ? st->bytes : 0;
}

/* What one microbatch's record holds on this rank (model.h): per layer, each linear layer's
 * output gradient and, under recompute (or for the experts, always), its input. Every GEMM of a
 * layer sees B·T rows (T: positions per rank in the attention and MLP GEMMs, gathered under
 * sequence parallelism), the routed experts B·T·top_k rows between them. */
size_t ct_model_wgrad_stash_bytes(const ct_model *m, int64_t B) {
    const int64_t tp = m->layout.tp_size, C = m->C, rows = B * m->T;
    const int64_t qkv = (m->NH + 2 * m->NKV) * m->hd / tp, att = m->NH * m->hd / tp;
    const int hidden = m->arch->act.hidden;
    const bool rc = m->layout.recompute;
    int64_t elems = 0;
    for (int64_t l = 0; l < m->L; l++) {
        if (m->layer_unit[l] < 0) continue; /* not on this rank */
        /* attention: qkv (out qkv, in C) and its output projection (out C, in att) */
        elems += rows * (qkv + C) + (rc ? rows * (C + att) : 0);
        if (!ct_moe_layer(&m->mc, l)) { /* the dense MLP: up (hidden·F/tp, C), down (C, F/tp) */
            const int64_t F = m->F / tp;
            elems += rows * (hidden * F + C) + (rc ? rows * (C + F) : 0);
            continue;
        }
        /* experts, their inputs copied whatever the recompute: routed (B·T·top_k rows in all)
         * and shared (B·T rows, moe_shared widths) */
        const int64_t Fe = (m->mc.moe_d_ff ? m->mc.moe_d_ff : m->F) / tp;
        const int64_t per_row = hidden * Fe + C + C + Fe;
        elems += rows * m->mc.moe_top_k * per_row;
        if (m->mc.moe_shared) {
            const int64_t S = m->mc.moe_shared * Fe;
            elems += rows * (hidden * S + C + C + S);
        }
    }
    return (size_t)elems * ct_dtype_size(m->dtype);
}

void ct_wgrad_store_free(ct_wgrad_store *st) {
    if (!st) return;
    clear_items(st);
    for (int i = 0; i < st->n_bufs; i++) ct_tensor_free(st->bufs[i]);
    free(st->bufs);
    free(st->items);
    free(st);
}
