/* plan.c — memory, communication and bubble estimates for a config (see plan.h). */
#include "plan.h"

#include <stdlib.h>

#include "core/backend/backend.h"
#include "core/model/model.h"
#include "parallel/data_parallel.h"
#include "parallel/schedule.h"

/*
 * Tensor-parallel bytes this rank sends per step (ring model, comm.h), for m microbatches of
 * B sequences, N = tp, activations of B·T·C floats, L_r layers on this rank:
 *   per microbatch, forward: two reductions per layer (attention and MLP outputs), plus the
 *   embedding's on the first stage and the loss's three B·T ones (row max, sum of exponentials,
 *   target logit) on the last; backward: two per layer (the norm-output gradients) and the LM
 *   head's one on the last stage; with recompute the forward's two per layer run again. Each is
 *   2·bytes·(N−1)/N as an allreduce; with sequence parallelism each becomes an allgather + a
 *   reduce-scatter of the same total. Sequence parallelism also sums the partial gradients of
 *   the tp-replicated tensors here (6C per layer, the position embedding T·C on the first stage,
 *   the final norm 2C on the last; Llama: its two RMSNorm weights 2C per layer and the final
 *   norm's C, no biases, no position table): once per step at ZeRO 0-1, once per microbatch at
 *   ZeRO 2-3. With context parallelism T is this rank's seq_len / cp positions (the position
 *   table's gradient stays T_seq·C).
 */
double ct_expected_tp_bytes(const ct_config *cfg, const ct_model_layout *lay, int64_t m) {
    double N = (double)cfg->parallel.tp;
    if (N <= 1) return 0.0;
    double L = 0, embed = 0, head = 0;
    for (int c = 0; c < lay->n_chunks; c++) {
        L += lay->chunks[c].n_layers;
        embed += lay->chunks[c].has_embed;
        head += lay->chunks[c].has_head;
    }
    double B = (double)cfg->train.micro_batch, T_seq = (double)cfg->model.seq_len;
    double T = T_seq / (double)cfg->parallel.cp;
    double C = (double)cfg->model.d_model, BTC = B * T * C;
    /* Activations travel in the model's dtype (bf16 in bf16 mode); the cross-entropy's row
     * statistics and the replicated tensors' gradients are fp32 in every mode. */
    double ring = 2.0 * (N - 1.0) / N;
    double act = (double)ct_dtype_size(ct_precision_dtype(cfg->derived.precision));
    double recompute = cfg->train.recompute == CT_RECOMPUTE_FULL ? 2.0 * L : 0.0;
    double per_mb = (4.0 * L + recompute + embed + head) * BTC * act + head * 3.0 * B * T * 4.0;
    /* MoE layers (moe.c): the gate gradients, (B·T, k) fp32, summed over the group */
    const double moe = (double)ct_layout_moe_layers(&cfg->model, lay),
                 E = (double)cfg->model.moe_experts;
    per_mb += moe * B * T * (double)cfg->model.moe_top_k * 4.0;
    double total = ring * per_mb * (double)m;
    if (cfg->parallel.sequence_parallel) {
        const bool llama = cfg->model.arch == CT_ARCH_LLAMA;
        /* an MoE layer's replicated tensors: the norms and bo (5C), the router (E·C) and each of
         * its experts' b_down (E/ep · C) instead of the MLP's b_down, and the shared experts'
         * b_down; Llama's: the router */
        double replicated = llama ? 2.0 * L * C + head * C + moe * E * C
                                  : 6.0 * L * C + embed * T_seq * C + head * 2.0 * C +
                                        moe *
                                            (E + E / (double)cfg->parallel.ep - 1.0 +
                                             (cfg->model.moe_shared ? 1.0 : 0.0)) *
                                            C;
        total += ring * 4.0 * replicated * (cfg->parallel.zero_stage >= 2 ? (double)m : 1.0);
    }
    return total;
}

/*
 * Context-parallel bytes this rank sends per step (core/model/ring_attention.h), for m
 * microbatches of B sequences of T = seq_len / cp local positions, n_kv/tp kv heads of width hd
 * on the rank, L_r layers: per layer and microbatch the forward ring sends cp−1 blocks of
 * B·T·2·(n_kv/tp)·hd elements in the model's dtype, the backward ring as many again plus cp fp32
 * dK/dV partials of the same size; recompute runs the forward ring again.
 */
double ct_expected_cp_bytes(const ct_config *cfg, const ct_model_layout *lay, int64_t m) {
    const double cp = (double)cfg->parallel.cp;
    if (cp <= 1) return 0.0;
    double L = 0;
    for (int c = 0; c < lay->n_chunks; c++) L += lay->chunks[c].n_layers;
    const double block = (double)cfg->train.micro_batch * ((double)cfg->model.seq_len / cp) * 2.0 *
                         (double)(cfg->derived.n_kv_head / cfg->parallel.tp) *
                         (double)cfg->derived.head_dim;
    const double act = (double)ct_dtype_size(ct_precision_dtype(cfg->derived.precision));
    const double rings = cfg->train.recompute == CT_RECOMPUTE_FULL ? 3.0 : 2.0;
    /* MoE layers with the balancing loss: each sequence's expert counts and probabilities,
     * 2·E doubles a sequence, summed over the group in every training forward (moe.c) */
    double moe_stats = 0.0;
    if (cfg->model.moe_aux_alpha > 0) {
        const uint64_t bytes = (uint64_t)(2 * cfg->train.micro_batch * cfg->model.moe_experts * 8);
        const double forwards = cfg->train.recompute == CT_RECOMPUTE_FULL ? 2.0 : 1.0;
        moe_stats = (double)ct_layout_moe_layers(&cfg->model, lay) * forwards * (double)m *
                    (double)(2 * bytes * (uint64_t)(cp - 1) / (uint64_t)cp);
    }
    return L * (double)m * block * (rings * (cp - 1.0) * act + cp * 4.0) + moe_stats;
}

/*
 * Expert-parallel bytes this rank sends per step (core/model/moe_dispatch.h) when routing is
 * uniform: in each MoE layer and microbatch the B·T tokens of the rank (T = seq_len / cp; every
 * tp rank routes all of them) travel k ways, (ep−1)/ep of the rows to other ranks, C values of
 * the activations' dtype a row, four times (dispatch and combine, and their backwards; six with
 * recompute), plus the count exchange (an all_to_all of E int64) in every forward. Skewed routing
 * moves more or less.
 */
double ct_expected_ep_bytes(const ct_config *cfg, const ct_model_layout *lay, int64_t m) {
    const double ep = (double)cfg->parallel.ep;
    if (ep <= 1) return 0.0;
    const double forwards = cfg->train.recompute == CT_RECOMPUTE_FULL ? 2.0 : 1.0;
    const double rows = (double)cfg->train.micro_batch *
                        ((double)cfg->model.seq_len / (double)cfg->parallel.cp) *
                        (double)cfg->model.moe_top_k * (ep - 1.0) / ep;
    const double act = (double)ct_dtype_size(ct_precision_dtype(cfg->derived.precision));
    const double moves = rows * (double)cfg->model.d_model * act * (2.0 * forwards + 2.0);
    const double counts = forwards * (double)cfg->model.moe_experts * 8.0 * (ep - 1.0) / ep;
    return (double)ct_layout_moe_layers(&cfg->model, lay) * (double)m * (moves + counts);
}

ct_status ct_plan_stage_model(const ct_config *cfg, int r, ct_backend *be, ct_model **out) {
    ct_model_layout layout = ct_model_layout_pipeline(cfg, r);
    layout.tp_size = (int)cfg->parallel.tp;
    layout.tp_rank = 0;
    layout.dp_size = (int)(cfg->derived.dp * cfg->parallel.cp);
    layout.cp_size = (int)cfg->parallel.cp;
    layout.sequence_parallel = cfg->parallel.sequence_parallel;
    layout.recompute = cfg->train.recompute == CT_RECOMPUTE_FULL;
    layout.zero.shard_params = layout.zero.shard_grads = true; /* nothing is allocated */
    layout.unit_min_bytes = ct_config_unit_min_bytes(cfg);
    layout.ep_size = (int)cfg->parallel.ep; /* ep rank 0's experts: every ep rank holds as many */
    layout.measure_only = true;
    return ct_model_new(out, cfg, be, &layout);
}

ct_status ct_plan_stage_cost_of(const ct_config *cfg, int r, const ct_model *model,
                                const ct_sim_result *sim, ct_plan_stage *out) {
    const int pp = (int)cfg->parallel.pp, dp = (int)cfg->derived.dp;
    const int cp = (int)cfg->parallel.cp, replicas = dp * cp;
    const int ep = (int)cfg->parallel.ep;
    const int m = (int)cfg->derived.grad_accum, stage = (int)cfg->parallel.zero_stage;
    const int64_t B = cfg->train.micro_batch;
    const ct_dtype pdt = ct_precision_dtype(cfg->derived.precision);
    const ct_state_bytes sb =
        ct_state_bytes_of(pdt, ct_precision_dtype(cfg->parallel.grad_reduce_dtype));
    const ct_model_layout *layout = ct_model_layout_of(model);
    memset(out, 0, sizeof *out);
    int64_t elems = 0, expert_elems = 0;
    for (int u = 0; u < ct_model_n_units(model); u++) {
        const ct_unit *unit = ct_model_unit(model, u);
        elems += unit->padded_numel;
        if (unit->experts) expert_elems += unit->padded_numel;
    }
    size_t phi = (size_t)elems * sb.params, mem[CT_MEM_COUNT];
    ct_zero_expected_memory_split(elems - expert_elems, expert_elems, sb, replicas, replicas / ep,
                                  stage, mem);
    int inflight = sim ? sim->peak_inflight_mb[r] : 1;
    /* a split backward's schedule (zbh1, zbv) also keeps each microbatch's record for its
     * weight parts with its activations */
    const size_t stash = ct_schedule_splits_backward(cfg->parallel.schedule)
                             ? ct_model_wgrad_stash_bytes(model, B)
                             : 0;
    double acts = (double)(ct_acts_bytes(model, B) + stash) * inflight;
    /* The formula plus the loss sum the trainer allreduces over dp every step. */
    double dp_bytes =
        replicas > 1 ? ct_zero_expected_step_bytes_split(elems - expert_elems, expert_elems, sb,
                                                         replicas, replicas / ep, stage, m) +
                           ct_zero_rebracket_bytes(model, sb, replicas, stage, m) +
                           (double)ct_zero_scalar_allreduce_bytes(replicas)
                     : 0.0;
    double tp_bytes = ct_expected_tp_bytes(cfg, layout, m);
    double cp_bytes = ct_expected_cp_bytes(cfg, layout, m);
    /* point to point: each chunk boundary sends B·Tl·C activations (model dtype) per
     * microbatch each way */
    double boundary = (double)B * (double)ct_model_local_seq_len(model) *
                      (double)ct_model_d_model(model) * (double)ct_dtype_size(pdt),
           pp_bytes = 0;
    for (int j = 0; j < layout->n_chunks; j++) {
        int c = layout->chunks[j].index;
        if (c < pp * (int)cfg->parallel.virtual_stages - 1) pp_bytes += boundary * m;
        if (c > 0) pp_bytes += boundary * m;
    }
    memcpy(out->mem, mem, sizeof out->mem);
    out->phi = phi;
    out->inflight = inflight;
    out->acts = acts;
    out->dp_bytes = dp_bytes;
    out->tp_bytes = tp_bytes;
    out->cp_bytes = cp_bytes;
    out->pp_bytes = pp_bytes;
    out->ep_bytes = ct_expected_ep_bytes(cfg, layout, m);
    out->flops_per_token = ct_model_flops_per_token(model);
    return CT_OK;
}

ct_status ct_plan_stage_cost(const ct_config *cfg, int r, ct_backend *be, const ct_sim_result *sim,
                             ct_plan_stage *out) {
    ct_model *model = NULL;
    CT_TRY(ct_plan_stage_model(cfg, r, be, &model));
    ct_status st = ct_plan_stage_cost_of(cfg, r, model, sim, out);
    ct_model_free(model);
    return st;
}

ct_status ct_plan_print(const ct_config *cfg, double backward_ratio, bool json, FILE *out) {
    const int tp = (int)cfg->parallel.tp, pp = (int)cfg->parallel.pp, dp = (int)cfg->derived.dp;
    const int cp = (int)cfg->parallel.cp, ep = (int)cfg->parallel.ep;
    char cp_part[32] = "";
    if (cp > 1)
        snprintf(cp_part, sizeof cp_part, "cp %d (%s) x ", cp,
                 cfg->parallel.cp_sharding == CT_CP_ZIGZAG ? "zigzag" : "contiguous");
    const int m = (int)cfg->derived.grad_accum, stage = (int)cfg->parallel.zero_stage;
    const int64_t B = cfg->train.micro_batch;
    if (!json)
        fprintf(out,
                "plan: %.2fM parameters on %lld ranks = tp %d x %spp %d x dp %d; ZeRO %d; "
                "%d microbatches of %lld x %lld tokens per dp rank per step%s%s\n",
                (double)cfg->derived.n_params / 1e6, (long long)cfg->derived.world_size, tp,
                cp_part, pp, dp, stage, m, (long long)B, (long long)cfg->model.seq_len,
                cfg->parallel.sequence_parallel ? "; sequence parallel" : "",
                cfg->train.recompute == CT_RECOMPUTE_FULL ? "; recompute" : "");

    ct_schedule *sched = NULL;
    ct_sim_result sim = {0};
    if (pp > 1) {
        sched = ct_schedule_new(cfg->parallel.schedule, pp, (int)cfg->parallel.virtual_stages, m);
        if (!sched) return CT_ERR_INPUT;
        sim = ct_schedule_simulate(sched, backward_ratio);
    }
    /* Memory is planned from the tensors the model would allocate: made on the CPU, whatever
     * the backend the job will run on. */
    ct_backend *be = NULL;
    char chosen[160];
    ct_status made = ct_backend_new(&be, "cpu", 1, chosen, sizeof chosen);
    CT_ASSERTF(made == CT_OK, "the cpu backend is always built");
    const ct_dtype pdt = ct_precision_dtype(cfg->derived.precision);
    const ct_state_bytes sb =
        ct_state_bytes_of(pdt, ct_precision_dtype(cfg->parallel.grad_reduce_dtype));
    if (!json)
        fprintf(out,
                "per rank, %s (%s; bytes per parameter: params %zu + grads %zu + master %zu + "
                "optimizer %zu; dp reduction %zu; tp rank 0 of each stage, dp ranks alike):\n",
                ct_dtype_name(pdt), cfg->derived.precision_why, sb.params, sb.grads, sb.master,
                sb.optim, sb.reduce);
    if (!json)
        fprintf(out,
                "  stage | params (Φ)  | param mem   | grads       | optimizer   | master      | "
                "activations (peak mb) | dp bytes/step | tp bytes/step | pp bytes/step\n");
    ct_status st = CT_OK;
    for (int r = 0; r < pp && st == CT_OK; r++) {
        ct_plan_stage c;
        st = ct_plan_stage_cost(cfg, r, be, pp > 1 ? &sim : NULL, &c);
        if (st != CT_OK) break;
        const size_t *mem = c.mem;
        const size_t phi = c.phi;
        const int inflight = c.inflight;
        const double acts = c.acts, dp_bytes = c.dp_bytes, tp_bytes = c.tp_bytes,
                     cp_bytes = c.cp_bytes, pp_bytes = c.pp_bytes;
        if (json) {
            fprintf(out,
                    "{\"stage\": %d, \"params_bytes\": %zu, \"grads_bytes\": %zu, "
                    "\"optim_bytes\": %zu, \"master_bytes\": %zu, \"acts_bytes\": %.0f, "
                    "\"inflight\": %d, \"dp_bytes\": %.0f, \"tp_bytes\": %.0f, "
                    "\"pp_bytes\": %.0f, \"cp_bytes\": %.0f, \"ep_bytes\": %.0f, "
                    "\"precision\": \"%s\"}\n",
                    r, mem[CT_MEM_PARAMS], mem[CT_MEM_GRADS], mem[CT_MEM_OPTIM], mem[CT_MEM_MASTER],
                    acts, inflight, dp_bytes, tp_bytes, pp_bytes, cp_bytes, c.ep_bytes,
                    ct_dtype_name(pdt));
            continue;
        }
        char a[6][32], b[3][32];
        fprintf(out,
                "  %5d | %11s | %11s | %11s | %11s | %11s | %11s (%3d)     | %13s | %13s | %13s\n",
                r, ct_format_bytes(a[0], 32, (double)phi),
                ct_format_bytes(a[1], 32, (double)mem[CT_MEM_PARAMS]),
                ct_format_bytes(a[2], 32, (double)mem[CT_MEM_GRADS]),
                ct_format_bytes(a[3], 32, (double)mem[CT_MEM_OPTIM]),
                ct_format_bytes(a[4], 32, (double)mem[CT_MEM_MASTER]),
                ct_format_bytes(a[5], 32, acts), inflight, ct_format_bytes(b[0], 32, dp_bytes),
                ct_format_bytes(b[1], 32, tp_bytes), ct_format_bytes(b[2], 32, pp_bytes));
        if (cp > 1)
            fprintf(out,
                    "        cp ring bytes/step: %s (parallel/README.md, Context parallelism)\n",
                    ct_format_bytes(b[0], 32, cp_bytes));
        if (cfg->model.moe_experts)
            fprintf(out,
                    "        MoE: %lld of %lld experts a layer on each rank; ep all-to-all "
                    "bytes/step under uniform routing: %s (parallel/README.md, Expert "
                    "parallelism)\n",
                    (long long)(cfg->model.moe_experts / ep), (long long)cfg->model.moe_experts,
                    ct_format_bytes(b[0], 32, c.ep_bytes));
    }
    ct_backend_free(be);
    if (sched) {
        if (!json) {
            fprintf(out, "\n");
            ct_schedule_print(sched, backward_ratio, out);
        }
        ct_sim_result_release(&sim);
        ct_schedule_free(sched);
    }
    return st;
}
