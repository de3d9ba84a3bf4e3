#!/usr/bin/env bash
# bench_cp.sh — context parallelism (parallel/README.md, Context parallelism) on this machine:
# configs/long-context.yaml (a 0.11M-parameter Llama, byte tokens) at each sequence length of
# --seqs and each cp of --cps, one run each (cp ranks under mpirun, oversubscribed when cp exceeds
# the cores; threads per rank = cores / cp, at least 1), and one table:
#   T, cp, tokens/s (median over the steps after the first), the step time, the ring's exposed
#   time as a share of the step (cp_wait_s of the metrics: the seconds a rank waited in the ring's
#   sends and receives, rank 0; with cp ranks sharing cores it also holds the waits for a slower
#   neighbour), the bytes the ring sent per step and rank (cp_bytes; the formula's in
#   cp_bytes_expected, which the suite checks), and memory per rank (mem_bytes: the backend's
#   allocations) beside the activations `cooktrain plan` predicts.
# A run that fails (out of memory under --mem-limit-mb) says so on its row.
#
#   scripts/bench_cp.sh [--seqs "2048 4096 8192 16384 32768"] [--cps "1 2 4"] [--steps N]
#                       [--mem-limit-mb N] [--data DIR]
# (--data: a directory with the byte-level train.bin and val.bin; default data/fortunes-bytes,
# which `make data` writes.)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/cooktrain
seqs="2048 4096 8192 16384 32768"
cps="1 2 4"
steps=3
mem_limit=""
data=data/fortunes-bytes
bad() { echo "bench_cp: $1" >&2; echo "hint: $2" >&2; exit 2; }
usage='scripts/bench_cp.sh [--seqs "2048 4096"] [--cps "1 2 4"] [--steps N] [--mem-limit-mb N] [--data DIR]'
while [ $# -gt 0 ]; do
    case $1 in
        --seqs | --cps | --steps | --mem-limit-mb | --data)
            [ $# -ge 2 ] || bad "$1 needs a value" "$usage"
            case $1 in
                --seqs) seqs=$2 ;;
                --cps) cps=$2 ;;
                --steps) steps=$2 ;;
                --mem-limit-mb) mem_limit=$2 ;;
                --data) data=$2 ;;
            esac
            shift 2 ;;
        *) bad "unknown option $1" "$usage" ;;
    esac
done
[[ $steps =~ ^[1-9][0-9]*$ ]] && [ "$steps" -ge 2 ] || bad "--steps $steps: at least 2 (the first is not timed)" "--steps 3"
for x in $seqs $cps; do [[ $x =~ ^[1-9][0-9]*$ ]] || bad "'$x' is not a positive integer" "$usage"; done
[ -x "$BIN" ] || bad "$BIN is missing" "build it: make"
[ -f "$data/train.bin" ] || bad "$data/train.bin is missing" "make data (or --data DIR)"

cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print ""; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\": \\([0-9.e+-]*\\).*/\\1/p" "$2"; }
export OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "== configs/long-context.yaml, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores, $(date -u +%Y-%m-%d); $steps steps a run${mem_limit:+, COOKTRAIN_MEM_LIMIT_MB=$mem_limit}"
printf '%7s %3s %10s %9s %12s %14s %13s %13s\n' T cp tok/s "step s" "ring wait %" "ring MiB/step" "mem MiB/rank" "plan acts MiB"
for T in $seqs; do
    for cp in $cps; do
        threads=$((cores / cp))
        [ "$threads" -ge 1 ] || threads=1
        sets=(--config configs/long-context.yaml --set model.seq_len="$T" --set parallel.cp="$cp"
              --set train.steps="$steps" --set train.threads="$threads"
              --set data.train="$data/train.bin" --set data.val="$data/val.bin")
        acts=$("$BIN" plan "${sets[@]}" --json 2>/dev/null | sed -n 's/.*"acts_bytes": \([0-9]*\).*/\1/p' | head -n 1)
        acts=$(awk -v a="${acts:-0}" 'BEGIN { printf "%.1f", a / 1048576 }')
        launch=("$BIN")
        [ "$cp" -gt 1 ] && launch=(mpirun -np "$cp" "$BIN")
        env_mem=()
        [ -n "$mem_limit" ] && env_mem=(env COOKTRAIN_MEM_LIMIT_MB="$mem_limit")
        if ! "${env_mem[@]}" "${launch[@]}" train "${sets[@]}" --set log.metrics="$tmp/m.jsonl" >"$tmp/out.txt" 2>&1 </dev/null; then
            why=$(grep -m1 '^cooktrain:' "$tmp/out.txt" | cut -c1-90 || true)
            printf '%7d %3d %s\n' "$T" "$cp" "failed: ${why:-see its output}"
            continue
        fi
        m=$tmp/m.jsonl
        tps=$(field tokens_per_s "$m" | tail -n +2 | median)
        st=$(field step_time_s "$m" | tail -n +2 | median)
        wait=$(field cp_wait_s "$m" | tail -n +2 | median)
        ring=$(field cp_bytes "$m" | tail -n 1)
        mem=$(field mem_bytes "$m" | sort -n | tail -n 1)
        awk -v T="$T" -v cp="$cp" -v tps="$tps" -v st="$st" -v w="$wait" -v ring="$ring" -v mem="$mem" -v acts="$acts" 'BEGIN {
            printf "%7d %3d %10.0f %9.2f %11.1f%% %14.1f %13.1f %13s\n", T, cp, tps, st,
                   (st > 0 ? 100 * w / st : 0), ring / 1048576, mem / 1048576, acts }'
    done
done
echo "(ring wait: rank 0's seconds blocked in the ring's hops over its step time; tok/s and step time: medians after the first step)"
