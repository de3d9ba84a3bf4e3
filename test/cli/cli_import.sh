#!/usr/bin/env bash
# Hugging Face models in (core/io/hf.h): `cooktrain import` and model.init_from, through the real
# binary, on models cooktrain did not write — scripts/reference_forward.py `make` writes random
# GPT-2, Llama and Mixtral models the way the safetensors library does (sorted keys, F32, BF16 or
# F16, one file or sharded with an index):
#   - import, then `cooktrain eval`, gives the numpy reference's loss on the same files to 1e-6
#     relative (Llama with grouped-query attention: RoPE's q/k row permutation undone by import);
#   - import ∘ export: exporting the imported checkpoint gives back every tensor bit for bit, and
#     export → import → export of a trained checkpoint is byte-identical (fp32 and bf16);
#   - model.init_from loads the same weights into every layout (tp 2 with sequence parallelism,
#     pp 2 with ZeRO-3, dp 2) as into one process, from the Hugging Face model and from the
#     imported checkpoint; a resumed checkpoint wins over init_from; a model of another shape is
#     exit 2 naming the key;
#   - hostile files: each exit 2 naming the file and the field, nothing written.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup
py=python3
/usr/bin/python3 -c 'import numpy' 2>/dev/null && py=/usr/bin/python3
ref=scripts/reference_forward.py
shape=(--vocab 123 --positions 32 --layers 4 --d-model 64 --heads 8)

# close A B WHAT: |A - B| <= 1e-6 |B| (fp32 against float64: see test/cli/cli_llama.sh)
close() {
    if $py -c 'import math,sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if math.isfinite(a) and abs(a-b) <= 1e-6*abs(b) else 1)' "$1" "$2"; then
        ok "$3 ($1 vs $2)"
    else
        fail "$3: $1 vs $2"
    fi
}

# same_tensors A B WHAT: every tensor of model A equals B's, value for value (names and shapes too)
same_tensors() {
    if out=$($py - "$1" "$2" <<'PY' 2>&1); then
import sys, numpy as np
sys.path.insert(0, "scripts")
from reference_forward import load_model
a, b = load_model(sys.argv[1]), load_model(sys.argv[2])
if sorted(a) != sorted(b):
    sys.exit("names differ: %s" % sorted(set(a) ^ set(b))[:4])
bad = [n for n in a if a[n].shape != b[n].shape or not np.array_equal(a[n], b[n])]
if bad:
    sys.exit("%d tensors differ, first %s" % (len(bad), bad[0]))
print("%d tensors" % len(a))
PY
        ok "$3 ($out)"
    else
        fail "$3: $out"
    fi
}

# ---- import, then eval against the numpy reference ---------------------------------------------
for model in "llama|BF16|1|--kv-heads 4 --d-ff 192" "llama|F32|3|--kv-heads 2 --d-ff 160 --untied" \
    "llama|F32|1|--kv-heads 4 --d-ff 192 --rope-scaling 8 --rope-original 16" \
    "gpt2|F16|1|" "gpt2|F32|2|--d-ff 96 --untied" \
    "mixtral|F32|2|--kv-heads 4 --d-ff 96 --experts 4 --top-k 2" \
    "mixtral|BF16|1|--kv-heads 2 --d-ff 64 --experts 8 --top-k 3 --untied"; do
    IFS='|' read -r arch dtype shards extra <<<"$model"
    name="$arch $dtype shards=$shards${extra:+ $extra}"
    selected "import $name" || continue
    d=$tmp/$arch-$dtype-$shards
    # shellcheck disable=SC2086
    $py $ref make "$d/hf" --arch "$arch" --dtype "$dtype" --shards "$shards" --seed 7 "${shape[@]}" $extra ||
        { fail "$name: the reference could not make a model"; continue; }
    expect_exit 0 "import $name" -- "$BIN" import "$d/hf" --out "$d/ck" || continue
    expect_text "  arch: ${arch/mixtral/llama}" "import $name prints the model keys"
    [ "$arch" = mixtral ] && expect_text "  moe_router: topk_softmax" "import $name prints the MoE keys"
    expect_exit 0 "eval of the imported $name" -- "$BIN" eval "$d/ck" --data "$TEST_DATA/val.bin" --samples 8
    loss=$(printf '%s\n' "$OUT_TEXT" | sed -n 's/^eval .* loss \([0-9.]*\)$/\1/p')
    want=$($py $ref "$d/hf" --tokens "$TEST_DATA/val.bin" --samples 8 2>&1)
    close "${loss:-nan}" "${want#loss }" "import $name: cooktrain eval gives the numpy reference's loss"
    edtype=fp32
    [ "$dtype" = BF16 ] && edtype=bf16
    expect_exit 0 "export of the imported $name" -- "$BIN" export "$d/ck" --out "$d/back/model.safetensors" --dtype $edtype
    [ "$dtype" = F16 ] || same_tensors "$d/hf" "$d/back/model.safetensors" "import ∘ export $name: every tensor back bit for bit"
    if [[ $extra == *rope-scaling* ]]; then
        $py -c 'import json,sys; a=json.load(open(sys.argv[1]))["rope_scaling"]; b=json.load(open(sys.argv[2]))["rope_scaling"]; sys.exit(0 if a == b else 1)' \
            "$d/hf/config.json" "$d/back/config.json" && ok "$name: export writes the same rope_scaling" ||
            fail "$name: the exported rope_scaling differs"
    fi
done

# ---- export → import → export is byte-identical -------------------------------------------------
if selected "round trip"; then
    d=$tmp/trip
    expect_exit 0 "llama: 3 steps with a checkpoint" -- "$BIN" "${base[@]}" --set model.arch=llama \
        --set model.n_layer=4 --set model.n_kv_head=4 --set model.multiple_of=32 --set train.steps=3 \
        --set checkpoint.dir="$d/ck"
    for dt in fp32 bf16; do
        "$BIN" export "$d/ck" --out "$d/a-$dt/model.safetensors" --dtype $dt >/dev/null &&
            "$BIN" import "$d/a-$dt" --out "$d/imported-$dt" >/dev/null &&
            "$BIN" export "$d/imported-$dt" --out "$d/b-$dt/model.safetensors" --dtype $dt >/dev/null &&
            cmp -s "$d/a-$dt/model.safetensors" "$d/b-$dt/model.safetensors" &&
            cmp -s "$d/a-$dt/config.json" "$d/b-$dt/config.json" &&
            ok "export ($dt) → import → export: model.safetensors and config.json byte-identical" ||
            fail "export ($dt) → import → export differs"
    done
fi

# ---- model.init_from in every layout -------------------------------------------------------------
if selected "init_from"; then
    d=$tmp/init
    $py $ref make "$d/hf" --arch llama --dtype BF16 --seed 3 "${shape[@]}" --kv-heads 4 --d-ff 192
    "$BIN" import "$d/hf" --out "$d/ck" >/dev/null
    llama=("${base[@]}" --set model.arch=llama --set model.n_layer=4 --set model.n_kv_head=4
        --set model.d_ff=192 --set train.steps=1 --set train.warmup_steps=0)
    expect_exit 0 "init_from the Hugging Face model, one process" -- "$BIN" "${llama[@]}" \
        --set model.init_from="$d/hf" --dump-init-params "$d/one.bin"
    expect_text "init: weights from the Hugging Face llama model" "init_from says where the weights came from"
    expect_exit 0 "init_from the imported checkpoint, one process" -- "$BIN" "${llama[@]}" \
        --set model.init_from="$d/ck" --dump-init-params "$d/ck.bin"
    cmp -s "$d/one.bin" "$d/ck.bin" && ok "init_from: the model and its import give the same weights" ||
        fail "init_from: the model and its import give different weights"
    expect_exit 0 "the same run without init_from" -- "$BIN" "${llama[@]}" --dump-init-params "$d/seed.bin"
    ! cmp -s "$d/one.bin" "$d/seed.bin" && ok "init_from: the weights are not train.seed's" ||
        fail "init_from: the run starts from train.seed's weights"
    for layout in "tp2|--set parallel.tp=2 --set parallel.sequence_parallel=true" \
        "pp2-zero3|--set parallel.pp=2 --set parallel.zero_stage=3" "dp2|--set parallel.zero_stage=1"; do
        IFS='|' read -r lname extra <<<"$layout"
        # shellcheck disable=SC2086
        expect_exit 0 "init_from the Hugging Face model, $lname" -- "${MPIRUN[@]}" -np 2 "$BIN" \
            "${llama[@]}" $extra --set model.init_from="$d/hf" --dump-init-params "$d/$lname.bin"
        cmp -s "$d/one.bin" "$d/$lname.bin" && ok "init_from $lname: the same weights as one process" ||
            fail "init_from $lname: weights differ from one process"
    done
    # an untied model: lm_head on the last stage, the embedding on the first
    $py $ref make "$d/hfu" --arch llama --seed 4 "${shape[@]}" --kv-heads 4 --d-ff 192 --untied
    untied=("${llama[@]}" --set model.tie_embeddings=false --set model.init_from="$d/hfu")
    expect_exit 0 "init_from an untied model, one process" -- "$BIN" "${untied[@]}" --dump-init-params "$d/u1.bin"
    grep -q lm_head "$d/u1.bin.index.json" && ok "init_from an untied model: the run has an lm_head" ||
        fail "init_from an untied model: no lm_head"
    for layout in "tp2|--set parallel.tp=2" "pp2|--set parallel.pp=2"; do
        IFS='|' read -r lname extra <<<"$layout"
        # shellcheck disable=SC2086
        expect_exit 0 "init_from an untied model, $lname" -- "${MPIRUN[@]}" -np 2 "$BIN" "${untied[@]}" $extra \
            --dump-init-params "$d/u-$lname.bin"
        cmp -s "$d/u1.bin" "$d/u-$lname.bin" && ok "init_from an untied model, $lname: the same weights as one process" ||
            fail "init_from an untied model, $lname: weights differ from one process"
    done
    expect_exit 2 "init_from an untied model into a tied run" -- "$BIN" "${llama[@]}" --set model.init_from="$d/hfu"
    expect_text "tie_word_embeddings 0 in its config.json, this run's model.tie_embeddings is 1" "the tie mismatch names both keys"
    "$BIN" import "$d/hfu" --out "$d/cku" >/dev/null
    expect_exit 2 "init_from an untied checkpoint into a tied run" -- "$BIN" "${llama[@]}" --set model.init_from="$d/cku"
    expect_text "has an LM head of its own (lm_head), this run has model.tie_embeddings=true" "the checkpoint's tie mismatch is named"
    expect_exit 0 "a run with a checkpoint and init_from" -- "$BIN" "${llama[@]}" \
        --set model.init_from="$d/hf" --set checkpoint.dir="$d/run"
    expect_exit 0 "the run again: resumes" -- "$BIN" "${llama[@]}" --set train.steps=2 \
        --set model.init_from="$d/hf" --set checkpoint.dir="$d/run"
    printf '%s' "$OUT_TEXT" | grep -q "resumed from" && ! printf '%s' "$OUT_TEXT" | grep -q "^init:" &&
        ok "a resumed checkpoint wins over model.init_from" || fail "init_from overrode a resume"
    expect_exit 2 "resume with another rope_theta" -- "$BIN" "${llama[@]}" --set train.steps=3 \
        --set model.rope_theta=500 --set checkpoint.dir="$d/run"
    expect_text "was written with model.rope_theta=10000, this run has 500" "a resume names the changed rope_theta"
    expect_exit 2 "init_from the checkpoint with another norm_eps" -- "$BIN" "${llama[@]}" \
        --set model.norm_eps=1e-6 --set model.init_from="$d/ck"
    expect_text "model.norm_eps=1.0000000000000001e-05, this run has 9.9999999999999995e-07" "init_from names the changed norm_eps"
    expect_exit 2 "init_from into another d_ff" -- "$BIN" "${llama[@]}" --set model.d_ff=256 \
        --set model.init_from="$d/hf"
    expect_text "intermediate_size 192 in its config.json, this run's model.d_ff is 256" "the mismatch names both keys"
    expect_exit 2 "init_from the checkpoint into another n_layer" -- "$BIN" "${llama[@]}" \
        --set model.n_layer=2 --set model.init_from="$d/ck"
    expect_text "model.n_layer=4, this run has 2" "the checkpoint mismatch names the key"
    expect_exit 2 "init_from a missing path" -- "$BIN" "${llama[@]}" --set model.init_from="$d/nothing"
fi

# ---- hostile files: exit 2, the field named, nothing written --------------------------------------
if selected "hostile"; then
    d=$tmp/hostile
    $py $ref make "$d/good" --arch llama --seed 5 "${shape[@]}" --kv-heads 4 --d-ff 192
    n=0
    # case WHAT EXPECTED-TEXT SHELL: copies the good model to $m, applies SHELL, imports
    case_() {
        n=$((n + 1))
        m=$d/case$n
        rm -rf "$m" && cp -r "$d/good" "$m"
        (cd "$m" && eval "$3") || { fail "$1: could not craft the case"; return; }
        expect_exit 2 "hostile: $1" -- "$BIN" import "$m" --out "$d/out$n" &&
            expect_text "$2" "hostile: $1 names '$2'"
        [ ! -e "$d/out$n" ] && ok "hostile: $1 writes nothing" || fail "hostile: $1 left $d/out$n"
    }
    # the safetensors header rewritten by python: PY is applied to the parsed header dict h
    st() {
        cat >"$m.py" <<PY
import json, struct
raw = open("model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
$1
b = json.dumps(h).encode()
open("model.safetensors", "wb").write(struct.pack("<Q", len(b)) + b + data)
PY
        $py "$m.py"
    }
    cfgset() { $py -c 'import json,sys; c=json.load(open("config.json")); c[sys.argv[1]]=json.loads(sys.argv[2]); json.dump(c, open("config.json","w"))' "$1" "$2"; }
    e=model.layers.0.self_attn.q_proj.weight
    case_ "truncated data" "model.safetensors" 'truncate -s -100 model.safetensors'
    case_ "header length past the file" "header length" "$py -c 'import struct; f=open(\"model.safetensors\",\"r+b\"); f.write(struct.pack(\"<Q\", 2**62))'"
    case_ "header length 0" "header length" "$py -c 'import struct; f=open(\"model.safetensors\",\"r+b\"); f.write(struct.pack(\"<Q\", 0))'"
    case_ "header not JSON" "not a JSON object" "$py -c 'f=open(\"model.safetensors\",\"r+b\"); f.seek(8); f.write(b\"[[[\")'"
    case_ "end offset past the data" "data_offsets" "st 'h[\"$e\"][\"data_offsets\"][1] += 10**15'"
    case_ "negative offset" "data_offsets" "st 'h[\"$e\"][\"data_offsets\"] = [-4, 0]'"
    case_ "offsets not its size" "data_offsets do not span" "st 'h[\"$e\"][\"shape\"] = [2**31 - 1, 2**31 - 1]'"
    case_ "offsets wider than its shape" "data_offsets do not span" "st 'h[\"model.norm.weight\"][\"shape\"] = [63]'"
    case_ "dimension 2^31" "dimension" "st 'h[\"$e\"][\"shape\"] = [2**31, 1]'"
    case_ "nine dimensions" "at most eight dimensions" "st 'h[\"$e\"][\"shape\"] = [1] * 9'"
    case_ "a weight of three dimensions" "(3 dims)" "st 'h[\"$e\"][\"shape\"] = [64, 64, 1]'"
    case_ "dtype I32" "is I32 of 2 dimensions" "st 'h[\"$e\"][\"dtype\"] = \"I32\"'"
    case_ "dtype X99" "dtype X99 is not a safetensors dtype" "st 'h[\"$e\"][\"dtype\"] = \"X99\"'"
    case_ "two tensors on the same bytes" "overlap" "st 'k = \"model.norm.weight\"; h[\"x\"] = dict(h[k])'"
    case_ "a tensor missing" "has no tensor $e" "st 'del h[\"$e\"]'"
    g=model.layers.1.mlp.gate_proj.weight
    case_ "a tensor of the wrong shape" "tensor $g has shape" "st 'h[\"$g\"][\"shape\"] = h[\"$g\"][\"shape\"][::-1]'"
    case_ "model.safetensors a FIFO" "not a regular file" 'rm model.safetensors && mkfifo model.safetensors'
    case_ "model.safetensors a directory" "safetensors" 'rm model.safetensors && mkdir model.safetensors'
    case_ "config.json a FIFO" "config.json" 'rm config.json && mkfifo config.json'
    case_ "config.json not JSON" "not a JSON object" 'echo "{" >config.json'
    case_ "config.json model_type" "model_type" 'cfgset model_type "\"bert\""'
    case_ "config.json hidden_size negative" "hidden_size" 'cfgset hidden_size -64'
    case_ "config.json hidden_size 2^63" "hidden_size" 'cfgset hidden_size 9223372036854775807'
    case_ "config.json vocab_size a string" "vocab_size" 'cfgset vocab_size "\"123\""'
    case_ "config.json heads not dividing" "n_head" 'cfgset num_attention_heads 7'
    case_ "config.json rope_scaling without factor" "rope_scaling" 'cfgset rope_scaling "{\"rope_type\": \"llama3\"}"'
    case_ "config.json rope_scaling yarn" "rope_type" 'cfgset rope_scaling "{\"rope_type\": \"yarn\", \"factor\": 4}"'
    case_ "config.json rope_scaling high below low" "high_freq_factor" 'cfgset rope_scaling "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1, \"original_max_position_embeddings\": 16}"'
    case_ "config.json untied, no lm_head.weight" "has no tensor lm_head.weight" 'cfgset tie_word_embeddings false'
    case_ "config.json tie_word_embeddings a number" "tie_word_embeddings" 'cfgset tie_word_embeddings 1'
    case_ "config.json duplicate key" "duplicate" "$py -c 't=open(\"config.json\").read(); open(\"config.json\",\"w\").write(t.replace(\"{\", \"{\\\"hidden_size\\\": 64, \", 1))'"
    case_ "index naming a file outside" "not a .safetensors file beside the index" \
        "mv model.safetensors x.safetensors && echo '{\"weight_map\": {\"a\": \"../x.safetensors\"}}' >model.safetensors.index.json"
    case_ "an index naming 5000 files" "names more than 4096 files" \
        "mv model.safetensors x.safetensors && $py -c 'import json; json.dump({\"weight_map\": {\"t%d\" % i: \"f%d.safetensors\" % i for i in range(5000)}}, open(\"model.safetensors.index.json\", \"w\"))'"
    case_ "no safetensors" "neither model.safetensors" 'rm model.safetensors'
    m=$d/extra
    rm -rf "$m" && cp -r "$d/good" "$m"
    (cd "$m" && st 'n = len(data); data += bytes(1024); h["model.layers.0.self_attn.mask"] = {"dtype": "BOOL", "shape": [1, 1, 32, 32], "data_offsets": [n, n + 1024]}') &&
        expect_exit 0 "an extra 4-D BOOL buffer (a stored causal mask) is left alone" -- "$BIN" import "$m" --out "$d/extra-out"
fi
