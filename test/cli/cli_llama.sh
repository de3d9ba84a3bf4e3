#!/usr/bin/env bash
# model.arch: llama through the real binary (core/README.md, The model):
#   - the forward pass against an independent one: a checkpoint exported in Hugging Face's Llama
#     layout (RoPE's q/k row permutation applied by export) gives, in scripts/reference_forward.py
#     (numpy, float64, HF's half-split rotary convention), the loss `cooktrain eval` prints, to
#     1e-6 relative — trained at world size 1 and at tp=2 (q, k and v heads and gate/up rows split
#     over ranks, gathered back by the checkpoint);
#   - equivalence against world size 1 on configs/test-tiny.yaml made a Llama (grouped-query
#     attention with 4 key/value heads for 8 query heads, SwiGLU width 192): tp 2 and 4 with and
#     without sequence parallelism, pp 2 (1F1B and interleaved), dp with ZeRO 1-3, recompute,
#     combined; memory and traffic against their formulas (test/tools/compare_runs.py --accounting);
#   - on the emulated CUDA backend: 3 steps against the CPU, and check mode over every op of a step
#     in fp32 and bf16;
#   - configs/llama-tiny.yaml trains (its loss falls) and bf16 trains;
#   - an untied LM head (model.tie_embeddings: false) against world size 1 at tp 2 + SP, pp 2,
#     pp 2 x dp 2 with ZeRO-2, dp 2 with ZeRO-3 and tp 2 x pp 2;
#   - bf16 against world size 1 in bf16 (within its distance from the fp32 twin) at tp 2 + SP, dp 2
#     ZeRO-3 with bf16 reduction, pp 2 interleaved ZeRO-1 and tp 2 x pp 2 x dp 2;
#   - a checkpoint saved at tp 2 and loaded (model.init_from) at tp 1 and tp 4: the same weights,
#     and the tp 4 run trains as the one-process run does;
#   - invalid shapes: an odd head_dim, n_kv_head not divisible by tp: exit 2 naming the numbers.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup
base+=(--set model.arch=llama --set model.n_kv_head=4 --set model.multiple_of=32)

# ---- the forward pass against the numpy reference, through export ------------------------------
# Debian's python3 has numpy (scripts/setup.sh installs python3-numpy); a pyenv python3 may not
py=python3
/usr/bin/python3 -c 'import numpy' 2>/dev/null && py=/usr/bin/python3
for layout in "1|" "2|--set parallel.tp=2"; do
    IFS='|' read -r np extra <<<"$layout"
    selected "export np=$np" || continue
    d=$tmp/export$np
    # 30 steps at a higher rate and rope_theta 500: attention far enough from uniform, and angles
    # that turn within the 32 positions, for a wrong rotation or pairing to move the loss
    launch=("$BIN")
    [ "$np" != 1 ] && launch=("${MPIRUN[@]}" -np "$np" "$BIN")
    # shellcheck disable=SC2086
    expect_exit 0 "llama np=$np $extra: 30 steps with a checkpoint" -- "${launch[@]}" "${base[@]}" $extra \
        --set model.n_layer=4 --set model.rope_theta=500 --set train.steps=30 --set train.lr=3e-3 \
        --set checkpoint.dir="$d/ck" || continue
    expect_exit 0 "llama np=$np: eval on 8 validation samples" -- \
        "$BIN" eval "$d/ck/step-00000030" --data "$TEST_DATA/val.bin" --samples 8
    loss=$(printf '%s\n' "$OUT_TEXT" | sed -n 's/^eval .* 8 samples of .* loss \([0-9.]*\)$/\1/p')
    expect_exit 0 "llama np=$np: export" -- "$BIN" export "$d/ck/step-00000030" --out "$d/hf/model.safetensors"
    expect_text "(fp32) and config.json" "llama np=$np: export says what it wrote"
    if ref=$($py scripts/reference_forward.py "$d/hf/model.safetensors" --tokens "$TEST_DATA/val.bin" \
        --samples 8 2>&1) && $py - "${ref#loss }" "${loss:-nan}" <<'PY'; then
import math, sys
# cooktrain computes in fp32, the reference in float64: float32 rounding, a few 2^-24 per op
# averaged over the 256 token losses (~1e-7 relative measured); 1e-6 leaves the margin and fails
# a wrong rotation, pairing or eps (1e-4 and more)
ref, ours = float(sys.argv[1]), float(sys.argv[2])
sys.exit(0 if math.isfinite(ref) and abs(ref - ours) <= 1e-6 * abs(ours) else 1)
PY
        ok "llama np=$np: the numpy Llama on the export gives cooktrain eval's loss ($ref vs $loss)"
    else
        fail "llama np=$np: the numpy Llama on the export gives $ref, cooktrain eval $loss"
    fi
    grep -q '"model_type": "llama"' "$d/hf/config.json" &&
        grep -q '"num_key_value_heads": 4' "$d/hf/config.json" &&
        grep -q '"intermediate_size": 192' "$d/hf/config.json" &&
        ok "llama np=$np: config.json says llama, 4 key/value heads, intermediate_size 192" ||
        fail "llama np=$np: config.json lacks model_type llama, the kv heads or the MLP width"
done

# ---- every layout family against world size 1 ---------------------------------------------------
if reference_run "$tmp"; then
    # tp pp dp schedule v zero sp recompute micro_batch
    while read -r tp pp dp sched v zero sp rc micro; do
        name="llama tp=$tp pp=$pp dp=$dp $sched v=$v zero=$zero sp=$sp recompute=$rc micro_batch=$micro"
        selected "$name" || continue
        if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np $((tp * pp * dp)) "$BIN" "${base[@]}" \
            --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.schedule="$sched" \
            --set parallel.virtual_stages="$v" --set parallel.zero_stage="$zero" \
            --set parallel.sequence_parallel="$sp" --set train.recompute="$rc" \
            --set train.micro_batch="$micro" --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin"; then
            check_against_reference "$name" "$tmp"
        fi
    done <<'RUNS'
2 1 1 1f1b 1 0 false none 2
2 1 1 1f1b 1 0 true none 4
4 1 1 1f1b 1 0 true none 2
1 2 1 1f1b 1 0 false none 2
1 2 1 interleaved 2 0 false none 2
1 1 2 1f1b 1 1 false none 2
1 1 4 1f1b 1 3 false full 2
2 2 2 1f1b 1 2 true full 2
1 2 1 zbh1 1 0 false none 2
2 2 1 zbh1 1 1 true full 2
1 2 1 zbv 2 0 false none 2
RUNS
fi

# ---- an LM head of its own (model.tie_embeddings: false) in every layout family -------------------
if selected "untied"; then
    u=$tmp/untied
    mkdir -p "$u"
    tied_base=("${base[@]}")
    base+=(--set model.tie_embeddings=false)
    if reference_run "$u"; then
        grep -q lm_head "$u/ref.bin.index.json" && ok "untied: the model has an lm_head tensor" ||
            fail "untied: no lm_head in the parameters"
        # tp pp dp zero sp micro_batch
        while read -r tp pp dp zero sp micro extra; do
            name="llama untied tp=$tp pp=$pp dp=$dp zero=$zero sp=$sp $extra"
            # shellcheck disable=SC2086
            if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np $((tp * pp * dp)) "$BIN" "${base[@]}" \
                --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.zero_stage="$zero" \
                --set parallel.sequence_parallel="$sp" --set train.micro_batch="$micro" $extra \
                --set log.metrics="$u/run.jsonl" --dump-params "$u/run.bin"; then
                check_against_reference "$name" "$u"
            fi
        done <<'RUNS'
2 1 1 0 true 2
1 2 1 0 false 2
1 2 2 2 false 2
1 1 2 3 false 2
2 2 1 1 false 2
1 4 1 0 false 2 --set parallel.schedule=zbh1
1 2 1 0 false 2 --set parallel.schedule=zbv --set parallel.virtual_stages=2
RUNS
    fi
    base=("${tied_base[@]}")
fi

# ---- bf16: against world size 1 in bf16, within its distance from the fp32 twin -----------------
if selected "llama bf16"; then
    b=$tmp/bf16
    mkdir -p "$b"
    if expect_exit 0 "llama bf16 reference run (world size 1)" -- "$BIN" "${base[@]}" --set train.precision=bf16 \
        --set log.metrics="$b/ref.jsonl" --dump-params "$b/ref.bin" --dump-init-params "$b/init.bin" &&
        expect_exit 0 "its fp32 twin" -- "$BIN" "${base[@]}" --set log.metrics="$b/twin.jsonl" --dump-params "$b/twin.bin"; then
        while read -r np extra; do
            name="llama bf16 np=$np $extra"
            # shellcheck disable=SC2086
            if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np "$np" "$BIN" "${base[@]}" --set train.precision=bf16 \
                $extra --set log.metrics="$b/run.jsonl" --dump-params "$b/run.bin"; then
                check_against_reference "$name" "$b"
            fi
        done <<'RUNS'
2 --set parallel.tp=2 --set parallel.sequence_parallel=true
2 --set parallel.zero_stage=3 --set parallel.grad_reduce_dtype=bf16
4 --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved --set parallel.zero_stage=1
8 --set parallel.tp=2 --set parallel.pp=2 --set parallel.zero_stage=2 --set parallel.sequence_parallel=true
4 --set parallel.pp=4 --set parallel.schedule=zbh1 --set train.recompute=full
RUNS
    fi
fi

# ---- saved at tp 2, loaded at tp 1 and tp 4: the same training -------------------------------------
# q/k/v heads and gate/up rows are grouped per tp rank inside the fused matrices: a checkpoint of
# tp 2 read into tp 4 (or one process) must put every row where that layout's kernels look for it,
# so runs started from it (model.init_from) train as one process does.
if selected "reshard"; then
    r=$tmp/reshard
    mkdir -p "$r"
    expect_exit 0 "llama: 3 steps at tp 2 with a checkpoint" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" \
        --set parallel.tp=2 --set train.steps=3 --set checkpoint.dir="$r/ck"
    from=(--set model.init_from="$r/ck" --set train.steps=2 --set train.warmup_steps=0)
    if expect_exit 0 "llama: from the tp 2 checkpoint in one process" -- "$BIN" "${base[@]}" "${from[@]}" \
        --set log.metrics="$r/ref.jsonl" --dump-params "$r/ref.bin" --dump-init-params "$r/init.bin"; then
        expect_exit 0 "llama: from the tp 2 checkpoint at tp 4" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" "${from[@]}" \
            --set parallel.tp=4 --set log.metrics="$r/run.jsonl" --dump-params "$r/run.bin" \
            --dump-init-params "$r/init4.bin" &&
            check_against_reference "llama: saved at tp 2, loaded at tp 4" "$r"
        cmp -s "$r/init.bin" "$r/init4.bin" && ok "llama: tp 1 and tp 4 load the same weights from tp 2" ||
            fail "llama: tp 1 and tp 4 load different weights from tp 2"
    fi
fi

# ---- on the emulated CUDA backend -----------------------------------------------------------------
# 3 steps of a 4-layer Llama against the CPU (compare_runs.py's fp32 tolerance), and check mode: every
# op of one step, Llama's included, rerun on the CPU and compared (check_ops.c's tolerances).
EMU=$BUILD/cooktrain-cuemu
if [ -x "$EMU" ] && selected "emulated"; then
    d=$tmp/emu
    mkdir -p "$d"
    short=(--set train.steps=3 --set train.global_batch=4 --set model.n_layer=4)
    expect_exit 0 "llama emulated: CPU reference run" -- "$BIN" "${base[@]}" "${short[@]}" \
        --set log.metrics="$d/ref.jsonl" --dump-params "$d/ref.bin" --dump-init-params "$d/init.bin"
    expect_exit 0 "llama emulated: 3 steps on the emulated CUDA backend" -- "$EMU" "${base[@]}" "${short[@]}" \
        --backend cuda --set log.metrics="$d/run.jsonl" --dump-params "$d/run.bin"
    check_against_reference "llama on the emulated CUDA backend (fp32)" "$d"
    for prec in fp32 bf16; do
        expect_exit 0 "llama check mode: every op of a $prec step on the emulated CUDA backend agrees with the CPU" -- \
            env CT_CHECK_BACKEND=1 OMP_NUM_THREADS=1 "$EMU" "${base[@]}" --backend cuda --set train.steps=1 \
            --set train.warmup_steps=0 --set train.global_batch=2 --set model.n_layer=2 --set train.precision=$prec
    done
elif selected "emulated"; then
    skip "Llama on the emulated device: $EMU not built (needs the CUDA headers)"
fi

# ---- the tiny config learns; bf16 ---------------------------------------------------------------
if selected "llama-tiny"; then
    # on the byte-level test corpus (a fresh clone has no BPE corpus until `make data`)
    expect_exit 0 "configs/llama-tiny.yaml: 40 steps" -- "$BIN" train --config configs/llama-tiny.yaml \
        --set train.threads=2 --set train.steps=40 --set train.warmup_steps=5 --set train.eval_interval=0 \
        --set log.sample_tokens=0 --set log.interval=40 --set log.metrics="$tmp/tiny.jsonl" \
        --set data.train="$TEST_DATA/train.bin" --set data.val="$TEST_DATA/val.bin" --set data.tokenizer=
    if $py - "$tmp/tiny.jsonl" "$TEST_DATA/train.bin" <<'PY'; then
import json, sys
import numpy as np
loss = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
# from ln(4096) = 8.3 at the start to below the corpus' unigram entropy (3.31 nats for the byte
# corpus; 3.21 after 40 steps, measured): a model that learned from context, not only counts
t = np.frombuffer(open(sys.argv[2], "rb").read()[64:], dtype="<u2")
p = np.bincount(t) / len(t)
h = -(p[p > 0] * np.log(p[p > 0])).sum()
print("final loss %.4f, unigram entropy %.4f" % (loss[-1] if loss else float("nan"), h))
sys.exit(0 if loss and loss[-1] < h else 1)
PY
        ok "configs/llama-tiny.yaml: the loss falls below the corpus' unigram entropy in 40 steps"
    else
        fail "configs/llama-tiny.yaml: the loss did not fall below the corpus' unigram entropy in 40 steps"
    fi
    expect_exit 0 "llama in bf16: 4 steps" -- "$BIN" "${base[@]}" --set train.precision=bf16
    expect_text "precision: bf16" "llama in bf16: the run says so"
fi

# ---- invalid shapes -------------------------------------------------------------------------------
expect_exit 2 "llama with an odd head_dim" -- "$BIN" "${base[@]}" --set model.d_model=72 --set model.n_head=8 \
    --set model.n_kv_head=8
expect_text "even head_dim" "odd head_dim: the message says why"
expect_text "d_model=72 / n_head=8 = 9" "odd head_dim: the message quotes the numbers"
expect_exit 2 "llama with n_kv_head not divisible by tp" -- "$BIN" "${base[@]}" --set model.n_kv_head=2 \
    --set parallel.tp=4 --print-config
expect_text "model.n_kv_head=2" "n_kv_head over tp: the message names n_kv_head"
expect_text "parallel.tp=4" "n_kv_head over tp: the message names tp"
