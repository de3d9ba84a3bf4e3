#!/usr/bin/env bash
# Mixture of Experts (core/README.md, Mixture of Experts) under mpirun: a GPT-2 whose every other
# layer is an MoE layer (8 routed experts, 2 a token, and a shared one; the balancing loss and z-loss
# on) trained in layouts of dp,
# ZeRO 1-3, tp with and without sequence parallelism, pp (1F1B and interleaved), cp, recompute and
# expert parallelism (ep 2, 4, 8, with ZeRO, tp, pp and cp on top), and a Llama with SwiGLU experts,
# against world size 1 (test/tools/compare_runs.py: losses and every parameter, its derived tolerance);
# the MoE metrics and trace counters; the MoE keys' errors (exit 2 on every rank, with the numbers and a hint).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup
base+=(--set model.n_layer=4 --set model.moe_experts=8 --set model.moe_top_k=2
       --set model.moe_every=2 --set model.moe_d_ff=96 --set model.moe_aux_alpha=0.05
       --set model.moe_z_alpha=0.01 --set model.moe_shared=1)

# same_aux NAME REF RUN: the balancing loss and the z-loss of every step equal world size 1's
# within 1e-5 relative (the layouts change only summation orders; a loss counted over another set
# of tokens moves them by percents)
same_aux() {
    if out=$(python3 - "$2" "$3" <<'PY'
import json, sys
def steps(p):
    return {r["step"]: (r["moe_aux_loss"], r["moe_z_loss"]) for r in map(json.loads, open(p)) if "moe_aux_loss" in r}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert a and a.keys() == b.keys(), (a.keys(), b.keys())
worst = max(abs(x - y) / abs(x) for s in a for x, y in zip(a[s], b[s]))
print("balancing and z-losses within %.1e of world size 1" % worst)
sys.exit(0 if worst <= 1e-5 else 1)
PY
    ); then ok "$1: $out"; else fail "$1: $out"; fi
}

if selected "layouts" && reference_run "$tmp"; then
    if python3 - "$tmp/ref.jsonl" <<'PY'; then ok "MoE metrics: balancing loss near alpha per layer, loads add up"; else fail "MoE metrics"; fi
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
for s in steps:
    # 2 MoE layers, alpha 0.05 each: the balancing loss is alpha at uniform routing and grows with
    # imbalance (alpha * E at worst); 512 tokens a step, 2 layers, 2 experts each, 8 experts
    assert 0.1 <= s["moe_aux_loss"] < 0.1 * 8, s
    assert s["moe_load_mean"] == 512 * 2 * 2 / 8, s
    assert s["moe_load_min"] <= s["moe_load_mean"] <= s["moe_load_max"], s
    assert abs(s["moe_imbalance"] - s["moe_load_max"] / s["moe_load_mean"]) < 1e-5, s
    # the z-loss: 0.01 x the squared logsumexp of 8 small logits (about ln 8) x 2 layers
    assert 0.01 * 2 * 1.5**2 < s["moe_z_loss"] < 0.01 * 2 * 3**2, s
assert len(steps) == 4
PY
    # np  extra
    while read -r np extra; do
        name="np=$np $extra"
        selected "$name" || continue
        # shellcheck disable=SC2086
        if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np "$np" "$BIN" "${base[@]}" $extra \
            --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin"; then
            check_against_reference "$name" "$tmp"
            same_aux "$name" "$tmp/ref.jsonl" "$tmp/run.jsonl"
        fi
    done <<'RUNS'
2
2 --set train.micro_batch=8
4 --set parallel.zero_stage=1
4 --set parallel.zero_stage=3
2 --set parallel.zero_stage=2 --set train.recompute=full
2 --set parallel.tp=2
4 --set parallel.tp=2 --set parallel.sequence_parallel=true --set parallel.zero_stage=2
2 --set parallel.pp=2
4 --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved
2 --set parallel.cp=2
2 --set parallel.ep=2
4 --set parallel.ep=2 --set parallel.zero_stage=1
4 --set parallel.ep=4 --set parallel.zero_stage=3
8 --set parallel.ep=8
4 --set parallel.ep=2 --set parallel.zero_stage=2 --set train.recompute=full
4 --set parallel.ep=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
4 --set parallel.ep=2 --set parallel.pp=2
4 --set parallel.ep=2 --set parallel.cp=2 --set parallel.zero_stage=1
2 --set parallel.pp=2 --set parallel.schedule=zbh1
4 --set parallel.ep=2 --set parallel.pp=2 --set parallel.schedule=zbh1 --set parallel.zero_stage=3
2 --set parallel.pp=2 --set parallel.schedule=zbv --set parallel.virtual_stages=2
RUNS
fi

# Llama with SwiGLU experts (gate and up adjacent per expert, no biases)
if selected "llama"; then
    d=$tmp/llama
    mkdir -p "$d"
    lbase=("${base[@]}")
    base+=(--set model.arch=llama --set model.n_kv_head=4 --set model.multiple_of=32)
    if reference_run "$d"; then
        while read -r np extra; do
            name="llama np=$np $extra"
            # shellcheck disable=SC2086
            if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np "$np" "$BIN" "${base[@]}" $extra \
                --set log.metrics="$d/run.jsonl" --dump-params "$d/run.bin"; then
                check_against_reference "$name" "$d"
            fi
        done <<'RUNS'
2 --set parallel.ep=2 --set parallel.zero_stage=1
4 --set parallel.ep=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
4 --set parallel.ep=2 --set parallel.pp=2 --set parallel.zero_stage=3
RUNS
    fi
    base=("${lbase[@]}")
fi

# A checkpoint of an MoE model: eval reads it; export refuses what Hugging Face has no layout for
# (GPT-2 experts; a Llama MoE with shared experts, dense layers between, another router or
# selection biases), naming the tensor and the reason. A Llama MoE in Mixtral's form (every layer
# sparse, topk_softmax, no shared experts), trained at ep 2 x tp 2, exports as Mixtral: the numpy
# reference (scripts/reference_forward.py, HF's Mixtral: softmax, top-k, renormalised) on the
# export gives cooktrain eval's loss to 1e-6 relative (fp32 against float64, as test/cli/cli_llama.sh);
# export -> import -> export is byte-identical; and model.init_from the export at ep 2 loads the
# weights one process loads.
if selected "export"; then
    d=$tmp/export
    expect_exit 0 "MoE checkpoint (2 steps)" -- "$BIN" "${base[@]}" --set train.steps=2 \
        --set checkpoint.dir="$d/ck" --set checkpoint.interval=2
    expect_exit 0 "eval of an MoE checkpoint" -- "$BIN" eval "$d/ck/step-00000002" --data "$TEST_DATA/val.bin" --samples 4
    expect_exit 2 "export of a GPT-2 MoE checkpoint" -- "$BIN" export "$d/ck/step-00000002" --out "$d/m.safetensors"
    expect_text "holds a Mixture-of-Experts model (layers.1.moe.shared.w_up) that export cannot write: GPT-2 experts have no Hugging Face layout" \
        "export names the MoE tensor it cannot write and why"
    mix=("${base[@]}" --set model.arch=llama --set model.n_kv_head=4 --set model.multiple_of=32
         --set model.moe_every=1 --set model.moe_shared=0 --set model.moe_z_alpha=0)
    for bad in "model.moe_shared=1|Mixtral has no shared experts" \
        "model.moe_every=2|Mixtral's every layer is sparse" \
        "model.moe_router=sigmoid|Mixtral routes by softmax then top-k" \
        "model.moe_bias_rate=0.01|Mixtral has no selection biases"; do
        IFS='|' read -r key why <<<"$bad"
        rm -rf "$d/bad"
        "$BIN" "${mix[@]}" --set "$key" --set train.steps=1 --set train.warmup_steps=0 \
            --set checkpoint.dir="$d/bad" >/dev/null 2>&1
        expect_exit 2 "export of a Llama MoE with $key" -- "$BIN" export "$d/bad" --out "$d/bad.safetensors"
        expect_text "$why" "export with $key says why"
    done
    py=python3
    /usr/bin/python3 -c 'import numpy' 2>/dev/null && py=/usr/bin/python3
    expect_exit 0 "Mixtral-form Llama MoE at ep 2 x tp 2: 10 steps with a checkpoint" -- \
        "${MPIRUN[@]}" -np 4 "$BIN" "${mix[@]}" --set parallel.ep=2 --set parallel.tp=2 \
        --set train.steps=10 --set train.lr=3e-3 --set checkpoint.dir="$d/mix"
    # (eval and sample run one process whatever layout wrote the checkpoint: ep 2 included)
    expect_exit 0 "eval of the Mixtral-form checkpoint" -- "$BIN" eval "$d/mix" --data "$TEST_DATA/val.bin" --samples 8
    loss=$(printf '%s\n' "$OUT_TEXT" | sed -n 's/^eval .* loss \([0-9.]*\)$/\1/p')
    expect_exit 0 "export as Mixtral" -- "$BIN" export "$d/mix" --out "$d/hf/model.safetensors"
    grep -q '"model_type": "mixtral"' "$d/hf/config.json" && grep -q '"num_local_experts": 8' "$d/hf/config.json" &&
        grep -q '"intermediate_size": 96' "$d/hf/config.json" &&
        ok "export: config.json says mixtral, 8 experts of width 96" || fail "export: config.json is not Mixtral's"
    if ref=$($py scripts/reference_forward.py "$d/hf/model.safetensors" --tokens "$TEST_DATA/val.bin" --samples 8 2>&1) &&
        $py -c 'import math,sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if math.isfinite(a) and abs(a-b) <= 1e-6*abs(b) else 1)' "${ref#loss }" "${loss:-nan}"; then
        ok "the numpy Mixtral on the export gives cooktrain eval's loss ($ref vs $loss)"
    else
        fail "the numpy Mixtral on the export gives $ref, cooktrain eval $loss"
    fi
    "$BIN" import "$d/hf" --out "$d/imported" >/dev/null &&
        "$BIN" export "$d/imported" --out "$d/hf2/model.safetensors" >/dev/null &&
        cmp -s "$d/hf/model.safetensors" "$d/hf2/model.safetensors" && cmp -s "$d/hf/config.json" "$d/hf2/config.json" &&
        ok "Mixtral export -> import -> export: model.safetensors and config.json byte-identical" ||
        fail "Mixtral export -> import -> export differs"
    init=("${mix[@]}" --set train.steps=1 --set train.warmup_steps=0 --set model.init_from="$d/hf")
    expect_exit 0 "init_from the Mixtral export, one process" -- "$BIN" "${init[@]}" --dump-init-params "$d/one.bin"
    expect_exit 0 "init_from the Mixtral export, ep 2" -- "${MPIRUN[@]}" -np 2 "$BIN" "${init[@]}" \
        --set parallel.ep=2 --dump-init-params "$d/ep2.bin"
    cmp -s "$d/one.bin" "$d/ep2.bin" && ok "init_from Mixtral at ep 2: the weights one process loads" ||
        fail "init_from Mixtral at ep 2: weights differ from one process"
    expect_exit 2 "init_from Mixtral into a run with dense layers between" -- "$BIN" "${init[@]}" --set model.moe_every=2
    expect_text "is a Mixtral model (every layer's MLP sparse" "init_from names the Mixtral form"
fi

# log.trace at ep 2: each rank's trace has a "moe tokens per expert" counter per step, one series
# per expert, adding up to the step's routed slots (512 tokens x 2 experts x 2 MoE layers)
if selected "trace"; then
    expect_exit 0 "trace at ep 2" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" --set parallel.ep=2 \
        --set log.trace="$tmp/trace/t.json"
    expect_text "moe: 2 of 4 layers route each token to 2 of 8 experts and 1 shared (width 96, topk_softmax router); balancing loss alpha 0.05, z-loss on; ep 2: 4 experts a layer on each rank" \
        "the start-up report describes the MoE layers and the experts per rank"
    if python3 - "$tmp/trace" <<'PY'; then ok "trace: tokens per expert each step, on every rank"; else fail "trace: tokens per expert"; fi
import json, sys
for r in (0, 1):
    ev = json.load(open("%s/t.rank%d.json" % (sys.argv[1], r)))["traceEvents"]
    c = [e for e in ev if e.get("ph") == "C" and e["name"] == "moe tokens per expert"]
    assert len(c) == 4, len(c)
    for e in c:
        assert sorted(e["args"]) == [str(i) for i in range(8)], e
        assert sum(e["args"].values()) == 512 * 2 * 2, e
PY
fi

expect_exit 2 "moe_top_k above moe_experts" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" --set model.moe_top_k=9
expect_text "model.moe_top_k=9 is more than model.moe_experts=8" "top_k: both numbers named"
expect_exit 2 "ep that does not divide dp" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" --set parallel.ep=4
expect_text "parallel.ep=4 must divide both dp=2 and model.moe_experts=8" "ep: the numbers named"
expect_text "ep values that divide both: 1, 2" "ep: a hint with the valid values"
expect_exit 2 "ep without experts" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" --set model.moe_experts=0 --set parallel.ep=2
expect_text "parallel.ep=2, but the model has no experts" "ep without experts named"
expect_exit 2 "tp that does not divide the experts' width" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" --set parallel.tp=2 --set model.moe_d_ff=33
expect_text "model.moe_d_ff=33" "moe_d_ff named"
n=$(printf '%s\n' "$OUT_TEXT" | grep -c '^cooktrain:')
if [ "$n" = 1 ]; then ok "MoE config error printed once (rank 0)"; else fail "MoE config error printed $n times"; fi

# ---- 20 steps ---------------------------------------------------------------------------------
# Expert gradients scaled right keep every layout on world size 1's trajectory for many steps, not
# only the first: dp 4 with ep 2 (ZeRO-1) and dp 8 with ep 8, 20 steps each
if selected "20 steps"; then
    d=$tmp/long
    mkdir -p "$d"
    twenty=(--set train.steps=20 --set train.warmup_steps=2)
    if expect_exit 0 "20 steps: reference (world size 1)" -- "$BIN" "${base[@]}" "${twenty[@]}" \
        --set log.metrics="$d/ref.jsonl" --dump-params "$d/ref.bin" --dump-init-params "$d/init.bin"; then
        for layout in "4 --set parallel.ep=2 --set parallel.zero_stage=1" "8 --set parallel.ep=8"; do
            read -r np extra <<<"$layout"
            name="20 steps np=$np $extra"
            # shellcheck disable=SC2086
            if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np "$np" "$BIN" "${base[@]}" "${twenty[@]}" \
                $extra --set log.metrics="$d/run.jsonl" --dump-params "$d/run.bin"; then
                check_against_reference "$name" "$d"
            fi
        done
    fi
fi

# ---- checkpoints across expert-parallel sizes ------------------------------------------------
# Saved after 3 of 6 steps at ep 2 (ZeRO 0: one rank of each expert's group saves it; ZeRO-1:
# expert optimizer state sharded over their group) and at ep 4 (ZeRO-3), resumed at ep 1, ep 4
# and ep 2: the six steps match world size 1.
if selected "reshard"; then
    d=$tmp/reshard
    mkdir -p "$d"
    six=(--set train.steps=6 --set train.warmup_steps=1)
    expect_exit 0 "reshard: reference (world size 1)" -- "$BIN" "${base[@]}" "${six[@]}" \
        --set log.metrics="$d/ref.jsonl" --dump-params "$d/ref.bin" --dump-init-params "$d/init.bin"
    reshard_extra=("${six[@]}")
    while read -r snp sargs lnp largs; do
        sargs=${sargs//,/ } largs=${largs//,/ }
        rm -rf "$d/ck"
        reshard_check "reshard np=$snp $sargs -> np=$lnp $largs" "$d" "$d/ck" 3 "$snp" "$sargs" "$lnp" "$largs"
    done <<'RUNS'
2 --set,parallel.ep=2 1 --set,parallel.ep=1
2 --set,parallel.ep=2,--set,parallel.zero_stage=1 4 --set,parallel.ep=4,--set,parallel.zero_stage=2
4 --set,parallel.ep=4,--set,parallel.zero_stage=3 2 --set,parallel.ep=2
RUNS
fi

# ---- auxiliary-loss-free balancing (model.moe_bias_rate) ---------------------------------------
# The selection biases move by counts summed over every rank, so every layout moves them alike:
# ep 2 with pp 2 (each stage its own layers' biases) and with tp 2 + SP against world size 1; a
# checkpoint saved at ep 2 and resumed at pp 2 carries each layer's bias to the stage that now
# holds it (without it the resumed run routes by zero biases and leaves world size 1's path).
# Then what the biases are for: with the sigmoid router and no balancing loss this model's routing
# collapses onto two experts (a layer's most loaded expert near 4x the mean over steps 11-30,
# measured 3.995-4.0 for seeds 1-3); rate 0.005 keeps it at 2.4-2.8 (0.61-0.70 of that), so the
# check asks for at most 0.8 of the unbalanced run. A bias moved the wrong way collapses it too.
if selected "bias"; then
    d=$tmp/bias
    mkdir -p "$d"
    lbase=("${base[@]}")
    base+=(--set model.moe_bias_rate=0.01 --set train.steps=6 --set train.warmup_steps=1)
    if reference_run "$d"; then
        if python3 - "$d/ref.jsonl" <<'PY'; then ok "bias: step 1 moves every bias by the rate"; else fail "bias: the metrics after step 1"; fi
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"moe_bias_min"' in l][0]
assert s["step"] == 1 and abs(s["moe_bias_min"] + 0.01) < 1e-9 and abs(s["moe_bias_max"] - 0.01) < 1e-9, s
PY
        while read -r np extra; do
            name="bias np=$np $extra"
            # shellcheck disable=SC2086
            if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np "$np" "$BIN" "${base[@]}" $extra \
                --set log.metrics="$d/run.jsonl" --dump-params "$d/run.bin"; then
                check_against_reference "$name" "$d"
            fi
        done <<'RUNS'
4 --set parallel.ep=2 --set parallel.pp=2
4 --set parallel.ep=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
RUNS
        reshard_extra=()
        reshard_check "bias: reshard np=2 ep 2 -> np=2 pp 2" "$d" "$d/ck" 3 2 "--set parallel.ep=2" 2 "--set parallel.pp=2"
    fi
    base=("${lbase[@]}")
    for rate in 0 0.005; do
        expect_exit 0 "bias rate $rate: 30 steps, sigmoid router, no balancing loss" -- "$BIN" "${base[@]}" \
            --set model.moe_router=sigmoid --set model.moe_aux_alpha=0 --set model.moe_bias_rate=$rate \
            --set train.steps=30 --set log.metrics="$d/rate$rate.jsonl"
    done
    if out=$(python3 - "$d/rate0.jsonl" "$d/rate0.005.jsonl" <<'PY'
import json, sys
def late(p):
    v = [json.loads(l)["moe_layer_imbalance"] for l in open(p) if '"moe_layer_imbalance"' in l]
    assert len(v) == 30, len(v)
    return sum(v[10:]) / 20
off, on = late(sys.argv[1]), late(sys.argv[2])
print("most loaded expert over steps 11-30: %.3f x the mean with the biases, %.3f without" % (on, off))
sys.exit(0 if on <= 0.8 * off else 1)
PY
    ); then ok "bias balancing: $out"; else fail "bias balancing: $out"; fi
fi

# ---- bf16 --------------------------------------------------------------------------------------
# ep 2 with ZeRO-1 in bf16 against the one-process bf16 run, within that run's distance from its
# fp32 twin (compare_runs.py --noise)
bdir=$tmp/bf16
mkdir -p "$bdir"
if selected "bf16" &&
    expect_exit 0 "bf16 reference run (world size 1)" -- "$BIN" "${base[@]}" --set train.precision=bf16 \
        --set log.metrics="$bdir/ref.jsonl" --dump-params "$bdir/ref.bin" --dump-init-params "$bdir/init.bin" &&
    expect_exit 0 "fp32 twin of the bf16 reference" -- "$BIN" "${base[@]}" \
        --set log.metrics="$bdir/twin.jsonl" --dump-params "$bdir/twin.bin" &&
    expect_exit 0 "train bf16 ep=2 zero 1" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" \
        --set train.precision=bf16 --set parallel.ep=2 --set parallel.zero_stage=1 \
        --set log.metrics="$bdir/run.jsonl" --dump-params "$bdir/run.bin"; then
    check_against_reference "bf16 ep=2 zero 1" "$bdir"
fi

# ---- plan against the trainer ------------------------------------------------------------------
# `cooktrain plan` for ep 2 at dp 4 with ZeRO-1 and ZeRO-3: parameter, optimizer memory and dp bytes
# per step equal what the trainer measured (experts sharded over dp / ep ranks, the rest over dp)
if selected "plan"; then
    for zero in 1 3; do
        name="plan ep=2 dp=4 zero=$zero"
        rm -f "$tmp/plan-run.jsonl" # a metrics file is appended to: this run's alone
        "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" --set parallel.ep=2 --set parallel.zero_stage=$zero \
            --set train.steps=2 --set log.metrics="$tmp/plan-run.jsonl" >/dev/null 2>&1 || { fail "$name: training"; continue; }
        "$BIN" plan --json "${base[@]:1}" --set parallel.dp=4 --set parallel.ep=2 \
            --set parallel.zero_stage=$zero >"$tmp/plan.json" 2>&1 || { fail "$name: plan"; continue; }
        if out=$(python3 - "$tmp/plan.json" "$tmp/plan-run.jsonl" <<'PY'
import json, sys
plan = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][0]
run = [json.loads(l) for l in open(sys.argv[2])]
setup = [r for r in run if r.get("setup")][0]
step = [r for r in run if "dp_bytes" in r][0]
pairs = [("params_bytes", setup["mem_params"]), ("optim_bytes", setup["mem_optim"]),
         ("grads_bytes", setup["mem_grads"]), ("dp_bytes", step["dp_bytes"])]
bad = ["%s: plan %s, measured %s" % (k, plan[k], v) for k, v in pairs if plan[k] != v]
assert step["ep_bytes"] > 0, step
print("; ".join(bad) if bad else "memory and dp bytes equal: %d params bytes, %d dp bytes" % (plan["params_bytes"], plan["dp_bytes"]))
sys.exit(1 if bad else 0)
PY
        ); then ok "$name: $out"; else fail "$name: $out"; fi
    done
fi

# configs/gpt2-moe-3b.yaml at 64 ranks: plan answers without allocating (exit 0, the experts per rank)
if selected "plan"; then
    expect_exit 0 "plan gpt2-moe-3b at 64 ranks" -- "$BIN" plan --config configs/gpt2-moe-3b.yaml
    expect_text "MoE: 8 of 64 experts a layer on each rank" "plan gpt2-moe-3b: 64 experts over ep 8"
fi

# scripts/bench_moe.sh refuses a bad option with a hint (the README runs it for real)
if selected "bench"; then
    expect_exit 2 "bench_moe.sh with a bad option" -- bash scripts/bench_moe.sh --steps 1
    expect_text "hint:" "bench_moe.sh says how to call it"
fi
