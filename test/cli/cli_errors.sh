#!/usr/bin/env bash
# Bad input through the real binary: every malformed config in test/cli/bad_configs (its first line
# says "# expect: <text>"), bad command lines, missing and corrupt data files. Each must end
# with exit code 2, a message that names the problem, and a hint line. And the command line's
# own help: `cooktrain --help`, `cooktrain COMMAND --help` and `--version` (exit 0, on stdout).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for f in test/cli/bad_configs/*.yaml; do
    want=$(head -1 "$f" | sed -n 's/^# expect: //p')
    name=$(basename "$f")
    if expect_exit 2 "bad config $name" -- "$BIN" train --config "$f" --print-config; then
        expect_text "$want" "bad config $name names '$want'"
        expect_text "hint:" "bad config $name has a hint"
    fi
done

expect_exit 2 "missing config file" -- "$BIN" train --config "$tmp/nope.yaml"
expect_text "nope.yaml" "missing config file is named"
# A config that is not a regular file is refused at once: /dev/zero used to be read forever.
expect_exit 2 "config that is a device (/dev/zero) is refused, no hang" -- "$BIN" train --config /dev/zero
expect_text "character device" "the device config is named for what it is"
mkfifo "$tmp/pipe.yaml"
expect_exit 2 "config that is a pipe with no writer is refused, no hang" -- "$BIN" train --config "$tmp/pipe.yaml"
expect_text "hint:" "the pipe config has a hint"
head -c 2000000 /dev/zero | tr '\0' '#' >"$tmp/huge.yaml"
expect_exit 2 "config over the size cap" -- "$BIN" train --config "$tmp/huge.yaml"
expect_text "KiB" "the size cap is named"
expect_exit 2 "unknown option" -- "$BIN" train --bogus
expect_text "hint:" "unknown option has a hint"
expect_exit 2 "unknown command" -- "$BIN" frobnicate
expect_exit 2 "--set without '='" -- "$BIN" train --set train.steps
expect_exit 2 "--set unknown key" -- "$BIN" train --set train.stepz=3
expect_text "train.steps" "--set unknown key suggests train.steps"
expect_exit 2 "--set bad value" -- "$BIN" train --set train.lr=fast
expect_text "train.lr" "--set bad value names train.lr"
# The backend registry: with a valid config, so the refusal is the backend's.
ensure_test_data
valid=(train --config configs/test-tiny.yaml --set train.threads=1 --set data.train="$TEST_DATA/train.bin"
       --set train.steps=2 --set train.warmup_steps=1)
# parallel.auto_layout on one process: dp 2 does not fit, the planner chooses tp 1 x pp 1 x dp 1
# and the run goes on; tp 3 fits no world of 1, refused with the layout's own reason
expect_exit 0 "auto_layout: dp 2 on one process" -- "$BIN" "${valid[@]}" --set parallel.dp=2 \
    --set parallel.auto_layout=true --print-config
expect_text "parallel.auto_layout: tp 1 x pp 1 x dp 2 does not fit 1 rank; chose tp 1 x pp 1 x dp 1" \
    "auto_layout: the choice for one process is said"
expect_exit 2 "auto_layout: tp 3 on one process" -- "$BIN" "${valid[@]}" --set parallel.tp=3 \
    --set parallel.auto_layout=true
expect_text "parallel.auto_layout: no layout keeping tp=3, cp=1 and the global batch fits 1 rank" \
    "auto_layout: the refusal says what it kept"
expect_text "hint:" "auto_layout: the refusal has a hint"
# A build with the CUDA backend (cuda/cuda.mk) refuses it here for want of a GPU (cli_cuda.sh has
# more); one without refuses it as not built.
if [ -f "$BUILD/libcooktrain-cuda.so" ]; then
    cuda_refusal="no usable CUDA device (cudaError" names="cpu, cpu-async, cuda, auto"
    auto_why="backend: cpu (auto: no usable CUDA device"
else
    cuda_refusal="the CUDA backend is not part of this build" names="cpu, cpu-async, auto"
    auto_why="backend: cpu (auto: this build has no GPU backend)"
fi
expect_exit 2 "--backend cuda without a GPU or without CUDA" -- "$BIN" "${valid[@]}" --backend cuda
expect_text "$cuda_refusal" "--backend cuda says why it cannot run"
expect_text "hint: use --backend cpu" "--backend cuda has a hint"
expect_exit 2 "--backend of an unknown name" -- "$BIN" "${valid[@]}" --backend tpu
expect_text "'tpu' is not a backend" "the unknown backend is named"
expect_text "$names" "the hint lists the registered backends"
if expect_exit 0 "--backend auto falls back to cpu" -- "$BIN" "${valid[@]}" --backend auto; then
    expect_text "$auto_why" "auto says what it picked and why"
fi
if expect_exit 0 "--backend cpu-async trains" -- "$BIN" "${valid[@]}" --backend cpu-async; then
    expect_text "backend: cpu-async" "the asynchronous stream is named at start"
fi

# --print-config shows the resolved config with derived values, and reloads identically.
if expect_exit 0 "print-config" -- "$BIN" train --config configs/tiny.yaml --set train.micro_batch=4 --print-config; then
    expect_text "grad_accum" "print-config shows grad_accum"
    expect_text "vocab_padded" "print-config shows the padded vocabulary"
    printf '%s\n' "$OUT_TEXT" >"$tmp/resolved.yaml"
    first=$OUT_TEXT
    if expect_exit 0 "printed config loads again" -- "$BIN" train --config "$tmp/resolved.yaml" --print-config; then
        if [ "$first" = "$OUT_TEXT" ]; then ok "printed config round-trips"; else fail "printed config round-trips"; fi
    fi
fi

# Data files: missing, corrupt magic, truncated.
common=(--config configs/test-tiny.yaml --set train.steps=2)
expect_exit 2 "missing train shard" -- "$BIN" train "${common[@]}" --set data.train="$tmp/none*.bin"
expect_text "hint:" "missing train shard has a hint"
head -c 4096 /dev/urandom >"$tmp/garbage.bin"
expect_exit 2 "corrupt shard (bad magic)" -- "$BIN" train "${common[@]}" --set data.train="$tmp/garbage.bin"
expect_text "garbage.bin" "corrupt shard is named"
mkdir -p "$tmp/p"
ensure_test_data
head -c 100000 "$TEST_TEXT" >"$tmp/text.txt"
if expect_exit 0 "prepare a small corpus" -- "$BIN" prepare --input "$tmp/text.txt" --vocab-size 300 --out "$tmp/p"; then
    size=$(stat -c %s "$tmp/p/train.bin")
    head -c $((size - 1000)) "$tmp/p/train.bin" >"$tmp/truncated.bin"
    expect_exit 2 "truncated shard" -- "$BIN" train "${common[@]}" --set model.vocab_size=300 --set data.train="$tmp/truncated.bin"
    expect_text "truncated.bin" "truncated shard is named"
    expect_exit 2 "shard vocabulary larger than the model's" -- "$BIN" train "${common[@]}" --set model.vocab_size=200 --set data.train="$tmp/p/train.bin"
    expect_text "vocab" "vocabulary mismatch is explained"
    head -c 20 "$tmp/p/tokenizer.bin" >"$tmp/bad_tok.bin"
    expect_exit 2 "truncated tokenizer" -- "$BIN" train "${common[@]}" --set model.vocab_size=300 --set data.train="$tmp/p/train.bin" --set data.tokenizer="$tmp/bad_tok.bin" --set log.sample_tokens=5
    expect_text "bad_tok.bin" "truncated tokenizer is named"
fi
expect_exit 2 "prepare without --input" -- "$BIN" prepare --out "$tmp/q"
expect_exit 2 "prepare with a missing input" -- "$BIN" prepare --input "$tmp/missing.txt" --out "$tmp/q"
# the command line's own errors for prepare (cmd/args.h): each names the argument, with the usage
expect_exit 2 "prepare --vocab-size that is no integer" -- "$BIN" prepare --input "$TEST_TEXT" --out "$tmp/q" --vocab-size 12ab
expect_text "'12ab'" "prepare --vocab-size 12ab: the value is quoted"
expect_exit 2 "prepare --input with no file" -- "$BIN" prepare --input --out "$tmp/q"
expect_text "--input needs at least one value" "prepare --input with no file: says so"
expect_exit 2 "prepare with an option missing its value" -- "$BIN" prepare --input "$TEST_TEXT" --out "$tmp/q" --vocab-size
expect_text "--vocab-size needs a value" "prepare --vocab-size at the end: says it needs a value"
[ -e "$tmp/q" ] && fail "a refused prepare wrote $tmp/q" || ok "a refused prepare writes nothing"

# ---- --help, --version, unknown options ----------------------------------------------------------
commands=(train plan prepare inspect sample eval export)
if expect_exit 0 "cooktrain --help" -- "$BIN" --help; then
    for c in "${commands[@]}"; do expect_text "  $c " "cooktrain --help lists $c"; done
    expect_text "cooktrain --version" "cooktrain --help mentions --version"
fi
expect_exit 0 "cooktrain -h" -- "$BIN" -h
expect_exit 2 "cooktrain with no command prints the usage and fails" -- "$BIN"
expect_text "usage: cooktrain <command>" "cooktrain alone: the usage"
for c in "${commands[@]}"; do
    if expect_exit 0 "cooktrain $c --help" -- "$BIN" "$c" --help; then
        expect_text "usage: cooktrain $c" "cooktrain $c --help: its usage line"
    fi
done
expect_exit 0 "cooktrain help export" -- "$BIN" help export
expect_text "--dtype fp32|bf16" "cooktrain help export: export's options"
# --help anywhere on the line wins over the rest (nothing runs)
expect_exit 0 "--help after other options" -- "$BIN" train --config "$tmp/nope.yaml" --help
expect_text "--print-config" "--help after other options: train's help"
if expect_exit 0 "cooktrain --version" -- "$BIN" --version; then
    expect_text "cooktrain 0." "--version: the version"
    commit=$(git describe --always --dirty 2>/dev/null || echo unknown)
    # the build's commit (git describe: a hash or tag, maybe -dirty; "unknown" outside git), this
    # tree's or an earlier one's when the binary was built before an edit
    if printf '%s\n' "$OUT_TEXT" | grep -qE '^commit: [A-Za-z0-9._-]+$'; then
        ok "--version: the commit (this tree: $commit)"
    else
        fail "--version: no commit line"
        printf '%s\n' "$OUT_TEXT" | sed 's/^/    /'
    fi
    expect_text "backends: cpu, cpu-async" "--version: the backends"
    expect_text "precisions: fp32, bf16" "--version: the precisions"
fi
for c in "${commands[@]}"; do
    expect_exit 2 "cooktrain $c with an unknown option" -- "$BIN" "$c" --no-such-option
    expect_text "$c: unknown option '--no-such-option'" "cooktrain $c --no-such-option: names it"
    expect_text "hint: usage: cooktrain $c" "cooktrain $c --no-such-option: the usage in the hint"
    expect_text "cooktrain $c --help" "cooktrain $c --no-such-option: the hint points to --help"
done
expect_exit 2 "a flag given a value" -- "$BIN" plan --json=yes
expect_text "--json takes no value" "a flag given a value: says so"
expect_exit 2 "unknown command" -- "$BIN" frobnicate
expect_text "'frobnicate' is not a cooktrain command" "unknown command: named"
expect_text "train, plan, prepare, inspect, sample, eval, export" "unknown command: the hint lists the commands"
