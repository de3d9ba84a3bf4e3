#!/usr/bin/env python3
"""Compares a training run with the world-size-1 reference of the same config (core/README.md,
Determinism: every layout trains the same model, up to float summation order).

  compare_runs.py REF.jsonl REF.bin RUN.jsonl RUN.bin --init INIT.bin [--accounting]
  compare_runs.py --self-test REF.jsonl REF.bin --init INIT.bin [--noise TWIN.jsonl TWIN.bin]
  compare_runs.py ... --noise TWIN.jsonl TWIN.bin      (bf16 runs: TWIN is the fp32 reference)

*.jsonl are metrics files (log.metrics); *.bin parameter dumps (--dump-params: raw little-endian
f32 global tensors, with FILE.index.json naming them); INIT.bin is the reference's
--dump-init-params. Prints what it found and exits 1 on any mismatch.

The tolerance, derived from fp32 rounding. Layouts differ only in the order of float sums: tensor
parallelism splits inner products, data parallelism and microbatches split the token sums of
weight gradients. Reordering a sum of K terms moves it by about sqrt(K)·u relative (u = 2^-24,
rounding errors adding like a random walk; K·u is the worst case). A gradient passes through the
backward of up to L layers, two GEMMs each, whose errors add in quadrature, and its longest sum
runs over the step's G·T tokens, so one step's relative error is about
    e_step = sqrt(2·L·G·T)·u.
AdamW turns a gradient's relative error into the same relative error of its update, and the
errors of the steps add up (at most linearly), so after s steps:
    tol(s) = 10 · s · e_step.
The factor 10 covers the largest of a few hundred tensors (a 4-sigma event is ~4x the typical
error) with room to spare; the worst-case bound (K·u instead of sqrt(K)·u) would be 20x larger.
For configs/test-tiny.yaml (L 16, G·T 512, 4 steps) tol = 3.1e-4; measured differences are
below 3e-5, a missing reduction or a wrong gradient scale moves a tensor by 1e-1 or more.

What must agree:
  - each step's loss and gradient norm, relatively, within tol(step) (the norm sees every
    gradient element before AdamW normalises it away, so it catches a wrongly scaled gradient);
  - every tensor: ||run − ref|| <= tol(steps) · max(||ref − init||, 0.1·lr·steps·sqrt(n)), i.e.
    the difference is a tiny fraction of how far the tensor moved. The floor is for tensors
    whose gradient is only rounding noise (the key bias: softmax ignores a shift of every score
    by q·b_k, so its exact gradient is 0): AdamW moves an element by at most about lr per step,
    and 10% of that scale stands in for their change;
  - every value finite (a NaN or Inf anywhere is a mismatch, never skipped), the same tensors
    with the same shapes.

The equivalence tests run with train.eps = 1e-6 (test/tools/lib_cli.sh says why): elements whose
gradient is only rounding noise then do not move by a sign-flipped lr.

With --accounting it also checks the run's own accounting (core/README.md, Memory and traffic),
exactly: memory per category after setup equals the ZeRO formula (parameters, gradients, optimizer
state), and each step's data-parallel and tensor-parallel bytes equal the formulas (the dp formula
includes the per-step scalars: the loss sum, and at ZeRO >= 1 the gradient norm's partial sum).

bf16 runs (--noise NOISE.jsonl NOISE.bin, the same config trained in the other precision).
Layouts in bf16 differ in where values are rounded to bf16, not only in the order of fp32 sums:
tensor parallelism rounds partial sums before its allreduce, a changed fp32 summation order
upstream of a rounding flips it now and then, a bf16 gradient reduction rounds each rank's part.
Each of these is a rounding error of bf16's size (u = 2^-8 relative per element: 8 significant bits) — the very
errors that separate a bf16 run from the fp32 run of the same config. So the bf16 run of a layout
may differ from the bf16 reference by no more than the reference differs from its fp32 twin,
measured in the same test: per tensor ||run − ref|| <= 2 · w · scale, where scale is the
tensor's movement as above and w the twins' largest ||twin − ref|| / scale over all tensors; per
step |Δloss|/loss, |Δnorm|/norm <= 3 · (the twins' largest relative difference over the steps)
+ tol(step). Measured on test-tiny (4 steps): w = 0.07; a tp=2 bf16 run reaches 0.97 w, ZeRO-1
with a bf16 gradient reduction 0.46 w, ZeRO-3 and micro_batch changes 0.06 w, pp=2 is
bit-exact. What it catches: a tensor whose movement changes by more than 2w (~15%; the
self-test plants 1.5x), a wrong gradient scale, any NaN or Inf.

--self-test plants one wrong thing at a time into a copy of the reference (a NaN parameter, an
Inf loss, one small tensor's change scaled by 1.01, a loss off by 3·tol, a norm off by 3·tol)
and checks that each is reported as a mismatch, and that the reference matches itself.
"""
import json
import math
import struct
import sys

U = 2.0 ** -24


def load_metrics(path):
    """The last run segment's setup line and the step lines as stitched: a metrics file is
    appended to, and a segment starting at step S (a resume, or a run started over at 1)
    replaces what earlier ones logged from S on."""
    kept, setup = [], {}
    for r in (json.loads(line) for line in open(path) if line.strip()):
        if r.get("setup"):
            last = max((k["step"] for k in kept if "step" in k), default=0)
            start = r.get("start_step", last + 1)
            kept = [k for k in kept if "step" not in k or k["step"] < start]
            setup = r
        kept.append(r)
    return setup, [r for r in kept if "loss" in r]


def load_dump(path):
    index = json.load(open(path + ".index.json"))
    data = open(path, "rb").read()
    values = struct.unpack("<%df" % (len(data) // 4), data)
    out = {}
    for e in index:
        n = e["shape"][0] * e["shape"][1]
        out[e["name"]] = (tuple(e["shape"]), values[e["offset"]:e["offset"] + n])
    return out


def tolerance_per_step(setup):
    return 10.0 * math.sqrt(2.0 * setup["n_layer"] * setup["tokens_per_step"]) * U


def finite(x):
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def twin_noise(ref_steps, ref_params, noise):
    """The bf16 allowance: per-step loss and norm scale, per-tensor distance (see the docstring)."""
    if noise is None:
        return None
    n_steps, n_params = noise
    rel = 0.0
    for a, b in zip(ref_steps, n_steps):
        for key in ("loss", "grad_norm"):
            rel = max(rel, abs(a[key] - b[key]) / abs(a[key]))
    return rel, n_params


def compare(ref_setup, ref_steps, ref_params, run_steps, run_params, init_params, out, noise=None):
    """Returns True when the run matches; appends lines to `out`. `noise`: (steps, params) of the
    reference config trained in the other precision, for bf16 runs."""
    ok = True
    e = tolerance_per_step(ref_setup)
    twin = twin_noise(ref_steps, ref_params, noise)
    steps, lr = ref_setup["steps"], ref_setup["lr"]
    if twin:  # the twins' largest relative distance over all tensors
        worst_twin = 0.0
        for name, (shape, ref) in ref_params.items():
            init = init_params[name][1]
            change = math.sqrt(sum((a - b) ** 2 for a, b in zip(ref, init)))
            scale = max(change, 0.1 * lr * steps * math.sqrt(len(ref)))
            d = math.sqrt(sum((a - b) ** 2 for a, b in zip(ref, twin[1][name][1])))
            worst_twin = max(worst_twin, d / scale)
    steps, lr = ref_setup["steps"], ref_setup["lr"]
    if len(ref_steps) != len(run_steps) or not ref_steps:
        out.append("MISMATCH step count: %d vs %d" % (len(ref_steps), len(run_steps)))
        return False
    worst = {"loss": 0.0, "grad_norm": 0.0}
    for i, (a, b) in enumerate(zip(ref_steps, run_steps)):
        tol = e * (i + 1) + (3.0 * twin[0] if twin else 0.0)
        for key in ("loss", "grad_norm"):
            x, y = a.get(key), b.get(key)
            if not (finite(x) and finite(y)):
                out.append("MISMATCH %s at step %d is not finite: %r vs %r" % (key, i + 1, x, y))
                ok = False
                continue
            rel = abs(x - y) / abs(x) if x else abs(y)
            worst[key] = max(worst[key], rel / tol)
            if not rel <= tol:
                out.append("MISMATCH %s at step %d: %.9g vs %.9g (rel %.2e > tol %.2e)" %
                           (key, i + 1, x, y, rel, tol))
                ok = False
    tol = e * steps
    if set(ref_params) != set(run_params):
        out.append("MISMATCH tensors differ: only in ref %s, only in run %s" %
                   (sorted(set(ref_params) - set(run_params))[:5],
                    sorted(set(run_params) - set(ref_params))[:5]))
        return False
    worst_tensor, worst_ratio = None, 0.0
    for name, (shape, ref) in ref_params.items():
        run_shape, run = run_params[name]
        init = init_params[name][1]
        if run_shape != shape:
            out.append("MISMATCH %s: shape %s vs %s" % (name, shape, run_shape))
            ok = False
            continue
        if not all(math.isfinite(v) for v in run) or not all(math.isfinite(v) for v in ref):
            out.append("MISMATCH %s: not finite" % name)
            ok = False
            continue
        diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(ref, run)))
        change = math.sqrt(sum((a - b) ** 2 for a, b in zip(ref, init)))
        scale = max(change, 0.1 * lr * steps * math.sqrt(len(ref)))
        allowed = tol * scale
        if twin:
            allowed = max(2.0 * worst_twin * scale, allowed)
        ratio = diff / allowed
        scale = allowed / tol
        if not ratio <= 1.0:
            out.append("MISMATCH %s: |run - ref| %.3e is %.2fx the tolerance %.2e x %.3e" %
                       (name, diff, ratio, tol, scale))
            ok = False
        elif ratio >= worst_ratio:
            worst_tensor, worst_ratio = name, ratio
    out.append("%s: losses within %.1f%%, grad norms within %.1f%% of tol(step) (%.2e per step); "
               "%d tensors, worst %s at %.1f%% of tol %.2e" %
               ("match" if ok else "MISMATCH", 100 * worst["loss"], 100 * worst["grad_norm"], e,
                len(ref_params), worst_tensor, 100 * worst_ratio, tol))
    return ok


def accounting(setup, steps, out):
    ok = True
    for cat in ("params", "grads", "optim", "master"):
        got, want = setup.get("mem_" + cat), setup.get("mem_expected_" + cat)
        if got is None or got != want:
            out.append("MISMATCH memory %s: %s bytes, formula %s" % (cat, got, want))
            ok = False
    for r in steps:
        for group in ("dp", "tp", "cp"):
            got, want = r.get(group + "_bytes"), r.get(group + "_bytes_expected")
            if group == "cp" and got is None and want is None:
                continue  # runs from before context parallelism
            if got is None or want is None or got != want:
                out.append("MISMATCH %s bytes at step %d: %s vs formula %s" %
                           (group, r.get("step"), got, want))
                ok = False
    if ok:
        out.append("accounting: memory and dp/tp/cp bytes per step equal the formulas exactly")
    return ok


def self_test(ref_m, ref_p, init_p, noise=None):
    setup, steps = load_metrics(ref_m)
    params, init = load_dump(ref_p), load_dump(init_p)
    e = tolerance_per_step(setup)
    twin = twin_noise(steps, params, noise)
    if twin:  # bf16: the allowance is the twin distance; plant beyond it
        e = 3.0 * twin[0] + e * len(steps)
    out = []
    if not compare(setup, steps, params, steps, params, init, out, noise):
        print("FAIL the reference does not match itself: " + " | ".join(out))
        return 1
    small = min(params, key=lambda n: len(params[n][1]) if "bk" not in n else 1 << 60)

    def scaled_change(p):
        shape, vals = p[small]
        iv = init[small][1]
        k = 1.5 if twin else 1.01
        p[small] = (shape, tuple(i + k * (v - i) for v, i in zip(vals, iv)))

    def nan_param(p):
        name = sorted(p)[len(p) // 2]
        shape, vals = p[name]
        p[name] = (shape, vals[:1] + (float("nan"),) + vals[2:])

    plants = [
        ("a NaN in one parameter", nan_param, None),
        ("one tensor's change scaled by %s (%s)" % ("1.5" if twin else "1.01", small),
         scaled_change, None),
        ("an Inf loss", None, lambda s: s[-1].update(loss=float("inf"))),
        ("a loss off by 3 tol", None, lambda s: s[0].update(loss=s[0]["loss"] * (1 + 3 * e))),
        ("a gradient norm off by 3 tol", None,
         lambda s: s[1].update(grad_norm=s[1]["grad_norm"] * (1 + 6 * e))),
    ]
    failed = 0
    for what, plant_params, plant_steps in plants:
        p = dict(params)
        s = [dict(r) for r in steps]
        if plant_params:
            plant_params(p)
        if plant_steps:
            plant_steps(s)
        out = []
        if compare(setup, steps, params, s, p, init, out, noise):
            print("FAIL compare_runs misses %s" % what)
            failed += 1
        else:
            print("ok compare_runs catches %s" % what)
    return 1 if failed else 0


def main(argv):
    if "--init" not in argv:
        print("usage: see the docstring of test/tools/compare_runs.py")
        return 2
    i = argv.index("--init")
    init_path = argv[i + 1]
    rest = argv[:i] + argv[i + 2:]
    noise = None
    if "--noise" in rest:
        j = rest.index("--noise")
        noise = (load_metrics(rest[j + 1])[1], load_dump(rest[j + 2]))
        rest = rest[:j] + rest[j + 3:]
    if rest and rest[0] == "--self-test":
        return self_test(rest[1], rest[2], init_path, noise)
    ref_m, ref_p, run_m, run_p = rest[:4]
    ref_setup, ref_steps = load_metrics(ref_m)
    run_setup, run_steps = load_metrics(run_m)
    out = []
    ok = compare(ref_setup, ref_steps, load_dump(ref_p), run_steps, load_dump(run_p),
                 load_dump(init_path), out, noise)
    if "--accounting" in rest:
        ok = accounting(run_setup, run_steps, out) and ok
    print("; ".join(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
