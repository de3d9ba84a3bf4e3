/*
 * test_optim.c — the learning-rate schedule, the clip factor and the optimizer's segments
 * against hand-computed values (AdamW's arithmetic itself is checked in test_ops).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/backend/backend.h"
#include "core/model/model.h"
#include "core/model/optim.h"
#include "test_util.h"

/* Exact to a few ulps: the schedule is a handful of double operations. */
#define assert_close(a, b) assert_true(fabs((a) - (b)) <= 1e-15 + 1e-12 * fabs(b))

static ct_train_config schedule_config(void) {
    ct_config cfg;
    ct_config_defaults(&cfg);
    cfg.train.lr = 1e-3;
    cfg.train.min_lr = 1e-4;
    cfg.train.warmup_steps = 10;
    cfg.train.steps = 100;
    return cfg.train;
}

static void test_lr_warmup(void **state) {
    ct_train_config tc = schedule_config();
    /* Linear from lr/warmup at step 0 to lr at the last warmup step. */
    assert_close(ct_optim_lr(&tc, 0), 1e-4);
    assert_close(ct_optim_lr(&tc, 4), 5e-4);
    assert_close(ct_optim_lr(&tc, 9), 1e-3);
}

static void test_lr_cosine(void **state) {
    ct_train_config tc = schedule_config();
    /* Cosine over the 90 steps after warmup: progress (s − 10) / 89 runs 0 → 1. */
    assert_close(ct_optim_lr(&tc, 10), 1e-3);
    assert_close(ct_optim_lr(&tc, 99), 1e-4);
    /* s = 40: 1e-4 + 0.5·9e-4·(1 + cos(π·30/89)), computed by hand (python) */
    assert_close(ct_optim_lr(&tc, 40), 0.0007703990830928028);
    for (int s = 10; s < 99; s++) assert_true(ct_optim_lr(&tc, s + 1) <= ct_optim_lr(&tc, s));
    /* Past the end it stays at min_lr. */
    assert_close(ct_optim_lr(&tc, 150), 1e-4);
}

static void test_lr_no_warmup(void **state) {
    ct_train_config tc = schedule_config();
    tc.warmup_steps = 0;
    assert_close(ct_optim_lr(&tc, 0), 1e-3);
    assert_close(ct_optim_lr(&tc, 99), 1e-4);
}

static void test_clip_scale(void **state) {
    ct_train_config tc = schedule_config();
    tc.grad_clip = 1.0;
    assert_true(ct_optim_clip_scale(&tc, 0.5) == 1.0f);
    assert_true(ct_optim_clip_scale(&tc, 1.0) == 1.0f);
    assert_true(ct_optim_clip_scale(&tc, 4.0) == 0.25f);
    tc.grad_clip = 0.0; /* off */
    assert_true(ct_optim_clip_scale(&tc, 100.0) == 1.0f);
}

/*
 * Segments: every parameter's real elements once, with decay only on ≥ 2-D tensors, and the
 * embedding's padding rows left out; a shard range clips them. The gradient norm over all
 * ranges equals the norm computed by hand from the gradient bytes.
 */
static void test_segments_and_norm(void **state) {
    ct_config cfg;
    test_tiny_config(&cfg, NULL);
    cfg.train.weight_decay = 0.1;
    assert_int_equal(ct_config_validate(&cfg, 1), CT_OK);
    ct_backend *be = test_backend_new(1);
    ct_model_layout layout = ct_model_layout_single(&cfg);
    ct_model *m;
    assert_int_equal(ct_model_new(&m, &cfg, be, &layout), CT_OK);
    ct_optimizer *opt;
    assert_int_equal(ct_optim_new(&opt, m, &cfg.train, NULL, NULL), CT_OK);
    int64_t covered = 0;
    for (int u = 0; u < m->n_units; u++) {
        const ct_optim_unit *ou = &opt->units[u];
        assert_int_equal(ou->n_segments, m->units[u].n_params);
        for (int i = 0; i < ou->n_segments; i++) {
            const ct_param *p = &m->params[m->units[u].first_param + i];
            assert_int_equal(ou->segments[i].offset, p->offset);
            assert_int_equal(ou->segments[i].count, p->valid_rows * p->local_shape[1]);
            assert_true(ou->segments[i].weight_decay == (p->ndim >= 2 ? 0.1f : 0.0f));
            covered += ou->segments[i].count;
        }
    }
    /* 5 padding rows of the embedding are the only parameters left out. */
    assert_int_equal(covered, cfg.derived.n_params - 5 * cfg.model.d_model);

    /* Fill the gradients with a known pattern and compare the norm with a host sum. */
    float *g = ct_xmalloc((size_t)m->slab_numel * sizeof(float));
    for (int64_t i = 0; i < m->slab_numel; i++) g[i] = (float)((i % 7) - 3) * 0.125f;
    ct_tensor_from_host(m->grad_slab, g);
    double want = 0.0;
    for (int i = 0; i < m->n_params; i++) {
        const ct_param *p = &m->params[i];
        int64_t base = m->units[p->unit].slab_offset + p->offset;
        for (int64_t e = 0; e < p->valid_rows * p->local_shape[1]; e++)
            want += (double)g[base + e] * g[base + e];
    }
    assert_true(fabs(ct_optim_grad_sumsq(opt, NULL) - want) <= 1e-9 * want);
    free(g);

    /* A shard range: the second half of each unit. */
    int64_t *lo = ct_xcalloc((size_t)m->n_units, sizeof(int64_t));
    int64_t *n = ct_xcalloc((size_t)m->n_units, sizeof(int64_t));
    for (int u = 0; u < m->n_units; u++) {
        n[u] = m->units[u].padded_numel / 2;
        lo[u] = m->units[u].padded_numel - n[u];
    }
    ct_optimizer *half;
    assert_int_equal(ct_optim_new(&half, m, &cfg.train, lo, n), CT_OK);
    for (int u = 0; u < m->n_units; u++) {
        const ct_optim_unit *ou = &half->units[u];
        for (int i = 0; i < ou->n_segments; i++) {
            assert_true(ou->segments[i].offset >= 0);
            assert_true(ou->segments[i].offset + ou->segments[i].count <= n[u]);
        }
    }
    free(lo);
    free(n);
    ct_optim_free(half);
    ct_optim_free(opt);
    ct_model_free(m);
    ct_backend_free(be);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lr_warmup),         cmocka_unit_test(test_lr_cosine),
        cmocka_unit_test(test_lr_no_warmup),      cmocka_unit_test(test_clip_scale),
        cmocka_unit_test(test_segments_and_norm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
