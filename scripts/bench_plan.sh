#!/usr/bin/env bash
# bench_plan.sh — how close `cooktrain plan --search`'s step-time estimate comes to a measured step
# on this machine (parallel/README.md, Plan search): the machine calibrated (`plan --calibrate`),
# the search run on 2 of its cores for a wider test-tiny (d_model 256, 4 layers, seq_len 64,
# global batch 16), then dp 2, tp 2 and pp 2 each trained for --steps steps under mpirun, and one
# table: the layout, the estimate, the measured median step (the first two steps left out as
# warm-up) and their ratio. The estimate leaves out elementwise work, attention at small shapes
# and MPI's per-call costs, so it is optimistic; a machine busy with other work while the ranks
# run (the calibration a moment before may catch it idle) makes the ratio larger still, which is
# why this is a benchmark and not a test.
#
#   scripts/bench_plan.sh [--steps N] [--data FILE]
# (--data: a byte-level train.bin; default build/test-data/bytes/train.bin, which make test and
# scripts/prepare_corpus.sh --byte-level write.)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/cooktrain
steps=8
data=$BUILD/test-data/bytes/train.bin
bad() { echo "bench_plan: $1" >&2; echo "hint: $2" >&2; exit 2; }
usage='scripts/bench_plan.sh [--steps N] [--data FILE]'
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=${2:-}; shift 2 ;;
        --data) data=${2:-}; shift 2 ;;
        *) bad "unknown option $1" "usage: $usage" ;;
    esac
done
[[ $steps =~ ^[0-9]+$ ]] && [ "$steps" -ge 3 ] || bad "--steps $steps" "at least 3: the first two are warm-up"
[ -x "$BIN" ] || bad "$BIN is not built" "run make first"
if [ ! -f "$data" ]; then
    bash scripts/prepare_corpus.sh --byte-level "$BIN" "$(dirname "$data")" >/dev/null ||
        bad "no data at $data" "pass --data with a byte-level train.bin"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=passive
        --mca mpi_yield_when_idle 1)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
wide=(--config configs/test-tiny.yaml --set model.d_model=256 --set model.n_layer=4
      --set model.seq_len=64 --set train.global_batch=16)
"$BIN" plan --calibrate >"$tmp/cpu.yaml"
"$BIN" plan "${wide[@]}" --search 2 --hardware "$tmp/cpu.yaml" --top 100000 --json >"$tmp/search.json"
echo "plan --search against measured steps ($(hostname), $(date -u '+%Y-%m-%d %H:%M UTC'), $steps steps)"
printf '%-8s %12s %12s %7s\n' layout "estimate ms" "measured ms" ratio
for layout in dp tp pp; do
    "${MPIRUN[@]}" -np 2 "$BIN" train "${wide[@]}" --set train.threads=1 --set data.train="$data" \
        --set parallel.$layout=2 --set train.micro_batch=2 --set train.steps="$steps" \
        --set train.warmup_steps=1 --set log.metrics="$tmp/$layout.jsonl" >"$tmp/$layout.log" 2>&1 ||
        { echo "$layout 2: the run failed:"; tail -5 "$tmp/$layout.log"; exit 1; }
    python3 - "$tmp/search.json" "$tmp/$layout.jsonl" "$layout" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
want = {"tp": 1, "pp": 1, "dp": 1}
want[sys.argv[3]] = 2
est = [r for r in rows if (r["tp"], r["pp"], r["dp"], r["cp"], r["ep"]) == (want["tp"], want["pp"], want["dp"], 1, 1) and
       r["zero_stage"] == 0 and r["micro_batch"] == 2 and not r["recompute"] and r["schedule"] == "1f1b"
       and not r["sequence_parallel"]]
if len(est) != 1:
    sys.exit(f"{sys.argv[3]} 2: {len(est)} search rows for the layout")
steps = [json.loads(l)["step_time_s"] for l in open(sys.argv[2]) if '"loss"' in l]
measured = statistics.median(steps[2:])
print(f"{sys.argv[3] + ' 2':<8} {1e3 * est[0]['step_s']:12.1f} {1e3 * measured:12.1f} {measured / est[0]['step_s']:7.2f}")
PY
done
