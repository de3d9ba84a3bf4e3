#!/usr/bin/env bash
# `cooktrain plan --search` (parallel/README.md, Plan search):
#   - `plan --calibrate` writes this machine as a YAML profile, which --hardware reads back;
#   - memory and traffic: for eight layouts of configs/test-tiny.yaml on 4 ranks (dp 4 at ZeRO 0
#     and 3, tp 2 x dp 2 without and with sequence parallelism, pp 2 x dp 2 in 1F1B and
#     interleaved with 4 virtual stages, tp 2 x pp 2 with recompute, tp 4 with sequence
#     parallelism, pp 2 x dp 2 in zbh1 at ZeRO 2 and in zbv at ZeRO 3 with recompute) the search's
#     stage-0 numbers equal what the trainer's rank 0 measures: memory
#     by category and dp/tp bytes per step;
#   - step time: scripts/bench_plan.sh (the estimate against measured dp 2, tp 2 and pp 2 steps
#     on this machine) runs and prints each layout's row; the ratio is a benchmark's figure, not
#     asserted, since it depends on what else the machine runs;
#   - the network: on 16 devices (2 nodes of 8) every layout whose dp group crosses nodes gets a
#     dp time at least 5x that of the same layout on a profile whose network is as fast as the
#     node's links (450 vs 50 GB/s: 9x), layouts inside a node the same, and the best layout's tp
#     group stays inside a node;
#   - nodes of any size: devices_per_node consecutive ranks a node, the last one what is left. On
#     6 H100s (1 node of 6) every tp 3 group is inside the node; on 12 (1 node of 8 and 1 of 4)
#     tp 4 stays inside and tp 3 crosses (ranks 6-8); on 1000, 125 nodes of 8, and with 6 a node,
#     166 of 6 and 1 of 4. For every listed layout each dimension's placement in --json equals
#     what the rank formula of the design (rank = tp_rank + tp·(cp_rank + cp·(dp_rank +
#     dp·pp_rank)), ep blocks of consecutive dp ranks) gives, and the text says the same link;
#   - no valid layout: 7 devices for a model of 12 heads, 12 layers, 256 positions and a batch of
#     4 is refused naming 7 and the sizes it divides none of, with a hint (exit 2), apart from
#     "nothing fits"; 2^14 devices, more factors of 2 than the sizes hold together, likewise;
#   - a large search (configs/llama3-8b.yaml on 8 devices) completes; its time is a benchmark's
#     figure, not asserted here;
#   - memory: with 20 MB devices only layouts that fit in 90% of them are listed, fewer than valid;
#   - bad profiles: an unknown name, a missing key, a number that is not positive (exit 2, hint).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup

if expect_exit 0 "plan --calibrate" -- "$BIN" plan --calibrate; then
    printf '%s\n' "$OUT_TEXT" >"$tmp/cpu.yaml"
    expect_text "peak_flops_fp32: " "the profile has the measured peak"
fi

cat >"$tmp/fast-net.yaml" <<'EOF'
# h100-sxm, but a network as fast as NVLink
peak_flops_bf16: 989e12
peak_flops_fp32: 67e12
gemm_efficiency: 0.70
memory_bytes: 80e9
memory_bandwidth: 3.35e12
devices_per_node: 8
intra_node_bandwidth: 450e9
intra_node_latency: 5e-6
inter_node_bandwidth: 450e9
inter_node_latency: 5e-6
EOF

# ---- memory and traffic against the trainer --------------------------------------------------
if selected "counters" && expect_exit 0 "search on 4 devices of this machine" -- "$BIN" plan \
    --config configs/test-tiny.yaml --search 4 --hardware "$tmp/cpu.yaml" --top 100000 --json; then
    printf '%s\n' "$OUT_TEXT" >"$tmp/search.json"
    # tp pp dp zero micro_batch recompute sequence_parallel virtual_stages [schedule]
    while read -r tp pp dp zero mb rc sp v sched; do
        if [ -z "$sched" ]; then
            sched=1f1b
            [ "$v" = 1 ] || sched=interleaved
        fi
        name="tp $tp pp $pp dp $dp ZeRO $zero mb $mb recompute $rc sp $sp v $v $sched"
        rm -f "$tmp/run.jsonl" # a metrics file is appended to
        expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" --set parallel.tp="$tp" \
            --set parallel.pp="$pp" --set parallel.zero_stage="$zero" --set train.micro_batch="$mb" \
            --set train.recompute="$rc" --set parallel.sequence_parallel="$sp" \
            --set parallel.schedule="$sched" --set parallel.virtual_stages="$v" --set train.steps=1 \
            --set train.warmup_steps=1 --set log.metrics="$tmp/run.jsonl" || continue
        if out=$(python3 - "$tmp/search.json" "$tmp/run.jsonl" "$tp" "$pp" "$dp" "$zero" "$mb" "$rc" "$sp" "$v" "$sched" <<'PY'
import json, sys
search, run = sys.argv[1], sys.argv[2]
tp, pp, dp, zero, mb = map(int, sys.argv[3:8])
rc = sys.argv[8] == "full"
sp = sys.argv[9] == "true"
v = int(sys.argv[10])
sched = sys.argv[11] if pp > 1 else "1f1b"
rows = [json.loads(l) for l in open(search)]
match = [r for r in rows if (r["tp"], r["cp"], r["pp"], r["dp"], r["ep"], r["zero_stage"], r["micro_batch"],
         r["recompute"], r["sequence_parallel"], r["virtual_stages"], r["schedule"]) ==
         (tp, 1, pp, dp, 1, zero, mb, rc, sp, v, sched)]
if len(match) != 1:
    sys.exit(f"{len(match)} search rows for the layout")
s = match[0]["stage0"]
lines = [json.loads(l) for l in open(run)]
setup = [l for l in lines if l.get("setup")][0]
step = [l for l in lines if "loss" in l][0]
pairs = [("params", s["params_bytes"], setup["mem_params"]), ("grads", s["grads_bytes"], setup["mem_grads"]),
         ("optim", s["optim_bytes"], setup["mem_optim"]), ("master", s["master_bytes"], setup["mem_master"]),
         ("dp bytes", s["dp_bytes"], step["dp_bytes"]), ("tp bytes", s["tp_bytes"], step["tp_bytes"])]
bad = [f"{k} {a} vs {b}" for k, a, b in pairs if a != b]
if bad:
    sys.exit("; ".join(bad))
print(", ".join(f"{k} {int(a)}" for k, a, _ in pairs))
PY
        ); then ok "$name: the search's memory and traffic equal the run's ($out)"; else fail "$name: $out"; fi
    done <<'LAYOUTS'
1 1 4 0 2 none false 1
1 1 4 3 2 none false 1
2 1 2 1 2 none false 1
2 1 2 1 2 none true 1
1 2 2 2 2 none false 1
1 2 2 1 2 none false 4
2 2 1 0 2 full false 1
4 1 1 0 4 none true 1
1 2 2 2 2 none false 1 zbh1
1 2 2 3 2 full false 2 zbv
LAYOUTS
fi

# ---- step time against measured runs ----------------------------------------------------------
# A timing, so a benchmark (scripts/bench_plan.sh), never an assertion here: its flow runs, and
# each layout gets its row of estimate, measurement and ratio, whatever the machine's load.
if selected "step time"; then
    if expect_exit 0 "scripts/bench_plan.sh --steps 3" -- env BUILD="$BUILD" bash scripts/bench_plan.sh \
        --steps 3 --data "$TEST_DATA/train.bin"; then
        for layout in dp tp pp; do
            if printf '%s\n' "$OUT_TEXT" | grep -qE "^$layout 2 +[0-9.]+ +[0-9.]+ +[0-9.]+$"; then
                ok "bench_plan: the $layout 2 row (estimate, measured, ratio)"
            else
                fail "bench_plan: no $layout 2 row"
                printf '%s\n' "$OUT_TEXT" | tail -5 | sed 's/^/    /'
            fi
        done
    fi
    expect_exit 2 "bench_plan: --steps below 3 is refused" -- bash scripts/bench_plan.sh --steps 2
    expect_text "hint: " "the refusal has a hint"
fi

# ---- the network -------------------------------------------------------------------------------
if selected "network"; then
    expect_exit 0 "search on 16 H100s" -- "$BIN" plan --config configs/gpt2-124m.yaml --search 16 --hardware h100-sxm --top 100000 --json &&
        printf '%s\n' "$OUT_TEXT" >"$tmp/h100.json"
    expect_exit 0 "search on 16 H100s with a fast network" -- "$BIN" plan --config configs/gpt2-124m.yaml --search 16 \
        --hardware "$tmp/fast-net.yaml" --top 100000 --json && printf '%s\n' "$OUT_TEXT" >"$tmp/fast.json"
    if out=$(python3 - "$tmp/h100.json" "$tmp/fast.json" <<'PY'
import json, sys
key = lambda r: (r["tp"], r["sequence_parallel"], r["cp"], r["pp"], r["dp"], r["ep"], r["zero_stage"], r["schedule"], r["virtual_stages"], r["micro_batch"], r["recompute"])
slow = {key(r): r for r in map(json.loads, open(sys.argv[1]))}
fast = {key(r): r for r in map(json.loads, open(sys.argv[2]))}
assert slow.keys() == fast.keys(), "different layouts"
crossing = [k for k in slow if slow[k]["dp_inter"] and slow[k]["dp_s"] > 0]
inside = [k for k in slow if not slow[k]["dp_inter"] and slow[k]["dp_s"] > 0]
bad = [k for k in crossing if slow[k]["dp_s"] < 5 * fast[k]["dp_s"]]
bad += [k for k in inside if abs(slow[k]["dp_s"] - fast[k]["dp_s"]) > 1e-12]
best = json.loads(open(sys.argv[1]).readline())
if not crossing or not inside or bad or best["tp_inter"]:
    sys.exit(f"{len(crossing)} layouts with dp across nodes, {len(inside)} inside, {len(bad)} wrong; best tp across nodes: {best['tp_inter']}")
print(f"{len(crossing)} layouts with dp across nodes pay the network, {len(inside)} inside a node do not; the best keeps tp {best['tp']} in a node")
PY
    ); then ok "the network: $out"; else fail "the network: $out"; fi
    # virtual stages beyond 2 and sequence parallelism are searched, and priced: the interleaved
    # bubble shrinks as v grows ((p-1)/(v m + p-1)); sequence parallelism holds less activation
    # memory and sends 1/tp of the pipeline's activations, for the norms' gradient reduction: at
    # equal layout it always takes less memory, with pp less time in pipeline sends, and a step
    # within 1% (the traffic it adds and saves is small beside compute here)
    if out=$(python3 - "$tmp/h100.json" 2>&1 <<'PY'
import json, sys
# 1F1B and interleaved, whose bubble v shrinks (the zero-bubble ones are v 1 and 2 of their own)
rows = [r for r in map(json.loads, open(sys.argv[1])) if r["schedule"] not in ("zbh1", "zbv")]
rest = lambda r: (r["tp"], r["cp"], r["pp"], r["dp"], r["ep"], r["zero_stage"], r["micro_batch"], r["recompute"])
vs = sorted({r["virtual_stages"] for r in rows})
by = {}
for r in rows:
    by.setdefault((rest(r), r["sequence_parallel"]), {})[r["virtual_stages"]] = r
grow = [b for b in by.values() if all(v in b for v in (1, 2, 3))]
bad = [b for b in grow if not (b[1]["bubble_s"] > b[2]["bubble_s"] > b[3]["bubble_s"] > 0)]
twins = [(by[(k, True)], by[(k, False)]) for (k, sp) in by if sp and (k, False) in by]
worse = [1 for t, f in twins for v in t if v in f and not (
    t[v]["memory_bytes"] < f[v]["memory_bytes"] and t[v]["step_s"] <= 1.01 * f[v]["step_s"] and
    (t[v]["pp"] == 1 or t[v]["pp_s"] < f[v]["pp_s"]))]
best_tp = next(r for r in rows if r["tp"] > 1)
if max(vs) < 4 or not grow or bad or not twins or worse or not best_tp["sequence_parallel"]:
    sys.exit(f"virtual stages {vs}; {len(grow)} families with v 1-3, {len(bad)} whose bubble does not shrink; "
             f"{len(twins)} sp twins, {len(worse)} where sp takes more memory or time; best with tp > 1 uses sp: {best_tp['sequence_parallel']}")
print(f"virtual stages {vs[0]}..{vs[-1]}; the bubble shrinks with v in all {len(grow)} families; "
      f"sequence parallelism saves memory (and pipeline sends) in all {len(twins)} tp layouts, "
      f"and the best tp layout uses it")
PY
    ); then ok "schedules and sequence parallelism: $out"; else fail "schedules and sequence parallelism: $out"; fi
fi

# ---- nodes of any size --------------------------------------------------------------------------
# check_nodes WHAT TEXT JSON N PER NODES: the text's header states NODES; every JSON row's nodes,
# last node and five placements equal what the design's rank formula gives on N devices of PER a
# node, and row i of the text names the same links as row i of the JSON.
check_nodes() {
    local what=$1 text=$2 json=$3 n=$4 per=$5 nodes=$6 out
    if ! grep -qF "search: $n devices ($nodes) of " "$text"; then
        fail "$what: the header does not say '$nodes'"
        head -1 "$text" | sed 's/^/    /'
        return
    fi
    if out=$(python3 - "$text" "$json" "$n" "$per" 2>&1 <<'PY'
import json, re, sys
text, rows = open(sys.argv[1]).read().splitlines(), [json.loads(l) for l in open(sys.argv[2])]
n, per = int(sys.argv[3]), int(sys.argv[4])
count, last = -(-n // per), n - (-(-n // per) - 1) * per
def crosses(tp, cp, dp, ep, pp):
    """Per dimension: some group has ranks on two nodes (rank = t + tp (c + cp (d + dp p)))."""
    groups = {}
    for p in range(pp):
        for d in range(dp):
            for c in range(cp):
                for t in range(tp):
                    node = (t + tp * (c + cp * (d + dp * p))) // per
                    for dim, key in (("tp", (c, d, p)), ("cp", (t, d, p)), ("dp", (t, c, p)),
                                     ("ep", (t, c, d // ep, p)), ("pp", (t, c, d))):
                        groups.setdefault((dim, key), set()).add(node)
    return {dim: any(len(v) > 1 for (g, _), v in groups.items() if g == dim)
            for dim in ("tp", "cp", "dp", "ep", "pp")}
memo, bad = {}, []
reasons = [l.strip() for l in text if l.startswith("      ")]
for i, r in enumerate(rows):
    grid = (r["tp"], r["cp"], r["dp"], r["ep"], r["pp"])
    want = memo.setdefault(grid, crosses(*grid))
    got = {dim: r[dim + "_inter"] for dim in want}
    if got != want or (r["nodes"], r["devices_per_node"], r["last_node_devices"]) != (count, per, last):
        bad.append(f"{grid}: json {got}, nodes {r['nodes']} x {r['devices_per_node']} last {r['last_node_devices']}; "
                   f"the rank formula {want}, {count} x {per} last {last}")
    said = {"tp": f"tp {r['tp']} on the network", "cp": f"cp {r['cp']} ring on the network",
            "ep": f"ep {r['ep']} all-to-all on the network", "pp": f"pp {r['pp']} sends on the network",
            "dp": "over the network"}
    text_says = {dim: phrase in reasons[i] for dim, phrase in said.items() if r[dim] > 1}
    if text_says != {dim: want[dim] for dim in text_says}:
        bad.append(f"row {i + 1} {grid}: the text says {text_says}, the placement is {want}")
if not rows or len(reasons) != len(rows) or bad:
    sys.exit(f"{len(rows)} rows, {len(reasons)} text rows; " + "; ".join(bad[:3]))
inside = sum(1 for g in memo.values() if not any(g.values()))
print(f"{len(rows)} layouts of {len(memo)} grids ({inside} wholly inside nodes) placed as the rank formula says, in text and json")
PY
    ); then ok "$what: '$nodes'; $out"; else fail "$what: $out"; fi
}

# search_both NAME ARGS...: the search as text and as JSON, into $tmp/NAME.txt and .json
search_both() {
    local name=$1
    shift
    expect_exit 0 "search: $name" -- "$BIN" plan "$@" --top 100000 && printf '%s\n' "$OUT_TEXT" >"$tmp/$name.txt" &&
        expect_exit 0 "search: $name, --json" -- "$BIN" plan "$@" --top 100000 --json &&
        printf '%s\n' "$OUT_TEXT" >"$tmp/$name.json"
}

if selected "nodes"; then
    sed 's/^devices_per_node: .*/devices_per_node: 6/' "$tmp/fast-net.yaml" >"$tmp/six.yaml"
    gpt2=(--config configs/gpt2-124m.yaml)
    if search_both six "${gpt2[@]}" --search 6; then
        check_nodes "6 H100s" "$tmp/six.txt" "$tmp/six.json" 6 8 "1 node of 6"
        if grep -q "tp 3 on the node's links" "$tmp/six.txt" && ! grep -q "tp 3 on the network" "$tmp/six.txt" &&
            python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; t=[x for x in r if x["tp"] == 3]; sys.exit(0 if t and not any(x["tp_inter"] for x in t) else 1)' "$tmp/six.json"; then
            ok "6 H100s: tp 3 inside the node, in text and json"
        else
            fail "6 H100s: tp 3 is not placed inside the node"
            grep "tp 3 on" "$tmp/six.txt" | head -3 | sed 's/^/    /'
        fi
    fi
    if search_both twelve "${gpt2[@]}" --search 12; then
        check_nodes "12 H100s" "$tmp/twelve.txt" "$tmp/twelve.json" 12 8 "1 node of 8 and 1 of 4"
        if python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; f=lambda tp: {x["tp_inter"] for x in r if x["tp"] == tp}; sys.exit(0 if f(4) == {False} and f(3) == {True} else 1)' "$tmp/twelve.json"; then
            ok "12 H100s: tp 4 stays in a node, tp 3 crosses into the node of 4"
        else
            fail "12 H100s: tp 4 or tp 3 placed wrong"
        fi
    fi
    # 1000 devices: a batch of 1000 so that 5 has somewhere to go
    if search_both thousand "${gpt2[@]}" --set train.global_batch=1000 --search 1000; then
        check_nodes "1000 H100s" "$tmp/thousand.txt" "$tmp/thousand.json" 1000 8 "125 nodes of 8"
    fi
    if search_both thousand-six "${gpt2[@]}" --set train.global_batch=1000 --search 1000 --hardware "$tmp/six.yaml"; then
        check_nodes "1000 devices, 6 a node" "$tmp/thousand-six.txt" "$tmp/thousand-six.json" 1000 6 "166 nodes of 6 and 1 of 4"
    fi

    # no layout valid: distinct from nothing fitting, with the factor and the sizes named
    expect_exit 2 "7 devices: no layout is valid" -- "$BIN" plan "${gpt2[@]}" --search 7
    expect_text "no layout of this config is valid on 7 devices: 7 divides none of the sizes the parallel dimensions split: tp 12" \
        "the refusal names 7 and the sizes it divides none of"
    expect_text "pp 12 (model.n_layer), dp 4 (train.global_batch)" "the refusal names each dimension's size"
    expect_text "hint: " "the refusal has a hint"
    expect_text "try 6 or 8 devices" "the hint names the nearest device counts that split"
    if printf '%s\n' "$OUT_TEXT" | grep -qE "fits|layouts valid|more memory"; then
        fail "7 devices: the refusal reads as nothing fitting"
    else
        ok "7 devices: the refusal is not 'nothing fits'"
    fi
    expect_exit 2 "2^14 devices: more factors of 2 than the sizes hold" -- "$BIN" plan "${gpt2[@]}" --search 16384
    expect_text "16384 holds 2 to the power 14, the sizes the parallel dimensions split only 2 to the power 13" \
        "the refusal says how many factors of 2 the sizes hold"

    # a large search completes (its time: the commit's figure, not a test's)
    expect_exit 0 "llama3-8b on 8 H100s" -- "$BIN" plan --config configs/llama3-8b.yaml --search 8 --top 3
    expect_text "search: 8 devices (1 node of 8) of h100-sxm" "llama3-8b: the header"
fi

# ---- memory ----------------------------------------------------------------------------------------
if selected "memory"; then
    sed 's/^memory_bytes: .*/memory_bytes: 20e6/' "$tmp/fast-net.yaml" >"$tmp/small.yaml"
    if expect_exit 0 "search with 20 MB devices" -- "$BIN" plan --config configs/test-tiny.yaml --search 4 \
        --hardware "$tmp/small.yaml" --top 100000; then
        fits=$(printf '%s\n' "$OUT_TEXT" | sed -n 's/^\([0-9]*\) layouts valid for this config, \([0-9]*\) fit.*/\1 \2/p')
        read -r valid fit <<<"$fits"
        if [ -n "$fit" ] && [ "$fit" -gt 0 ] && [ "$fit" -lt "$valid" ]; then
            ok "only layouts that fit are listed: $fit of $valid"
        else
            fail "only layouts that fit are listed: '$fits'"
        fi
    fi
    expect_exit 0 "the same as JSON" -- "$BIN" plan --config configs/test-tiny.yaml --search 4 \
        --hardware "$tmp/small.yaml" --top 100000 --json
    if printf '%s\n' "$OUT_TEXT" | python3 -c 'import json,sys; m=[json.loads(l)["memory_bytes"] for l in sys.stdin if l.strip()]; sys.exit(0 if m and max(m) <= 0.9 * 20e6 else 1)'; then
        ok "every listed layout fits in 90% of 20 MB"
    else
        fail "every listed layout fits in 90% of 20 MB"
    fi
fi

# ---- bad profiles ----------------------------------------------------------------------------------
expect_exit 2 "an unknown profile" -- "$BIN" plan --config configs/test-tiny.yaml --search 4 --hardware tpu-v9
expect_text "built-in profiles: h100-sxm, h200, a100, cpu" "the refusal lists the profiles"
grep -v '^inter_node_bandwidth' "$tmp/fast-net.yaml" >"$tmp/lacking.yaml"
expect_exit 2 "a profile without inter_node_bandwidth" -- "$BIN" plan --config configs/test-tiny.yaml --search 4 --hardware "$tmp/lacking.yaml"
expect_text "lacks inter_node_bandwidth" "the refusal names the key"
sed 's/^gemm_efficiency: .*/gemm_efficiency: -1/' "$tmp/fast-net.yaml" >"$tmp/negative.yaml"
expect_exit 2 "a profile with a negative efficiency" -- "$BIN" plan --config configs/test-tiny.yaml --search 4 --hardware "$tmp/negative.yaml"
expect_text "needs a positive number for gemm_efficiency" "the refusal names the key and the rule"
expect_text "hint:" "with a hint"
