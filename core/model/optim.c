/* optim.c — AdamW on unit ranges, LR schedule, clipping. See optim.h. */
#include "optim.h"

#include <math.h>
#include <stdlib.h>

ct_state_bytes ct_state_bytes_of(ct_dtype param_dtype, ct_dtype reduce_dtype) {
    CT_ASSERT(param_dtype == CT_DTYPE_F32 || param_dtype == CT_DTYPE_BF16);
    CT_ASSERT(reduce_dtype == CT_DTYPE_F32 || reduce_dtype == CT_DTYPE_BF16);
    return (ct_state_bytes){
        .params = ct_dtype_size(param_dtype),
        .grads = sizeof(float),
        .master = param_dtype == CT_DTYPE_F32 ? 0 : sizeof(float),
        .optim = 2 * sizeof(float),
        .reduce = ct_dtype_size(reduce_dtype),
    };
}

ct_status ct_optim_new(ct_optimizer **out, ct_model *model, const ct_train_config *tc,
                       const int64_t *lo, const int64_t *n) {
    ct_optimizer *opt = ct_xcalloc(1, sizeof *opt);
    opt->model = model;
    opt->tc = *tc;
    opt->units = ct_xcalloc((size_t)model->n_units, sizeof *opt->units);
    for (int u = 0; u < model->n_units; u++) {
        const ct_unit *unit = &model->units[u];
        ct_optim_unit *ou = &opt->units[u];
        ou->lo = lo ? lo[u] : 0;
        ou->n = n ? n[u] : unit->padded_numel;
        ou->m = ct_tensor_new_1d(model->be, CT_DTYPE_F32, ou->n, CT_MEM_OPTIM);
        ou->v = ou->m ? ct_tensor_new_1d(model->be, CT_DTYPE_F32, ou->n, CT_MEM_OPTIM) : NULL;
        if (!ou->m || !ou->v) {
            ct_optim_free(opt);
            return CT_ERR_RUNTIME;
        }
        ct_tensor_zero(ou->m);
        ct_tensor_zero(ou->v);
        /* Each parameter's real elements, clipped to the range. */
        ou->segments = ct_xcalloc((size_t)CT_MAX(1, unit->n_params), sizeof(ct_adamw_segment));
        for (int i = 0; i < unit->n_params; i++) {
            const ct_param *p = &model->params[unit->first_param + i];
            int64_t start = CT_MAX(p->offset, ou->lo);
            int64_t end = CT_MIN(p->offset + p->valid_rows * p->local_shape[1], ou->lo + ou->n);
            if (end <= start) continue;
            ou->segments[ou->n_segments++] = (ct_adamw_segment){
                .offset = start - ou->lo,
                .count = end - start,
                .weight_decay = p->decay ? (float)tc->weight_decay : 0.0f,
            };
        }
    }
    if (model->dtype != CT_DTYPE_F32) {
        int64_t total = 0;
        for (int u = 0; u < model->n_units; u++) total += opt->units[u].n;
        opt->master_slab =
            ct_tensor_new_1d(model->be, CT_DTYPE_F32, CT_MAX(1, total), CT_MEM_MASTER);
        if (!opt->master_slab) {
            ct_optim_free(opt);
            return CT_ERR_RUNTIME;
        }
        int64_t at = 0;
        for (int u = 0; u < model->n_units; u++) {
            ct_optim_unit *ou = &opt->units[u];
            ou->master = ct_tensor_view_1d(opt->master_slab, at, ou->n);
            at += ou->n;
            float *host = ct_xmalloc((size_t)CT_MAX(1, ou->n) * sizeof(float));
            ct_model_init_range_host(model, u, ou->lo, ou->n, host);
            ct_tensor_from_host(ou->master, host);
            free(host);
        }
    }
    opt->norm_partials =
        ct_tensor_new_1d(model->be, CT_DTYPE_F32, CT_MAX(1, model->n_params), CT_MEM_WORKSPACE);
    if (!opt->norm_partials) {
        ct_optim_free(opt);
        return CT_ERR_RUNTIME;
    }
    *out = opt;
    return CT_OK;
}

void ct_optim_free(ct_optimizer *opt) {
    if (!opt) return;
    for (int u = 0; opt->units && u < opt->model->n_units; u++) {
        ct_tensor_free(opt->units[u].m);
        ct_tensor_free(opt->units[u].v);
        ct_tensor_free(opt->units[u].master);
        free(opt->units[u].segments);
    }
    free(opt->units);
    ct_tensor_free(opt->master_slab);
    ct_tensor_free(opt->norm_partials);
    free(opt);
}

double ct_optim_lr(const ct_train_config *tc, int64_t step) {
    if (step < tc->warmup_steps) return tc->lr * (double)(step + 1) / (double)tc->warmup_steps;
    int64_t decay_steps = tc->steps - tc->warmup_steps;
    if (decay_steps <= 1) return tc->lr;
    double progress = (double)(step - tc->warmup_steps) / (double)(decay_steps - 1);
    if (progress > 1.0) progress = 1.0;
    return tc->min_lr + 0.5 * (tc->lr - tc->min_lr) * (1.0 + cos(M_PI * progress));
}

double ct_optim_grad_sumsq(ct_optimizer *opt, ct_tensor *const *grads) {
    ct_model *m = opt->model;
    bool first_tp_rank = m->layout.tp_rank == 0;
    /* every counted range, in parameter order, then one multi-tensor sumsq over them all */
    ct_tensor **parts = ct_xcalloc((size_t)CT_MAX(m->n_params, 1), sizeof *parts);
    ct_tensor **ranges = ct_xcalloc((size_t)CT_MAX(m->n_units, 1), sizeof *ranges);
    int n_parts = 0;
    for (int u = 0; u < m->n_units; u++) {
        const ct_unit *unit = &m->units[u];
        const ct_optim_unit *ou = &opt->units[u];
        if (grads && !grads[u]) continue; /* left out */
        ct_tensor *range = grads ? grads[u] : ct_tensor_view_1d(unit->grads, ou->lo, ou->n);
        if (!grads) ranges[u] = range;
        for (int i = 0; i < unit->n_params; i++) {
            int k = unit->first_param + i;
            const ct_param *p = &m->params[k];
            if (p->tied_to) continue;                            /* counted on its owner */
            if (p->tp_split_dim < 0 && !first_tp_rank) continue; /* replicated over tp */
            int64_t start = CT_MAX(p->offset, ou->lo);
            int64_t end = CT_MIN(p->offset + p->valid_rows * p->local_shape[1], ou->lo + ou->n);
            if (end <= start) continue;
            parts[n_parts++] = ct_tensor_view_1d(range, start - ou->lo, end - start);
        }
    }
    ct_sumsq(opt->norm_partials, 0, parts, n_parts);
    /* The partials are a handful of floats: sum them on the host in double, in order. */
    float *partials = ct_xmalloc((size_t)CT_MAX(n_parts, 1) * sizeof(float));
    if (n_parts) {
        ct_tensor *head = ct_tensor_view_1d(opt->norm_partials, 0, n_parts);
        ct_tensor_to_host(partials, head);
        ct_tensor_free(head);
    }
    double sum = 0.0;
    for (int i = 0; i < n_parts; i++) sum += partials[i];
    for (int i = 0; i < n_parts; i++) ct_tensor_free(parts[i]);
    for (int u = 0; u < m->n_units; u++) ct_tensor_free(ranges[u]);
    free(partials);
    free(parts);
    free(ranges);
    return sum;
}

float ct_optim_clip_scale(const ct_train_config *tc, double grad_norm) {
    if (tc->grad_clip <= 0.0 || !(grad_norm > tc->grad_clip)) return 1.0f;
    return (float)(tc->grad_clip / grad_norm);
}

void ct_optim_begin_step(ct_optimizer *opt) {
    opt->step++;
}

void ct_optim_update_unit(ct_optimizer *opt, int u, ct_tensor *params, const ct_tensor *grads,
                          float lr, float grad_scale) {
    ct_optim_unit *ou = &opt->units[u];
    CT_ASSERT(params->numel == ou->n && grads->numel == ou->n);
    ct_adamw_hparams hp = {
        .lr = lr,
        .beta1 = (float)opt->tc.beta1,
        .beta2 = (float)opt->tc.beta2,
        .eps = (float)opt->tc.eps,
        .step = opt->step,
        .grad_scale = grad_scale,
    };
    if (ou->master)
        ct_adamw(ou->master, grads, ou->m, ou->v, ou->segments, ou->n_segments, &hp, params);
    else
        ct_adamw(params, grads, ou->m, ou->v, ou->segments, ou->n_segments, &hp, NULL);
}

void ct_optim_step(ct_optimizer *opt, float lr, float grad_scale) {
    ct_model *m = opt->model;
    ct_optim_begin_step(opt);
    for (int u = 0; u < m->n_units; u++) {
        ct_optim_unit *ou = &opt->units[u];
        ct_tensor *p = ct_tensor_view_1d(m->units[u].params, ou->lo, ou->n);
        ct_tensor *g = ct_tensor_view_1d(m->units[u].grads, ou->lo, ou->n);
        ct_optim_update_unit(opt, u, p, g, lr, grad_scale);
        ct_tensor_free(p);
        ct_tensor_free(g);
    }
}
