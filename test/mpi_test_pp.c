/*
 * mpi_test_pp.c — the pipeline executor against its schedule, run under mpirun by
 * test/cli_mpi_pp.sh with the world as one pipeline group (pp = world size).
 *
 * For every schedule (GPipe, 1F1B, interleaved with v = 2) one training step of the tiny model
 * runs with the executor's action log on; each rank checks that
 *   - the actions it executed are exactly its list from the generator, in order;
 *   - the activation contexts it held at once match the simulator's peak in-flight
 *     microbatches for that rank (the executor frees a microbatch's activations as soon as its
 *     last backward on this rank is done);
 *   - after the tied-embedding gradient sum and an optimizer step, the first stage's wte and
 *     the last stage's twin are the same bytes;
 *   - the loss summed over the stages is finite and the same for every schedule (to 1e-6
 *     relative: the schedules reorder work, not arithmetic — each microbatch's gradient sum
 *     is accumulated in microbatch order on every rank).
 * Prints "ok <what>" / "FAIL <what>" lines; exits 1 on any failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/model.h"
#include "core/rng.h"
#include "parallel/context.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "test_util.h"

static int failures, rank, world;

static void report(bool cond, const char *what) {
    if (!cond) {
        printf("FAIL %s (rank %d)\n", what, rank);
        failures++;
    } else if (rank == 0) {
        printf("ok %s\n", what);
    }
}

static void fill(void *ctx, int mb, int32_t *tokens, int32_t *targets) {
    const int64_t n = *(const int64_t *)ctx;
    for (int64_t i = 0; i < n; i++) {
        tokens[i] = (int32_t)(ct_rng_u64(11, (uint64_t)mb, (uint64_t)i) % 123);
        targets[i] = (int32_t)(ct_rng_u64(12, (uint64_t)mb, (uint64_t)i) % 123);
    }
}

static double run_schedule(ct_pctx *pctx, ct_schedule_choice choice, int v) {
    static const char *names[] = {"1f1b", "gpipe", "interleaved"};
    ct_config cfg;
    test_tiny_config(&cfg, NULL); /* test_util.h's tiny model, 8 layers on 8 positions */
    cfg.model.seq_len = 8;
    cfg.model.n_layer = 8;
    cfg.parallel.pp = world;
    cfg.parallel.schedule = choice;
    cfg.parallel.virtual_stages = v;
    const int m = 2 * world;
    cfg.train.micro_batch = 1;
    cfg.train.global_batch = m;
    if (ct_config_validate(&cfg, world) != CT_OK) {
        ct_error_print();
        exit(1);
    }
    ct_backend *be = ct_backend_cpu_new(1);
    ct_model_layout layout = ct_model_layout_pipeline(&cfg, pctx->pp_rank);
    ct_model *model;
    ct_dp *dp;
    ct_pipeline *pipe;
    static const ct_schedule_kind kinds[] = {CT_SCHEDULE_KIND_1F1B, CT_SCHEDULE_KIND_GPIPE,
                                             CT_SCHEDULE_KIND_INTERLEAVED};
    if (ct_model_new(&model, &cfg, be, &layout) != CT_OK ||
        ct_dp_new(&dp, model, pctx->dp_comm, 0, &cfg.train) != CT_OK ||
        ct_pipeline_new(&pipe, model, dp, pctx, kinds[choice], m, 1) != CT_OK) {
        ct_error_print();
        exit(1);
    }
    int64_t n = cfg.model.seq_len;
    ct_pipeline_log_actions(pipe, true);
    ct_dp_begin_step(dp, m);
    double loss = ct_pipeline_run(pipe, true, (float)(1.0 / (double)(m * n)), fill, &n);
    ct_dp_finish_backward(dp);
    ct_comm_allreduce(pctx->pp_comm, &loss, 1, CT_DTYPE_F64, CT_REDUCE_SUM);

    char what[160];
    int n_done;
    const ct_action *done = ct_pipeline_executed(pipe, &n_done);
    const ct_schedule *s = ct_pipeline_schedule(pipe);
    int r = pctx->pp_rank;
    bool same = n_done == s->n_actions[r];
    for (int i = 0; same && i < n_done; i++)
        same = done[i].kind == s->actions[r][i].kind && done[i].mb == s->actions[r][i].mb &&
               done[i].chunk == s->actions[r][i].chunk && done[i].peer == s->actions[r][i].peer;
    snprintf(what, sizeof what, "%s pp=%d m=%d: executed actions are the generator's list",
             names[choice], world, m);
    report(same, what);
    ct_sim_result sim = ct_schedule_simulate(s, 2.0);
    snprintf(what, sizeof what, "%s pp=%d m=%d: activations held at once = simulated peak (%d)",
             names[choice], world, m, sim.peak_inflight_mb[r]);
    report(ct_pipeline_peak_inflight(pipe) == sim.peak_inflight_mb[r], what);
    ct_sim_result_release(&sim);

    /* The tied embedding: sum its two gradients over the embedding group, update, and the
     * first stage's wte and the last stage's twin must still be the same bytes. */
    ct_dp_sync_tied(dp, pctx->embed_comm);
    ct_dp_optimizer_step(dp, 1e-2f, 1.0f);
    if (pctx->embed_comm) {
        int64_t nw = model->wte->numel;
        float *mine = ct_xmalloc((size_t)nw * sizeof(float));
        ct_tensor_to_host(mine, model->wte->value);
        float *both = ct_xmalloc(2 * (size_t)nw * sizeof(float));
        ct_comm_allgather(pctx->embed_comm, mine, both, 2 * nw, CT_DTYPE_F32);
        snprintf(what, sizeof what, "%s pp=%d: tied embedding copies identical after the update",
                 names[choice], world);
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
    double l_1f1b = run_schedule(pctx, CT_SCHEDULE_1F1B, 1);
    double l_gpipe = run_schedule(pctx, CT_SCHEDULE_GPIPE, 1);
    double l_inter = run_schedule(pctx, CT_SCHEDULE_INTERLEAVED, 2);
    char what[128];
    snprintf(what, sizeof what, "pp=%d: the loss is finite and the same for every schedule", world);
    report(isfinite(l_1f1b) && fabs(l_gpipe - l_1f1b) <= 1e-6 * fabs(l_1f1b) &&
               fabs(l_inter - l_1f1b) <= 1e-6 * fabs(l_1f1b),
           what);
    int any = failures;
    ct_comm_allreduce(pctx->world, &any, 1, CT_DTYPE_I32, CT_REDUCE_MAX);
    ct_pctx_free(pctx);
    ct_mpi_finalize();
    return any ? 1 : 0;
}
