/*
 * plan_search.c — `cooktrain plan --search N` (plan_search.h): every valid layout of a config on
 * N devices of a hardware model, the ones that fit, their estimated step time, best first.
 *
 * Layouts: tp (with and without sequence parallelism), cp (when seq_len splits into 2·cp pieces),
 * pp and dp over N's divisors, ep over dp's that divide the experts (MoE models), ZeRO 0-3, 1F1B
 * or interleaved with v = 2 .. min(8, layers / pp) virtual stages, power-of-two micro-batches,
 * recompute off and on; the config's validation decides what is valid. Sequence parallelism
 * costs no time here (its allgather and reduce-scatter move an allreduce's bytes, plus the norms'
 * gradients) and saves activation memory, so at equal time it wins on memory.
 *
 * The step-time model (parallel/README.md, Plan search), per device:
 *   compute   = FLOPs per token × tokens per step / N × (4/3 with full recompute)
 *               / (peak FLOP/s of the precision × GEMM efficiency), stretched by the pipeline's
 *               bubble: × total / busy of the schedule's simulation (unit costs, backward 2×);
 *   tp, cp    = their bytes per step (the trainer's formulas) / the link's bandwidth + one latency
 *               per collective; on the critical path, not overlapped;
 *   dp        = bytes / bandwidth, hidden behind the backward (2/3 of compute; ZeRO 3's gathers
 *               also behind the forward: all of it) — only the excess is exposed;
 *   pp, ep    = bytes / bandwidth (sends, all-to-alls), exposed.
 * A group's link is the node's (intra) when its ranks share a node under rank order (tp fastest,
 * then cp, dp, pp, devices_per_node consecutive ranks a node), else the network (inter).
 * Memory: the largest stage's params + grads + optimizer + master + peak activations must fit in
 * 90% of the device (the rest: workspace, the allocator, the runtime).
 */
#include "plan_search.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "core/backend/backend.h"
#include "core/backend/gemm_bench.h"
#include "parallel/plan.h"

/* ---- hardware profiles -------------------------------------------------------------------- */

/* Datasheet figures: dense (no sparsity) peaks; HBM; NVLink per GPU per direction; one NIC per
 * GPU (NDR 400 Gb/s on H100/H200 systems, HDR 200 Gb/s on A100). */
static const ct_hardware builtin[] = {
    {"h100-sxm", 989e12, 67e12, 0.70, 80e9, 3.35e12, 8, 450e9, 5e-6, 50e9, 10e-6},
    {"h200", 989e12, 67e12, 0.70, 141e9, 4.8e12, 8, 450e9, 5e-6, 50e9, 10e-6},
    {"a100", 312e12, 19.5e12, 0.70, 80e9, 2.0e12, 8, 300e9, 5e-6, 25e9, 10e-6},
};

static const struct {
    const char *key;
    size_t offset;
    bool integer;
} hw_keys[] = {
    {"peak_flops_bf16", offsetof(ct_hardware, peak_bf16), false},
    {"peak_flops_fp32", offsetof(ct_hardware, peak_fp32), false},
    {"gemm_efficiency", offsetof(ct_hardware, gemm_efficiency), false},
    {"memory_bytes", offsetof(ct_hardware, memory_bytes), false},
    {"memory_bandwidth", offsetof(ct_hardware, memory_bandwidth), false},
    {"devices_per_node", offsetof(ct_hardware, devices_per_node), true},
    {"intra_node_bandwidth", offsetof(ct_hardware, intra_bw), false},
    {"intra_node_latency", offsetof(ct_hardware, intra_lat), false},
    {"inter_node_bandwidth", offsetof(ct_hardware, inter_bw), false},
    {"inter_node_latency", offsetof(ct_hardware, inter_lat), false},
};
enum { N_HW_KEYS = sizeof hw_keys / sizeof hw_keys[0] };

ct_status ct_hardware_measure_cpu(ct_hardware *hw) {
    memset(hw, 0, sizeof *hw);
    snprintf(hw->name, sizeof hw->name, "cpu");
    ct_backend *be = NULL;
    char chosen[160], how[160];
    CT_TRY(ct_backend_new(&be, "cpu", 1, chosen, sizeof chosen));
    /* a device is a core (one rank of one thread); GEMMs measured at a small model's MLP shape */
    hw->peak_fp32 = ct_backend_peak_flops(be, CT_DTYPE_F32, how, sizeof how);
    hw->peak_bf16 = ct_backend_peak_flops(be, CT_DTYPE_BF16, how, sizeof how);
    double rate = ct_gemm_bench_rate(be, 256, 1024, 256, CT_DTYPE_F32, 5);
    hw->gemm_efficiency = hw->peak_fp32 > 0 ? fmin(1.0, rate / hw->peak_fp32) : 0.5;
    /* memory bandwidth, and the shared-memory "link" between ranks: a 64 MiB copy */
    size_t bytes = (size_t)64 << 20;
    char *a = ct_xmalloc(bytes), *b = ct_xmalloc(bytes);
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        double t0 = ct_now();
        memcpy(b, a, bytes);
        best = fmin(best, ct_now() - t0);
    }
    free(a);
    free(b);
    ct_backend_free(be);
    hw->memory_bandwidth = 2.0 * (double)bytes / best; /* read + write */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    hw->devices_per_node = cores > 0 ? (int)cores : 1;
    hw->memory_bytes =
        pages > 0 && page > 0 ? (double)pages * (double)page / hw->devices_per_node : 1e9;
    /* MPI between processes of one machine: a copy through shared memory, one each way */
    hw->intra_bw = (double)bytes / best / 2.0;
    hw->intra_lat = 2e-6;
    /* between machines: 10 Gb/s Ethernet, TCP */
    hw->inter_bw = 1.25e9;
    hw->inter_lat = 30e-6;
    return CT_OK;
}

void ct_hardware_print_yaml(const ct_hardware *hw, FILE *out) {
    fprintf(out, "# cooktrain hardware profile: %s\n", hw->name);
    for (int i = 0; i < N_HW_KEYS; i++) {
        const char *p = (const char *)hw + hw_keys[i].offset;
        if (hw_keys[i].integer)
            fprintf(out, "%s: %d\n", hw_keys[i].key, *(const int *)p);
        else
            fprintf(out, "%s: %.4g\n", hw_keys[i].key, *(const double *)p);
    }
}

static ct_status hw_bad(const char *path, const char *what, const char *key) {
    ct_error(CT_ERR_INPUT, "hardware profile '%s': %s%s%s", path, what, key ? " " : "",
             key ? key : "");
    ct_hint("a profile is a YAML mapping of numbers: peak_flops_bf16, peak_flops_fp32, "
            "gemm_efficiency, memory_bytes, memory_bandwidth, devices_per_node, "
            "intra_node_bandwidth, intra_node_latency, inter_node_bandwidth, inter_node_latency "
            "(`cooktrain plan --calibrate` writes one for this machine)");
    return CT_ERR_INPUT;
}

/* A file: a flat YAML mapping of every key above to a positive number. */
static ct_status read_profile(const char *path, ct_hardware *hw) {
    FILE *f = fopen(path, "r");
    if (!f) return hw_bad(path, "cannot be read", NULL);
    memset(hw, 0, sizeof *hw);
    const char *slash = strrchr(path, '/');
    snprintf(hw->name, sizeof hw->name, "%s", slash ? slash + 1 : path);
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    ct_status st = CT_OK;
    bool seen[N_HW_KEYS] = {false};
    char key[64] = "";
    int depth = 0;
    for (bool done = false; !done && st == CT_OK;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            st = hw_bad(path, parser.problem ? parser.problem : "is not YAML", NULL);
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = true; break;
        case YAML_MAPPING_START_EVENT:
            if (++depth > 1) st = hw_bad(path, "has a nested mapping under", key);
            break;
        case YAML_MAPPING_END_EVENT: depth--; break;
        case YAML_SEQUENCE_START_EVENT: st = hw_bad(path, "has a list under", key); break;
        case YAML_SCALAR_EVENT: {
            const char *v = (const char *)ev.data.scalar.value;
            if (!key[0]) {
                snprintf(key, sizeof key, "%s", v);
                break;
            }
            int k = 0;
            while (k < N_HW_KEYS && strcmp(hw_keys[k].key, key) != 0) k++;
            char *end = NULL;
            double x = strtod(v, &end);
            if (k == N_HW_KEYS)
                st = hw_bad(path, "has an unknown key", key);
            else if (!end || *end || !(x > 0) || !isfinite(x))
                st = hw_bad(path, "needs a positive number for", key);
            else if (hw_keys[k].integer) {
                if (x != floor(x) || x > 1 << 20)
                    st = hw_bad(path, "needs a whole number for", key);
                else
                    *(int *)((char *)hw + hw_keys[k].offset) = (int)x;
            } else {
                *(double *)((char *)hw + hw_keys[k].offset) = x;
            }
            if (k < N_HW_KEYS) seen[k] = true;
            key[0] = '\0';
            break;
        }
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    fclose(f);
    for (int k = 0; k < N_HW_KEYS && st == CT_OK; k++)
        if (!seen[k]) st = hw_bad(path, "lacks", hw_keys[k].key);
    if (st == CT_OK && hw->gemm_efficiency > 1)
        st = hw_bad(path, "needs at most 1 for", "gemm_efficiency");
    return st;
}

ct_status ct_hardware_load(const char *name, ct_hardware *hw) {
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        if (!strcmp(name, builtin[i].name)) {
            *hw = builtin[i];
            return CT_OK;
        }
    if (!strcmp(name, "cpu")) return ct_hardware_measure_cpu(hw);
    if (!strchr(name, '/') && !strchr(name, '.')) {
        ct_error(CT_ERR_INPUT, "--hardware %s: no such profile", name);
        ct_hint("built-in profiles: h100-sxm, h200, a100, cpu (this machine, measured); or a "
                "YAML file's path");
        return CT_ERR_INPUT;
    }
    return read_profile(name, hw);
}

/* ---- the search --------------------------------------------------------------------------- */

typedef struct candidate {
    int tp, cp, pp, dp, ep, zero, v, recompute;
    bool sp; /* sequence parallel */
    ct_schedule_kind schedule;
    int64_t micro_batch;
    double mem, compute, tp_s, cp_s, dp_s, dp_exposed, pp_s, ep_s, bubble, step;
    ct_plan_stage first; /* stage 0's rank, as `plan --json` and the trainer's rank 0 count */
    bool tp_inter, cp_inter, dp_inter, pp_inter, ep_inter;
} candidate;

/* Whether a group of `size` ranks `stride` apart stays inside one node. */
static bool inside_node(int stride, int size, int per_node) {
    return size <= 1 || (stride * size <= per_node && per_node % (stride * size) == 0);
}

static double link_time(const ct_hardware *hw, bool inter, double bytes, double calls) {
    if (bytes <= 0) return 0.0;
    return inter ? bytes / hw->inter_bw + calls * hw->inter_lat
                 : bytes / hw->intra_bw + calls * hw->intra_lat;
}

/* Evaluates one layout: false when it is not valid for the config (silently) or errs. */
static bool evaluate(const ct_config *base, int n, const ct_hardware *hw, ct_backend *be,
                     candidate *c) {
    ct_config cfg = *base;
    cfg.parallel.tp = c->tp;
    cfg.parallel.pp = c->pp;
    cfg.parallel.cp = c->cp;
    cfg.parallel.ep = c->ep;
    cfg.parallel.dp = c->dp;
    cfg.parallel.zero_stage = c->zero;
    cfg.parallel.schedule = c->schedule;
    cfg.parallel.virtual_stages = c->v;
    cfg.parallel.sequence_parallel = c->sp;
    cfg.train.micro_batch = c->micro_batch;
    cfg.train.micro_batch_auto = false;
    cfg.train.recompute = c->recompute ? CT_RECOMPUTE_FULL : CT_RECOMPUTE_NONE;
    if (ct_config_validate(&cfg, n) != CT_OK) {
        ct_error_clear();
        return false;
    }
    const int m = (int)cfg.derived.grad_accum;
    ct_schedule *sched = NULL;
    ct_sim_result sim = {0};
    double stretch = 1.0;
    if (c->pp > 1) {
        if (ct_schedule_check(c->schedule, c->pp, c->v, m) != CT_OK) {
            ct_error_clear();
            return false;
        }
        sched = ct_schedule_new(c->schedule, c->pp, c->v, m);
        if (!sched) {
            ct_error_clear();
            return false;
        }
        sim = ct_schedule_simulate(sched, 2.0);
        double busy = 0;
        for (int r = 0; r < c->pp; r++) busy = fmax(busy, sim.busy[r]);
        stretch = busy > 0 ? sim.total_time / busy : 1.0;
    }
    ct_plan_stage worst = {0}, st;
    double most = -1;
    bool ok = true;
    for (int r = 0; r < c->pp && ok; r++) {
        if (ct_plan_stage_cost(&cfg, r, be, sched ? &sim : NULL, &st) != CT_OK) {
            ct_error_clear();
            ok = false;
            break;
        }
        double mem = st.acts;
        for (int k = 0; k < CT_MEM_COUNT; k++) mem += (double)st.mem[k];
        most = fmax(most, mem);
        /* the slowest stage sets the pace: each cost at its largest over the stages */
        worst.flops_per_token = fmax(worst.flops_per_token, st.flops_per_token);
        worst.tp_bytes = fmax(worst.tp_bytes, st.tp_bytes);
        worst.dp_bytes = fmax(worst.dp_bytes, st.dp_bytes);
        worst.pp_bytes = fmax(worst.pp_bytes, st.pp_bytes);
        worst.ep_bytes = fmax(worst.ep_bytes, st.ep_bytes);
        worst.cp_bytes = fmax(worst.cp_bytes, st.cp_bytes);
        if (r == 0) c->first = st;
    }
    if (sched) {
        ct_sim_result_release(&sim);
        ct_schedule_free(sched);
    }
    if (!ok) return false;
    const double tokens = (double)cfg.train.global_batch * (double)cfg.model.seq_len;
    const double peak = cfg.derived.precision == CT_PRECISION_BF16 ? hw->peak_bf16 : hw->peak_fp32;
    const double flops = worst.flops_per_token * tokens / n * (c->recompute ? 4.0 / 3.0 : 1.0);
    const double pure = flops / (peak * hw->gemm_efficiency);
    c->compute = pure * stretch;
    c->bubble = c->compute - pure;
    c->mem = most;
    const int per = hw->devices_per_node;
    /* rank order: tp fastest, then cp, dp (ep: consecutive dp ranks), pp */
    c->tp_inter = !inside_node(1, c->tp, per);
    c->cp_inter = !inside_node(c->tp, c->cp, per);
    c->dp_inter = !inside_node(c->tp * c->cp, c->dp, per);
    c->ep_inter = !inside_node(c->tp * c->cp, c->ep, per);
    c->pp_inter = !inside_node(c->tp * c->cp * c->dp, c->pp, per);
    const double layers = (double)cfg.model.n_layer / c->pp;
    /* tp: about four collectives a layer and microbatch, forward and backward */
    c->tp_s = link_time(hw, c->tp_inter, worst.tp_bytes, 4.0 * layers * m);
    c->dp_s = link_time(hw, c->dp_inter, worst.dp_bytes, layers + 2);
    c->pp_s = link_time(hw, c->pp_inter, worst.pp_bytes, 2.0 * m * c->v);
    c->ep_s = link_time(hw, c->ep_inter, worst.ep_bytes, 4.0 * layers * m);
    /* ring attention: two hops a layer and microbatch each way, forward and backward */
    c->cp_s = link_time(hw, c->cp_inter, worst.cp_bytes, 4.0 * layers * m);
    const double hide = c->zero == 3 ? pure : pure * 2.0 / 3.0;
    c->dp_exposed = fmax(0.0, c->dp_s - hide);
    c->step = c->compute + c->tp_s + c->cp_s + c->dp_exposed + c->pp_s + c->ep_s;
    return true;
}

/* Faster first; at equal time, less traffic (what the model hides may still cost), then less
 * memory. */
static int by_step(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    double tx = x->tp_s + x->dp_s + x->pp_s + x->ep_s, ty = y->tp_s + y->dp_s + y->pp_s + y->ep_s;
    if (tx != ty) return tx < ty ? -1 : 1;
    return x->mem < y->mem ? -1 : x->mem > y->mem ? 1 : 0;
}

/* Why this layout: its costs in words, the largest first. */
static void reasons(const candidate *c, const ct_hardware *hw, char *buf, size_t n) {
    size_t used = 0;
#define SAY(...) used += (size_t)snprintf(buf + used, used < n ? n - used : 0, __VA_ARGS__)
    if (c->tp == 1)
        SAY("no tp traffic");
    else
        SAY("tp %d on %s (%.1f ms)%s", c->tp, c->tp_inter ? "the network" : "the node's links",
            1e3 * c->tp_s,
            c->sp ? ", sequence parallel (activations and pipeline sends / tp)" : "");
    if (c->cp > 1)
        SAY("; cp %d ring on %s (%.1f ms)", c->cp, c->cp_inter ? "the network" : "the node's links",
            1e3 * c->cp_s);
    if (c->ep > 1)
        SAY("; ep %d all-to-all on %s (%.1f ms)", c->ep,
            c->ep_inter ? "the network" : "the node's links", 1e3 * c->ep_s);
    if (c->pp == 1)
        SAY("; no bubble");
    else
        SAY("; bubble %.0f%% of compute", 100.0 * c->bubble / (c->compute - c->bubble));
    if (c->dp > 1)
        SAY("; dp reduction %.1f ms over %s, %s", 1e3 * c->dp_s,
            c->dp_inter ? "the network" : "the node's links",
            c->dp_exposed > 0 ? "partly exposed" : "hidden behind the backward");
    SAY("; %s", c->recompute ? "recompute (4/3 of the FLOPs) to fit" : "no recompute");
    SAY("; %.0f%% of device memory", 100.0 * c->mem / hw->memory_bytes);
#undef SAY
}

static void print_hw(const ct_hardware *hw, int n, FILE *out) {
    int nodes = (n + hw->devices_per_node - 1) / hw->devices_per_node;
    fprintf(out,
            "search: %d devices (%d node%s of %d) of %s: %.0f TFLOP/s bf16, %.1f fp32, GEMMs at "
            "%.0f%% of peak, %.1f GiB, node links %.0f GB/s (%.0f us), network %.1f GB/s "
            "(%.0f us)\n",
            n, nodes, nodes == 1 ? "" : "s", CT_MIN(n, hw->devices_per_node), hw->name,
            hw->peak_bf16 / 1e12, hw->peak_fp32 / 1e12, 100 * hw->gemm_efficiency,
            hw->memory_bytes / (1024.0 * 1024 * 1024), hw->intra_bw / 1e9, hw->intra_lat * 1e6,
            hw->inter_bw / 1e9, hw->inter_lat * 1e6);
}

ct_status ct_plan_search(const ct_config *base, int n, const ct_hardware *hw, int top, bool json,
                         FILE *out) {
    ct_backend *be = NULL;
    char chosen[160];
    CT_TRY(ct_backend_new(&be, "cpu", 1, chosen, sizeof chosen));
    int cap = 256, count = 0, valid = 0;
    candidate *list = ct_xmalloc((size_t)cap * sizeof *list);
    const int64_t G = base->train.global_batch;
    /* cp when the config's sequences split (seq_len a multiple of 2·cp); ep over dp's divisors
     * that divide the experts, when the model has them */
    const int64_t T = base->model.seq_len, E = base->model.moe_experts;
    for (int tp = 1; tp <= n; tp++) {
        if (n % tp) continue;
        for (int cp = 1; cp <= n / tp; cp++) {
            if ((n / tp) % cp || (cp > 1 && T % (2 * cp))) continue;
            for (int pp = 1; pp <= n / tp / cp; pp++) {
                if ((n / tp / cp) % pp) continue;
                int dp = n / tp / cp / pp;
                if (G % dp) continue;
                for (int ep = 1; ep <= dp; ep++) {
                    if (dp % ep || (ep > 1 && (!E || E % ep))) continue;
                    for (int zero = 0; zero <= 3; zero++) {
                        if (dp * cp == 1 && zero > 0) continue; /* nothing to shard */
                        /* v 1: 1F1B; 2 and up: interleaved */
                        const int vmax = pp == 1 ? 1 : (int)CT_MIN(8, base->model.n_layer / pp);
                        for (int v = 1; v <= vmax; v++)
                            for (int sp = 0; sp <= (tp > 1); sp++)
                                for (int64_t mb = 1; mb <= G / dp; mb *= 2) {
                                    if ((G / dp) % mb) continue;
                                    for (int rc = 0; rc < 2; rc++) {
                                        candidate c = {.tp = tp,
                                                       .cp = cp,
                                                       .pp = pp,
                                                       .dp = dp,
                                                       .ep = ep,
                                                       .zero = zero,
                                                       .v = v,
                                                       .sp = sp,
                                                       .recompute = rc,
                                                       .schedule = v > 1 ? CT_SCHEDULE_INTERLEAVED
                                                                         : CT_SCHEDULE_1F1B,
                                                       .micro_batch = mb};
                                        if (!evaluate(base, n, hw, be, &c)) continue;
                                        valid++;
                                        if (c.mem > 0.9 * hw->memory_bytes) continue;
                                        if (count == cap) {
                                            cap *= 2;
                                            list = realloc(list, (size_t)cap * sizeof *list);
                                            CT_ASSERT(list != NULL);
                                        }
                                        list[count++] = c;
                                    }
                                }
                    }
                }
            }
        }
    }
    ct_backend_free(be);
    qsort(list, (size_t)count, sizeof *list, by_step);
    const double tokens = (double)G * (double)base->model.seq_len;
    if (!json) {
        print_hw(hw, n, out);
        fprintf(out,
                "%d layouts valid for this config, %d fit in 90%% of device memory; the "
                "best by estimated step time (parallel/README.md, Plan search):\n",
                valid, count);
        fprintf(out, "  # |  tp sp  cp  pp  dp  ep ZeRO schedule      mb recompute | memory     | "
                     "compute    tp+cp     dp (exposed)       pp+ep    | step       tokens/s\n");
    }
    for (int i = 0; i < count && i < top; i++) {
        const candidate *c = &list[i];
        if (json) {
            fprintf(
                out,
                "{\"tp\": %d, \"cp\": %d, \"pp\": %d, \"dp\": %d, \"ep\": %d, \"zero_stage\": %d, "
                "\"sequence_parallel\": %s, \"schedule\": "
                "\"%s\", \"virtual_stages\": %d, \"micro_batch\": %lld, \"recompute\": %s, "
                "\"memory_bytes\": %.0f, \"compute_s\": %.6g, \"bubble_s\": %.6g, \"tp_s\": "
                "%.6g, \"cp_s\": %.6g, \"dp_s\": %.6g, \"dp_exposed_s\": %.6g, \"pp_s\": %.6g, "
                "\"ep_s\": "
                "%.6g, \"step_s\": %.6g, \"tokens_per_s\": %.6g, \"tp_inter\": %s, "
                "\"dp_inter\": %s, \"pp_inter\": %s, \"stage0\": {\"params_bytes\": %zu, "
                "\"grads_bytes\": %zu, \"optim_bytes\": %zu, \"master_bytes\": %zu, "
                "\"dp_bytes\": %.0f, \"tp_bytes\": %.0f}}\n",
                c->tp, c->cp, c->pp, c->dp, c->ep, c->zero, c->sp ? "true" : "false",
                ct_schedule_kind_name(c->schedule), c->v, (long long)c->micro_batch,
                c->recompute ? "true" : "false", c->mem, c->compute, c->bubble, c->tp_s, c->cp_s,
                c->dp_s, c->dp_exposed, c->pp_s, c->ep_s, c->step, tokens / c->step,
                c->tp_inter ? "true" : "false", c->dp_inter ? "true" : "false",
                c->pp_inter ? "true" : "false", c->first.mem[CT_MEM_PARAMS],
                c->first.mem[CT_MEM_GRADS], c->first.mem[CT_MEM_OPTIM], c->first.mem[CT_MEM_MASTER],
                c->first.dp_bytes, c->first.tp_bytes);
            continue;
        }
        char mem[32], why[512], sched[24];
        snprintf(sched, sizeof sched, "%s", c->pp > 1 ? ct_schedule_kind_name(c->schedule) : "-");
        if (c->pp > 1 && c->v > 1) snprintf(sched, sizeof sched, "interleaved v%d", c->v);
        reasons(c, hw, why, sizeof why);
        fprintf(out,
                "%3d | %3d %2s %3d %3d %3d %3d %4d %-14s %3lld %-9s | %-10s | %7.2f ms %6.2f ms "
                "%6.2f ms (%6.2f) %6.2f ms | %7.2f ms %9.0f\n      %s\n",
                i + 1, c->tp, c->sp ? "y" : "-", c->cp, c->pp, c->dp, c->ep, c->zero, sched,
                (long long)c->micro_batch, c->recompute ? "full" : "none",
                ct_format_bytes(mem, sizeof mem, c->mem), 1e3 * c->compute,
                1e3 * (c->tp_s + c->cp_s), 1e3 * c->dp_s, 1e3 * c->dp_exposed,
                1e3 * (c->pp_s + c->ep_s), 1e3 * c->step, tokens / c->step, why);
    }
    ct_status st = CT_OK;
    if (count == 0) {
        ct_error(CT_ERR_INPUT, "no layout of this config fits on %d devices of %s (%d valid)", n,
                 hw->name, valid);
        ct_hint("more devices, a smaller train.global_batch or seq_len, bf16 "
                "(train.precision), or a profile with more memory");
        st = CT_ERR_INPUT;
    }
    free(list);
    return st;
}
