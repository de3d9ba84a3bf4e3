#!/usr/bin/env bash
# gpu_check.sh — the first run of the CUDA backend on a real GPU (cuda/README.md, On a real GPU),
# in three parts:
#   1. check mode: configs/test-tiny.yaml for 2 steps with every op also run on the CPU backend
#      from the same inputs and compared within its derived tolerance (CT_CHECK_BACKEND=1,
#      core/backend/backend_check.c), in fp32 and in bf16; the first op that disagrees is named
#      (on Hopper, the wgmma attention kernels too: CT_CUDA_ATTENTION=wgmma);
# then the same for 2 layers at head widths 64 and 128 and sequence lengths 150, 100 and 256, and
# for a Llama (model.arch llama: RMSNorm, rotary positions, SwiGLU, grouped-query attention) at
# test-tiny's shape with 4 key/value heads and at head width 128 with 2 key/value heads, T 150;
#   2. training against the CPU: test-tiny for 4 steps on the GPU and on the CPU backend, every
#      loss, gradient norm and final parameter compared by test/tools/compare_runs.py (fp32: its
#      summation-order tolerance; bf16: the distance between the CPU's bf16 and fp32 runs), as
#      test/cli/cli_cuda.sh does on the emulated device, and the GPU run's trace (its unit spans timed
#      by CUDA events) checked by test/tools/check_trace.py --timeline; then the GPU runs again with
#      the step issued from a CUDA graph (train.cuda_graph), which must give the same bits;
#   3. throughput: configs/tiny.yaml and configs/gpt2-124m.yaml in fp32 and bf16 on one GPU:
#      median tokens/s, MFU over the device's peak in that precision (as the trainer prints it)
#      and, from a second short run, the --profile split by op category;
#   4. on a Hopper GPU (sm_90), with nvcc: test/unit/wgmma_probe.cu built for sm_90a and run, which
#      says for each shared-memory layout of cuda/ct_wgmma.cuh whether the hardware reads it as
#      the emulator does (a report for the kernels to come: it fails nothing).
# Exits 1 when part 1 or 2 fails. Needs a GPU, the nvcc build (build/libcooktrain-cuda.so) and
# the corpora of `make data`; 124M trains on build/bench-data/gpt2-124m (made here from the
# fortunes corpus when missing, as configs/gpt2-124m.yaml expects).
#
#   scripts/gpu_check.sh [--steps-tiny N] [--steps-124m N] [--skip-throughput]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/cooktrain
steps_tiny=60
steps_124m=30
throughput=1
while [ $# -gt 0 ]; do
    case $1 in
        --steps-tiny) steps_tiny=$2; shift 2 ;;
        --steps-124m) steps_124m=$2; shift 2 ;;
        --skip-throughput) throughput=0; shift ;;
        *) echo "gpu_check: unknown option $1" >&2; echo "hint: see the comment at the top of $0" >&2; exit 2 ;;
    esac
done
for n in "$steps_tiny" "$steps_124m"; do
    if ! [[ $n =~ ^[1-9][0-9]*$ ]] || [ "$n" -lt 4 ]; then
        echo "gpu_check: a step count of $n is too few (the medians skip the first 2 steps)" >&2; echo "hint: --steps-tiny 60 --steps-124m 30" >&2; exit 2
    fi
done
if [ ! -x "$BIN" ] || [ ! -f "$BUILD/libcooktrain-cuda.so" ]; then
    echo "gpu_check: $BIN or $BUILD/libcooktrain-cuda.so is missing" >&2; echo "hint: build with nvcc on the PATH: make" >&2; exit 2
fi
for d in data/fortunes-bytes data/fortunes; do
    if [ ! -f "$d/train.bin" ]; then echo "gpu_check: $d/train.bin is missing" >&2; echo "hint: make data" >&2; exit 2; fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

# ---- 1. check mode ------------------------------------------------------------------------------
tiny=(train --config configs/test-tiny.yaml --set train.threads=1 --set train.eps=1e-6)
for precision in fp32 bf16; do
    if CT_CHECK_BACKEND=1 "$BIN" "${tiny[@]}" --backend cuda --set train.steps=2 --set train.precision=$precision \
        >"$tmp/check.$precision.log" 2>&1; then
        echo "check mode $precision: every op of 2 steps agrees with the CPU backend ($(grep -m1 '^backend' "$tmp/check.$precision.log" || true))"
    else
        failed=1
        echo "check mode $precision: FAILED"; tail -n 12 "$tmp/check.$precision.log" | sed 's/^/    /'
    fi
done
# the attention kernels at the head widths they compile (test-tiny's 8 runs in the 32-wide one)
# and at sequence lengths with partial tiles: d_model heads seq_len batch
for shape in "256 4 150 4" "256 2 100 2" "512 8 256 2"; do
    read -r d heads t b <<<"$shape"
    for precision in fp32 bf16; do
        log="$tmp/check.$d.$t.$precision.log"
        if CT_CHECK_BACKEND=1 "$BIN" "${tiny[@]}" --backend cuda --set train.steps=2 --set train.precision=$precision \
            --set model.n_layer=2 --set model.d_model="$d" --set model.n_head="$heads" --set model.seq_len="$t" \
            --set train.global_batch="$b" --set train.micro_batch="$b" >"$log" 2>&1; then
            echo "check mode $precision, head width $((d / heads)), T $t: every op agrees"
        else
            failed=1
            echo "check mode $precision, head width $((d / heads)), T $t: FAILED"; tail -n 12 "$log" | sed 's/^/    /'
        fi
    done
done
# the Llama ops (RMSNorm, rotary positions, SwiGLU) and grouped-query attention: n_layer d_model
# heads kv_heads seq_len batch ("-": test-tiny's)
for shape in "- - - 4 - -" "2 512 4 2 150 2"; do
    read -r l d heads kv t b <<<"$shape"
    llama=(--set model.arch=llama --set model.n_kv_head="$kv" --set model.multiple_of=32)
    [ "$l" = - ] || llama+=(--set model.n_layer="$l" --set model.d_model="$d" --set model.n_head="$heads"
                            --set model.seq_len="$t" --set train.global_batch="$b" --set train.micro_batch="$b")
    for precision in fp32 bf16; do
        log="$tmp/check.llama.$kv.$precision.log"
        what="check mode $precision, Llama, $kv key/value heads"
        [ "$d" = - ] || what="check mode $precision, Llama, $kv key/value heads, head width $((d / heads)), T $t"
        if CT_CHECK_BACKEND=1 "$BIN" "${tiny[@]}" --backend cuda --set train.steps=2 --set train.precision=$precision \
            "${llama[@]}" >"$log" 2>&1; then
            echo "$what: every op agrees"
        else
            failed=1
            echo "$what: FAILED"; tail -n 12 "$log" | sed 's/^/    /'
        fi
    done
done
# Hopper: the wgmma attention kernels (CT_CUDA_ATTENTION=wgmma, head width 64 in bf16), at partial
# tiles, past the three key-tile slots they stream through (T 300: five tiles) and with
# grouped-query heads: d_model heads kv_heads seq_len batch
cc_major=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | cut -d. -f1 || true)
if [ "$cc_major" = 9 ]; then
    for shape in "256 4 4 300 2" "512 8 2 100 2"; do
        read -r d heads kv t b <<<"$shape"
        log="$tmp/check.wgmma.$d.$kv.log"
        what="check mode bf16, wgmma attention, head width $((d / heads)), $kv key/value heads, T $t"
        if CT_CUDA_ATTENTION=wgmma CT_CHECK_BACKEND=1 "$BIN" "${tiny[@]}" --backend cuda --set train.steps=2 \
            --set train.precision=bf16 --set model.arch=llama --set model.multiple_of=32 --set model.n_layer=2 \
            --set model.d_model="$d" --set model.n_head="$heads" --set model.n_kv_head="$kv" \
            --set model.seq_len="$t" --set train.global_batch="$b" --set train.micro_batch="$b" >"$log" 2>&1; then
            echo "$what: every op agrees"
        else
            failed=1
            echo "$what: FAILED"; tail -n 12 "$log" | sed 's/^/    /'
        fi
    done
else
    echo "check mode, wgmma attention: skipped (compute capability ${cc_major:-unknown}.x, not Hopper)"
fi

# ---- 2. training against the CPU ----------------------------------------------------------------
# train DIR NAME [args]: test-tiny's 4 steps with metrics and final parameters under DIR/NAME.*
train() {
    local dir=$1 name=$2
    shift 2
    "$BIN" "${tiny[@]}" --set log.metrics="$dir/$name.jsonl" --dump-params "$dir/$name.bin" "$@" >"$dir/$name.log" 2>&1
}
# compare NAME DIR [--noise TWIN.jsonl TWIN.bin]
compare() {
    local name=$1 dir=$2 out
    shift 2
    if out=$(python3 test/tools/compare_runs.py "$dir/ref.jsonl" "$dir/ref.bin" "$dir/run.jsonl" "$dir/run.bin" \
        --init "$dir/init.bin" "$@" 2>&1); then
        echo "training $name: the GPU run matches the CPU's; $out"
    else
        failed=1
        echo "training $name: MISMATCH: $out"
    fi
}
mkdir -p "$tmp/f32" "$tmp/b16"
train "$tmp/f32" ref --dump-init-params "$tmp/f32/init.bin"
train "$tmp/f32" run --backend cuda --set log.trace="$tmp/f32/trace.json"
compare fp32 "$tmp/f32"
# the trace's unit spans come from the compute stream's timing events (core/README.md, Device time)
if out=$(python3 test/tools/check_trace.py --timeline "$tmp/f32/trace.json" 4 2>&1); then
    echo "device timeline: $out"
else
    failed=1
    echo "device timeline: WRONG: $out"
fi
for f in bin bin.index.json; do cp "$tmp/f32/init.$f" "$tmp/b16/init.$f"; done
train "$tmp/b16" ref --set train.precision=bf16
train "$tmp/b16" run --set train.precision=bf16 --backend cuda
compare bf16 "$tmp/b16" --noise "$tmp/f32/ref.jsonl" "$tmp/f32/ref.bin"
# train.cuda_graph (core/README.md, CUDA graphs): the same device work from one launch a step, so
# the same parameters bit for bit
for d in f32 b16; do
    p=fp32
    [ $d = b16 ] && p=bf16
    if train "$tmp/$d" graph --set train.precision=$p --backend cuda --set train.cuda_graph=true &&
        grep -q "cuda graph: step 2's forward and backward captured" "$tmp/$d/graph.log" &&
        cmp -s "$tmp/$d/run.bin" "$tmp/$d/graph.bin"; then
        echo "training $p from a CUDA graph: $(grep -m1 'cuda graph:' "$tmp/$d/graph.log"); parameters bit-identical"
    else
        failed=1
        echo "training $p from a CUDA graph: DIFFERS from the ops issued one by one (or failed):"
        tail -n 5 "$tmp/$d/graph.log" | sed 's/^/    /'
    fi
done

# ---- 3. throughput ------------------------------------------------------------------------------
# speed NAME CONFIG STEPS PRECISION [--set ...]: median tokens/s and MFU after the first 2 steps,
# then the op split from a second, 6-step run under --profile (which syncs the device after every
# op to time it, so its own tokens/s is not the trainer's)
speed() {
    local name=$1 config=$2 steps=$3 precision=$4
    shift 4
    local sets=(train --config "$config" --backend cuda --set train.warmup_steps=1 --set log.interval=1
                --set train.eval_interval=0 --set log.sample_tokens=0 --set train.precision="$precision" "$@")
    if ! "$BIN" "${sets[@]}" --set train.steps="$steps" --set log.metrics="$tmp/$name.jsonl" >"$tmp/$name.log" 2>&1 ||
        ! "$BIN" "${sets[@]}" --set train.steps=6 --profile >"$tmp/$name.profile.log" 2>&1; then
        failed=1
        echo "$name: the run failed:"; tail -n 8 "$tmp/$name.log" "$tmp/$name.profile.log" | sed 's/^/    /'
        return
    fi
    python3 - "$tmp/$name.jsonl" "$name" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
setup = next(r for r in rows if r.get("setup"))
steps = [r for r in rows if "tokens_per_s" in r][2:]
tps = statistics.median(r["tokens_per_s"] for r in steps)
mfu = statistics.median(r["mfu"] for r in steps) if all("mfu" in r for r in steps) else float("nan")
print("%-15s %9.0f tok/s | MFU %.1f%% of %.0f TFLOP/s | %.2f GiB of device memory | medians of %d steps"
      % (sys.argv[2], tps, 100 * mfu, setup.get("peak_flops_per_s", float("nan")) / 1e12,
         max(r["mem_bytes"] for r in steps) / 2**30, len(steps)))
PY
    echo "$name $(grep '^profile' "$tmp/$name.profile.log" | tail -1)"
}
if [ $throughput = 1 ]; then
    data124=$BUILD/bench-data/gpt2-124m
    if [ ! -f "$data124/train.bin" ] && [ -d /usr/share/games/fortunes ]; then
        "$BIN" prepare --input /usr/share/games/fortunes --vocab-size 50257 --out "$data124" >/dev/null
    fi
    echo "== throughput on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo 'the GPU')"
    for precision in fp32 bf16; do speed "tiny.$precision" configs/tiny.yaml "$steps_tiny" $precision; done
    if [ -f "$data124/train.bin" ]; then
        for precision in fp32 bf16; do speed "gpt2-124m.$precision" configs/gpt2-124m.yaml "$steps_124m" $precision; done
    else
        echo "gpt2-124m: skipped ($data124/train.bin is missing and there is no fortunes corpus to make it)"
    fi
fi

# ---- 4. the wgmma layout probe ------------------------------------------------------------------
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 || true)
if [ "${cc%%.*}" != 9 ]; then
    echo "wgmma probe: skipped (compute capability '${cc:-unknown}', not 9.x)"
elif ! command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then
    echo "wgmma probe: skipped (no nvcc on the PATH to build test/unit/wgmma_probe.cu)"
elif "${NVCC:-nvcc}" -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I. test/unit/wgmma_probe.cu \
    -o "$tmp/wgmma_probe" >"$tmp/wgmma_probe.build.log" 2>&1; then
    "$tmp/wgmma_probe" || echo "wgmma probe: exited $?"
else
    echo "wgmma probe: the build failed:"; tail -n 5 "$tmp/wgmma_probe.build.log" | sed 's/^/    /'
fi
exit $failed
