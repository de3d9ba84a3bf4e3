#!/usr/bin/env bash
# Untrusted input, as an attacker would craft it: checkpoints whose manifest is re-signed after a
# field was changed (test/tools/craft_ckpt.py recomputes the checksum, so the checks behind it are what
# is tested), files replaced by FIFOs, directories, symlink loops, /dev/zero and sparse giants,
# manifests cut at every header boundary, rank files and manifests swapped between ranks, steps
# and runs, shards and tokenizers replaced the same way. Every case
# must exit 2 with a message naming the file and the field, within the timeout (no hang), and
# leave the checkpoint directory byte for byte as it was; two cases run under mpirun, where every
# rank must agree. A resume before the checks indexed a per-step array with a negative step,
# allocated what a wrapped count asked for, and blocked forever opening a FIFO.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
equivalence_setup
craft=test/tools/craft_ckpt.py

# a pristine 2-step checkpoint of test-tiny
expect_exit 0 "hostile: a 2-step run saves a checkpoint" -- "$BIN" "${base[@]}" \
    --set train.steps=2 --set train.warmup_steps=1 --set checkpoint.dir="$tmp/ck" \
    --set checkpoint.interval=2
good=$tmp/ck/step-00000002
[ -f "$good/manifest.bin" ] || fail "hostile: no checkpoint at $good"

# every entry's name, type, size and time, and the contents of those under 100 MiB (not the sparse
# 64 GiB file: reading it would take minutes)
tree_sum() {
    (cd "$1" && find . -printf '%p %y %s %T@\n' | sort &&
        find . -type f -size -100M -exec md5sum {} + | sort) | md5sum
}

# resume_case NAME TEXT SETUP...: copies the pristine checkpoint to $c, runs SETUP (a shell
# snippet using $c), resumes from it (train.steps=4) and expects exit 2, TEXT in the output, and
# the directory unchanged.
resume_case() {
    local name=$1 text=$2 setup=$3 np=${4:-1} before
    c=$tmp/case
    rm -rf "$c" "$tmp/out"
    cp -r "$good" "$c"
    eval "$setup"
    before=$(tree_sum "$c")
    local cmd=("$BIN" "${base[@]}" --set train.steps=4 --set train.warmup_steps=1
               --set checkpoint.resume="$c" --set checkpoint.dir="$tmp/out")
    if [ "$np" = 1 ]; then
        expect_exit 2 "hostile: $name" -- timeout 60 "${cmd[@]}"
    else
        mpi_setup
        expect_exit 2 "hostile: $name (np=$np, every rank agrees)" -- timeout 120 \
            "${MPIRUN[@]}" -np "$np" "${cmd[@]}"
    fi
    expect_text "$text" "hostile: $name: the message says '$text'"
    if [ "$(tree_sum "$c")" = "$before" ]; then
        ok "hostile: $name: the checkpoint directory is unchanged"
    else
        fail "hostile: $name: the checkpoint directory changed"
    fi
}

# ---- re-signed manifests: the train state ----------------------------------------------------
resume_case "step -1" "train-state field step is -1" "python3 $craft \$c state step -1"
resume_case "step 2^62" "at step 4611686018427387904, past this run's train.steps=4" \
    "python3 $craft \$c state step $((1 << 62))"
resume_case "step past train.steps" "past this run's train.steps=4" "python3 $craft \$c state step 5"
resume_case "optimizer_step -1" "optimizer_step is -1" "python3 $craft \$c state optimizer_step -1"
resume_case "optimizer_step 2^63-1" "optimizer_step is 9223372036854775807" \
    "python3 $craft \$c state optimizer_step 0x7fffffffffffffff"
resume_case "samples_seen inconsistent" "samples_seen" "python3 $craft \$c state samples_seen 7"
resume_case "world_size inconsistent" "world_size" "python3 $craft \$c state world_size 0"
resume_case "zero_stage 9" "zero_stage is 9" "python3 $craft \$c state zero_stage 9"
resume_case "precision 7" "precision is 7" "python3 $craft \$c state precision 7"
resume_case "step -1 under mpirun" "train-state field step is -1" "python3 $craft \$c state step -1" 2

# ---- re-signed manifests: counts, offsets, boxes ---------------------------------------------
n=$(python3 -c "import struct;print(struct.unpack_from('<q',open('$good/manifest.bin','rb').read(),24)[0])")
resume_case "n_pieces wrapping n x 152 around 2^64" "do not fit" \
    "python3 $craft \$c header n_pieces $((n + (1 << 61)))"
resume_case "n_pieces 2^63-1" "do not fit" "python3 $craft \$c header n_pieces 0x7fffffffffffffff"
resume_case "n_pieces -1" "do not fit" "python3 $craft \$c header n_pieces -1"
resume_case "n_files 0" "field n_files is 0" "python3 $craft \$c header n_files 0"
resume_case "n_files 2^31-1" "field n_files is 2147483647" "python3 $craft \$c header n_files 0x7fffffff"
resume_case "n_files 2^32-1" "field n_files is 4294967295" "python3 $craft \$c header n_files 0xffffffff"
resume_case "config_bytes 2^31" "do not fit" "python3 $craft \$c header config_bytes $((1 << 31))"
resume_case "piece kind 7" "impossible box or file" "python3 $craft \$c piece 0 kind 7"
resume_case "piece file -1" "impossible box or file" "python3 $craft \$c piece 0 file -1"
resume_case "piece file past n_files" "impossible box or file" "python3 $craft \$c piece 0 file 1"
resume_case "piece hi 2^62" "impossible box or file" "python3 $craft \$c piece 0 hi $((1 << 62))"
resume_case "piece rows x cols wrapping" "impossible box or file" \
    "python3 $craft \$c piece 0 row1 $((1 << 40)) && python3 $craft \$c piece 0 rows $((1 << 40)) && python3 $craft \$c piece 0 col1 $((1 << 40)) && python3 $craft \$c piece 0 cols $((1 << 40))"
resume_case "piece offset 2^63-1 (offset + bytes wraps)" "impossible box or file" \
    "python3 $craft \$c piece 0 offset 0x7fffffffffffffff"
resume_case "piece offset -1" "impossible box or file" "python3 $craft \$c piece 0 offset -1"
resume_case "two pieces on the same bytes" "share bytes of rank file" \
    "python3 $craft \$c piece 1 offset piece:0"

# ---- the manifest cut at every header boundary (no re-signing) -------------------------------
for cut in 0 8 12 16 20 24 32 40 63 64 100; do
    resume_case "manifest cut to $cut bytes" "manifest.bin" "python3 $craft \$c truncate $cut"
done

# ---- files that are not regular files --------------------------------------------------------
resume_case "manifest is a FIFO" "is a pipe, not a regular file" 'rm "$c/manifest.bin" && mkfifo "$c/manifest.bin"'
resume_case "manifest is a directory" "is a directory, not a regular file" 'rm "$c/manifest.bin" && mkdir "$c/manifest.bin"'
resume_case "manifest is a symlink loop" "Too many levels of symbolic links" 'rm "$c/manifest.bin" && ln -s manifest.bin "$c/manifest.bin"'
resume_case "manifest is /dev/zero" "is a character device, not a regular file" 'rm "$c/manifest.bin" && ln -s /dev/zero "$c/manifest.bin"'
resume_case "manifest is a sparse 64 GiB file" "larger than the" 'truncate -s 64G "$c/manifest.bin"'
resume_case "rank file is a FIFO" "is a pipe, not a regular file" 'rm "$c/rank-00000.bin" && mkfifo "$c/rank-00000.bin"'
resume_case "rank file is a directory" "is a directory, not a regular file" 'rm "$c/rank-00000.bin" && mkdir "$c/rank-00000.bin"'
resume_case "rank file is a FIFO under mpirun" "is a pipe, not a regular file" 'rm "$c/rank-00000.bin" && mkfifo "$c/rank-00000.bin"' 2

# ---- files swapped between ranks, steps and runs ---------------------------------------------
# Two runs of 2 ranks with sharded optimizer state (every rank writes a file), each saving at
# steps 2 and 4, from different seeds: every file below is a genuine one, only not this
# checkpoint's. A rank file's header names its rank, each piece's checksum its values, and the
# manifest the seed.
mpi_setup
for run in a b; do
    seed=1234
    [ $run = b ] && seed=99
    expect_exit 0 "hostile: run $run (seed $seed) saves at steps 2 and 4 on 2 ranks" -- \
        "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" --set train.steps=4 --set train.warmup_steps=1 \
        --set parallel.zero_stage=1 --set train.seed=$seed --set checkpoint.dir="$tmp/$run" \
        --set checkpoint.interval=2
done
good=$tmp/a/step-00000004
swap01='mv "$c/rank-00000.bin" "$c/x" && mv "$c/rank-00001.bin" "$c/rank-00000.bin" && mv "$c/x" "$c/rank-00001.bin"'
resume_case "rank files swapped between ranks" "header names another rank" "$swap01"
resume_case "rank files swapped between ranks, under mpirun" "header names another rank" "$swap01" 2
resume_case "a rank file from an earlier step" "does not match" 'cp "$tmp/a/step-00000002/rank-00001.bin" "$c/"'
resume_case "a rank file from another run" "does not match" 'cp "$tmp/b/step-00000004/rank-00000.bin" "$c/"'
resume_case "the manifest from an earlier step" "does not match" 'cp "$tmp/a/step-00000002/manifest.bin" "$c/"'
resume_case "the manifest from another run" "was written with train.seed=99" 'cp "$tmp/b/step-00000004/manifest.bin" "$c/"'

# ---- shards and tokenizers -------------------------------------------------------------------
mkfifo "$tmp/fifo"
mkdir "$tmp/dir"
expect_exit 2 "hostile: a FIFO as data.train" -- timeout 60 "$BIN" "${base[@]}" --set train.steps=1 \
    --set train.warmup_steps=0 --set data.train="$tmp/fifo"
expect_text "is a pipe, not a regular file" "hostile: a FIFO shard: the message says so"
expect_exit 2 "hostile: /dev/zero as data.train" -- timeout 60 "$BIN" "${base[@]}" --set train.steps=1 \
    --set train.warmup_steps=0 --set data.train=/dev/zero
expect_text "is a character device, not a regular file" "hostile: /dev/zero shard: the message says so"
tok=(--set train.steps=1 --set train.warmup_steps=0 --set log.sample_tokens=4)
expect_exit 2 "hostile: a FIFO as data.tokenizer" -- timeout 60 "$BIN" "${base[@]}" "${tok[@]}" \
    --set data.tokenizer="$tmp/fifo"
expect_text "is a pipe, not a regular file" "hostile: a FIFO tokenizer: the message says so"
expect_exit 2 "hostile: a directory as data.tokenizer" -- timeout 60 "$BIN" "${base[@]}" "${tok[@]}" \
    --set data.tokenizer="$tmp/dir"
expect_text "is a directory, not a regular file" "hostile: a directory tokenizer: the message says so"
mkdir "$tmp/insp" && mkfifo "$tmp/insp/manifest.bin"
expect_exit 2 "hostile: inspect of a checkpoint whose manifest is a FIFO" -- timeout 60 "$BIN" inspect "$tmp/insp"
expect_text "is a pipe, not a regular file" "hostile: inspect: the message says so"
