#!/usr/bin/env bash
# `cooktrain report` (README.md, Run reports): three short runs of configs/test-tiny.yaml — one
# process with evaluations, 2 ranks in a pipeline (a bubble), one process with MoE layers — and
# hand-crafted metrics files (no training), then:
#   - report of the first two overlaid, given as files, read back by test/tools/check_report.py:
#     self-contained (no script, no link, no address but the SVG namespace), every chart, every
#     metrics line a point on its exact place (x and y exact linear maps, y downward), memory bars
#     equal to the setup line's bytes; and readable (check_report.py says how each is read from
#     the SVG's text): no "nan", byte counts in MiB or GiB, every label and legend entry whole and
#     inside its chart, totals beside their bars, one tick format per axis, whole steps, each run
#     labelled by its folder;
#   - the same page rendered by headless Chromium (Debian's chromium; skipped with the reason
#     where it is missing): the screenshot is not blank and shows both runs' colours;
#   - the MoE run's report has the tokens-per-expert chart with a legend of every expert (and the
#     others have none);
#   - a run resumed into its own metrics file, three segments, the second restarted from an older
#     checkpoint (it runs steps 4 and 5 again), beside an older file of two runs' lines joined
#     (no start_step), both in folders named "run": every step drawn once, in order, each resume
#     marked on every step chart and counted in the table, memory of the last segment in GiB, the
#     runs told apart by their parent folders; rendered by Chromium too;
#   - a one-step run without evaluation, of 40 experts, started over after two steps: whole steps
#     on x, a dash for its best validation loss, the experts' legend in rows within the chart, the
#     restart marked;
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

# screenshot PAGE PNG COLOR...: headless Chromium renders PAGE into PNG, which must not be blank
# and must show every COLOR (the runs' colours)
screenshot() {
    local page=$1 png=$2 out
    shift 2
    if ! command -v chromium >/dev/null 2>&1; then
        skip "report rendering: chromium not installed (scripts/setup.sh installs it)"
        return
    fi
    # a private profile, no sandbox (root), no GPU; bounded in time
    timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --user-data-dir="$tmp/chromium" --window-size=1200,1800 \
        --screenshot="$png" "file://$page" >"$tmp/chromium.log" 2>&1
    if [ -s "$png" ] && out=$(python3 test/tools/check_report.py --png "$png" "$@"); then
        ok "headless Chromium renders $(basename "$page"): $out"
    else
        fail "headless Chromium renders $(basename "$page"): ${out:-no screenshot}"
        tail -3 "$tmp/chromium.log" | sed 's/^/    /'
    fi
}

if expect_exit 0 "report of runs a and b, given as files" -- \
    "$BIN" report "$tmp/a/metrics.jsonl" "$tmp/b/metrics.jsonl" -o "$tmp/ab.html"; then
    expect_text "report: $tmp/ab.html (2 runs)" "it names the page"
    if out=$(python3 test/tools/check_report.py "$tmp/ab.html" "$tmp/a/metrics.jsonl" \
        "$tmp/b/metrics.jsonl" --names a,b); then
        ok "the page is self-contained, draws every metric exactly and reads at a glance: $out"
    else
        fail "the page: $out"
    fi
    screenshot "$tmp/ab.html" "$tmp/shot.png" '#1f77b4' '#d62728'
fi

if expect_exit 0 "report of the MoE run, to its run directory" -- "$BIN" report "$tmp/c"; then
    if [ -s "$tmp/c/report.html" ]; then ok "written to RUN_DIR/report.html"; else fail "written to RUN_DIR/report.html"; fi
    if out=$(python3 test/tools/check_report.py "$tmp/c/report.html" "$tmp/c/metrics.jsonl" --moe \
        --names c); then
        ok "the MoE page has the tokens-per-expert chart and its legend: $out"
    else
        fail "the MoE page: $out"
    fi
fi

# Hand-crafted metrics: x/run resumed into its own file (segments from steps 1, 4 and 7; the
# second restarted from the checkpoint of step 3 after step 5 was logged, so its steps 4 and 5
# replace the first's), y/run an older file of two runs' lines joined (no start_step: the second
# continues after the last step, at 4), one/ a run of 40 experts (their legend takes rows, then
# "+8 more") started over after two steps, and stopped after one. The lr crosses 1e-3 (where a tick
# format chosen per value would change), x/run's last segment has GiB of memory.
python3 - "$tmp/craft" <<'EOF'
import json, os, sys
out, MIB = sys.argv[1], 1 << 20


def setup(mem, **more):
    line = {"setup": True, "world": 1, "dp": 1, "zero_stage": 0, "steps": 9, "precision": "f32"}
    line.update({"mem_" + k: v for k, v in mem.items()}, **more)
    return line


def step(s, segment, mem):
    return {"step": s, "loss": 5 - 0.1 * s + 0.01 * segment, "lr": min(1e-3, 2e-4 * s),
            "grad_norm": 1 + 0.1 * segment, "tokens_per_s": 4000 + 100 * s,
            "exposed_comm_s": 0.001 * s, "bubble_s": 0.0, "mfu": 0.2, "mem_bytes": mem}


def write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(l) + "\n" for l in lines)


small = {"params": 100 * MIB, "grads": 100 * MIB, "optim": 200 * MIB, "workspace": MIB}
big = {"params": 1536 * MIB, "grads": 1536 * MIB, "optim": 3072 * MIB, "master": 1536 * MIB,
       "acts": 700 * MIB, "comm": 64 * MIB, "gathered": 128 * MIB, "workspace": 3 * MIB}
write(f"{out}/x/run/metrics.jsonl",
      [setup(small)] + [step(s, 1, 1.5 * 2**30) for s in (1, 2, 3, 4)]
      + [{"step": 4, "val_loss": 4.7}, step(5, 1, 1.5 * 2**30)]
      + [setup(small, start_step=4, resumed_from="ck/step-00000003"), step(4, 2, 1.5 * 2**30),
         {"remeasured": True, "from_step": 5, "peak_flops_per_s": 1e11, "gemm_flops_per_s": 9e10}]
      + [step(s, 2, 1.5 * 2**30) for s in (5, 6)]
      + [setup(big, world=2, dp=2, start_step=7, resumed_from="ck/step-00000006")]
      + [step(s, 3, 2.5 * 2**30) for s in (7, 8, 9)])
small = {"params": 50 * MIB, "grads": 50 * MIB, "optim": 100 * MIB}
write(f"{out}/y/run/metrics.jsonl", [setup(small)] + [step(s, 1, 300 * MIB) for s in (1, 2, 3)]
      + [setup(small)] + [step(s, 2, 300 * MIB) for s in (4, 5)])
per = [100 + e for e in range(40)]
moe = dict(moe_tokens_per_expert=per, moe_load_min=min(per), moe_load_max=max(per),
           moe_load_mean=sum(per) / len(per))
small = {"params": 10 * MIB, "optim": 20 * MIB}
write(f"{out}/one/metrics.jsonl",
      [setup(small, start_step=1)] + [dict(step(s, 1, 40 * MIB), **moe) for s in (1, 2)]
      + [setup(small, start_step=1), dict(step(1, 2, 40 * MIB), **moe)])
EOF
x=$tmp/craft/x/run/metrics.jsonl y=$tmp/craft/y/run/metrics.jsonl one=$tmp/craft/one/metrics.jsonl
if expect_exit 0 "report of a resumed run and an older joined file, both in folders named run" -- \
    "$BIN" report "$x" "$y" -o "$tmp/resumed.html"; then
    if out=$(python3 test/tools/check_report.py "$tmp/resumed.html" "$x" "$y" --names x/run,y/run \
        --steps 0:1-9 --resumes 0:4,7 --steps 1:1-5 --resumes 1:4); then
        ok "segments stitched: every step once and in order, each resume marked and counted: $out"
    else
        fail "the resumed runs' page: $out"
    fi
    screenshot "$tmp/resumed.html" "$tmp/resumed.png" '#1f77b4' '#d62728'
fi
if expect_exit 0 "report of a one-step run" -- "$BIN" report "$one" -o "$tmp/one.html"; then
    if out=$(python3 test/tools/check_report.py "$tmp/one.html" "$one" --moe --names one \
        --steps 0:1-1 --resumes 0:1); then
        ok "a one-step run: whole steps, no nan, 40 experts' legend, restart marked: $out"
    else
        fail "the one-step page: $out"
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
