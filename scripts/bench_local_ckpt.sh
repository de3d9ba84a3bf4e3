#!/usr/bin/env bash
# bench_local_ckpt.sh — what a local checkpoint every step costs (parallel/README.md, Local
# checkpoints): configs/tiny.yaml at dp ranks under mpirun, a rank a core, the same run with
# checkpoint.local_interval 0 and 1 (into --local-dir, default /dev/shm), alternated --pairs
# times so that both see the same machine, at each global batch of --batches. Per run, the mean
# over the steps after the first four (the first three saves make their files) of step_time_s plus
# local_save_s (the wait for local saves at the step boundaries); one line per batch:
#   tokens a step, ms a step without and with, with/without (the median of the pairs' ratios),
#   the wait at a boundary, the bytes each rank stages and sends to its partner.
# A save's cost is about fixed (the state), a step's grows with its tokens: the ratio falls as
# the batch grows, and a real run's hundreds of thousands of tokens a step lie far to the right.
#
#   scripts/bench_local_ckpt.sh [--dp N] [--batches "16 64"] [--steps N] [--pairs N]
#                               [--local-dir DIR] [--config FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/cooktrain
dp=2
batches="16 64"
steps=16
pairs=2
local_dir=/dev/shm
config=configs/tiny.yaml
bad() { echo "bench_local_ckpt: $1" >&2; echo "hint: $2" >&2; exit 2; }
usage='scripts/bench_local_ckpt.sh [--dp N] [--batches "16 64"] [--steps N] [--pairs N] [--local-dir DIR] [--config FILE]'
while [ $# -gt 0 ]; do
    case $1 in
        --dp | --batches | --steps | --pairs | --local-dir | --config)
            [ $# -ge 2 ] || bad "$1 needs a value" "$usage"
            case $1 in
                --dp) dp=$2 ;;
                --batches) batches=$2 ;;
                --steps) steps=$2 ;;
                --pairs) pairs=$2 ;;
                --local-dir) local_dir=$2 ;;
                --config) config=$2 ;;
            esac
            shift 2 ;;
        *) bad "unknown option $1" "$usage" ;;
    esac
done
for x in $dp $batches $pairs; do [[ $x =~ ^[1-9][0-9]*$ ]] || bad "'$x' is not a positive integer" "$usage"; done
[[ $steps =~ ^[0-9]+$ ]] && [ "$steps" -ge 6 ] || bad "--steps $steps: at least 6 (the first four are not timed)" "--steps 16"
[ "$dp" -ge 2 ] || bad "--dp $dp: a partner's copy needs two ranks" "--dp 2"
[ -x "$BIN" ] || bad "$BIN is missing" "build it: make"
[ -f "$config" ] || bad "$config is missing" "--config FILE"
[ -d "$local_dir" ] && [ -w "$local_dir" ] || bad "--local-dir $local_dir is not a writable folder" "--local-dir /dev/shm"
grep -q 'data/fortunes' "$config" && { [ -f data/fortunes/train.bin ] || bad "data/fortunes/train.bin is missing" "make data"; }

cores=$(getconf _NPROCESSORS_ONLN) # not nproc, which reads OMP_NUM_THREADS
threads=$((cores / dp))
[ "$threads" -ge 1 ] || threads=1
tmp=$(mktemp -d)
shm=$(mktemp -d -p "$local_dir" bench-local.XXXXXX)
trap 'rm -rf "$tmp" "$shm"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print ""; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# run BATCH INTERVAL: one run; prints "ms-per-step wait-ms-per-step"
run() {
    rm -rf "$tmp/ck" "$tmp/m.jsonl" "$shm"/*
    if ! mpirun -np "$dp" "$BIN" train --config "$config" --set parallel.dp="$dp" \
        --set train.global_batch="$1" --set train.steps="$steps" --set train.eval_interval=0 \
        --set train.threads="$threads" --set log.sample_tokens=0 --set log.interval=1000 \
        --set checkpoint.dir="$tmp/ck" --set checkpoint.local_interval="$2" \
        --set checkpoint.local_dir="$shm" --set log.metrics="$tmp/m.jsonl" \
        >"$tmp/out.txt" 2>&1 </dev/null; then
        echo "bench_local_ckpt: the run at global batch $1 failed:" >&2
        tail -5 "$tmp/out.txt" >&2
        exit 1
    fi
    grep '"loss"' "$tmp/m.jsonl" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin][4:]
step = sum(r["step_time_s"] + r.get("local_save_s", 0.0) for r in rows) / len(rows)
wait = sum(r.get("local_save_s", 0.0) for r in rows) / len(rows)
print(f"{1e3 * step:.2f} {1e3 * wait:.2f}")'
}

echo "== $config at dp $dp, $threads thread(s) a rank, local dir $local_dir, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores, $(date -u +%Y-%m-%d); $steps steps a run, $pairs pairs"
printf '%8s %10s %10s %10s %9s %12s %14s\n' batch tokens/step "ms off" "ms on" on/off "wait ms" "MiB staged/rank"
seq_len=$(sed -n 's/^ *seq_len: *\([0-9]*\).*/\1/p' "$config" | head -1)
for b in $batches; do
    offs="" ons="" ratios="" waits=""
    for _ in $(seq "$pairs"); do
        read -r off _ < <(run "$b" 0)
        read -r on wait < <(run "$b" 1)
        offs+="$off"$'\n' ons+="$on"$'\n' waits+="$wait"$'\n'
        ratios+=$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.4f", a / b }')$'\n'
    done
    mib=$(sed -n 's/.*partner.s copy in each: \([0-9.]*\) MiB per rank.*/\1/p' "$tmp/out.txt" | head -1)
    printf '%8d %10d %10.1f %10.1f %9.3f %12.2f %14s\n' "$b" "$((b * ${seq_len:-0}))" \
        "$(printf '%s' "$offs" | median)" "$(printf '%s' "$ons" | median)" \
        "$(printf '%s' "$ratios" | median)" "$(printf '%s' "$waits" | median)" "${mib:--}"
done
