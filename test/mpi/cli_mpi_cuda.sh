#!/usr/bin/env bash
# Multi-rank runs of the CUDA backend under emulation (cuda/README.md, Tests without a GPU), with
# the NCCL comm (cuda/comm_nccl.c) over the NCCL stand-in (cuda/emu/nccl_emu.cc), one emulated
# device per rank (CUEMU_DEVICES):
#   - the comm tests of the MPI comm, through NCCL on device buffers (mpi_test_comm_nccl at 1, 2
#     and 4 ranks: every op, dtype, in-place form and completion, a part-of-the-world group,
#     the byte counters);
#   - the watchdog: a rank that skips a collective, and one that calls another collective than
#     the others, end the job with the report (exit 1), not a hang;
#   - device selection: more ranks on the node than devices is refused (exit 2, hint) unless
#     --share-gpus;
#   - training: dp2 with ZeRO-1 and ZeRO-3, tp2 with sequence parallelism, pp2 1F1B, pp2
#     interleaved (x dp2), tp2 x pp2, and tp2 x pp2 x dp2 (interleaved, ZeRO-3, sequence
#     parallel) at 8 ranks give the CPU backend's world-size-1 results within the
#     fp32 tolerance of test/tools/compare_runs.py (the emulated kernels sum in other orders than the
#     CPU ops, as another layout does), and a bf16 run stays within the bf16 allowance; a Llama,
#     tied and untied, at tp2 with sequence parallelism and pp2 with ZeRO-1 the same;
#   - context parallelism: ring attention's op test (mpi_test_cp_nccl: the CUDA backend's part ops,
#     NCCL sends) at 2 and 4 ranks, and cp2, cp2 x tp2 with sequence parallelism and ZeRO-1, and a
#     Llama at cp4 with contiguous chunks, against the CPU at world size 1;
#   - Mixture of Experts: ep2 with ZeRO-1 and ep2 x tp2 with sequence parallelism against the CPU
#     at world size 1;
#   - overlap: the trace of an emulated dp2 run shows reductions completing while backward runs;
#   - device waits: a rank made late shows on its partner's compute stream as exposed comm (dp)
#     or bubble (pp), measured from CUDA events, in the metrics and the merged trace.
# make test runs one layout of each kind (the rest print "long NAME"); make test-long all of them.
# MPI tests run one at a time, one thread per rank, passive waiting (test/README.md, MPI tests).
# long: the ring's op test at 4 ranks; GPT-2 at dp2 ZeRO-1, pp2 1F1B, pp2 interleaved x dp2 and
# long: tp2 x pp2 ZeRO-2; the tied Llama; MoE at ep2 ZeRO-1; GPT-2 at cp2 alone; the Llama at cp4
# cores: 2 (several ranks at once: run_tests.sh runs it alone)
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup

EMU=$BUILD/cooktrain-cuemu
COMM=$BUILD/test/mpi_test_comm_nccl
if [ ! -x "$EMU" ] || [ ! -x "$COMM" ]; then
    skip "emulated multi-rank CUDA tests: $EMU or $COMM not built (needs the CUDA headers)"
    exit 0
fi

# ---- the stand-in covers the real build ----------------------------------------------------------
# Every NCCL entry point the real plugin imports is one the stand-in defines, so the emulated
# build runs the same calls the GPU build makes.
PLUGIN=$BUILD/libcooktrain-cuda.so
if selected "stand-in" && [ -f "$PLUGIN" ]; then
    want=$(nm -D --undefined-only "$PLUGIN" | awk '$2 ~ /^nccl/ {print $2}' | sort -u)
    have=$(nm --defined-only "$BUILD/libctncclemu.a" | awk '$2 == "T" && $3 ~ /^nccl/ {print $3}' | sort -u)
    missing=$(comm -23 <(printf '%s\n' "$want") <(printf '%s\n' "$have") | tr '\n' ' ')
    n_want=$(printf '%s\n' "$want" | grep -c .)
    if [ "$n_want" -ge 10 ] && [ -z "$missing" ]; then
        ok "the NCCL stand-in defines all $n_want NCCL functions the real plugin calls"
    else
        fail "NCCL functions the real plugin calls but the stand-in lacks: ${missing:-none} ($n_want imported)"
    fi
fi

# ---- the comm tests through NCCL ---------------------------------------------------------------
for np in 1 2 4; do
    selected "comm np=$np" || continue
    out=$(CUEMU_DEVICES=$np "${MPIRUN[@]}" -x CUEMU_DEVICES -np "$np" "$COMM" 2>&1 </dev/null)
    rc=$?
    n_ok=$(printf '%s\n' "$out" | grep -c '^ok ')
    printf '%s\n' "$out" | grep -E '^FAIL |^    rank ' | head -20
    if [ $rc = 0 ] && [ "$n_ok" -gt 300 ]; then
        ok "NCCL comm at $np ranks: $n_ok checks of mpi_test_comm pass through NCCL"
    else
        fail "NCCL comm at $np ranks: exit $rc, $n_ok checks passed"
        printf '%s\n' "$out" | grep -v '^ok ' | tail -8 | sed 's/^/    /'
    fi
done

# nccl_abort_run MODE WANT...: the job must end within a few times the 2 s limit, non-zero.
nccl_abort_run() {
    local mode=$1 t0 rc
    shift
    t0=$(date +%s)
    OUT_TEXT=$(CUEMU_DEVICES=2 timeout 60 mpirun --oversubscribe --bind-to none -x CUEMU_DEVICES \
        -np 2 "$COMM" "$mode" 2>&1 </dev/null)
    rc=$?
    local elapsed=$(($(date +%s) - t0))
    if [ $rc != 0 ] && [ $rc != 124 ] && [ $elapsed -lt 30 ]; then
        ok "NCCL $mode: the job ends (exit $rc after ${elapsed} s, limit 2 s)"
    else
        fail "NCCL $mode: exit $rc after ${elapsed} s (want an abort well before 30 s)"
        printf '%s\n' "$OUT_TEXT" | tail -8 | sed 's/^/    /'
    fi
    for want in "$@"; do expect_text "$want" "NCCL $mode: report names '$want'"; done
}
if selected "watchdog"; then
    nccl_abort_run watchdog "collective timed out on rank 0 after" "group dp (rank 0 of 2)" \
        "op allreduce (f32 sum)" "4096 bytes" "sequence #2 (NCCL)" "hint:" "parallel.timeout_s"
    # (either rank may see NCCL's error first and abort the job before the other prints)
    nccl_abort_run mismatch "rank 1 called ncclAllGather(count 512, float32) #1" \
        "NCCL reported an asynchronous error on rank " ": invalid usage (ncclInvalidUsage)"
fi

# ---- ring attention through NCCL ----------------------------------------------------------------
# test/mpi/mpi_test_cp.c again (its CT_TEST_NCCL build): the ring on the CUDA backend's part ops over
# an NCCL cp group of emulated devices, against the CPU backend's attention on the whole sequence
CPTEST=$BUILD/test/mpi_test_cp_nccl
for np in 2 4; do
    selected "ring np=$np" || continue
    [ $np = 2 ] || long_part "ring np=$np" || continue
    out=$(CUEMU_DEVICES=$np "${MPIRUN[@]}" -x CUEMU_DEVICES -np "$np" "$CPTEST" 2>&1 </dev/null)
    rc=$?
    printf '%s\n' "$out" | grep -E '^(ok|FAIL) '
    if [ $rc != 0 ] && ! printf '%s\n' "$out" | grep -q '^FAIL '; then
        fail "mpi_test_cp_nccl at $np ranks exited $rc"
        printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
    fi
done

# ---- devices -------------------------------------------------------------------------------------
ensure_test_data
# 4 layers (enough for pp 2 x 2 virtual stages) and 8 sequences a step: the emulated device runs
# every CUDA thread as a fiber, and the layouts, not the model's size, are what is checked here.
base=(train --config configs/test-tiny.yaml --set train.threads=1
      --set data.train="$TEST_DATA/train.bin" --set train.eps=1e-6
      --set train.steps=2 --set train.warmup_steps=1 --set model.n_layer=4 --set train.global_batch=8)
if selected "devices"; then
    expect_exit 2 "2 ranks on 1 emulated device are refused" -- env CUEMU_DEVICES=1 \
        "${MPIRUN[@]}" -x CUEMU_DEVICES -np 2 "$EMU" "${base[@]}" --backend cuda
    expect_text "2 ranks on this node but 1 CUDA device" "the refusal counts ranks and devices"
    expect_text "hint: run one rank per GPU" "the refusal has a hint"
    expect_exit 0 "--share-gpus lets them share it" -- env CUEMU_DEVICES=1 \
        "${MPIRUN[@]}" -x CUEMU_DEVICES -np 2 "$EMU" "${base[@]}" --backend cuda --share-gpus \
        --set train.steps=1
    expect_text "rank 1: cuda device 0 (node-local rank 1 of 2, 1 device, shared)" \
        "each rank says which device it took"
fi

# ---- training against the CPU backend at world size 1 --------------------------------------------
if expect_exit 0 "CPU reference run (world size 1, fp32)" -- "$BIN" "${base[@]}" \
    --set log.metrics="$tmp/ref.jsonl" --dump-params "$tmp/ref.bin" --dump-init-params "$tmp/init.bin"; then
    while read -r when np extra; do
        name="emulated cuda np=$np $extra"
        selected "$name" || continue
        [ "$when" = test ] || long_part "$name" || continue
        # shellcheck disable=SC2086
        if expect_exit 0 "train $name" -- env CUEMU_DEVICES="$np" "${MPIRUN[@]}" -x CUEMU_DEVICES \
            -np "$np" "$EMU" "${base[@]}" --backend cuda $extra \
            --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin"; then
            [ "$np" = 4 ] && expect_text "rank 3: cuda device 3 (node-local rank 3 of 4, 4 devices)" \
                "$name: each rank takes the device of its node-local rank"
            check_against_reference "$name" "$tmp"
        fi
    done <<'RUNS'
long 2 --set parallel.zero_stage=1
test 2 --set parallel.zero_stage=3
test 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
long 2 --set parallel.pp=2 --set parallel.schedule=1f1b
long 4 --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved --set parallel.zero_stage=1
long 4 --set parallel.tp=2 --set parallel.pp=2 --set parallel.schedule=1f1b --set parallel.zero_stage=2
test 8 --set parallel.tp=2 --set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 --set parallel.zero_stage=3 --set parallel.sequence_parallel=true
test 2 --set parallel.pp=2 --set parallel.schedule=zbv --set parallel.virtual_stages=2
RUNS
fi

# bf16: against the CPU's bf16 run, within the distance of that run from its fp32 twin
bdir=$tmp/bf16
mkdir -p "$bdir"
if selected "emulated cuda bf16" &&
    expect_exit 0 "CPU bf16 reference run (world size 1)" -- "$BIN" "${base[@]}" \
        --set train.precision=bf16 --set log.metrics="$bdir/ref.jsonl" --dump-params "$bdir/ref.bin" \
        --dump-init-params "$bdir/init.bin" &&
    cp "$tmp/ref.jsonl" "$bdir/twin.jsonl" && cp "$tmp/ref.bin" "$bdir/twin.bin" &&
    cp "$tmp/ref.bin.index.json" "$bdir/twin.bin.index.json" &&
    expect_exit 0 "train emulated cuda bf16 np=2 zero 1" -- env CUEMU_DEVICES=2 "${MPIRUN[@]}" \
        -x CUEMU_DEVICES -np 2 "$EMU" "${base[@]}" --backend cuda --set train.precision=bf16 \
        --set parallel.zero_stage=1 --set log.metrics="$bdir/run.jsonl" --dump-params "$bdir/run.bin"; then
    check_against_reference "emulated cuda bf16 np=2 zero 1" "$bdir"
fi

# Llama (grouped-query attention, SwiGLU, RoPE; one run with its own LM head) on the emulated GPUs
# through the NCCL stand-in, against the CPU at world size 1
ldir=$tmp/llama
mkdir -p "$ldir"
llama=(--set model.arch=llama --set model.n_layer=4 --set model.n_kv_head=4 --set model.multiple_of=32)
for tie in true false; do
    selected "emulated cuda llama tie=$tie" || continue
    [ $tie = false ] || long_part "emulated cuda llama tie=$tie" || continue
    expect_exit 0 "CPU llama reference run (tie_embeddings=$tie)" -- "$BIN" "${base[@]}" "${llama[@]}" \
        --set model.tie_embeddings=$tie --set log.metrics="$ldir/ref.jsonl" --dump-params "$ldir/ref.bin" \
        --dump-init-params "$ldir/init.bin" || continue
    while read -r np extra; do
        name="emulated cuda llama tie=$tie np=$np $extra"
        # shellcheck disable=SC2086
        if expect_exit 0 "train $name" -- env CUEMU_DEVICES="$np" "${MPIRUN[@]}" -x CUEMU_DEVICES \
            -np "$np" "$EMU" "${base[@]}" "${llama[@]}" --set model.tie_embeddings=$tie --backend cuda $extra \
            --set log.metrics="$ldir/run.jsonl" --dump-params "$ldir/run.bin"; then
            check_against_reference "$name" "$ldir"
        fi
    done <<'RUNS'
2 --set parallel.tp=2 --set parallel.sequence_parallel=true
2 --set parallel.pp=2 --set parallel.zero_stage=1
RUNS
done

# Mixture of Experts (4 layers, every other one MoE, 8 experts, 2 a token) on the emulated GPUs:
# routing on the host; the rows gathered on the device and exchanged as device buffers by the NCCL
# stand-in's grouped sends and receives; the experts' GEMMs on the device; the expert units reduced
# through NCCL over the expert-data-parallel group; against the CPU at world size 1
mdir=$tmp/moe
mkdir -p "$mdir"
moe=(--set model.n_layer=4 --set model.moe_experts=8 --set model.moe_every=2 --set model.moe_d_ff=96
     --set model.moe_aux_alpha=0.05)
if selected "emulated cuda moe" &&
    expect_exit 0 "CPU MoE reference run (world size 1)" -- "$BIN" "${base[@]}" "${moe[@]}"         --set log.metrics="$mdir/ref.jsonl" --dump-params "$mdir/ref.bin" --dump-init-params "$mdir/init.bin"; then
    while read -r when np extra; do
        name="emulated cuda moe np=$np $extra"
        [ "$when" = test ] || long_part "$name" || continue
        # shellcheck disable=SC2086
        if expect_exit 0 "train $name" -- env CUEMU_DEVICES="$np" "${MPIRUN[@]}" -x CUEMU_DEVICES \
            -np "$np" "$EMU" "${base[@]}" "${moe[@]}" --backend cuda $extra \
            --set log.metrics="$mdir/run.jsonl" --dump-params "$mdir/run.bin"; then
            check_against_reference "$name" "$mdir"
        fi
    done <<'RUNS'
long 2 --set parallel.ep=2 --set parallel.zero_stage=1
test 4 --set parallel.ep=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
RUNS
fi

# Context parallelism (4 layers): the ring's part ops (cuda/attention_part.cu) on the emulated
# GPUs, its kv blocks and dK/dV partials through the NCCL stand-in's sends, against the CPU at
# world size 1 — GPT-2 (learned positions) and Llama (RoPE angles at global positions, GQA)
cdir=$tmp/cp
mkdir -p "$cdir"
for arch in gpt2 llama; do
    selected "emulated cuda cp $arch" || continue
    [ $arch = gpt2 ] || [ -n "${CT_LONG:-}" ] || continue # its one run is long_part's
    arch_args=(--set model.n_layer=4 --set log.sample_tokens=0)
    [ $arch = llama ] && arch_args+=("${llama[@]}" --set model.tie_embeddings=false)
    expect_exit 0 "CPU $arch reference run (4 layers)" -- "$BIN" "${base[@]}" "${arch_args[@]}" \
        --set log.metrics="$cdir/ref.jsonl" --dump-params "$cdir/ref.bin" \
        --dump-init-params "$cdir/init.bin" || continue
    while read -r when a np extra; do
        [ "$a" = $arch ] || continue
        name="emulated cuda $arch np=$np $extra"
        [ "$when" = test ] || long_part "$name" || continue
        # shellcheck disable=SC2086
        if expect_exit 0 "train $name" -- env CUEMU_DEVICES="$np" "${MPIRUN[@]}" -x CUEMU_DEVICES \
            -np "$np" "$EMU" "${base[@]}" "${arch_args[@]}" --backend cuda $extra \
            --set log.metrics="$cdir/run.jsonl" --dump-params "$cdir/run.bin"; then
            # the emulator's device memory is host memory, so MPI on it would pass: the line
            # says which groups are NCCL (on a GPU a group left on MPI reads device pointers)
            expect_text "collectives: NCCL on the groups tp cp dp pp mp embed dpcp" \
                "$name: the cp and dp x cp groups are NCCL groups"
            check_against_reference "$name" "$cdir"
        fi
    done <<'RUNS'
long gpt2 2 --set parallel.cp=2
test gpt2 4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set parallel.zero_stage=1
long llama 4 --set parallel.cp=4 --set parallel.cp_sharding=contiguous
RUNS
done

# ---- overlap -------------------------------------------------------------------------------------
# As in cli_mpi_dp.sh: some unit's reduction is seen complete (through ct_comm_test: the event
# after the NCCL operation has passed) before backward has ended — here with ZeRO-2, which
# reduces after every microbatch, asked of every microbatch: on emulated GPUs the ranks may keep
# in step for a whole microbatch, and then neither is behind (test/tools/check_overlap.py).
if selected "overlap" &&
    expect_exit 0 "emulated cuda dp2 with a trace" -- env CUEMU_DEVICES=2 "${MPIRUN[@]}" \
        -x CUEMU_DEVICES -np 2 "$EMU" "${base[@]}" --backend cuda --set train.steps=1 \
        --set parallel.zero_stage=2 --set log.trace="$tmp/trace.json"; then
    if out=$(python3 test/tools/check_overlap.py --every-microbatch "$tmp/trace.rank0.json" \
        "$tmp/trace.rank1.json"); then
        ok "NCCL reductions complete while backward runs (trace: $out)"
    else
        fail "NCCL reductions complete while backward runs (trace: $out)"
    fi
fi

# ---- device waits --------------------------------------------------------------------------------
# Under NCCL the host does not wait for communication, the compute stream does, so exposed
# communication and bubble are measured on the stream's clock (core/README.md, Device time).
# With eager emulated streams (CUEMU_EAGER=1: work runs as it arrives, as on a GPU) one rank is
# made 4 s late in step 2 — it sleeps before a dp collective, or before a pipeline send — and
# rank 0's step-2 exposed comm (or bubble) must grow by at least half of that over step 1's. Half:
# the late rank's delay reaches rank 0's stream whole, less the slack the ranks already had
# between them (under 0.3 s on a quiet machine, 1.7 s seen on one running 16 processes on its 2
# cores); a host-side measurement gives about 0.
# The merged trace holds the device's spans of that group and the long wait (check_trace.py).
device_wait() { # NAME METRIC FAULT GROUP WAIT -- extra --set arguments
    local name=$1 metric=$2 fault=$3 group=$4 wait=$5
    shift 6
    selected "device waits" || return 0
    local d="$tmp/wait-$group"
    mkdir -p "$d"
    expect_exit 0 "$name: emulated cuda run with rank 1 late" -- env CUEMU_DEVICES=2 CUEMU_EAGER=1 \
        COOKTRAIN_FAULT_COMM="$fault" "${MPIRUN[@]}" -x CUEMU_DEVICES -x CUEMU_EAGER \
        -x COOKTRAIN_FAULT_COMM -np 2 "$EMU" "${base[@]}" --backend cuda --set train.steps=2 \
        --set train.global_batch=8 --set log.trace="$d/trace.json" \
        --set log.metrics="$d/metrics.jsonl" "$@" || return 0
    if out=$(python3 - "$d/metrics.jsonl" "$metric" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
v = [r[sys.argv[2]] for r in rows]
print(" ".join("%.3f" % x for x in v))
sys.exit(0 if len(v) == 2 and v[1] - v[0] >= 2.0 else 1)
PY
    ); then
        ok "$name: rank 0's $metric grows by the late rank's 4 s on the device (steps: $out s)"
    else
        fail "$name: rank 0's $metric by step: $out s, expected step 2 at least 2 s above step 1"
    fi
    if out=$(python3 test/tools/check_trace.py --device-wait "$d/trace.json" 0 "$group" "$wait" 2.0); then
        ok "$name: the trace has the device's $group spans and the wait ($out)"
    else
        fail "$name: the trace's device side: $out"
    fi
}
device_wait "dp2 ZeRO-1" exposed_comm_s 1:dp:45:sleep:4 dp "exposed comm" -- \
    --set parallel.zero_stage=1 --set model.n_layer=16 # collective 45: in step 2 at 16 layers
device_wait "pp2 1F1B" bubble_s 1:pp:6:sleep-send:4 pp "pipeline wait" -- --set parallel.pp=2
