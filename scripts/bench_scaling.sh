#!/usr/bin/env bash
# Scaling benchmark: weak and strong scaling of `cooktrain train` over 1, 2, 4 and 8 ranks for
# one config, backend and parallel layout; prints a table and writes an SVG plot of efficiency
# against ranks. Runs unchanged on this CPU and on a GPU cluster (--backend cuda, --launcher srun).
#
#   scripts/bench_scaling.sh [--config FILE] [--backend cpu|cuda] [--ranks "1 2 4 8"] [--steps N]
#                            [--layout dp|tp|pp] [--mode weak|strong|both] [--out DIR]
#                            [--launcher "mpirun ..."] [--set section.key=value]... [--quick]
#                            [--slurm [--sbatch "OPTIONS"] [--array-limit K] [--wait]]
#   scripts/bench_scaling.sh --collect DIR
#
# Defaults: configs/test-tiny.yaml (its data is made by `make data`, which the script runs when
# data/fortunes-bytes is missing), cpu, ranks "1 2 4 8", 6 steps (train.warmup_steps=1,
# log.interval=1), layout dp, both modes, out dir /tmp/bench_scaling.PID. --quick is ranks "1 2",
# 4 steps, strong scaling only: a smoke run, well under a minute on two cores.
#
# Strong scaling keeps the config's train.global_batch and the ranks split it; weak scaling sets
# train.global_batch = the config's x ranks, so the work per rank stays the same. The layout puts
# every rank into one dimension: dp -> parallel.dp=N, tp -> parallel.tp=N, pp -> parallel.pp=N
# with the 1f1b schedule (an explicit train.micro_batch is lowered where the batch would give
# fewer than N microbatches; micro_batch: auto already keeps 4·pp of them where it can). A rank
# count the config rejects (cooktrain exits 2) is skipped with cooktrain's message. Checkpoints,
# evaluation, the run dir and sampling are switched off; --set adds overrides (before the
# layout's own, which win), e.g. --set parallel.zero_stage=1 or --set log.trace=/tmp/t.json.
#
# Per run, the out dir holds the log (N.MODE.log) and the metrics (N.MODE.jsonl). The table takes
# medians over the steps after the first two (warm-up), each column its own median (so the split
# need not add up exactly): tokens/s, step time, and the split of rank 0's step into exposed comm
# (exposed_comm_s: waits for gradient reductions — data-parallel, sequence-parallel, the tied
# embedding across stages), bubble (bubble_s: waits for activations and gradients from other
# pipeline stages, transfers included) and compute = step - exposed comm - bubble, which holds
# the tensor-parallel collectives inside the layers (blocking, not timed apart). Speedup is
# tokens/s over the 1-rank run's (or the smallest rank count's, when 1 is not in --ranks or
# failed); efficiency is speedup / N: strong, time(1) / (N·time(N)); weak, tok/s(N) / (N·tok/s(1)).
# The plot is DIR/efficiency.svg, the numbers also DIR/results.tsv.
#
# Launch: one rank runs the executable alone; N ranks run `LAUNCHER -n N $BUILD/cooktrain ...`.
# The default launcher is mpirun with the test suite's conventions (test/tools/lib_cli.sh):
# --oversubscribe --bind-to none --mca mpi_yield_when_idle 1, and --allow-run-as-root as root.
# --launcher replaces it on every rank count, 1 included (e.g. --launcher "srun --mpi=pmix" inside
# an allocation; on a GPU node cooktrain takes the GPU of its node-local rank); a "{n}" in it is
# replaced by N instead of appending -n N. It is split on spaces (no quoting). srun may spread N
# tasks over every node of the allocation; cooktrain's log (DIR/N.MODE.log) says where each rank
# ran (with cuda: "rank R: cuda device D (node-local rank ...)").
# Threads: on the CPU every rank gets the same T threads in every run (the config's or --set's
# train.threads; 1 where that is 0, auto), so N ranks use N·T cores the way N ranks on a cluster use N GPUs, and speedup / N compares like
# with like. Where N·T exceeds the host's cores (local launches only) the run is oversubscribed: one
# thread per rank (OMP_NUM_THREADS=1), marked * in the table, and its efficiency measures the
# oversubscription, not the code. Every run uses OMP_WAIT_POLICY=passive (one policy for the whole
# table; ranks that spin while waiting starve each other when oversubscribed).
# Environment: BUILD=dir (default build; $BUILD/cooktrain is built only when missing, never
# rebuilt), RUN_TIMEOUT_S (seconds per run, default 1800).
#
# On a SLURM cluster: --slurm submits the sweep as a job array, one array task per run (per rank
# count and mode), each in an allocation of its own, and a table job that waits for the whole
# array (--dependency=afterany) and writes the table to DIR/table.txt; the script returns once
# both are queued and prints their ids (--wait: it waits for the table job and prints the table).
# Every array task asks for as many tasks as the largest rank count (--ntasks=MAX; a job array's
# tasks all get the same resources) and runs its ranks with `srun --mpi=pmix --kill-on-bad-exit=1
# -n N` in it (--launcher replaces that); --sbatch adds options to both jobs, after the script's
# own, so they win: the site's partition and account, GPUs, nodes, a time limit. --array-limit K
# lets at most K runs go at once (sbatch --array=...%K; 1 on a partition whose nodes jobs share,
# so that runs do not time each other). E.g.
#   scripts/bench_scaling.sh --slurm --backend cuda --config configs/gpt2-124m.yaml \
#       --sbatch "--partition=gpu --gpus-per-node=8 --ntasks-per-node=8 --time=30"
# DIR must be on a file system the compute nodes share (the default /tmp is not: give --out under
# the repository, e.g. --out runs/scaling). Each task's log is DIR/slurm/task-I.log (rank count
# and mode in its first line); DIR/N.MODE.{log,jsonl} are the runs' own, as above. A task that did
# not report (cancelled, failed before it ran) shows as "missing" in the table.
# --collect DIR prints the table again from DIR's rows (DIR/rows/), for either kind of sweep.
set -euo pipefail
usage_hint() { echo "hint: see the comment at the top of $0 (or $0 --help)" >&2; }
die() {
    echo "bench_scaling: $1" >&2
    if [ $# -gt 1 ]; then echo "hint: $2" >&2; else usage_hint; fi
    exit 2
}

config=configs/test-tiny.yaml
backend=cpu
ranks="1 2 4 8"
steps=6
layout=dp
mode=both
out=
launcher=
user_sets=()
slurm=0
sbatch_options=
array_limit=
wait_table=0
task=
collect=
args=("$@") # for the array tasks, which run this script again with the same options
while [ $# -gt 0 ]; do
    case $1 in
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        --quick) ranks="1 2"; steps=4; mode=strong; shift; continue ;;
        --slurm) slurm=1; shift; continue ;;
        --wait) wait_table=1; shift; continue ;;
    esac
    if [ $# -lt 2 ] || { [[ $2 == --* ]] && [ "$1" != --sbatch ] && [ "$1" != --launcher ]; }; then
        case $1 in
            --config | --backend | --ranks | --steps | --layout | --mode | --out | --launcher | --set | \
                --sbatch | --array-limit | --task | --collect)
                die "$1 needs a value" "see the usage line at the top of $0 (or $0 --help)" ;;
            *) die "unknown option $1" ;;
        esac
    fi
    case $1 in
        --config) config=$2 ;;
        --backend) backend=$2 ;;
        --ranks) ranks=$2 ;;
        --steps) steps=$2 ;;
        --layout) layout=$2 ;;
        --mode) mode=$2 ;;
        --out) out=$2 ;;
        --launcher) launcher=$2 ;;
        --set) user_sets+=(--set "$2") ;;
        --sbatch) sbatch_options=$2 ;;
        --array-limit) array_limit=$2 ;;
        --task) task=$2 ;;
        --collect) collect=$2 ;;
        *) echo "bench_scaling: unknown option $1" >&2; usage_hint; exit 2 ;;
    esac
    shift 2
done

# ---- the table: from a sweep directory's plan, meta and rows -----------------------------------
# print_table DIR: DIR/plan.tsv lists the table's runs in order (mode, ranks), DIR/meta.tsv the
# title, the host's cores and whether the launches were local, DIR/rows/MODE.N.tsv one row per
# run (run_one writes it). Writes DIR/results.tsv and DIR/efficiency.svg and prints the table.
# Returns 2 when no run finished, 1 when a run failed or never reported, 0 otherwise.
print_table() {
    local dir=$1 m n row title cores local_launch
    if [ ! -f "$dir/plan.tsv" ] || [ ! -f "$dir/meta.tsv" ]; then
        die "$dir holds no sweep (plan.tsv and meta.tsv are missing)" "--collect takes the --out directory of a sweep"
    fi
    title=$(sed -n 's/^title\t//p' "$dir/meta.tsv")
    cores=$(sed -n 's/^cores\t//p' "$dir/meta.tsv")
    local_launch=$(sed -n 's/^local_launch\t//p' "$dir/meta.tsv")
    local results=$dir/results.tsv
    printf 'mode\tranks\tglobal_batch\tmicro_batch\tthreads\toversubscribed\tstatus\ttokens_per_s\tstep_ms\tcompute_ms\tcomm_ms\tbubble_ms\n' >"$results"
    while IFS=$'\t' read -r m n; do
        row=$dir/rows/$m.$n.tsv
        if [ -f "$row" ]; then
            cat "$row"
        elif [ "$m" = weak ] && [ "$n" = 1 ] && [ -f "$dir/rows/strong.1.tsv" ]; then
            sed 's/^strong/weak/' "$dir/rows/strong.1.tsv" # the same run: the same batch
        else
            printf '%s\t%s\t\t\t\t0\tmissing\t\t\t\t\t\n' "$m" "$n"
        fi
    done <"$dir/plan.tsv" >>"$results"

    python3 - "$results" "$dir/efficiency.svg" "$cores" "$local_launch" "$title" <<'PY'
import csv, sys
path, svg_path, cores, local_launch, title = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
rows = list(csv.DictReader(open(path), delimiter="\t"))
series = {}
print()
print("%-6s %6s %12s %10s %8s %10s %9s %10s %9s %9s" % ("mode", "ranks", "global_batch", "tokens/s",
      "speedup", "efficiency", "step ms", "compute ms", "comm ms", "bubble ms"))
for mode in ("strong", "weak"):
    mine = [r for r in rows if r["mode"] == mode]
    ok = [r for r in mine if r["status"] == "ok"]
    base = min(ok, key=lambda r: int(r["ranks"])) if ok else None
    for r in mine:
        n = int(r["ranks"])
        mark = "*" if r["oversubscribed"] == "1" else ""
        if r["status"] != "ok":
            print("%-6s %6s %12s %s" % (mode, "%d%s" % (n, mark), r["global_batch"], r["status"]))
            continue
        b = int(base["ranks"])
        speedup = float(r["tokens_per_s"]) / float(base["tokens_per_s"])
        eff = speedup * b / n
        series.setdefault(mode, []).append((n, eff))
        print("%-6s %6s %12s %10.1f %7.2fx %9.1f%% %9.1f %10.1f %9.1f %9.1f" % (
            mode, "%d%s" % (n, mark), r["global_batch"], float(r["tokens_per_s"]), speedup, 100 * eff,
            float(r["step_ms"]), float(r["compute_ms"]), float(r["comm_ms"]), float(r["bubble_ms"])))
    if base and int(base["ranks"]) != 1:
        print("       (%s: speedup against %s ranks, efficiency = speedup x %s / ranks)" % (mode, base["ranks"], base["ranks"]))
print()
oversub = any(r["oversubscribed"] == "1" for r in rows)
if local_launch:
    print("host: %d cores." % cores, end="")
    if oversub:
        print(" Runs marked * have more ranks x threads than cores: they are oversubscribed (one"
              " thread per rank, ranks time-sharing cores), so their efficiency measures the"
              " oversubscription, not the code.", end="")
    print()
else:
    print("host: %d cores (where the sweep was started; the launcher places ranks on the allocation's nodes)." % cores)
if any(r["status"] == "missing" for r in rows):
    print("missing: the run never reported (a cancelled or failed SLURM array task: see %s/slurm/)." % path.rsplit("/", 1)[0])

# ---- SVG: efficiency against ranks, log2 x axis -----------------------------------------------
W, H, L, R, T, B = 640, 400, 70, 150, 50, 55
pts = [p for s in series.values() for p in s]
ns = sorted({int(r["ranks"]) for r in rows}) or [1]
import math
lo, hi = math.log2(min(ns)), math.log2(max(ns))
if hi == lo: lo, hi = lo - 1, hi + 1
ymax = max([1.2] + [e * 1.1 for _, e in pts])
ymax = math.ceil(ymax * 5) / 5
X = lambda n: L + (math.log2(n) - lo) / (hi - lo) * (W - L - R)
Y = lambda e: T + (1 - e / ymax) * (H - T - B)
colors = {"strong": "#d62728", "weak": "#1f77b4"}
o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">' % (W, H, W, H),
     '<rect width="100%" height="100%" fill="white"/>',
     '<text x="%d" y="22" font-size="14" text-anchor="middle">scaling efficiency: %s</text>' % ((L + W - R) / 2, title.replace("&", "&amp;").replace("<", "&lt;"))]
over_ns = [int(r["ranks"]) for r in rows if r["oversubscribed"] == "1"]
if over_ns:  # shade the oversubscribed rank counts
    first = min(over_ns)
    below = [n for n in ns if n < first]
    x0 = (X(max(below)) + X(first)) / 2 if below else L
    o.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#eee"/>' % (x0, T, W - R - x0, H - T - B))
    o.append('<text x="%.1f" y="%d" fill="#666">oversubscribed</text>' % (x0 + 4, T + 14))
k = 0.0
while k <= ymax + 1e-9:
    o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, Y(k), W - R, Y(k)))
    o.append('<text x="%d" y="%.1f" text-anchor="end">%d%%</text>' % (L - 6, Y(k) + 4, round(100 * k)))
    k += 0.2
o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#888" stroke-dasharray="6,4"/>' % (L, Y(1), W - R, Y(1)))
for n in ns:
    o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#888"/>' % (X(n), H - B, X(n), H - B + 5))
    over = any(r["oversubscribed"] == "1" and int(r["ranks"]) == n for r in rows)
    o.append('<text x="%.1f" y="%d" text-anchor="middle">%d%s</text>' % (X(n), H - B + 18, n, "*" if over else ""))
o.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>' % (L, T, W - L - R, H - T - B))
o.append('<text x="%d" y="%d" text-anchor="middle">ranks%s</text>' % ((L + W - R) / 2, H - 12, " (* oversubscribed)" if oversub else ""))
o.append('<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">efficiency</text>' % ((T + H - B) / 2, (T + H - B) / 2))
for i, (mode, s) in enumerate(sorted(series.items())):
    c = colors[mode]
    o.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (c, " ".join("%.1f,%.1f" % (X(n), Y(e)) for n, e in s)))
    for n, e in s:
        o.append('<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s, %d ranks: %.1f%%</title></circle>' % (X(n), Y(e), c, mode, n, 100 * e))
    o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>' % (W - R + 15, T + 10 + 20 * i, W - R + 40, T + 10 + 20 * i, c))
    o.append('<text x="%d" y="%d">%s scaling</text>' % (W - R + 46, T + 14 + 20 * i, mode))
o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888" stroke-dasharray="6,4"/>' % (W - R + 15, T + 10 + 20 * len(series), W - R + 40, T + 10 + 20 * len(series)))
o.append('<text x="%d" y="%d">ideal</text>' % (W - R + 46, T + 14 + 20 * len(series)))
o.append("</svg>")
open(svg_path, "w").write("\n".join(o) + "\n")
print("plot: %s" % svg_path)
PY
    echo "runs: $dir/RANKS.MODE.{log,jsonl}; numbers: $results"
    if ! cut -f7 "$results" | grep -qx ok; then
        echo "bench_scaling: no run finished; the messages above say why" >&2
        return 2
    fi
    if cut -f7 "$results" | grep -qx 'failed\|missing'; then return 1; fi
    return 0
}

if [ -n "$collect" ]; then
    rc=0
    print_table "$(realpath -m "$collect")" || rc=$?
    exit $rc
fi

case $backend in cpu | cuda) ;; *) die "--backend $backend is not cpu or cuda" "--backend cuda on a GPU machine, cpu elsewhere" ;; esac
case $layout in dp | tp | pp) ;; *) die "--layout $layout is not dp, tp or pp" "--layout dp puts every rank into data parallelism" ;; esac
case $mode in weak | strong | both) ;; *) die "--mode $mode is not weak, strong or both" "--mode both runs the two series" ;; esac
if ! [[ $steps =~ ^[0-9]+$ ]] || [ "$steps" -lt 3 ]; then
    die "--steps $steps is not a whole number >= 3" "the first two steps are warm-up and not measured; try --steps 6"
fi
[ -n "${ranks// /}" ] || die "--ranks is empty" 'e.g. --ranks "1 2 4 8"'
for n in $ranks; do
    if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ]; then
        die "--ranks \"$ranks\": $n is not a positive whole number" 'e.g. --ranks "1 2 4 8"'
    fi
done
ranks=$(tr -s '[:blank:]' '\n' <<<"$ranks" | sed '/^$/d' | sort -n -u | tr '\n' ' ')
for s in "${user_sets[@]}"; do
    [ "$s" = --set ] && continue
    [[ $s =~ ^[a-z0-9_]+\.[a-z0-9_]+=.* ]] || die "--set $s is not section.key=value" "e.g. --set parallel.zero_stage=1"
done
[ -f "$config" ] || die "--config $config: no such file" "configs/ holds the ready configs, e.g. --config configs/test-tiny.yaml"
[ -n "$launcher" ] && [ -z "${launcher// /}" ] && die "--launcher is empty" 'e.g. --launcher "srun --mpi=pmix"'
if [ -n "$task" ] && ! [[ $task =~ ^[0-9]+$ ]]; then die "--task $task is not a run index" "--task is for the SLURM array tasks that --slurm submits"; fi
if [ "$slurm" = 1 ] && [ -z "$task" ] && ! command -v sbatch >/dev/null 2>&1; then
    die "--slurm: sbatch not found" "run the sweep on a SLURM login node, or leave out --slurm to launch with mpirun here"
fi
if [ -n "$sbatch_options" ] && [ "$slurm" = 0 ]; then die "--sbatch without --slurm" "--slurm --sbatch \"OPTIONS\" submits the sweep"; fi
if [ -n "$array_limit" ]; then
    [ "$slurm" = 1 ] || die "--array-limit without --slurm" "--slurm --array-limit 1 submits the sweep to run one task at a time"
    [[ $array_limit =~ ^[1-9][0-9]*$ ]] || die "--array-limit $array_limit is not a positive whole number" "--array-limit 1 runs one task at a time"
fi
if [ "$wait_table" = 1 ] && [ "$slurm" = 0 ]; then die "--wait without --slurm" "--slurm --wait submits the sweep and waits for its table"; fi

# Paths the user gave are relative to where they ran us; the configs' data paths to the checkout.
invoked_from=$PWD
self=$(realpath -e "$0")
config=$(realpath -e "$config")
out=$(realpath -m "${out:-/tmp/bench_scaling.$$}")
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/cooktrain
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-1800}
mkdir -p "$out/rows"
if [ -n "$task" ]; then
    # an array task: the submission built the executable and the data; several tasks start at once
    [ -x "$BIN" ] || die "$BIN is missing on $(hostname)" "build before submitting, in a directory the compute nodes share"
elif [ ! -x "$BIN" ]; then
    make --no-print-directory -s BUILD="$BUILD" "$BIN" >/dev/null
elif ! make -q --no-print-directory BUILD="$BUILD" "$BIN" 2>/dev/null; then
    echo "bench_scaling: note: $BIN is older than its sources; measuring it as it is (make rebuilds it)"
fi

# ---- the config as cooktrain resolves it (world size 1; the layout is set per run) -------------
bench_sets=(--set train.steps="$steps" --set train.warmup_steps=1 --set log.interval=1
            --set train.eval_interval=0 --set log.sample_tokens=0 --set checkpoint.dir=
            --set log.run_dir= --set log.trace=)
single=(--set parallel.tp=1 --set parallel.pp=1 --set parallel.dp=0 --set parallel.schedule=1f1b
        --set parallel.virtual_stages=1 --set parallel.pp_layers=)
if ! resolved=$("$BIN" train --config "$config" "${bench_sets[@]}" "${user_sets[@]}" "${single[@]}" --print-config 2>&1); then
    printf '%s\n' "$resolved" | grep -E '^(cooktrain|hint):' >&2 || printf '%s\n' "$resolved" | tail -5 >&2
    die "cooktrain rejects $config with these settings (above)" "fix the config or the --set values; the layout keys are set by --layout"
fi
# value SECTION KEY: one field of the printed config (quotes and comment stripped)
value() {
    printf '%s\n' "$resolved" | awk -v s="$1:" -v k="$2:" '
        /^[a-z]/ { sec = $1 } sec == s && $1 == k { v = $0; sub(/^[^:]*: */, "", v); sub(/ *#.*/, "", v); gsub(/"/, "", v); print v; exit }'
}
G0=$(value train global_batch)
MB=$(value train micro_batch)
threads=$(value train threads)
data_train=$(value data train)

# The default configs' data comes from `make data`; anything else must exist already.
if ! compgen -G "$data_train" >/dev/null; then
    case $data_train in
        data/fortunes/* | data/fortunes-bytes/*)
            [ -z "$task" ] || die "data.train=$data_train is missing on $(hostname)" "the submission runs make data; submit from a directory the compute nodes share"
            echo "bench_scaling: $data_train is missing; running make data"
            make --no-print-directory BUILD="$BUILD" data ;;
        *) die "data.train=$data_train: no such file" "prepare it with \`cooktrain prepare\` or point --set data.train= at token shards" ;;
    esac
fi

# ---- launching --------------------------------------------------------------------------------
cores=$(nproc)
if [ -z "$launcher" ] && [ "$slurm" = 1 ]; then launcher="srun --mpi=pmix --kill-on-bad-exit=1"; fi
if [ -n "$launcher" ]; then
    read -ra launch_words <<<"$launcher"
    local_launch=0
else
    launch_words=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
    [ "$(id -u)" = 0 ] && launch_words+=(--allow-run-as-root)
    local_launch=1
fi
# T threads per rank on the CPU (see the top); 0 (auto) is the same for every run only on a GPU.
if [ "$backend" = cpu ] && [ "$threads" = 0 ]; then threads=1; fi
export OMP_WAIT_POLICY=passive

# micro_batch_for G N: the train.micro_batch to set for the pp layout ("" = the config's): the
# largest divisor of G that still gives at least N microbatches, when the config's gives fewer.
micro_batch_for() {
    local g=$1 n=$2 b
    [ "$layout" = pp ] && [ "$MB" != auto ] && [ $((g % MB)) = 0 ] && [ $((g / MB)) -lt "$n" ] || return 0
    for ((b = g / n; b >= 1; b--)); do
        if [ $((g % b)) = 0 ]; then echo "$b"; return 0; fi
    done
}

# summarize METRICS: medians over the training lines after the first two:
# "tokens_per_s step_ms compute_ms comm_ms bubble_ms measured_steps", or nothing without any.
summarize() {
    python3 - "$1" <<'PY'
import json, statistics, sys
rows = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "tokens_per_s" in r and "step_time_s" in r:
        rows.append(r)
rows = rows[2:]
if rows:
    med = lambda f: statistics.median(f(r) for r in rows)
    print("%.1f %.2f %.2f %.2f %.2f %d" % (
        med(lambda r: r["tokens_per_s"]), 1e3 * med(lambda r: r["step_time_s"]),
        1e3 * med(lambda r: r["step_time_s"] - r["exposed_comm_s"] - r["bubble_s"]),
        1e3 * med(lambda r: r["exposed_comm_s"]), 1e3 * med(lambda r: r["bubble_s"]), len(rows)))
PY
}

# run_one MODE N: one training run; writes its row to rows/MODE.N.tsv and prints a progress
# line. Fails when the run failed (a run cooktrain refused, exit 2, is "skipped").
run_one() {
    local m=$1 n=$2 g=$G0 mb t=$threads over=0 name rc cmd env_threads=()
    [ "$m" = weak ] && g=$((G0 * n))
    mb=$(micro_batch_for "$g" "$n")
    name=$n.$m
    local sets=("${bench_sets[@]}" "${user_sets[@]}" "${single[@]}" --set "parallel.$layout=$n"
                --set train.global_batch="$g" --set log.metrics="$out/$name.jsonl")
    [ -n "$mb" ] && sets+=(--set train.micro_batch="$mb")
    if [ "$backend" = cpu ]; then
        if [ "$local_launch" = 1 ] && [ $((n * t)) -gt "$cores" ]; then over=1; t=1; fi
        sets+=(--set train.threads="$t")
        env_threads=(OMP_NUM_THREADS="$t")
    fi
    cmd=("$BIN" train --config "$config" --backend "$backend" "${sets[@]}")
    if [ "$n" -gt 1 ] || [ "$local_launch" = 0 ]; then
        if [[ $launcher == *"{n}"* ]]; then
            cmd=("${launch_words[@]//\{n\}/$n}" "${cmd[@]}")
        else
            cmd=("${launch_words[@]}" -n "$n" "${cmd[@]}")
        fi
    fi
    printf '%-6s ranks %-3s global_batch %-5s%s' "$m" "$n" "$g" "${mb:+ micro_batch $mb}"
    rm -f "$out/$name.jsonl" "$out/rows/$m.$n.tsv"
    rc=0
    env "${env_threads[@]}" timeout "$RUN_TIMEOUT_S" "${cmd[@]}" >"$out/$name.log" 2>&1 </dev/null || rc=$?
    local status=ok stats=""
    if [ "$rc" = 0 ]; then
        stats=$(summarize "$out/$name.jsonl" 2>/dev/null || true)
        [ -n "$stats" ] || status=failed
    elif [ "$rc" = 2 ]; then
        status=skipped
    else
        status=failed
    fi
    case $status in
        ok)
            read -r tps step _ _ _ nmeas <<<"$stats"
            printf ' ok: %s tok/s, step %s ms (median of %s steps)\n' "$tps" "$step" "$nmeas" ;;
        skipped)
            echo " skipped: cooktrain refused it (exit 2: bad input):"
            grep -E '^(cooktrain|hint):' "$out/$name.log" | sort -u | sed 's/^/    /' || tail -5 "$out/$name.log" | sed 's/^/    /' ;;
        failed)
            if [ "$rc" = 124 ]; then echo " FAILED: still running after ${RUN_TIMEOUT_S}s"
            elif [ "$rc" = 0 ]; then echo " FAILED: no measured steps in $out/$name.jsonl"
            else echo " FAILED (exit $rc); the end of $out/$name.log:"; fi
            tail -5 "$out/$name.log" | sed 's/^/    /' ;;
    esac
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$n" "$g" "${mb:-$MB}" "$t" "$over" "$status" \
        "$(if [ -n "$stats" ]; then awk '{printf "%s\t%s\t%s\t%s\t%s", $1, $2, $3, $4, $5}' <<<"$stats"; else printf '\t\t\t\t'; fi)" \
        >"$out/rows/$m.$n.tsv.tmp"
    mv "$out/rows/$m.$n.tsv.tmp" "$out/rows/$m.$n.tsv"
    [ "$status" != failed ]
}

# ---- the plan: the table's runs, and the ones to run -------------------------------------------
# Strong and weak run side by side at each rank count, so both series see the machine in the
# same state; their 1-rank runs are the same run (weak 1 is not run when strong 1 is).
# shares_strong_run MODE N: true for weak 1 when strong 1 is in the sweep
shares_strong_run() { [ "$1" = weak ] && [ "$2" = 1 ] && [ "$mode" = both ]; }
plan=()
runs=()
for n in $ranks; do
    if [ "$mode" != weak ]; then plan+=("strong $n"); runs+=("strong $n"); fi
    if [ "$mode" != strong ]; then
        plan+=("weak $n")
        shares_strong_run weak "$n" || runs+=("weak $n")
    fi
done
header() {
    echo "== scaling: $(basename "$config"), backend $backend, layout $layout (parallel.$layout = ranks)," \
         "$steps steps (medians over steps 3-$steps), global batch $G0, micro_batch $MB, threads per rank" \
         "$([ "$threads" = 0 ] && echo auto || echo "$threads")"
    echo "   launcher: ${launch_words[*]}$([ "$local_launch" = 1 ] && echo " (1 rank: the executable alone)"); host: $cores cores," \
         "load average $(cut -d' ' -f1 /proc/loadavg) before the runs (other work on the host skews the timings); out: $out"
}

if [ -n "$task" ]; then
    # one array task of a --slurm sweep: run number $task of the plan
    [ "$task" -lt ${#runs[@]} ] || die "--task $task: the sweep has ${#runs[@]} runs (0-$((${#runs[@]} - 1)))" "the array has one task per run"
    read -r m n <<<"${runs[$task]}"
    echo "bench_scaling: array task $task of ${#runs[@]}: $m scaling, $n ranks (SLURM job ${SLURM_JOB_ID:-?} on $(hostname))"
    header
    run_one "$m" "$n"
    exit
fi

printf '%s\n' "${plan[@]}" | tr ' ' '\t' >"$out/plan.tsv"
printf 'title\t%s\ncores\t%s\nlocal_launch\t%s\n' "$(basename "$config"), $backend, layout $layout" \
    "$cores" "$local_launch" >"$out/meta.tsv"
rm -f "$out"/rows/*.tsv

if [ "$slurm" = 1 ]; then
    # ---- submit: a job array of the runs, and a table job after it -----------------------------
    read -ra sbatch_words <<<"$sbatch_options"
    max_n=${ranks%% }
    max_n=${max_n##* }
    # the array tasks run this script again with the user's options (not the submission's own)
    task_args=()
    skip=0
    for a in "${args[@]}"; do
        if [ "$skip" = 1 ]; then skip=0; continue; fi
        case $a in
            --slurm | --wait) ;;
            --sbatch | --out | --array-limit | --launcher) skip=1 ;; # --launcher: added below
            *) task_args+=("$a") ;;
        esac
    done
    task_args+=(--launcher "$launcher" --out "$out")
    mkdir -p "$out/slurm"
    {
        echo '#!/usr/bin/env bash'
        echo "# one array task of a scaling sweep (written by scripts/bench_scaling.sh --slurm)"
        printf 'cd %q\n' "$invoked_from"
        printf 'exec bash %q' "$self"
        printf ' %q' "${task_args[@]}"
        printf ' --task "$SLURM_ARRAY_TASK_ID"\n'
    } >"$out/slurm/task.sh"
    {
        echo '#!/usr/bin/env bash'
        echo "# the table of a scaling sweep, after its array (written by scripts/bench_scaling.sh --slurm)"
        printf 'exec bash %q --collect %q\n' "$self" "$out"
    } >"$out/slurm/table.sh"
    header
    array_id=$(sbatch --parsable --job-name=cooktrain-scaling --array=0-$((${#runs[@]} - 1))${array_limit:+%$array_limit} \
        --ntasks="$max_n" --output="$out/slurm/task-%a.log" --chdir="$invoked_from" \
        "${sbatch_words[@]}" "$out/slurm/task.sh") || die "sbatch refused the array (above)" "check the --sbatch options against the partition's limits"
    array_id=${array_id%%;*}
    echo "submitted job array $array_id: ${#runs[@]} runs ($(IFS=,; echo "${runs[*]}")), each with --ntasks=$max_n"
    wait_words=()
    [ "$wait_table" = 1 ] && wait_words=(--wait)
    rc=0
    table_id=$(sbatch --parsable --job-name=cooktrain-scaling-table --dependency=afterany:"$array_id" \
        --output="$out/table.txt" --chdir="$invoked_from" "${sbatch_words[@]}" --ntasks=1 --nodes=1 \
        "${wait_words[@]}" "$out/slurm/table.sh") || rc=$?
    table_id=${table_id%%;*}
    if [ -z "$table_id" ]; then
        scancel "$array_id" 2>/dev/null || true
        die "sbatch refused the table job (above); array $array_id cancelled" "check the --sbatch options"
    fi
    echo "submitted the table job $table_id (after the array): the table will be in $out/table.txt"
    if [ "$wait_table" = 0 ]; then
        echo "squeue -j $array_id,$table_id shows them; scripts/bench_scaling.sh --collect $out prints the table so far"
        exit 0
    fi
    cat "$out/table.txt"
    exit $rc
fi

# ---- local: run the plan here, then the table -------------------------------------------------
header
for entry in "${plan[@]}"; do
    read -r m n <<<"$entry"
    if shares_strong_run "$m" "$n"; then
        printf '%-6s ranks %-3s global_batch %-5s the strong run (the same batch)\n' weak 1 "$G0"
        continue
    fi
    run_one "$m" "$n" || true
done
rc=0
print_table "$out" || rc=$?
exit $rc
