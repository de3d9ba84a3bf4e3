#!/usr/bin/env bash
# cli_fuzz.sh — every libFuzzer target of test/fuzz/ (README.md there): the seeds the target
# writes itself (CT_FUZZ_SEEDS=DIR), then every input saved under test/fuzz/regressions/NAME/ run
# once, then CT_FUZZ_SECONDS of fuzzing (3 in make test, 30 in make test-long, 300 in make fuzz)
# from the seeds. Each must end clean: no ASan or UBSan report, no crash, no leak, no input taking
# over 10 s, and no allocation over 256 MiB (inputs are at most 64 KiB, so a parser that asks for
# more has trusted a count). A failure keeps the input that caused it in CT_FUZZ_CRASHES (make fuzz) or prints
# where it was; `build/fuzz/fuzz_NAME FILE` replays it. CT_FUZZ_ONLY=REGEX runs the targets whose
# name matches.
# long: 30 s of fuzzing per target instead of 3
. "$(dirname "$0")/../tools/lib_cli.sh"
secs=${CT_FUZZ_SECONDS:-$([ -n "${CT_LONG:-}" ] && echo 30 || echo 3)}
crashes=${CT_FUZZ_CRASHES:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -n "$crashes" ] && mkdir -p "$crashes"

for name in config shard tokenizer manifest rankfile safetensors hfconfig; do
    [[ $name =~ ${CT_FUZZ_ONLY:-.} ]] || continue
    bin=$BUILD/fuzz/fuzz_$name
    if [ ! -x "$bin" ]; then
        skip "fuzz $name: $bin is not built (no clang with a fuzzer runtime: bash scripts/setup.sh)"
        continue
    fi
    work=$tmp/$name
    mkdir -p "$work/seeds" "$work/corpus" "$work/artifacts"
    if CT_FUZZ_SEEDS="$work/seeds" "$bin" >"$work/seeds.log" 2>&1 && [ -n "$(ls -A "$work/seeds")" ]; then
        ok "fuzz $name: $(ls "$work/seeds" | wc -l) seed inputs written"
    else
        fail "fuzz $name: the target wrote no seeds"
        tail -5 "$work/seeds.log" | sed 's/^/    /'
        continue
    fi
    flags=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 -max_len=65536
        -artifact_prefix="$work/artifacts/")
    regressions=(test/fuzz/regressions/"$name"/*)
    if [ -e "${regressions[0]}" ]; then
        if timeout 300 "$bin" "${flags[@]}" "${regressions[@]}" >"$work/regressions.log" 2>&1; then
            ok "fuzz $name: ${#regressions[@]} regression inputs run clean"
        else
            fail "fuzz $name: a regression input fails again"
            grep -E "ERROR|SUMMARY|Running:" "$work/regressions.log" | tail -6 | sed 's/^/    /'
        fi
    fi
    if timeout $((secs + 120)) "$bin" "${flags[@]}" -max_total_time="$secs" -print_final_stats=1 \
        "$work/corpus" "$work/seeds" >"$work/fuzz.log" 2>&1; then
        runs=$(awk '/stat::number_of_executed_units/ { print $2 }' "$work/fuzz.log")
        ok "fuzz $name: ${runs:-?} inputs in ${secs} s, no finding"
    else
        fail "fuzz $name: a finding (libFuzzer's report follows)"
        grep -E "ERROR|SUMMARY|Test unit written|#[0-9]+ 0x" "$work/fuzz.log" | head -12 | sed 's/^/    /'
        if [ -n "$crashes" ]; then
            cp "$work/artifacts/"* "$crashes/" 2>/dev/null
            echo "    kept in $crashes/; replay: $bin FILE; then add it to test/fuzz/regressions/$name/"
        fi
    fi
done
