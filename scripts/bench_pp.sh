#!/usr/bin/env bash
# bench_pp.sh — pipeline schedules side by side on this machine (parallel/README.md, Pipeline
# parallel): configs/tiny.yaml (GPT-2, 8 layers here so that 2 and 4 stages, and two chunks a
# rank, divide them) on the byte-level corpus (vocabulary 123: the LM head costs a tenth of a
# layer, so the stages balance; with the 4096-token BPE it costs about 2.7 layers and the last
# stage sets everyone's pace) at each pp of --pps and each microbatch count of --ms, every
# schedule of --schedules, one run each (pp ranks under mpirun, oversubscribed past the cores:
# the table says how many ranks share a core), and one table:
#   pp, m, schedule, tokens/s (median of the steps after the first); the idle share of the
#   pipeline's span, mean over ranks, measured from the trace (log.trace; steps 2 on) beside the
#   simulator's fed each chunk's measured F, B and W (test/tools/check_trace.py --pipeline),
#   and the simulator's at F = B = W (`cooktrain plan --schedule S --costs 1,1,1`: a split
#   backward's two parts equal, a whole one twice the forward); memory of rank 0 (mem_bytes).
#
#   scripts/bench_pp.sh [--pps "2 4"] [--ms "4 8 16"] [--schedules "1f1b interleaved zbh1 zbv"]
#                       [--steps N] [--data DIR] [--vocab N]
# (--data: train.bin, val.bin and tokenizer.bin, default data/fortunes-bytes, which `make data`
# writes; --vocab: its vocabulary, default 123.)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/cooktrain
pps="2 4"
ms="4 8 16"
schedules="1f1b interleaved zbh1 zbv"
steps=4
data=data/fortunes-bytes
vocab=123
bad() { echo "bench_pp: $1" >&2; echo "hint: $2" >&2; exit 2; }
usage='scripts/bench_pp.sh [--pps "2 4"] [--ms "4 8 16"] [--schedules "1f1b zbh1"] [--steps N] [--data DIR] [--vocab N]'
while [ $# -gt 0 ]; do
    case $1 in
        --pps | --ms | --schedules | --steps | --data | --vocab)
            [ $# -ge 2 ] || bad "$1 needs a value" "$usage"
            case $1 in
                --pps) pps=$2 ;;
                --ms) ms=$2 ;;
                --schedules) schedules=$2 ;;
                --steps) steps=$2 ;;
                --data) data=$2 ;;
                --vocab) vocab=$2 ;;
            esac
            shift 2 ;;
        *) bad "unknown option $1" "$usage" ;;
    esac
done
[[ $steps =~ ^[1-9][0-9]*$ ]] && [ "$steps" -ge 2 ] || bad "--steps $steps: at least 2 (the first is not timed)" "--steps 4"
for x in $pps $ms $vocab; do [[ $x =~ ^[1-9][0-9]*$ ]] || bad "'$x' is not a positive integer" "$usage"; done
for s in $schedules; do
    case $s in 1f1b | gpipe | interleaved | zbh1 | zbv) ;; *) bad "unknown schedule $s" "$usage" ;; esac
done
[ -x "$BIN" ] || bad "$BIN is missing" "build it: make"
[ -f "$data/train.bin" ] || bad "$data/train.bin is missing" "make data (or --data DIR)"

cores=$(getconf _NPROCESSORS_ONLN) # not nproc, which reads OMP_NUM_THREADS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print ""; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\": \\([0-9.e+-]*\\).*/\\1/p" "$2"; }
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "== configs/tiny.yaml with 8 layers and vocabulary $vocab, micro_batch 2, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores, $(date -u +%Y-%m-%d); $steps steps a run"
printf '%3s %3s %-12s %6s %8s %9s %9s %9s %13s\n' pp m schedule ranks/core tok/s "idle %" "sim %" "sim=%" "mem MiB/rank"
mean_rank() { awk '{ s += $1; n++ } END { if (n) printf "%.1f", s / n }'; }
for pp in $pps; do
    for m in $ms; do
        for s in $schedules; do
            v=1
            [ "$s" = interleaved ] && v=2
            [ "$s" = zbv ] && v=2
            even=$("$BIN" plan --schedule "$s" --pp "$pp" --microbatches "$m" --virtual-stages "$v" --costs 1,1,1 2>/dev/null |
                sed -n 's/^rank *[0-9]*: .*bubble *\([0-9.]*\)%.*/\1/p' | mean_rank || true)
            per_core=$(awk -v p="$pp" -v c="$cores" 'BEGIN { printf "%.1f", p / c }')
            threads=$((cores / pp))
            [ "$threads" -ge 1 ] || threads=1
            sets=(--config configs/tiny.yaml --set model.n_layer=8 --set model.vocab_size="$vocab"
                  --set parallel.pp="$pp" --set parallel.schedule="$s" --set parallel.virtual_stages="$v"
                  --set train.micro_batch=2 --set train.global_batch=$((2 * m))
                  --set train.steps="$steps" --set train.warmup_steps=1 --set train.eval_interval=0
                  --set train.threads="$threads" --set log.sample_tokens=0
                  --set data.train="$data/train.bin" --set data.val="$data/val.bin")
            [ -f "$data/tokenizer.bin" ] && sets+=(--set data.tokenizer="$data/tokenizer.bin")
            if ! mpirun -np "$pp" "$BIN" train "${sets[@]}" --set log.metrics="$tmp/m.jsonl" \
                --set log.trace="$tmp/trace.json" >"$tmp/out.txt" 2>&1 </dev/null; then
                why=$(grep -m1 '^cooktrain:' "$tmp/out.txt" | cut -c1-70 || true)
                printf '%3d %3d %-12s %s\n' "$pp" "$m" "$s" "failed: ${why:-see its output}"
                continue
            fi
            rm -f "$tmp/m.jsonl.tmp"
            grep '"loss"' "$tmp/m.jsonl" >"$tmp/steps.jsonl"
            tps=$(field tokens_per_s "$tmp/steps.jsonl" | tail -n +2 | median)
            mem=$(field mem_bytes "$tmp/steps.jsonl" | tail -n 1)
            # each rank's measured idle and the simulator's with the measured costs ("rank R idle
            # X% vs Y%"), whatever the difference (bound 1)
            idle=$(python3 test/tools/check_trace.py --pipeline "$tmp/trace.json" "$BIN" "$s" "$pp" "$v" "$m" 1 |
                grep -o 'rank [0-9]* idle [0-9.]*% vs [0-9.]*%' || true)
            got=$(printf '%s\n' "$idle" | sed -n 's/.* idle \([0-9.]*\)% vs .*/\1/p' | mean_rank)
            sim=$(printf '%s\n' "$idle" | sed -n 's/.* vs \([0-9.]*\)%/\1/p' | mean_rank)
            printf '%3d %3d %-12s %6s %8.0f %9s %9s %9s %13.1f\n' "$pp" "$m" "$s" "$per_core" "$tps" "${got:--}" \
                "${sim:--}" "${even:--}" "$(awk -v b="$mem" 'BEGIN { print b / 1048576 }')"
            rm -f "$tmp/m.jsonl" "$tmp"/trace*.json
        done
    done
done
