#!/usr/bin/env python3
"""Compares two training runs: per-step losses from their metrics files and final parameters
from their --dump-params files (raw little-endian f32, registry order).

  compare_runs.py REF.jsonl REF.bin RUN.jsonl RUN.bin LR STEPS [--accounting]

Tolerances (DESIGN §5): losses agree to 1e-5 relative (only float summation order differs
between layouts), gradient norms to 1e-4 relative (they see a wrong gradient scale that AdamW's
per-element normalisation would hide from the parameters). Parameters: AdamW normalises each element's update to about lr, so where a
gradient is pure rounding noise its sign can differ between layouts and the element can move by
up to 2·lr per step; every element must lie within 2·lr·steps, and 99.9% of them within
1e-3·lr·steps + 1e-6. Prints one line and exits 1 on a mismatch.

With --accounting it also checks the run's own accounting (DESIGN §6): memory per category
after setup equals the ZeRO formula exactly (parameters, gradients, optimizer state), and each
step's data-parallel and tensor-parallel bytes are within 2% of the formulas (the loss and
gradient-norm scalars are the only extra dp traffic; the tp formula is exact).
"""
import json
import struct
import sys


def losses(path, key="loss"):
    out = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "loss" in rec:
                out.append(rec[key])
    return out


def params(path):
    with open(path, "rb") as f:
        data = f.read()
    return struct.unpack("<%df" % (len(data) // 4), data)


def main():
    ref_m, ref_p, run_m, run_p, lr, steps = sys.argv[1:7]
    lr, steps = float(lr), int(steps)
    a, b = losses(ref_m), losses(run_m)
    if len(a) != len(b) or len(a) == 0:
        print("loss count differs: %d vs %d" % (len(a), len(b)))
        return 1
    worst_loss = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    # The gradient norm sees every gradient element before AdamW normalises it away, so it
    # catches a gradient that is wrong by a factor; summation order moves it by ~1e-6.
    na, nb = losses(ref_m, "grad_norm"), losses(run_m, "grad_norm")
    worst_norm = max(abs(x - y) / abs(x) for x, y in zip(na, nb))
    pa, pb = params(ref_p), params(run_p)
    if len(pa) != len(pb):
        print("parameter count differs: %d vs %d" % (len(pa), len(pb)))
        return 1
    bound, tight = 2 * lr * steps, 1e-3 * lr * steps + 1e-6
    diffs = [abs(x - y) for x, y in zip(pa, pb)]
    worst = max(diffs)
    loose = sum(1 for d in diffs if d > tight)
    ok = worst_loss <= 1e-5 and worst_norm <= 1e-4 and worst <= bound and loose <= len(pa) // 1000
    print("%s: max loss rel diff %.2e (tol 1e-5), grad norm %.2e (tol 1e-4), max param diff "
          "%.2e (bound %.1e), %d of %d beyond %.1e" % ("match" if ok else "MISMATCH", worst_loss,
                                                       worst_norm, worst, bound, loose, len(pa),
                                                       tight))
    if "--accounting" in sys.argv[7:]:
        ok = accounting(run_m) and ok
    return 0 if ok else 1


def accounting(path):
    records = [json.loads(line) for line in open(path)]
    setup = [r for r in records if r.get("setup")][0]
    ok = True
    for cat in ("params", "grads", "optim"):
        got, want = setup["mem_" + cat], setup["mem_expected_" + cat]
        if got != want:
            print("MISMATCH memory %s: %d bytes, formula %d" % (cat, got, want))
            ok = False
    for r in records:
        for group in ("dp", "tp"):
            if r.get(group + "_bytes_expected", 0) == 0:
                continue
            ratio = r[group + "_bytes"] / r[group + "_bytes_expected"]
            if not 1.0 <= ratio <= 1.02:
                print("MISMATCH %s bytes at step %d: %d vs formula %.0f" %
                      (group, r["step"], r[group + "_bytes"], r[group + "_bytes_expected"]))
                ok = False
    if ok:
        print("accounting: memory equals the formula, dp and tp bytes within 2%")
    return ok


if __name__ == "__main__":
    sys.exit(main())
