#!/usr/bin/env bash
# Context parallelism (parallel/README.md, Context parallelism) under mpirun: ring attention
# (core/model/ring_attention.h) at cp 1, 2, 4 and 8 against one rank's attention on the whole
# sequence — out, lse, dq, dk, dv and the qkv bias gradient of each rank's rows, zigzag and
# contiguous, MHA and GQA, fp32 and bf16 — the bytes each ring sends, bit-identical reruns, and
# the causal work per rank (test/mpi/mpi_test_cp.c states the tolerances).
. "$(dirname "$0")/../tools/lib_cli.sh"
mpi_setup

for np in 1 2 4 8; do run_mpi_program "$np" "$BUILD/test/mpi_test_cp"; done

# Training with context parallelism against world size 1 (test/tools/compare_runs.py's tolerances and
# accounting): cp 2 and 4, zigzag and contiguous, with tp (and sequence parallelism), dp with
# ZeRO, pp and recompute; GPT-2's learned positions, then Llama's rotary ones.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
equivalence_setup
base+=(--set log.sample_tokens=0)
for arch in gpt2 llama; do
    [ $arch = llama ] && base+=(--set model.arch=llama --set model.n_kv_head=4 --set model.d_ff=128)
    reference_run "$tmp" || continue
    # cp  tp  dp  zero  sp  extra
    while read -r cp tp dp zero sp extra; do
        name="$arch cp=$cp tp=$tp dp=$dp zero=$zero sp=$sp $extra"
        selected "$name" || continue
        pp=1
        [[ $extra == *parallel.pp=2* ]] && pp=2
        # shellcheck disable=SC2086
        if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np $((cp * tp * dp * pp)) "$BIN" "${base[@]}" \
            --set parallel.cp="$cp" --set parallel.tp="$tp" --set parallel.zero_stage="$zero" \
            --set parallel.sequence_parallel="$sp" $extra \
            --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin"; then
            expect_text "all bit-identical" "$name: every replica holds the same bytes"
            check_against_reference "$name" "$tmp"
        fi
    done <<'RUNS'
2 1 1 0 false
4 1 1 0 false
2 1 1 0 false --set parallel.cp_sharding=contiguous
2 2 1 0 false
2 2 1 0 true
4 2 1 0 true
2 1 2 1 false
2 1 2 3 false
2 1 1 0 false --set parallel.pp=2
2 1 1 0 false --set train.recompute=full
2 1 1 0 false --set parallel.pp=2 --set parallel.schedule=zbh1
2 1 1 0 false --set parallel.pp=2 --set parallel.schedule=zbv --set parallel.virtual_stages=2
RUNS
done

# A checkpoint saved at cp 2 resumes at cp 1 (with dp 2) and at cp 4; one saved at world size 1
# resumes at cp 2 with tp 2: the losses and final parameters equal world size 1's.
if selected "reshard"; then
    base=("${base[@]:0:${#base[@]}-6}") # GPT-2 again (the Llama settings were appended last)
    d=$tmp/reshard
    mkdir -p "$d"
    if reference_run "$d"; then
        # save: name np settings | resume: name np settings
        while IFS='|' read -r sname snp sargs lname lnp largs; do
            reshard_check "reshard $sname -> $lname" "$d" "$d/ck-$sname-$lname" 2 "$snp" "$sargs" "$lnp" "$largs"
        done <<'RESHARD'
cp2-zero1|2|--set parallel.cp=2 --set parallel.zero_stage=1|dp2-zero1|2|--set parallel.zero_stage=1
cp2|2|--set parallel.cp=2|cp4-zero3|4|--set parallel.cp=4 --set parallel.zero_stage=3
w1|1||cp2-tp2-sp|4|--set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
RESHARD
        # the one-process commands read a checkpoint saved at cp 2 as any other
        expect_exit 0 "eval of a checkpoint saved at cp 2" -- "$BIN" eval "$d/ck-cp2-cp4-zero3/step-00000002" \
            --data "$TEST_DATA/val.bin" --samples 4
    fi
fi

# The trace (log.trace): every kv hop in flight across the block computed while it travels, every
# dK/dV partial across the next backward block (test/tools/check_overlap.py --ring), at cp 4
if selected "trace" &&
    expect_exit 0 "cp 4 with a trace" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" \
        --set parallel.cp=4 --set model.n_layer=2 --set train.steps=1 --set train.warmup_steps=1 \
        --set log.trace="$tmp/trace/cp.json"; then
    if out=$(python3 test/tools/check_overlap.py --ring "$tmp"/trace/cp.rank*.json); then
        ok "cp 4 trace: $out"
    else
        fail "cp 4 trace: $out"
    fi
fi

# Settings context parallelism cannot run: exit 2 on every rank with the numbers and a hint.
if selected "invalid"; then
    expect_exit 2 "cp whose 2 x cp does not divide seq_len" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" \
        --set parallel.cp=2 --set model.seq_len=30
    expect_text "parallel.cp=2 needs model.seq_len=30 divisible by 2 x cp = 4" "the message names seq_len and 2 x cp"
    expect_text "hint: use model.seq_len=28 or 32" "the hint offers the neighbours"
    expect_exit 2 "cp with sequence parallelism: seq_len not divisible by 2 x cp x tp" -- \
        "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" --set parallel.cp=2 --set parallel.tp=2 \
        --set parallel.sequence_parallel=true --set model.seq_len=36
    expect_text "divisible by 2 x cp x parallel.tp = 8" "with sequence parallelism tp joins the divisor"
    expect_exit 2 "a world size that tp x cp x pp does not divide" -- "${MPIRUN[@]}" -np 3 "$BIN" "${base[@]}" \
        --set parallel.cp=2
    expect_text "parallel.tp=1 x parallel.cp=2 x parallel.pp=1 = 2 ranks per model replica" "the grid names cp"
    expect_exit 0 "cp 2 in check mode: every ring op agrees with the CPU's" -- env CT_CHECK_BACKEND=1 \
        "${MPIRUN[@]}" -x CT_CHECK_BACKEND -np 2 "$BIN" "${base[@]}" --backend cpu-async \
        --set parallel.cp=2 --set model.n_layer=4
    expect_text "every op checked against the CPU backend" "the run was checked"
fi

# configs/long-context.yaml, shortened to 2048 positions and one step: under a memory cap that
# one rank's activations exceed (cp 1 needs about 27 MiB, cp 4 about 8 per rank) cp 1 stops at
# start for lack of memory and cp 4 trains.
if selected "long"; then
    long=(train --config configs/long-context.yaml --set data.train="$TEST_DATA/train.bin"
          --set data.val="$TEST_DATA/val.bin" --set model.seq_len=2048 --set train.steps=1
          --set train.threads=1)
    expect_exit 1 "long context at cp 1 under a 16 MiB cap" -- env COOKTRAIN_MEM_LIMIT_MB=16 "$BIN" \
        "${long[@]}" --set parallel.cp=1
    expect_text "memory: could not allocate" "cp 1 runs out of memory"
    expect_exit 0 "long context at cp 4 under the same cap" -- env COOKTRAIN_MEM_LIMIT_MB=16 \
        "${MPIRUN[@]}" -np 4 "$BIN" "${long[@]}"
    expect_text "cp traffic step 1 (rank 0): 5.000 MiB measured, 5.000 MiB expected" \
        "cp 4: the ring's bytes are the formula's"
fi

# scripts/bench_cp.sh runs (its figures are not checked here: they are a machine's, see
# scripts/README.md) and prints a row per run, none failed.
if selected "bench"; then
    if out=$(BUILD=$BUILD bash scripts/bench_cp.sh --seqs 256 --cps "1 2" --steps 2 --data "$TEST_DATA" 2>&1); then
        rows=$(printf '%s\n' "$out" | awk '$1 == 256 && ($2 == 1 || $2 == 2) && $0 !~ /failed/' | wc -l)
        if [ "$rows" = 2 ]; then ok "bench_cp.sh: a row for cp 1 and cp 2"; else fail "bench_cp.sh rows: $out"; fi
    else
        fail "bench_cp.sh exited non-zero: $(printf '%s\n' "$out" | tail -3)"
    fi
    expect_exit 2 "bench_cp.sh with a bad option" -- bash scripts/bench_cp.sh --steps 1
    expect_text "hint:" "bench_cp.sh says how to call it"
fi
