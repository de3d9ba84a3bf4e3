/* trainer.c — the training loop over the data-parallel group. See trainer.h. */
#include "trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/data/data.h"
#include "core/comm/flight.h"
#include "core/backend/gemm_bench.h"
#include "core/metrics.h"
#include "core/model/model.h"
#include "core/model/optim.h"
#include "core/model/ring_attention.h"
#include "core/rng.h"
#include "core/data/tokenizer.h"
#include "parallel/checkpoint_io.h"
#include "parallel/data_parallel.h"
#include "parallel/param_stream.h"
#include "parallel/pipeline.h"
#include "parallel/plan.h"
#include "cmd/generate/sampler.h"

static void trainer_free(trainer *t) {
    ct_ckpt_save_abandon(t->pending); /* only after a failure: a save ends before the run does */
    ct_ckpt_local_abandon(t->local);
    ct_ckpt_release();
    ct_backend_graph_free(t->be, t->graph);
    ct_tensor_free(t->graph_inputs);
    ct_tensor_free(t->graph_targets);
    ct_grad_scratch_free(t->scratch);
    ct_acts_free(t->acts);
    ct_pipeline_free(t->pipeline);
    ct_dp_free(t->dp);
    ct_model_free(t->model);
    ct_dataset_free(t->train_data);
    ct_dataset_free(t->val_data);
    free(t->step_inputs);
    free(t->step_targets);
    free(t->cp_scratch);
    free(t->moe_trace);
    free(t->moe_load);
    free(t->step_spans);
    free(t->rank_compute);
    free(t->rank_wait);
    free(t->slow_in_a_row);
    ct_tokenizer_free(t->tokenizer);
    ct_metrics_free(t->metrics);
    if (t->own_pctx) ct_pctx_free(t->pctx);
}

/* SIGTERM or SIGUSR1 (what SLURM sends before a time limit or a preemption): the signal number,
 * agreed on at the next step boundary; the run then saves a checkpoint and ends (exit 0). */
static volatile sig_atomic_t stop_signal_seen;
/* Set once ct_train_run's steps and final saves are over, whatever the status: a SIGTERM after
 * that is the launcher tearing down a job whose ranks have already agreed to end (mpirun stops
 * the others when one exits non-zero), not a hang, so it leaves no flight record and no message
 * beside the run's own. */
static volatile sig_atomic_t run_over;

static void on_stop_signal(int sig) {
    stop_signal_seen = sig;
    /* a hung job's ranks get SIGTERM: keep a record */
    if (sig == SIGTERM && !run_over) ct_flight_signal(sig);
}

static void catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    /* A peer that died (its host lost) closes its sockets: a write to one fails with EPIPE,
     * which the communication layer reports, instead of killing this rank with SIGPIPE, which
     * leaves no record and made mpirun's report name this rank, not the one that died. */
    signal(SIGPIPE, SIG_IGN);
}

/* Every rank gets the worst status of all (core/README.md, Errors); one process needs no
 * agreement. */
static ct_status agree(trainer *t, ct_status st) {
    return ct_pctx_agree(t->pctx, st);
}

/* The same, once per step: one small allreduce on the world group (watchdog-guarded) when all
 * is well, the message exchange only when some rank failed. */
static ct_status step_agree(trainer *t, ct_status st) {
    /* The same allreduce carries the stop request (SIGTERM / SIGUSR1 on any rank), so every
     * rank stops after the same step. */
    t->stop_signal = stop_signal_seen;
    /* ... and whether an asynchronous checkpoint is still being written on some rank */
    int32_t unwritten = t->pending && !ct_ckpt_save_written(t->pending);
    t->pending_written = t->pending && !unwritten;
    /* ... and whether a local checkpoint is (its transfers and files) */
    int32_t local_unwritten = t->local && !ct_ckpt_local_progress(t->local, false);
    t->local_written = t->local && !local_unwritten;
    if (t->pctx->world_size == 1) return st;
    int32_t flags[4] = {st != CT_OK, t->stop_signal, unwritten, local_unwritten};
    ct_comm_allreduce(t->pctx->world, flags, 4, CT_DTYPE_I32, CT_REDUCE_MAX);
    t->stop_signal = flags[1];
    t->pending_written = t->pending && !flags[2];
    t->local_written = t->local && !flags[3];
    return flags[0] ? ct_mpi_agree(st) : CT_OK;
}

/* Files and settings every rank checks for itself: data, tokenizer, metrics. */
static ct_status open_inputs(trainer *t) {
    const ct_config *cfg = t->cfg;
    if (!cfg->data.train[0]) {
        ct_error(CT_ERR_INPUT, "data.train is not set (is --config missing?)");
        ct_hint("start from a ready config, e.g. `cooktrain train --config configs/tiny.yaml`, or "
                "set data.train to a token shard path or glob such as data/fortunes/train.bin "
                "(make one with `cooktrain prepare`)");
        return CT_ERR_INPUT;
    }
    CT_TRY(ct_dataset_open(&t->train_data, cfg->data.train, cfg->model.seq_len,
                           cfg->model.vocab_size, cfg->train.seed));
    if (cfg->train.eval_interval > 0) {
        if (!cfg->data.val[0]) {
            ct_error(CT_ERR_INPUT, "train.eval_interval=%lld but data.val is not set",
                     (long long)cfg->train.eval_interval);
            ct_hint("set data.val to a validation shard, or train.eval_interval=0");
            return CT_ERR_INPUT;
        }
        CT_TRY(ct_dataset_open(&t->val_data, cfg->data.val, cfg->model.seq_len,
                               cfg->model.vocab_size, cfg->train.seed));
    }
    if (cfg->log.sample_tokens > 0 && cfg->data.tokenizer[0]) {
        /* Loaded now, not after training, so a bad tokenizer file costs no training time. */
        CT_TRY(ct_tokenizer_load(&t->tokenizer, cfg->data.tokenizer));
        /* a byte-level tokenizer (no merges) may stand beside a smaller vocabulary, when the
         * text held no bytes above it: sampling checks the prompt */
        bool bytes_only = ct_tokenizer_vocab_size(t->tokenizer) == 256;
        if (!bytes_only && ct_tokenizer_vocab_size(t->tokenizer) > cfg->model.vocab_size) {
            ct_error(CT_ERR_INPUT, "tokenizer '%s' has %d tokens but model.vocab_size is %lld",
                     cfg->data.tokenizer, ct_tokenizer_vocab_size(t->tokenizer),
                     (long long)cfg->model.vocab_size);
            ct_hint("set model.vocab_size to at least %d, or use the tokenizer the shards were "
                    "made with",
                    ct_tokenizer_vocab_size(t->tokenizer));
            return CT_ERR_INPUT;
        }
        int32_t *prompt = NULL;
        const char *text = cfg->log.sample_prompt;
        size_t n = ct_tokenizer_encode(t->tokenizer, (const uint8_t *)text, strlen(text), &prompt);
        int32_t top = 0;
        for (size_t i = 0; i < n; i++) top = CT_MAX(top, prompt[i]);
        free(prompt);
        if (top >= cfg->model.vocab_size) {
            ct_error(CT_ERR_INPUT,
                     "log.sample_prompt holds token %d, outside model.vocab_size %lld", top,
                     (long long)cfg->model.vocab_size);
            ct_hint("leave bytes the training text does not hold out of log.sample_prompt");
            return CT_ERR_INPUT;
        }
    }
    /* log.run_dir collects the run's outputs: the resolved config (write_run_config), and the
     * metrics unless log.metrics names another file — opened to append, so that nothing is
     * written to either before the run has started. */
    char metrics[CT_PATH_MAX + 32];
    snprintf(metrics, sizeof metrics, "%s", cfg->log.metrics);
    if (cfg->log.run_dir[0] && t->rank0 && !metrics[0])
        snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", cfg->log.run_dir);
    /* the last step the runs before logged: a restart says what it runs again */
    if (metrics[0] && t->rank0) t->last_logged_step = ct_metrics_last_step(metrics);
    if (metrics[0] && t->rank0) CT_TRY(ct_metrics_open(&t->metrics, metrics));
    return CT_OK;
}

/* Whether files a and b hold the same bytes (false when either cannot be read). */
static bool same_bytes(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = getc(fa), cb = getc(fb);
        same = ca == cb;
        if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* log.run_dir/config.yaml: the resolved config of the segment that started last, written once
 * it has (a start that fails leaves the previous one); a resume with another config keeps the
 * previous one as config-to-step-S.yaml, S the step it had reached. */
static ct_status write_run_config(trainer *t) {
    const ct_config *cfg = t->cfg;
    if (!cfg->log.run_dir[0] || !t->rank0) return CT_OK;
    char path[CT_PATH_MAX + 32], tmp[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.yaml", cfg->log.run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CT_TRY(ct_mkdir_parents(path));
    FILE *f = fopen(tmp, "w");
    if (!f) {
        ct_error(CT_ERR_INPUT, "cannot write '%s' in log.run_dir: %s", path, strerror(errno));
        ct_hint("check that log.run_dir is a writable directory");
        return CT_ERR_INPUT;
    }
    ct_config_print(cfg, f);
    bool written = fflush(f) == 0 && !ferror(f);
    if (fclose(f) != 0 || !written) {
        ct_error(CT_ERR_RUNTIME, "cannot write '%s' in log.run_dir: %s", path, strerror(errno));
        ct_hint("check free space in log.run_dir");
        unlink(tmp);
        return CT_ERR_RUNTIME;
    }
    if (t->first_step > 0 && !same_bytes(path, tmp)) {
        char kept[CT_PATH_MAX + 64];
        snprintf(kept, sizeof kept, "%s/config-to-step-%lld.yaml", cfg->log.run_dir,
                 (long long)t->first_step);
        if (rename(path, kept) != 0 && errno != ENOENT) {
            ct_error(CT_ERR_RUNTIME, "cannot keep '%s' as '%s': %s", path, kept, strerror(errno));
            ct_hint("check log.run_dir's permissions");
            unlink(tmp);
            return CT_ERR_RUNTIME;
        }
    }
    if (rename(tmp, path) != 0) {
        ct_error(CT_ERR_RUNTIME, "cannot write '%s': %s", path, strerror(errno));
        ct_hint("check log.run_dir's permissions");
        unlink(tmp);
        return CT_ERR_RUNTIME;
    }
    return CT_OK;
}

/* Model, data-parallel state and activations: out of memory is the only way these fail. */
static ct_status build_model(trainer *t) {
    const ct_config *cfg = t->cfg;
    ct_model_layout layout = ct_model_layout_pipeline(cfg, t->pctx->pp_rank);
    layout.tp = t->pctx->tp_comm;
    layout.tp_rank = t->pctx->tp_rank;
    layout.tp_size = t->pctx->tp;
    layout.sequence_parallel = cfg->parallel.sequence_parallel;
    layout.recompute = cfg->train.recompute == CT_RECOMPUTE_FULL;
    layout.dp_size = t->replicas;
    layout.cp = t->pctx->cp_comm;
    layout.cp_rank = t->pctx->cp_rank;
    layout.cp_size = t->pctx->cp;
    layout.cp_zigzag = cfg->parallel.cp_sharding == CT_CP_ZIGZAG;
    layout.ep = t->pctx->ep_comm;
    layout.ep_rank = t->pctx->ep_rank;
    layout.ep_size = t->pctx->ep;
    layout.edp = t->pctx->ep > 1 ? t->pctx->edp_comm : NULL;
    layout.zero = ct_zero_layout_of(cfg->parallel.zero_stage);
    layout.unit_min_bytes = ct_config_unit_min_bytes(cfg);
    CT_TRY(ct_model_new(&t->model, cfg, t->be, &layout));
    CT_TRY(ct_dp_new(&t->dp, t->model, t->pctx->dpcp_comm, &cfg->train,
                     ct_precision_dtype(cfg->parallel.grad_reduce_dtype)));
    if (t->pctx->pp > 1) {
        return ct_pipeline_new(&t->pipeline, t->model, t->dp, t->pctx, cfg->parallel.schedule,
                               (int)cfg->derived.grad_accum, cfg->train.micro_batch);
    }
    CT_TRY(ct_acts_new(&t->acts, t->model, cfg->train.micro_batch));
    CT_TRY(ct_grad_scratch_new(&t->scratch, t->model, cfg->train.micro_batch));
    return CT_OK;
}

/* Reads this rank's share of one global batch — samples [first, first + G/dp) of `ds`, every
 * token checked — into the step buffers, then agrees with every rank before any collective of
 * the step runs: a corrupt sample on one rank ends all of them (exit 2), nobody hangs. Rank 0
 * also brings in a failed metrics write from the step before. */
/* Context parallelism: each of the n sequences of buf (seq_len tokens each) cut to this rank's
 * T_local positions (ring_attention.h: two chunks, zigzag or contiguous), in place. Inputs and
 * targets are cut alike, so every target stays the token after its input's global position. */
static void cut_to_cp_rank(trainer *t, int32_t *buf, int64_t n) {
    const ct_pctx *p = t->pctx;
    const int64_t T = t->cfg->model.seq_len, Tl = t->T_local;
    const bool zigzag = t->cfg->parallel.cp_sharding == CT_CP_ZIGZAG;
    memcpy(t->cp_scratch, buf, (size_t)(n * T) * sizeof(int32_t));
    for (int64_t s = 0; s < n; s++)
        ct_cp_cut(p->cp, p->cp_rank, zigzag, Tl, t->cp_scratch + s * T, buf + s * Tl);
}

static ct_status read_batch(trainer *t, ct_dataset *ds, int64_t first) {
    const int64_t per_rank = t->cfg->train.global_batch / t->dp_size;
    ct_status st = ct_dataset_fill(ds, first, per_rank, t->step_inputs, t->step_targets);
    if (st == CT_OK && t->pctx->cp > 1) {
        cut_to_cp_rank(t, t->step_inputs, per_rank);
        cut_to_cp_rank(t, t->step_targets, per_rank);
    }
    if (st == CT_OK) st = ct_metrics_status(t->metrics);
    return step_agree(t, st);
}

/* Microbatch mb of the step buffers (host, B·T_local each). */
static void microbatch_tokens(trainer *t, int mb, const int32_t **tokens, const int32_t **targets) {
    int64_t n = t->cfg->train.micro_batch * t->T_local;
    *tokens = t->step_inputs + mb * n;
    *targets = t->step_targets + mb * n;
}

/* The pipeline's batch callback: microbatch mb of the step buffers. */
static void fill_batch(void *ctx, int mb, int32_t *tokens, int32_t *targets) {
    trainer *t = ctx;
    const int32_t *in, *tg;
    microbatch_tokens(t, mb, &in, &tg);
    size_t bytes = (size_t)(t->cfg->train.micro_batch * t->T_local) * sizeof(int32_t);
    memcpy(tokens, in, bytes);
    memcpy(targets, tg, bytes);
}

/* The grad_accum microbatches in a loop (no pipeline): forward, and backward when training, each
 * microbatch's tokens from the step buffers on the host, or (from_device) from their copies in
 * graph_inputs / graph_targets (train.cuda_graph, graph_step). The loss is not read. */
static void issue_microbatches(trainer *t, bool train, float dloss, bool from_device) {
    const int accum = (int)t->cfg->derived.grad_accum;
    const int64_t n = t->cfg->train.micro_batch * t->T_local;
    for (int mb = 0; mb < accum; mb++) {
        if (train) ct_dp_begin_microbatch(t->dp, mb);
        if (from_device) {
            ct_tensor *in = ct_tensor_view_1d(t->graph_inputs, mb * n, n);
            ct_tensor *tg = ct_tensor_view_1d(t->graph_targets, mb * n, n);
            ct_acts_set_batch_device(t->acts, mb, in, tg);
            ct_tensor_free(in), ct_tensor_free(tg);
        } else {
            const int32_t *in, *tg;
            microbatch_tokens(t, mb, &in, &tg);
            ct_acts_set_batch(t->acts, mb, in, tg);
        }
        ct_model_forward(t->model, t->acts, train ? dloss : 0.0f);
        if (train) ct_model_backward(t->model, t->acts, t->scratch);
    }
}

/* One batch of this rank's grad_accum microbatches (the step buffers), through the pipeline or
 * in a loop: forward, and backward when training. Returns the summed loss of the microbatches
 * whose head ran here, read from the backend once, at the end. */
static double run_microbatches(trainer *t, bool train, float dloss) {
    if (t->pipeline) return ct_pipeline_run(t->pipeline, train, dloss, fill_batch, t);
    ct_model_begin_losses(t->model, (int)t->cfg->derived.grad_accum, t->cfg->train.micro_batch);
    issue_microbatches(t, train, dloss, false);
    return ct_model_loss_sum(t->model);
}

/*
 * train.cuda_graph: the step's forward and backward (ct_dp_begin_step to ct_dp_finish_backward,
 * every microbatch) captured once in a graph and then issued by one launch a step. What the
 * graph cannot hold stays outside it: the step's tokens go to the device first (graph_inputs,
 * graph_targets, which the captured microbatches copy from), the loss is read after it, and the
 * gradient norm and the optimizer (whose learning rate and clip scale change every step) follow.
 * The host's part of the step is not replayed, so the graph holds only a step whose host work
 * is the same every time (config_validate.c, check_cuda_graph: one process, no MoE routing, no
 * per-op timing). The run's first step runs eagerly and sizes every workspace, so the capture
 * at its second allocates nothing; a device free later (an evaluation's, a workspace's growth)
 * may leave an address in the graph dangling, and the backend then refuses the launch: the step
 * is captured again.
 */
static ct_status graph_buffers(trainer *t, int64_t n) {
    if (!ct_backend_can_capture(t->be)) {
        ct_error(CT_ERR_INPUT, "train.cuda_graph is on, but the %s backend cannot capture a graph",
                 t->be->iface->name);
        ct_hint("CT_CHECK_BACKEND=1 checks each op on the host as it is issued, which a graph's "
                "launch skips: run one or the other");
        return CT_ERR_INPUT;
    }
    t->graph_inputs = ct_tensor_new_1d(t->be, CT_DTYPE_I32, n, CT_MEM_ACTS);
    t->graph_targets = ct_tensor_new_1d(t->be, CT_DTYPE_I32, n, CT_MEM_ACTS);
    return t->graph_inputs && t->graph_targets ? CT_OK : CT_ERR_RUNTIME;
}

/* The step's forward and backward from graph_inputs / graph_targets, as train_step issues them
 * (after ct_model_begin_losses; the loss is not read). */
static void issue_step(trainer *t) {
    ct_dp_begin_step(t->dp, (int)t->accum);
    issue_microbatches(t, true, t->dloss, true);
    ct_dp_finish_backward(t->dp);
}

/* One step's forward and backward under train.cuda_graph; returns the summed loss. */
static double graph_step(trainer *t, int64_t step) {
    ct_tensor_from_host(t->graph_inputs, t->step_inputs);
    ct_tensor_from_host(t->graph_targets, t->step_targets);
    /* The per-token losses' buffer zeroed, and its host bookkeeping set (an evaluation may have
     * changed it); outside the graph, so a buffer that had to grow is a free the launch sees. */
    ct_model_begin_losses(t->model, (int)t->accum, t->cfg->train.micro_batch);
    /* COOKTRAIN_FAULT_GRAPH_FREE=N: a device free before step N's launch, as an evaluation or
     * a growing workspace may make, for the tests of the recapture */
    const char *fault = getenv("COOKTRAIN_FAULT_GRAPH_FREE");
    if (fault && atoll(fault) == step + 1)
        ct_tensor_free(ct_tensor_new_1d(t->be, CT_DTYPE_F32, 1, CT_MEM_WORKSPACE));
    if (t->graph && !ct_backend_graph_launch(t->be, t->graph)) {
        ct_backend_graph_free(t->be, t->graph);
        t->graph = NULL;
    }
    if (!t->graph && step == t->first_step) {
        issue_step(t); /* eager: sizes the workspaces the capture will find */
    } else if (!t->graph) {
        ct_backend_capture_begin(t->be);
        issue_step(t);
        t->graph = ct_backend_capture_end(t->be, &t->graph_ops);
        if (t->rank0)
            printf("cuda graph: step %lld's forward and backward %scaptured, %lld operations "
                   "issued by one launch\n",
                   (long long)step + 1, t->graph_captures ? "re" : "", (long long)t->graph_ops);
        t->graph_captures++;
        CT_ASSERT(ct_backend_graph_launch(t->be, t->graph)); /* nothing freed since */
    }
    return ct_model_loss_sum(t->model);
}

/* Sum over the pipeline group: only the stage holding the loss contributes. */
static double pp_sum(trainer *t, double x) {
    ct_comm_allreduce(t->pctx->pp_comm, &x, 1, CT_DTYPE_F64, CT_REDUCE_SUM);
    return x;
}

static ct_status trainer_init(trainer *t, const ct_config *cfg, ct_backend *be, ct_pctx *pctx) {
    memset(t, 0, sizeof *t);
    t->local_restore.step = -1;
    t->cfg = cfg;
    t->be = be;
    t->own_pctx = pctx == NULL;
    t->pctx = pctx ? pctx : ct_pctx_local_new();
    t->rank0 = t->pctx->world_rank == 0;
    t->dp_rank = t->pctx->dp_rank;
    t->dp_size = t->pctx->dp;
    t->replicas = t->pctx->dp * t->pctx->cp;
    t->T_local = cfg->model.seq_len / t->pctx->cp;
    size_t n = (size_t)(cfg->train.global_batch / t->dp_size * cfg->model.seq_len);
    t->step_inputs = ct_xmalloc(n * sizeof(int32_t));
    t->step_targets = ct_xmalloc(n * sizeof(int32_t));
    if (t->pctx->cp > 1) t->cp_scratch = ct_xmalloc(n * sizeof(int32_t));
    CT_TRY(agree(t, open_inputs(t)));
    CT_TRY(agree(t, build_model(t)));
    if (cfg->train.cuda_graph) CT_TRY(agree(t, graph_buffers(t, (int64_t)n)));
    return CT_OK;
}

/* Sum over the replicas (dp × cp: every token of the batch once) of a host double. */
static double dp_sum(trainer *t, double x) {
    ct_comm_allreduce(t->pctx->dpcp_comm, &x, 1, CT_DTYPE_F64, CT_REDUCE_SUM);
    return x;
}

/* The step's MoE statistics (step_stats), summed over every rank: the tp ranks of a group
 * route the same tokens (tp rank 0 counts them), and the cp ranks of a sequence hold its whole
 * balancing loss (cp rank 0 counts it). Then, with model.moe_bias_rate, every rank moves its
 * layers' selection biases by those counts (a skipped step's too: its tokens were routed). */
static void moe_step_stats(trainer *t, step_stats *s) {
    const int64_t E = t->cfg->model.moe_experts, Lm = ct_moe_layer_count(&t->cfg->model);
    if (!E) return;
    /* [0] the balancing loss, [1] the z-loss (its tokens: like the counts, each tp group's
     * once), [2 ..] tokens per expert of each MoE layer (Lm × E) */
    double *v = ct_xcalloc((size_t)(Lm * E + 2), sizeof *v);
    int64_t *counts = ct_xcalloc((size_t)(Lm * E), sizeof *counts);
    ct_model_moe_stats(t->model, &v[0], &v[1], counts);
    ct_model_moe_timing(t->model, &s->moe_route_s, &s->moe_expert_s, &s->moe_expert_flops);
    if (t->pctx->tp_rank != 0 || t->pctx->cp_rank != 0) v[0] = 0.0;
    if (t->pctx->tp_rank == 0)
        for (int64_t i = 0; i < Lm * E; i++) v[2 + i] = (double)counts[i];
    else
        v[1] = 0.0;
    ct_comm_allreduce(t->pctx->world, v, Lm * E + 2, CT_DTYPE_F64, CT_REDUCE_SUM);
    for (int64_t i = 0; i < Lm * E; i++) counts[i] = (int64_t)v[2 + i]; /* exact below 2^53 */
    if (t->cfg->model.moe_bias_rate > 0) ct_model_moe_update_bias(t->model, counts);
    /* per expert, summed over layers */
    double *load = ct_xcalloc((size_t)E, sizeof *load);
    for (int64_t i = 0; i < Lm * E; i++) load[i % E] += (double)counts[i];
    if (t->cfg->log.trace[0]) { /* the trace's tokens-per-expert track (write_trace) */
        if (!t->moe_trace)
            t->moe_trace = ct_xcalloc((size_t)(t->cfg->train.steps * (E + 1)), sizeof(double));
        double *row = t->moe_trace + s->step * (E + 1);
        row[0] = ct_now();
        memcpy(row + 1, load, (size_t)E * sizeof(double));
    }
    s->moe_aux = v[0];
    s->moe_z = v[1];
    s->moe_load_min = s->moe_load_max = load[0];
    double sum = 0.0;
    for (int64_t e = 0; e < E; e++) {
        s->moe_load_min = CT_MIN(s->moe_load_min, load[e]);
        s->moe_load_max = CT_MAX(s->moe_load_max, load[e]);
        sum += load[e];
    }
    s->moe_load_mean = sum / (double)E;
    if (!t->moe_load) t->moe_load = ct_xcalloc((size_t)E, sizeof *t->moe_load);
    memcpy(t->moe_load, load, (size_t)E * sizeof *load);
    s->moe_load = t->moe_load;
    /* the most loaded expert of any layer against that layer's mean */
    s->moe_layer_imbalance = 0.0;
    for (int64_t g = 0; g < Lm; g++) {
        double most = 0.0, all = 0.0;
        for (int64_t e = 0; e < E; e++)
            most = CT_MAX(most, v[2 + g * E + e]), all += v[2 + g * E + e];
        if (all > 0) s->moe_layer_imbalance = CT_MAX(s->moe_layer_imbalance, most * E / all);
    }
    free(load);
    free(v);
    free(counts);
}

/* Mean loss over eval_steps global batches of the validation set, from its first samples so
 * every evaluation sees the same data. *val_loss is set on every rank; a corrupt validation
 * sample is agreed on like a training one. */
static ct_status evaluate(trainer *t, double *val_loss) {
    const ct_config *cfg = t->cfg;
    int64_t G = cfg->train.global_batch, T = cfg->model.seq_len;
    double sum = 0.0;
    for (int64_t s = 0; s < cfg->train.eval_steps; s++) {
        CT_TRY(read_batch(t, t->val_data, s * G + t->dp_rank * (G / t->dp_size)));
        sum += run_microbatches(t, false, 0.0f);
    }
    if (t->pipeline) sum = pp_sum(t, sum);
    *val_loss = dp_sum(t, sum) / (double)(cfg->train.eval_steps * G * T);
    return CT_OK;
}

/* The after-training sample (log.sample_tokens): every rank runs the sampler in lockstep (its
 * forward passes are collective, sampler.h); rank 0 prints. */
static ct_status print_sample(trainer *t) {
    const ct_config *cfg = t->cfg;
    ct_tokenizer *tok = t->tokenizer;
    if (cfg->log.sample_tokens <= 0 || !tok) return CT_OK;
    return ct_sample_print(t->model, t->dp, t->pctx, tok, cfg->log.sample_prompt,
                           cfg->log.sample_tokens, cfg->train.seed, NULL);
}

/* The ranks' trace files merged into `path` by rank 0: each sends its file's text (length,
 * then bytes) over the world group. */
static ct_status merge_trace(trainer *t, const char *path) {
    const ct_pctx *p = t->pctx;
    char mine[CT_PATH_MAX + 32];
    ct_trace_rank_path(mine, sizeof mine, path, p->world_rank, p->world_size);
    uint8_t *raw = NULL;
    size_t len = 0;
    ct_status mine_st = ct_read_regular(mine, "log.trace file", INT64_MAX, &raw, &len);
    char *text = (char *)raw;
    int64_t n = mine_st == CT_OK ? (int64_t)len : -1; /* -1: could not read its own file back */
    char **bodies = NULL;
    if (p->world_rank == 0) {
        bodies = ct_xcalloc((size_t)p->world_size, sizeof *bodies);
        if (text) {
            bodies[0] = ct_xmalloc(len + 1);
            memcpy(bodies[0], text, len);
            bodies[0][len] = '\0';
            free(text);
        }
        for (int r = 1; r < p->world_size; r++) {
            int64_t m = 0;
            ct_comm_wait(p->world, ct_comm_irecv(p->world, &m, 1, CT_DTYPE_I64, r, 0));
            if (m < 0) continue;
            bodies[r] = ct_xmalloc((size_t)m + 1);
            ct_comm_wait(p->world, ct_comm_irecv(p->world, bodies[r], m, CT_DTYPE_U8, r, 1));
            bodies[r][m] = '\0';
        }
    } else {
        ct_comm_wait(p->world, ct_comm_isend(p->world, &n, 1, CT_DTYPE_I64, 0, 0));
        if (n >= 0) ct_comm_wait(p->world, ct_comm_isend(p->world, text, n, CT_DTYPE_U8, 0, 1));
        free(text);
        return mine_st;
    }
    ct_status st = mine_st == CT_OK ? ct_trace_write_merged(path, p->world_size, bodies) : mine_st;
    for (int r = 0; r < p->world_size; r++) free(bodies[r]);
    free(bodies);
    return st;
}

/* Waits for the stream and reads the times of every mark since the last call (backend.h, mark)
 * into the dp layer's and the pipeline's waits and events, then forgets the marks. At the start
 * of a step (for whatever ran between steps: evaluation, a checkpoint's gathers) and after its
 * last op. */
static void settle_marks(trainer *t) {
    ct_backend_marks_settle(t->be);
    ct_dp_settle(t->dp);
    if (t->pipeline) ct_pipeline_settle(t->pipeline);
    ct_backend_marks_clear(t->be);
}

/* log.trace: this rank's data-parallel events and ring attention's spans as a Chrome/Perfetto
 * trace (core/trace.h). */
static ct_status write_trace(trainer *t, const char *path) {
    ct_trace *trace;
    const ct_pctx *p = t->pctx;
    settle_marks(t);
    CT_TRY(ct_trace_open(&trace, path, p->world_rank, p->world_size));
    char name[96];
    snprintf(name, sizeof name, "rank %d (host %d, tp %d pp %d dp %d)", p->world_rank,
             ct_mpi_host_of(p->world_rank), p->tp_rank, p->pp_rank, p->dp_rank);
    ct_trace_process(trace, name);
    ct_trace_set_shift(trace, t->trace_skew - t->trace_origin);
    ct_trace_thread(trace, 8, "steps");
    for (int64_t step = 0; step < t->cfg->train.steps; step++) {
        const double *span = t->step_spans + 2 * step;
        if (span[1] <= 0) continue;
        snprintf(name, sizeof name, "step %lld", (long long)step + 1);
        ct_trace_span(trace, 8, name, span[0], span[1], -1);
    }
    ct_dp_trace(t->dp, trace);
    if (t->pipeline) ct_pipeline_trace(t->pipeline, trace);
    ct_flight_trace(trace, 16);
    if (t->pctx->cp > 1) ct_ring_trace(trace);
    const int64_t E = t->cfg->model.moe_experts;
    for (int64_t step = 0; t->moe_trace && step < t->cfg->train.steps; step++) {
        const double *row = t->moe_trace + step * (E + 1);
        if (row[0] > 0) ct_trace_counter(trace, "moe tokens per expert", row[0], (int)E, row + 1);
    }
    CT_TRY(ct_trace_close(trace));
    return p->world_size > 1 ? merge_trace(t, path) : CT_OK;
}

/* ---- parameters kept in memory (ct_train_options.keep_params) ---------------------------------
 */

typedef struct param_copy {
    float *data;
    int64_t n, cap;
    ct_param_span *spans;
    int n_spans, cap_spans;
} param_copy;

static ct_status param_copy_sink(void *ctx, const char *name, int64_t rows, int64_t cols,
                                 const float *data) {
    param_copy *c = ctx;
    int64_t numel = rows * cols;
    if (c->n + numel > c->cap) {
        c->cap = CT_MAX(2 * c->cap, c->n + numel);
        c->data = realloc(c->data, (size_t)c->cap * sizeof(float));
        CT_ASSERT(c->data != NULL);
    }
    if (c->n_spans == c->cap_spans) {
        c->cap_spans = c->cap_spans ? 2 * c->cap_spans : 64;
        c->spans = realloc(c->spans, (size_t)c->cap_spans * sizeof *c->spans);
        CT_ASSERT(c->spans != NULL);
    }
    ct_param_span *sp = &c->spans[c->n_spans++];
    snprintf(sp->name, sizeof sp->name, "%s", name);
    sp->offset = c->n;
    sp->numel = numel;
    memcpy(c->data + c->n, data, (size_t)numel * sizeof(float));
    c->n += numel;
    return CT_OK;
}

/* The parameters as they are now: to a dump file and/or into memory (rank 0 keeps them). */
static ct_status export_params(trainer *t, const char *dump_path, bool keep, param_copy *copy) {
    if (dump_path) CT_TRY(ct_param_dump_write(t->model, t->dp, t->pctx, dump_path));
    if (!keep) return CT_OK;
    memset(copy, 0, sizeof *copy);
    return ct_param_stream(t->model, t->dp, t->pctx, t->rank0 ? param_copy_sink : NULL, copy, NULL);
}

/* ---- the run ----------------------------------------------------------------------------------
 */

/* The run's constants, the measured rates, the start-up report; then tracing, profiling and
 * the progress clocks start. */
/* MFU's and GEMM efficiency's denominators, measured: the hardware's peak in the model's dtype
 * into *peak (and how it was found into how, sizeof t->peak_how bytes), and the GEMM rate at the
 * model's MLP shape, returned. */
static double measure_denominators(trainer *t, double *peak, char *how) {
    const ct_config *cfg = t->cfg;
    const ct_dtype dt = ct_model_dtype(t->model);
    *peak = ct_backend_peak_flops(t->be, dt, how, sizeof t->peak_how);
    double rate = ct_gemm_bench_rate(t->be, cfg->train.micro_batch * cfg->model.seq_len,
                                     cfg->derived.d_ff, cfg->model.d_model, dt, 5);
    /* COOKTRAIN_FAULT_SLOW_GEMM=F: the GEMM rate F times too low at every measurement, as on a
     * machine that stays busy (the tests of the progress line's figures) */
    const char *slow = getenv("COOKTRAIN_FAULT_SLOW_GEMM");
    return slow ? rate * atof(slow) : rate;
}

static void start_run(trainer *t) {
    const ct_config *cfg = t->cfg;
    const int64_t T = cfg->model.seq_len;
    t->accum = cfg->derived.grad_accum;
    t->tokens_per_step = (double)cfg->train.global_batch * (double)T;
    t->dloss = (float)(1.0 / t->tokens_per_step);
    /* Per-step traffic the formulas predict (data_parallel.h; plan.h: ct_expected_tp_bytes), exact:
     * the dp group also carries the loss sum (one f64 allreduce per step, dp_sum). */
    if (t->replicas > 1)
        t->dp_bytes_expected = ct_dp_expected_step_bytes(t->dp, (int)t->accum) +
                               (double)ct_zero_scalar_allreduce_bytes(t->replicas);
    t->tp_bytes_expected = ct_expected_tp_bytes(cfg, ct_model_layout_of(t->model), t->accum);
    t->cp_bytes_expected = ct_expected_cp_bytes(cfg, ct_model_layout_of(t->model), t->accum);
    /* FLOPs per token for the whole model; every rank does 1/world of them. */
    t->flops_per_token = ct_model_flops_per_token(t->model) / t->pctx->world_size;
    /* Two denominators, each named for what it is: MFU against the hardware's peak (the
     * backend's measured FMA rate), and GEMM efficiency against the GEMM rate this rank
     * reaches at the model's MLP shape. */
    t->gemm_rate = measure_denominators(t, &t->hw_peak, t->peak_how);
    /* COOKTRAIN_FAULT_SLOW_PEAK=F: both measured F times too low, as on a machine busy with
     * something else during start-up (the tests of remeasure_denominators) */
    const char *slow = getenv("COOKTRAIN_FAULT_SLOW_PEAK");
    if (slow) t->hw_peak *= atof(slow), t->gemm_rate *= atof(slow);
    if (t->rank0) ct_report_start(t);
    if (cfg->log.trace[0]) {
        ct_dp_log_events(t->dp, true);
        if (t->pipeline) ct_pipeline_log_waits(t->pipeline, true);
        /* one time 0 for every rank: the end of a barrier, read on each rank's own clock */
        const char *skew = getenv("COOKTRAIN_TRACE_SKEW_S");
        t->trace_skew = skew ? atof(skew) * t->pctx->world_rank : 0.0;
        if (t->pctx->world_size > 1) ct_comm_barrier(t->pctx->world);
        t->trace_origin = ct_now() + t->trace_skew;
        ct_flight_keep_spans(true); /* every operation from here (device times under NCCL) */
        t->step_spans = ct_xcalloc((size_t)(2 * cfg->train.steps), sizeof *t->step_spans);
    }
    if (cfg->log.trace[0] && t->pctx->cp > 1) ct_ring_log_events(true);
    if (cfg->log.profile) ct_backend_profile(t->be, true);
    if (cfg->log.profile && t->pipeline) ct_pipeline_time_actions(t->pipeline, true);
    if (cfg->log.device_idle) { /* audited in the steps only (train_step) */
        ct_backend_idle(t->be, true);
        ct_backend_idle_pause(t->be, true);
    }
    ct_pctx *p = t->pctx;
    ct_comm *groups[] = {p->tp_comm, p->dpcp_comm,  p->pp_comm,
                         p->mp_comm, p->embed_comm, p->world,
                         p->cp_comm, p->ep_comm,    p->ep > 1 ? p->edp_comm : NULL};
    memcpy(t->groups, groups, sizeof groups);
    for (int g = 0; g < (int)CT_ARRAY_LEN(t->groups); g++)
        if (t->groups[g]) t->groups[g]->seconds = 0.0;
    t->profile_start = t->run_start = t->interval_start = ct_now();
}

/*
 * One optimizer step: read and agree on the step's samples, forward and backward of every
 * microbatch (dp reductions overlapping backward), the loss and gradient norm summed over the
 * grid, then AdamW — or a skipped step when either is not finite. Fails only on bad data.
 */
static ct_status train_step(trainer *t, int64_t step, step_stats *s) {
    const ct_config *cfg = t->cfg;
    const int64_t G = cfg->train.global_batch;
    memset(s, 0, sizeof *s);
    s->step = step;
    double start = ct_now();
    t->comm_at_step = ct_report_comm_seconds(t);
    int64_t copies = t->be->host_copies;
    /* The step's samples, read and checked on every rank before anything collective. */
    CT_TRY(read_batch(t, t->train_data, step * G + t->dp_rank * (G / t->dp_size)));
    t->step_began = ct_now(); /* read_batch ended in a world allreduce: about one moment */
    if (t->stop_signal) {
        s->stop = true;
        return CT_OK;
    }
    settle_marks(t);
    const double busy0 = t->be->idle_busy, idle0 = t->be->idle_gaps;
    ct_backend_idle_pause(t->be, false);
    const double waited = ct_report_comm_seconds(t); /* the counters' waits the reset drops */
    ct_comm_reset_counters(t->pctx->dpcp_comm);
    ct_comm_reset_counters(t->pctx->tp_comm);
    ct_comm_reset_counters(t->pctx->cp_comm);
    ct_comm_reset_counters(t->pctx->ep_comm);
    if (t->pctx->ep > 1) ct_comm_reset_counters(t->pctx->edp_comm);
    t->comm_at_step -= waited - ct_report_comm_seconds(t);
    const double cp_wait0 = t->pctx->cp_comm->seconds;
    double loss_sum;
    if (t->graph_inputs) {
        loss_sum = graph_step(t, step);
    } else {
        ct_dp_begin_step(t->dp, (int)t->accum);
        loss_sum = run_microbatches(t, true, t->dloss);
        ct_dp_finish_backward(t->dp);
    }
    ct_dp_sync_tied(t->dp, t->pctx->embed_comm);
    if (t->pipeline) loss_sum = pp_sum(t, loss_sum);
    s->loss = dp_sum(t, loss_sum) / t->tokens_per_step;
    moe_step_stats(t, s);
    /* Each rank summed its own slice (replicated tensors on tp rank 0 only): add up the
     * slices of the model-parallel group. */
    double sumsq = ct_dp_grad_sumsq(t->dp);
    ct_comm_allreduce(t->pctx->mp_comm, &sumsq, 1, CT_DTYPE_F64, CT_REDUCE_SUM);
    s->grad_norm = sqrt(sumsq);
    s->lr = ct_optim_lr(&cfg->train, step);
    s->finite = isfinite(s->loss) && isfinite(s->grad_norm);
    if (s->finite)
        ct_dp_optimizer_step(t->dp, (float)s->lr, ct_optim_clip_scale(&cfg->train, s->grad_norm));
    settle_marks(t); /* waits for the stream, so the step's time is all in */
    ct_backend_idle_pause(t->be, true);
    s->seconds = ct_now() - start;
    s->device_busy = t->be->idle_busy - busy0;
    s->device_idle = t->be->idle_gaps - idle0;
    s->exposed = ct_dp_exposed_seconds(t->dp);
    s->bubble = t->pipeline ? ct_pipeline_wait_seconds(t->pipeline) : 0.0;
    s->host_copies = t->be->host_copies - copies;
    for (int k = 0; k < CT_COMM_OP_COUNT; k++) s->dp_bytes += t->pctx->dpcp_comm->bytes[k];
    if (t->pctx->ep > 1) /* the expert units' reductions (data_parallel.h) */
        for (int k = 0; k < CT_COMM_OP_COUNT; k++) s->dp_bytes += t->pctx->edp_comm->bytes[k];
    for (int k = 0; k < CT_COMM_OP_COUNT; k++) s->ep_bytes += t->pctx->ep_comm->bytes[k];
    for (int k = 0; k < CT_COMM_OP_COUNT; k++) s->tp_bytes += t->pctx->tp_comm->bytes[k];
    for (int k = 0; k < CT_COMM_OP_COUNT; k++) s->cp_bytes += t->pctx->cp_comm->bytes[k];
    s->cp_wait = t->pctx->cp_comm->seconds - cp_wait0;
    return CT_OK;
}

/* The step's numbers into the result, the traffic check of step 1, the skip count. */
static ct_status record_step(trainer *t, const step_stats *s) {
    ct_train_result *res = &t->res;
    if (s->step == t->first_step) res->first_loss = s->loss;
    res->losses[s->step] = s->loss;
    res->grad_norms[s->step] = s->grad_norm;
    res->last_loss = s->loss;
    res->steps_done = s->step + 1;
    t->interval_tokens += t->tokens_per_step;
    t->interval_exposed += s->exposed;
    t->interval_bubble += s->bubble;
    if (s->step == 0 && t->rank0) {
        if (t->replicas > 1) /* the gradient reduction over the replicas: dp × cp ranks */
            printf("%s traffic step 1 (rank 0): %.3f MiB measured, %.3f MiB expected\n",
                   t->pctx->cp > 1 ? "dp x cp (gradients)" : "dp", (double)s->dp_bytes / 1048576.0,
                   t->dp_bytes_expected / 1048576.0);
        if (t->pctx->cp > 1)
            printf("cp traffic step 1 (rank 0): %.3f MiB measured, %.3f MiB expected\n",
                   (double)s->cp_bytes / 1048576.0, t->cp_bytes_expected / 1048576.0);
        if (t->pctx->tp > 1)
            printf("tp traffic step 1 (rank 0): %.3f MiB measured, %.3f MiB expected\n",
                   (double)s->tp_bytes / 1048576.0, t->tp_bytes_expected / 1048576.0);
    }
    if (s->finite) {
        t->bad_in_a_row = 0;
        return CT_OK;
    }
    res->skipped_steps++;
    t->bad_in_a_row++;
    if (t->rank0)
        printf("step %lld: loss %g, grad norm %g is not finite; step skipped (%lld in a row)\n",
               (long long)s->step + 1, s->loss, s->grad_norm, (long long)t->bad_in_a_row);
    return CT_OK;
}

/* A step that outran a denominator measured at start-up (MFU or GEMM efficiency over 100%) says
 * that measurement came out low: the machine was busy then (a VM lending a core elsewhere, say).
 * Both are measured again, once a run, and the higher of each kept; the next lines use them. */
static void remeasure_denominators(trainer *t, const step_stats *s) {
    if (t->remeasured >= CT_REMEASURE_MAX || !s->finite || s->seconds <= 0.0) return;
    const double achieved = t->flops_per_token * t->tokens_per_step / s->seconds;
    if (!(t->hw_peak > 0.0 && achieved > t->hw_peak) &&
        !(t->gemm_rate > 0.0 && achieved > t->gemm_rate))
        return;
    t->remeasured++;
    const double start = ct_now();
    const double peak0 = t->hw_peak, gemm0 = t->gemm_rate;
    char how[sizeof t->peak_how];
    double peak;
    t->gemm_rate = CT_MAX(t->gemm_rate, measure_denominators(t, &peak, how));
    if (peak > t->hw_peak) t->hw_peak = peak, memcpy(t->peak_how, how, sizeof how);
    if (t->rank0)
        printf("step %lld ran at %.1f GFLOP/s, above the peak (%.1f) or GEMM rate (%.1f) measured "
               "%s, so the machine was busy then; measured again: %.1f and %.1f GFLOP/s\n",
               (long long)s->step + 1, achieved / 1e9, peak0 / 1e9, gemm0 / 1e9,
               t->remeasured == 1 ? "at start-up" : "last", t->hw_peak / 1e9, t->gemm_rate / 1e9);
    ct_report_remeasured_metrics(t, s->step + 1);
    t->interval_start += ct_now() - start; /* not training time */
}

/* train.max_bad_steps consecutive non-finite steps end the run. */
static ct_status check_bad_steps(trainer *t, int64_t step) {
    if (t->bad_in_a_row < t->cfg->train.max_bad_steps) return CT_OK;
    ct_error(CT_ERR_RUNTIME,
             "%lld consecutive steps had a non-finite loss or gradient norm (last at step %lld)",
             (long long)t->bad_in_a_row, (long long)step + 1);
    ct_hint("lower train.lr or raise train.warmup_steps; train.max_bad_steps sets how many are "
            "tolerated");
    return CT_ERR_RUNTIME;
}

/* Evaluation every train.eval_interval steps and after the last; its time is not counted in
 * the training throughput. */
static ct_status maybe_evaluate(trainer *t, int64_t step) {
    const ct_config *cfg = t->cfg;
    bool last = step + 1 == cfg->train.steps;
    if (!t->val_data || ((step + 1) % cfg->train.eval_interval != 0 && !last)) return CT_OK;
    double start = ct_now(), val_loss = 0.0;
    CT_TRY(evaluate(t, &val_loss));
    t->res.last_val_loss = val_loss;
    if (t->rank0)
        printf("step %5lld/%lld | val_loss %.4f\n", (long long)step + 1,
               (long long)cfg->train.steps, val_loss);
    ct_metrics_begin(t->metrics);
    ct_metrics_int(t->metrics, "step", step + 1);
    ct_metrics_num(t->metrics, "val_loss", "%.6f", val_loss);
    ct_metrics_end(t->metrics);
    t->interval_start += ct_now() - start;
    return CT_OK;
}

/* model.init_from, when no checkpoint was resumed: the weights to start from. */
static ct_status init_from(trainer *t) {
    ct_ckpt_init_info info;
    ct_ckpt_load_stats stats;
    double start = ct_now();
    CT_TRY(ct_ckpt_init_from(t->cfg->model.init_from, t->cfg, t->model, t->dp, t->pctx, &info,
                             &stats));
    if (t->rank0) {
        if (info.hf)
            printf("init: weights from the Hugging Face %s model %s",
                   info.arch == CT_ARCH_LLAMA ? "llama" : "gpt2", info.dir);
        else
            printf("init: weights from checkpoint %s (step %lld)", info.dir, (long long)info.step);
        printf(", optimizer fresh at step 0; loaded in %.2f s; rank 0 read %.1f MiB of weights "
               "holding at most %.1f MiB of host buffers\n",
               ct_now() - start, stats.state_bytes / 3 / 1048576.0, stats.buffer_bytes / 1048576.0);
    }
    t->profile_start = t->run_start = t->interval_start = ct_now();
    return CT_OK;
}

/* checkpoint.resume: loads the checkpoint to continue from, if any (after start_run, so the
 * start-up report describes the run; before the first step). */
static ct_status resume_run(trainer *t) {
    const ct_checkpoint_config *cc = &t->cfg->checkpoint;
    if (cc->dir[0]) CT_TRY(ct_ckpt_prepare(t->model, t->dp, t->pctx));
    char **paths;
    int n = ct_ckpt_candidates(cc->dir, cc->resume, &paths);
    if (cc->local_interval > 0 && !strcmp(cc->resume, "auto")) {
        /* a newer step complete in the nodes' local folders is gathered into dir first */
        int64_t *steps;
        const int n_steps = ct_ckpt_steps(cc->dir, &steps);
        const int64_t newest = n_steps > 0 ? steps[n_steps - 1] : -1;
        free(steps);
        ct_ckpt_local_info info;
        CT_TRY(ct_ckpt_local_restore(t->cfg, t->pctx, newest, &info));
        t->local_restore = info;
        if (info.step >= 0) {
            if (t->rank0)
                printf("checkpoint: local step %lld is newer than %s: its %lld rank files "
                       "gathered into %s (%lld from partners' copies, their own node's were "
                       "gone)\n",
                       (long long)info.step,
                       newest >= 0 ? "the newest in checkpoint.dir" : "checkpoint.dir's (none)",
                       (long long)info.files, cc->dir, (long long)info.from_partners);
            for (int k = 0; k < n; k++) free(paths[k]);
            free(paths);
            n = ct_ckpt_candidates(cc->dir, cc->resume, &paths);
        }
    }
    ct_ckpt_state state;
    ct_ckpt_load_stats stats;
    ct_status st = CT_OK;
    int i = 0;
    double start = ct_now();
    char first_bad[CT_PATH_MAX + 32] = "", why[512] = "";
    for (; i < n; i++) {
        /* every rank tries the same candidate; a load is collective and agreed, and one that
         * fails part-way is overwritten whole by the next */
        st = ct_ckpt_load(paths[i], t->cfg, t->model, t->dp, t->pctx, &state, &stats);
        if (st == CT_OK) break;
        if (st != CT_ERR_INPUT || i + 1 == n) break;
        if (!first_bad[0]) {
            snprintf(first_bad, sizeof first_bad, "%s", paths[i]);
            snprintf(why, sizeof why, "%s", ct_error_message());
        }
        if (t->rank0)
            printf("checkpoint: %s is not usable (%s); trying %s\n", paths[i], ct_error_message(),
                   paths[i + 1]);
        ct_error_clear();
        start = ct_now();
    }
    if (st != CT_OK && n > 1) {
        ct_error(CT_ERR_INPUT,
                 "no usable checkpoint in '%s': the newest, %s, and every older "
                 "one fail their checks (%s)",
                 cc->dir, first_bad, why);
        ct_hint("`cooktrain inspect DIR` checks one; checkpoint.resume: never starts over "
                "(with another checkpoint.dir, to keep these)");
    }
    if (st == CT_OK && i < n) {
        t->first_step = CT_MIN(state.step, t->cfg->train.steps);
        snprintf(t->resumed_from, sizeof t->resumed_from, "%s", paths[i]);
        if (t->rank0)
            printf("checkpoint: resumed from %s at step %lld (written by %lld ranks: tp %lld, "
                   "pp %lld, dp x cp %lld, zero %lld), loaded in %.2f s; rank 0 read %.1f MiB of "
                   "state holding at most %.1f MiB of host buffers\n",
                   paths[i], (long long)state.step, (long long)state.world_size,
                   (long long)state.tp, (long long)state.pp, (long long)state.dp,
                   (long long)state.zero_stage, ct_now() - start, stats.state_bytes / 1048576.0,
                   stats.buffer_bytes / 1048576.0);
        const int64_t again = t->last_logged_step - state.step;
        if (t->rank0 && again > 0)
            printf("checkpoint: the run before had logged step %lld, so %lld step%s run again "
                   "(from step %lld): the steps lost\n",
                   (long long)t->last_logged_step, (long long)again, again == 1 ? " is" : "s are",
                   (long long)state.step + 1);
        t->profile_start = t->run_start = t->interval_start = ct_now();
    }
    for (int k = 0; k < n; k++) free(paths[k]);
    free(paths);
    if (st == CT_OK && i >= n && t->cfg->model.init_from[0]) st = init_from(t);
    return st;
}

/* Ends the save in flight (waiting for its files if need be) and reports it. */
static ct_status end_pending_save(trainer *t) {
    if (!t->pending) return CT_OK;
    ct_ckpt_saver *s = t->pending;
    t->pending = NULL;
    ct_ckpt_save_stats stats;
    double start = ct_now();
    CT_TRY(ct_ckpt_save_end(s, &stats));
    t->interval_start += ct_now() - start; /* saving is not training throughput */
    if (t->rank0) {
        printf("checkpoint: step %lld saved to %s/step-%08lld: %.1f MiB per rank; training "
               "blocked %.3f s; written in %.3f s (%.0f MB/s)%s\n",
               (long long)t->pending_step, t->cfg->checkpoint.dir, (long long)t->pending_step,
               stats.bytes / 1048576.0, stats.blocked_s, stats.write_s,
               stats.write_s > 0 ? stats.bytes / stats.write_s / 1e6 : 0.0,
               stats.async ? " in the background" : "");
        fflush(stdout);
    }
    return CT_OK;
}

/* A checkpoint of the state after `steps` steps, when checkpoint.dir is set and one is due:
 * every checkpoint.interval steps, after the last step, and when stopping. With
 * checkpoint.async the files are written in the background and the save ends at the first step
 * boundary where every rank's file is done (or at the next save, or the end of the run). */
static ct_status maybe_save(trainer *t, int64_t steps, bool stopping) {
    const ct_checkpoint_config *cc = &t->cfg->checkpoint;
    bool last = stopping || steps == t->cfg->train.steps;
    bool due = last || (cc->interval > 0 && steps % cc->interval == 0);
    if (!cc->dir[0] || !due) return CT_OK;
    CT_TRY(end_pending_save(t)); /* saves complete in order */
    double start = ct_now();
    CT_TRY(ct_ckpt_save_begin(&t->pending, t->cfg, t->model, t->dp, t->pctx, steps));
    t->interval_start += ct_now() - start;
    t->pending_step = steps;
    t->pending_written = false;
    return last || !cc->async ? end_pending_save(t) : CT_OK;
}

/* Ends the local save in flight: at the first step boundary where every rank's files are
 * written, or at once (waiting) before the run ends. */
static ct_status end_local_save(trainer *t) {
    if (!t->local) return CT_OK;
    ct_ckpt_local_saver *ls = t->local;
    t->local = NULL;
    ct_ckpt_save_stats stats;
    double start = ct_now();
    CT_TRY(ct_ckpt_local_end(ls, &stats));
    t->local_stall_s += ct_now() - start;
    if (t->rank0 && t->local_saved++ == 0) { /* the first says what one costs */
        char root[CT_PATH_MAX + 64];
        ct_ckpt_local_root(t->cfg, 0, root, sizeof root);
        printf("local checkpoint: step %lld in %s and each rank's folder beside it, a "
               "partner's copy in each: %.1f MiB per rank; training blocked %.3f s; written in "
               "%.3f s%s\n",
               (long long)t->local_step, root, stats.bytes / 1048576.0, stats.blocked_s,
               stats.write_s, stats.async ? " in the background" : "");
        fflush(stdout);
    }
    return CT_OK;
}

/* checkpoint.local_interval: a local checkpoint after `steps` steps (not where a persistent one
 * is saved, nor after the last step, which always saves one when checkpoint.dir is set). One at
 * a time: one still being written when the next is due is waited for (that wait is in the
 * metrics' local_save_s), so every due step is saved and a crash loses at most the steps since
 * the one before. */
static ct_status maybe_save_local(trainer *t, int64_t steps) {
    const ct_checkpoint_config *cc = &t->cfg->checkpoint;
    /* the save in flight ends at the first boundary where every rank's files are written, here,
     * at one place in the boundary's work, so that the boundary's collectives come in the same
     * order whenever it ends (a fault planted on the Nth one hits the same one every run) */
    if (t->local_written) CT_TRY(end_local_save(t));
    if (cc->local_interval <= 0 || steps % cc->local_interval != 0 ||
        steps >= t->cfg->train.steps || (cc->interval > 0 && steps % cc->interval == 0))
        return CT_OK;
    CT_TRY(end_local_save(t));
    double start = ct_now();
    CT_TRY(ct_ckpt_local_begin(&t->local, t->cfg, t->model, t->dp, t->pctx, steps));
    t->local_step = steps;
    t->local_written = false;
    t->local_stall_s += ct_now() - start;
    return CT_OK;
}

/* Ends the run early after `steps` steps, on a signal or train.stop_after: saves, says how to
 * go on. */
static ct_status stop_run(trainer *t, int64_t steps) {
    t->stopped = true;
    CT_TRY(maybe_save(t, steps, true));
    if (t->rank0) {
        if (t->stop_signal)
            printf("stopped after step %lld on %s", (long long)steps,
                   t->stop_signal == SIGUSR1 ? "SIGUSR1" : "SIGTERM");
        else
            printf("stopped after step %lld (train.stop_after)", (long long)steps);
        printf("; %s\n", t->cfg->checkpoint.dir[0]
                             ? "run the same command again to resume (checkpoint.resume: auto)"
                             : "no checkpoint.dir was set, so nothing was saved");
    }
    return CT_OK;
}

/* What follows the last step: the last metrics write agreed on, the sample, the trace. */
static ct_status finish_run(trainer *t) {
    CT_TRY(end_pending_save(t));
    CT_TRY(end_local_save(t));
    /* the last step's (or the stop's) persistent checkpoint is published: the node-local ones
     * are older, and their memory goes back to the node */
    if (t->cfg->checkpoint.local_interval > 0)
        CT_TRY(agree(t, ct_ckpt_local_forget(t->cfg, t->pctx)));
    CT_TRY(step_agree(t, ct_metrics_status(t->metrics)));
    if (!t->stopped) CT_TRY(print_sample(t));
    if (t->cfg->log.trace[0]) CT_TRY(agree(t, write_trace(t, t->cfg->log.trace)));
    return CT_OK;
}

ct_status ct_train_run(const ct_config *cfg, ct_backend *be, ct_pctx *pctx,
                       const ct_train_options *opts, ct_train_result *result) {
    static const ct_train_options no_options;
    if (!opts) opts = &no_options;
    const bool keep = opts->keep_params && result;
    trainer t;
    if (pctx && pctx->world_size > 1)
        ct_flight_configure((int)cfg->log.flight_recorder,
                            cfg->log.run_dir[0] ? cfg->log.run_dir : ".", pctx->world_size,
                            ct_mpi_job_id(), cfg->parallel.timeout_s);
    ct_status st = trainer_init(&t, cfg, be, pctx);
    param_copy init_copy = {0}, final_copy = {0};
    if (st != CT_OK) {
        trainer_free(&t);
        return st;
    }
    t.res.losses = ct_xcalloc((size_t)cfg->train.steps, sizeof(double));
    t.res.grad_norms = ct_xcalloc((size_t)cfg->train.steps, sizeof(double));
    run_over = 0;
    catch_stop_signals();
    start_run(&t);
    st = resume_run(&t);
    /* the run has started: its config and its segment's first metrics line */
    if (st == CT_OK) st = agree(&t, write_run_config(&t));
    if (st == CT_OK) ct_report_setup_metrics(&t);
    /* the parameters the first step starts from: resumed, from model.init_from, or initialised */
    if (st == CT_OK) st = export_params(&t, opts->dump_init_params, keep, &init_copy);
    for (int64_t step = t.first_step; step < cfg->train.steps && st == CT_OK; step++) {
        step_stats s;
        st = train_step(&t, step, &s);
        if (t.step_spans)
            t.step_spans[2 * step] = t.step_began, t.step_spans[2 * step + 1] = ct_now();
        if (st == CT_OK && s.stop) {
            st = stop_run(&t, step);
            break;
        }
        if (st == CT_OK && t.pending_written) st = end_pending_save(&t);
        if (st == CT_OK) st = record_step(&t, &s);
        if (st == CT_OK) ct_report_stragglers(&t, &s);
        if (st == CT_OK) remeasure_denominators(&t, &s);
        if (st == CT_OK) st = maybe_evaluate(&t, step);
        if (st != CT_OK) break;
        ct_report_step_metrics(&t, &s);
        st = check_bad_steps(&t, step);
        if (st == CT_OK) ct_report_progress(&t, &s);
        if (st == CT_OK) ct_report_pipeline_costs(&t, step);
        if (st == CT_OK && step + 1 == cfg->train.stop_after) {
            st = stop_run(&t, step + 1);
            break;
        }
        if (st == CT_OK) st = maybe_save(&t, step + 1, false);
        if (st == CT_OK) st = maybe_save_local(&t, step + 1);
    }
    if (st == CT_OK) st = finish_run(&t);
    if (st == CT_OK) st = export_params(&t, opts->dump_params, keep, &final_copy);
    run_over = 1;
    ct_train_result res = t.res;
    trainer_free(&t);
    if (keep && st == CT_OK) {
        res.init_params = init_copy.data;
        res.final_params = final_copy.data;
        res.n_params = final_copy.n;
        res.spans = final_copy.spans;
        res.n_spans = final_copy.n_spans;
        free(init_copy.spans);
    } else {
        free(init_copy.data), free(init_copy.spans);
        free(final_copy.data), free(final_copy.spans);
    }
    if (result && st == CT_OK)
        *result = res;
    else
        ct_train_result_release(&res);
    return st;
}

void ct_train_result_release(ct_train_result *result) {
    free(result->losses);
    free(result->grad_norms);
    free(result->init_params);
    free(result->final_params);
    free(result->spans);
    memset(result, 0, sizeof *result);
}
