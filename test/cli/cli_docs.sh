#!/usr/bin/env bash
# The docs a program can check (test/tools/check_docs.py says each rule): every tracked source
# file in its folder README's file table, README.md's command list equal to `cooktrain --help`'s,
# its package list equal to what scripts/setup.sh installs, README.md and cuda/README.md within
# 250 lines, no file citing an issue number or the cards and folder the project was planned in.
# Then the checker is shown to catch what it guards against: a planted undocumented file, and a
# `--help` that lists a command README.md does not (or the reverse).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$(python3 test/tools/check_docs.py --binary "$BIN" 2>&1)
rc=$?
printf '%s\n' "$out" | sed -n 's/^ok /ok docs: /p; s/^FAIL /FAIL docs: /p'
[ $rc = 0 ] || [ -n "$(printf '%s\n' "$out" | grep '^FAIL ')" ] || fail "docs: check_docs.py exited $rc"

# a source file no README names
if out=$(python3 test/tools/check_docs.py --binary "$BIN" --extra-file core/backend/undocumented_op.c 2>&1); then
    fail "docs: a planted undocumented file passed"
elif printf '%s\n' "$out" | grep -q "^FAIL files: core/backend/undocumented_op.c is not in the file table of core/README.md"; then
    ok "docs: a planted undocumented file is named"
else
    fail "docs: a planted undocumented file: $(printf '%s\n' "$out" | grep '^FAIL' | head -3)"
fi

# a binary whose --help lists one command more, and one fewer
bin_abs=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
cat >"$tmp/more" <<SH
#!/bin/sh
"$bin_abs" --help
echo "  frobnicate  a command README.md does not name"
SH
sed '/^  report /d' <<<"$("$BIN" --help)" >"$tmp/fewer.txt"
printf '#!/bin/sh\ncat "%s"\n' "$tmp/fewer.txt" >"$tmp/fewer"
chmod +x "$tmp/more" "$tmp/fewer"
for c in "more:\`frobnicate\` is a command (--help) missing from README.md's Commands table" \
    "fewer:README.md's Commands table names \`report\`, which --help does not list"; do
    b=${c%%:*} want=${c#*:}
    if out=$(python3 test/tools/check_docs.py --binary "$tmp/$b" 2>&1); then
        fail "docs: a --help with $b commands passed"
    elif printf '%s\n' "$out" | grep -qF "$want"; then
        ok "docs: a --help with $b commands than README.md is caught"
    else
        fail "docs: a --help with $b commands: $(printf '%s\n' "$out" | grep '^FAIL' | head -3)"
    fi
done
