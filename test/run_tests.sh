#!/usr/bin/env bash
# The whole suite: cmocka unit-test binaries (build/test/test_*) in parallel, then the shell
# tests (test/cli_*.sh) one at a time. Each cmocka case and each shell check counts as a test; a
# check this machine cannot run (cmocka's skip(), a shell test's "skip REASON" line) counts as a
# skip, never as passed. Ends with the skips, each with its test and reason, then one line:
# "tests: N passed, N failed, N skipped". Exit status 0 only when nothing failed.
#
#   bash test/run_tests.sh                 everything
#   bash test/run_tests.sh test_ops        one binary (or shell test) by name
#   bash test/run_tests.sh test_ops gemm   one case of a binary (cmocka filter, wildcards ok)
#   CT_TESTS="test_data cli_hostile" bash test/run_tests.sh   the named ones (`make test SAN=1`)
set -u
BUILD=${BUILD:-build}
TEST_JOBS=${TEST_JOBS:-2}
export CT_BUILD=$BUILD
logdir=$BUILD/test-logs
mkdir -p "$logdir"
only=${1:-}
filter=${2:-}
# selected_test NAME: in CT_TESTS (a space-separated list), or CT_TESTS empty.
selected_test() { [ -z "${CT_TESTS// /}" ] || [[ " $CT_TESTS " == *" $1 "* ]]; }
CT_TESTS=${CT_TESTS:-}

# Unit tests share the machine's cores when they run in parallel: one thread each keeps them
# from oversubscribing, and the thread-determinism tests set their own counts.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMP_WAIT_POLICY=passive

binaries=()
for b in "$BUILD"/test/test_*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    [ -n "$only" ] && [ "$name" != "$only" ] && continue
    selected_test "$name" || continue
    binaries+=("$b")
done

run_binary() {
    local b=$1 name
    name=$(basename "$b")
    if [ -n "$filter" ]; then "$b" "$filter"; else "$b"; fi >"$logdir/$name.log" 2>&1
    echo $? >"$logdir/$name.rc"
}
export -f run_binary
export logdir filter

start=$(date +%s)
# The test corpus every test reads (test_util.h, lib_cli.sh): made once, before anything runs.
if ! bash scripts/prepare_corpus.sh --byte-level "$BUILD/cooktrain" "$BUILD/test-data/bytes" >/dev/null; then
    echo "FAIL preparing the test corpus (scripts/prepare_corpus.sh --byte-level)"
    echo "tests: 0 passed, 1 failed, 0 skipped"
    exit 1
fi
if [ ${#binaries[@]} -gt 0 ]; then
    printf '%s\n' "${binaries[@]}" | xargs -P "$TEST_JOBS" -I{} bash -c 'run_binary {}'
fi

passed=0
failed=0
skipped=0
skips=() # "NAME: reason", printed before the closing line
for b in "${binaries[@]}"; do
    name=$(basename "$b")
    log=$logdir/$name.log
    rc=$(cat "$logdir/$name.rc")
    p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$4} END {print s+0}')
    f=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$log" | awk '{s+=$4} END {print s+0}')
    # cmocka prints "[  SKIPPED ] NAME" for each skipped case (and a count line): the reason is
    # whatever the case printed before it called skip()
    mapfile -t sk < <(grep -E '^\[  SKIPPED \] ' "$log" | grep -vE '^\[  SKIPPED \] [0-9]+ test' |
        sed 's/^\[  SKIPPED \] //' | sort -u)
    for c in "${sk[@]}"; do
        why=$(grep -B1 -xF "[  SKIPPED ] $c" "$log" | head -1)
        case $why in "[ RUN      ] "*) why="skip() without a message" ;; esac
        skips+=("$name $c: $why")
    done
    ns=${#sk[@]}
    skipped=$((skipped + ns))
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then
        f=1 # crashed or exited without a summary
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$f" != 0 ]; then
        echo "FAIL $name (exit $rc): see $log"
        grep -E '^\[  (FAILED|  ERROR) |ERROR|error|Assert|failure' "$log" | head -20
    else
        echo "ok   $name ($p$([ "$ns" != 0 ] && echo ", $ns skipped"))"
    fi
done

# Shell tests print "ok <what>" / "FAIL <what>" / "skip <reason>" lines.
for s in test/cli/cli_*.sh test/mpi/cli_*.sh; do
    [ -f "$s" ] || continue
    name=$(basename "$s" .sh)
    [ -n "$only" ] && [ "$name" != "$only" ] && continue
    selected_test "$name" || continue
    t0=$(date +%s)
    out=$(bash "$s" 2>&1)
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    p=$(printf '%s\n' "$out" | grep -c '^ok ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    mapfile -t sk < <(printf '%s\n' "$out" | sed -n 's/^skip //p')
    for why in "${sk[@]}"; do skips+=("$name: $why"); done
    ns=${#sk[@]}
    skipped=$((skipped + ns))
    if [ $rc != 0 ] && [ "$f" = 0 ]; then f=1; fi
    printf '%s\n' "$out" >"$logdir/$name.log"
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$f" != 0 ]; then
        echo "FAIL $name: see $logdir/$name.log"
        printf '%s\n' "$out" | grep -A3 '^FAIL ' | head -30
    else
        echo "ok   $name ($p$([ "$ns" != 0 ] && echo ", $ns skipped"), ${secs}s)"
    fi
done

if [ ${#skips[@]} -gt 0 ]; then
    echo "skipped (not run on this machine):"
    printf '  %s\n' "${skips[@]}"
fi
echo "suite time: $(( $(date +%s) - start ))s"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
