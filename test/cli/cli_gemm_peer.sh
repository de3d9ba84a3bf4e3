#!/usr/bin/env bash
# scripts/gemm_peer.py, which bench_gpu.sh runs on the GPU machine: it reads the GEMM shapes of a
# --device-idle run and times each in PyTorch. Here on a CPU run's log (bf16: its weight
# gradients are bf16 products into fp32 C), without torch and with test/tools/fake_torch, a stand-in
# whose clock encodes each call (the shape, which operands are transposed views, the output type,
# a bias or C), so the test reads off what the script asked PyTorch for: the same product in the
# same layout. Then PyTorch without out_dtype (the fallback names itself) and bad arguments.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ensure_test_data
script=scripts/gemm_peer.py

expect_exit 0 "a bf16 CPU run with --device-idle" -- "$BIN" train --config configs/test-tiny.yaml \
    --set train.threads=1 --set train.steps=2 --set train.precision=bf16 \
    --set data.train="$TEST_DATA/train.bin" --device-idle
printf '%s\n' "$OUT_TEXT" >"$tmp/run.log"

# check_table OUT FAKE: each row of the table against the run's GEMM line — the shape, the calls,
# cooktrain's ms a call — and, with FAKE (0: no torch; 1: the stand-in; 2: it without out_dtype),
# PyTorch's ms as the stand-in's clock says the script's call must have taken, the ratio and the
# step's totals.
check_table() {
    python3 - "$tmp/run.log" "$1" "$2" <<'PY'
import re, sys
log, out, fake = open(sys.argv[1]).read(), open(sys.argv[2]).read(), int(sys.argv[3])
line = [l for l in log.splitlines() if l.startswith("device busy by GEMM shape")][-1]
want = []
for e in line.split(":", 1)[1].split(" | "):
    m = re.fullmatch(r"\s*(.+) ([0-9.]+) \(([0-9]+)\)", e)
    want.append((m.group(1), float(m.group(2)), int(m.group(3))))
rows = [l for l in out.splitlines() if re.match(r"  gemm", l)]
if len(rows) != len(want) or len(want) != 15:
    sys.exit("%d rows for %d shapes in the run (test-tiny has 15)" % (len(rows), len(want)))
ours_total = torch_total = 0.0
for (shape, ms, calls), row in zip(want, rows):
    m = re.match(r"  (.+?)\s+([0-9]+)\s+([0-9.]+)(?:\s+([0-9.]+)\s+([0-9.]+)x\s+(.*))?$", row)
    if not m or m.group(1) != shape or int(m.group(2)) != calls:
        sys.exit("row %r, expected shape %r with %d calls" % (row, shape, calls))
    if abs(float(m.group(3)) - ms / calls) > 0.00005 + 1e-9:
        sys.exit("row %r: %s ms a call, the run's %.6f" % (row, m.group(3), ms / calls))
    ours_total += ms
    if fake == 0:
        if m.group(4):
            sys.exit("row %r has PyTorch columns without PyTorch" % row)
        continue
    s = re.fullmatch(r"gemm (\d+)x(\d+)x(\d+) ([NT])([NT]) (\w+)>(\w+)( acc)?", shape)
    M, N, K = int(s.group(1)), int(s.group(2)), int(s.group(3))
    wide = s.group(6) != s.group(7) and fake == 1  # an fp32 product out of bf16 operands
    t = (1e-6 * M * N * K + 0.1 * (s.group(4) == "T") + 0.2 * (s.group(5) == "T") + 0.4 * wide
         + 0.8 * bool(s.group(8)))
    if abs(float(m.group(4)) - t) > 0.00005 + 1e-9:
        sys.exit("row %r: PyTorch %s ms, the stand-in's clock says the call it was asked for "
                 "takes %.4f" % (row, m.group(4), t))
    if abs(float(m.group(5)) - (ms / calls) / t) > 0.005 + 1e-9:
        sys.exit("row %r: ratio %s, expected %.3f" % (row, m.group(5), (ms / calls) / t))
    if s.group(6) != s.group(7) and fake == 2 and "bf16 out" not in m.group(6):
        sys.exit("row %r: without out_dtype the row must say it ran a bf16 product" % row)
    torch_total += t * calls
total = re.search(r"all GEMMs of a step: cooktrain ([0-9.]+) ms(?:, PyTorch ([0-9.]+) ms.*: "
                  r"([0-9.]+)x)?", out)
if not total or abs(float(total.group(1)) - ours_total) > 0.0005 * (len(want) + 1):
    sys.exit("the step's total: %r, the rows add up to %.3f" % (total and total.group(0),
                                                                  ours_total))
if fake and (not total.group(2) or abs(float(total.group(2)) - torch_total) > 0.001 or
             abs(float(total.group(3)) - ours_total / torch_total) > 0.005 + 1e-9):
    sys.exit("the step's PyTorch total: %r, expected %.3f ms, %.2fx" % (
        total.group(0), torch_total, ours_total / torch_total))
print("%d shapes, cooktrain %.3f ms a step" % (len(want), ours_total) +
      (", PyTorch %.3f" % torch_total if fake else ""))
PY
}

expect_exit 0 "gemm_peer --no-torch: cooktrain's columns" -- python3 "$script" --no-torch "bf16 B=2=$tmp/run.log"
printf '%s\n' "$OUT_TEXT" >"$tmp/out0"
expect_text "PyTorch not timed: --no-torch" "gemm_peer --no-torch: says why there is no PyTorch column"
if out=$(check_table "$tmp/out0" 0 2>&1); then ok "gemm_peer --no-torch: the table is the run's ($out)"; else fail "gemm_peer --no-torch: $out"; fi

expect_exit 0 "gemm_peer with the PyTorch stand-in" -- env PYTHONPATH=test/tools/fake_torch python3 "$script" --reps 3 "bf16 B=2=$tmp/run.log"
printf '%s\n' "$OUT_TEXT" >"$tmp/out1"
if out=$(check_table "$tmp/out1" 1 2>&1); then ok "gemm_peer: PyTorch ran each shape in its layout and output type ($out)"; else fail "gemm_peer with the stand-in: $out"; fi

expect_exit 0 "gemm_peer with a PyTorch without out_dtype" -- env PYTHONPATH=test/tools/fake_torch FAKE_TORCH_NO_OUT_DTYPE=1 python3 "$script" "bf16 B=2=$tmp/run.log"
printf '%s\n' "$OUT_TEXT" >"$tmp/out2"
if out=$(check_table "$tmp/out2" 2 2>&1); then ok "gemm_peer: without out_dtype, bf16 products, said so ($out)"; else fail "gemm_peer without out_dtype: $out"; fi

expect_exit 2 "gemm_peer: an unknown option is refused" -- python3 "$script" --bogus
expect_text "hint: usage: gemm_peer.py" "gemm_peer: the refusal has a hint"
expect_exit 2 "gemm_peer: no LABEL=LOG is refused" -- python3 "$script"
printf 'step 1/1 | loss 5\n' >"$tmp/no-idle.log"
expect_exit 2 "gemm_peer: a log without the GEMM line is refused" -- python3 "$script" "x=$tmp/no-idle.log"
expect_text "no 'device busy by GEMM shape' line" "gemm_peer: the refusal names the missing line"
