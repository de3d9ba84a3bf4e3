#!/usr/bin/env bash
# Sampling after training (log.sample_tokens) in every kind of layout: tensor parallel (the
# vocabulary split over tp: each rank draws over its own rows, sampler.h), sequence parallel,
# pipelines (the window goes through the stages on a forward-only schedule), ZeRO-3 (units
# gathered during the sampler's forwards), 3D, and context parallelism (each cp rank runs its
# positions of the window through the ring; the rank holding the last real position draws and
# the others receive the token) — each must print exactly the text a
# world-size-1 run with the same seed prints (core/README.md, Determinism). The vocabulary (500,
# padded to 512) leaves padding rows on the last tp rank, which the draw must skip.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
ensure_test_data

head -c 300000 "$TEST_TEXT" >"$tmp/text.txt"
expect_exit 0 "prepare a 500-token BPE corpus" -- "$BIN" prepare --input "$tmp/text.txt" --vocab-size 500 --out "$tmp/data"
base=(train --config configs/test-tiny.yaml --set train.threads=1 --set model.vocab_size=500
      --set data.train="$tmp/data/train.bin" --set data.tokenizer="$tmp/data/tokenizer.bin"
      --set log.sample_tokens=40 --set log.sample_prompt="The meaning of")

# The text between the sample markers.
sample_of() { printf '%s\n' "$1" | sed -n '/^---- sample/,/^-----------------------------$/p'; }

if expect_exit 0 "world size 1 samples" -- "$BIN" "${base[@]}"; then
    ref=$(sample_of "$OUT_TEXT")
    if [ "$(printf '%s\n' "$ref" | wc -l)" -ge 3 ]; then ok "the reference sample is printed"; else fail "the reference sample is printed"; fi
    # np  settings
    while read -r np settings; do
        # shellcheck disable=SC2086
        if expect_exit 0 "sample at np=$np $settings" -- "${MPIRUN[@]}" -np "$np" "$BIN" "${base[@]}" $settings; then
            got=$(sample_of "$OUT_TEXT")
            if [ "$got" = "$ref" ]; then
                ok "np=$np $settings: the same sample as world size 1"
            else
                fail "np=$np $settings: the same sample as world size 1"
                diff <(printf '%s\n' "$ref") <(printf '%s\n' "$got") | head -6 | sed 's/^/    /'
            fi
        fi
    done <<'RUNS'
2 --set parallel.tp=2
4 --set parallel.tp=4 --set parallel.sequence_parallel=true
2 --set parallel.dp=2 --set parallel.zero_stage=3
2 --set parallel.pp=2
4 --set parallel.pp=4
4 --set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2
8 --set parallel.tp=2 --set parallel.pp=2 --set parallel.zero_stage=3 --set parallel.sequence_parallel=true --set train.recompute=full
2 --set parallel.cp=2
4 --set parallel.cp=4 --set parallel.cp_sharding=contiguous
4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
4 --set parallel.cp=2 --set parallel.pp=2
2 --set parallel.pp=2 --set parallel.schedule=zbv --set parallel.virtual_stages=2
4 --set parallel.pp=2 --set parallel.cp=2 --set parallel.schedule=zbv --set parallel.virtual_stages=2
RUNS
fi
