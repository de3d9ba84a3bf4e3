#!/usr/bin/env bash
# Every example command of every README.md in the repository (the top one first, then the
# folders' in name order) runs as written, on a fresh tree: each ```sh block is executed line by
# line (a trailing backslash continues a line) in a scratch directory that holds the repository's
# files but none of its data/ or runs/, so an example that needs data must make it with the
# README's own commands first (a folder README's examples run after the top README's, in the same
# scratch tree). A block fenced without a language (plain ```) is shown, not run: that is how a
# README shows commands that need a cluster, a GPU or many minutes. Skipped: `make run` and
# `make test` (and test-quick, test-long) themselves (the suite is already running; make run is a
# long training of what the other examples exercise). A line whose comment says "exit N" must exit with N (an example of an
# error); every other line must exit 0. Training commands are shortened with overrides appended
# after the example's own (--set is applied in order, so the last one wins): 3 steps, evaluation
# and the sample kept but small (off where the example turns it off), one thread per rank. mpirun gets the root and oversubscription
# permissions through the environment, as a user on this machine would pass the flags.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
export OMPI_MCA_rmaps_base_oversubscribe=1

# The scratch tree: every tracked top-level entry, and the build directory.
root=$(pwd)
mkdir -p "$tmp/tree"
for entry in $(git ls-files | cut -d/ -f1 | sort -u); do ln -s "$root/$entry" "$tmp/tree/$entry"; done
ln -s "$root/$BUILD" "$tmp/tree/build"

# commands FILE: the lines of its ```sh blocks, continuations joined, comments and blanks dropped.
commands() {
    awk '
        /^```sh[[:space:]]*$/ { inside = 1; next }
        /^```/ { inside = 0; next }
        inside {
            line = $0
            if (cont != "") { line = cont " " line; cont = "" }
            if (line ~ /\\[[:space:]]*$/) { sub(/\\[[:space:]]*$/, "", line); cont = line; next }
            sub(/^[[:space:]]+/, "", line)
            if (line == "" || line ~ /^#/) next
            print line
        }' "$1"
}

shorten=(--set train.steps=3 --set train.warmup_steps=1 --set train.eval_interval=2
         --set train.eval_steps=1 --set log.sample_tokens=16 --set train.threads=1)
n=0
# The READMEs: the top one first (the folders' examples may use the data its examples make).
docs=(README.md $(git ls-files '*/README.md' | sort))
# A fence is ```sh (run) or ``` (shown); any other language would be neither run nor marked.
other=$(grep -Hn '^```[^`]' "${docs[@]}" | grep -v ':```sh[[:space:]]*$')
if [ -z "$other" ]; then ok "every fenced block of the READMEs is \`\`\`sh (run) or plain (shown)"
else fail "fenced blocks neither run nor plain: $other"; fi
for doc in "${docs[@]}"; do
    while IFS= read -r cmd; do
        # Drop a trailing comment for the name; the shell ignores it anyway.
        name=$(printf '%s' "$cmd" | sed 's/[[:space:]]*#.*$//')
        case "$name" in
            "make run" | "make test" | "make test-"*) continue ;;
        esac
        n=$((n + 1))
        want=$(printf '%s' "$cmd" | sed -n 's/.*#.*exit \([0-9]\+\).*/\1/p')
        want=${want:-0}
        extra=""
        if printf '%s' "$name" | grep -q 'cooktrain train' && ! printf '%s' "$name" | grep -q -- '--print-config'; then
            extra="${shorten[*]}"
            # an example that turns the sample off (context parallelism refuses one) keeps it off
            if printf '%s' "$name" | grep -q -- 'log.sample_tokens=0'; then
                extra="$extra --set log.sample_tokens=0"
            fi
        fi
        (cd "$tmp/tree" && timeout 600 bash -c "$name $extra") >"$tmp/out.txt" 2>&1 </dev/null
        rc=$?
        if [ "$rc" = "$want" ]; then
            ok "$doc: $name (exit $rc)"
        else
            fail "$doc: $name (exit $rc, expected $want)"
            tail -5 "$tmp/out.txt" | sed 's/^/    /'
        fi
    done < <(commands "$doc")
done
if [ "$n" -ge 8 ]; then ok "the ${#docs[@]} READMEs hold $n example commands"; else fail "the READMEs hold only $n example commands (the extraction broke?)"; fi
