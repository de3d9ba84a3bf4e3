# lib_cli.sh — helpers for the shell tests (sourced). Each check prints "ok <what>" or
# "FAIL <what>" plus context; run_tests.sh counts those lines.
BUILD=${CT_BUILD:-build}
BIN=$BUILD/cooktrain
SHARED=${CT_SHARED:-../shared}

ok() { echo "ok $*"; }
fail() { echo "FAIL $*"; }

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
