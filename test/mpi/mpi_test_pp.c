/*
 * mpi_test_pp.c — the pipeline executor against world size 1, run under mpirun by
 * test/mpi/cli_mpi_pp.sh with the world as one pipeline group (pp = world size).
 *
 * For every schedule (GPipe, 1F1B, interleaved with v = 2, and a GPipe whose backward passes run
 * in reverse microbatch order) one step of the tiny model runs through the executor; each rank
 * then compares the gradients of the chunks it holds with a single-process model that runs the
 * same microbatches (the reference is built on every rank from the same seed):
 *   - every gradient element g must be within K·u·A of the exact sum S = Σ g_mb, where the g_mb
 *     are the reference's per-microbatch gradients, A = Σ |g_mb| and u = 2^-24: the executor
 *     runs each microbatch's arithmetic exactly as one process does and only sums the K
 *     contributions (the m microbatches of each of the dp replicas; twice that for the tied
 *     embedding, whose two halves are summed over the embedding group) in its own order, which
 *     moves a float sum by at most (K − 1)·u·Σ|terms|;
 *   - with one data-parallel replica, the schedules that accumulate in microbatch order (all
 *     but the reversed one) must give the reference's bytes exactly (the tied embedding aside);
 *   - the reversed schedule, at 4 ranks as pp 2 × dp 2 with ZeRO-0, must still be right: the
 *     data-parallel layer reduces a unit after its last backward of the step, whichever
 *     microbatch that is (a reduction keyed to "microbatch m − 1" would fire after the first
 *     backward here and reduce a partial sum);
 *   - the activation contexts held at once match the simulator's peak in-flight microbatches;
 *   - after the tied-embedding gradient sum and an optimizer step, the first stage's wte and
 *     the last stage's twin are the same bytes;
 *   - the loss summed over the stages is finite and the same for every schedule (to 1e-6
 *     relative: each microbatch's loss is summed in order on the last stage);
 *   - all of it again with a tag bound that leaves one tag per channel (pipeline.c: tags then
 *     repeat across microbatches and MPI's in-order matching must keep them apart).
 * Prints "ok <what>" / "FAIL <what>" lines; exits 1 on any failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/model/model.h"
#include "core/rng.h"
#include "parallel/context.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "test/unit/test_util.h"

static int failures, rank, world;

static void report(bool cond, const char *what) {
    if (!cond) {
        printf("FAIL %s (rank %d)\n", what, rank);
        failures++;
    } else if (rank == 0) {
        printf("ok %s\n", what);
    }
}

/* Microbatch mb of data-parallel replica `replica`: n tokens and targets from the RNG. */
typedef struct batch {
    int64_t n;
    int replica, m;
} batch;

static void fill(void *ctx, int mb, int32_t *tokens, int32_t *targets) {
    const batch *b = ctx;
    uint64_t key = (uint64_t)b->replica * (uint64_t)b->m + (uint64_t)mb;
    for (int64_t i = 0; i < b->n; i++) {
        tokens[i] = (int32_t)(ct_rng_u64(11, key, (uint64_t)i) % 123);
        targets[i] = (int32_t)(ct_rng_u64(12, key, (uint64_t)i) % 123);
    }
}

/* The tiny model of test_util.h, 8 layers on 8 positions, over the grid's pp stages and dp
 * replicas, 2·pp microbatches of one sequence per replica. */
static void pipeline_config(ct_config *cfg, const ct_pctx *pctx, ct_schedule_kind choice, int v) {
    test_tiny_config(cfg, NULL);
    cfg->model.seq_len = 8;
    cfg->model.n_layer = 8;
    cfg->parallel.pp = pctx->pp;
    cfg->parallel.dp = pctx->dp;
    cfg->parallel.schedule = choice;
    cfg->parallel.virtual_stages = v;
    cfg->train.micro_batch = 1;
    cfg->train.global_batch = 2 * pctx->pp * pctx->dp;
    if (ct_config_validate(cfg, world) != CT_OK) {
        ct_error_print();
        exit(1);
    }
}

/* The reference on one process: per parameter (by name) the exact sum S of the m microbatch
 * gradients and the sum A of their magnitudes (double), and the fp32 gradients of the m
 * microbatches accumulated in order as a world-size-1 step does. */
typedef struct reference {
    ct_model *model;
    double *exact, *magnitude;
    float *in_order;
} reference;

static void reference_run(reference *ref, const ct_config *cfg, ct_backend *be, int m,
                          int replicas) {
    ct_model_layout layout = ct_model_layout_single(cfg);
    CT_ASSERT(ct_model_new(&ref->model, cfg, be, &layout) == CT_OK);
    ct_model *rm = ref->model;
    int64_t n = rm->slab_numel, tokens = cfg->model.seq_len;
    ref->exact = ct_xcalloc((size_t)n, sizeof(double));
    ref->magnitude = ct_xcalloc((size_t)n, sizeof(double));
    ref->in_order = ct_xmalloc((size_t)n * sizeof(float));
    float *g = ct_xmalloc((size_t)n * sizeof(float));
    ct_acts *acts;
    ct_grad_scratch *scratch;
    CT_ASSERT(ct_acts_new(&acts, rm, 1) == CT_OK && ct_grad_scratch_new(&scratch, rm, 1) == CT_OK);
    int32_t *in = ct_xmalloc((size_t)tokens * sizeof(int32_t));
    int32_t *tg = ct_xmalloc((size_t)tokens * sizeof(int32_t));
    const float dloss = (float)(1.0 / (double)(replicas * m * tokens));
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: each microbatch alone; pass 1: accumulated in order, as a step does */
        ct_model_zero_grads(rm);
        for (int mb = 0; mb < replicas * m; mb++) {
            batch b = {.n = tokens, .replica = mb / m, .m = m};
            fill(&b, mb % m, in, tg);
            ct_acts_set_batch(acts, 0, in, tg);
            if (pass == 0) ct_model_zero_grads(rm);
            ct_model_forward(rm, acts, dloss);
            ct_model_backward(rm, acts, scratch);
            if (pass == 1) continue;
            ct_tensor_to_host(g, rm->grad_slab);
            for (int64_t i = 0; i < n; i++) {
                ref->exact[i] += g[i];
                ref->magnitude[i] += fabs(g[i]);
            }
        }
    }
    ct_tensor_to_host(ref->in_order, rm->grad_slab);
    free(g), free(in), free(tg);
    ct_acts_free(acts);
    ct_grad_scratch_free(scratch);
}

static void reference_free(reference *ref) {
    ct_model_free(ref->model);
    free(ref->exact), free(ref->magnitude), free(ref->in_order);
}

/* GPipe with each rank's backward passes (with their transfers) in reverse microbatch order. */
static ct_schedule *gpipe_reversed(int pp, int m) {
    ct_schedule *s = ct_schedule_new(CT_SCHEDULE_GPIPE, pp, 1, m);
    for (int r = 0; r < s->pp; r++) {
        ct_action *a = s->actions[r];
        int n = s->n_actions[r], first = n;
        for (int i = 0; i < n && first == n; i++)
            if (a[i].kind == CT_ACTION_RECV_GRAD || a[i].kind == CT_ACTION_BACKWARD) first = i;
        ct_action *tail = ct_xmalloc((size_t)(n - first) * sizeof *tail);
        int k = 0;
        /* groups [RECV_GRAD] BACKWARD [SEND_GRAD], copied last group first */
        for (int end = n; end > first;) {
            int start = end - 1;
            while (a[start].kind != CT_ACTION_BACKWARD) start--;
            if (start > first && a[start - 1].kind == CT_ACTION_RECV_GRAD) start--;
            memcpy(tail + k, a + start, (size_t)(end - start) * sizeof *tail);
            k += end - start;
            end = start;
        }
        memcpy(a + first, tail, (size_t)k * sizeof *tail);
        free(tail);
    }
    return s;
}

static double run_schedule(ct_pctx *pctx, const char *name, ct_schedule_kind choice, int v,
                           bool reversed) {
    ct_config cfg;
    pipeline_config(&cfg, pctx, choice, v);
    const int m = (int)cfg.derived.grad_accum, dp_size = pctx->dp;
    ct_backend *be = test_backend_new(1);
    ct_model_layout layout = ct_model_layout_pipeline(&cfg, pctx->pp_rank);
    layout.dp_size = dp_size;
    ct_model *model;
    ct_dp *dp;
    ct_pipeline *pipe;
    bool built = ct_model_new(&model, &cfg, be, &layout) == CT_OK &&
                 ct_dp_new(&dp, model, pctx->dp_comm, &cfg.train, CT_DTYPE_F32) == CT_OK;
    if (built && reversed)
        built = ct_pipeline_new_from_schedule(&pipe, model, dp, pctx, gpipe_reversed(pctx->pp, m),
                                              1) == CT_OK;
    else if (built)
        built = ct_pipeline_new(&pipe, model, dp, pctx, choice, m, 1) == CT_OK;
    if (!built) {
        ct_error_print();
        exit(1);
    }
    int64_t n = cfg.model.seq_len;
    batch b = {.n = n, .replica = pctx->dp_rank, .m = m};
    ct_dp_begin_step(dp, m);
    double loss = ct_pipeline_run(pipe, true, (float)(1.0 / (double)(dp_size * m * n)), fill, &b);
    ct_dp_finish_backward(dp);
    ct_dp_sync_tied(dp, pctx->embed_comm);
    ct_comm_allreduce(pctx->pp_comm, &loss, 1, CT_DTYPE_F64, CT_REDUCE_SUM);
    ct_comm_allreduce(pctx->dp_comm, &loss, 1, CT_DTYPE_F64, CT_REDUCE_SUM);

    /* Gradients against the reference, parameter by parameter. */
    reference ref;
    reference_run(&ref, &cfg, be, m, dp_size);
    const double u = ldexp(1.0, -24);
    double worst = 0.0;
    bool bitwise = true, within = true;
    const char *worst_name = "";
    for (int i = 0; i < model->n_params; i++) {
        const ct_param *p = &model->params[i];
        const ct_param *q = ct_model_find_param(ref.model, p->tied_to ? p->tied_to : p->name);
        CT_ASSERT(q != NULL && q->numel == p->numel);
        float *g = ct_xmalloc((size_t)p->numel * sizeof(float));
        ct_tensor_to_host(g, p->grad);
        int64_t base = ref.model->units[q->unit].slab_offset + q->offset;
        bool tied = !strcmp(q->name, "wte") && pctx->pp > 1;
        double terms = (tied ? 2.0 : 1.0) * m * dp_size;
        for (int64_t k = 0; k < p->numel; k++) {
            double err = fabs((double)g[k] - ref.exact[base + k]);
            double bound = terms * u * ref.magnitude[base + k];
            double ratio = err > 0 ? err / bound : 0.0;
            if (!(err <= bound)) within = false; /* NaN fails too */
            if (ratio > worst) worst = ratio, worst_name = p->name;
            if (!tied && dp_size == 1 && memcmp(&g[k], &ref.in_order[base + k], sizeof(float)))
                bitwise = false;
        }
        free(g);
    }
    char what[200];
    snprintf(what, sizeof what,
             "%s pp=%d dp=%d m=%d: every gradient within K·u·Σ|g_mb| of the exact sum (worst %s "
             "at %.0f%% of it)",
             name, pctx->pp, dp_size, m, worst_name, 100.0 * worst);
    report(within, what);
    if (dp_size == 1 && !reversed) {
        snprintf(what, sizeof what,
                 "%s pp=%d m=%d: gradients are world size 1's bytes (microbatch order)", name,
                 pctx->pp, m);
        report(bitwise, what);
    }
    reference_free(&ref);
    int r = pctx->pp_rank;
    ct_sim_result sim = ct_schedule_simulate(ct_pipeline_schedule(pipe), 2.0);
    snprintf(what, sizeof what,
             "%s pp=%d dp=%d m=%d: activations held at once = simulated peak (%d)", name, pctx->pp,
             dp_size, m, sim.peak_inflight_mb[r]);
    report(ct_pipeline_peak_inflight(pipe) == sim.peak_inflight_mb[r], what);
    ct_sim_result_release(&sim);

    /* The tied embedding: update, and the first stage's wte and the last stage's twin must
     * still be the same bytes. */
    ct_dp_optimizer_step(dp, 1e-2f, 1.0f);
    if (pctx->embed_comm) {
        int64_t nw = model->wte->numel;
        float *mine = ct_xmalloc((size_t)nw * sizeof(float));
        ct_tensor_to_host(mine, model->wte->value);
        float *both = ct_xmalloc(2 * (size_t)nw * sizeof(float));
        ct_comm_allgather(pctx->embed_comm, mine, both, 2 * nw, CT_DTYPE_F32);
        snprintf(what, sizeof what,
                 "%s pp=%d dp=%d: tied embedding copies identical after the update", name, pctx->pp,
                 dp_size);
        report(memcmp(both, both + nw, (size_t)nw * sizeof(float)) == 0, what);
        free(mine), free(both);
    }
    ct_pipeline_free(pipe);
    ct_dp_free(dp);
    ct_model_free(model);
    ct_backend_free(be);
    return loss;
}

int main(int argc, char **argv) {
    if (ct_mpi_init(&argc, &argv) != CT_OK) {
        ct_error_print();
        return 1;
    }
    rank = ct_mpi_world_rank();
    world = ct_mpi_world_size();
    ct_pctx *pctx;
    if (ct_pctx_new(&pctx, 1, world, 1, 120.0) != CT_OK) {
        ct_error_print();
        return 1;
    }
    char what[128];
    double l_1f1b = run_schedule(pctx, "1f1b", CT_SCHEDULE_1F1B, 1, false);
    double l_gpipe = run_schedule(pctx, "gpipe", CT_SCHEDULE_GPIPE, 1, false);
    double l_inter = run_schedule(pctx, "interleaved", CT_SCHEDULE_INTERLEAVED, 2, false);
    double l_rev = run_schedule(pctx, "gpipe, backward reversed", CT_SCHEDULE_GPIPE, 1, true);
    /* An MPI whose tag bound leaves one tag per channel: every microbatch's message on a
     * channel carries the same tag, and MPI's in-order matching must still deliver each one
     * to its own receive (pipeline.c, choose_tags). 2·pp·v tags: the interleaved run's. */
    ct_pipeline_set_tag_bound_for_tests(2 * world * 2 - 1);
    run_schedule(pctx, "1f1b, tags repeating every 2 microbatches", CT_SCHEDULE_1F1B, 1, false);
    run_schedule(pctx, "interleaved, one tag per channel", CT_SCHEDULE_INTERLEAVED, 2, false);
    /* Fewer tags than channels: refused with a message, not run with colliding tags. */
    ct_pipeline_set_tag_bound_for_tests(2 * world - 2);
    {
        ct_config cfg;
        pipeline_config(&cfg, pctx, CT_SCHEDULE_1F1B, 1);
        ct_backend *be = test_backend_new(1);
        ct_model_layout layout = ct_model_layout_pipeline(&cfg, pctx->pp_rank);
        ct_model *model;
        ct_dp *dp;
        ct_pipeline *pipe = NULL;
        CT_ASSERT(ct_model_new(&model, &cfg, be, &layout) == CT_OK &&
                  ct_dp_new(&dp, model, pctx->dp_comm, &cfg.train, CT_DTYPE_F32) == CT_OK);
        ct_status st = ct_pipeline_new(&pipe, model, dp, pctx, CT_SCHEDULE_1F1B,
                                       (int)cfg.derived.grad_accum, 1);
        snprintf(what, sizeof what, "pp=%d: too small a tag bound is refused (exit 2, tags named)",
                 world);
        report(st == CT_ERR_INPUT && pipe == NULL && strstr(ct_error_message(), "message tags"),
               what);
        ct_dp_free(dp);
        ct_model_free(model);
        ct_backend_free(be);
    }
    ct_pipeline_set_tag_bound_for_tests(0);
    if (world == 4) {
        /* pp 2 x dp 2: the data-parallel reduction under a reversed backward order. */
        ct_pctx *grid;
        if (ct_pctx_new(&grid, 1, 2, 2, 120.0) != CT_OK) {
            ct_error_print();
            return 1;
        }
        run_schedule(grid, "gpipe, backward reversed", CT_SCHEDULE_GPIPE, 1, true);
        run_schedule(grid, "1f1b", CT_SCHEDULE_1F1B, 1, false);
        ct_pctx_free(grid);
    }
    snprintf(what, sizeof what, "pp=%d: the loss is finite and the same for every schedule", world);
    report(isfinite(l_1f1b) && fabs(l_gpipe - l_1f1b) <= 1e-6 * fabs(l_1f1b) &&
               fabs(l_inter - l_1f1b) <= 1e-6 * fabs(l_1f1b) &&
               fabs(l_rev - l_1f1b) <= 1e-6 * fabs(l_1f1b),
           what);
    int any = failures;
    ct_comm_allreduce(pctx->world, &any, 1, CT_DTYPE_I32, CT_REDUCE_MAX);
    ct_pctx_free(pctx);
    ct_mpi_finalize();
    return any ? 1 : 0;
}
