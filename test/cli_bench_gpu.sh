#!/usr/bin/env bash
# scripts/bench_gpu.sh where it cannot measure: without a GPU (nvidia-smi missing or failing, or
# cooktrain finding no usable CUDA device) or without the nvcc build it prints
# "bench_gpu: skipped: REASON" and exits 0, so that a run on any machine is safe; a bad option
# exits 2 with a hint. The GPU is faked away through NVIDIA_SMI (the nvidia-smi the script asks)
# and BUILD; the checks that need the machine itself to lack a GPU are left out on one that has
# it (they would start the benchmark), and say so.
. "$(dirname "$0")/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
script=scripts/bench_gpu.sh

printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver"\nexit 9\n' >"$tmp/smi-fails"
printf '#!/bin/sh\necho "NVIDIA H100 80GB HBM3"\n' >"$tmp/smi-h100"
chmod +x "$tmp/smi-fails" "$tmp/smi-h100"

expect_exit 2 "bench_gpu: an unknown option is refused" -- bash "$script" --no-such-option
expect_text "hint:" "bench_gpu: the refusal has a hint"
expect_exit 2 "bench_gpu: --steps below the warmup is refused" -- bash "$script" --steps 2
expect_exit 2 "bench_gpu: a precision other than bf16 and fp32 is refused" -- bash "$script" --precisions fp16
expect_exit 2 "bench_gpu: a model other than gpt2 and llama is refused" -- bash "$script" --models "gpt2 mistral"
expect_text "bench_gpu: --models: 'mistral' is not gpt2 or llama" "bench_gpu: the refusal names the model"

expect_exit 0 "bench_gpu: no nvidia-smi: skips" -- env NVIDIA_SMI="$tmp/no-such-nvidia-smi" BUILD="$BUILD" bash "$script"
expect_text "bench_gpu: skipped: no GPU ($tmp/no-such-nvidia-smi not found)" "bench_gpu: no nvidia-smi: the skip says why"
expect_exit 0 "bench_gpu: nvidia-smi fails: skips" -- env NVIDIA_SMI="$tmp/smi-fails" BUILD="$BUILD" bash "$script"
expect_text "bench_gpu: skipped: no GPU ($tmp/smi-fails failed: NVIDIA-SMI has failed" "bench_gpu: nvidia-smi fails: the skip quotes it"
expect_exit 0 "bench_gpu: no CUDA build: skips" -- env NVIDIA_SMI="$tmp/smi-h100" BUILD="$tmp/no-build" bash "$script"
expect_text "bench_gpu: skipped: $tmp/no-build/libcooktrain-cuda.so is missing" "bench_gpu: no CUDA build: the skip names the plugin"

if nvidia-smi -L >/dev/null 2>&1; then
    skip "bench_gpu: the skips of a machine without a GPU (this machine has one)"
else
    if [ -f "$BUILD/libcooktrain-cuda.so" ]; then
        # nvidia-smi answers (faked), but the trainer's CUDA runtime finds no device
        expect_exit 0 "bench_gpu: no usable CUDA device: skips" -- env NVIDIA_SMI="$tmp/smi-h100" BUILD="$BUILD" bash "$script"
        expect_text "bench_gpu: skipped: cooktrain finds no usable CUDA device (cudaError" "bench_gpu: no usable CUDA device: the skip gives the runtime's answer"
    else
        skip "bench_gpu: no usable CUDA device: $BUILD/libcooktrain-cuda.so not built (needs nvcc)"
    fi
    expect_exit 0 "bench_gpu: as run on this machine without a GPU: skips" -- env BUILD="$BUILD" bash "$script"
    expect_text "bench_gpu: skipped: " "bench_gpu: as run here: the skip says why"
    if [ "$(printf '%s\n' "$OUT_TEXT" | wc -l)" = 1 ]; then
        ok "bench_gpu: the skip is one line"
    else
        fail "bench_gpu: the skip printed more than one line"
        printf '%s\n' "$OUT_TEXT" | head -5 | sed 's/^/    /'
    fi
fi
