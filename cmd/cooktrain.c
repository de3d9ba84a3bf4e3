/*
 * cooktrain — command-line entry: argument parsing, subcommand dispatch and the exit-code policy
 * (core/README.md, Errors): 0 success, 2 bad input (usage, config, data, tokenizer, checkpoint), 1
 * runtime failure. Every module below returns a ct_status; only this file decides how the process
 * ends.
 *
 *   cooktrain train --config FILE [--set section.key=value]... [--backend cpu] [--print-config]
 *   mpirun -np N cooktrain train ...     (data parallel over N ranks)
 *   cooktrain prepare --input FILE|DIR... --vocab-size N --out DIR
 *   cooktrain inspect DIR
 *   cooktrain export DIR --out FILE.safetensors [--dtype fp32|bf16]
 *   cooktrain eval DIR --data FILE|GLOB [--samples N]
 *   cooktrain sample DIR [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "core/backend.h"
#include "core/checkpoint.h"
#include "core/export.h"
#include "core/config.h"
#include "core/gemm_bench.h"
#include "core/model.h"
#include "core/prepare.h"
#include "cuda/backend_cuda.h"
#include "cuda/comm_nccl.h"
#include "cuda/plugin.h"
#include "parallel/context.h"
#include "parallel/generate.h"
#include "parallel/plan.h"
#include "parallel/schedule.h"
#include "parallel/trainer.h"

/* The CUDA backend is linked in (the emulated build), loaded on demand from a library beside the
 * executable (the real build, cuda/plugin.h), or absent (CUDA=0): weak references, so this one
 * object serves all three binaries. */
#pragma weak ct_cuda_register
#pragma weak ct_cuda_usable
#pragma weak ct_cuda_plugin_register
#pragma weak ct_cuda_plugin_usable
#pragma weak ct_comm_nccl_new
#pragma weak ct_comm_nccl_set_abort
#pragma weak ct_cuda_plugin_nccl_new

static void register_cuda(void) {
    if (ct_cuda_register)
        ct_cuda_register();
    else if (ct_cuda_plugin_register)
        ct_cuda_plugin_register();
}

static bool cuda_usable(char *why, size_t cap) {
    if (ct_cuda_register) return ct_cuda_usable(why, cap);
    if (ct_cuda_plugin_register) return ct_cuda_plugin_usable(why, cap);
    return false;
}

static void abort_job(int code) {
    ct_mpi_abort(code);
}

/* The CUDA backend's groups: each group of the grid that carries tensors becomes an NCCL
 * communicator of the same ranks (cuda/comm_nccl.h; the MPI group stays inside it, for host
 * buffers). world stays MPI: it carries host flags only. Collective. */
static ct_status use_nccl(ct_pctx *p, ct_backend *be) {
    ct_comm **groups[] = {&p->tp_comm, &p->dp_comm, &p->pp_comm, &p->mp_comm, &p->embed_comm};
    ct_status st = CT_OK;
    for (size_t i = 0; i < sizeof groups / sizeof *groups && st == CT_OK; i++) {
        if (!*groups[i]) continue;                /* embed on middle stages */
        bool channels = groups[i] == &p->pp_comm; /* the pipeline's transfers (comm_nccl.h) */
        if (ct_comm_nccl_new) {
            ct_comm_nccl_set_abort(abort_job);
            *groups[i] = ct_comm_nccl_new(*groups[i], be, p->timeout_s, channels);
        } else {
            *groups[i] = ct_cuda_plugin_nccl_new(*groups[i], be, p->timeout_s, channels, abort_job);
        }
        if (!*groups[i]) st = CT_ERR_RUNTIME;
    }
    return ct_pctx_agree(p, st);
}

/*
 * One rank per GPU (parallel/README.md, The grid): the device is the node-local rank, and more
 * ranks on a node than devices is refused unless --share-gpus lets them share (round robin: tests,
 * or a GPU with memory to spare). Every rank says which device it took.
 */
static ct_status pick_device(bool share) {
    bool mpi = ct_mpi_world_size() > 1;
    int local_rank = mpi ? ct_mpi_local_rank() : 0, local_size = mpi ? ct_mpi_local_size() : 1;
    char why[256];
    int count = ct_backend_device_count("cuda", why, sizeof why);
    if (count == 0) return CT_OK; /* the registry refuses the backend with the reason */
    if (local_size > count && !share) {
        ct_error(CT_ERR_INPUT, "%d ranks on this node but %d CUDA device%s", local_size, count,
                 count == 1 ? "" : "s");
        ct_hint("run one rank per GPU (mpirun -np / srun --ntasks-per-node), or pass --share-gpus "
                "to let ranks share devices");
        return CT_ERR_INPUT;
    }
    int device = local_rank % count;
    ct_backend_set_device(device);
    printf("rank %d: cuda device %d (node-local rank %d of %d, %d device%s%s)\n",
           ct_mpi_world_rank(), device, local_rank, local_size, count, count == 1 ? "" : "s",
           local_size > count ? ", shared" : "");
    return CT_OK;
}

static const char usage_text[] =
    "cooktrain " CT_VERSION "\n"
    "usage: cooktrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train     train a model (the default command)\n"
    "            --config FILE          YAML config (see configs/README.md)\n"
    "            --set section.key=V    override one config field (repeatable)\n"
    "            --backend cpu          compute backend (cpu; cuda when built with CUDA)\n"
    "            --share-gpus           let several ranks of a node share a CUDA device\n"
    "            --print-config         print the resolved config and derived values, then exit\n"
    "            --profile              time ops by category (same as --set log.profile=true)\n"
    "            --gemm-rate            measure GEMM FLOP/s at the model's shapes and the\n"
    "                                   hardware's FMA peak (benchmarks)\n"
    "            --dump-params FILE     write the final parameters as global tensors (raw f32 in\n"
    "                                   FILE, names and shapes in FILE.index.json) after checking\n"
    "                                   that every replica holds the same bytes (tests)\n"
    "            --dump-init-params FILE  the same for the parameters before the first step\n"
    "            under mpirun (or srun) the job runs on every rank: tp x pp x dp = world size\n"
    "  plan      memory, communication and pipeline bubble of a config, without training\n"
    "            --config FILE [--set section.key=V]...   (parallel.dp sets the dp degree)\n"
    "            or a schedule alone: --schedule gpipe|1f1b|interleaved --pp N --microbatches M\n"
    "            [--virtual-stages V]; both take [--backward-ratio R] (default 2);\n"
    "            --json prints a config's per-stage bytes as JSON lines\n"
    "  prepare   train a BPE tokenizer and write token shards\n"
    "            --input FILE|DIR...  --vocab-size N  --out DIR  [--val-fraction F]\n"
    "  inspect   print a checkpoint's train state and tensors and verify every checksum\n"
    "            DIR (a checkpoint.dir/step-N directory)\n"
    "  sample    text from a checkpoint, on one process: DIR [--prompt TEXT] [--tokens N]\n"
    "            [--temperature T] [--top-k K] [--seed S] [--tokenizer FILE]\n"
    "  export    a checkpoint as one safetensors file with Hugging Face GPT-2 names, and its\n"
    "            config.json: DIR --out FILE.safetensors [--dtype fp32|bf16]\n"
    "  help      this text\n";

/* Every rank ends with the same code; only rank 0 prints the (agreed) message. */
static int exit_code(ct_status st) {
    if (st == CT_OK) return 0;
    if (ct_mpi_world_rank() == 0) ct_error_print();
    return st == CT_ERR_INPUT ? 2 : 1;
}

static ct_status usage_error(const char *fmt, const char *arg) {
    ct_error(CT_ERR_INPUT, fmt, arg);
    ct_hint("run `cooktrain help` for the list of commands and options");
    return CT_ERR_INPUT;
}

/* Threads per rank: the node's cores shared by the ranks on this node, at least one. */
static int default_threads(void) {
    int n = omp_get_num_procs() / (ct_mpi_world_size() > 1 ? ct_mpi_local_size() : 1);
    return n > 0 ? n : 1;
}

/* True when a launcher started us (then MPI is initialised; a plain run needs no MPI). */
static bool launched_by_mpi(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return true;
    return false;
}

static ct_status cmd_train(int argc, char **argv) {
    ct_config cfg;
    ct_config_defaults(&cfg);
    const char *config_path = NULL, *backend_name = "cpu";
    bool print_config = false, gemm_rate = false, share_gpus = false;
    ct_train_options opts = {0};
    /* The file is loaded first and --set applied after, whatever their order on the line. */
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0;
    ct_status st = CT_OK;
    for (int i = 0; i < argc && st == CT_OK; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "--config")) {
            if (!has_value)
                st = usage_error("%s needs a file name", a);
            else
                config_path = argv[++i];
        } else if (!strcmp(a, "--set")) {
            if (!has_value)
                st = usage_error("%s needs section.key=value", a);
            else
                sets[n_sets++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            sets[n_sets++] = a + 6;
        } else if (!strcmp(a, "--backend")) {
            if (!has_value)
                st = usage_error("%s needs cpu, cuda, auto or cpu-async", a);
            else
                backend_name = argv[++i];
        } else if (!strcmp(a, "--print-config")) {
            print_config = true;
        } else if (!strcmp(a, "--profile")) {
            sets[n_sets++] = "log.profile=true";
        } else if (!strcmp(a, "--gemm-rate")) {
            gemm_rate = true;
        } else if (!strcmp(a, "--share-gpus")) {
            share_gpus = true;
        } else if (!strcmp(a, "--dump-params") || !strcmp(a, "--dump-init-params")) {
            if (!has_value)
                st = usage_error("%s needs a file name", a);
            else if (!strcmp(a, "--dump-params"))
                opts.dump_params = argv[++i];
            else
                opts.dump_init_params = argv[++i];
        } else {
            st = usage_error("train: unknown option '%s'", a);
        }
    }
    if (st == CT_OK && config_path) st = ct_config_load_file(&cfg, config_path);
    for (int i = 0; i < n_sets && st == CT_OK; i++) st = ct_config_set(&cfg, sets[i]);
    free(sets);
    const int world = ct_mpi_world_size(), rank = ct_mpi_world_rank();
    /* train.precision: auto picks bf16 on a GPU; the backend itself is made after validation */
    char why[160];
    cfg.runtime_backend_cuda = !strcmp(backend_name, "cuda") ||
                               (!strcmp(backend_name, "auto") && cuda_usable(why, sizeof why));
    if (st == CT_OK) st = ct_config_validate(&cfg, world);
    /* Every rank parsed the same input and reached the same verdict; agreeing anyway covers a
     * config file readable on one node only. */
    if (world > 1) st = ct_mpi_agree(st);
    if (st != CT_OK) return st;
    if (print_config) {
        if (rank == 0) ct_config_print(&cfg, stdout);
        return CT_OK;
    }
    int threads = cfg.train.threads > 0 ? (int)cfg.train.threads : default_threads();
    ct_backend *be = NULL;
    char chosen[256];
    if (cfg.runtime_backend_cuda) st = pick_device(share_gpus);
    if (world > 1) st = ct_mpi_agree(st);
    if (st != CT_OK) return st;
    st = ct_backend_new(&be, backend_name, threads, chosen, sizeof chosen);
    /* every rank reaches the same verdict on the same build; a node without a device differs */
    if (world > 1) st = ct_mpi_agree(st);
    if (st != CT_OK) {
        ct_backend_free(be);
        return st;
    }
    if (rank == 0 && !gemm_rate && strcmp(chosen, backend_name) != 0)
        printf("backend: %s\n", chosen);
    if (gemm_rate) {
        /* For scripts/bench_cpu.sh: the MFU denominator at this config's GEMM shapes. */
        double rate = ct_gemm_bench_model_rate(&cfg, be, 5);
        ct_model *model = NULL;
        ct_model_layout layout = ct_model_layout_single(&cfg);
        st = ct_model_new(&model, &cfg, be, &layout);
        if (st == CT_OK) {
            char how[128];
            double peak = ct_backend_peak_flops(be, model->dtype, how, sizeof how);
            printf("gemm_flops_per_s %.6e\nflops_per_token %.6e\nthreads %d\n"
                   "peak_flops_per_s %.6e\npeak_source %s\n",
                   rate, ct_model_flops_per_token(model), threads, peak, how);
            ct_model_free(model);
        }
    } else {
        ct_pctx *pctx = NULL;
        if (world > 1) {
            st = ct_pctx_new(&pctx, (int)cfg.parallel.tp, (int)cfg.parallel.pp, (int)cfg.derived.dp,
                             cfg.parallel.timeout_s);
            if (st == CT_OK && !strcmp(be->iface->name, "cuda")) st = use_nccl(pctx, be);
        }
        if (st == CT_OK) st = ct_train_run(&cfg, be, pctx, &opts, NULL);
        ct_pctx_free(pctx);
    }
    ct_backend_free(be);
    return st;
}

static ct_status parse_int(const char *opt, const char *value, int *out) {
    char *end = NULL;
    long v = value ? strtol(value, &end, 10) : 0;
    if (!value || end == value || *end || v < 1 || v > 1 << 20) {
        ct_error(CT_ERR_INPUT, "%s needs a positive integer, got '%s'", opt, value ? value : "");
        ct_hint("e.g. cooktrain plan --schedule 1f1b --pp 4 --microbatches 8");
        return CT_ERR_INPUT;
    }
    *out = (int)v;
    return CT_OK;
}

/*
 * `cooktrain plan`: the schedule of a config (its pp, virtual_stages, schedule and the derived
 * grad_accum), or one given on the command line, through the simulator.
 */
static ct_status cmd_plan(int argc, char **argv) {
    ct_config cfg;
    ct_config_defaults(&cfg);
    const char *config_path = NULL, *schedule = NULL;
    int pp = 0, m = 0, v = 1;
    double ratio = 2.0;
    bool json = false;
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0;
    ct_status st = CT_OK;
    for (int i = 0; i < argc && st == CT_OK; i++) {
        const char *a = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config") && value)
            config_path = argv[++i];
        else if (!strcmp(a, "--set") && value)
            sets[n_sets++] = argv[++i];
        else if (!strcmp(a, "--schedule") && value)
            schedule = argv[++i];
        else if (!strcmp(a, "--json"))
            json = true;
        else if (!strcmp(a, "--pp"))
            st = parse_int(a, value, &pp), i++;
        else if (!strcmp(a, "--microbatches"))
            st = parse_int(a, value, &m), i++;
        else if (!strcmp(a, "--virtual-stages"))
            st = parse_int(a, value, &v), i++;
        else if (!strcmp(a, "--backward-ratio") && value) {
            char *end = NULL;
            ratio = strtod(argv[++i], &end);
            if (*end || !(ratio > 0.0 && ratio <= 100.0)) {
                ct_error(CT_ERR_INPUT, "--backward-ratio needs a number in (0, 100], got '%s'",
                         value);
                ct_hint("the cost of a backward relative to a forward; 2 is typical");
                st = CT_ERR_INPUT;
            }
        } else
            st = usage_error("plan: unknown option or missing value '%s'", a);
    }
    ct_schedule_kind kind = CT_SCHEDULE_1F1B;
    if (st == CT_OK && (config_path || n_sets > 0)) {
        /* A config: its whole cost per stage, on tp x pp x dp ranks (parallel.dp, default 1). */
        if (config_path) st = ct_config_load_file(&cfg, config_path);
        for (int i = 0; i < n_sets && st == CT_OK; i++) st = ct_config_set(&cfg, sets[i]);
        int64_t world = cfg.parallel.tp * cfg.parallel.pp * CT_MAX(1, cfg.parallel.dp);
        if (st == CT_OK) st = ct_config_validate(&cfg, world);
        free(sets);
        return st == CT_OK ? ct_plan_print(&cfg, ratio, json, stdout) : st;
    }
    free(sets);
    if (st == CT_OK && schedule) {
        kind = CT_SCHEDULE_FORWARD_ONLY; /* "not found" until a configurable name matches */
        for (int k = 0; k < CT_SCHEDULE_FORWARD_ONLY; k++)
            if (!strcmp(schedule, ct_schedule_kind_name((ct_schedule_kind)k)))
                kind = (ct_schedule_kind)k;
        if (kind == CT_SCHEDULE_FORWARD_ONLY) {
            ct_error(CT_ERR_INPUT, "--schedule '%s' is not a schedule", schedule);
            ct_hint("valid schedules: gpipe, 1f1b, interleaved");
            st = CT_ERR_INPUT;
        }
    }
    if (st == CT_OK && (pp < 1 || m < 1)) {
        ct_error(CT_ERR_INPUT, "plan needs the pipeline size and microbatch count");
        ct_hint("give --config FILE, or --pp N and --microbatches M");
        st = CT_ERR_INPUT;
    }
    if (st != CT_OK) return st;
    ct_schedule *s = ct_schedule_new(kind, pp, v, m);
    if (!s) return CT_ERR_INPUT;
    ct_schedule_print(s, ratio, stdout);
    ct_sim_result r = ct_schedule_simulate(s, ratio);
    st = r.deadlock ? ct_error(CT_ERR_RUNTIME, "the schedule deadlocks (rank %d)", r.deadlock_rank)
                    : CT_OK;
    ct_sim_result_release(&r);
    ct_schedule_free(s);
    return st;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    register_cuda();
    const char *command = argc > 1 ? argv[1] : "train";
    int first = 2;
    if (argc > 1 && argv[1][0] == '-') command = "train", first = 1;
    if (argc == 1) {
        fputs(usage_text, stderr);
        return 2;
    }
    ct_status st;
    if (!strcmp(command, "train")) {
        st = launched_by_mpi() ? ct_mpi_init(&argc, &argv) : CT_OK;
        if (st == CT_OK) st = cmd_train(argc - first, argv + first);
        int code = exit_code(st);
        ct_mpi_finalize();
        return code;
    } else if (!strcmp(command, "plan")) {
        st = cmd_plan(argc - first, argv + first);
    } else if (!strcmp(command, "prepare")) {
        st = ct_prepare_run(argc - first, argv + first);
    } else if (!strcmp(command, "sample")) {
        st = ct_generate_run(argc - first, argv + first);
    } else if (!strcmp(command, "eval")) {
        st = ct_eval_run(argc - first, argv + first);
    } else if (!strcmp(command, "export")) {
        st = ct_export_run(argc - first, argv + first);
    } else if (!strcmp(command, "inspect")) {
        st = argc - first == 1 ? ct_ckpt_inspect(argv[first], stdout)
                               : usage_error("inspect takes one checkpoint directory%s", "");
    } else if (!strcmp(command, "help") || !strcmp(command, "--help") || !strcmp(command, "-h")) {
        fputs(usage_text, stdout);
        st = CT_OK;
    } else {
        st = usage_error("'%s' is not a cooktrain command", command);
    }
    return exit_code(st);
}
