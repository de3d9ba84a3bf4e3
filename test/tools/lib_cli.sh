# lib_cli.sh — helpers for the shell tests (sourced). Each check prints "ok <what>",
# "FAIL <what>" plus context, or "skip <reason>" for checks this machine cannot run (a tool or
# build missing); run_tests.sh counts those lines and lists the skips with their reasons.
BUILD=${CT_BUILD:-build}
BIN=$BUILD/cooktrain

# CT_TIMES=FILE appends each check's line to FILE after the time it was printed (seconds since
# the epoch), to find where a suite spends its time: test/tools/check_times.py FILE.
ct_time_() { [ -z "${CT_TIMES:-}" ] || echo "$(date +%s.%N) $*" >>"$CT_TIMES"; }
ok() { echo "ok $*"; ct_time_ "ok $*"; }
fail() { echo "FAIL $*"; ct_time_ "FAIL $*"; }
# skip REASON: what was not run and why ("GPU script tests: cooktrain-cuemu not built"). Never an
# ok: a machine without a tool must not look all green.
skip() { echo "skip $*"; ct_time_ "skip $*"; }

# long_part NAME: true under `make test-long` (CT_LONG=1); otherwise prints "long NAME" (counted
# by run_tests.sh as left to make test-long) and is false. A suite wraps its soak-style and
# repeated-layout checks in it: make test keeps a sample of each kind, make test-long runs all.
long_part() {
    [ -n "${CT_LONG:-}" ] && return 0
    echo "long $*"
    return 1
}

# selected NAME: true unless CT_FILTER (an extended regex) is set and NAME does not match it. The
# equivalence loops use it so that one layout can be run alone (`make mutants` does).
selected() { [ -z "${CT_FILTER:-}" ] || printf '%s\n' "$1" | grep -qE -- "$CT_FILTER"; }

# expect_exit CODE WHAT -- command...   (stdout+stderr captured in $OUT_TEXT)
expect_exit() {
    local want=$1 what=$2
    shift 3
    OUT_TEXT=$(timeout 300 "$@" 2>&1 </dev/null)
    local rc=$?
    if [ "$rc" = "$want" ]; then
        ok "$what (exit $rc)"
        return 0
    fi
    fail "$what: expected exit $want, got $rc"
    printf '%s\n' "$OUT_TEXT" | head -10 | sed 's/^/    /'
    return 1
}

# expect_text SUBSTRING WHAT  — checks $OUT_TEXT
expect_text() {
    if printf '%s' "$OUT_TEXT" | grep -qF -- "$1"; then
        ok "$2"
    else
        fail "$2: output lacks '$1'"
        printf '%s\n' "$OUT_TEXT" | head -10 | sed 's/^/    /'
    fi
}

# expect_layout_chosen WAS N NAME: $OUT_TEXT says parallel.auto_layout replaced the layout WAS
# ("tp 1 x pp 2 x dp 4") on N ranks with the planner's choice, one of tp 1 that fills N ranks
# (which one depends on the hardware rank 0 measured; test_plan checks the ranking itself)
expect_layout_chosen() {
    local line pp dp
    line=$(printf '%s\n' "$OUT_TEXT" | grep -F "parallel.auto_layout: $1 does not fit $2 ranks; chose tp 1 x pp " |
        grep -F "by the planner's estimate on cpu")
    pp=$(printf '%s' "$line" | sed -n 's/.*; chose tp 1 x pp \([0-9]*\) x dp \([0-9]*\),.*/\1/p')
    dp=$(printf '%s' "$line" | sed -n 's/.*; chose tp 1 x pp \([0-9]*\) x dp \([0-9]*\),.*/\2/p')
    if [ -n "$pp" ] && [ -n "$dp" ] && [ $((pp * dp)) = "$2" ]; then
        ok "$3: chose pp $pp x dp $dp"
    else
        fail "$3: no planner's choice of tp 1 x pp x dp = $2 ranks in the output"
        printf '%s\n' "$OUT_TEXT" | grep auto_layout | head -3 | sed 's/^/    /'
    fi
}

# ---- MPI tests -------------------------------------------------------------------------------
# One thread per rank and passive waiting, so oversubscribed ranks do not starve each other.
mpi_setup() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
    MPIRUN=(timeout 300 mpirun --oversubscribe --bind-to none)
    # Under `make test SAN=1`, ranks keep ASan's memory checks but not its leak report: Open MPI
    # leaves allocations at exit in plugins it has unloaded, which no suppression can name.
    export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
}

# run_mpi_program NP PROGRAM — relays its ok/FAIL/skip lines; a crash without FAIL lines is a FAIL.
run_mpi_program() {
    local np=$1 prog=$2 out rc
    out=$("${MPIRUN[@]}" -np "$np" "$prog" 2>&1 </dev/null)
    rc=$?
    printf '%s\n' "$out" | grep -E '^(ok|FAIL|skip) '
    if [ $rc != 0 ] && ! printf '%s\n' "$out" | grep -q '^FAIL '; then
        fail "$(basename "$prog") at $np ranks exited $rc"
        printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
    fi
}

# rank_dirs_command DIR: sets RANK_CMD to a 2-rank job whose rank R trains configs/test-tiny.yaml
# inside DIR/rankR on a relative data.train=train.bin, so each rank reads its own file (a file
# missing or corrupt on one rank only).
rank_dirs_command() {
    local here bin
    here=$(pwd)
    bin=$BIN
    [ "${bin#/}" = "$bin" ] && bin=$here/$BIN # BUILD may be relative or absolute
    RANK_CMD=("${MPIRUN[@]}" -np 2 bash -c \
        'cd "$0/rank$OMPI_COMM_WORLD_RANK" && exec "$1" train --config "$2/configs/test-tiny.yaml" --set train.threads=1 --set data.train=train.bin' \
        "$1" "$bin" "$here")
}

# The byte-level test corpus (fortunes text, every byte a token < 123) that configs/test-tiny.yaml
# trains on, made by scripts/prepare_corpus.sh --byte-level; sets TEST_DATA (train.bin, val.bin)
# and TEST_TEXT (the text itself). run_tests.sh prepares it before any test runs.
ensure_test_data() {
    TEST_DATA=$BUILD/test-data/bytes
    TEST_TEXT=$TEST_DATA/text.txt
    bash scripts/prepare_corpus.sh --byte-level "$BIN" "$TEST_DATA" >/dev/null ||
        fail "prepare the byte-level test corpus"
}

# The equivalence runs (core/README.md, Determinism): configs/test-tiny.yaml on the test corpus, one
# thread per rank; sets `base`. train.eps is 1e-6 instead of 1e-8: AdamW divides by sqrt(v) + eps,
# so an element whose gradient is pure rounding noise (~1e-9: the key bias, whose exact gradient is
# 0) would move by up to lr in a direction set by the order of a float sum; at 1e-6 — three orders
# below real gradients (~1e-3) — such elements stay put and every real update is unchanged.
equivalence_setup() {
    ensure_test_data
    base=(train --config configs/test-tiny.yaml --set train.threads=1
          --set data.train="$TEST_DATA/train.bin" --set train.eps=1e-6)
}

# reference_run DIR: the world-size-1 run every layout is compared with: DIR/ref.jsonl (metrics),
# DIR/ref.bin (final parameters), DIR/init.bin (parameters before the first step).
reference_run() {
    expect_exit 0 "reference run (world size 1)" -- "$BIN" "${base[@]}" \
        --set log.metrics="$1/ref.jsonl" --dump-params "$1/ref.bin" --dump-init-params "$1/init.bin"
}

# check_against_reference NAME DIR: compares DIR/run.{jsonl,bin} with the reference in DIR
# (test/tools/compare_runs.py states the tolerances) including the accounting.
# In bf16 (DIR/twin.{jsonl,bin} present: the reference config trained in fp32) the allowance is
# the twins' distance (--noise; compare_runs.py says why).
check_against_reference() {
    local name=$1 dir=$2 out noise=()
    [ -f "$dir/twin.bin" ] && noise=(--noise "$dir/twin.jsonl" "$dir/twin.bin")
    if out=$(python3 test/tools/compare_runs.py "$dir/ref.jsonl" "$dir/ref.bin" "$dir/run.jsonl" "$dir/run.bin" \
        --init "$dir/init.bin" --accounting "${noise[@]}"); then
        ok "$name matches world size 1; $out"
    else
        fail "$name: $out"
    fi
}

# reshard_check NAME DIR CK STEP SNP SARGS LNP LARGS: trains at SNP ranks with SARGS (split into
# words) until step STEP with checkpoints in CK, resumes that checkpoint at LNP ranks with LARGS,
# and compares the two halves joined with DIR/ref.{jsonl,bin} (the world-size-1 run of as many
# steps; DIR/init.bin its start). Both runs use `base` and the array `reshard_extra` (may be unset).
reshard_check() {
    local name=$1 d=$2 ck=$3 step=$4 snp=$5 sargs=$6 lnp=$7 largs=$8 out
    local extra=("${reshard_extra[@]}")
    # shellcheck disable=SC2086
    expect_exit 0 "$name: save" -- "${MPIRUN[@]}" -np "$snp" "$BIN" "${base[@]}" "${extra[@]}" $sargs \
        --set checkpoint.dir="$ck" --set train.stop_after="$step" --set log.metrics="$d/first.jsonl" || return 0
    rm -f "$d/run.bin"
    # shellcheck disable=SC2086
    expect_exit 0 "$name: resume" -- "${MPIRUN[@]}" -np "$lnp" "$BIN" "${base[@]}" "${extra[@]}" $largs \
        --set checkpoint.resume="$ck/step-$(printf %08d "$step")" --set log.metrics="$d/second.jsonl" \
        --dump-params "$d/run.bin" || return 0
    cat "$d/first.jsonl" "$d/second.jsonl" >"$d/run.jsonl"
    if out=$(python3 test/tools/compare_runs.py "$d/ref.jsonl" "$d/ref.bin" "$d/run.jsonl" "$d/run.bin" --init "$d/init.bin"); then
        ok "$name matches world size 1; $out"
    else
        fail "$name: $out"
    fi
}
