#!/usr/bin/env bash
# The CUDA backend without a GPU (cuda/README.md, Kernel files):
#   - the portability rules every .cu file keeps, so that one source builds under nvcc and under
#     the emulator: ct_cuda.h included first, no raw <<<>>> launch, shared memory only through
#     CT_SHARED / CT_DYN_SHARED, cuBLAS called only from cuda/gemm.c;
#   - the real build (nvcc, sm_80 and sm_90a): ptxas reported every kernel for both architectures
#     with no spills and no local memory, and no wgmma kernel serialized or fenced by ptxas; the backend is a plugin the executable loads on demand
#     (cuBLAS stays out of CPU runs); without a GPU --backend cuda is refused with exit 2 and the
#     runtime's reason, and --backend auto falls back to the CPU and says so;
#   - a whole training run of configs/test-tiny.yaml on the emulated CUDA backend
#     (build/cooktrain-cuemu: the same .cu files compiled by g++, each CUDA thread a fiber) gives
#     the CPU backend's losses and parameters within test/tools/compare_runs.py's fp32 tolerance, and in
#     bf16 stays within the distance between the CPU's bf16 and fp32 runs;
#   - train.cuda_graph on the emulated device: the step from a CUDA graph trains bit for bit as
#     the ops issued one by one (GPT-2 fp32 with evaluations, the Llama bf16 with recompute and
#     ZeRO-3), captures again after a planted device free and after a resume, and is refused in
#     check mode;
#   - --device-idle on the emulated device's clock (eager streams): a host planted 0.3 s late
#     shows as 0.3 s of stream idle before the op it delayed (test/tools/check_idle.py);
#   - check mode (CT_CHECK_BACKEND=1) on the emulated device: every op of a step in fp32 and bf16
#     within core/backend/backend_check.c's tolerances, as scripts/gpu_check.sh asks of a real GPU
#     (also a model with a Mixture-of-Experts layer);
#   - cuda/README.md's roofline table is the output of scripts/cuda_roofline.py, and
#     cuda/resources.md that of scripts/cuda_resources.py for this build's ptxas reports (that the
#     README names every file of cuda/ and holds at most 250 lines is cli_docs's check).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- portability rules ---------------------------------------------------------------------------
if selected "portability"; then
    bad=()
    for f in cuda/*.cu; do
        [ -f "$f" ] || continue
        first=$(grep -m1 '^#include' "$f")
        [ "$first" = '#include "cuda/ct_cuda.h"' ] || bad+=("$f: first include is '$first'")
        grep -n '<<<' "$f" | sed "s|^|$f: raw launch: |" >>"$tmp/bad"
        grep -nE '(^|[^_A-Z])__shared__' "$f" | sed "s|^|$f: __shared__ outside CT_SHARED: |" >>"$tmp/bad"
        grep -nE '\bcublas[A-Z]' "$f" | sed "s|^|$f: cuBLAS outside cuda/gemm.c: |" >>"$tmp/bad"
    done
    grep -lE '\bcublas(Lt)?[A-Z][a-zA-Z]*\(' cuda/*.c | grep -v '^cuda/gemm.c$' | sed 's|$|: calls cuBLAS outside cuda/gemm.c|' >>"$tmp/bad"
    [ -s "$tmp/bad" ] && mapfile -t more <"$tmp/bad" && bad+=("${more[@]}")
    if [ ${#bad[@]} = 0 ]; then
        ok "portability: every .cu includes cuda/ct_cuda.h first, launches through ct_launch, declares shared memory through the macros; cuBLAS only in cuda/gemm.c"
    else
        fail "portability: ${bad[*]}"
    fi
fi

# ---- the real build ------------------------------------------------------------------------------
if [ -f "$BUILD/libcooktrain-cuda.so" ] && selected "real"; then
    n_kernels=0
    spills=0
    missing=()
    for f in cuda/*.cu; do
        rep=$BUILD/cuda/$(basename "$f" .cu).o.ptxas
        if [ ! -s "$rep" ]; then
            missing+=("$rep")
            continue
        fi
        for arch in sm_80 sm_90a; do
            grep -q "for '$arch'" "$rep" || missing+=("$rep: no $arch")
        done
        n_kernels=$((n_kernels + $(grep -c "^ptxas info *: Compiling entry function" "$rep")))
        spills=$((spills + $(grep -E "[1-9][0-9]* bytes spill (stores|loads)" -c "$rep")))
    done
    if [ ${#missing[@]} = 0 ] && [ "$n_kernels" -gt 0 ] && [ "$spills" = 0 ]; then
        ok "real build: ptxas compiled $n_kernels kernel entries for sm_80 and sm_90a, none spills"
    else
        fail "real build: ptxas reports ${missing[*]:-complete}, $n_kernels kernels, $spills with spills"
    fi
    # wgmma (sm_90a): ptxas serializes a kernel's wgmmas when it cannot prove a pipelined kernel
    # safe (its "Potential Performance Loss" notes, C7510-C7515), and injects a wgmma.fence where
    # registers are written after one (C7519): both mean the source is not what runs on the GPU,
    # which nothing else here would show (guards attention_tc.cu's wgmma kernels)
    notes=$(cat "$BUILD"/cuda/*.o.ptxas | grep -E "Potential Performance Loss|is injected .* to allow use of registers in GMMA" | sort -u || true)
    if [ -z "$notes" ]; then
        ok "real build: ptxas neither serializes a wgmma kernel nor injects a fence into one"
    else
        fail "real build: ptxas on the wgmma kernels: $notes"
    fi
    # cuBLAS(Lt) costs every process that loads it ~0.1 s and ~220 MB (cuda/plugin.c): only the
    # plugin links it, and a CPU run never opens the plugin
    if ldd "$BIN" | grep -q cublas; then
        fail "real build: $BIN links cuBLAS itself (it belongs in the plugin)"
    else
        ok "real build: $BIN does not link cuBLAS; libcooktrain-cuda.so does"
    fi
    ensure_test_data
    expect_exit 2 "no GPU: --backend cuda is refused" -- "$BIN" train --config configs/test-tiny.yaml \
        --set data.train="$TEST_DATA/train.bin" --backend cuda
    expect_text "no usable CUDA device (cudaError" "no GPU: the message names the runtime's answer"
    expect_text "hint: use --backend cpu" "no GPU: the hint says to use the CPU backend"
    expect_exit 0 "no GPU: --backend auto trains on the CPU" -- "$BIN" train --config configs/test-tiny.yaml \
        --set data.train="$TEST_DATA/train.bin" --set train.steps=2 --backend auto
    expect_text "backend: cpu (auto: no usable CUDA device" "no GPU: auto says it fell back to the CPU, and why"
elif selected "real"; then
    skip "real build checks: $BUILD/libcooktrain-cuda.so not built (needs nvcc)"
fi

# ---- training on the emulated device -------------------------------------------------------------
EMU=$BUILD/cooktrain-cuemu
if [ -x "$EMU" ] && selected "emulated training"; then
    equivalence_setup
    d=$tmp/emu
    mkdir -p "$d"
    short=(--set train.steps=3 --set train.global_batch=4) # 4 sequences a step: emulation is slow
    # the CPU reference in each precision (the fp32 one is also the bf16 run's twin)
    expect_exit 0 "emulated: CPU reference run (fp32)" -- "$BIN" "${base[@]}" "${short[@]}" \
        --set log.metrics="$d/ref.jsonl" --dump-params "$d/ref.bin" --dump-init-params "$d/init.bin"
    expect_exit 0 "emulated: a 3-step run of test-tiny on the emulated CUDA backend (fp32)" -- \
        "$EMU" "${base[@]}" "${short[@]}" --backend cuda --set log.metrics="$d/run.jsonl" --dump-params "$d/run.bin" \
        --set log.trace="$d/trace.json"
    expect_text "cuda:0 cuemu" "emulated: the run says it is on the emulated device"
    # its trace's unit spans are the compute stream's marks, turned into host time (core/README.md,
    # Device time): each inside its step, in stream order
    if out=$(python3 test/tools/check_trace.py --timeline "$d/trace.json" 3); then
        ok "emulated: the trace's device times fall inside their steps ($out)"
    else
        fail "emulated: the trace's device times: $out"
    fi
    check_against_reference "emulated CUDA fp32" "$d"
    b=$tmp/emu-bf16
    mkdir -p "$b"
    cp "$d/ref.jsonl" "$b/twin.jsonl"
    for f in bin bin.index.json; do cp "$d/ref.$f" "$b/twin.$f" && cp "$d/init.$f" "$b/init.$f"; done
    expect_exit 0 "emulated: CPU reference run (bf16)" -- "$BIN" "${base[@]}" "${short[@]}" \
        --set train.precision=bf16 --set log.metrics="$b/ref.jsonl" --dump-params "$b/ref.bin"
    expect_exit 0 "emulated: the same on the emulated CUDA backend (bf16)" -- \
        "$EMU" "${base[@]}" "${short[@]}" --backend cuda --set train.precision=bf16 \
        --set log.metrics="$b/run.jsonl" --dump-params "$b/run.bin"
    check_against_reference "emulated CUDA bf16" "$b"
elif selected "emulated training"; then
    skip "training on the emulated device: $EMU not built (needs the CUDA headers)"
fi

# ---- train.cuda_graph on the emulated device ----------------------------------------------------
# The step's forward and backward captured at step 2 and launched from step 3 (core/README.md, CUDA
# graphs) train bit for bit as the same ops issued one by one: the final parameters identical, and
# every step's loss, gradient norm and validation loss. GPT-2 in fp32 with two microbatches a step
# and an evaluation after every step (the graph's buffers in between), the Llama in bf16 with
# recompute and ZeRO-3; a run stopped after step 2 resumes eagerly and captures again.
graph_same() { # NAME A B: A/B.{bin,jsonl} from the eager and the graph run
    local out
    if cmp -s "$2.bin" "$3.bin" && out=$(python3 - "$2.jsonl" "$3.jsonl" <<'PY'
import json, sys
def rows(path):
    keys = ("step", "loss", "grad_norm", "val_loss")
    return [{k: r[k] for k in keys if k in r} for r in map(json.loads, open(path)) if "loss" in r or "val_loss" in r]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
if not a or a != b:
    sys.exit(f"metrics differ: {a} against {b}")
print(f"{len(a)} metrics rows equal")
PY
    ); then
        ok "$1: the graph run's parameters are bit-identical to the eager run's; $out"
    else
        fail "$1: graph and eager runs differ ${out:-(parameters)}"
    fi
}
if [ -x "$EMU" ] && selected "cuda graph"; then
    equivalence_setup
    g=$tmp/graph
    mkdir -p "$g"
    few=(--backend cuda --set train.steps=3 --set train.global_batch=4 --set model.n_layer=4)
    gpt=(--set data.val="$TEST_DATA/val.bin" --set train.eval_interval=1 --set train.eval_steps=1)
    llama=(--set model.arch=llama --set model.n_kv_head=4 --set train.precision=bf16
        --set train.recompute=full --set parallel.zero_stage=3)
    for v in gpt llama; do
        declare -n extra=$v
        for mode in eager graph; do
            on=false
            [ $mode = graph ] && on=true
            expect_exit 0 "cuda graph ($v): $mode run" -- "$EMU" "${base[@]}" "${few[@]}" "${extra[@]}" \
                --set train.cuda_graph=$on --set log.metrics="$g/$v-$mode.jsonl" --dump-params "$g/$v-$mode.bin"
        done
        expect_text "cuda graph: step 2's forward and backward captured, " "cuda graph ($v): captured at step 2"
        graph_same "cuda graph ($v)" "$g/$v-eager" "$g/$v-graph"
        unset -n extra
    done
    # a device free before step 3's launch (an address in the graph may dangle): the backend
    # refuses the launch, the trainer captures again, and the bits stay those of the eager run
    expect_exit 0 "cuda graph (gpt): a free before step 3" -- env COOKTRAIN_FAULT_GRAPH_FREE=3 "$EMU" \
        "${base[@]}" "${few[@]}" "${gpt[@]}" --set train.cuda_graph=true --set log.metrics="$g/freed.jsonl" \
        --dump-params "$g/freed.bin"
    expect_text "cuda graph: step 3's forward and backward recaptured" "cuda graph: recaptured after the free"
    graph_same "cuda graph (gpt, recaptured)" "$g/gpt-eager" "$g/freed"
    expect_exit 0 "cuda graph: a run stopped after step 2" -- "$EMU" "${base[@]}" "${few[@]}" \
        --set train.steps=4 --set train.cuda_graph=true --set checkpoint.dir="$g/ck" --set train.stop_after=2
    expect_exit 0 "cuda graph: resumed" -- "$EMU" "${base[@]}" "${few[@]}" \
        --set train.steps=4 --set train.cuda_graph=true --set checkpoint.dir="$g/ck"
    expect_text "cuda graph: step 4's forward and backward captured" "cuda graph: the resumed run's first step runs eagerly, its second is captured"
    # check mode checks each op on the host as it is issued: a graph cannot hold that
    CT_CHECK_BACKEND=1 expect_exit 2 "cuda graph: refused in check mode" -- "$EMU" "${base[@]}" "${few[@]}" \
        --set train.cuda_graph=true
    expect_text "backend cannot capture a graph" "cuda graph: check mode's refusal names the reason"
elif selected "cuda graph"; then
    skip "train.cuda_graph on the emulated device: $EMU not built (needs the CUDA headers)"
fi

# ---- device idle on the emulated device ----------------------------------------------------------
# --device-idle reads the stream's clock (timing events; core/README.md, Device idle): with eager
# streams (CUEMU_EAGER=1, the emulated GPU runs work as it arrives) a host that sleeps 0.3 s before
# step 1's first AdamW leaves the stream idle that long, charged to AdamW (test/tools/check_idle.py);
# the by-op lines name the CUDA backend's fused GEMMs by shape (one microbatch of 2 x 32 tokens).
if [ -x "$EMU" ] && selected "device idle"; then
    ensure_test_data
    expect_exit 0 "device idle: 3 steps on the emulated GPU, the host planted late" -- \
        env CUEMU_EAGER=1 COOKTRAIN_FAULT_HOST_DELAY=adamw:1:0.3 OMP_NUM_THREADS=1 "$EMU" train \
        --config configs/test-tiny.yaml --backend cuda --set data.train="$TEST_DATA/train.bin" \
        --set train.steps=3 --set train.global_batch=2 --set log.interval=1 \
        --set log.metrics="$tmp/idle.jsonl" --device-idle
    printf '%s\n' "$OUT_TEXT" >"$tmp/idle.log"
    if out=$(python3 test/tools/check_idle.py "$tmp/idle.jsonl" "$tmp/idle.log" adamw 0.3 --gemm-shapes 15 \
        --gemm "gemm_bias_gelu 64x256x64 NT f32>f32=16" --gemm "gemm_bias 64x192x64 NT f32>f32=16" \
        --gemm "gemm 64x128x64 NT f32>f32=1"); then
        ok "device idle: the emulated stream waited for the late host before adamw ($out)"
    else
        fail "device idle on the emulated GPU: $out"
    fi
elif selected "device idle"; then
    skip "device idle on the emulated device: $EMU not built (needs the CUDA headers)"
fi

# ---- check mode on the emulated device -----------------------------------------------------------
# scripts/gpu_check.sh's first part, here: every op of a training step rerun on the CPU backend and
# compared within core/backend/backend_check.c's tolerances, bf16 included (the tensor-core
# attention's bf16 weights are in the attention tolerances). One step of 2 sequences: emulation is
# slow.
if [ -x "$EMU" ] && selected "check mode"; then
    ensure_test_data
    for prec in fp32 bf16; do
        expect_exit 0 "check mode: every op of a $prec step on the emulated CUDA backend agrees with the CPU" -- \
            env CT_CHECK_BACKEND=1 OMP_NUM_THREADS=1 "$EMU" train --config configs/test-tiny.yaml \
            --backend cuda --set data.train="$TEST_DATA/train.bin" --set train.steps=1 --set train.warmup_steps=0 \
            --set train.global_batch=2 --set train.precision=$prec
    done
    # the tensor-core attention at the 124M model's head width 64, with a partial 64-row tile
    expect_exit 0 "check mode: a bf16 step at head width 64 and T 70 agrees with the CPU" -- \
        env CT_CHECK_BACKEND=1 OMP_NUM_THREADS=1 "$EMU" train --config configs/test-tiny.yaml \
        --backend cuda --set data.train="$TEST_DATA/train.bin" --set train.steps=1 --set train.warmup_steps=0 \
        --set train.global_batch=2 --set train.precision=bf16 --set model.n_layer=1 --set model.d_model=128 \
        --set model.n_head=2 --set model.seq_len=70
    # the same on Hopper's wgmma kernels (CT_CUDA_ATTENTION=wgmma; the emulated device is an sm_90)
    expect_exit 0 "check mode: a bf16 step at head width 64 and T 70 on the wgmma attention agrees with the CPU" -- \
        env CT_CUDA_ATTENTION=wgmma CT_CHECK_BACKEND=1 OMP_NUM_THREADS=1 "$EMU" train --config configs/test-tiny.yaml \
        --backend cuda --set data.train="$TEST_DATA/train.bin" --set train.steps=1 --set train.warmup_steps=0 \
        --set train.global_batch=2 --set train.precision=bf16 --set model.n_layer=1 --set model.d_model=128 \
        --set model.n_head=2 --set model.seq_len=70
    expect_text "sm_90, wgmma attention" "check mode on wgmma: the backend's line says the attention kernels"
    # a Mixture-of-Experts layer: the dispatch's row gathers and gate dots (ct_gather_rows,
    # ct_gather_dot) and the experts' GEMMs, op for op
    for prec in fp32 bf16; do
        expect_exit 0 "check mode: a $prec step with an MoE layer on the emulated CUDA backend agrees with the CPU" -- \
            env CT_CHECK_BACKEND=1 OMP_NUM_THREADS=1 "$EMU" train --config configs/test-tiny.yaml \
            --backend cuda --set data.train="$TEST_DATA/train.bin" --set train.steps=1 --set train.warmup_steps=0 \
            --set train.global_batch=2 --set train.precision=$prec --set model.moe_experts=4 \
            --set model.moe_every=2 --set model.moe_d_ff=64 --set model.moe_top_k=2
    done
elif selected "check mode"; then
    skip "check mode on the emulated device: $EMU not built (needs the CUDA headers)"
fi

# ---- cuda/README.md and its generated tables ---------------------------------------------------
# readme_holds WHAT FILE: every line of FILE (a script's output) is a line of cuda/README.md.
readme_holds() {
    if [ -s "$2" ] && [ -z "$(grep -vxF -f <(cat cuda/README.md) "$2")" ]; then
        ok "$1: cuda/README.md holds the script's output"
    else
        fail "$1: cuda/README.md differs from the script's output (regenerate it); first lines missing:"
        grep -vxF -f <(cat cuda/README.md) "$2" | head -3 | sed 's/^/    /'
    fi
}
if selected "roofline"; then
    python3 scripts/cuda_roofline.py >"$tmp/roofline.md"
    readme_holds "roofline (scripts/cuda_roofline.py)" "$tmp/roofline.md"
fi
if [ -f "$BUILD/libcooktrain-cuda.so" ] && selected "resources"; then
    python3 scripts/cuda_resources.py "$BUILD" >"$tmp/resources.md"
    if [ -s "$tmp/resources.md" ] && cmp -s "$tmp/resources.md" cuda/resources.md; then
        ok "resource usage: cuda/resources.md is scripts/cuda_resources.py's output for $BUILD"
    else
        fail "resource usage: cuda/resources.md differs from scripts/cuda_resources.py $BUILD (regenerate it):"
        diff cuda/resources.md "$tmp/resources.md" | head -4 | sed 's/^/    /'
    fi
elif selected "resources"; then
    skip "cuda/resources.md: $BUILD/libcooktrain-cuda.so not built (needs nvcc)"
fi
