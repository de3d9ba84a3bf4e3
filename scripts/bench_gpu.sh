#!/usr/bin/env bash
# bench_gpu.sh — 124M-class training on one GPU against plain PyTorch, in one run, for each model
# of --models: gpt2 (configs/gpt2-124m.yaml, GPT-2 small) and llama (configs/llama-125m.yaml: the
# same vocabulary, layers, width and query heads with Llama's parts — 4 key/value heads, SwiGLU
# 2048, RMSNorm, rotary positions, no biases; 114M parameters):
#   1. cooktrain: the model's config at seq_len 1024 with micro batch = global batch = B for
#      each B of --batches and each precision of --precisions (`--backend cuda`, `--set`
#      overrides): median tokens/s over the steps after the first 3, the most device memory the
#      trainer holds (its own allocations, mem_bytes of the metrics), and, from a second 5-step
#      run under --profile (which syncs the device after every op to time it, so its own tokens/s
#      is not the trainer's), the time of a step by op category;
#   2. the peers (scripts/torch_gpt2_gpu.py in the PyTorch of --python): the same model and
#      optimizer in plain PyTorch 2.x, eager with F.scaled_dot_product_attention(is_causal=True)
#      and AdamW(fused=True), and the same under torch.compile; bf16 under torch.autocast, fp32
#      with TF32 off; same B and T, median tokens/s after the first 3 steps and
#      torch.cuda.max_memory_allocated. And two reference rates: an 8192³ matmul in each
#      precision (TFLOP/s, measured once), and causal SDPA forward + backward at the model's
#      attention shape (B, 12 heads — 4 key/value heads for llama —, T 1024, head dim 64; flash
#      attention in bf16), per layer and x 12 per step;
#   3. one table per model: system, precision, B, tok/s, cooktrain's tok/s over the row's, peak
#      memory, MFU (the FLOPs per token cooktrain's trainer counts, `cooktrain train --gemm-rate`,
#      over the device's dense datasheet peak for the precision) beside the measured 8192³
#      matmul rate; then the --profile split (by op category, then by op), the device's idle
#      time between ops from a third 5-step run under --device-idle (the launch overhead a CUDA
#      graph could remove, at most) and its time by op on the device's clock, and cooktrain's
#      attention ms per step (synced, and on the device's clock) against SDPA's;
#   4. the GEMMs of each row's --device-idle step, shape by shape, against the same shapes
#      through PyTorch (scripts/gemm_peer.py, where the peers run);
#   On Hopper (or with --wgmma on), each bf16 row at head width 64 runs a second time with the wgmma
#   attention kernels (CT_CUDA_ATTENTION=wgmma, cuda/README.md): its own row, "cooktrain wgmma",
#   and its own --device-idle run (--wgmma off leaves them out); and each row runs once more with
#   the step's forward and backward issued from a CUDA graph (train.cuda_graph, core/README.md):
#   its own row, "cooktrain graph" (--graph off leaves it out);
#   5. the GPU-speed targets, each met or MISSED from those figures: tok/s >= 1.0x torch.compile
#      and >= 1.05x eager (fp32: >= 1.0x eager), memory no more than torch.compile's, attention
#      within 1.25x of SDPA flash, the GEMMs within 1.15x of PyTorch's, AdamW + gradient norm
#      <= 3 ms.
# Skips cleanly — prints "bench_gpu: skipped: REASON" and exits 0 — when there is no GPU
# (nvidia-smi missing or failing, or cooktrain finding no usable CUDA device) or no nvcc build
# (build/libcooktrain-cuda.so); when --python cannot import torch or torch sees no GPU, only
# the peers are skipped. Both models train on build/bench-data/gpt2-124m (scripts/gpu_check.sh's
# corpus) when it is there, else on random tokens written once to
# build/bench-data/gpt2-124m-random (the speed does not depend on the text). Exits 1 when a
# cooktrain run fails (its row says so, as a peer's row says why a peer failed: out of memory,
# torch.compile without a working C compiler). Prints how long each part took, for sizing runs.
#
#   scripts/bench_gpu.sh [--steps N] [--models "gpt2 llama"] [--batches "16 64"]
#                        [--precisions "bf16 fp32"] [--peers "eager compile"] [--skip-peers]
#                        [--python PYTHON] [--wgmma auto|on|off] [--graph on|off]
# (--steps counts every step, the 3 warmup steps too. For a device the script does not know,
# BENCH_GPU_PEAK_BF16 and BENCH_GPU_PEAK_FP32 give the datasheet peaks in TFLOP/s; NVIDIA_SMI
# names the nvidia-smi to ask, for the tests.)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/cooktrain
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
BACKEND=cuda
T=1024
VOCAB=50257 # both models' vocabulary: the random-token shard's range
WARMUP=3
PROFILE_STEPS=5
steps=20
models="gpt2 llama"
batches="16 64"
precisions="bf16 fp32"
peers="eager compile"
skip_peers=0
PY=python3
wgmma=auto
graph=on

bad() { echo "bench_gpu: $1" >&2; echo "hint: $2" >&2; exit 2; }
skip() { echo "bench_gpu: skipped: $*"; exit 0; }
usage_hint='scripts/bench_gpu.sh [--steps N] [--models "gpt2 llama"] [--batches "16 64"] [--precisions "bf16 fp32"] [--peers "eager compile"] [--skip-peers] [--python PYTHON] [--wgmma auto|on|off] [--graph on|off] (see the comment at the top of scripts/bench_gpu.sh)'
while [ $# -gt 0 ]; do
    case $1 in
        --steps | --models | --batches | --precisions | --peers | --python | --wgmma | --graph)
            [ $# -ge 2 ] || bad "$1 needs a value" "$usage_hint"
            case $1 in
                --steps) steps=$2 ;;
                --models) models=$2 ;;
                --batches) batches=$2 ;;
                --precisions) precisions=$2 ;;
                --peers) peers=$2 ;;
                --python) PY=$2 ;;
                --wgmma) wgmma=$2 ;;
                --graph) graph=$2 ;;
            esac
            shift 2 ;;
        --skip-peers) skip_peers=1; shift ;;
        *) bad "unknown option $1" "$usage_hint" ;;
    esac
done
if ! [[ $steps =~ ^[1-9][0-9]*$ ]] || [ "$steps" -lt $((WARMUP + 2)) ]; then
    bad "--steps $steps is too few: the medians skip the first $WARMUP steps" "--steps 20"
fi
[ -n "${models// /}" ] || bad "--models is empty" '--models "gpt2 llama"'
for m in $models; do
    case $m in gpt2 | llama) ;; *) bad "--models: '$m' is not gpt2 or llama" '--models "gpt2 llama"' ;; esac
done
[ -n "${batches// /}" ] || bad "--batches is empty" '--batches "16 64"'
for b in $batches; do
    [[ $b =~ ^[1-9][0-9]*$ ]] || bad "--batches: '$b' is not a positive batch size" '--batches "16 64"'
done
[ -n "${precisions// /}" ] || bad "--precisions is empty" '--precisions "bf16 fp32"'
for p in $precisions; do
    case $p in bf16 | fp32) ;; *) bad "--precisions: '$p' is not bf16 or fp32" '--precisions "bf16 fp32"' ;; esac
done
for m in $peers; do
    case $m in eager | compile) ;; *) bad "--peers: '$m' is not eager or compile" '--peers "eager compile" (or --skip-peers)' ;; esac
done
[ -n "${peers// /}" ] || skip_peers=1
case $wgmma in auto | on | off) ;; *) bad "--wgmma: '$wgmma' is not auto, on or off" "--wgmma auto" ;; esac
case $graph in on | off) ;; *) bad "--graph: '$graph' is not on or off" "--graph on" ;; esac

# ---- is there a GPU, and a build for it? ---------------------------------------------------------
if ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
    skip "no GPU ($NVIDIA_SMI not found)"
fi
if ! gpus=$("$NVIDIA_SMI" --query-gpu=name --format=csv,noheader 2>&1) || [ -z "$gpus" ]; then
    skip "no GPU ($NVIDIA_SMI failed: $(printf '%s\n' "$gpus" | head -1))"
fi
device=$(printf '%s\n' "$gpus" | head -1)
if [ "$wgmma" = auto ]; then # the wgmma attention rows on Hopper (compute capability 9.x)
    cc=$("$NVIDIA_SMI" --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 || true)
    if [ "${cc%%.*}" = 9 ]; then wgmma=on; else wgmma=off; fi
fi
if [ ! -f "$BUILD/libcooktrain-cuda.so" ]; then
    skip "$BUILD/libcooktrain-cuda.so is missing (build with nvcc on the PATH: make)"
fi
[ -x "$BIN" ] || bad "$BIN is missing" "build it: make"
# the trainer's own answer: a device it can use (a quick --gemm-rate at test-tiny's shapes)
if ! probe=$("$BIN" train --config configs/test-tiny.yaml --backend "$BACKEND" --gemm-rate 2>&1 </dev/null); then
    if why=$(printf '%s\n' "$probe" | grep -o 'no usable CUDA device.*'); then
        skip "cooktrain finds $(printf '%s\n' "$why" | head -1)"
    fi
    echo "bench_gpu: cooktrain --backend $BACKEND failed on $device:" >&2
    printf '%s\n' "$probe" | tail -n 5 | sed 's/^/    /' >&2
    exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
started=$SECONDS
failed=0
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print ""; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# ---- can the peers run? ---------------------------------------------------------------------------
peer_skip=""
if [ $skip_peers = 1 ]; then
    peer_skip="--skip-peers"
elif ! command -v "$PY" >/dev/null 2>&1; then
    peer_skip="$PY not found"
else
    rc=0
    torch_line=$("$PY" - 2>&1 <<'PY'
import sys
try:
    import torch
except Exception as e:
    print("%s cannot import torch (%s)" % (sys.executable, e))
    sys.exit(3)
if not torch.cuda.is_available():
    print("torch %s: torch.cuda.is_available() is false" % torch.__version__)
    sys.exit(3)
print("torch %s, CUDA %s" % (torch.__version__, torch.version.cuda))
PY
    ) || rc=$?
    torch_line=$(printf '%s\n' "$torch_line" | tail -n 1) # its answer, after any warning
    [ $rc = 0 ] || peer_skip=$torch_line
fi
if [ -n "$peer_skip" ]; then
    echo "bench_gpu: peers skipped: $peer_skip"
fi

# ---- the data ----------------------------------------------------------------------------------------
data=$BUILD/bench-data/gpt2-124m/train.bin
if [ ! -f "$data" ]; then
    data=$BUILD/bench-data/gpt2-124m-random/train.bin
    if [ ! -f "$data" ]; then
        gen=$PY
        command -v "$gen" >/dev/null 2>&1 || gen=python3
        # a cooktrain token shard (core/data/data.c): 64-byte header, then 2-byte little-endian
        # tokens
        "$gen" - "$(dirname "$data")" "$VOCAB" <<'PY'
import array, os, random, struct, sys
out, vocab, n = sys.argv[1], int(sys.argv[2]), 1 << 22
tokens = array.array("H", (t % vocab for t in array.array("H", random.Random(1234).randbytes(2 * n))))
if sys.byteorder != "little":
    tokens.byteswap()
header = b"CTSHARD1" + struct.pack("<IIIIQ", 1, 0x01020304, 2, vocab, n)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "train.bin.tmp"), "wb") as f:
    f.write(header + bytes(64 - len(header)))
    tokens.tofile(f)
os.replace(os.path.join(out, "train.bin.tmp"), os.path.join(out, "train.bin"))
PY
    fi
fi

# model_spec MODEL: the config, title and shape of one model of --models, and its peer's options
model_spec() {
    case $1 in
        gpt2)
            CONFIG=configs/gpt2-124m.yaml TITLE="GPT-2 124M" L=12 D=768 HEADS=12 KV=12
            PEER_ARGS=(--arch gpt2 --vocab "$VOCAB" --layers "$L" --d "$D" --heads "$HEADS") ;;
        llama)
            CONFIG=configs/llama-125m.yaml TITLE="Llama 114M (GPT-2 small's size)" L=12 D=768 HEADS=12 KV=4
            PEER_ARGS=(--arch llama --vocab "$VOCAB" --layers "$L" --d "$D" --heads "$HEADS" --kv-heads "$KV" --ffn 2048) ;;
    esac
}

# datasheet dense peaks, TFLOP/s: bf16 on tensor cores; fp32 without them (TF32 off)
case $device in
    *H200*NVL* | *H100*NVL*) peak_bf16=835 peak_fp32=60 ;;
    *H100*PCIe*) peak_bf16=756 peak_fp32=51 ;;
    *H100* | *H200*) peak_bf16=989 peak_fp32=67 ;;
    *A100*) peak_bf16=312 peak_fp32=19.5 ;;
    *) peak_bf16="" peak_fp32="" ;;
esac
peak_bf16=${BENCH_GPU_PEAK_BF16:-$peak_bf16}
peak_fp32=${BENCH_GPU_PEAK_FP32:-$peak_fp32}
peak_note="$device datasheet, dense: bf16 ${peak_bf16:-?} TFLOP/s, fp32 ${peak_fp32:-?} TFLOP/s (no tensor cores)"
[ -n "$peak_bf16$peak_fp32" ] || peak_note="$device: no datasheet peak known here, so no MFU (set BENCH_GPU_PEAK_BF16 / BENCH_GPU_PEAK_FP32 in TFLOP/s)"

echo "== $models at T $T on $device: $steps steps a run, medians over the steps after the first $WARMUP; data $data"
t_cooktrain=0 t_peers=0
gemm_done=0
for model in $models; do
model_spec "$model"
m=$tmp/$model
mkdir -p "$m"
echo
echo "== $TITLE ($CONFIG), T $T"

# the FLOPs per token of cooktrain's own count (ct_model_flops_per_token), for MFU
flops=""
if "$BIN" train --config "$CONFIG" --backend "$BACKEND" --set model.seq_len=$T --set data.train="$data" \
    --gemm-rate >"$m/gemm-rate.log" 2>&1 </dev/null; then
    flops=$(sed -n 's/^flops_per_token //p' "$m/gemm-rate.log")
fi
[ -n "$flops" ] || echo "bench_gpu: cooktrain --gemm-rate gave no FLOPs per token for $CONFIG, so no MFU: $(tail -n 1 "$m/gemm-rate.log")"

# ---- 1. cooktrain ------------------------------------------------------------------------------------
# rows: SYSTEM PRECISION B TOKENS_PER_S PEAK_BYTES NOTE... ("-" for a failed run's numbers)
: >"$m/rows"
# cooktrain_row PRECISION B [wgmma|graph]: the row; with wgmma the same model with the wgmma
# attention kernels (CT_CUDA_ATTENTION=wgmma; its own row "wgmma", and its --device-idle run, no
# --profile); with graph the step issued from a CUDA graph (train.cuda_graph; its own row "graph",
# no --profile or --device-idle run: they time the ops one by one, which a graph's launch cannot)
cooktrain_row() {
    local p=$1 b=$2 sys=${3:-cooktrain} tps mem
    local name="$sys.$p.$b" env=() extra=()
    case $sys in
        wgmma) env=(CT_CUDA_ATTENTION=wgmma) ;;
        graph) extra=(--set train.cuda_graph=true) ;;
    esac
    local sets=(train --config "$CONFIG" --backend "$BACKEND" --set model.seq_len="$T"
                --set train.global_batch="$b" --set train.micro_batch="$b" --set train.warmup_steps=1
                --set log.interval=1 --set train.eval_interval=0 --set log.sample_tokens=0
                --set train.precision="$p" --set data.train="$data" "${extra[@]}")
    if ! env "${env[@]}" "$BIN" "${sets[@]}" --set train.steps="$steps" --set log.metrics="$m/$name.jsonl" >"$m/$name.log" 2>&1 </dev/null; then
        failed=1
        echo "$sys $p $b - - failed: $(grep -m1 -E '^(cooktrain|error)' "$m/$name.log" || tail -n 1 "$m/$name.log")" >>"$m/rows"
        echo "$sys $p B=$b: the run failed:"; tail -n 6 "$m/$name.log" | sed 's/^/    /'
        return
    fi
    tps=$(sed -n 's/.*"tokens_per_s": \([0-9.]*\).*/\1/p' "$m/$name.jsonl" | tail -n +$((WARMUP + 1)) | median)
    mem=$(sed -n 's/.*"mem_bytes": \([0-9]*\).*/\1/p' "$m/$name.jsonl" | sort -n | tail -n 1)
    echo "$sys $p $b ${tps:--} ${mem:--} ok" >>"$m/rows"
    echo "$sys $p B=$b: ${tps:-?} tok/s"
    if [ "$sys" != cooktrain ]; then
        :
    elif "$BIN" "${sets[@]}" --set train.steps=$PROFILE_STEPS --profile >"$m/$name.profile.log" 2>&1 </dev/null; then
        grep '^profile (rank' "$m/$name.profile.log" | tail -n 1 >"$m/$name.profile" || true
        grep '^profile by op' "$m/$name.profile.log" | tail -n 1 >"$m/$name.profile_ops" || true
    else
        failed=1
        echo "cooktrain $p B=$b: the --profile run failed:"; tail -n 6 "$m/$name.profile.log" | sed 's/^/    /'
    fi
    if [ "$sys" = graph ]; then
        :
    elif env "${env[@]}" "$BIN" "${sets[@]}" --set train.steps=$PROFILE_STEPS --device-idle >"$m/$name.idle.log" 2>&1 </dev/null; then
        grep '^device idle (rank' "$m/$name.idle.log" | tail -n 1 >"$m/$name.idle" || true
        grep '^device busy by op (rank' "$m/$name.idle.log" | tail -n 1 >"$m/$name.busy" || true
    else
        failed=1
        echo "$sys $p B=$b: the --device-idle run failed:"; tail -n 6 "$m/$name.idle.log" | sed 's/^/    /'
    fi
}
t0=$SECONDS
for p in $precisions; do
    for b in $batches; do
        cooktrain_row "$p" "$b"
        # bf16 attention at head width 64 runs on tensor cores: the wgmma kernels beside them
        if [ "$wgmma" = on ] && [ "$p" = bf16 ] && [ $((D / HEADS)) = 64 ]; then cooktrain_row "$p" "$b" wgmma; fi
        if [ "$graph" = on ]; then cooktrain_row "$p" "$b" graph; fi
    done
done
t_cooktrain=$((t_cooktrain + SECONDS - t0))

# ---- 2. the peers --------------------------------------------------------------------------------------
t0=$SECONDS
: >"$m/peers.log"
if [ -z "$peer_skip" ]; then
    echo "== the PyTorch peers ($torch_line): scripts/torch_gpt2_gpu.py ${PEER_ARGS[*]}"
    rc=0
    gemm=8192
    [ $gemm_done = 0 ] || gemm=0 # the matmul rate is the device's: measured once
    # shellcheck disable=SC2086 # the lists are words on purpose
    "$PY" -u scripts/torch_gpt2_gpu.py --steps "$steps" --warmup $WARMUP --seq $T "${PEER_ARGS[@]}" \
        --batches $batches --precisions $precisions --modes $peers \
        --gemm $gemm --sdpa 2>&1 | tee "$m/peers.log" | awk '!/^step / { print "    " $0; fflush() }' || rc=$?
    if [ $rc != 0 ]; then
        echo "bench_gpu: scripts/torch_gpt2_gpu.py exited $rc (the rows it finished are in the table)"
    fi
    awk '$1 == "row" { $1 = ""; sub(/^ /, ""); print }' "$m/peers.log" >>"$m/rows"
    [ $gemm = 0 ] || grep '^gemm ' "$m/peers.log" >"$tmp/gemm" || true
    gemm_done=1
fi
t_peers=$((t_peers + SECONDS - t0))

# ---- 3. the table --------------------------------------------------------------------------------------
echo
echo "== $TITLE, T $T, one $device"
awk -v f="$flops" -v L="$L" -v T=$T -v d="$D" -v note="$peak_note" 'BEGIN {
    if (f == "") { print "MFU: no FLOP count (cooktrain --gemm-rate failed)"; exit }
    printf "MFU = tok/s x F / peak, F = %.4g FLOP/token, cooktrain'"'"'s own count: 6 FLOPs a token for each weight of a\n", f
    printf "  GEMM (every projection and the LM head tied to the padded embedding; position embedding, norms\n"
    printf "  and biases not), plus 6*L*T*d = 6 x %d x %d x %d for causal attention (QK^T and PV, forward and\n", L, T, d
    printf "  backward, over the half of the TxT square computed).\n"
    printf "  peak: %s\n", note
}'

gemm_rate() { [ -f "$tmp/gemm" ] && awk -v p="$1" '$1 == "gemm" && $2 == p { print $4 }' "$tmp/gemm" | tail -n 1; }
awk -v f="$flops" -v precisions="$precisions" -v batches="$batches" \
    -v pbf16="$peak_bf16" -v pfp32="$peak_fp32" -v gbf16="$(gemm_rate bf16)" -v gfp32="$(gemm_rate fp32)" '
    function gib(x) { return x == "-" ? "-" : sprintf("%.1f GiB", x / 2^30) }
    { key = $1 SUBSEP $2 SUBSEP $3; tps[key] = $4; mem[key] = $5
      note = ""; for (i = 6; i <= NF; i++) note = note (i > 6 ? " " : "") $i; notes[key] = note }
    END {
        peak["bf16"] = pbf16; peak["fp32"] = pfp32; gemm["bf16"] = gbf16; gemm["fp32"] = gfp32
        label["cooktrain"] = "cooktrain"; label["wgmma"] = "cooktrain wgmma"; label["graph"] = "cooktrain graph"
        label["eager"] = "torch eager+SDPA"; label["compile"] = "torch.compile"
        printf "%-17s %-9s %4s %10s %14s %11s %7s %14s %9s\n", "system", "precision", "B", "tok/s",
               "cooktrain/this", "peak mem", "MFU", "matmul 8192^3", "of matmul"
        np = split(precisions, ps, " "); nb = split(batches, bs, " ")
        for (i = 1; i <= np; i++) for (j = 1; j <= nb; j++) {
            p = ps[i]; b = bs[j]; ours = tps["cooktrain" SUBSEP p SUBSEP b]
            for (s = 1; s <= 5; s++) {
                sys = s == 1 ? "cooktrain" : s == 2 ? "wgmma" : s == 3 ? "graph" : s == 4 ? "eager" : "compile"
                key = sys SUBSEP p SUBSEP b
                if (!(key in tps)) continue
                t = tps[key]
                ratio = (t != "-" && ours != "" && ours != "-") ? sprintf("%.2fx", ours / t) : "-"
                mfu = (t != "-" && peak[p] != "" && f != "") ? sprintf("%.1f%%", 100 * t * f / (peak[p] * 1e12)) : "-"
                g = gemm[p] != "" ? sprintf("%.0f TFLOP/s", gemm[p]) : "-"
                og = (t != "-" && gemm[p] != "" && f != "") ? sprintf("%.1f%%", 100 * t * f / (gemm[p] * 1e12)) : "-"
                printf "%-17s %-9s %4d %10s %14s %11s %7s %14s %9s%s\n", label[sys], p, b,
                       t == "-" ? "-" : sprintf("%.0f", t), ratio, gib(mem[key]), mfu, g, og,
                       notes[key] == "ok" ? "" : "  " notes[key]
            }
        }
        print "(cooktrain wgmma: with CT_CUDA_ATTENTION=wgmma, Hopper'"'"'s attention kernels; cooktrain graph: with train.cuda_graph; cooktrain/this: cooktrain tok/s over the row'"'"'s; peak mem: cooktrain'"'"'s allocations (mem_bytes), torch.cuda.max_memory_allocated for the peers;"
        print " of matmul: tok/s x F over the measured 8192^3 matmul rate in that precision)"
    }' "$m/rows"

echo
echo "== where a cooktrain step goes, $TITLE (--profile: ms per step, step $PROFILE_STEPS of a $PROFILE_STEPS-step run, the device synced after every op;"
echo "   then --device-idle, another such run: the device's time between ops on its own clock — waiting for the host to issue the next op, or at a sync —, the most a CUDA graph of the step could save)"
for p in $precisions; do
    for b in $batches; do
        f=$m/cooktrain.$p.$b.profile
        if [ -s "$f" ]; then echo "$p B=$b: $(cat "$f")"; else echo "$p B=$b: no profile (the run failed)"; fi
        [ -s "${f}_ops" ] && echo "$p B=$b: $(cat "${f}_ops")"
        f=$m/cooktrain.$p.$b.idle
        if [ -s "$f" ]; then echo "$p B=$b: $(cat "$f")"; else echo "$p B=$b: no device idle line (the run failed)"; fi
        f=$m/cooktrain.$p.$b.busy
        [ -s "$f" ] && echo "$p B=$b: $(cat "$f")"
    done
done

echo
echo "== attention, forward + backward of all $L layers per step: cooktrain's --profile \"attention\" against causal SDPA ($HEADS heads, $KV key/value heads, T $T, head dim $((D / HEADS)))"
for p in $precisions; do
    for b in $batches; do
        f=$m/cooktrain.$p.$b.profile
        ours="" dev=""
        [ -s "$f" ] && ours=$(sed -n 's/.* attention \([0-9.]*\) .*/\1/p' "$f")
        # the same ops on the device's clock, nothing synced (--device-idle's busy time by op)
        f=$m/cooktrain.$p.$b.busy
        [ -s "$f" ] && dev=$(awk '{ for (i = 1; i < NF; i++) if ($i == "attention_fwd" || $i == "attention_bwd") s += $(i + 1) }
                                  END { if (s > 0) printf "%.3f", s }' "$f")
        # one "sdpa" line per kernel timed (flash, cudnn, efficient, default: scripts/torch_gpt2_gpu.py)
        sdpa=$(awk -v p="$p" -v b="$b" '$1 == "sdpa" && $2 == p && $3 == b { printf "%s %s ", $4, $5 }' "$m/peers.log")
        awk -v p="$p" -v b="$b" -v L="$L" -v ours="$ours" -v dev="$dev" -v sdpa="$sdpa" 'BEGIN {
            n = split(sdpa, s, " ")
            a = ours != "" ? sprintf("cooktrain %.2f ms synced", ours) : "cooktrain: no profile"
            a = a (dev != "" ? sprintf(", %.2f ms on the device clock", dev) : "")
            if (n == 0) { printf "%s B=%d: %s; SDPA not measured\n", p, b, a; exit }
            x = dev != "" ? dev : ours # the ratio of the unsynced figure where there is one
            printf "%s B=%d: %s vs SDPA", p, b, a
            for (i = 1; i < n; i += 2) {
                printf "%s %s %d x %.3f = %.2f ms", (i > 1 ? ";" : ""), s[i + 1], L, s[i], L * s[i]
                if (x != "" && s[i] > 0) printf " (%.2fx)", x / (L * s[i])
            }
            printf "\n" }'
    done
done
echo "(cooktrain's figures: --profile's, a device sync around every op, and --device-idle's time in the attention ops on the"
echo " device's own clock, nothing synced; SDPA's: CUDA events around each forward + backward; (Nx): cooktrain's time, on the"
echo " device clock where measured, over that kernel's; default: the kernel PyTorch picks, which the peers' models run)"

# ---- 5. GEMMs by shape ---------------------------------------------------------------------------------
# each --device-idle run's GEMM shapes, timed again through PyTorch (scripts/gemm_peer.py)
: >"$m/gemm_peer.log"
if [ -z "$peer_skip" ]; then
    logs=()
    for p in $precisions; do
        for b in $batches; do
            f=$m/cooktrain.$p.$b.idle.log
            [ -f "$f" ] && grep -q '^device busy by GEMM shape' "$f" && logs+=("$p B=$b=$f")
        done
    done
    if [ ${#logs[@]} -gt 0 ]; then
        echo
        t0=$SECONDS
        rc=0
        "$PY" -u scripts/gemm_peer.py --reps 10 "${logs[@]}" | tee "$m/gemm_peer.log" || rc=$?
        [ $rc = 0 ] || echo "bench_gpu: scripts/gemm_peer.py exited $rc"
        t_peers=$((t_peers + SECONDS - t0))
    fi
fi

# ---- 6. the targets ------------------------------------------------------------------------------------
# The GPU targets, each from the figures above: tok/s against torch.compile (>= 1.0x) and eager
# (the floor, >= 1.05x; fp32: >= 1.0x), attention on the device clock against SDPA flash (<= 1.25x),
# the step's GEMMs against PyTorch's at the same shapes (<= 1.15x), AdamW + the gradient norm on the
# device clock (<= 3 ms), and cooktrain's memory against torch.compile's (<= 1.0x)
echo
echo "== targets, $TITLE (each from the figures above; met or MISSED)"
for p in $precisions; do
    for b in $batches; do
        busy=$m/cooktrain.$p.$b.busy busyw=$m/wgmma.$p.$b.busy
        [ -s "$busy" ] || busy=/dev/null
        [ -s "$busyw" ] || busyw=/dev/null
        sdpa=$(awk -v p="$p" -v b="$b" '$1 == "sdpa" && $2 == p && $3 == b && $5 == "flash" { print $4 }' "$m/peers.log")
        gemm=$(awk -v key="== GEMMs by shape, $p B=$b:" 'index($0, key) == 1 { on = 1; next }
                  on && /all GEMMs of a step/ { if (match($0, /: [0-9.]+x \(target/)) print substr($0, RSTART + 2, RLENGTH - 11); exit }' "$m/gemm_peer.log")
        awk -v p="$p" -v b="$b" -v L="$L" -v sdpa="$sdpa" -v gemm="$gemm" -v busyf="$busy" -v busyw="$busyw" '
            function verdict(ok) { return ok ? "met" : "MISSED" }
            function attention(file,   line, n, f, i, a) { # attention_fwd + attention_bwd, ms/step
                while ((getline line < file) > 0) {
                    n = split(line, f, " ")
                    for (i = 1; i < n; i++) if (f[i] == "attention_fwd" || f[i] == "attention_bwd") a += f[i + 1]
                }
                close(file)
                return a
            }
            BEGIN {
                while ((getline line < busyf) > 0) {
                    n = split(line, f, " ")
                    for (i = 1; i < n; i++) if (f[i] == "adamw" || f[i] == "sumsq") opt += f[i + 1]
                }
                close(busyf)
                att = attention(busyf); attw = attention(busyw)
            }
            $2 == p && $3 == b && $4 != "-" { tps[$1] = $4; mem[$1] = $5 }
            END {
                pre = sprintf("  %s B=%d: ", p, b)
                if (!("cooktrain" in tps)) { print pre "no cooktrain figures (the run failed)"; exit }
                ours = tps["cooktrain"]
                if ("compile" in tps)
                    printf "%stok/s %.2fx torch.compile (target >= 1.0x): %s\n", pre, ours / tps["compile"], verdict(ours >= tps["compile"])
                if ("eager" in tps) {
                    want = p == "fp32" ? 1.0 : 1.05
                    printf "%stok/s %.2fx PyTorch eager (%s >= %.2fx): %s\n", pre, ours / tps["eager"],
                           p == "fp32" ? "target" : "floor", want, verdict(ours >= want * tps["eager"])
                }
                if ("compile" in mem && mem["compile"] > 0)
                    printf "%smemory %.2f GiB, torch.compile %.2f GiB (target: no more): %s\n", pre, mem["cooktrain"] / 2^30,
                           mem["compile"] / 2^30, verdict(mem["cooktrain"] <= mem["compile"])
                if (att > 0 && sdpa > 0)
                    printf "%sattention %.2f ms on the device clock, %.2fx SDPA flash %d x %.3f ms (target <= 1.25x): %s\n", pre,
                           att, att / (L * sdpa), L, sdpa, verdict(att <= 1.25 * L * sdpa)
                if (gemm != "")
                    printf "%sGEMMs %.2fx PyTorch'"'"'s at the same shapes (target <= 1.15x): %s\n", pre, gemm, verdict(gemm <= 1.15)
                if (opt > 0)
                    printf "%sAdamW + gradient norm %.2f ms on the device clock (target <= 3 ms): %s\n", pre, opt, verdict(opt <= 3)
                if ("wgmma" in tps && "compile" in tps)
                    printf "%swith the wgmma attention: tok/s %.2fx torch.compile (target >= 1.0x): %s\n", pre,
                           tps["wgmma"] / tps["compile"], verdict(tps["wgmma"] >= tps["compile"])
                if ("graph" in tps && "compile" in tps)
                    printf "%swith the CUDA graph: tok/s %.2fx the ops issued one by one, %.2fx torch.compile (target >= 1.0x): %s\n", pre,
                           tps["graph"] / ours, tps["graph"] / tps["compile"], verdict(tps["graph"] >= tps["compile"])
                if (attw > 0 && sdpa > 0)
                    printf "%swith the wgmma attention: attention %.2f ms on the device clock, %.2fx SDPA flash (target <= 1.25x): %s\n",
                           pre, attw, attw / (L * sdpa), verdict(attw <= 1.25 * L * sdpa)
            }' "$m/rows"
    done
done
done
echo
echo "bench_gpu: took $((SECONDS - started)) s: cooktrain $t_cooktrain s, peers $t_peers s"
exit $failed
