/*
 * plan_search.c — `cooktrain plan --search N` (plan_search.h): every valid layout of a config on
 * N devices of a hardware model, the ones that fit, their estimated step time, best first; and
 * parallel.auto_layout's choice, the same search over the pipeline depths and micro-batches of
 * one config (ct_plan_choose_layout).
 *
 * Layouts: tp (with and without sequence parallelism), cp (when seq_len splits into 2·cp pieces),
 * pp and dp over N's divisors, ep over dp's that divide the experts (MoE models), ZeRO 0-3, 1F1B
 * or interleaved with v = 2 .. min(8, layers / pp) virtual stages, and the zero-bubble ZB-H1
 * (v = 1) and ZB-V (v = 2), whose activations include each microbatch's record for its weight
 * parts (ct_model_wgrad_stash_bytes), power-of-two micro-batches,
 * recompute off and on; the config's validation decides what is valid. Sequence parallelism
 * costs no time here (its allgather and reduce-scatter move an allreduce's bytes, plus the norms'
 * gradients) and saves activation memory, so at equal time it wins on memory.
 *
 * The step-time model (parallel/README.md, Plan search), per device:
 *   compute   = FLOPs per token × tokens per step / N × (4/3 with full recompute)
 *               / (peak FLOP/s of the precision × GEMM efficiency), stretched by the pipeline's
 *               bubble: × total / busy of the schedule's simulation (unit costs, backward 2×,
 *               a split one's parts 1× each; the split's copies are not counted);
 *   tp, cp    = their bytes per step (the trainer's formulas) / the link's bandwidth + one latency
 *               per collective; on the critical path, not overlapped;
 *   dp        = bytes / bandwidth, hidden behind the backward (2/3 of compute; ZeRO 3's gathers
 *               also behind the forward: all of it) — only the excess is exposed;
 *   pp, ep    = bytes / bandwidth (sends, all-to-alls), exposed.
 * A group's link is the node's (intra) when every group of its dimension stays inside a node under
 * rank order (tp fastest, then cp, dp, pp; devices_per_node consecutive ranks a node, the last
 * node what is left), else the network (inter).
 * Memory: the largest stage's params + grads + optimizer + master + peak activations must fit in
 * 90% of the device (the rest: workspace, the allocator, the runtime).
 *
 * Cost of the search itself: a layout's price is mostly building its stages' models (registry,
 * units, activation sizes), so the models are built once per shape — grid, virtual stages,
 * sequence parallelism, recompute — and serve its ZeRO stages and micro-batches, and each
 * schedule is simulated once per (schedule, pp, v, microbatches) for the whole search.
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

/* ---- where groups sit --------------------------------------------------------------------- */

/* The nodes of n devices: devices_per_node consecutive ranks each — the order in which mpirun's
 * --map-by slot and SLURM's block distribution fill them — and the last node whatever is left
 * (12 devices of 8 a node: a node of 8 and a node of 4; 6 devices: one node of 6). */
typedef struct nodes {
    int per;   /* devices of a full node: the profile's devices_per_node */
    int count; /* nodes */
    int last;  /* devices of the last node: per, or fewer */
} nodes;

static nodes nodes_of(int n, int per) {
    nodes s = {.per = per, .count = (n + per - 1) / per};
    s.last = n - (s.count - 1) * per;
    return s;
}

/* "1 node of 6", "2 nodes of 8", "1 node of 8 and 1 of 4" */
static void describe_nodes(nodes s, char *buf, size_t cap) {
    if (s.count == 1)
        snprintf(buf, cap, "1 node of %d", s.last);
    else if (s.last == s.per)
        snprintf(buf, cap, "%d nodes of %d", s.count, s.per);
    else
        snprintf(buf, cap, "%d node%s of %d and 1 of %d", s.count - 1, s.count == 2 ? "" : "s",
                 s.per, s.last);
}

/* Whether some group of a dimension — `size` ranks `stride` apart under the rank order — spans
 * two nodes, on n devices of `per` a node. The groups of a dimension run their collectives in
 * step, so one group across a node boundary (a tp 3 group on ranks 6-8 of nodes of 8, or one that
 * reaches into a partial last node) sets the pace for all: the whole dimension pays the network.
 * A group's ranks increase and a node is a range of ranks, so a group is inside a node when its
 * first and last ranks are. */
static bool crosses_nodes(int n, int per, int stride, int size) {
    if (size <= 1) return false;
    for (int first = 0; first < n; first++) {
        if ((first / stride) % size) continue; /* not the first rank of its group */
        if (first / per != (first + stride * (size - 1)) / per) return true;
    }
    return false;
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

/* A schedule simulated once for the whole search: it depends on the schedule, pp, v and the
 * microbatch count only, and the same ones recur across tp, cp, dp, sequence parallelism,
 * recompute and ZeRO. */
typedef struct schedule_memo {
    ct_schedule_kind kind;
    int pp, v, m;
    bool ok; /* the schedule can run m microbatches */
    ct_sim_result sim;
    double stretch; /* the makespan over the busiest rank's work */
} schedule_memo;

/* The search: what it was asked and what it found. */
typedef struct search {
    const ct_config *base;
    bool keep; /* parallel.auto_layout's search: only pp, dp and the micro-batch vary */
    int n;
    const ct_hardware *hw;
    nodes nodes;
    ct_backend *be;
    candidate *list; /* the valid layouts that fit */
    int count, cap, valid;
    char refusal[512], refusal_hint[512]; /* the first refused layout's reason */
    schedule_memo *schedules;
    int n_schedules;
} search;

/* The schedule of layout c (pp > 1) on m microbatches, simulated at its first use. */
static const schedule_memo *search_schedule(search *s, const candidate *c, int m) {
    for (int i = 0; i < s->n_schedules; i++) {
        const schedule_memo *o = &s->schedules[i];
        if (o->kind == c->schedule && o->pp == c->pp && o->v == c->v && o->m == m) return o;
    }
    s->schedules = realloc(s->schedules, (size_t)(s->n_schedules + 1) * sizeof *s->schedules);
    CT_ASSERT(s->schedules != NULL);
    schedule_memo *o = &s->schedules[s->n_schedules++];
    *o = (schedule_memo){.kind = c->schedule, .pp = c->pp, .v = c->v, .m = m, .stretch = 1.0};
    ct_schedule *sched = NULL;
    if (ct_schedule_check(c->schedule, c->pp, c->v, m) == CT_OK)
        sched = ct_schedule_new(c->schedule, c->pp, c->v, m);
    if (!sched) {
        ct_error_clear();
        return o;
    }
    o->sim = ct_schedule_simulate(sched, 2.0);
    ct_schedule_free(sched);
    double busy = 0;
    for (int r = 0; r < c->pp; r++) busy = fmax(busy, o->sim.busy[r]);
    o->stretch = busy > 0 ? o->sim.total_time / busy : 1.0;
    o->ok = true;
    return o;
}

static void search_release(search *s) {
    for (int i = 0; i < s->n_schedules; i++)
        if (s->schedules[i].ok) ct_sim_result_release(&s->schedules[i].sim);
    free(s->schedules);
    free(s->list);
}

/* What the layouts of one shape — grid, virtual stages, sequence parallelism, recompute — share
 * over their ZeRO stages and micro-batches: the stages' models, built at the shape's first valid
 * layout. Building a model is most of a layout's cost, and nothing in it depends on the ZeRO
 * stage or the micro-batch (plan.h, ct_plan_stage_model). */
typedef struct shape {
    candidate proto; /* the grid, v, sp, recompute and placement of every layout of the shape */
    ct_model **models;
    bool models_failed;
} shape;

static void shape_release(shape *sh) {
    for (int r = 0; sh->models && r < sh->proto.pp; r++) ct_model_free(sh->models[r]);
    free(sh->models);
}

/* The shape's stage models, built from its first valid layout's config. */
static bool shape_models(shape *sh, const ct_config *cfg, ct_backend *be) {
    if (sh->models || sh->models_failed) return !sh->models_failed;
    sh->models = ct_xcalloc((size_t)sh->proto.pp, sizeof *sh->models);
    for (int r = 0; r < sh->proto.pp; r++)
        if (ct_plan_stage_model(cfg, r, be, &sh->models[r]) != CT_OK) {
            ct_error_clear();
            sh->models_failed = true;
            return false;
        }
    return true;
}

/* The config of layout c. */
static ct_config layout_config(const search *s, const candidate *c) {
    ct_config cfg = *s->base;
    cfg.parallel.pp = c->pp;
    cfg.parallel.dp = c->dp;
    cfg.train.micro_batch = c->micro_batch;
    cfg.train.micro_batch_auto = false;
    if (s->keep) return cfg;
    cfg.parallel.tp = c->tp;
    cfg.parallel.cp = c->cp;
    cfg.parallel.ep = c->ep;
    cfg.parallel.zero_stage = c->zero;
    cfg.parallel.schedule = c->schedule;
    cfg.parallel.virtual_stages = c->v;
    cfg.parallel.sequence_parallel = c->sp;
    cfg.train.recompute = c->recompute ? CT_RECOMPUTE_FULL : CT_RECOMPUTE_NONE;
    return cfg;
}

static double link_time(const ct_hardware *hw, bool inter, double bytes, double calls) {
    if (bytes <= 0) return 0.0;
    return inter ? bytes / hw->inter_bw + calls * hw->inter_lat
                 : bytes / hw->intra_bw + calls * hw->intra_lat;
}

/* Step time of c from its slowest stage's costs (the model in the file's opening comment). */
static void estimate(candidate *c, const ct_config *cfg, const ct_hardware *hw,
                     const ct_plan_stage *worst, double stretch) {
    const int m = (int)cfg->derived.grad_accum;
    const double tokens = (double)cfg->train.global_batch * (double)cfg->model.seq_len;
    const double peak = cfg->derived.precision == CT_PRECISION_BF16 ? hw->peak_bf16 : hw->peak_fp32;
    const int n = c->tp * c->cp * c->pp * c->dp;
    const double flops = worst->flops_per_token * tokens / n * (c->recompute ? 4.0 / 3.0 : 1.0);
    const double pure = flops / (peak * hw->gemm_efficiency);
    c->compute = pure * stretch;
    c->bubble = c->compute - pure;
    const double layers = (double)cfg->model.n_layer / c->pp;
    /* tp: about four collectives a layer and microbatch, forward and backward */
    c->tp_s = link_time(hw, c->tp_inter, worst->tp_bytes, 4.0 * layers * m);
    c->dp_s = link_time(hw, c->dp_inter, worst->dp_bytes, layers + 2);
    c->pp_s = link_time(hw, c->pp_inter, worst->pp_bytes, 2.0 * m * c->v);
    c->ep_s = link_time(hw, c->ep_inter, worst->ep_bytes, 4.0 * layers * m);
    /* ring attention: two hops a layer and microbatch each way, forward and backward */
    c->cp_s = link_time(hw, c->cp_inter, worst->cp_bytes, 4.0 * layers * m);
    const double hide = c->zero == 3 ? pure : pure * 2.0 / 3.0;
    c->dp_exposed = fmax(0.0, c->dp_s - hide);
    c->step = c->compute + c->tp_s + c->cp_s + c->dp_exposed + c->pp_s + c->ep_s;
}

/* Evaluates layout c of shape sh: false when the config refuses it (the first refusal is kept
 * for when none is valid) or its schedule cannot run. */
static bool evaluate(search *s, shape *sh, candidate *c) {
    ct_config cfg = layout_config(s, c);
    if (ct_config_validate(&cfg, s->n) != CT_OK) {
        if (!s->refusal[0]) {
            snprintf(s->refusal, sizeof s->refusal, "tp %d x cp %d x pp %d x dp %d: %s", c->tp,
                     c->cp, c->pp, c->dp, ct_error_message());
            snprintf(s->refusal_hint, sizeof s->refusal_hint, "%s",
                     ct_error_hint() ? ct_error_hint() : "");
        }
        ct_error_clear();
        return false;
    }
    const schedule_memo *sched =
        c->pp > 1 ? search_schedule(s, c, (int)cfg.derived.grad_accum) : NULL;
    if ((sched && !sched->ok) || !shape_models(sh, &cfg, s->be)) return false;
    ct_plan_stage worst = {0}, st;
    double most = -1;
    for (int r = 0; r < c->pp; r++) {
        if (ct_plan_stage_cost_of(&cfg, r, sh->models[r], sched ? &sched->sim : NULL, &st) !=
            CT_OK) {
            ct_error_clear();
            return false;
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
    c->mem = most;
    estimate(c, &cfg, s->hw, &worst, sched ? sched->stretch : 1.0);
    return true;
}

static void keep(search *s, const candidate *c) {
    if (s->count == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->list = realloc(s->list, (size_t)s->cap * sizeof *s->list);
        CT_ASSERT(s->list != NULL);
    }
    s->list[s->count++] = *c;
}

/* Every micro-batch and ZeRO stage of a shape. */
static void search_shape(search *s, shape *sh) {
    const int dp = sh->proto.dp, replicas = dp * sh->proto.cp;
    const int64_t per_rank = s->base->train.global_batch / dp;
    for (int64_t mb = 1; mb <= per_rank; mb *= 2) {
        if (per_rank % mb) continue;
        for (int zero = 0; zero <= 3; zero++) {
            if (s->keep ? zero != sh->proto.zero : replicas == 1 && zero > 0)
                continue; /* the configured stage; else nothing to shard */
            candidate c = sh->proto;
            c.micro_batch = mb;
            c.zero = zero;
            if (!evaluate(s, sh, &c)) continue;
            s->valid++;
            if (c.mem <= 0.9 * s->hw->memory_bytes) keep(s, &c);
        }
    }
}

/* A grid and where its groups sit (rank order: tp fastest, then cp, dp with ep's consecutive dp
 * ranks inside it, pp). */
static candidate grid_of(const search *s, int tp, int cp, int pp, int dp, int ep) {
    const int n = s->n, per = s->nodes.per;
    return (candidate){
        .tp = tp,
        .cp = cp,
        .pp = pp,
        .dp = dp,
        .ep = ep,
        .tp_inter = crosses_nodes(n, per, 1, tp),
        .cp_inter = crosses_nodes(n, per, tp, cp),
        .dp_inter = crosses_nodes(n, per, tp * cp, dp),
        .ep_inter = crosses_nodes(n, per, tp * cp, ep),
        .pp_inter = crosses_nodes(n, per, tp * cp * dp, pp),
    };
}

/* Every shape of one grid: virtual stages (1: 1F1B and ZB-H1; 2: interleaved and ZB-V; up to
 * min(8, layers / pp): interleaved), sequence parallelism and recompute. */
static void search_grid(search *s, int tp, int cp, int pp, int dp, int ep) {
    const candidate grid = grid_of(s, tp, cp, pp, dp, ep);
    const int vmax = pp == 1 ? 1 : (int)CT_MIN(8, s->base->model.n_layer / pp);
    for (int v = 1; v <= vmax; v++)
        for (int zb = 0; zb <= (pp > 1 && v <= 2); zb++) /* the zero-bubble one of the v */
            for (int sp = 0; sp <= (tp > 1); sp++)
                for (int rc = 0; rc < 2; rc++) {
                    shape sh = {.proto = grid};
                    sh.proto.v = v;
                    sh.proto.schedule = zb      ? (v > 1 ? CT_SCHEDULE_ZBV : CT_SCHEDULE_ZBH1)
                                        : v > 1 ? CT_SCHEDULE_INTERLEAVED
                                                : CT_SCHEDULE_1F1B;
                    sh.proto.sp = sp;
                    sh.proto.recompute = rc;
                    search_shape(s, &sh);
                    shape_release(&sh);
                }
}

/* Every grid tp × cp × pp × dp = n: cp when the config's sequences split (seq_len a multiple of
 * 2·cp), dp when it divides the batch; ep over dp's divisors that divide the experts, when the
 * model has them. */
static void search_grids(search *s) {
    const int n = s->n;
    const int64_t G = s->base->train.global_batch, T = s->base->model.seq_len;
    const int64_t E = s->base->model.moe_experts;
    for (int tp = 1; tp <= n; tp++) {
        if (n % tp) continue;
        for (int cp = 1; cp <= n / tp; cp++) {
            if ((n / tp) % cp || (cp > 1 && T % (2 * cp))) continue;
            for (int pp = 1; pp <= n / tp / cp; pp++) {
                if ((n / tp / cp) % pp) continue;
                const int dp = n / tp / cp / pp;
                if (G % dp) continue;
                for (int ep = 1; ep <= dp; ep++)
                    if (dp % ep == 0 && (ep == 1 || (E && E % ep == 0)))
                        search_grid(s, tp, cp, pp, dp, ep);
            }
        }
    }
}

/* ---- when no layout is valid -------------------------------------------------------------- */

/* The size each dimension splits, of a config validated on one device: tp must divide what the
 * heads, the key/value heads, d_ff and the padded vocabulary have in common, cp half the
 * sequence (each rank holds 2 of its 2·cp pieces), pp the layers, dp the global batch. */
typedef struct split_sizes {
    int64_t tp, cp, pp, dp;
} split_sizes;

static split_sizes split_sizes_of(const ct_config *one) {
    const ct_derived_config *d = &one->derived;
    return (split_sizes){
        .tp =
            ct_gcd64(ct_gcd64(one->model.n_head, d->n_kv_head), ct_gcd64(d->d_ff, d->vocab_padded)),
        .cp = one->model.seq_len / 2,
        .pp = one->model.n_layer,
        .dp = one->train.global_batch,
    };
}

static int times_divides(int64_t p, int64_t x) {
    int k = 0;
    for (; x > 0 && x % p == 0; x /= p) k++;
    return k;
}

/* Whether n splits into tp × cp × pp × dp each dividing its size. Each prime factor of n goes
 * to the dimensions independently of the others, so this holds exactly when every prime p of n
 * appears in the four sizes together at least as often as in n; else *prime is the first p that
 * does not (and *have how often the sizes hold it, *need how often n does). */
static bool grid_exists(int n, split_sizes z, int *prime, int *need, int *have) {
    for (int p = 2, rest = n; rest > 1; p++) {
        if (rest % p) continue;
        int e = 0;
        for (; rest % p == 0; rest /= p) e++;
        int cap = times_divides(p, z.tp) + times_divides(p, z.cp) + times_divides(p, z.pp) +
                  times_divides(p, z.dp);
        if (cap < e) {
            *prime = p, *need = e, *have = cap;
            return false;
        }
    }
    return true;
}

/* "6 or 8": the device counts nearest n, below and above (up to 2n), that split. */
static void nearest_counts(int n, split_sizes z, char *buf, size_t cap) {
    int p, e, h, below = n - 1, above = n + 1;
    while (below > 1 && !grid_exists(below, z, &p, &e, &h)) below--;
    while (above <= 2 * n && !grid_exists(above, z, &p, &e, &h)) above++;
    if (above <= 2 * n)
        snprintf(buf, cap, "%d or %d", below, above);
    else
        snprintf(buf, cap, "%d", below);
}

/* Why no layout of the config is valid on s->n devices: a factor of the device count that the
 * sizes the dimensions split do not hold (7 devices for a model of 12 heads and 12 layers),
 * else the config's own refusal. */
static ct_status explain_none_valid(const search *s) {
    const int n = s->n;
    ct_config one = *s->base;
    one.parallel.tp = one.parallel.cp = one.parallel.pp = one.parallel.ep = one.parallel.dp = 1;
    one.parallel.zero_stage = 0;
    one.parallel.virtual_stages = 1;
    one.parallel.schedule = CT_SCHEDULE_1F1B;
    one.parallel.sequence_parallel = false;
    one.train.micro_batch = 1;
    one.train.micro_batch_auto = false;
    int p = 0, need = 0, have = 0;
    if (ct_config_validate(&one, 1) == CT_OK) {
        const split_sizes z = split_sizes_of(&one);
        if (!grid_exists(n, z, &p, &need, &have)) {
            char sizes[320], near[64], factor[64] = "";
            snprintf(sizes, sizeof sizes,
                     "tp %lld (what model.n_head, n_kv_head, d_ff and the padded vocabulary "
                     "share), cp %lld (model.seq_len / 2), pp %lld (model.n_layer), dp %lld "
                     "(train.global_batch)",
                     (long long)z.tp, (long long)z.cp, (long long)z.pp, (long long)z.dp);
            nearest_counts(n, z, near, sizeof near);
            if (have == 0) {
                if (p != n) snprintf(factor, sizeof factor, ", a factor of %d,", n);
                ct_error(CT_ERR_INPUT,
                         "no layout of this config is valid on %d devices: %d%s divides none of "
                         "the sizes the parallel dimensions split: %s",
                         n, p, factor, sizes);
            } else {
                ct_error(CT_ERR_INPUT,
                         "no layout of this config is valid on %d devices: %d holds %d to the "
                         "power %d, the sizes the parallel dimensions split only %d to the power "
                         "%d together: %s",
                         n, n, p, need, p, have, sizes);
            }
            ct_hint("each of tp, cp, pp and dp divides its size, and their product is the device "
                    "count: try %s devices, or a config whose sizes %d divides",
                    near, p);
            return CT_ERR_INPUT;
        }
    }
    /* the config refuses every layout for another reason: say the first one's */
    ct_error(CT_ERR_INPUT, "no layout of this config is valid on %d devices; %s", n,
             s->refusal[0] ? s->refusal : "the config is refused on one device too");
    if (s->refusal_hint[0]) ct_hint("%s", s->refusal_hint);
    return CT_ERR_INPUT;
}

/* ---- the report --------------------------------------------------------------------------- */

/* Faster first; at equal time, less traffic (what the model hides may still cost), then less
 * memory. */
static int by_step(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    double tx = x->tp_s + x->dp_s + x->pp_s + x->ep_s, ty = y->tp_s + y->dp_s + y->pp_s + y->ep_s;
    if (tx != ty) return tx < ty ? -1 : 1;
    return x->mem < y->mem ? -1 : x->mem > y->mem ? 1 : 0;
}

static const char *link_name(bool inter) {
    return inter ? "the network" : "the node's links";
}

/* Why this layout: its costs in words, the largest first. */
static void reasons(const candidate *c, const ct_hardware *hw, char *buf, size_t n) {
    size_t used = 0;
#define SAY(...) used += (size_t)snprintf(buf + used, used < n ? n - used : 0, __VA_ARGS__)
    if (c->tp == 1)
        SAY("no tp traffic");
    else
        SAY("tp %d on %s (%.1f ms)%s", c->tp, link_name(c->tp_inter), 1e3 * c->tp_s,
            c->sp ? ", sequence parallel (activations and pipeline sends / tp)" : "");
    if (c->cp > 1)
        SAY("; cp %d ring on %s (%.1f ms)", c->cp, link_name(c->cp_inter), 1e3 * c->cp_s);
    if (c->ep > 1)
        SAY("; ep %d all-to-all on %s (%.1f ms)", c->ep, link_name(c->ep_inter), 1e3 * c->ep_s);
    if (c->pp == 1)
        SAY("; no bubble");
    else
        SAY("; pp %d sends on %s; bubble %.0f%% of compute", c->pp, link_name(c->pp_inter),
            100.0 * c->bubble / (c->compute - c->bubble));
    if (c->dp > 1)
        SAY("; dp reduction %.1f ms over %s, %s", 1e3 * c->dp_s, link_name(c->dp_inter),
            c->dp_exposed > 0 ? "partly exposed" : "hidden behind the backward");
    SAY("; %s", c->recompute ? "recompute (4/3 of the FLOPs) to fit" : "no recompute");
    SAY("; %.0f%% of device memory", 100.0 * c->mem / hw->memory_bytes);
#undef SAY
}

static void print_hw(const ct_hardware *hw, int n, nodes shape, FILE *out) {
    char where[96];
    describe_nodes(shape, where, sizeof where);
    fprintf(out,
            "search: %d device%s (%s) of %s: %.0f TFLOP/s bf16, %.1f fp32, GEMMs at "
            "%.0f%% of peak, %.1f GiB, node links %.0f GB/s (%.0f us), network %.1f GB/s "
            "(%.0f us)\n",
            n, n == 1 ? "" : "s", where, hw->name, hw->peak_bf16 / 1e12, hw->peak_fp32 / 1e12,
            100 * hw->gemm_efficiency, hw->memory_bytes / (1024.0 * 1024 * 1024),
            hw->intra_bw / 1e9, hw->intra_lat * 1e6, hw->inter_bw / 1e9, hw->inter_lat * 1e6);
}

static const char *yes(bool b) {
    return b ? "true" : "false";
}

static void print_json(const candidate *c, nodes shape, double tokens, FILE *out) {
    fprintf(out,
            "{\"tp\": %d, \"cp\": %d, \"pp\": %d, \"dp\": %d, \"ep\": %d, \"zero_stage\": %d, "
            "\"sequence_parallel\": %s, \"schedule\": \"%s\", \"virtual_stages\": %d, "
            "\"micro_batch\": %lld, \"recompute\": %s, \"memory_bytes\": %.0f, \"compute_s\": "
            "%.6g, \"bubble_s\": %.6g, \"tp_s\": %.6g, \"cp_s\": %.6g, \"dp_s\": %.6g, "
            "\"dp_exposed_s\": %.6g, \"pp_s\": %.6g, \"ep_s\": %.6g, \"step_s\": %.6g, "
            "\"tokens_per_s\": %.6g, \"tp_inter\": %s, \"cp_inter\": %s, \"dp_inter\": %s, "
            "\"ep_inter\": %s, \"pp_inter\": %s, \"nodes\": %d, \"devices_per_node\": %d, "
            "\"last_node_devices\": %d, \"stage0\": {\"params_bytes\": %zu, \"grads_bytes\": %zu, "
            "\"optim_bytes\": %zu, \"master_bytes\": %zu, \"dp_bytes\": %.0f, \"tp_bytes\": "
            "%.0f}}\n",
            c->tp, c->cp, c->pp, c->dp, c->ep, c->zero, yes(c->sp),
            ct_schedule_kind_name(c->schedule), c->v, (long long)c->micro_batch, yes(c->recompute),
            c->mem, c->compute, c->bubble, c->tp_s, c->cp_s, c->dp_s, c->dp_exposed, c->pp_s,
            c->ep_s, c->step, tokens / c->step, yes(c->tp_inter), yes(c->cp_inter),
            yes(c->dp_inter), yes(c->ep_inter), yes(c->pp_inter), shape.count, shape.per,
            shape.last, c->first.mem[CT_MEM_PARAMS], c->first.mem[CT_MEM_GRADS],
            c->first.mem[CT_MEM_OPTIM], c->first.mem[CT_MEM_MASTER], c->first.dp_bytes,
            c->first.tp_bytes);
}

static void print_row(int i, const candidate *c, const ct_hardware *hw, double tokens, FILE *out) {
    char mem[32], why[512], sched[24];
    snprintf(sched, sizeof sched, "%s", c->pp > 1 ? ct_schedule_kind_name(c->schedule) : "-");
    if (c->pp > 1 && c->v > 1) snprintf(sched, sizeof sched, "interleaved v%d", c->v);
    reasons(c, hw, why, sizeof why);
    fprintf(out,
            "%3d | %3d %2s %3d %3d %3d %3d %4d %-14s %3lld %-9s | %-10s | %7.2f ms %6.2f ms "
            "%6.2f ms (%6.2f) %6.2f ms | %7.2f ms %9.0f\n      %s\n",
            i + 1, c->tp, c->sp ? "y" : "-", c->cp, c->pp, c->dp, c->ep, c->zero, sched,
            (long long)c->micro_batch, c->recompute ? "full" : "none",
            ct_format_bytes(mem, sizeof mem, c->mem), 1e3 * c->compute, 1e3 * (c->tp_s + c->cp_s),
            1e3 * c->dp_s, 1e3 * c->dp_exposed, 1e3 * (c->pp_s + c->ep_s), 1e3 * c->step,
            tokens / c->step, why);
}

ct_status ct_plan_search(const ct_config *base, int n, const ct_hardware *hw, int top, bool json,
                         FILE *out) {
    search s = {.base = base, .n = n, .hw = hw, .nodes = nodes_of(n, hw->devices_per_node)};
    char chosen[160];
    CT_TRY(ct_backend_new(&s.be, "cpu", 1, chosen, sizeof chosen));
    search_grids(&s);
    ct_backend_free(s.be);
    if (s.valid == 0) {
        ct_status st = explain_none_valid(&s);
        search_release(&s);
        return st;
    }
    qsort(s.list, (size_t)s.count, sizeof *s.list, by_step);
    const double tokens = (double)base->train.global_batch * (double)base->model.seq_len;
    if (!json) {
        print_hw(hw, n, s.nodes, out);
        fprintf(out,
                "%d layouts valid for this config, %d fit in 90%% of device memory; the "
                "best by estimated step time (parallel/README.md, Plan search):\n",
                s.valid, s.count);
        fprintf(out, "  # |  tp sp  cp  pp  dp  ep ZeRO schedule      mb recompute | memory     | "
                     "compute    tp+cp     dp (exposed)       pp+ep    | step       tokens/s\n");
    }
    for (int i = 0; i < s.count && i < top; i++) {
        if (json)
            print_json(&s.list[i], s.nodes, tokens, out);
        else
            print_row(i, &s.list[i], hw, tokens, out);
    }
    search_release(&s);
    if (s.count == 0) {
        ct_error(CT_ERR_INPUT, "no layout of this config fits on %d devices of %s (%d valid)", n,
                 hw->name, s.valid);
        ct_hint("more devices, a smaller train.global_batch or seq_len, bf16 "
                "(train.precision), or a profile with more memory");
        return CT_ERR_INPUT;
    }
    return CT_OK;
}

/* ---- parallel.auto_layout ----------------------------------------------------------------- */

/* A layout's ranks: "tp 1 x pp 2 x dp 4" (cp when it is not 1). */
static void describe_layout(const ct_config *cfg, int64_t dp, char *buf, size_t n) {
    const ct_parallel_config *p = &cfg->parallel;
    char cp[32] = "";
    if (p->cp > 1) snprintf(cp, sizeof cp, " x cp %lld", (long long)p->cp);
    snprintf(buf, n, "tp %lld%s x pp %lld x dp %lld", (long long)p->tp, cp, (long long)p->pp,
             (long long)dp);
}

ct_status ct_plan_choose_layout(ct_config *cfg, int n, const ct_hardware *hw) {
    char why[1024], why_hint[512], was[96];
    snprintf(why, sizeof why, "%s", ct_error_message());
    snprintf(why_hint, sizeof why_hint, "%s", ct_error_hint());
    ct_error_clear();
    const ct_parallel_config *p = &cfg->parallel;
    const int64_t mp = p->tp * p->cp;
    describe_layout(cfg, p->dp ? p->dp : n % (mp * p->pp) ? 0 : n / (mp * p->pp), was, sizeof was);
    search s = {
        .base = cfg, .keep = true, .n = n, .hw = hw, .nodes = nodes_of(n, hw->devices_per_node)};
    char chosen[160];
    CT_TRY(ct_backend_new(&s.be, "cpu", 1, chosen, sizeof chosen));
    /* the configured tp, cp, ep, ZeRO stage, schedule and virtual stages, sequence parallelism
     * and recompute: one shape per pipeline depth, dp the rest */
    for (int64_t pp = 1; n % mp == 0 && pp <= n / mp; pp++) {
        const int64_t dp = n / mp / pp;
        if ((n / mp) % pp || cfg->train.global_batch % dp || dp % p->ep) continue;
        shape sh = {.proto = grid_of(&s, (int)p->tp, (int)p->cp, (int)pp, (int)dp, (int)p->ep)};
        sh.proto.zero = (int)p->zero_stage;
        sh.proto.schedule = p->schedule;
        sh.proto.v = (int)p->virtual_stages;
        sh.proto.sp = p->sequence_parallel;
        sh.proto.recompute = cfg->train.recompute != CT_RECOMPUTE_NONE;
        search_shape(&s, &sh);
        shape_release(&sh);
    }
    ct_backend_free(s.be);
    if (s.count == 0) {
        if (s.valid == 0)
            ct_error(CT_ERR_INPUT,
                     "parallel.auto_layout: no layout keeping tp=%lld, cp=%lld and the global "
                     "batch fits %d rank%s (%s: %s)",
                     (long long)p->tp, (long long)p->cp, n, n == 1 ? "" : "s", was, why);
        else
            ct_error(CT_ERR_INPUT,
                     "parallel.auto_layout: none of the %d layouts keeping tp=%lld, cp=%lld and "
                     "the global batch that are valid on %d ranks fits in 90%% of a device's "
                     "memory (%s)",
                     s.valid, (long long)p->tp, (long long)p->cp, n, hw->name);
        ct_hint("%s", s.valid == 0 && why_hint[0]
                          ? why_hint
                          : "launch a world size that tp * cp divides, with a dp that divides "
                            "train.global_batch");
        search_release(&s);
        return CT_ERR_INPUT;
    }
    qsort(s.list, (size_t)s.count, sizeof *s.list, by_step);
    const candidate best = s.list[0];
    char next[160] = "";
    for (int i = 1; i < s.count && !next[0]; i++) {
        const candidate *c = &s.list[i];
        if (c->pp != best.pp)
            snprintf(next, sizeof next, "; the next, pp %d x dp %d, %.3g ms", c->pp, c->dp,
                     1e3 * c->step);
    }
    const int valid = s.valid;
    ct_config c = layout_config(&s, &best);
    search_release(&s);
    CT_ASSERTF(ct_config_validate(&c, n) == CT_OK, "the chosen layout validated, then not: %s",
               ct_error_message());
    char now[96];
    describe_layout(&c, c.derived.dp, now, sizeof now);
    *cfg = c;
    snprintf(cfg->derived.layout_chosen, sizeof cfg->derived.layout_chosen,
             "parallel.auto_layout: %s does not fit %d rank%s; chose %s, global batch %lld = "
             "micro_batch %lld x grad_accum %lld x dp %lld (the fastest of %d valid layouts "
             "by the planner's estimate on %s: %.3g ms a step%s)",
             was, n, n == 1 ? "" : "s", now, (long long)c.train.global_batch,
             (long long)c.train.micro_batch, (long long)c.derived.grad_accum,
             (long long)c.derived.dp, valid, hw->name, 1e3 * best.step, next);
    return CT_OK;
}
