#!/usr/bin/env bash
# CPU benchmark: tokens/s and MFU for configs/tiny.yaml and configs/gpt2-124m.yaml, and the BPE
# training time. Every ratio uses figures measured in this same run: MFU's denominator is the
# sgemm rate at the model's own GEMM shapes (`cooktrain train --gemm-rate`, every linear
# layer's forward, input-gradient and weight-gradient GEMM), measured right before training,
# because this machine's speed drifts over minutes.
#
#   scripts/bench_cpu.sh [--steps-tiny N] [--steps-124m N] [--threads N]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/cooktrain
steps_tiny=30
steps_124m=6
threads=2
while [ $# -gt 0 ]; do
    case $1 in
        --steps-tiny) steps_tiny=$2; shift 2 ;;
        --steps-124m) steps_124m=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        *) echo "bench_cpu: unknown option $1" >&2; echo "hint: see the comment at the top of $0" >&2; exit 2 ;;
    esac
done

make --no-print-directory -s "$BIN" >/dev/null
export OMP_WAIT_POLICY=active
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- BPE training time ----------------------------------------------------------------------
fortunes=/usr/share/games/fortunes
echo "== BPE: 4096-token vocabulary on the fortunes corpus"
"$BIN" prepare --input "$fortunes" --vocab-size 4096 --out "$tmp/f4096" | sed 's/^/   /'

# ---- a model: gemm rate, then training ------------------------------------------------------
# bench NAME CONFIG STEPS [--set ...]
bench() {
    local name=$1 config=$2 steps=$3
    shift 3
    local sets=(--set train.threads="$threads" --set train.steps="$steps" --set log.interval=1
                --set log.metrics="$tmp/$name.jsonl" --set train.eval_interval=0
                --set log.sample_tokens=0 "$@")
    local rate fpt
    rate=$("$BIN" train --config "$config" "${sets[@]}" --gemm-rate | awk '/gemm_flops_per_s/ {print $2}')
    fpt=$("$BIN" train --config "$config" "${sets[@]}" --gemm-rate | awk '/flops_per_token/ {print $2}')
    "$BIN" train --config "$config" "${sets[@]}" >"$tmp/$name.log"
    # Median tokens/s over the steps after the first two (warm-up: page faults, BLAS buffers).
    local tps
    tps=$(sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' "$tmp/$name.jsonl" | tail -n +3 | sort -g |
          awk '{a[NR]=$1} END {if (NR == 0) print 0; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}')
    awk -v n="$name" -v tps="$tps" -v fpt="$fpt" -v rate="$rate" -v th="$threads" 'BEGIN {
        printf "%-10s %8.1f tok/s | %.3g FLOP/token | sgemm at model shapes %.1f GFLOP/s (%d threads) | MFU %.1f%%\n",
               n, tps, fpt, rate / 1e9, th, 100 * tps * fpt / rate }'
}

echo "== training throughput (median over steps 3..N; MFU = tokens/s x FLOP/token / sgemm rate)"
if [ ! -f data/fortunes/train.bin ]; then bash scripts/prepare_corpus.sh "$BIN" data/fortunes >/dev/null; fi
bench tiny configs/tiny.yaml "$steps_tiny"
# GPT-2 124M on the fortunes text tokenized with a large BPE (the corpus yields fewer merges
# than 50257, which the model's vocabulary of 50257 accepts).
"$BIN" prepare --input "$fortunes" --vocab-size 50257 --out "$tmp/f50k" >/dev/null
bench gpt2-124m configs/gpt2-124m.yaml "$steps_124m" --set data.train="$tmp/f50k/train.bin"
