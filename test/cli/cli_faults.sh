#!/usr/bin/env bash
# Bad input and runtime faults in the middle of a run (core/README.md, Errors): each ends every rank
# with the right exit code (2 bad input, 1 runtime) and one message naming the problem — never an
# assertion, never a hang until the watchdog.
#   - a token id out of range in a shard read by one rank only (checked as samples are read);
#   - the metrics file on a full disk (/dev/full), and log.run_dir's config.yaml on one;
#   - out of memory: at start (agreed on), in a pipeline's gradient send buffer mid-step (the
#     job ends with the rank and the allocation named), in the sampler on one rank (agreed on).
# COOKTRAIN_MEM_LIMIT_MB caps a rank's backend memory and COOKTRAIN_FAIL_ALLOC=<category> fails
# every allocation of one category (core/backend/backend.h).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup
short=(--set train.steps=2 --set train.warmup_steps=1)

# exactly_one_message WHAT: the agreed message was printed once (rank 0), not per rank.
exactly_one_message() {
    local n
    n=$(printf '%s\n' "$OUT_TEXT" | grep -c '^cooktrain:')
    if [ "$n" = 1 ]; then ok "$1: one message"; else fail "$1: one message (got $n)"; fi
}

# ---- a corrupt token in the shard of rank 1 only -------------------------------------------
# Every 33rd token (the sample length) is set to 200, above the shard's vocab_size 123, so the
# first sample rank 1 reads holds one; rank 0 reads a clean copy and would go on into the
# step's collectives if the ranks did not agree first.
mkdir -p "$tmp/rank0" "$tmp/rank1"
cp "$TEST_DATA/train.bin" "$tmp/rank0/train.bin"
python3 - "$TEST_DATA/train.bin" "$tmp/rank1/train.bin" <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
for pos in range(64, len(data) - 1, 2 * 33):  # 64-byte header, 2-byte tokens
    data[pos:pos + 2] = (200).to_bytes(2, "little")
open(sys.argv[2], "wb").write(data)
PY
rank_dirs_command "$tmp"
expect_exit 2 "a token id out of range on one rank" -- "${RANK_CMD[@]}"
expect_text "rank 1: data shard train.bin is corrupt: token 200" "the bad token, its shard and the rank are named"
expect_text "hint:" "the bad token has a hint"
exactly_one_message "the bad token"

# ---- full disks -----------------------------------------------------------------------------
expect_exit 1 "metrics on a full disk (/dev/full), 2 ranks" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" \
    "${short[@]}" --set log.metrics=/dev/full
expect_text "cannot write the metrics file '/dev/full': No space left on device" "the full metrics file is named"
exactly_one_message "the full metrics file"
mkdir -p "$tmp/run"
ln -s /dev/full "$tmp/run/config.yaml.tmp" # written whole there, then renamed
expect_exit 1 "log.run_dir on a full disk" -- "$BIN" "${base[@]}" "${short[@]}" --set log.run_dir="$tmp/run"
expect_text "config.yaml' in log.run_dir: No space left on device" "the full run_dir file is named"

# ---- out of memory ----------------------------------------------------------------------------
expect_exit 1 "out of memory at start (pipeline activations), 2 ranks" -- env COOKTRAIN_MEM_LIMIT_MB=7 \
    "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" "${short[@]}" --set parallel.pp=2
expect_text "for acts" "the category is named"
expect_text "limit 7.0 MiB" "the limit is named"
exactly_one_message "out of memory at start"

expect_exit 1 "out of memory mid-step (a pipeline's gradient send buffer)" -- env COOKTRAIN_FAIL_ALLOC=comm \
    "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" "${short[@]}" --set parallel.pp=2
expect_text "rank 1 (pipeline stage 1), a gradient send buffer: out of cpu memory: could not allocate 16384 bytes" \
    "the rank, the buffer and its bytes are named"
expect_text "for comm" "the category is named"

# The sampler's memory on rank 0 only: rank 0's memory after training (the metrics) plus 1/16
# MiB — less than its key/value cache (8 layers of 32 rows of 128 floats: 1/8 MiB) — so only its
# sampler allocation fails.
head -c 300000 "$TEST_TEXT" >"$tmp/text.txt"
"$BIN" prepare --input "$tmp/text.txt" --vocab-size 500 --out "$tmp/bpe" >/dev/null
sample=(--set model.vocab_size=500 --set data.train="$tmp/bpe/train.bin" --set data.tokenizer="$tmp/bpe/tokenizer.bin"
        --set log.sample_tokens=5 --set parallel.pp=2)
if expect_exit 0 "a run that samples (pp=2)" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" "${short[@]}" \
    "${sample[@]}" --set log.metrics="$tmp/sample.jsonl"; then
    limit=$(python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(r[-1]["mem_bytes"] / 1048576 + 0.0625)' "$tmp/sample.jsonl")
    expect_exit 1 "out of memory in the sampler on rank 0 only" -- "${MPIRUN[@]}" -np 2 bash -c \
        'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then export COOKTRAIN_MEM_LIMIT_MB=$0; fi; exec "$@"' \
        "$limit" "$BIN" "${base[@]}" "${short[@]}" "${sample[@]}"
    expect_text "for acts" "the sampler's allocation is named"
    exactly_one_message "out of memory in the sampler"
fi
