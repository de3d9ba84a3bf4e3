#!/usr/bin/env bash
# Untrusted input, as an attacker would craft it: checkpoints whose manifest is re-signed after a
# field was changed (test/tools/craft_ckpt.py recomputes the checksum, so the checks behind it are what
# is tested), files replaced by FIFOs, directories, symlink loops, /dev/zero and sparse giants,
# manifests cut at every header boundary, rank files and manifests swapped between ranks, steps
# and runs, shards and tokenizers replaced the same way. Every case
# must exit 2 with a message naming the file and the field, within the timeout (no hang), and
# leave the checkpoint directory byte for byte as it was; two cases run under mpirun, where every
# rank must agree. A resume before the checks indexed a per-step array with a negative step,
# allocated what a wrapped count asked for, and blocked forever opening a FIFO. Then Hugging Face
# folders for `cooktrain import` (the last section says which).
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

# ---- Hugging Face folders for `cooktrain import` ---------------------------------------------
# A small Llama (and a GPT-2) written by the python below, F32, no numpy, then changed as an
# attacker would: config.json's sizes far past the files, overlaps hidden behind an empty tensor,
# NaN weights, surplus layers, a tensor under two names, a hostile --out (a file, a step of a
# checkpoint, links where import removes things, paths too long), broken indexes. Every refused
# case exits 2 naming the file and the field, with a hint, and leaves every file of the case's
# folder (model, --out, the victim a link points at) as it was. Two are not refused: a model of
# one position imports and samples, and a tied model's spare lm_head.weight is named in a warning.
hf=$tmp/hf.py
cat >"$hf" <<'PY'
import json, math, struct, sys

def shapes(c):
    V, C, F, L = c["vocab_size"], c.get("hidden_size", c.get("n_embd")), c.get("intermediate_size"), c.get("num_hidden_layers", c.get("n_layer"))
    if c["model_type"] == "gpt2":
        F = 4 * C
        t = [("wte.weight", [V, C]), ("wpe.weight", [c["n_positions"], C])]
        for l in range(L):
            p = "h.%d." % l
            t += [(p + "ln_1.weight", [C]), (p + "ln_1.bias", [C]), (p + "attn.c_attn.weight", [C, 3 * C]),
                  (p + "attn.c_attn.bias", [3 * C]), (p + "attn.c_proj.weight", [C, C]), (p + "attn.c_proj.bias", [C]),
                  (p + "ln_2.weight", [C]), (p + "ln_2.bias", [C]), (p + "mlp.c_fc.weight", [C, F]),
                  (p + "mlp.c_fc.bias", [F]), (p + "mlp.c_proj.weight", [F, C]), (p + "mlp.c_proj.bias", [C])]
        return t + [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    kv = c["num_key_value_heads"] * C // c["num_attention_heads"]
    t = [("model.embed_tokens.weight", [V, C])]
    for l in range(L):
        p = "model.layers.%d." % l
        t += [(p + "input_layernorm.weight", [C]), (p + "self_attn.q_proj.weight", [C, C]),
              (p + "self_attn.k_proj.weight", [kv, C]), (p + "self_attn.v_proj.weight", [kv, C]),
              (p + "self_attn.o_proj.weight", [C, C]), (p + "post_attention_layernorm.weight", [C]),
              (p + "mlp.gate_proj.weight", [F, C]), (p + "mlp.up_proj.weight", [F, C]), (p + "mlp.down_proj.weight", [C, F])]
    return t + [("model.norm.weight", [C])]

def load(d):
    raw = open(d + "/model.safetensors", "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])

def save(d, h, data):
    b = json.dumps(h).encode()
    open(d + "/model.safetensors", "wb").write(struct.pack("<Q", len(b)) + b + data)

cmd, d = sys.argv[1], sys.argv[2]
if cmd == "make":  # make DIR llama|gpt2: 2 layers, d_model 16, vocab 256, 8 positions
    if sys.argv[3] == "gpt2":
        c = dict(model_type="gpt2", vocab_size=256, n_positions=8, n_embd=16, n_layer=2, n_head=2)
    else:
        c = dict(model_type="llama", vocab_size=256, max_position_embeddings=8, hidden_size=16,
                 intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                 hidden_act="silu", rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)
    json.dump(c, open(d + "/config.json", "w"))
    h, data = {}, bytearray()
    for k, (name, shape) in enumerate(shapes(c)):
        n = math.prod(shape)
        v = [1.0 if len(shape) == 1 else 0.05 * math.sin(0.37 * i + k) for i in range(n)]
        h[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + 4 * n]}
        data += struct.pack("<%df" % n, *v)
    save(d, h, data)
elif cmd == "config":  # config DIR KEY JSON...
    c = json.load(open(d + "/config.json"))
    for k, v in zip(sys.argv[3::2], sys.argv[4::2]):
        c[k] = json.loads(v)
    json.dump(c, open(d + "/config.json", "w"))
elif cmd == "edit":  # edit DIR CODE: CODE changes the header h and the data bytes
    h, data = load(d)
    exec(sys.argv[3])
    save(d, h, data)
PY
hc=$tmp/hc
hf_tok=$tmp/hftok
head -c 20000 "$TEST_TEXT" >"$tmp/hftext.txt"
"$BIN" prepare --input "$tmp/hftext.txt" --vocab-size 256 --out "$hf_tok" >/dev/null ||
    fail "hostile import: a tokenizer of 256 tokens for sample"
for arch in llama gpt2; do
    mkdir -p "$tmp/hf-$arch" && python3 "$hf" make "$tmp/hf-$arch" $arch ||
        fail "hostile import: the python could not write a $arch model"
    expect_exit 0 "hostile import: the pristine $arch model imports" -- "$BIN" import "$tmp/hf-$arch" --out "$tmp/hf-$arch-ck"
done

# tree_files DIR: tree_sum but for the times of directories (an import that fails late, on a
# value, has made --out and removed it again: its parent's time changed, nothing else)
tree_files() {
    (cd "$1" && find . \( -type d -printf '%p d\n' \) -o -printf '%p %y %s %T@\n' | sort &&
        find . -type f -exec md5sum {} + | sort) | md5sum
}

# import_case NAME TEXT SETUP [ARGS...]: a fresh $hc holding the pristine Llama ($m), an empty
# out folder's parent and a victim folder ($v, one file); SETUP (a shell snippet: $m, $o, $v) may
# change them and set $o; then `import $m --out $o ARGS` must exit 2 saying TEXT and a hint, and
# leave every file under $hc as it was.
import_case() {
    local name=$1 text=$2 setup=$3 before
    shift 3
    rm -rf "$hc" && mkdir -p "$hc/victim" && cp -r "$tmp/hf-llama" "$hc/model"
    echo precious >"$hc/victim/keep"
    m=$hc/model o=$hc/out v=$hc/victim
    eval "$setup" || { fail "hostile import: $name: could not craft the case"; return; }
    before=$(tree_files "$hc")
    expect_exit 2 "hostile import: $name" -- timeout 60 "$BIN" import "$m" --out "$o" "$@"
    expect_text "$text" "hostile import: $name: the message says '$text'"
    expect_text "hint: " "hostile import: $name: with a hint"
    if [ "$(tree_files "$hc")" = "$before" ]; then
        ok "hostile import: $name: nothing written, nothing changed"
    else
        fail "hostile import: $name: the files changed"
        (cd "$hc" && find . | sort | head -20 | sed 's/^/    /')
    fi
}
edit() { python3 "$hf" edit "$m" "$1"; }
config() { python3 "$hf" config "$m" "$@"; }

# one position: eval and sample work (the sampler's window on one rank is the sequence itself,
# whatever its length: 1, or odd)
for case in "max_position_embeddings 1|" "--seq-len 3|3"; do
    IFS='|' read -r what seq <<<"$case"
    rm -rf "$hc" && cp -r "$tmp/hf-llama" "$hc"
    [ -n "$seq" ] || python3 "$hf" config "$hc" max_position_embeddings 1
    expect_exit 0 "hostile import: a model of $what imports" -- "$BIN" import "$hc" --out "$hc/ck" ${seq:+--seq-len $seq}
    expect_text "seq_len: ${seq:-1}" "hostile import: $what: the checkpoint's seq_len is ${seq:-1}"
    expect_exit 0 "hostile import: $what: sample draws from it" -- timeout 60 "$BIN" sample "$hc/ck" \
        --tokenizer "$hf_tok/tokenizer.bin" --tokens 5 --prompt "The cat"
    expect_text "---- sample (5 tokens) ----" "hostile import: $what: sample prints its text"
done

# config.json's sizes against the files, before anything large is allocated
import_case "vocab_size near 2^31" "model.embed_tokens.weight has shape [256, 16] (2 dims), the model of" \
    'config vocab_size 2147483000'
import_case "65536 layers of 4096 experts" "a model of num_hidden_layers 65536 of num_local_experts 4096 has" \
    'config model_type "\"mixtral\"" num_hidden_layers 65536 num_local_experts 4096 num_experts_per_tok 2'
import_case "65536 layers" "a model of num_hidden_layers 65536 has 589826 tensors, the safetensors files hold 20" \
    'config num_hidden_layers 65536'
# ...and what that costs: the refusal of 65536 layers from a 40 KB folder in under 100 MiB (the
# name table alone was 326 MiB)
rss=$(python3 -c 'import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)' \
    "$BIN" import "$m" --out "$hc/out2")
[ "${rss:-999}" -lt 100 ] && ok "hostile import: 65536 layers refused in ${rss} MiB" ||
    fail "hostile import: 65536 layers: refused in ${rss} MiB, more than 100"

# safetensors: two tensors on the same bytes with an empty one between them
import_case "overlap behind an empty tensor" "tensor zz.over: its bytes" \
    'edit "b = h[\"model.norm.weight\"][\"data_offsets\"][0]; h[\"zz.empty\"] = {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [b + 8, b + 8]}; h[\"zz.over\"] = {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [b + 16, b + 32]}"'

# --out: trusted with nothing
import_case "--out an earlier import without latest" "already holds 'step-00000000'" \
    '"$BIN" import "$m" --out "$o" >/dev/null && rm "$o/latest"'
import_case "--out a checkpoint step" "is in the checkpoint step" \
    '"$BIN" import "$m" --out "$hc/ck" >/dev/null && o=$hc/ck/step-00000000'
import_case "--out below a checkpoint step" "is in the checkpoint step" \
    '"$BIN" import "$m" --out "$hc/ck" >/dev/null && o=$hc/ck/step-00000000/sub/dir'
import_case "--out a step-to-be of a checkpoint" "would be a step of the checkpoints in" \
    '"$BIN" import "$m" --out "$hc/ck" >/dev/null && o=$hc/ck/step-00000009'
import_case "--out empty" "--out is an empty path" 'o='
import_case "--out a file" "is a regular file, not a directory" 'o=$v/keep'
import_case "step-00000000.tmp a link to another folder" "already holds 'step-00000000.tmp'" \
    'mkdir "$o" && ln -s "$v" "$o/step-00000000.tmp"'
import_case "step-00000000.old a link to another folder" "already holds 'step-00000000.old'" \
    'mkdir "$o" && ln -s "$v" "$o/step-00000000.old"'
# the same links met by a training run's save: refused, never emptied
rm -rf "$hc" && mkdir -p "$hc/ck" "$hc/victim" && echo precious >"$hc/victim/keep"
ln -s ../victim "$hc/ck/step-00000002.tmp"
expect_exit 2 "hostile: a save whose step-00000002.tmp is a link to another folder" -- "$BIN" "${base[@]}" \
    --set train.steps=2 --set train.warmup_steps=1 --set checkpoint.dir="$hc/ck" --set checkpoint.interval=2
expect_text "step-00000002.tmp' is a symbolic link" "hostile: the save names the link"
[ -f "$hc/victim/keep" ] && ok "hostile: the save left what the link points at" ||
    fail "hostile: the save deleted the files the link points at"

# paths too long: refused, not cut
long=$(printf 'd%.0s' $(seq 1 250))
import_case "--out of 600 characters" "characters long, longer than the 448 cooktrain takes" \
    'o=$hc/$long/$long/x'
import_case "a model path of 600 characters" "characters long, longer than the 448 cooktrain takes" \
    'mkdir -p "$hc/$long/$long" && mv "$m" "$hc/$long/$long/model" && m=$hc/$long/$long/model'

# the index and the source folder: what is wrong, in words
index() { mv "$m/model.safetensors" "$m/a.safetensors" && printf '%s' "$1" >"$m/model.safetensors.index.json"; }
import_case "an empty index" "JSON error at line 1, column 0: '[' or '{' expected near end of file" "index ''"
import_case "an index of duplicate keys" "duplicate object key" \
    "index '{\"weight_map\": {\"a\": \"a.safetensors\", \"a\": \"a.safetensors\"}}'"
import_case "an index 3000 levels deep" "maximum parsing depth reached" \
    "index \"\$(python3 -c 'print(\"[\" * 3000 + \"]\" * 3000)')\""
import_case "a source folder that is not there" "'$hc/nothing' does not exist" 'm=$hc/nothing'

# weights: NaN and Inf, a layer more than config.json's, a tensor under two names
import_case "a NaN weight" "tensor model.layers.1.mlp.up_proj.weight holds a value that is not finite (nan" \
    'edit "b = h[\"model.layers.1.mlp.up_proj.weight\"][\"data_offsets\"][0]; data[b + 8:b + 12] = struct.pack(\"<f\", float(\"nan\"))"'
import_case "an infinite weight" "tensor model.norm.weight holds a value that is not finite (-inf" \
    'edit "b = h[\"model.norm.weight\"][\"data_offsets\"][0]; data[b:b + 4] = struct.pack(\"<f\", float(\"-inf\"))"'
import_case "a surplus layer" "holds tensor model.layers.2.input_layernorm.weight, of a layer past the model of" \
    'edit "t = h[\"model.norm.weight\"]; n = len(data); data += data[t[\"data_offsets\"][0]:t[\"data_offsets\"][1]]; h[\"model.layers.2.input_layernorm.weight\"] = dict(t, data_offsets=[n, n + 64])"'
import_case "a GPT-2 tensor under two names" "holds tensor wte.weight under two names: wte.weight in" \
    'rm -rf "$m" && cp -r "$tmp/hf-gpt2" "$m" && edit "t = h[\"wte.weight\"]; n = len(data); data += data[t[\"data_offsets\"][0]:t[\"data_offsets\"][1]]; h[\"transformer.wte.weight\"] = dict(t, data_offsets=[n, len(data)])"'
# an lm_head.weight that a tied model does not read: imported, with a warning naming it
rm -rf "$hc" && cp -r "$tmp/hf-llama" "$hc"
python3 "$hf" edit "$hc" 't = h["model.embed_tokens.weight"]; n = len(data); data += bytes(t["data_offsets"][1] - t["data_offsets"][0]); h["lm_head.weight"] = dict(t, data_offsets=[n, len(data)])'
expect_exit 0 "hostile import: a tied model with an lm_head.weight imports" -- "$BIN" import "$hc" --out "$hc/ck"
expect_text "warning: Hugging Face model '$hc': 1 tensor the model of its config.json does not use, left out: lm_head.weight" \
    "hostile import: the unused lm_head.weight is named in a warning"
expect_text "hint: tie_word_embeddings is true" "hostile import: the warning says why it is not read"
