#!/usr/bin/env bash
# bench_moe.sh — Mixture of Experts (core/README.md, Mixture of Experts; parallel/README.md,
# Expert parallelism) on this machine: configs/moe-tiny.yaml against configs/tiny.yaml, the dense
# GPT-2 whose every token meets the same MLP width (moe-tiny routes each token to 2 experts of
# width 512 where tiny has one MLP of 1024: the same active parameters per token), at 1 rank and
# at 2 ranks (dp 2, with ep 1 and ep 2), one run each, and one table:
#   tok/s (median over the steps after the first) and its ratio to the dense model's at the same
#   ranks; the share of rank 0's step spent routing and moving tokens (moe_route_s of the metrics:
#   the router's choice, the permutation, the all-to-all and the host copies around them);
#   the experts' GEMM rate in training (moe_expert_gemm_flops_per_s) against the rate the same
#   GEMMs reach alone at the rows an expert receives under uniform routing (`cooktrain train
#   --gemm-rate`'s moe_expert_gemm_flops_per_s), and the ratio of the two.
# (The alone rate is measured per rank count with a rank's threads and micro-batch.)
# The CPU backend runs ops as they are issued, so the routing and GEMM clocks see each part's
# cost; on an asynchronous backend the host's waits fall into the routing.
#
#   scripts/bench_moe.sh [--steps N] [--threads N]
# (needs data/fortunes: `make data`; threads default to cores / ranks)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/cooktrain
steps=20
threads=""
bad() { echo "bench_moe: $1" >&2; echo "hint: $2" >&2; exit 2; }
usage='scripts/bench_moe.sh [--steps N] [--threads N]'
while [ $# -gt 0 ]; do
    case $1 in
        --steps | --threads)
            [ $# -ge 2 ] || bad "$1 needs a value" "$usage"
            case $1 in
                --steps) steps=$2 ;;
                --threads) threads=$2 ;;
            esac
            shift 2 ;;
        *) bad "unknown option $1" "$usage" ;;
    esac
done
[[ $steps =~ ^[1-9][0-9]*$ ]] && [ "$steps" -ge 2 ] || bad "--steps $steps: at least 2 (the first is not timed)" "--steps 20"
[ -z "$threads" ] || [[ $threads =~ ^[1-9][0-9]*$ ]] || bad "--threads $threads is not a positive integer" "$usage"
[ -x "$BIN" ] || bad "$BIN is missing" "build it: make"
[ -f data/fortunes/train.bin ] || bad "data/fortunes/train.bin is missing" "make data"

cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print 0; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\": \\([0-9.e+-]*\\).*/\\1/p" "$2"; }
export OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# run NAME NP ARGS...: trains `steps` steps, leaves the metrics in $tmp/NAME.jsonl
run() {
    local name=$1 np=$2 t=${threads:-$((cores / $2))}
    shift 2
    [ "$t" -ge 1 ] || t=1
    local launch=("$BIN")
    [ "$np" -gt 1 ] && launch=(mpirun -np "$np" "$BIN")
    "${launch[@]}" train "$@" --set train.steps="$steps" --set train.warmup_steps=1 \
        --set train.eval_interval=0 --set log.sample_tokens=0 --set train.threads="$t" \
        --set log.metrics="$tmp/$name.jsonl" >"$tmp/$name.out" 2>&1 </dev/null ||
        { echo "bench_moe: the $name run failed:" >&2; tail -5 "$tmp/$name.out" >&2; exit 1; }
}

echo "== configs/moe-tiny.yaml vs configs/tiny.yaml, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores, $(date -u +%Y-%m-%d); $steps steps a run"
printf '%-10s %5s %3s %10s %10s %12s %18s %9s\n' config ranks ep tok/s "vs dense" "routing %" "expert GFLOP/s" "vs alone"
for np in 1 2; do
    # the expert GEMMs alone at their shapes, with a rank's threads and micro-batch at np ranks
    t=${threads:-$((cores / np))}
    [ "$t" -ge 1 ] || t=1
    # (micro_batch auto: the whole global batch of 16 sequences of 128 tokens per dp rank)
    alone=$("$BIN" train --config configs/moe-tiny.yaml --set train.threads="$t" \
        --set train.micro_batch=$((16 / np)) --gemm-rate | sed -n 's/^moe_expert_gemm_flops_per_s //p')
    run "dense-$np" "$np" --config configs/tiny.yaml
    dense=$(field tokens_per_s "$tmp/dense-$np.jsonl" | tail -n +2 | median)
    printf '%-10s %5d %3s %10.0f %10s %12s %18s %9s\n' tiny "$np" - "$dense" 1.00 - - -
    eps=1
    [ "$np" -gt 1 ] && eps="1 $np"
    for ep in $eps; do
        name=moe-$np-$ep
        run "$name" "$np" --config configs/moe-tiny.yaml --set parallel.ep="$ep"
        m=$tmp/$name.jsonl
        tps=$(field tokens_per_s "$m" | tail -n +2 | median)
        st=$(field step_time_s "$m" | tail -n +2 | median)
        route=$(field moe_route_s "$m" | tail -n +2 | median)
        rate=$(field moe_expert_gemm_flops_per_s "$m" | tail -n +2 | median)
        awk -v np="$np" -v ep="$ep" -v tps="$tps" -v d="$dense" -v st="$st" -v r="$route" \
            -v rate="$rate" -v alone="$alone" 'BEGIN {
            printf "%-10s %5d %3d %10.0f %10.2f %11.1f%% %18.1f %8.0f%%\n", "moe-tiny", np, ep, tps,
                   (d > 0 ? tps / d : 0), (st > 0 ? 100 * r / st : 0), rate / 1e9,
                   (alone > 0 ? 100 * rate / alone : 0) }'
    done
done
echo "(tok/s: medians after the first step; routing: rank 0's routing, permutation, all-to-all and host copies over its step time; expert GFLOP/s: rank 0's expert GEMMs in training, forward and backward)"
