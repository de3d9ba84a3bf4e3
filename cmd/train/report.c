/*
 * report.c — what a training run tells the people who watch it: rank 0's start-up report and
 * progress lines, the profile line, the metrics lines (setup, re-measured rates, per step). The
 * loop (trainer.c) decides when; this file decides what the lines say. Its functions are declared
 * in trainer_internal.h.
 */
#include "trainer_internal.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static void format_duration(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e7)
        snprintf(buf, n, "?");
    else if (s < 60)
        snprintf(buf, n, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else
        snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

static void print_memory(ct_backend *be) {
    char total[32];
    ct_format_bytes(total, sizeof total, (double)ct_backend_mem_total(be));
    printf("memory (rank 0): %s =", total);
    for (int c = 0; c < CT_MEM_COUNT; c++) {
        size_t b = ct_backend_mem(be, (ct_mem_category)c);
        if (!b) continue;
        char s[32];
        ct_format_bytes(s, sizeof s, (double)b);
        printf(" %s %s", ct_mem_category_name((ct_mem_category)c), s);
    }
    printf("\n");
}

/* order[0..n) = the indices of the n entries of a table whose seconds are at `seconds`, a field
 * of stride bytes into each entry: the most seconds first (ties in table order). */
static void order_by_seconds(const double *seconds, size_t stride, int n, int *order) {
#define SECONDS_OF(i) (*(const double *)((const char *)seconds + (size_t)(i)*stride))
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && SECONDS_OF(order[j]) > SECONDS_OF(order[j - 1]); j--) {
            int x = order[j];
            order[j] = order[j - 1], order[j - 1] = x;
        }
#undef SECONDS_OF
}

/* The entries of an op table, the most seconds first, at most `limit`: " NAME MS (CALLS)" per step,
 * MS to `digits` decimals, separated by " |"; then the line's end. */
static void print_ops(const struct ct_prof_op *ops, int n, int limit, int digits, double steps) {
    int order[CT_PROF_OPS_MAX];
    order_by_seconds(&ops[0].seconds, sizeof *ops, n, order);
    for (int i = 0; i < n && i < limit; i++) {
        const struct ct_prof_op *op = &ops[order[i]];
        printf("%s %s %.*f (%.0f)", i ? " |" : "", op->name, digits, 1e3 * op->seconds / steps,
               (double)op->calls / steps);
    }
    printf("\n");
}

/* One line: milliseconds per step in each op category, in communication, and the rest. */
static void print_profile(const ct_backend *be, ct_comm *const *groups, int n_groups,
                          double elapsed, double steps) {
    double total = 0.0;
    printf("profile (rank 0, ms/step):");
    for (int c = 0; c < CT_PROF_COUNT; c++) {
        double x = be->prof_seconds[c];
        total += x;
        printf(" %s %.1f (%.0f%%) |", ct_prof_category_name((ct_prof_category)c), 1e3 * x / steps,
               100.0 * x / elapsed);
    }
    double comm = 0.0;
    for (int g = 0; g < n_groups; g++)
        if (groups[g] && groups[g]->size > 1) comm += groups[g]->seconds;
    printf(" communication %.1f (%.0f%%) | other %.1f (%.0f%%)\n", 1e3 * comm / steps,
           100.0 * comm / elapsed, 1e3 * (elapsed - total - comm) / steps,
           100.0 * (elapsed - total - comm) / elapsed);
    /* then the same time by op, the slowest first: which op of a category takes it */
    printf("profile by op (rank 0, ms/step, calls/step):");
    print_ops(be->prof_ops, be->n_prof_ops, CT_PROF_OPS_MAX, 2, steps);
}

/* log.device_idle's line: the stream's time between ops and in them (backend.h, ct_backend_idle),
 * and the ops whose start it waited for longest, the longest first. */
static void print_idle(const ct_backend *be, double steps) {
    const double span = be->idle_busy + be->idle_gaps;
    printf("device idle (rank 0, ms/step): %.3f between ops, %.3f in ops (%.1f%% idle), %.0f "
           "ops/step; waited longest before:",
           1e3 * be->idle_gaps / steps, 1e3 * be->idle_busy / steps,
           span > 0 ? 100.0 * be->idle_gaps / span : 0.0, (double)be->idle_n_ops / steps);
    print_ops(be->idle_by_op, be->n_idle_by_op, 5, 3, steps);
    /* the time in ops by op, on the device's clock with nothing synced: --profile's by-op line
     * without the waits that inflate the small ops */
    printf("device busy by op (rank 0, ms/step, calls/step):");
    print_ops(be->busy_by_op, be->n_busy_by_op, CT_PROF_OPS_MAX, 3, steps);
    /* and the GEMM ops' by shape: "OP MxNxK TT AB>C[ acc]", TT the transposes of A and B (N or
     * T), acc where the product adds onto C (scripts/gemm_peer.py reads this line) */
    if (be->n_busy_by_gemm == 0) return;
    int order[CT_GEMM_SHAPES_MAX];
    order_by_seconds(&be->busy_by_gemm[0].seconds, sizeof be->busy_by_gemm[0], be->n_busy_by_gemm,
                     order);
    printf("device busy by GEMM shape (rank 0, ms/step, calls/step):");
    for (int i = 0; i < be->n_busy_by_gemm; i++) {
        const struct ct_gemm_shape *g = &be->busy_by_gemm[order[i]];
        printf("%s %s %lldx%lldx%lld %c%c %s>%s%s %.3f (%.0f)", i ? " |" : "", g->op,
               (long long)g->M, (long long)g->N, (long long)g->K, g->trans_a ? 'T' : 'N',
               g->trans_b ? 'T' : 'N', ct_dtype_name(g->ab), ct_dtype_name(g->c),
               g->accumulate ? " acc" : "", 1e3 * g->seconds / steps, (double)g->calls / steps);
    }
    printf("\n");
}

/* "layers.3-5, 1.2 MiB": the unit with the most elements (parallel.bucket_mb merges layers). */
static const char *largest_unit(const ct_model *m, char *buf, size_t n) {
    int best = 0;
    for (int u = 1; u < ct_model_n_units(m); u++)
        if (ct_model_unit(m, u)->padded_numel > ct_model_unit(m, best)->padded_numel) best = u;
    char size[32];
    ct_format_bytes(size, sizeof size,
                    (double)ct_model_unit(m, best)->padded_numel * sizeof(float));
    snprintf(buf, n, "%s, %s", ct_model_unit(m, best)->name, size);
    return buf;
}

/* Rank 0's start-up report, from the constants start_run fixed. */
void ct_report_start(const trainer *t) {
    const ct_config *cfg = t->cfg;
    ct_pctx *p = t->pctx;
    printf("model: %s, %lld layers, d_model %lld, %lld heads (%lld key/value), d_ff %lld, seq_len "
           "%lld, vocab %lld (padded %lld), LM head %s, %.2fM parameters\n",
           cfg->model.arch == CT_ARCH_LLAMA ? "llama" : "gpt2", (long long)cfg->model.n_layer,
           (long long)cfg->model.d_model, (long long)cfg->model.n_head,
           (long long)cfg->derived.n_kv_head, (long long)cfg->derived.d_ff,
           (long long)cfg->model.seq_len, (long long)cfg->model.vocab_size,
           (long long)cfg->derived.vocab_padded,
           cfg->model.tie_embeddings ? "tied to the embedding" : "untied",
           (double)cfg->derived.n_params / 1e6);
    const ct_model_config *mc = &cfg->model;
    if (mc->moe_experts) {
        char shared[48] = "";
        if (mc->moe_shared)
            snprintf(shared, sizeof shared, " and %lld shared", (long long)mc->moe_shared);
        char bias[64] = "";
        if (mc->moe_bias_rate > 0)
            snprintf(bias, sizeof bias, ", bias balancing rate %g", mc->moe_bias_rate);
        printf(
            "moe: %lld of %lld layers route each token to %lld of %lld experts%s (width %lld, "
            "%s router); balancing loss alpha %g%s%s; ep %d: %lld experts a layer on each rank\n",
            (long long)ct_moe_layer_count(mc), (long long)mc->n_layer, (long long)mc->moe_top_k,
            (long long)mc->moe_experts, shared, (long long)cfg->derived.moe_d_ff,
            ct_moe_router_names[mc->moe_router], mc->moe_aux_alpha,
            mc->moe_z_alpha > 0 ? ", z-loss on" : "", bias, p->ep,
            (long long)(mc->moe_experts / p->ep));
    }
    if (p->world_size > 1) ct_pctx_print(p, stdout);
    printf("data: %lld train samples (%lld tokens); global batch %lld = micro_batch %lld%s x "
           "grad_accum %lld x dp %d; %.0f tokens/step\n",
           (long long)ct_dataset_n_samples(t->train_data),
           (long long)ct_dataset_n_tokens(t->train_data), (long long)cfg->train.global_batch,
           (long long)cfg->train.micro_batch,
           cfg->train.micro_batch_auto ? " (auto: the largest that divides global_batch/dp within "
                                         "8192 tokens)"
                                       : "",
           (long long)cfg->derived.grad_accum, t->dp_size, t->tokens_per_step);
    if (cfg->derived.warmup_asked)
        printf("note: train.warmup_steps=%lld is longer than the run: the learning rate warms up "
               "over all %lld steps\n",
               (long long)cfg->derived.warmup_asked, (long long)cfg->train.steps);
    char what[128];
    ct_backend_describe(t->be, what, sizeof what);
    printf("backend: %s per rank, %d ranks; per rank: hardware peak in %s %.1f GFLOP/s "
           "(%s), GEMM rate at the model's MLP shape %.1f GFLOP/s (%s, measured)\n",
           what, p->world_size, ct_dtype_name(ct_model_dtype(t->model)), t->hw_peak / 1e9,
           t->peak_how, t->gemm_rate / 1e9, ct_dtype_name(ct_model_dtype(t->model)));
    const ct_state_bytes sb = ct_dp_state_bytes(t->dp);
    printf("precision: %s (%s): bytes per parameter: params %zu + grads %zu + master %zu + "
           "optimizer %zu = %zu; dp gradient reduction in %s\n",
           cfg->derived.precision == CT_PRECISION_BF16 ? "bf16 mixed" : "fp32",
           cfg->derived.precision_why, sb.params, sb.grads, sb.master, sb.optim,
           sb.params + sb.grads + sb.master + sb.optim, sb.reduce == 2 ? "bf16" : "fp32");
    print_memory(t->be);
    const size_t moe = ct_acts_moe_first_step_bytes(t->model, cfg->train.micro_batch);
    if (moe) { /* the MoE layers' buffers hold routed rows, so they are sized by the first step */
        char more[32], total[32];
        ct_format_bytes(more, sizeof more, (double)moe);
        ct_format_bytes(total, sizeof total, (double)(ct_backend_mem_total(t->be) + moe));
        printf("memory in the steps (rank 0): %s = the above + acts %s that the MoE layers' routed "
               "rows take at the first step (uniform routing%s)\n",
               total, more, p->ep > 1 ? "; a rank that receives more rows takes more" : "");
    }
    size_t expected[CT_MEM_COUNT];
    ct_dp_expected_memory(t->dp, expected);
    char a[32], b[32], c[32], d[32], unit[96];
    ct_format_bytes(a, sizeof a, (double)expected[CT_MEM_PARAMS]);
    ct_format_bytes(b, sizeof b, (double)expected[CT_MEM_GRADS]);
    ct_format_bytes(c, sizeof c, (double)expected[CT_MEM_OPTIM]);
    ct_format_bytes(d, sizeof d, (double)expected[CT_MEM_MASTER]);
    printf("zero stage %lld over dp %d: expected params %s, grads %s, optim %s, master %s per "
           "rank; %d units on rank 0 (largest %s)\n",
           (long long)cfg->parallel.zero_stage, t->dp_size, a, b, c, d, ct_model_n_units(t->model),
           largest_unit(t->model, unit, sizeof unit));
    if (t->dp_size > 1) {
        ct_format_bytes(a, sizeof a,
                        ct_dp_expected_step_bytes(t->dp, (int)cfg->derived.grad_accum));
        ct_format_bytes(b, sizeof b, (double)ct_dp_param_bytes(t->dp));
        printf("dp traffic per step per rank (ring model): %s expected (phi = %s)\n", a, b);
    }
    fflush(stdout);
}

/* The first metrics line of a segment: where it starts, the run's shape, the measured rates,
 * memory by category after setup next to the ZeRO formula (tests compare them). */
void ct_report_setup_metrics(trainer *t) {
    const ct_config *cfg = t->cfg;
    ct_metrics *m = t->metrics;
    size_t mem[CT_MEM_COUNT], expected[CT_MEM_COUNT];
    ct_backend_mem_snapshot(t->be, mem);
    ct_dp_expected_memory(t->dp, expected);
    ct_metrics_begin(m);
    ct_metrics_bool(m, "setup", true);
    ct_metrics_int(m, "start_step", t->first_step + 1);
    ct_metrics_str(m, "resumed_from", t->resumed_from);
    if (t->local_restore.step >= 0) { /* gathered from the nodes' local checkpoints */
        ct_metrics_int(m, "local_restore_step", t->local_restore.step);
        ct_metrics_int(m, "local_restore_from_partners", t->local_restore.from_partners);
    }
    ct_metrics_str(m, "job", ct_mpi_job_id());
    ct_metrics_int(m, "world", t->pctx->world_size);
    ct_metrics_int(m, "dp", t->dp_size);
    ct_metrics_int(m, "zero_stage", cfg->parallel.zero_stage);
    ct_metrics_int(m, "steps", cfg->train.steps);
    ct_metrics_num(m, "lr", "%.9g", cfg->train.lr);
    ct_metrics_int(m, "n_layer", cfg->model.n_layer);
    ct_metrics_int(m, "tokens_per_step", cfg->derived.tokens_per_step);
    ct_metrics_int(m, "micro_batch", cfg->train.micro_batch);
    ct_metrics_bool(m, "micro_batch_auto", cfg->train.micro_batch_auto);
    ct_metrics_int(m, "units", ct_model_n_units(t->model));
    ct_metrics_num(m, "peak_flops_per_s", "%.6e", t->hw_peak);
    ct_metrics_num(m, "gemm_flops_per_s", "%.6e", t->gemm_rate);
    for (int c = 0; c < CT_MEM_COUNT; c++) {
        char key[48];
        snprintf(key, sizeof key, "mem_%s", ct_mem_category_name((ct_mem_category)c));
        ct_metrics_uint(m, key, mem[c]);
    }
    ct_metrics_uint(m, "mem_expected_params", expected[CT_MEM_PARAMS]);
    ct_metrics_uint(m, "mem_expected_grads", expected[CT_MEM_GRADS]);
    ct_metrics_uint(m, "mem_expected_optim", expected[CT_MEM_OPTIM]);
    ct_metrics_uint(m, "mem_expected_master", expected[CT_MEM_MASTER]);
    ct_metrics_str(m, "precision", ct_dtype_name(ct_model_dtype(t->model)));
    ct_metrics_end(m);
}

void ct_report_remeasured_metrics(trainer *t, int64_t step) {
    ct_metrics *m = t->metrics;
    ct_metrics_begin(m);
    ct_metrics_bool(m, "remeasured", true);
    ct_metrics_int(m, "from_step", step);
    ct_metrics_num(m, "peak_flops_per_s", "%.6e", t->hw_peak);
    ct_metrics_num(m, "gemm_flops_per_s", "%.6e", t->gemm_rate);
    ct_metrics_end(m);
}

void ct_report_step_metrics(trainer *t, const step_stats *s) {
    ct_metrics *m = t->metrics;
    double tok_per_s = t->tokens_per_step / s->seconds;
    double achieved = t->flops_per_token * tok_per_s; /* this rank's FLOP/s */
    ct_metrics_begin(m);
    ct_metrics_int(m, "step", s->step + 1);
    ct_metrics_num(m, "loss", "%.9g", s->loss);
    ct_metrics_num(m, "lr", "%.6e", s->lr);
    ct_metrics_num(m, "grad_norm", "%.6f", s->grad_norm);
    ct_metrics_num(m, "tokens_per_s", "%.1f", tok_per_s);
    ct_metrics_num(m, "step_time_s", "%.4f", s->seconds);
    if (t->cfg->checkpoint.local_interval > 0) { /* the wait at the boundaries since the last */
        ct_metrics_num(m, "local_save_s", "%.4f", t->local_stall_s);
        t->local_stall_s = 0.0;
    }
    ct_metrics_num(m, "exposed_comm_s", "%.4f", s->exposed);
    ct_metrics_num(m, "bubble_s", "%.4f", s->bubble);
    ct_metrics_num(m, "mfu", "%.6g", t->hw_peak > 0 ? achieved / t->hw_peak : 0.0);
    ct_metrics_num(m, "gemm_efficiency", "%.6g", t->gemm_rate > 0 ? achieved / t->gemm_rate : 0.0);
    ct_metrics_bool(m, "skipped", !s->finite);
    ct_metrics_uint(m, "dp_bytes", s->dp_bytes);
    ct_metrics_num(m, "dp_bytes_expected", "%.0f", t->dp_bytes_expected);
    ct_metrics_uint(m, "tp_bytes", s->tp_bytes);
    ct_metrics_num(m, "tp_bytes_expected", "%.0f", t->tp_bytes_expected);
    ct_metrics_uint(m, "cp_bytes", s->cp_bytes);
    ct_metrics_num(m, "cp_bytes_expected", "%.0f", t->cp_bytes_expected);
    ct_metrics_num(m, "cp_wait_s", "%.4f", s->cp_wait);
    ct_metrics_uint(m, "mem_bytes", ct_backend_mem_total(t->be));
    ct_metrics_int(m, "host_copies", s->host_copies);
    if (t->cfg->log.device_idle) {
        ct_metrics_num(m, "device_busy_s", "%.6f", s->device_busy);
        ct_metrics_num(m, "device_idle_s", "%.6f", s->device_idle);
    }
    if (t->cfg->model.moe_experts) {
        ct_metrics_num(m, "moe_aux_loss", "%.9g", s->moe_aux);
        if (t->cfg->model.moe_z_alpha > 0) ct_metrics_num(m, "moe_z_loss", "%.9g", s->moe_z);
        ct_metrics_uint(m, "ep_bytes", s->ep_bytes);
        ct_metrics_num(m, "moe_route_s", "%.6f", s->moe_route_s);
        ct_metrics_num(m, "moe_expert_gemm_s", "%.6f", s->moe_expert_s);
        ct_metrics_num(m, "moe_expert_gemm_flops_per_s", "%.6e",
                       s->moe_expert_s > 0 ? s->moe_expert_flops / s->moe_expert_s : 0.0);
        ct_metrics_num(m, "moe_load_min", "%.0f", s->moe_load_min);
        ct_metrics_num(m, "moe_load_mean", "%.6g", s->moe_load_mean);
        ct_metrics_num(m, "moe_load_max", "%.0f", s->moe_load_max);
        if (s->moe_load)
            ct_metrics_nums(m, "moe_tokens_per_expert", "%.0f", t->cfg->model.moe_experts,
                            s->moe_load);
        ct_metrics_num(m, "moe_imbalance", "%.6g",
                       s->moe_load_mean > 0 ? s->moe_load_max / s->moe_load_mean : 0.0);
        ct_metrics_num(m, "moe_layer_imbalance", "%.6g", s->moe_layer_imbalance);
        if (t->cfg->model.moe_bias_rate > 0) {
            float lo = 0.0f, hi = 0.0f; /* this rank's layers' biases */
            for (int l = 0; l < t->cfg->model.n_layer; l++) {
                const float *b = ct_model_moe_bias(t->model, l);
                for (int64_t e = 0; b && e < t->cfg->model.moe_experts; e++)
                    lo = CT_MIN(lo, b[e]), hi = CT_MAX(hi, b[e]);
            }
            ct_metrics_num(m, "moe_bias_min", "%.9g", lo);
            ct_metrics_num(m, "moe_bias_max", "%.9g", hi);
        }
    }
    if (t->stragglers_fresh) { /* a progress step: every rank's means over the interval */
        const int world = t->pctx->world_size;
        ct_metrics_nums(m, "rank_compute_s", "%.6f", world, t->rank_compute);
        ct_metrics_nums(m, "rank_wait_s", "%.6f", world, t->rank_wait);
        ct_metrics_int(m, "straggler_rank", t->straggler);
        if (t->straggler >= 0) ct_metrics_num(m, "straggler_ratio", "%.4f", t->straggler_ratio);
    }
    ct_metrics_end(m);
}

/* "42.0%" of rate over denominator; "  n/a" (false) when it would exceed 100%: a denominator
 * measured too low on a busy machine, even after measuring it again. */
static bool percent_of(char *buf, size_t n, double rate, double denominator) {
    if (denominator > 0 && rate > denominator) {
        snprintf(buf, n, "  n/a");
        return false;
    }
    snprintf(buf, n, "%4.1f%%", denominator > 0 ? 100.0 * rate / denominator : 0.0);
    return true;
}

/* Whether step (0-based) gets a progress line: every log.interval steps, the first and last. */
static bool progress_due(const trainer *t, int64_t step) {
    const ct_config *cfg = t->cfg;
    return (step + 1) % cfg->log.interval == 0 || step + 1 == cfg->train.steps ||
           step == t->first_step;
}

void ct_report_pipeline_costs(trainer *t, int64_t step) {
    if (!t->cfg->log.profile || !t->pipeline || !progress_due(t, step)) return;
    const ct_model_layout *layout = ct_model_layout_of(t->model);
    const int nc = t->pctx->pp * layout->n_chunks;
    ct_sim_costs mine[CT_MAX_CHUNKS];
    ct_pipeline_chunk_costs(t->pipeline, mine);
    /* every rank's chunks (each held by the world / pp ranks of its stage): sum and count */
    double *sum = ct_xcalloc((size_t)nc * 4, sizeof *sum);
    for (int j = 0; j < layout->n_chunks; j++) {
        double *c = sum + 4 * layout->chunks[j].index;
        c[0] = mine[j].f, c[1] = mine[j].b, c[2] = mine[j].w, c[3] = 1.0;
    }
    if (t->pctx->world_size > 1)
        ct_comm_allreduce(t->pctx->world, sum, nc * 4, CT_DTYPE_F64, CT_REDUCE_SUM);
    if (t->rank0) {
        ct_sim_costs *costs = ct_xcalloc((size_t)nc, sizeof *costs);
        printf("pipeline by chunk (ms per forward, input part, weight part; --costs for "
               "`cooktrain plan --schedule %s`): ",
               ct_schedule_kind_name(t->cfg->parallel.schedule));
        for (int c = 0; c < nc; c++) {
            const double *x = sum + 4 * c, k = x[3] > 0 ? x[3] : 1.0;
            costs[c] =
                (ct_sim_costs){.f = 1e3 * x[0] / k, .b = 1e3 * x[1] / k, .w = 1e3 * x[2] / k};
            printf("%s%.3f,%.3f,%.3f", c ? "/" : "", costs[c].f, costs[c].b, costs[c].w);
        }
        ct_sim_result r = ct_schedule_simulate_chunks(ct_pipeline_schedule(t->pipeline), costs);
        printf("\n             simulated with them: idle per rank");
        for (int q = 0; q < t->pctx->pp; q++) printf(" %.1f%%", 100 * r.bubble[q]);
        printf(" of %.1f ms\n", r.total_time);
        ct_sim_result_release(&r);
        free(costs);
    }
    free(sum);
}

double ct_report_comm_seconds(const trainer *t) {
    double sum = 0.0;
    const int n = (int)CT_ARRAY_LEN(t->groups);
    for (int g = 0; g < n; g++) {
        bool seen = false; /* groups of size 1 may share one object */
        for (int h = 0; h < g && !seen; h++) seen = t->groups[h] == t->groups[g];
        if (t->groups[g] && !seen) sum += t->groups[g]->seconds;
    }
    return sum;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void ct_report_stragglers(trainer *t, const step_stats *s) {
    const double wait = ct_report_comm_seconds(t) - t->comm_at_step;
    t->strag_compute += CT_MAX(0.0, s->seconds - wait);
    t->strag_wait += wait;
    t->strag_steps++;
    t->stragglers_fresh = false;
    const int world = t->pctx->world_size;
    if (world < 2 || !progress_due(t, s->step)) return;
    const double mine[2] = {t->strag_compute / (double)t->strag_steps,
                            t->strag_wait / (double)t->strag_steps};
    double *all = ct_xmalloc((size_t)world * 2 * sizeof *all);
    ct_comm_allgather(t->pctx->world, mine, all, 2 * world, CT_DTYPE_F64);
    t->strag_compute = t->strag_wait = 0.0;
    t->strag_steps = 0;
    if (t->rank0) {
        if (!t->rank_compute) {
            t->rank_compute = ct_xcalloc((size_t)world, sizeof *t->rank_compute);
            t->rank_wait = ct_xcalloc((size_t)world, sizeof *t->rank_wait);
            t->slow_in_a_row = ct_xcalloc((size_t)world, sizeof *t->slow_in_a_row);
        }
        double *sorted = ct_xmalloc((size_t)world * sizeof *sorted);
        for (int r = 0; r < world; r++) {
            t->rank_compute[r] = sorted[r] = all[2 * r];
            t->rank_wait[r] = all[2 * r + 1];
        }
        qsort(sorted, (size_t)world, sizeof *sorted, cmp_double);
        const double median =
            world % 2 ? sorted[world / 2] : 0.5 * (sorted[world / 2 - 1] + sorted[world / 2]);
        const double limit = median * (1.0 + t->cfg->log.straggler_pct / 100.0);
        t->straggler = -1;
        t->straggler_ratio = 0.0;
        for (int r = 0; r < world; r++) {
            t->slow_in_a_row[r] = t->rank_compute[r] > limit ? t->slow_in_a_row[r] + 1 : 0;
            const double ratio = median > 0 ? t->rank_compute[r] / median : 0.0;
            if (t->slow_in_a_row[r] >= t->cfg->log.straggler_intervals &&
                ratio > t->straggler_ratio)
                t->straggler = r, t->straggler_ratio = ratio;
        }
        t->straggler_median = median;
        t->stragglers_fresh = true;
        free(sorted);
    }
    free(all);
}

/* Rank 0's progress line every log.interval steps (and the first and last), with the profile
 * when log.profile asks for it. */
void ct_report_progress(trainer *t, const step_stats *s) {
    const ct_config *cfg = t->cfg;
    const int64_t step = s->step;
    if (!t->rank0 || !progress_due(t, step)) return;
    double elapsed = ct_now() - t->interval_start;
    double steps = t->interval_tokens / t->tokens_per_step;
    double tok_s = t->interval_tokens / elapsed, rate = t->flops_per_token * tok_s;
    char mem[32], eta[32];
    ct_format_bytes(mem, sizeof mem, (double)ct_backend_mem_total(t->be));
    format_duration(eta, sizeof eta,
                    (double)(cfg->train.steps - step - 1) * (ct_now() - t->run_start) /
                        (double)(step + 1 - t->first_step));
    char mfu[16], eff[16];
    bool shown = percent_of(mfu, sizeof mfu, rate, t->hw_peak);
    shown = percent_of(eff, sizeof eff, rate, t->gemm_rate) && shown;
    if (!shown && !t->said_unmeasurable) {
        printf("note: from step %lld the steps run faster than the peak or GEMM rate measured "
               "(%d times): this machine is too busy to measure them, so MFU or GEMM eff is not "
               "shown where it would exceed 100%%\n",
               (long long)step + 1, t->remeasured + 1);
        t->said_unmeasurable = true;
    }
    printf("step %5lld/%lld | loss %.4f | lr %.2e | gnorm %6.3f | %7.0f tok/s | "
           "MFU %s | GEMM eff %s | compute %.0f ms, comm %.0f ms, bubble %.0f ms "
           "| mem %s | ETA %s\n",
           (long long)step + 1, (long long)cfg->train.steps, s->loss, s->lr, s->grad_norm, tok_s,
           mfu, eff, 1e3 * (elapsed - t->interval_exposed - t->interval_bubble) / steps,
           1e3 * t->interval_exposed / steps, 1e3 * t->interval_bubble / steps, mem, eta);
    if (t->stragglers_fresh && t->straggler >= 0) {
        const int r = t->straggler;
        printf("             straggler: rank %d (host %d) ran %.2fx the median outside "
               "communication (%.1f vs %.1f ms a step) for %lld progress lines in a row "
               "(log.straggler_pct %g)\n",
               r, ct_mpi_host_of(r), t->straggler_ratio, 1e3 * t->rank_compute[r],
               1e3 * t->straggler_median, (long long)t->slow_in_a_row[r], cfg->log.straggler_pct);
    }
    if (cfg->model.moe_experts && s->moe_load_mean > 0)
        printf("             moe: balancing loss %.5f | tokens per expert min %.0f mean %.1f max "
               "%.0f (imbalance %.2f)\n",
               s->moe_aux, s->moe_load_min, s->moe_load_mean, s->moe_load_max,
               s->moe_load_max / s->moe_load_mean);
    if (cfg->log.profile) {
        const int n_groups = (int)CT_ARRAY_LEN(t->groups);
        print_profile(t->be, t->groups, n_groups, ct_now() - t->profile_start, steps);
        ct_backend_profile(t->be, true);
        for (int g = 0; g < n_groups; g++)
            if (t->groups[g]) t->groups[g]->seconds = 0.0;
        t->profile_start = ct_now();
    }
    if (cfg->log.device_idle) {
        print_idle(t->be, steps);
        ct_backend_idle(t->be, true);
    }
    fflush(stdout);
    t->interval_start = ct_now();
    t->interval_tokens = t->interval_exposed = t->interval_bubble = 0;
}
