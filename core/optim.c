/* optim.c — AdamW on unit ranges, LR schedule, clipping. See optim.h. */
#include "optim.h"

#include <math.h>
#include <stdlib.h>

ct_status ct_optim_new(ct_optimizer **out, ct_model *model, const ct_train_config *tc) {
    ct_optimizer *opt = ct_xcalloc(1, sizeof *opt);
    opt->model = model;
    opt->tc = *tc;
    opt->m_slab = ct_tensor_new_1d(model->be, CT_DTYPE_F32, model->slab_numel, CT_MEM_OPTIM);
    opt->v_slab = opt->m_slab ? ct_tensor_new_1d(model->be, CT_DTYPE_F32, model->slab_numel,
                                                 CT_MEM_OPTIM)
                              : NULL;
    opt->norm_partials = ct_tensor_new_1d(model->be, CT_DTYPE_F32, CT_MAX(1, model->n_params),
                                          CT_MEM_WORKSPACE);
    if (!opt->m_slab || !opt->v_slab || !opt->norm_partials) {
        ct_optim_free(opt);
        return CT_ERR_RUNTIME;
    }
    ct_tensor_zero(opt->m_slab);
    ct_tensor_zero(opt->v_slab);

    int nu = model->n_units;
    opt->unit_m = ct_xcalloc((size_t)nu, sizeof *opt->unit_m);
    opt->unit_v = ct_xcalloc((size_t)nu, sizeof *opt->unit_v);
    opt->segments = ct_xcalloc((size_t)nu, sizeof *opt->segments);
    opt->n_segments = ct_xcalloc((size_t)nu, sizeof *opt->n_segments);
    for (int u = 0; u < nu; u++) {
        ct_unit *unit = &model->units[u];
        opt->unit_m[u] = ct_tensor_view_1d(opt->m_slab, unit->slab_offset, unit->padded_numel);
        opt->unit_v[u] = ct_tensor_view_1d(opt->v_slab, unit->slab_offset, unit->padded_numel);
        opt->segments[u] = ct_xcalloc((size_t)CT_MAX(1, unit->n_params), sizeof(ct_adamw_segment));
        for (int i = 0; i < unit->n_params; i++) {
            const ct_param *p = &model->params[unit->first_param + i];
            int64_t count = p->valid_rows * p->local_shape[1];
            if (count == 0) continue;
            opt->segments[u][opt->n_segments[u]++] = (ct_adamw_segment){
                .offset = p->offset,
                .count = count,
                .weight_decay = p->decay ? (float)tc->weight_decay : 0.0f,
            };
        }
    }
    *out = opt;
    return CT_OK;
}

void ct_optim_free(ct_optimizer *opt) {
    if (!opt) return;
    if (opt->model) {
        for (int u = 0; u < opt->model->n_units; u++) {
            if (opt->unit_m) ct_tensor_free(opt->unit_m[u]);
            if (opt->unit_v) ct_tensor_free(opt->unit_v[u]);
            if (opt->segments) free(opt->segments[u]);
        }
    }
    free(opt->unit_m);
    free(opt->unit_v);
    free(opt->segments);
    free(opt->n_segments);
    ct_tensor_free(opt->m_slab);
    ct_tensor_free(opt->v_slab);
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

double ct_optim_grad_sumsq_local(ct_optimizer *opt) {
    ct_model *m = opt->model;
    bool first_tp_rank = m->layout.tp_rank == 0;
    for (int i = 0; i < m->n_params; i++) {
        const ct_param *p = &m->params[i];
        ct_tensor *valid = ct_tensor_view_1d(p->grad, 0, p->valid_rows * p->local_shape[1]);
        ct_sumsq(opt->norm_partials, i, valid);
        ct_tensor_free(valid);
    }
    float *partials = ct_xmalloc((size_t)m->n_params * sizeof(float));
    ct_tensor_to_host(partials, opt->norm_partials);
    double sum = 0.0;
    for (int i = 0; i < m->n_params; i++) {
        const ct_param *p = &m->params[i];
        if (p->tied_to) continue;                          /* counted on its owner */
        if (p->tp_split_dim < 0 && !first_tp_rank) continue; /* replicated over tp */
        sum += partials[i];
    }
    free(partials);
    return sum;
}

float ct_optim_clip_scale(const ct_train_config *tc, double grad_norm) {
    if (tc->grad_clip <= 0.0 || !(grad_norm > tc->grad_clip)) return 1.0f;
    return (float)(tc->grad_clip / grad_norm);
}

void ct_optim_step(ct_optimizer *opt, float lr, float grad_scale) {
    ct_model *m = opt->model;
    opt->step++;
    ct_adamw_hparams hp = {
        .lr = lr,
        .beta1 = (float)opt->tc.beta1,
        .beta2 = (float)opt->tc.beta2,
        .eps = (float)opt->tc.eps,
        .step = opt->step,
        .grad_scale = grad_scale,
    };
    for (int u = 0; u < m->n_units; u++)
        ct_adamw(m->units[u].params, m->units[u].grads, opt->unit_m[u], opt->unit_v[u],
                 opt->segments[u], opt->n_segments[u], &hp);
}
