#!/usr/bin/env bash
# Prepares a corpus from the English text of Debian's fortunes package (the plain-text files of
# /usr/share/games/fortunes in name order, not the .dat indexes or .u8 links; scripts/setup.sh
# installs the package). Skips the work when DIR already holds its files.
#
#   scripts/prepare_corpus.sh BIN DIR                a 4096-token BPE tokenizer and train/val
#                                                    shards (configs/tiny.yaml, `make run`)
#   scripts/prepare_corpus.sh --byte-level BIN DIR   DIR/text.txt: the text with every byte
#                                                    outside tab, newline and ' '..'z' replaced
#                                                    by a space (what the tests tokenize); and
#                                                    byte-level train/val shards of the corpus
#                                                    so replaced, tokens < 123, and tokenizer.bin
#                                                    (configs/test-tiny.yaml, the test suite)
set -euo pipefail
byte_level=0
if [ "${1:-}" = "--byte-level" ]; then
    byte_level=1
    shift
fi
if [ $# -ne 2 ]; then
    echo "usage: scripts/prepare_corpus.sh [--byte-level] path/to/cooktrain DIR" >&2
    exit 2
fi
bin=$1
out=$2
src=/usr/share/games/fortunes
if [ ! -d "$src" ]; then
    echo "prepare_corpus: $src not found" >&2
    echo "hint: run 'bash scripts/setup.sh' (it installs Debian's fortunes package)" >&2
    exit 2
fi

if [ $byte_level = 0 ]; then
    if [ -f "$out/tokenizer.bin" ] && [ -f "$out/train.bin" ] && [ -f "$out/val.bin" ]; then
        exit 0
    fi
    "$bin" prepare --input "$src" --vocab-size 4096 --out "$out"
    exit 0
fi

if [ -f "$out/text.txt" ] && [ -f "$out/train.bin" ] && [ -f "$out/val.bin" ]; then
    exit 0
fi
mkdir -p "$out"
# The plain-text files only: no extension (the .dat indexes and .u8 links have one).
files=$(find "$src" -maxdepth 1 -type f ! -name '*.*' | LC_ALL=C sort)
# Written under a temporary name and renamed, so an interrupted run is redone, not half-used.
# shellcheck disable=SC2086
cat $files | LC_ALL=C tr -c '\t\n -z' ' ' >"$out/text.txt.tmp"
mv "$out/text.txt.tmp" "$out/text.txt"
# the shards: the README's command for test-tiny.yaml's data
"$bin" prepare --input "$src" --byte-level --vocab-size 123 --replace-unknown --out "$out"
