#!/usr/bin/env bash
# The first hour, as a newcomer spends it with the README: every ready config trains for a few
# steps with `--set train.steps=N` (a warmup longer than the run is bounded, with a note) into
# its log.run_dir, and `report`, `sample` and `eval` read what it wrote; configs too large for
# this machine are priced by `plan`. The byte-level corpus from the one documented `prepare`
# command gives a tokenizer, so `sample` reads its checkpoints. A run's history is never lost:
# stopped, resumed twice with a failed start between, every step is in metrics.jsonl once, in
# order, each segment marked. SIGUSR2 (the flight recorder's signal) kills no cooktrain process,
# and a mistyped command gets a "did you mean". MoE's memory at start-up is the steps' and plan's.
. "$(dirname "$0")/../tools/lib_cli.sh"
# long: the BPE ready configs beyond moe-tiny (tiny, llama-tiny)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ensure_test_data
bytes=$TEST_DATA

# ---- a run's history: appended, never truncated --------------------------------------------------
if selected history; then
d=$tmp/history
hist=(train --config configs/test-tiny.yaml --set train.threads=1 --set data.train="$bytes/train.bin"
      --set train.steps=8 --set log.interval=1 --set checkpoint.dir="$d/ck" --set log.run_dir="$d")
expect_exit 0 "history: train, stopped after step 3" -- "$BIN" "${hist[@]}" --set train.stop_after=3
expect_exit 2 "history: a start that fails (a bad key) in between" -- "$BIN" "${hist[@]}" --set train.bogus=1
expect_exit 2 "history: a start that fails (its data missing) in between" -- "$BIN" "${hist[@]}" \
    --set data.train="$tmp/none.bin"
expect_exit 0 "history: resumed, stopped after step 5" -- "$BIN" "${hist[@]}" --set train.stop_after=5
expect_exit 0 "history: resumed to the end" -- "$BIN" "${hist[@]}"
if out=$(python3 - "$d/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows if "loss" in r]
starts = [(r["start_step"], r["resumed_from"].rsplit("/", 1)[-1]) for r in rows if r.get("setup")]
if steps != list(range(1, 9)):
    sys.exit(f"steps {steps}")
if starts != [(1, ""), (4, "step-00000003"), (6, "step-00000005")]:
    sys.exit(f"segments {starts}")
print(f"steps 1-8 once; segments start at {[s for s, _ in starts]}")
PY
); then ok "history: $out"; else fail "history: $out"; fi
if [ -s "$d/config.yaml" ] && [ -s "$d/config-to-step-3.yaml" ] && [ -s "$d/config-to-step-5.yaml" ]; then
    ok "history: each segment's config kept (config-to-step-3.yaml, config-to-step-5.yaml, config.yaml)"
else
    fail "history: each segment's config kept: $(ls "$d" | tr '\n' ' ')"
fi
expect_exit 0 "history: report reads the whole run" -- "$BIN" report "$d" -o "$tmp/history.html"
fi

# ---- signals and names ------------------------------------------------------------------------------
# usr2_survives WHAT -- command...: SIGUSR2 a second in; the command still ends with status 0.
usr2_survives() {
    local what=$1
    shift 2
    "$@" >"$tmp/usr2.txt" 2>&1 &
    local pid=$!
    sleep 1
    kill -USR2 "$pid" 2>/dev/null
    wait "$pid"
    local rc=$?
    if [ "$rc" = 0 ] && grep -q "SIGUSR2: nothing to record here" "$tmp/usr2.txt"; then
        ok "SIGUSR2 to $what: noted, not fatal"
    else
        fail "SIGUSR2 to $what: exit $rc"
        tail -3 "$tmp/usr2.txt" | sed 's/^/    /'
    fi
}
if selected usr2; then
usr2_survives "a one-process train" -- "$BIN" train --config configs/test-tiny.yaml \
    --set train.threads=1 --set data.train="$bytes/train.bin" --set train.steps=40
usr2_survives "plan --search" -- "$BIN" plan --config configs/llama3-8b.yaml --search 65536
expect_exit 2 "a mistyped command" -- "$BIN" trian --config configs/test-tiny.yaml
expect_text "did you mean 'train'?" "a mistyped command: did you mean"
expect_exit 2 "train without --config" -- "$BIN" train
expect_text "is --config missing?" "train without --config: says what is missing"
fi

# ---- the byte-level corpus: one prepare command, a tokenizer, sample and eval --------------------
if selected bytes; then
b=$tmp/bytes
if expect_exit 0 "prepare --byte-level --vocab-size 123 --replace-unknown (the README's command)" -- \
    "$BIN" prepare --input /usr/share/games/fortunes --byte-level --vocab-size 123 --replace-unknown --out "$b"; then
    if [ -s "$b/tokenizer.bin" ]; then ok "byte-level: tokenizer.bin written"; else fail "byte-level: no tokenizer.bin"; fi
    expect_exit 0 "byte-level: test-tiny trains on it" -- "$BIN" train --config configs/test-tiny.yaml \
        --set train.threads=1 --set data.train="$b/train.bin" --set data.val="$b/val.bin" \
        --set data.tokenizer="$b/tokenizer.bin" --set log.sample_tokens=8 --set train.steps=3 \
        --set checkpoint.dir="$b/ck"
    expect_text "---- sample" "byte-level: the run's own sample, through its tokenizer"
fi
# a checkpoint whose config names no tokenizer: its tokens are bytes (test-tiny's vocabulary 123)
expect_exit 0 "byte-level: a checkpoint without a tokenizer" -- "$BIN" train --config configs/test-tiny.yaml \
    --set train.threads=1 --set data.train="$bytes/train.bin" --set train.steps=2 --set checkpoint.dir="$tmp/ck"
expect_exit 0 "byte-level: sample reads it" -- "$BIN" sample "$tmp/ck" --tokens 8 --prompt "Hi"
expect_text "reading tokens as bytes" "byte-level: sample says how it decodes"
expect_exit 2 "byte-level: a prompt byte outside the vocabulary" -- "$BIN" sample "$tmp/ck" --prompt "{"
expect_text "outside the model's vocabulary of 123" "byte-level: the refusal names the vocabulary"
expect_exit 0 "byte-level: eval reads it" -- "$BIN" eval "$tmp/ck" --data "$bytes/val.bin" --samples 8
fi

# ---- the ready configs, as a newcomer runs them ---------------------------------------------------
selected ready || exit 0
bpe=$BUILD/test-data/fortunes # what `make data` puts in data/fortunes
if [ ! -s "$bpe/val.bin" ]; then
    "$BIN" prepare --input /usr/share/games/fortunes --vocab-size 4096 --out "$bpe.tmp" >/dev/null &&
        rm -rf "$bpe" && mv "$bpe.tmp" "$bpe" || fail "prepare the BPE corpus"
fi
# ready NAME DATA: trains configs/NAME.yaml for 2 steps on DATA's shards into its run_dir, then
# report, sample and eval on what it wrote.
ready() {
    local name=$1 data=$2 r=$tmp/ready/$1
    local set=(--set train.steps=2 --set log.run_dir="$r" --set checkpoint.dir="$r/ck"
               --set data.train="$data/train.bin" --set data.val="$data/val.bin")
    [ -s "$data/tokenizer.bin" ] && set+=(--set data.tokenizer="$data/tokenizer.bin")
    expect_exit 0 "$name: train --set train.steps=2" -- "$BIN" train --config "configs/$name.yaml" "${set[@]}" || return
    TRAIN_OUT=$OUT_TEXT
    if [ "$(awk '$1 == "warmup_steps:" { print $2 }' "configs/$name.yaml")" -gt 2 ]; then
        expect_text "the learning rate warms up over all 2 steps" "$name: the warmup bounded by the run, with a note"
    fi
    if [ "$(grep -c '"loss"' "$r/metrics.jsonl" 2>/dev/null)" = 2 ]; then ok "$name: metrics in its run_dir"; else fail "$name: no metrics in $r"; fi
    expect_exit 0 "$name: report" -- "$BIN" report "$r"
    expect_exit 0 "$name: sample" -- "$BIN" sample "$r/ck" --tokens 8
    expect_exit 0 "$name: eval" -- "$BIN" eval "$r/ck" --data "$data/val.bin" --samples 4
}
ready test-tiny "$bytes"
ready moe-tiny "$bpe"
# MoE's memory, said three ways: at start-up (what the routed rows will add), in the steps, and
# by plan (formatted to 0.1 MiB: equal within 0.1)
train_out=$TRAIN_OUT
expect_exit 0 "moe-tiny: plan" -- "$BIN" plan --config configs/moe-tiny.yaml
if out=$(python3 - "$train_out" "$OUT_TEXT" <<'PY'
import re, sys
train, plan = sys.argv[1], sys.argv[2]
start = re.search(r"^memory in the steps \(rank 0\): ([0-9.]+) MiB", train, re.M)
steps = re.findall(r"\| mem ([0-9.]+) MiB", train)
acts0 = re.search(r"^memory \(rank 0\):.* acts ([0-9.]+) MiB", train, re.M)
more = re.search(r"the above \+ acts ([0-9.]+) MiB", train)
row = re.search(r"^ +0 \|(.*)$", plan, re.M)
if not (start and steps and acts0 and more and row):
    sys.exit("a memory line is missing")
plan_acts = float(row.group(1).split("|")[5].split("MiB")[0])
mine = float(acts0.group(1)) + float(more.group(1))
print(f"start-up {start.group(1)} MiB, steps {set(steps)} MiB; acts {mine:.1f} MiB, plan {plan_acts} MiB")
sys.exit(not (set(steps) == {start.group(1)} and abs(mine - plan_acts) <= 0.11))
PY
); then ok "moe-tiny: memory at start-up, in the steps and by plan agree: $out"; else fail "moe-tiny: memory: $out"; fi
if long_part "the ready configs tiny and llama-tiny"; then
    ready tiny "$bpe"
    ready llama-tiny "$bpe"
fi
for name in gpt2-124m llama-125m long-context llama3-8b gpt2-moe-3b; do
    expect_exit 0 "$name: plan" -- "$BIN" plan --config "configs/$name.yaml"
done
