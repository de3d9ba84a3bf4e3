#!/usr/bin/env bash
# `cooktrain report` (README.md, Run reports): three short runs of configs/test-tiny.yaml — one
# process with evaluations, 2 ranks in a pipeline (a bubble), one process with MoE layers — then:
#   - report of the first two overlaid, read back by test/tools/check_report.py: self-contained (no
#     script, no link, no address but the SVG namespace), every chart, every metrics line a point
#     on its exact place (x and y exact linear maps, y downward), memory bars equal to the setup
#     line's bytes;
#   - the same page rendered by headless Chromium (Debian's chromium; skipped with the reason
#     where it is missing): the screenshot is not blank and shows both runs' colours;
#   - the MoE run's report has the tokens-per-expert chart (and the others have none);
#   - the default output is RUN_DIR/report.html;
#   - a missing run, a corrupt metrics line and a run without steps: exit 2, named, with a hint.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup
short=(--set train.steps=12 --set train.warmup_steps=2 --set data.val="$TEST_DATA/val.bin"
       --set train.eval_interval=4 --set train.eval_steps=2)

expect_exit 0 "run a: one process, evaluations every 4 steps" -- "$BIN" "${base[@]}" "${short[@]}" \
    --set log.run_dir="$tmp/a"
expect_exit 0 "run b: 2 ranks, pp 2" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" "${short[@]}" \
    --set parallel.pp=2 --set log.run_dir="$tmp/b"
expect_exit 0 "run c: MoE layers" -- "$BIN" "${base[@]}" "${short[@]}" --set model.n_layer=4 \
    --set model.moe_experts=4 --set model.moe_top_k=2 --set log.run_dir="$tmp/c"

if expect_exit 0 "report of runs a and b" -- "$BIN" report "$tmp/a" "$tmp/b" -o "$tmp/ab.html"; then
    expect_text "report: $tmp/ab.html (2 runs)" "it names the page"
    if out=$(python3 test/tools/check_report.py "$tmp/ab.html" "$tmp/a/metrics.jsonl" "$tmp/b/metrics.jsonl"); then
        ok "the page is self-contained and draws every metric exactly: $out"
    else
        fail "the page: $out"
    fi
    if ! command -v chromium >/dev/null 2>&1; then
        skip "report rendering: chromium not installed (scripts/setup.sh installs it)"
    else
        # a private profile, no sandbox (root), no GPU; bounded in time
        timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
            --user-data-dir="$tmp/chromium" --window-size=1200,1800 \
            --screenshot="$tmp/shot.png" "file://$tmp/ab.html" >"$tmp/chromium.log" 2>&1
        if [ -s "$tmp/shot.png" ] && out=$(python3 test/tools/check_report.py --png "$tmp/shot.png" '#1f77b4' '#d62728'); then
            ok "headless Chromium renders it: $out"
        else
            fail "headless Chromium renders it: ${out:-no screenshot}"
            tail -3 "$tmp/chromium.log" | sed 's/^/    /'
        fi
    fi
fi

if expect_exit 0 "report of the MoE run, to its run directory" -- "$BIN" report "$tmp/c"; then
    if [ -s "$tmp/c/report.html" ]; then ok "written to RUN_DIR/report.html"; else fail "written to RUN_DIR/report.html"; fi
    if out=$(python3 test/tools/check_report.py "$tmp/c/report.html" "$tmp/c/metrics.jsonl" --moe); then
        ok "the MoE page has the tokens-per-expert chart: $out"
    else
        fail "the MoE page: $out"
    fi
fi

expect_exit 2 "report of a missing run" -- "$BIN" report "$tmp/none"
expect_text "cannot read metrics '$tmp/none'" "the refusal names the path"
expect_text "hint:" "with a hint"
mkdir -p "$tmp/bad"
head -3 "$tmp/a/metrics.jsonl" >"$tmp/bad/metrics.jsonl"
echo '{"step": 4, "loss": ' >>"$tmp/bad/metrics.jsonl"
expect_exit 2 "report of a corrupt metrics line" -- "$BIN" report "$tmp/bad"
expect_text "metrics.jsonl:4: not a metrics line" "the refusal names the file and line"
head -1 "$tmp/a/metrics.jsonl" >"$tmp/bad/metrics.jsonl"
expect_exit 2 "report of a run without steps" -- "$BIN" report "$tmp/bad"
expect_text "holds no training steps" "the refusal says why"
