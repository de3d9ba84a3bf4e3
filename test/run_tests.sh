#!/usr/bin/env bash
# The whole suite: the cmocka unit-test binaries (build/test/test_*), then the shell suites
# (test/cli/cli_*.sh and test/mpi/cli_*.sh). Each cmocka case and each shell check counts as a
# test; a check this machine cannot run (cmocka's skip(), a shell test's "skip REASON" line)
# counts as a skip, never as passed. Ends with the skips, each with its test and reason, then one
# line: "tests: N passed, N failed, N skipped". Exit status 0 only when nothing failed.
#
# Parts run side by side, TEST_JOBS (2) cores' worth at a time: a binary or a one-process suite
# takes one, a suite that says `# cores: 2` in its header (several ranks at once) takes two.
# The longest parts start first, by the seconds each took last time in this build folder.
#
#   bash test/run_tests.sh                 everything (make test)
#   bash test/run_tests.sh test_ops        one binary (or shell suite) by name
#   bash test/run_tests.sh test_ops gemm   one case of a binary (cmocka filter, wildcards ok)
#   CT_TESTS="test_data cli_hostile" bash test/run_tests.sh   the named ones (make test SAN=1)
#   CT_QUICK=1 bash test/run_tests.sh      the binaries and the quick suites (make test-quick)
#   CT_LONG=1 bash test/run_tests.sh       the suites with long parts (a `# long: WHAT` header
#                                          line), with them (make test-long)
set -u
BUILD=${BUILD:-build}
TEST_JOBS=${TEST_JOBS:-2}
export CT_BUILD=$BUILD
logdir=$BUILD/test-logs
mkdir -p "$logdir"
only=${1:-}
filter=${2:-}
CT_TESTS=${CT_TESTS:-}
CT_QUICK=${CT_QUICK:-}
export CT_LONG=${CT_LONG:-}
# The quick suites: seconds each (test/README.md, Quick and long).
QUICK_SUITES="cli_smoke cli_docs cli_errors"

# selected NAME: by name, CT_TESTS, and the quick or long selection.
selected_test() {
    local name=$1 file=${2:-}
    [ -n "$only" ] && { [ "$name" = "$only" ]; return; }
    [ -z "${CT_TESTS// /}" ] || [[ " $CT_TESTS " == *" $name "* ]] || return 1
    if [ -n "$CT_QUICK" ] && [ -n "$file" ]; then [[ " $QUICK_SUITES " == *" $name "* ]] || return 1; fi
    if [ -n "$CT_LONG" ]; then [ -n "$file" ] && grep -q '^# long: ' "$file" || return 1; fi
    return 0
}

# Unit tests share the machine's cores when they run side by side: one thread each keeps them
# from oversubscribing, and the thread-determinism tests set their own counts.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMP_WAIT_POLICY=passive

# parts: "KIND NAME PATH CORES" — KIND bin or sh
parts=()
for b in "$BUILD"/test/test_*; do
    [ -x "$b" ] || continue
    [[ $b == *.o || $b == *.d ]] && continue
    name=$(basename "$b")
    [ -n "$CT_LONG" ] && [ -z "$only" ] && continue
    selected_test "$name" || continue
    parts+=("bin $name $b 1")
done
for s in test/cli/cli_*.sh test/mpi/cli_*.sh; do
    [ -f "$s" ] || continue
    name=$(basename "$s" .sh)
    selected_test "$name" "$s" || continue
    cores=$(sed -n 's/^# cores: \([0-9]\).*/\1/p' "$s" | head -1)
    parts+=("sh $name $s ${cores:-1}")
done

# run_part KIND NAME PATH: its output to NAME.log, exit status to NAME.rc, seconds to NAME.secs
# (wall and CPU: the scheduling of the next run reads the wall seconds).
run_part() {
    local kind=$1 name=$2 path=$3 t0 rc
    t0=$(date +%s.%N)
    [ -z "${CT_TIMES:-}" ] || echo "$t0 start $name" >>"$CT_TIMES"
    if [ "$kind" = bin ]; then
        if [ -n "$filter" ]; then
            /usr/bin/time -f '%U %S' -o "$logdir/$name.cpu" "$path" "$filter"
        else
            /usr/bin/time -f '%U %S' -o "$logdir/$name.cpu" "$path"
        fi >"$logdir/$name.log" 2>&1
    else
        /usr/bin/time -f '%U %S' -o "$logdir/$name.cpu" bash "$path" >"$logdir/$name.log" 2>&1
    fi
    rc=$?
    echo "$rc" >"$logdir/$name.rc"
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f\n", b - a }' >"$logdir/$name.secs"
}

start=$(date +%s)
# The test corpus every test reads (test_util.h, lib_cli.sh): made once, before anything runs.
if ! bash scripts/prepare_corpus.sh --byte-level "$BUILD/cooktrain" "$BUILD/test-data/bytes" >/dev/null; then
    echo "FAIL preparing the test corpus (scripts/prepare_corpus.sh --byte-level)"
    echo "tests: 0 passed, 1 failed, 0 skipped"
    exit 1
fi

# Longest first (last run's seconds; unknown ones first of all, then by name).
mapfile -t order < <(for p in "${parts[@]}"; do
    read -r _ name _ _ <<<"$p"
    secs=$(cat "$logdir/$name.secs" 2>/dev/null || echo 100000)
    printf '%s\t%s\n' "$secs" "$p"
done | sort -t$'\t' -k1,1nr -k2 | cut -f2)
for p in "${parts[@]}"; do read -r _ name _ _ <<<"$p"; rm -f "$logdir/$name.rc"; done

passed=0
failed=0
skipped=0
long=0
skips=() # "NAME: reason", printed before the closing line
failures=() # names of the parts that failed, listed again at the end
# report_part KIND NAME: counts a finished part's tests and prints its line (as parts finish).
report_part() {
    local kind=$1 name=$2 log rc secs cpu p f ns c why
    local -a sk
    log=$logdir/$name.log
    rc=$(cat "$logdir/$name.rc" 2>/dev/null || echo "?")
    secs=$(cat "$logdir/$name.secs" 2>/dev/null || echo "?")
    cpu=$(awk '{printf "%.0f", $1 + $2}' "$logdir/$name.cpu" 2>/dev/null)
    if [ "$kind" = bin ]; then
        p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$4} END {print s+0}')
        f=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$log" | awk '{s+=$4} END {print s+0}')
        # cmocka prints "[  SKIPPED ] NAME" for each skipped case (and a count line): the reason
        # is whatever the case printed before it called skip()
        mapfile -t sk < <(grep -E '^\[  SKIPPED \] ' "$log" | grep -vE '^\[  SKIPPED \] [0-9]+ test' |
            sed 's/^\[  SKIPPED \] //' | sort -u)
        for c in "${sk[@]}"; do
            why=$(grep -B1 -xF "[  SKIPPED ] $c" "$log" | head -1)
            case $why in "[ RUN      ] "*) why="skip() without a message" ;; esac
            skips+=("$name $c: $why")
        done
    else
        # Shell suites print "ok <what>" / "FAIL <what>" / "skip <reason>" lines.
        p=$(grep -c '^ok ' "$log")
        f=$(grep -c '^FAIL ' "$log")
        mapfile -t sk < <(sed -n 's/^skip //p' "$log")
        for why in "${sk[@]}"; do skips+=("$name: $why"); done
        long=$((long + $(grep -c '^long ' "$log")))
    fi
    ns=${#sk[@]}
    skipped=$((skipped + ns))
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then
        f=1 # crashed or exited without a summary
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$f" != 0 ]; then
        failures+=("$name")
        echo "FAIL $name (exit $rc, ${secs}s): see $log"
        if [ "$kind" = bin ]; then
            grep -E '^\[  (FAILED|  ERROR) |ERROR|error|Assert|failure' "$log" | head -20
        else
            grep -A3 '^FAIL ' "$log" | head -30
        fi
    else
        echo "ok   $name ($p$([ "$ns" != 0 ] && echo ", $ns skipped"); ${secs}s, cpu ${cpu:-?}s)"
    fi
}

declare -A running=() # pid -> cores
declare -A part_of=() # pid -> "KIND NAME"
# reap: reports every part that has finished and frees its cores.
reap() {
    local pid
    for pid in "${!running[@]}"; do
        kill -0 "$pid" 2>/dev/null && continue
        busy=$((busy - running[$pid]))
        # shellcheck disable=SC2086
        report_part ${part_of[$pid]}
        unset "running[$pid]" "part_of[$pid]"
    done
}
busy=0
for p in "${order[@]}"; do
    read -r kind name path cores <<<"$p"
    [ "$cores" -gt "$TEST_JOBS" ] && cores=$TEST_JOBS
    while [ $((busy + cores)) -gt "$TEST_JOBS" ]; do
        wait -n
        reap
    done
    run_part "$kind" "$name" "$path" &
    running[$!]=$cores
    part_of[$!]="$kind $name"
    busy=$((busy + cores))
done
while [ ${#running[@]} -gt 0 ]; do
    wait -n
    reap
done

if [ ${#failures[@]} -gt 0 ]; then
    echo "failed: ${failures[*]} (logs in $logdir/)"
fi
if [ ${#skips[@]} -gt 0 ]; then
    echo "skipped (not run on this machine):"
    printf '  %s\n' "${skips[@]}"
fi
[ "$long" = 0 ] || echo "left to make test-long: $long parts (\`long\` lines in the logs)"
echo "suite time: $(($(date +%s) - start))s"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
