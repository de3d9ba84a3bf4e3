#!/usr/bin/env bash
# Prepares the default corpus for `make run` once: the English text of Debian's fortunes
# package (the plain-text files, not the .dat indexes or .u8 copies), a 4096-token BPE, and
# train/val shards in DIR. Skips the work when DIR already holds all three files.
#   usage: scripts/prepare_corpus.sh path/to/cooktrain DIR
set -euo pipefail
bin=$1
out=$2
src=/usr/share/games/fortunes
if [ -f "$out/tokenizer.bin" ] && [ -f "$out/train.bin" ] && [ -f "$out/val.bin" ]; then
    exit 0
fi
if [ ! -d "$src" ]; then
    echo "prepare_corpus: $src not found" >&2
    echo "hint: run 'bash scripts/setup.sh' (it installs Debian's fortunes package)" >&2
    exit 2
fi
"$bin" prepare --input "$src" --vocab-size 4096 --out "$out"
