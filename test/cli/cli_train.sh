#!/usr/bin/env bash
# End to end through the binary: prepare a corpus, train a small model for a few dozen steps
# with evaluation and metrics, check the metrics file and that the loss falls.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ensure_test_data
head -c 300000 "$TEST_TEXT" >"$tmp/text.txt"
expect_exit 0 "prepare (vocab 512)" -- "$BIN" prepare --input "$tmp/text.txt" --vocab-size 512 --out "$tmp/data"
for f in tokenizer.bin train.bin val.bin; do
    if [ -s "$tmp/data/$f" ]; then ok "prepare wrote $f"; else fail "prepare wrote $f"; fi
done

args=(train --config configs/tiny.yaml
      --set model.vocab_size=512 --set model.seq_len=64 --set model.n_layer=2 --set model.d_model=64
      --set model.n_head=4 --set train.steps=40 --set train.global_batch=8 --set train.micro_batch=4
      --set train.warmup_steps=5 --set train.lr=3e-3 --set train.eval_interval=20 --set train.eval_steps=2
      --set data.train="$tmp/data/train.bin" --set data.val="$tmp/data/val.bin"
      --set data.tokenizer="$tmp/data/tokenizer.bin"
      --set log.metrics="$tmp/metrics.jsonl" --set log.interval=10 --set log.sample_tokens=30
      --set train.threads=1)
if expect_exit 0 "train 40 steps" -- "$BIN" "${args[@]}"; then
    expect_text "step    40/40" "progress line reaches the last step"
    expect_text "tok/s" "progress line shows tokens/s"
    expect_text "MFU" "progress line shows MFU"
    expect_text "GEMM eff" "progress line shows the GEMM efficiency"
    expect_text "hardware peak" "the start-up report names the hardware peak"
    expect_text "measured: " "the start-up report says how the peak was obtained"
    expect_text "val_loss" "evaluation runs"
    expect_text "sample" "a sample is printed"
    expect_text "memory" "memory is reported at start"
    lines=$(grep -c '"loss"' "$tmp/metrics.jsonl")
    if [ "$lines" = 40 ]; then ok "metrics has 40 training lines"; else fail "metrics has 40 training lines (got $lines)"; fi
    vals=$(grep -c '"val_loss"' "$tmp/metrics.jsonl")
    if [ "$vals" = 2 ]; then ok "metrics has 2 eval lines"; else fail "metrics has 2 eval lines (got $vals)"; fi
    for key in step loss lr grad_norm tokens_per_s mfu gemm_efficiency mem_bytes; do
        if grep "\"loss\"" "$tmp/metrics.jsonl" | head -1 | grep -q "\"$key\":"; then ok "metrics carries $key"; else fail "metrics carries $key"; fi
    done
    first=$(grep '"loss"' "$tmp/metrics.jsonl" | head -1 | sed 's/.*"loss": \([0-9.]*\).*/\1/')
    last=$(grep '"loss"' "$tmp/metrics.jsonl" | tail -1 | sed 's/.*"loss": \([0-9.]*\).*/\1/')
    # ln(512) = 6.24 at the start; 40 steps of a 2-layer model reach well under 5.5.
    if awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 5.8 && b < 5.5) }'; then
        ok "loss falls ($first -> $last)"
    else
        fail "loss falls ($first -> $last)"
    fi
fi

# Non-finite steps: an absurd learning rate breaks the weights after step 1; the following steps
# are skipped and logged, and train.max_bad_steps in a row stop the run with exit 1 (runtime).
bytes=$TEST_DATA
if expect_exit 1 "non-finite steps abort after max_bad_steps" -- "$BIN" train --config configs/test-tiny.yaml \
    --set train.threads=1 --set train.lr=1e30 --set train.min_lr=1e30 --set train.steps=10 \
    --set train.max_bad_steps=3 --set data.train="$bytes/train.bin" --set log.metrics="$tmp/nan.jsonl"; then
    expect_text "step skipped (1 in a row)" "a non-finite step is skipped and logged"
    expect_text "3 consecutive steps" "the abort names the count"
    expect_text "hint:" "the abort has a hint"
    skipped=$(grep -c '"skipped": true' "$tmp/nan.jsonl")
    if [ "$skipped" = 3 ]; then ok "metrics mark 3 skipped steps"; else fail "metrics mark 3 skipped steps (got $skipped)"; fi
    if python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$tmp/nan.jsonl"; then
        ok "metrics stay valid JSON (null for NaN)"
    else
        fail "metrics stay valid JSON (null for NaN)"
    fi
fi

# --profile: one line per log interval with the time of each op category.
if expect_exit 0 "train with --profile" -- "$BIN" train --config configs/test-tiny.yaml --set train.threads=1 \
    --set train.steps=2 --set log.interval=2 --set data.train="$bytes/train.bin" --profile; then
    expect_text "profile (rank 0, ms/step): gemm" "the profile line starts with gemm"
    expect_text "attention" "the profile names attention"
    expect_text "communication" "the profile names communication"
    expect_text "profile by op (rank 0, ms/step, calls/step):" "a second profile line splits the time by op"
    expect_text " attention_bwd " "the by-op line names attention's backward"
    expect_text " layernorm_fwd " "the by-op line names LayerNorm's forward"
    # the ops' times add up to the categories' (each printed rounded: 0.05 ms a category, 0.005 an op)
    if printf '%s\n' "$OUT_TEXT" | python3 -c '
import re, sys
lines = sys.stdin.read().splitlines()
cats = [l for l in lines if l.startswith("profile (rank 0")][-1]
ops = [l for l in lines if l.startswith("profile by op")][-1]
c = [float(x) for x in re.findall(r"([a-z]+) ([0-9.]+) \(", cats.split("communication")[0].split(":", 1)[1]) for x in [x[1]]]
o = [float(x) for x in re.findall(r" [a-z_]+ ([0-9.]+) \(", ops.split(":", 1)[1])]
assert o and abs(sum(c) - sum(o)) <= 0.05 * len(c) + 0.005 * len(o), (sum(c), sum(o))
'; then
        ok "the by-op times add up to the category times"
    else
        fail "the by-op times add up to the category times"
    fi
fi

# --device-idle (core/README.md, Device idle): the stream's time in ops and between them, per
# step; the host made to sleep 0.3 s before step 1's first AdamW call, the audit must charge that
# wait to AdamW in step 1 and nowhere else, and count the steps' ops only, not the evaluation
# after each step (test/tools/check_idle.py says what it checks). The by-op lines after each idle line:
# their times add up to it, and test-tiny's 15 GEMM shapes (4 linear layers and the LM head, each
# forward, input and weight gradient) come with their calls: the LM head's 8 a step (one per
# microbatch of 2 x 32 tokens; vocabulary padded to 128, width 64).
if expect_exit 0 "train with --device-idle and a host planted late" -- env COOKTRAIN_FAULT_HOST_DELAY=adamw:1:0.3 \
    "$BIN" train --config configs/test-tiny.yaml --set train.threads=1 --set train.steps=5 --set log.interval=3 \
    --set data.train="$bytes/train.bin" --set data.val="$bytes/val.bin" --set train.eval_interval=1 \
    --set train.eval_steps=2 --set log.metrics="$tmp/idle.jsonl" --device-idle; then
    printf '%s\n' "$OUT_TEXT" >"$tmp/idle.log"
    if out=$(python3 test/tools/check_idle.py "$tmp/idle.jsonl" "$tmp/idle.log" adamw 0.3 --interval 3 --coverage 0.8 \
        --gemm-shapes 15 --gemm "gemm 64x128x64 NT f32>f32=8" --gemm "gemm 64x64x128 NN f32>f32=8" \
        --gemm "gemm 128x64x64 TN f32>f32 acc=8"); then
        ok "device idle: the planted 0.3 s is step 1's, before adamw ($out)"
    else
        fail "device idle: $out"
    fi
fi
# A peak and GEMM rate measured low at start-up (planted: COOKTRAIN_FAULT_SLOW_PEAK=0.001, as on
# a machine busy with something else then) are outrun by step 1: the trainer says so, measures
# both again, and every step's MFU and GEMM efficiency, step 1's too, come out in (0, 1].
if expect_exit 0 "train with the start-up peak planted low" -- env COOKTRAIN_FAULT_SLOW_PEAK=0.001 \
    "$BIN" train --config configs/test-tiny.yaml --set train.threads=1 --set train.steps=3 \
    --set data.train="$bytes/train.bin" --set log.metrics="$tmp/slow.jsonl"; then
    expect_text "step 1 ran at " "a low start-up peak: noticed at step 1"
    expect_text "so the machine was busy then; measured again: " "a low start-up peak: measured again"
    if out=$(python3 - "$tmp/slow.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
bad = [(r["step"], r["mfu"], r["gemm_efficiency"]) for r in rows
       if not (0 < r["mfu"] <= 1 and 0 < r["gemm_efficiency"] <= 1)]
if len(rows) != 3 or bad:
    sys.exit(f"{len(rows)} steps; out of (0, 1]: {bad}")
print(", ".join(f"step {r['step']}: MFU {r['mfu']:.2f}, GEMM eff {r['gemm_efficiency']:.2f}" for r in rows))
PY
    ); then
        ok "a low start-up peak: the measured-again figures are the steps' denominators ($out)"
    else
        fail "a low start-up peak: $out"
    fi
fi
# A GEMM rate that stays low however often it is measured (planted: COOKTRAIN_FAULT_SLOW_GEMM, as
# on a machine that stays busy): measured again at most 3 times, then the progress line shows
# "n/a", with a note once, and never a GEMM efficiency above 100%.
if expect_exit 0 "train with the GEMM rate planted low at every measurement" -- \
    env COOKTRAIN_FAULT_SLOW_GEMM=0.0001 "$BIN" train --config configs/test-tiny.yaml \
    --set train.threads=1 --set train.steps=6 --set log.interval=1 --set data.train="$bytes/train.bin" \
    --set log.metrics="$tmp/slowgemm.jsonl"; then
    n=$(grep -c '"remeasured"' "$tmp/slowgemm.jsonl")
    over=$(printf '%s\n' "$OUT_TEXT" | grep -oE 'GEMM eff +[0-9.]+%' | awk '{ if ($3 + 0 > 100) print }')
    if [ "$n" = 3 ] && [ -z "$over" ] && printf '%s\n' "$OUT_TEXT" | grep -q 'GEMM eff   n/a'; then
        ok "a busy machine: measured again 3 times, then GEMM eff n/a, never above 100%"
    else
        fail "a busy machine: $n re-measurements; figures above 100%: ${over:-none}"
    fi
    expect_text "this machine is too busy to measure them" "a busy machine: the progress lines say why"
fi
expect_exit 2 "--profile with --device-idle is refused" -- "$BIN" train --config configs/test-tiny.yaml \
    --set data.train="$bytes/train.bin" --profile --device-idle
expect_text "hint: " "the refusal has a hint"

# log.run_dir: the resolved config and the metrics land there.
if expect_exit 0 "train with log.run_dir" -- "$BIN" train --config configs/test-tiny.yaml --set train.threads=1 \
    --set train.steps=2 --set data.train="$bytes/train.bin" --set log.run_dir="$tmp/run1"; then
    if [ -s "$tmp/run1/config.yaml" ] && [ "$(grep -c '"loss"' "$tmp/run1/metrics.jsonl")" = 2 ]; then
        ok "run_dir holds config.yaml and metrics.jsonl"
    else
        fail "run_dir holds config.yaml and metrics.jsonl"
    fi
    expect_exit 0 "the saved config reloads" -- "$BIN" train --config "$tmp/run1/config.yaml" --print-config
fi
# MFU (against the hardware peak) and GEMM efficiency (against the GEMM rate at the model's
# shapes) are the same throughput over the two rates in force: the setup line's, or those of the
# last `remeasured` line before the step (a step that outran them on a machine busy at start-up).
# The 1e-4 is the metrics' 6 significant digits of each ratio.
denominator_segments() {
    python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rates, steps, bad = None, 0, []
for r in rows:
    if r.get("setup") or r.get("remeasured"):
        if not (r["peak_flops_per_s"] > 0 and r["gemm_flops_per_s"] > 0):
            sys.exit(f"a rate is not positive: {r}")
        if r.get("remeasured") and rates and r["from_step"] != steps + 1:
            sys.exit(f"remeasured from step {r['from_step']}, written before step {steps + 1}")
        rates = r["peak_flops_per_s"] / r["gemm_flops_per_s"]
    elif "mfu" in r:
        steps += 1
        if rates is None or not (r["mfu"] > 0 and r["gemm_efficiency"] > 0) or \
                not abs(r["gemm_efficiency"] / r["mfu"] - rates) <= 1e-4 * rates:
            bad.append(r["step"])
if not steps or bad:
    sys.exit(f"{steps} steps; off their rates: {bad}")
print(f"{steps} steps, {sum(1 for r in rows if r.get('remeasured'))} re-measurements")
PY
}
if out=$(denominator_segments "$tmp/metrics.jsonl"); then
    ok "metrics: mfu and gemm_efficiency are the same throughput over the rates in force ($out)"
else
    fail "metrics: mfu and gemm_efficiency are the same throughput over the rates in force: $out"
fi
if out=$(denominator_segments "$tmp/slow.jsonl") && [[ $out == *" 1 re-measurements" ]]; then
    ok "metrics: after a re-measurement, the steps use the new rates ($out)"
else
    fail "metrics: after a re-measurement, the steps use the new rates: $out"
fi

# The loss reaches the host once per step, not once per microbatch (core/README.md, Ordering: a copy
# to the host waits for the stream): the step's copies to the host are the same with 1 and with 8
# microbatches per step.
for mb in 16 2; do
    expect_exit 0 "train with micro_batch $mb (host copies counted)" -- "$BIN" train --config configs/test-tiny.yaml \
        --set train.threads=1 --set train.steps=3 --set train.micro_batch=$mb \
        --set data.train="$bytes/train.bin" --set log.metrics="$tmp/copies$mb.jsonl"
done
if python3 - "$tmp/copies16.jsonl" "$tmp/copies2.jsonl" <<'PY'
import json, sys
runs = [[json.loads(l)["host_copies"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:]]
print("host copies per step, 1 and 8 microbatches:", runs)
sys.exit(0 if len(runs[0]) == 3 and runs[0][0] > 0 and len(set(runs[0] + runs[1])) == 1 else 1)
PY
then ok "host copies per step do not grow with the microbatch count"; else fail "host copies per step do not grow with the microbatch count"; fi

