/*
 * cooktrain — command-line entry: the subcommand table, each subcommand's argument parsing (with
 * cmd/args.h, the one parser), dispatch and the exit-code policy (core/README.md, Errors): 0
 * success, 2 bad input (usage, config, data, tokenizer, checkpoint), 1 runtime failure. Every
 * module below returns a ct_status; only this file decides how the process ends.
 *
 *   cooktrain train --config FILE [--set section.key=value]... [--backend cpu] [--print-config]
 *   mpirun -np N cooktrain train ...     (data parallel over N ranks)
 *   cooktrain plan | prepare | inspect | sample | eval | export | import ...
 *   cooktrain --help, cooktrain COMMAND --help, cooktrain --version
 *
 * The commands, their one-line summaries and their --help texts are the table `commands` below:
 * `cooktrain --help` and the dispatch are made from it.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

#include "cmd/args.h"
#include "core/backend/backend.h"
#include "core/io/checkpoint.h"
#include "core/config/config.h"
#include "core/io/export.h"
#include "core/io/hf.h"
#include "core/model/model.h"
#include "core/data/prepare.h"
#include "cuda/backend_cuda.h"
#include "cuda/comm_nccl.h"
#include "cuda/plugin.h"
#include "cmd/tools/diagnose.h"
#include "cmd/tools/html_report.h"
#include "parallel/plan_search.h"
#include "parallel/context.h"
#include "cmd/generate/generate.h"
#include "parallel/plan.h"
#include "parallel/schedule.h"
#include "cmd/train/trainer.h"

/* The CUDA backend is linked in (the emulated build), loaded on demand from a library beside the
 * executable (the real build, cuda/plugin.h), or absent (CUDA=0): weak references, so this one
 * object serves all three binaries. */
#pragma weak ct_cuda_register
#pragma weak ct_cuda_plugin_register
#pragma weak ct_comm_nccl_new
#pragma weak ct_comm_nccl_set_abort
#pragma weak ct_cuda_plugin_nccl_new

static void register_cuda(void) {
    if (ct_cuda_register)
        ct_cuda_register();
    else if (ct_cuda_plugin_register)
        ct_cuda_plugin_register();
}

static void abort_job(int code) {
    ct_mpi_abort(code);
}

/* The CUDA backend's groups: each group of the grid that carries tensors becomes an NCCL
 * communicator of the same ranks (cuda/comm_nccl.h; the MPI group stays inside it, for host
 * buffers). world stays MPI: it carries host flags only. Collective. */
static ct_status use_nccl(ct_pctx *p, ct_backend *be) {
    /* dpcp is the dp group itself when cp = 1 (NULL here: converted once, as dp) */
    ct_comm **groups[] = {&p->tp_comm,
                          &p->cp_comm,
                          &p->dp_comm,
                          &p->pp_comm,
                          &p->mp_comm,
                          &p->embed_comm,
                          p->cp > 1 ? &p->dpcp_comm : NULL};
    ct_status st = CT_OK;
    char names[96] = "";
    for (size_t i = 0; i < sizeof groups / sizeof *groups && st == CT_OK; i++) {
        if (!groups[i] || !*groups[i]) continue; /* embed on middle stages */
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, " %s", (*groups[i])->name);
        bool channels = groups[i] == &p->pp_comm; /* the pipeline's transfers (comm_nccl.h) */
        if (ct_comm_nccl_new) {
            ct_comm_nccl_set_abort(abort_job);
            *groups[i] = ct_comm_nccl_new(*groups[i], be, p->timeout_s, channels);
        } else {
            *groups[i] = ct_cuda_plugin_nccl_new(*groups[i], be, p->timeout_s, channels, abort_job);
        }
        if (!*groups[i]) st = CT_ERR_RUNTIME;
    }
    if (p->cp == 1) p->dpcp_comm = p->dp_comm;
    if (p->ep == 1) p->edp_comm = p->dpcp_comm; /* the alias follows the group it names */
    st = ct_pctx_agree(p, st);
    if (st == CT_OK && ct_mpi_world_rank() == 0)
        printf("collectives: NCCL on the groups%s (rank 0's); world on MPI\n", names);
    return st;
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

/* ---- the subcommands' help texts (the first line of each is its usage line) ---------------- */

static const char train_help[] =
    "usage: cooktrain train --config FILE [--set section.key=V]... [options]\n"
    "train a model; under mpirun (or srun) the job runs on every rank: tp x cp x pp x dp = world\n"
    "size (parallel.ep divides dp: the expert groups are made of dp ranks).\n"
    "train is the default command: `cooktrain --config FILE` trains.\n"
    "\n"
    "  --config FILE          YAML config (see configs/README.md)\n"
    "  --set section.key=V    override one config field (repeatable)\n"
    "  --backend NAME         compute backend: cpu, cpu-async, cuda (when built with CUDA), auto\n"
    "  --share-gpus           let several ranks of a node share a CUDA device\n"
    "  --print-config         print the resolved config and derived values, then exit\n"
    "  --profile              time ops by category (same as --set log.profile=true)\n"
    "  --device-idle          time the device's waits between ops (log.device_idle=true)\n"
    "  --gemm-rate            measure GEMM FLOP/s at the model's shapes and the hardware's FMA\n"
    "                         peak (benchmarks)\n"
    "  --dump-params FILE     write the final parameters as global tensors (raw f32 in FILE,\n"
    "                         names and shapes in FILE.index.json) after checking that every\n"
    "                         replica holds the same bytes (tests)\n"
    "  --dump-init-params FILE  the same for the parameters before the first step\n";

static const char plan_help[] =
    "usage: cooktrain plan --config FILE [--set section.key=V]... [--json] [--backward-ratio R]\n"
    "   or: cooktrain plan --schedule gpipe|1f1b|interleaved|zbh1|zbv --pp N --microbatches M\n"
    "                      [--timeline]\n"
    "                      [--virtual-stages V] [--backward-ratio R | --costs F,B,W]\n"
    "   or: cooktrain plan --config FILE [--set ...]... --search N [--hardware H] [--top K]"
    " [--json]\n"
    "   or: cooktrain plan --calibrate\n"
    "memory, communication and pipeline bubble of a config, without training (parallel.dp sets\n"
    "the dp degree), or a schedule alone through the simulator; with --search, every layout of\n"
    "the config on N devices of a hardware model, the ones that fit ranked by estimated step\n"
    "time, each with why.\n"
    "\n"
    "  --json                 a config's per-stage bytes (or --search's layouts) as JSON lines\n"
    "  --backward-ratio R     the cost of a backward relative to a forward (default 2; a\n"
    "                         split one's input and weight parts R/2 each)\n"
    "  --costs F,B,W          a stage's forward, input-gradient and weight-gradient costs\n"
    "                         (or one triple per chunk, joined by '/': F,B,W/F,B,W/...)\n"
    "                         (zbh1 and zbv run B and W apart; other schedules B+W together)\n"
    "  --search N             rank the layouts on N devices\n"
    "  --hardware H           h100-sxm (default), h200, a100, cpu (this machine, measured), or a\n"
    "                         YAML profile's path\n"
    "  --top K                how many layouts to print (default 10)\n"
    "  --calibrate            measure this machine and print it as a YAML profile\n";

static const char prepare_help[] =
    "usage: cooktrain prepare --input FILE|DIR... --out DIR [--vocab-size N] [--val-fraction F]"
    " [--byte-level]\n"
    "train a BPE tokenizer and write token shards: DIR/tokenizer.bin, train.bin, val.bin.\n"
    "\n"
    "  --input FILE|DIR...    text files, or directories of them (repeatable)\n"
    "  --out DIR              the output directory (created)\n"
    "  --vocab-size N         tokenizer vocabulary, >= 256 (default 4096)\n"
    "  --val-fraction F       the last fraction of the text for val.bin, in [0, 1) (default 0.05)\n"
    "  --byte-level           no BPE: every byte a token (vocabulary 256, or --vocab-size N\n"
    "                         below it: the text's bytes must all be < N); tokenizer.bin holds\n"
    "                         the 256 bytes without merges\n"
    "  --replace-unknown      with --byte-level: a byte >= N, or a control byte other than tab\n"
    "                         and newline, becomes a space (configs/test-tiny.yaml's data:\n"
    "                         --byte-level --vocab-size 123 --replace-unknown)\n";

static const char inspect_help[] =
    "usage: cooktrain inspect DIR\n"
    "print a checkpoint's train state and tensors and verify every checksum; DIR is a\n"
    "checkpoint.dir/step-N directory.\n";

static const char diagnose_help[] =
    "usage: cooktrain diagnose RUN_DIR [--hang-after S]\n"
    "read the flight records every rank of a failed or hung job wrote (RUN_DIR/flight/rank-R.txt:\n"
    "on a watchdog timeout, an MPI or NCCL error, SIGTERM or SIGUSR2) and name the first "
    "operation\n"
    "some rank entered and another never did: the rank, group, op and sequence number. RUN_DIR is\n"
    "the job's log.run_dir, or the directory it ran in when that was not set. Only the newest\n"
    "job's records are read (others are named and left out). Snapshots (SIGUSR2) of a job in\n"
    "which no rank has waited S seconds in one operation are called \"not hung\".\n"
    "\n"
    "  --hang-after S         the wait that makes a hang (default: the job's parallel.timeout_s,\n"
    "                         at most 10)\n";

static const char report_help[] =
    "usage: cooktrain report RUN_DIR... [-o FILE]\n"
    "one self-contained HTML page (inline SVG; no script, nothing fetched) of the runs' metrics:\n"
    "loss and validation loss, learning rate, gradient norm, tokens/s, MFU, exposed communication\n"
    "and bubble, memory (per category at start-up, and over the steps), tokens per expert with\n"
    "MoE; several runs are overlaid, labelled by their folders. RUN_DIR is a log.run_dir (its\n"
    "metrics.jsonl) or a metrics file; a run resumed into its metrics file is stitched: each step\n"
    "once (the later segment's), each resume marked. Written to FILE, else RUN_DIR/report.html\n"
    "(the first run's), else ./report.html.\n";

static const char sample_help[] =
    "usage: cooktrain sample DIR [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]"
    " [--seed S] [--tokenizer FILE] [--no-kv-cache]\n"
    "text from a checkpoint, on one process. Each position runs once, against a cache of the keys\n"
    "and values before it; past seq_len the window of the last seq_len tokens runs whole for\n"
    "every token.\n"
    "\n"
    "  --prompt TEXT          the text to continue (default: none)\n"
    "  --tokens N             tokens to draw, 0..1000000 (default 64)\n"
    "  --temperature T        in (0, 100] (default 1)\n"
    "  --top-k K              draw from the K likeliest tokens; 0: all (default)\n"
    "  --seed S               the draw's seed (default 1234)\n"
    "  --tokenizer FILE       default: the one the checkpoint's config names (data.tokenizer)\n"
    "  --no-kv-cache          run the whole window for every token (slower; the same tokens up\n"
    "                         to float rounding: for comparison)\n";

static const char eval_help[] =
    "usage: cooktrain eval DIR --data FILE|GLOB [--samples N]\n"
    "a checkpoint's mean per-token loss on token shards, read in file order, on one process.\n"
    "\n"
    "  --data FILE|GLOB       the token shards to score\n"
    "  --samples N            score the first N samples (default: all)\n";

static const char export_help[] =
    "usage: cooktrain export DIR --out FILE.safetensors [--dtype fp32|bf16]\n"
    "a checkpoint as one safetensors file with Hugging Face GPT-2, Llama or Mixtral names, and "
    "its\n"
    "config.json beside it.\n"
    "\n"
    "  --out FILE             the safetensors file to write\n"
    "  --dtype fp32|bf16      the stored dtype (default fp32)\n";

static const char import_help[] =
    "usage: cooktrain import SRC --out ROOT [--seq-len N]\n"
    "a Hugging Face GPT-2, Llama or Mixtral model (a directory with config.json and\n"
    "model.safetensors or model.safetensors.index.json, or a .safetensors file with config.json\n"
    "beside it) as a\n"
    "cooktrain checkpoint, ROOT/step-00000000, that any layout loads (model.init_from: ROOT,\n"
    "eval, sample, export); prints the model keys a run of it needs.\n"
    "\n"
    "  --out ROOT             the checkpoint directory to make (must hold no checkpoint yet,\n"
    "                         nor be in one)\n"
    "  --seq-len N            the checkpoint's model.seq_len (default: config.json's positions)\n";

/* Every rank ends with the same code; only rank 0 prints the (agreed) message. */
static int exit_code(ct_status st) {
    if (st == CT_OK) return 0;
    if (ct_mpi_world_rank() == 0) ct_error_print();
    return st == CT_ERR_INPUT ? 2 : 1;
}

/* Prints a subcommand's --help (rank 0 only, under mpirun) and succeeds. */
static ct_status print_help(const char *help_text) {
    if (ct_mpi_world_rank() == 0) fputs(help_text, stdout);
    return CT_OK;
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

/*
 * parallel.auto_layout: when the configured layout does not validate for this world size (a
 * restart on fewer or more nodes), the planner chooses one (parallel/plan_search.h). Its
 * hardware model is the same on every rank, so every rank makes the same choice: on the CPU
 * this machine as rank 0 measures it, sent to the others; on GPUs the built-in h100-sxm. A node
 * holds as many devices as rank 0's node has ranks. cfg validated on CT_OK. Collective: every
 * rank calls it or none (the caller's ranks agreed that the config loaded everywhere).
 */
static ct_status auto_layout(ct_config *cfg, int world) {
    ct_status st = CT_OK;
    ct_hardware hw;
    const bool cuda = !strcmp(cfg->runtime_backend, "cuda");
    if (cuda)
        st = ct_hardware_load("h100-sxm", &hw);
    else if (ct_mpi_world_rank() == 0)
        st = ct_hardware_measure_cpu(&hw);
    if (world > 1) st = ct_mpi_agree(st);
    if (st != CT_OK) return st;
    if (ct_mpi_world_rank() == 0) hw.devices_per_node = world > 1 ? ct_mpi_local_size() : 1;
    if (world > 1) ct_mpi_bcast(&hw, sizeof hw, 0);
    ct_config c = *cfg;
    if (ct_config_validate(&c, world) == CT_OK) {
        *cfg = c;
        return CT_OK;
    }
    return ct_plan_choose_layout(cfg, world, &hw);
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
    ct_args a;
    ct_args_init(&a, "train", train_help, argc, argv);
    while (st == CT_OK && ct_args_next(&a)) {
        if (ct_args_is(&a, "--config"))
            st = ct_args_string(&a, &config_path);
        else if (ct_args_is(&a, "--set"))
            st = ct_args_string(&a, &sets[n_sets++]);
        else if (ct_args_is(&a, "--backend"))
            st = ct_args_string(&a, &backend_name);
        else if (ct_args_is(&a, "--print-config"))
            st = ct_args_flag(&a), print_config = true;
        else if (ct_args_is(&a, "--profile"))
            st = ct_args_flag(&a), sets[n_sets++] = "log.profile=true";
        else if (ct_args_is(&a, "--device-idle"))
            st = ct_args_flag(&a), sets[n_sets++] = "log.device_idle=true";
        else if (ct_args_is(&a, "--gemm-rate"))
            st = ct_args_flag(&a), gemm_rate = true;
        else if (ct_args_is(&a, "--share-gpus"))
            st = ct_args_flag(&a), share_gpus = true;
        else if (ct_args_is(&a, "--dump-params"))
            st = ct_args_string(&a, &opts.dump_params);
        else if (ct_args_is(&a, "--dump-init-params"))
            st = ct_args_string(&a, &opts.dump_init_params);
        else
            st = ct_args_unknown(&a);
    }
    if (st == CT_OK && a.help) {
        free(sets);
        return print_help(train_help);
    }
    if (st == CT_OK && config_path) st = ct_config_load_file(&cfg, config_path);
    for (int i = 0; i < n_sets && st == CT_OK; i++) st = ct_config_set(&cfg, sets[i]);
    free(sets);
    const int world = ct_mpi_world_size(), rank = ct_mpi_world_rank();
    /* train.precision: auto asks the backend that will run; it is made after validation */
    const char *resolved = ct_backend_resolve(backend_name);
    snprintf(cfg.runtime_backend, sizeof cfg.runtime_backend, "%s", resolved ? resolved : "cpu");
    /* A config file readable on one node only: every rank stops here, before auto_layout's
     * collectives, which the ranks then all reach (the same config) or none. */
    if (world > 1) st = ct_mpi_agree(st);
    if (st == CT_OK)
        st = cfg.parallel.auto_layout ? auto_layout(&cfg, world) : ct_config_validate(&cfg, world);
    /* Every rank validated the same config and reached the same verdict; agreeing anyway keeps
     * a verdict that differs (a bug) from leaving the ranks that went on waiting. */
    if (world > 1) st = ct_mpi_agree(st);
    if (st != CT_OK) return st;
    if (rank == 0 && cfg.derived.layout_chosen[0]) {
        printf("%s\n", cfg.derived.layout_chosen);
        fflush(stdout);
    }
    if (print_config) {
        if (rank == 0) ct_config_print(&cfg, stdout);
        return CT_OK;
    }
    int threads = cfg.train.threads > 0 ? (int)cfg.train.threads : default_threads();
    ct_backend *be = NULL;
    char chosen[256];
    if (!strcmp(cfg.runtime_backend, "cuda")) st = pick_device(share_gpus);
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
        double rate = ct_model_gemm_rate(&cfg, be, 5);
        ct_model *model = NULL;
        ct_model_layout layout = ct_model_layout_single(&cfg);
        st = ct_model_new(&model, &cfg, be, &layout);
        if (st == CT_OK) {
            char how[128];
            double peak = ct_backend_peak_flops(be, model->dtype, how, sizeof how);
            printf("gemm_flops_per_s %.6e\nflops_per_token %.6e\nthreads %d\n"
                   "peak_flops_per_s %.6e\npeak_source %s\n",
                   rate, ct_model_flops_per_token(model), threads, peak, how);
            if (cfg.model.moe_experts)
                printf("moe_expert_gemm_flops_per_s %.6e\n",
                       ct_model_expert_gemm_rate(&cfg, be, 5));
            ct_model_free(model);
        }
    } else {
        ct_pctx *pctx = NULL;
        if (cfg.parallel.cp > 1 && !ct_backend_has_context_parallel(be)) {
            char what[160];
            ct_backend_describe(be, what, sizeof what);
            ct_error(CT_ERR_INPUT, "parallel.cp=%lld: backend %s has no ring attention ops",
                     (long long)cfg.parallel.cp, what);
            ct_hint("the cpu, cpu-async and cuda backends have them: use one of those");
            st = ct_mpi_agree(CT_ERR_INPUT);
        }
        if (st == CT_OK && world > 1) {
            st = ct_pctx_new_cp(&pctx, (int)cfg.parallel.tp, (int)cfg.parallel.cp,
                                (int)cfg.parallel.pp, (int)cfg.derived.dp, (int)cfg.parallel.ep,
                                cfg.parallel.timeout_s);
            if (st == CT_OK && !strcmp(be->iface->name, "cuda")) st = use_nccl(pctx, be);
        }
        if (st == CT_OK) st = ct_train_run(&cfg, be, pctx, &opts, NULL);
        ct_pctx_free(pctx);
    }
    ct_backend_free(be);
    return st;
}

/*
 * `cooktrain plan`: the schedule of a config (its pp, virtual_stages, schedule and the derived
 * grad_accum), or one given on the command line, through the simulator.
 */
static ct_status cmd_plan(int argc, char **argv) {
    ct_config cfg;
    ct_config_defaults(&cfg);
    const char *config_path = NULL, *schedule = NULL;
    int64_t pp = 0, m = 0, v = 1;
    double ratio = 2.0;
    const char *costs_arg = NULL;
    bool json = false, calibrate = false;
    int64_t search = 0, top = 10;
    const char *hardware = "h100-sxm";
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0;
    ct_status st = CT_OK;
    ct_args a;
    ct_args_init(&a, "plan", plan_help, argc, argv);
    while (st == CT_OK && ct_args_next(&a)) {
        if (ct_args_is(&a, "--config"))
            st = ct_args_string(&a, &config_path);
        else if (ct_args_is(&a, "--set"))
            st = ct_args_string(&a, &sets[n_sets++]);
        else if (ct_args_is(&a, "--schedule"))
            st = ct_args_string(&a, &schedule);
        else if (ct_args_is(&a, "--json"))
            st = ct_args_flag(&a), json = true;
        else if (ct_args_is(&a, "--search"))
            st = ct_args_int(&a, 1, 1 << 16, &search);
        else if (ct_args_is(&a, "--hardware"))
            st = ct_args_string(&a, &hardware);
        else if (ct_args_is(&a, "--top"))
            st = ct_args_int(&a, 1, 1 << 20, &top);
        else if (ct_args_is(&a, "--calibrate"))
            st = ct_args_flag(&a), calibrate = true;
        else if (ct_args_is(&a, "--pp"))
            st = ct_args_int(&a, 1, 1 << 20, &pp);
        else if (ct_args_is(&a, "--microbatches"))
            st = ct_args_int(&a, 1, 1 << 20, &m);
        else if (ct_args_is(&a, "--virtual-stages"))
            st = ct_args_int(&a, 1, 1 << 20, &v);
        else if (ct_args_is(&a, "--costs"))
            st = ct_args_string(&a, &costs_arg);
        else if (ct_args_is(&a, "--timeline")) /* printed with every --schedule; said aloud */
            st = ct_args_flag(&a);
        else if (ct_args_is(&a, "--backward-ratio")) {
            st = ct_args_double(&a, 0.0, 100.0, &ratio);
            if (st == CT_OK && ratio <= 0.0)
                st = ct_args_error(&a, "--backward-ratio needs a number in (0, 100], got 0");
        } else
            st = ct_args_unknown(&a);
    }
    if (st == CT_OK && a.help) {
        free(sets);
        return print_help(plan_help);
    }
    ct_schedule_kind kind = CT_SCHEDULE_1F1B;
    if (st == CT_OK && calibrate) {
        free(sets);
        ct_hardware hw;
        CT_TRY(ct_hardware_measure_cpu(&hw));
        ct_hardware_print_yaml(&hw, stdout);
        return CT_OK;
    }
    if (st == CT_OK && search > 0) {
        /* every layout on `search` devices: parallel.* of the config are replaced */
        if (config_path) st = ct_config_load_file(&cfg, config_path);
        for (int i = 0; i < n_sets && st == CT_OK; i++) st = ct_config_set(&cfg, sets[i]);
        free(sets);
        ct_hardware hw;
        if (st == CT_OK) st = ct_hardware_load(hardware, &hw);
        return st == CT_OK ? ct_plan_search(&cfg, (int)search, &hw, (int)top, json, stdout) : st;
    }
    if (st == CT_OK && (config_path || n_sets > 0)) {
        /* A config: its whole cost per stage, on tp x cp x pp x dp ranks (parallel.dp, default 1).
         */
        if (config_path) st = ct_config_load_file(&cfg, config_path);
        for (int i = 0; i < n_sets && st == CT_OK; i++) st = ct_config_set(&cfg, sets[i]);
        int64_t world =
            cfg.parallel.tp * cfg.parallel.cp * cfg.parallel.pp * CT_MAX(1, cfg.parallel.dp);
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
            ct_hint("valid schedules: gpipe, 1f1b, interleaved, zbh1, zbv");
            st = CT_ERR_INPUT;
        }
        if (kind == CT_SCHEDULE_ZBV && v == 1) v = 2; /* its V is two chunks a rank */
    }
    ct_sim_costs costs = ct_sim_costs_of_ratio(ratio);
    ct_sim_costs *per_chunk = NULL; /* --costs with one triple per global chunk */
    int n_given = 0;
    if (st == CT_OK && costs_arg) {
        const int64_t nc = pp * v;
        per_chunk = ct_xcalloc((size_t)CT_MAX(nc, 1), sizeof *per_chunk);
        for (const char *at = costs_arg; st == CT_OK;) {
            ct_sim_costs c;
            int used = 0;
            if (n_given >= CT_MAX(nc, 1) ||
                sscanf(at, "%lf,%lf,%lf%n", &c.f, &c.b, &c.w, &used) != 3 ||
                !(c.f > 0 && c.b > 0 && c.w > 0 && c.f <= 1e6 && c.b <= 1e6 && c.w <= 1e6) ||
                (at[used] != '\0' && at[used] != '/')) {
                ct_error(CT_ERR_INPUT,
                         "--costs '%s' is not three positive numbers F,B,W, or %lld such triples "
                         "joined by '/' (one per chunk)",
                         costs_arg, (long long)nc);
                ct_hint("for example --costs 1,1,1 (forward, input gradient, weight gradients of a "
                        "stage, in any one unit up to 1e6), or per chunk --costs 1,1,1/1.5,1.5,1");
                st = CT_ERR_INPUT;
                break;
            }
            per_chunk[n_given++] = c;
            if (at[used] == '\0') break;
            at += used + 1;
        }
        if (st == CT_OK && n_given == 1) {
            costs = per_chunk[0];
        } else if (st == CT_OK && n_given != nc) {
            ct_error(CT_ERR_INPUT, "--costs gives %d chunks' costs, the pipeline has %lld chunks",
                     n_given, (long long)nc);
            ct_hint("give one F,B,W triple (a stage's) or one per chunk (pp x virtual stages)");
            st = CT_ERR_INPUT;
        }
    }
    if (st == CT_OK && (pp < 1 || m < 1)) {
        ct_error(CT_ERR_INPUT, "plan needs the pipeline size and microbatch count");
        ct_hint("give --config FILE, or --pp N and --microbatches M");
        st = CT_ERR_INPUT;
    }
    ct_schedule *s = st == CT_OK ? ct_schedule_new(kind, (int)pp, (int)v, (int)m) : NULL;
    if (!s) {
        free(per_chunk);
        return st == CT_OK ? CT_ERR_INPUT : st;
    }
    const bool chunks = n_given > 1;
    if (chunks)
        ct_schedule_print_chunks(s, per_chunk, stdout);
    else
        ct_schedule_print_costs(s, costs, stdout);
    ct_sim_result r =
        chunks ? ct_schedule_simulate_chunks(s, per_chunk) : ct_schedule_simulate_costs(s, costs);
    free(per_chunk);
    st = r.deadlock ? ct_error(CT_ERR_RUNTIME, "the schedule deadlocks (rank %d)", r.deadlock_rank)
                    : CT_OK;
    ct_sim_result_release(&r);
    ct_schedule_free(s);
    return st;
}

/* `cooktrain prepare`: the options of core/data/prepare.h. */
static ct_status cmd_prepare(int argc, char **argv) {
    ct_prepare_options o = CT_PREPARE_DEFAULTS;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    int64_t vocab = o.vocab_size;
    ct_status st = CT_OK;
    ct_args a;
    ct_args_init(&a, "prepare", prepare_help, argc, argv);
    while (st == CT_OK && ct_args_next(&a)) {
        if (ct_args_is(&a, "--input")) {
            st = ct_args_list(&a, inputs, &o.n_inputs);
        } else if (ct_args_is(&a, "--out")) {
            st = ct_args_string(&a, &o.out_dir);
        } else if (ct_args_is(&a, "--vocab-size")) {
            st = ct_args_int(&a, 2, 1 << 24, &vocab);
        } else if (ct_args_is(&a, "--val-fraction")) {
            st = ct_args_double(&a, 0.0, 1.0, &o.val_fraction);
        } else if (ct_args_is(&a, "--byte-level")) {
            st = ct_args_flag(&a), o.byte_level = true;
        } else if (ct_args_is(&a, "--replace-unknown")) {
            st = ct_args_flag(&a), o.replace_unknown = true;
        } else {
            st = ct_args_unknown(&a);
        }
    }
    o.inputs = inputs;
    o.vocab_size = (int)vocab;
    if (st == CT_OK) st = a.help ? print_help(prepare_help) : ct_prepare_run(&o);
    free(inputs);
    return st;
}

/* `cooktrain inspect DIR`. */
static ct_status cmd_inspect(int argc, char **argv) {
    const char *dir = NULL;
    ct_status st = CT_OK;
    ct_args a;
    ct_args_init(&a, "inspect", inspect_help, argc, argv);
    while (st == CT_OK && ct_args_next(&a))
        st = a.positional && !dir ? (dir = a.arg, CT_OK) : ct_args_unknown(&a);
    if (st != CT_OK) return st;
    if (a.help) return print_help(inspect_help);
    if (!dir) return ct_args_error(&a, "needs a checkpoint directory");
    char step_dir[CT_PATH_MAX + 32];
    ct_ckpt_resolve(dir, step_dir, sizeof step_dir);
    return ct_ckpt_inspect(step_dir, stdout);
}

/* `cooktrain diagnose RUN_DIR`. */
static ct_status cmd_diagnose(int argc, char **argv) {
    const char *dir = NULL;
    ct_status st = CT_OK;
    ct_args a;
    ct_args_init(&a, "diagnose", diagnose_help, argc, argv);
    double hang_after = -1.0;
    while (st == CT_OK && ct_args_next(&a)) {
        if (ct_args_is(&a, "--hang-after"))
            st = ct_args_double(&a, 0.0, 1e9, &hang_after);
        else
            st = a.positional && !dir ? (dir = a.arg, CT_OK) : ct_args_unknown(&a);
    }
    if (st != CT_OK) return st;
    if (a.help) return print_help(diagnose_help);
    if (!dir) return ct_args_error(&a, "needs a run directory");
    return ct_diagnose(dir, hang_after, stdout);
}

/* `cooktrain report RUN_DIR... [-o FILE]`. */
static ct_status cmd_report(int argc, char **argv) {
    char **runs = ct_xcalloc((size_t)argc + 1, sizeof *runs);
    int n = 0;
    const char *out = NULL;
    ct_status st = CT_OK;
    ct_args a;
    ct_args_init(&a, "report", report_help, argc, argv);
    while (st == CT_OK && ct_args_next(&a)) {
        if (a.positional)
            runs[n++] = (char *)a.arg;
        else if (ct_args_is(&a, "-o") || ct_args_is(&a, "--out"))
            st = ct_args_string(&a, &out);
        else
            st = ct_args_unknown(&a);
    }
    if (st == CT_OK && a.help)
        st = print_help(report_help);
    else if (st == CT_OK && n == 0)
        st = ct_args_error(&a, "needs at least one run directory or metrics file");
    else if (st == CT_OK)
        st = ct_html_report(n, runs, out);
    free(runs);
    return st;
}

/* `cooktrain sample DIR`: the options of cmd/generate/generate.h. */
static ct_status cmd_sample(int argc, char **argv) {
    ct_generate_options o = CT_GENERATE_DEFAULTS;
    int64_t tokens = o.tokens, top_k = 0, seed = (int64_t)o.seed;
    ct_status st = CT_OK;
    ct_args a;
    ct_args_init(&a, "sample", sample_help, argc, argv);
    while (st == CT_OK && ct_args_next(&a)) {
        if (a.positional && !o.dir)
            o.dir = a.arg;
        else if (ct_args_is(&a, "--prompt"))
            st = ct_args_string(&a, &o.prompt);
        else if (ct_args_is(&a, "--tokenizer"))
            st = ct_args_string(&a, &o.tokenizer);
        else if (ct_args_is(&a, "--tokens"))
            st = ct_args_int(&a, 0, 1000000, &tokens);
        else if (ct_args_is(&a, "--temperature"))
            st = ct_args_double(&a, 1e-6, 100.0, &o.sample.temperature);
        else if (ct_args_is(&a, "--top-k"))
            st = ct_args_int(&a, 0, INT64_MAX, &top_k);
        else if (ct_args_is(&a, "--seed"))
            st = ct_args_int(&a, 0, INT64_MAX, &seed);
        else if (ct_args_is(&a, "--no-kv-cache"))
            st = ct_args_flag(&a), o.sample.full_windows = true;
        else
            st = ct_args_unknown(&a);
    }
    if (st != CT_OK) return st;
    if (a.help) return print_help(sample_help);
    if (!o.dir) return ct_args_error(&a, "needs a checkpoint directory");
    o.tokens = tokens, o.sample.top_k = top_k, o.seed = (uint64_t)seed;
    char step_dir[CT_PATH_MAX + 32];
    ct_ckpt_resolve(o.dir, step_dir, sizeof step_dir);
    o.dir = step_dir;
    return ct_generate_run(&o);
}

/* `cooktrain eval DIR --data FILE|GLOB [--samples N]` (cmd/generate/generate.h). */
static ct_status cmd_eval(int argc, char **argv) {
    const char *dir = NULL, *data = NULL;
    int64_t samples = 0; /* all */
    ct_status st = CT_OK;
    ct_args a;
    ct_args_init(&a, "eval", eval_help, argc, argv);
    while (st == CT_OK && ct_args_next(&a)) {
        if (a.positional && !dir)
            dir = a.arg;
        else if (ct_args_is(&a, "--data"))
            st = ct_args_string(&a, &data);
        else if (ct_args_is(&a, "--samples"))
            st = ct_args_int(&a, 1, INT64_MAX, &samples);
        else
            st = ct_args_unknown(&a);
    }
    if (st != CT_OK) return st;
    if (a.help) return print_help(eval_help);
    if (!dir) return ct_args_error(&a, "needs a checkpoint directory");
    if (!data) return ct_args_error(&a, "needs the token shards to score: --data FILE|GLOB");
    char step_dir[CT_PATH_MAX + 32];
    ct_ckpt_resolve(dir, step_dir, sizeof step_dir);
    return ct_eval_run(step_dir, data, samples);
}

/* `cooktrain export DIR --out FILE.safetensors [--dtype fp32|bf16]` (core/io/export.h). */
static ct_status cmd_export(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *dtype_name = "fp32";
    ct_status st = CT_OK;
    ct_args a;
    ct_args_init(&a, "export", export_help, argc, argv);
    while (st == CT_OK && ct_args_next(&a)) {
        if (a.positional && !dir)
            dir = a.arg;
        else if (ct_args_is(&a, "--out"))
            st = ct_args_string(&a, &out);
        else if (ct_args_is(&a, "--dtype"))
            st = ct_args_string(&a, &dtype_name);
        else
            st = ct_args_unknown(&a);
    }
    if (st != CT_OK) return st;
    if (a.help) return print_help(export_help);
    ct_dtype dtype = !strcmp(dtype_name, "bf16") ? CT_DTYPE_BF16 : CT_DTYPE_F32;
    if (strcmp(dtype_name, "fp32") && strcmp(dtype_name, "bf16"))
        return ct_args_error(&a, "--dtype '%s' is not fp32 or bf16", dtype_name);
    if (!dir || !out) return ct_args_error(&a, "needs a checkpoint directory and --out FILE");
    char step_dir[CT_PATH_MAX + 32];
    ct_ckpt_resolve(dir, step_dir, sizeof step_dir);
    CT_TRY(ct_export_safetensors(step_dir, out, dtype));
    printf("exported %s to %s (%s) and config.json beside it\n", dir, out, dtype_name);
    return CT_OK;
}

/* `cooktrain import SRC --out ROOT [--seq-len N]` (core/io/hf.h). */
static ct_status cmd_import(int argc, char **argv) {
    const char *src = NULL, *out = NULL;
    int64_t seq_len = 0;
    ct_status st = CT_OK;
    ct_args a;
    ct_args_init(&a, "import", import_help, argc, argv);
    while (st == CT_OK && ct_args_next(&a)) {
        if (a.positional && !src)
            src = a.arg;
        else if (ct_args_is(&a, "--out"))
            st = ct_args_string(&a, &out);
        else if (ct_args_is(&a, "--seq-len"))
            st = ct_args_int(&a, 1, 1048576, &seq_len);
        else
            st = ct_args_unknown(&a);
    }
    if (st != CT_OK) return st;
    if (a.help) return print_help(import_help);
    if (!src || !out) return ct_args_error(&a, "needs a Hugging Face model and --out ROOT");
    return ct_hf_import(src, out, seq_len, stdout);
}

/* ---- the command table, --help and --version ------------------------------------------------- */

typedef struct command {
    const char *name;
    const char *summary;                     /* one line of `cooktrain --help` */
    const char *help;                        /* `cooktrain NAME --help` */
    ct_status (*run)(int argc, char **argv); /* the arguments after the command's name */
    bool mpi; /* runs on every rank: MPI initialised first when a launcher started us */
} command;

static const command commands[] = {
    {.name = "train",
     .summary = "train a model (the default command)",
     .help = train_help,
     .run = cmd_train,
     .mpi = true},
    {.name = "plan",
     .summary = "memory, communication and pipeline bubble of a config, without training",
     .help = plan_help,
     .run = cmd_plan},
    {.name = "prepare",
     .summary = "train a BPE tokenizer and write token shards",
     .help = prepare_help,
     .run = cmd_prepare},
    {.name = "inspect",
     .summary = "a checkpoint's train state and tensors, every checksum verified",
     .help = inspect_help,
     .run = cmd_inspect},
    {.name = "sample", .summary = "text from a checkpoint", .help = sample_help, .run = cmd_sample},
    {.name = "eval",
     .summary = "a checkpoint's loss on token shards",
     .help = eval_help,
     .run = cmd_eval},
    {.name = "export",
     .summary = "a checkpoint as safetensors with Hugging Face GPT-2, Llama or Mixtral names",
     .help = export_help,
     .run = cmd_export},
    {.name = "import",
     .summary = "a Hugging Face GPT-2, Llama or Mixtral model as a checkpoint",
     .help = import_help,
     .run = cmd_import},
    {.name = "diagnose",
     .summary = "which rank and collective a failed or hung job stopped at (flight records)",
     .help = diagnose_help,
     .run = cmd_diagnose},
    {.name = "report",
     .summary = "an HTML page of one or more runs' curves (inline SVG, self-contained)",
     .help = report_help,
     .run = cmd_report},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void print_usage(FILE *f) {
    fprintf(f,
            "cooktrain %s — a distributed GPT trainer (CPU, CUDA; MPI, NCCL)\n"
            "usage: cooktrain <command> [options]\n"
            "       cooktrain <command> --help    that command's options\n"
            "       cooktrain --version           version, commit and build options\n"
            "\n"
            "commands:\n",
            CT_VERSION);
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
}

#ifndef CT_GIT_COMMIT
#define CT_GIT_COMMIT "unknown" /* the Makefile passes `git describe --always --dirty` */
#endif

#ifdef __clang__
#define COMPILER "" /* clang's __VERSION__ names it */
#else
#define COMPILER "gcc "
#endif

/* The CUDA backend of this binary: linked in, a plugin beside the executable, or none. */
static const char *cuda_build(void) {
    if (ct_cuda_register) return "cuda (emulated on the CPU: cuda/emu)";
    if (ct_cuda_plugin_register) return "cuda (libcooktrain-cuda.so, loaded when used)";
    return NULL;
}

static void print_version(void) {
    const char *cuda = cuda_build();
    printf("cooktrain %s\n"
           "commit: %s\n"
           "backends: cpu, cpu-async%s%s\n"
           "precisions: fp32, bf16 (train.precision: auto, fp32, bf16)\n"
           "compiler: %s%s\n",
           CT_VERSION, CT_GIT_COMMIT, cuda ? ", " : " (no CUDA: built with CUDA=0)",
           cuda ? cuda : "", COMPILER, __VERSION__);
}

/* SIGUSR2 asks a job's ranks for their flight records (core/comm/flight.h installs the handler
 * that writes one); any other cooktrain process — one rank, plan, sample, ... — has nothing to
 * record and must not die of it, as the signal's default action would have it. */
static void on_usr2_unrecorded(int sig) {
    (void)sig;
    static const char msg[] = "cooktrain: SIGUSR2: nothing to record here (flight records are "
                              "written by the ranks of a multi-rank train); going on\n";
    ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)n;
}

/* The command a mistyped name most likely meant: the nearest, if within 2 edits. */
static const char *nearest_command(const char *name) {
    const char *best = NULL;
    int best_d = 3;
    for (int i = 0; i < N_COMMANDS; i++) {
        int d = ct_edit_distance(name, commands[i].name);
        if (d < best_d) best_d = d, best = commands[i].name;
    }
    return best;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGUSR2, on_usr2_unrecorded);
    register_cuda();
    if (argc == 1) {
        print_usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        /* `cooktrain help COMMAND` is `cooktrain COMMAND --help` */
        for (int i = 0; argc > 2 && i < N_COMMANDS; i++)
            if (!strcmp(argv[2], commands[i].name)) return fputs(commands[i].help, stdout), 0;
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "-V") || !strcmp(name, "version")) {
        print_version();
        return 0;
    }
    int first = 2;
    if (name[0] == '-') name = "train", first = 1; /* `cooktrain --config FILE` trains */
    const command *c = NULL;
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].name)) c = &commands[i];
    ct_status st = CT_OK;
    if (c) {
        if (c->mpi && launched_by_mpi()) st = ct_mpi_init(&argc, &argv);
        if (st == CT_OK) st = c->run(argc - first, argv + first);
    } else {
        char names[256] = "";
        for (int i = 0; i < N_COMMANDS; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     commands[i].name);
        const char *near = nearest_command(name);
        if (near) {
            st = ct_error(CT_ERR_INPUT, "'%s' is not a cooktrain command; did you mean '%s'?", name,
                          near);
        } else {
            st = ct_error(CT_ERR_INPUT, "'%s' is not a cooktrain command", name);
        }
        ct_hint("the commands are %s; `cooktrain --help` says what each does", names);
    }
    int code = exit_code(st);
    ct_mpi_finalize();
    return code;
}
