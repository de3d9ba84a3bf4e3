/*
 * test_model.c — the whole model against finite differences, the registry, layout-independent
 * initialisation, overfitting one batch, microbatch equivalence and thread determinism.
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
#include "core/rng.h"
#include "cmd/generate/sampler.h"
#include "cmd/train/trainer.h"
#include "parallel/context.h"
#include "test_util.h"

static void validated_config(ct_config *cfg) {
    assert_int_equal(ct_config_validate(cfg, 1), CT_OK);
}

static void random_batch(int32_t *tokens, int32_t *targets, int64_t n, int64_t V, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        tokens[i] = (int32_t)(ct_rng_u64(seed, 1, (uint64_t)i) % (uint64_t)V);
        targets[i] = (int32_t)(ct_rng_u64(seed, 2, (uint64_t)i) % (uint64_t)V);
    }
}

/* ---- registry ----------------------------------------------------------------------------------
 */

static void test_registry(void **state) {
    ct_config cfg;
    test_tiny_config(&cfg, NULL);
    validated_config(&cfg);
    ct_backend *be = test_backend_new(1);
    ct_model_layout layout = ct_model_layout_single(&cfg);
    ct_model *m;
    assert_int_equal(ct_model_new(&m, &cfg, be, &layout), CT_OK);
    /* One unit per layer, plus embeddings and head. */
    assert_int_equal(m->n_units, cfg.model.n_layer + 2);
    int64_t total = 0;
    for (int i = 0; i < m->n_params; i++) {
        const ct_param *p = &m->params[i];
        total += p->numel;
        assert_int_equal(p->decay, p->ndim >= 2);
        assert_true(p->offset + p->numel <= m->units[p->unit].numel);
    }
    /* The registry's parameter count is the config's formula (tied embedding counted once). */
    assert_int_equal(total, cfg.derived.n_params);
    for (int u = 0; u < m->n_units; u++) {
        assert_int_equal(m->units[u].padded_numel % 16, 0);
        assert_true(m->units[u].padded_numel >= m->units[u].numel);
    }
    assert_int_equal(m->wte->valid_rows, 123);
    assert_int_equal(m->wte->local_shape[0], 128);
    ct_model_free(m);
    ct_backend_free(be);
}

/* ---- initialisation ----------------------------------------------------------------------------
 */

static float *param_to_host(const ct_param *p) {
    float *h = ct_xmalloc((size_t)p->numel * sizeof(float));
    ct_tensor_to_host(h, p->value);
    return h;
}

/* A tensor-parallel shard initialises exactly its slice of the single-process tensor. */
static void test_init_layout_independent(void **state) {
    ct_config cfg;
    test_tiny_config(&cfg, NULL);
    validated_config(&cfg);
    ct_backend *be = test_backend_new(1);
    ct_model_layout single = ct_model_layout_single(&cfg);
    ct_model *full;
    assert_int_equal(ct_model_new(&full, &cfg, be, &single), CT_OK);
    const char *names[] = {"wte",
                           "layers.1.attn.wq",
                           "layers.0.attn.wo",
                           "layers.1.mlp.w_up",
                           "layers.0.mlp.w_down",
                           "layers.1.attn.bo"};
    for (int r = 0; r < 2; r++) {
        ct_model_layout layout = single;
        layout.tp_size = 2;
        layout.tp_rank = r;
        ct_model *shard;
        assert_int_equal(ct_model_new(&shard, &cfg, be, &layout), CT_OK);
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
            const ct_param *pf = ct_model_find_param(full, names[k]);
            const ct_param *ps = ct_model_find_param(shard, names[k]);
            assert_non_null(pf);
            assert_non_null(ps);
            float *a = param_to_host(pf), *b = param_to_host(ps);
            int64_t cols_f = pf->local_shape[1], rows_s = ps->local_shape[0],
                    cols_s = ps->local_shape[1];
            for (int64_t i = 0; i < rows_s; i++)
                for (int64_t j = 0; j < cols_s; j++) {
                    int64_t gi = i + (ps->tp_split_dim == 0 ? ps->tp_offset : 0);
                    int64_t gj = j + (ps->tp_split_dim == 1 ? ps->tp_offset : 0);
                    /* bitwise: the same (seed, name, global index) gives the same float */
                    assert_memory_equal(&a[gi * cols_f + gj], &b[i * cols_s + j], sizeof(float));
                }
            free(a);
            free(b);
        }
        ct_model_free(shard);
    }
    /* Padding rows of the embedding are zero; real rows are not. */
    float *wte = param_to_host(full->wte);
    for (int64_t r = 0; r < 128; r++) {
        double s = 0;
        for (int64_t c = 0; c < cfg.model.d_model; c++) s += fabs(wte[r * cfg.model.d_model + c]);
        if (r < 123)
            assert_true(s > 0);
        else
            assert_true(s == 0);
    }
    free(wte);
    ct_model_free(full);
    ct_backend_free(be);
}

/* ---- whole-model gradient check -----------------------------------------------------------------
 */

/* The objective backward differentiates: the mean token loss, plus with MoE layers their
 * balancing losses (a forward with dloss 1/N weighs them 1: one micro-batch). */
static double model_loss(ct_model *m, ct_acts *a) {
    const double N = (double)(a->B * m->T);
    double lm = ct_model_forward_loss(m, a, (float)(1.0 / N)) / N, aux = 0.0;
    if (m->mc.moe_experts) {
        int64_t *counts = ct_xmalloc((size_t)m->mc.moe_experts * sizeof *counts);
        double z;
        ct_model_moe_stats(m, &aux, &z, counts);
        aux += z;
        free(counts);
    }
    return lm + aux;
}

/*
 * For every parameter tensor, the directional derivative along a random direction r (over the
 * tensor's real elements) from central differences, (L(θ+εr) − L(θ−εr)) / 2ε, must match g·r
 * from backward. A direction over the whole tensor gives a signal ~‖g‖ far above fp32 noise:
 * the loss is a mean of fp32 per-token losses (relative rounding ~1e-7 of ~4.8, i.e. ~5e-7),
 * so with ε = 3e-3 the difference quotient carries ≲1e-4 of noise; the O(ε²) truncation term
 * stays below 0.2% (at ε = 1e-2 it reaches 3-4% for the embeddings and the first layer's wo,
 * at 1e-3 the noise starts to show: 3e-3 uses 15% of the tolerance, the best of the three).
 * Directions and the symmetry-breaking noise are keyed by parameter name, so they do not change
 * when the registry's order does. Tolerance: 3e-4 absolute + 2% relative.
 */
static void gradcheck(ct_arch arch, int moe_router) {
    ct_config cfg;
    test_tiny_config(&cfg, NULL);
    cfg.model.arch = arch;
    if (moe_router >= 0) {
        /* every other layer MoE, 4 experts of width 24, 2 a token, the balancing loss weighted
         * high enough that its gradient is a visible part of the router's */
        cfg.model.moe_experts = 4;
        cfg.model.moe_top_k = 2;
        cfg.model.moe_every = 2;
        cfg.model.moe_d_ff = 24;
        cfg.model.moe_router = (ct_moe_router)moe_router;
        cfg.model.moe_aux_alpha = 0.5;
        cfg.model.moe_z_alpha = 0.1; /* the router z-loss in the objective too */
        /* two shared experts beside the routed ones (the sigmoid router's and Llama's runs) */
        cfg.model.moe_shared = moe_router == CT_MOE_SIGMOID || arch == CT_ARCH_LLAMA ? 2 : 0;
    }
    cfg.model.seq_len = 8;
    cfg.model.d_model = 16;
    cfg.model.n_head = 2;
    if (arch == CT_ARCH_LLAMA) cfg.model.n_kv_head = 1, cfg.model.multiple_of = 16;
    cfg.train.micro_batch = 2;
    cfg.train.global_batch = 2;
    validated_config(&cfg);
    ct_backend *be = test_backend_new(1);
    ct_model_layout layout = ct_model_layout_single(&cfg);
    ct_model *m;
    assert_int_equal(ct_model_new(&m, &cfg, be, &layout), CT_OK);
    /* Break the symmetry of ones/zeros inits so LN and bias gradients are generic. */
    for (int i = 0; i < m->n_params; i++) {
        ct_param *p = &m->params[i];
        float *h = param_to_host(p);
        for (int64_t e = 0; e < p->valid_rows * p->local_shape[1]; e++)
            h[e] += 0.1f * (float)ct_rng_normal(7, ct_rng_hash_name(p->name), (uint64_t)e);
        ct_tensor_from_host(p->value, h);
        free(h);
    }
    ct_acts *a;
    ct_grad_scratch *s;
    assert_int_equal(ct_acts_new(&a, m, 2), CT_OK);
    assert_int_equal(ct_grad_scratch_new(&s, m, 2), CT_OK);
    int64_t N = 2 * cfg.model.seq_len;
    int32_t tokens[64], targets[64];
    random_batch(tokens, targets, N, cfg.model.vocab_size, 99);
    ct_acts_set_batch(a, 0, tokens, targets);
    ct_model_zero_grads(m);
    ct_model_forward(m, a, (float)(1.0 / (double)N));
    ct_model_backward(m, a, s);
    if (m->mc.moe_experts) { /* that forward's statistics: not the first difference's */
        int64_t counts[8];
        double aux, z;
        ct_model_moe_stats(m, &aux, &z, counts);
    }
    const uint64_t routing = ct_model_moe_routing_digest(a);

    int failures = 0;
    for (int i = 0; i < m->n_params; i++) {
        ct_param *p = &m->params[i];
        int64_t n = p->valid_rows * p->local_shape[1];
        float *theta = param_to_host(p);
        float *grad = ct_xmalloc((size_t)p->numel * sizeof(float));
        ct_tensor_to_host(grad, p->grad);
        float *pert = ct_xmalloc((size_t)p->numel * sizeof(float));
        double analytic = 0.0;
        for (int64_t e = 0; e < n; e++)
            analytic += grad[e] * ct_rng_normal(11, ct_rng_hash_name(p->name), (uint64_t)e);
        /* MoE: a step that changes some token's experts crosses a discontinuity of the loss;
         * such a step is shortened until the routing stays that of θ (at most three times). */
        double eps = 3e-3, f[2];
        for (int tries = 0;; tries++) {
            bool same_routing = true;
            for (int sgn = 0; sgn < 2; sgn++) {
                memcpy(pert, theta, (size_t)p->numel * sizeof(float));
                for (int64_t e = 0; e < n; e++)
                    pert[e] += (float)((sgn ? -eps : eps) *
                                       ct_rng_normal(11, ct_rng_hash_name(p->name), (uint64_t)e));
                ct_tensor_from_host(p->value, pert);
                f[sgn] = model_loss(m, a);
                same_routing &= ct_model_moe_routing_digest(a) == routing;
            }
            if (same_routing) break;
            assert_true(tries < 3);
            eps /= 4;
        }
        ct_tensor_from_host(p->value, theta);
        double numeric = (f[0] - f[1]) / (2 * eps);
        double err = fabs(numeric - analytic), tol = 3e-4 + 2e-2 * fabs(numeric);
        /* every MoE tensor (router, routed and shared experts) takes part in the loss: a path
         * left out of both passes would otherwise agree at 0 */
        if (strstr(p->name, ".moe.") && !(fabs(numeric) > 1e-6)) {
            printf("gradcheck %-24s does not affect the loss (numeric %+.3e)\n", p->name, numeric);
            failures++;
        }
        if (!(err <= tol)) {
            printf("gradcheck %-24s analytic %+.6e numeric %+.6e err %.2e tol %.2e\n", p->name,
                   analytic, numeric, err, tol);
            failures++;
        }
        /* Padding rows never receive gradient. */
        for (int64_t e = n; e < p->numel; e++) assert_true(grad[e] == 0.0f);
        free(theta);
        free(grad);
        free(pert);
    }
    assert_int_equal(failures, 0);
    ct_grad_scratch_free(s);
    ct_acts_free(a);
    ct_model_free(m);
    ct_backend_free(be);
}

static void test_gradcheck(void **state) {
    gradcheck(CT_ARCH_GPT2, -1);
}

/* GPT-2 with MoE layers (every other layer; the balancing loss in the objective), each router,
 * and a Llama with MoE layers (SwiGLU experts):
 * the same check, the same tolerance. The routing is piecewise constant in the parameters, so
 * the check holds where no token's k-th and (k+1)-th expert keys lie within the perturbation
 * (~1e-3 of a logit) of each other; the seeds here have none. */
static void test_gradcheck_moe(void **state) {
    gradcheck(CT_ARCH_GPT2, CT_MOE_TOPK_SOFTMAX);
    gradcheck(CT_ARCH_GPT2, CT_MOE_SOFTMAX_TOPK);
    gradcheck(CT_ARCH_GPT2, CT_MOE_SIGMOID);
    gradcheck(CT_ARCH_LLAMA, CT_MOE_TOPK_SOFTMAX); /* SwiGLU experts */
}

/* Llama (RMSNorm, RoPE, SwiGLU, GQA with one key/value head for two query heads, no biases):
 * the same check, the same tolerance. */
static void test_gradcheck_llama(void **state) {
    gradcheck(CT_ARCH_LLAMA, -1);
}

/* ---- overfitting one batch ------------------------------------------------------------------ */

static void test_overfit_one_batch(void **state) {
    ct_config cfg;
    test_tiny_config(&cfg, NULL);
    cfg.train.weight_decay = 0.0;
    cfg.train.steps = 120;
    cfg.train.lr = 1e-2;
    cfg.train.min_lr = 1e-2;
    cfg.train.warmup_steps = 1;
    validated_config(&cfg);
    ct_backend *be = test_backend_new(1);
    ct_model_layout layout = ct_model_layout_single(&cfg);
    ct_model *m;
    ct_optimizer *opt;
    ct_acts *a;
    ct_grad_scratch *s;
    assert_int_equal(ct_model_new(&m, &cfg, be, &layout), CT_OK);
    assert_int_equal(ct_optim_new(&opt, m, &cfg.train, NULL, NULL), CT_OK);
    assert_int_equal(ct_acts_new(&a, m, 4), CT_OK);
    assert_int_equal(ct_grad_scratch_new(&s, m, 4), CT_OK);
    int64_t N = 4 * cfg.model.seq_len;
    int32_t tokens[64], targets[64];
    random_batch(tokens, targets, N, cfg.model.vocab_size, 5);
    ct_acts_set_batch(a, 0, tokens, targets);
    double first = 0, loss = 0;
    for (int step = 0; step < cfg.train.steps; step++) {
        ct_model_zero_grads(m);
        loss = ct_model_forward_loss(m, a, (float)(1.0 / (double)N)) / (double)N;
        ct_model_backward(m, a, s);
        double norm = sqrt(ct_optim_grad_sumsq(opt, NULL));
        ct_optim_step(opt, (float)ct_optim_lr(&cfg.train, step),
                      ct_optim_clip_scale(&cfg.train, norm));
        if (step == 0) first = loss;
    }
    printf("overfit: loss %.4f -> %.4f\n", first, loss);
    /* Random targets: the initial loss is about ln(123) = 4.81; memorising 64 tokens drives it
     * near zero. */
    assert_true(first > 4.0 && first < 5.5);
    assert_true(loss < 0.2);
    ct_grad_scratch_free(s);
    ct_acts_free(a);
    ct_optim_free(opt);
    ct_model_free(m);
    ct_backend_free(be);
}

/* ---- the training loop: microbatches and threads -----------------------------------------------
 */

static char shard_path[1024];
static char *tmpdir;

static int setup_data(void **state) {
    tmpdir = test_make_tmpdir();
    test_write_corpus_shard(tmpdir, "train.bin", 200000, shard_path, sizeof shard_path);
    return 0;
}

static int teardown_data(void **state) {
    test_remove_tree(tmpdir);
    free(tmpdir);
    return 0;
}

static ct_train_result run_training(ct_config *cfg, int threads) {
    validated_config(cfg);
    ct_backend *be = test_backend_new(threads);
    ct_train_result r;
    ct_train_options opts = {.keep_params = true};
    ct_status st = ct_train_run(cfg, be, NULL, &opts, &r);
    if (st != CT_OK) ct_error_print();
    assert_int_equal(st, CT_OK);
    ct_backend_free(be);
    return r;
}

/*
 * One global batch of 8 sequences as 1, 2 or 4 microbatches gives the same losses and
 * parameters: only the order of summing microbatch gradients differs. test_runs_match
 * (test_util.h, after test/tools/compare_runs.py) derives the tolerance from fp32 rounding.
 */
static void test_microbatch_equivalence(void **state) {
    ct_train_result ref = {0};
    const int64_t micro[] = {8, 4, 2, 1};
    for (int k = 0; k < 4; k++) {
        ct_config cfg;
        test_tiny_config(&cfg, shard_path);
        cfg.train.global_batch = 8;
        cfg.train.micro_batch = micro[k];
        cfg.train.steps = 5;
        ct_train_result r = run_training(&cfg, 1);
        if (k == 0) {
            ref = r;
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "micro_batch %lld vs 8", (long long)micro[k]);
        assert_true(test_runs_match(&cfg, &ref, &r, what));
        ct_train_result_release(&r);
    }
    ct_train_result_release(&ref);
}

/* A run gathers the model's parameters only when asked (--dump-params, keep_params): nothing is
 * collected at the end of an ordinary run. */
static void test_params_kept_only_when_asked(void **state) {
    ct_config cfg;
    test_tiny_config(&cfg, shard_path);
    cfg.train.steps = 1;
    cfg.train.warmup_steps = 1;
    validated_config(&cfg);
    ct_backend *be = test_backend_new(1);
    ct_train_result r;
    assert_int_equal(ct_train_run(&cfg, be, NULL, NULL, &r), CT_OK);
    assert_null(r.final_params);
    assert_null(r.init_params);
    assert_int_equal(r.n_spans, 0);
    ct_train_result_release(&r);
    ct_backend_free(be);
}

/* The same bytes with 1 and 2 threads: every reduction has a thread-independent order. */
static void test_thread_determinism(void **state) {
    ct_config cfg;
    test_tiny_config(&cfg, shard_path);
    cfg.train.steps = 3;
    ct_train_result a = run_training(&cfg, 1);
    test_tiny_config(&cfg, shard_path);
    cfg.train.steps = 3;
    ct_train_result b = run_training(&cfg, 2);
    assert_int_equal(a.n_params, b.n_params);
    assert_memory_equal(a.losses, b.losses, 3 * sizeof(double));
    assert_memory_equal(a.final_params, b.final_params, (size_t)a.n_params * sizeof(float));
    ct_train_result_release(&a);
    ct_train_result_release(&b);
}

/*
 * train.recompute = full: the same bytes as keeping every activation (the recomputed forward
 * is the same arithmetic in the same order), and far fewer activation bytes kept per
 * microbatch: only each layer's input survives, plus one shared layer workspace.
 */
static void test_recompute(void **state) {
    ct_config cfg;
    test_tiny_config(&cfg, shard_path);
    cfg.train.steps = 3;
    ct_train_result a = run_training(&cfg, 1);
    test_tiny_config(&cfg, shard_path);
    cfg.train.steps = 3;
    cfg.train.recompute = CT_RECOMPUTE_FULL;
    ct_train_result b = run_training(&cfg, 1);
    assert_memory_equal(a.losses, b.losses, 3 * sizeof(double));
    assert_memory_equal(a.final_params, b.final_params, (size_t)a.n_params * sizeof(float));
    ct_train_result_release(&a);
    ct_train_result_release(&b);

    ct_backend *be = test_backend_new(1);
    ct_model_layout keep = ct_model_layout_single(&cfg), recompute = keep;
    recompute.recompute = true;
    ct_model *m1, *m2;
    assert_int_equal(ct_model_new(&m1, &cfg, be, &keep), CT_OK);
    assert_int_equal(ct_model_new(&m2, &cfg, be, &recompute), CT_OK);
    size_t kept = ct_acts_bytes(m1, 4), recomputed = ct_acts_bytes(m2, 4);
    printf("activations per microbatch: %zu bytes kept, %zu with recompute\n", kept, recomputed);
    assert_true(recomputed < kept / 2);
    ct_model_free(m1);
    ct_model_free(m2);
    ct_backend_free(be);
}

/* Training on real text makes the loss fall well below its start. */
static void test_loss_falls(void **state) {
    ct_config cfg;
    test_tiny_config(&cfg, shard_path);
    cfg.model.seq_len = 64;
    cfg.model.d_model = 64;
    cfg.train.steps = 200;
    cfg.train.global_batch = 16;
    cfg.train.micro_batch = 16;
    cfg.train.warmup_steps = 10;
    cfg.train.lr = 1e-2;
    cfg.train.min_lr = 1e-3;
    ct_train_result r = run_training(&cfg, 1);
    printf("loss %.3f -> %.3f\n", r.first_loss, r.last_loss);
    /* Byte-level Shakespeare: from ln(123) ≈ 4.8 to under 3.0, below the unigram entropy of
     * this text (3.30 nats), which needs the model to use context, in 200 small steps. */
    assert_true(r.first_loss > 4.2);
    assert_true(r.last_loss < 3.0);
    ct_train_result_release(&r);
}

/* ---- decoding, the split backward: a small model of each kind -------------------------------
 */

/* A 2-layer model of seq_len 16 (GPT-2 or Llama with grouped-query heads; with moe every other
 * layer a Mixture of Experts, Llama's with a shared expert), micro_batch B, in bf16 or fp32, with
 * recompute or not (set in the layout as the trainer does), on a 2-thread CPU backend. */
static ct_model *small_model(ct_config *cfg, ct_backend **be, ct_arch arch, bool moe, bool bf16,
                             bool recompute, int64_t B) {
    test_tiny_config(cfg, NULL);
    cfg->model.arch = arch;
    if (moe) {
        cfg->model.moe_experts = 4;
        cfg->model.moe_top_k = 2;
        cfg->model.moe_every = 2;
        cfg->model.moe_d_ff = 24;
        cfg->model.moe_shared = arch == CT_ARCH_LLAMA ? 1 : 0;
    }
    cfg->model.seq_len = 16;
    cfg->model.n_layer = 2;
    cfg->model.d_model = 32;
    cfg->model.n_head = 4;
    if (arch == CT_ARCH_LLAMA) cfg->model.n_kv_head = 2, cfg->model.multiple_of = 16;
    cfg->train.micro_batch = B;
    cfg->train.global_batch = B;
    cfg->train.precision = bf16 ? CT_PRECISION_BF16 : CT_PRECISION_FP32;
    cfg->train.recompute = recompute ? CT_RECOMPUTE_FULL : CT_RECOMPUTE_NONE;
    validated_config(cfg);
    *be = test_backend_new(2);
    ct_model_layout layout = ct_model_layout_single(cfg);
    layout.recompute = recompute;
    ct_model *m;
    assert_int_equal(ct_model_new(&m, cfg, *be, &layout), CT_OK);
    return m;
}

/* ---- decoding with a key/value cache ----------------------------------------------------------
 */

/* The logits (T, Vl) of one sequence through a full forward, then again one position at a time
 * through ct_model_decode_*: row by row the same up to the summation order of the GEMMs, whose
 * M = 1 and M = T kernels may add their K terms in other orders (the attention and norms add in
 * the same order either way). A sum of K terms in another order moves by at most red_tol(K) =
 * 2(K+1)·u of the sum of |terms| (u = 2^-24); a logit passes through 2 + 4·n_layer such sums (the
 * QKV, output, up and down projections, the head), each of at most K_max = max(C, F) terms, with
 * the |terms| of each sum taken at the scale of the largest |logit| (pre-norm layers: every
 * matmul reads a normalised input): tolerance (2 + 4L)·red_tol(K_max)·max|logit|. bf16: an
 * order change can flip the rounding of an op's bf16 output by one unit (2^-8 relative), which
 * the next ops carry to the logits: two such units of max|logit|. (Measured on the CPU backend:
 * at most 9e-8 in fp32, 0 in bf16: the kernels add in one order for any M.) */
static void decode_matches_forward(ct_arch arch, bool moe, bool bf16, bool recompute) {
    ct_config cfg;
    ct_backend *be;
    ct_model *m = small_model(&cfg, &be, arch, moe, bf16, recompute, 1);
    const int64_t T = cfg.model.seq_len, Vl = ct_model_head_weight(m)->local_shape[0];
    int32_t tokens[16], targets[16];
    random_batch(tokens, targets, T, cfg.model.vocab_size, 5);
    float *full = ct_xmalloc((size_t)(T * Vl) * sizeof(float)), *row = ct_xmalloc((size_t)Vl * 4);
    ct_acts *a;
    assert_int_equal(ct_acts_new(&a, m, 1), CT_OK);
    ct_acts_set_batch(a, -1, tokens, targets);
    ct_model_forward(m, a, 0.0f);
    ct_tensor_to_host_f32(full, ct_acts_logits(a));
    ct_acts_free(a);
    float big = 0.0f;
    for (int64_t i = 0; i < T * Vl; i++) big = fmaxf(big, fabsf(full[i]));
    const int64_t K = CT_MAX(cfg.model.d_model, m->F);
    const double tol = bf16 ? 2.0 * 0x1p-8 * big
                            : (2 + 4 * cfg.model.n_layer) * 2.0 * (double)(K + 1) * 0x1p-24 * big;
    /* twice: the second pass starts the sequence again over a used cache */
    assert_int_equal(ct_model_decode_begin(m), CT_OK);
    assert_int_equal(ct_acts_new(&a, m, 1), CT_OK);
    double worst = 0.0;
    for (int pass = 0; pass < 2; pass++)
        for (int64_t pos = 0; pos < T; pos++) {
            ct_model_decode_at(m, pos);
            ct_acts_set_batch(a, -1, tokens + pos, targets + pos);
            ct_model_forward(m, a, 0.0f);
            ct_tensor_to_host_f32(row, ct_acts_logits(a));
            for (int64_t v = 0; v < Vl; v++) {
                double d = fabs((double)row[v] - full[pos * Vl + v]);
                if (!(d <= tol))
                    fail_msg("%s%s%s%s: position %lld logit %lld: decoded %g, full forward %g "
                             "(tolerance %g)",
                             arch == CT_ARCH_LLAMA ? "llama" : "gpt2", moe ? " moe" : "",
                             bf16 ? " bf16" : "", recompute ? " recompute" : "", (long long)pos,
                             (long long)v, row[v], full[pos * Vl + v], tol);
                worst = fmax(worst, d);
            }
        }
    ct_acts_free(a);
    ct_model_decode_end(m);
    assert_int_equal(m->T, T); /* decoding set nothing aside for good */
    print_message("%s%s%s%s: worst logit difference %.3g of tolerance %.3g\n",
                  arch == CT_ARCH_LLAMA ? "llama" : "gpt2", moe ? " moe" : "", bf16 ? " bf16" : "",
                  recompute ? " recompute" : "", worst, tol);
    free(full), free(row);
    ct_model_free(m);
    ct_backend_free(be);
}

/* Greedy sampling (temperature 1e-6: the likeliest token, or one of those tied with it) with the
 * cache and with whole windows: each drawn token must be an argmax of a full forward's logits at
 * the text before it, read in the model's dtype (bf16 logits widened, never read as floats). */
static void greedy_matches_forward(bool bf16) {
    ct_config cfg;
    test_tiny_config(&cfg, NULL);
    cfg.model.arch = CT_ARCH_LLAMA;
    cfg.model.seq_len = 16;
    cfg.model.n_layer = 2;
    cfg.model.d_model = 32;
    cfg.model.n_head = 4;
    cfg.model.n_kv_head = 2, cfg.model.multiple_of = 16;
    cfg.train.micro_batch = 1;
    cfg.train.global_batch = 1;
    cfg.train.precision = bf16 ? CT_PRECISION_BF16 : CT_PRECISION_FP32;
    validated_config(&cfg);
    ct_backend *be = test_backend_new(2);
    ct_model_layout layout = ct_model_layout_single(&cfg);
    ct_pctx *pctx = ct_pctx_local_new();
    layout.tp = pctx->tp_comm;
    ct_model *m;
    assert_int_equal(ct_model_new(&m, &cfg, be, &layout), CT_OK);
    const int64_t T = cfg.model.seq_len, Vl = ct_model_head_weight(m)->local_shape[0];
    const int64_t V = cfg.model.vocab_size, n_new = 24; /* past seq_len: the window slides */
    const int32_t prompt[3] = {5, 17, 2};
    ct_sample_options opt = {.temperature = 1e-6, .top_k = 0};
    float *logits = ct_xmalloc((size_t)(T * Vl) * sizeof(float));
    int32_t window[16];
    for (int full = 0; full < 2; full++) {
        opt.full_windows = full;
        int32_t *ids = NULL;
        int64_t n = 0;
        assert_int_equal(ct_sample_tokens(m, NULL, pctx, prompt, 3, n_new, 1, &opt, &ids, &n),
                         CT_OK);
        assert_int_equal(n, 3 + n_new);
        ct_acts *a;
        assert_int_equal(ct_acts_new(&a, m, 1), CT_OK);
        for (int64_t k = 3; k < n; k++) {
            const int64_t start = k > T ? k - T : 0, len = k - start;
            memset(window, 0, sizeof window);
            memcpy(window, ids + start, (size_t)len * sizeof(int32_t));
            ct_acts_set_batch(a, -1, window, window);
            ct_model_forward(m, a, 0.0f);
            ct_tensor_to_host_f32(logits, ct_acts_logits(a));
            const float *row = logits + (len - 1) * Vl;
            float best = -INFINITY;
            for (int64_t v = 0; v < V; v++) best = fmaxf(best, row[v]);
            if (!(ids[k] >= 0 && ids[k] < V && row[ids[k]] == best))
                fail_msg("%s%s: token %lld is %d (logit %g), the largest logit is %g",
                         bf16 ? "bf16" : "fp32", full ? " whole windows" : " cached", (long long)k,
                         ids[k], ids[k] >= 0 && ids[k] < V ? row[ids[k]] : NAN, best);
        }
        ct_acts_free(a);
        free(ids);
    }
    free(logits);
    ct_model_free(m);
    ct_pctx_free(pctx);
    ct_backend_free(be);
}

static void test_greedy_sampling(void **state) {
    (void)state;
    greedy_matches_forward(false);
    greedy_matches_forward(true);
}

/* ---- the backward in two parts --------------------------------------------------------------
 */

/* Every gradient of three microbatches through the whole backward (F0 B0 F1 B1 F2 B2), then
 * through the split one in a zero-bubble order (F0 F1 F2, B0 B1 W0 B2 W1 W2): the same bytes,
 * because each gradient gets the same products added in the same microbatch order; only when
 * the weight GEMMs run changes. */
static void split_matches_whole(ct_arch arch, bool moe, bool bf16, bool recompute) {
    ct_config cfg;
    ct_backend *be;
    ct_model *m = small_model(&cfg, &be, arch, moe, bf16, recompute, 2);
    enum { M = 3 };
    const int64_t N = 2 * cfg.model.seq_len;
    int32_t tokens[M][32], targets[M][32];
    for (int k = 0; k < M; k++)
        random_batch(tokens[k], targets[k], N, cfg.model.vocab_size, 40 + k);
    ct_acts *a[M];
    ct_grad_scratch *s;
    for (int k = 0; k < M; k++) assert_int_equal(ct_acts_new(&a[k], m, 2), CT_OK);
    assert_int_equal(ct_grad_scratch_new(&s, m, 2), CT_OK);
    const size_t bytes = ct_tensor_bytes(m->grad_slab);
    unsigned char *whole = ct_xmalloc(bytes), *split = ct_xmalloc(bytes);
    const float dloss = (float)(1.0 / (double)(M * N));
    for (int pass = 0; pass < 2; pass++) {
        ct_model_zero_grads(m);
        ct_model_begin_losses(m, M, 2);
        for (int k = 0; k < M; k++) ct_acts_set_batch(a[k], k, tokens[k], targets[k]);
        if (pass == 0) {
            for (int k = 0; k < M; k++) {
                ct_model_forward(m, a[k], dloss);
                ct_model_backward(m, a[k], s);
            }
        } else {
            for (int k = 0; k < M; k++) ct_model_forward(m, a[k], dloss);
            ct_model_backward_input(m, 0, a[0], s);
            /* the record holds what the formula says (plan's activation memory of a split
             * schedule): one microbatch's, the experts' rows B·T·top_k in all */
            if (ct_acts_wgrad_bytes(a[0]) != ct_model_wgrad_stash_bytes(m, 2))
                fail_msg("%s%s%s%s: the record holds %zu bytes, the formula says %zu",
                         arch == CT_ARCH_LLAMA ? "llama" : "gpt2", moe ? " moe" : "",
                         bf16 ? " bf16" : "", recompute ? " recompute" : "",
                         ct_acts_wgrad_bytes(a[0]), ct_model_wgrad_stash_bytes(m, 2));
            ct_model_backward_input(m, 0, a[1], s);
            ct_model_backward_weight(m, 0, a[0]);
            ct_model_backward_input(m, 0, a[2], s);
            ct_model_backward_weight(m, 0, a[1]);
            ct_model_backward_weight(m, 0, a[2]);
        }
        ct_tensor_to_host(pass == 0 ? whole : split, m->grad_slab);
    }
    const char *what = arch == CT_ARCH_LLAMA ? "llama" : "gpt2";
    if (memcmp(whole, split, bytes) != 0) {
        const float *x = (const float *)whole, *y = (const float *)split;
        size_t i = 0;
        while (i < bytes / 4 && memcmp(&x[i], &y[i], 4) == 0) i++;
        fail_msg("%s%s%s%s: gradient element %zu: whole backward %.9g, split %.9g", what,
                 moe ? " moe" : "", bf16 ? " bf16" : "", recompute ? " recompute" : "", i, x[i],
                 y[i]);
    }
    free(whole), free(split);
    for (int k = 0; k < M; k++) ct_acts_free(a[k]);
    ct_grad_scratch_free(s);
    ct_model_free(m);
    ct_backend_free(be);
}

static void test_split_backward(void **state) {
    (void)state;
    for (int arch = 0; arch < 2; arch++)
        for (int moe = 0; moe < 2; moe++)
            for (int bf16 = 0; bf16 < 2; bf16++)
                for (int rc = 0; rc < 2; rc++)
                    split_matches_whole(arch ? CT_ARCH_LLAMA : CT_ARCH_GPT2, moe, bf16, rc);
}

static void test_decode_matches_forward(void **state) {
    (void)state;
    for (int arch = 0; arch < 2; arch++)
        for (int moe = 0; moe < 2; moe++)
            for (int bf16 = 0; bf16 < 2; bf16++)
                decode_matches_forward(arch ? CT_ARCH_LLAMA : CT_ARCH_GPT2, moe, bf16, false);
    decode_matches_forward(CT_ARCH_LLAMA, true, false, true);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_init_layout_independent),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_gradcheck_llama),
        cmocka_unit_test(test_gradcheck_moe),
        cmocka_unit_test(test_overfit_one_batch),
        cmocka_unit_test(test_microbatch_equivalence),
        cmocka_unit_test(test_params_kept_only_when_asked),
        cmocka_unit_test(test_thread_determinism),
        cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_loss_falls),
        cmocka_unit_test(test_decode_matches_forward),
        cmocka_unit_test(test_greedy_sampling),
        cmocka_unit_test(test_split_backward),
    };
    return cmocka_run_group_tests(tests, setup_data, teardown_data);
}
