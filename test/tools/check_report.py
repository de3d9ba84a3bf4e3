#!/usr/bin/env python3
"""check_report.py — reads a `cooktrain report` page back and checks it against the metrics it
was drawn from (test/cli/cli_report.sh).

  python3 test/tools/check_report.py REPORT.html METRICS.jsonl... [--moe]
  python3 test/tools/check_report.py --png SHOT.png COLOR...

The page: self-contained (no script, no link, no src or href, no url(), nothing but the SVG
namespace naming http); one chart per metric (loss, lr, grad_norm, tokens_per_s, mfu, comm,
mem_bytes, memory, and with --moe only, moe_load and moe_experts.R per run R: a polyline per
expert, "moe_tokens_per_expert.E", drawn from element E of the lines' moe_tokens_per_expert, and
every line's array agreeing with its moe_load_min, _max and _mean: the same extremes, a sum of
n_experts times the mean, to the mean's 6 printed digits); in every chart, each run's series holds
one point per metrics line that has the key, in order, x an exact linear map of the step and y an
exact linear map of the value with y growing downward (least-squares fit within the 0.01 px the
page rounds to, slope of the right sign), inside the plot; the memory bars carry the setup line's
bytes per category. The screenshot (--png): a PNG decoded here (zlib, the five filters) that is
not blank: at least 3% of its pixels not the background and every COLOR (#rrggbb: the runs'
colours) present.
"""
import json
import struct
import sys
import zlib
from html.parser import HTMLParser

KEYS = {"loss": ["loss", "val_loss"], "lr": ["lr"], "grad_norm": ["grad_norm"],
        "tokens_per_s": ["tokens_per_s"], "mfu": ["mfu"], "comm": ["exposed_comm_s", "bubble_s"],
        "mem_bytes": ["mem_bytes"], "moe_load": ["moe_load_min", "moe_load_mean", "moe_load_max"]}
MEM = {"params": "mem_params", "grads": "mem_grads", "optimizer": "mem_optim",
       "master": "mem_master", "acts": "mem_acts", "comm": "mem_comm",
       "gathered": "mem_gathered", "workspace": "mem_workspace"}


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts = {}  # name -> {"attrs", "lines": [...], "rects": [...]}
        self.current = None
        self.problems = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "link", "iframe", "object", "embed", "img"):
            self.problems.append(f"<{tag}> in a self-contained page")
        for k, v in a.items():
            if k in ("src", "href") or (v and "url(" in v):
                self.problems.append(f"<{tag} {k}={v!r}> refers to something outside the page")
            if v and "http" in v and not (k == "xmlns" and v == "http://www.w3.org/2000/svg"):
                self.problems.append(f"<{tag} {k}={v!r}> names a network address")
        if tag == "svg" and "data-chart" in a:
            self.current = {"attrs": a, "lines": [], "rects": []}
            self.charts[a["data-chart"]] = self.current
        elif tag == "polyline" and self.current is not None:
            self.current["lines"].append(a)
        elif tag == "rect" and self.current is not None and "data-category" in a:
            self.current["rects"].append(a)

    def handle_endtag(self, tag):
        if tag == "svg":
            self.current = None

    def handle_data(self, data):
        if "url(" in data or "@import" in data:
            self.problems.append(f"style or text refers outside the page: {data.strip()[:60]!r}")


def fit(xs, ys):
    """Least squares y = a + b x; returns (a, b, worst residual)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    return a, b, max(abs(a + b * x - y) for x, y in zip(xs, ys))


def check_page(path, metrics, moe):
    page = Page()
    page.feed(open(path, encoding="utf-8").read())
    errors = list(page.problems)
    runs = []
    for m in metrics:
        lines = [json.loads(l) for l in open(m) if l.strip()]
        runs.append(lines)
    want = ["loss", "lr", "grad_norm", "tokens_per_s", "mfu", "comm", "mem_bytes", "memory"]
    keys_of = dict(KEYS)
    if moe:
        want.append("moe_load")
        for r, lines in enumerate(runs):
            n = max((len(l.get("moe_tokens_per_expert", [])) for l in lines), default=0)
            want.append(f"moe_experts.{r}")
            keys_of[f"moe_experts.{r}"] = [f"moe_tokens_per_expert.{e}" for e in range(n)]
            for l in lines:
                per = l.get("moe_tokens_per_expert")
                if per is not None and (len(per) != n or min(per) != l["moe_load_min"]
                                        or max(per) != l["moe_load_max"]
                                        or abs(sum(per) - n * l["moe_load_mean"]) > 1e-5 * sum(per)):
                    errors.append(f"run {r} step {l['step']}: moe_tokens_per_expert {per} against "
                                  f"min {l['moe_load_min']} max {l['moe_load_max']}")
            if n == 0:
                errors.append(f"run {r}: no moe_tokens_per_expert in its metrics")
    if sorted(page.charts) != sorted(want):
        errors.append(f"charts {sorted(page.charts)}, expected {sorted(want)}")
    points = 0

    def value(line, key):
        """The metrics value a series key names: a key, or KEY.E for element E of an array."""
        name, _, index = key.rpartition(".")
        if name and index.isdigit():
            arr = line.get(name)
            return arr[int(index)] if isinstance(arr, list) and int(index) < len(arr) else None
        return line.get(key)

    for name, keys in keys_of.items():
        chart = page.charts.get(name)
        if chart is None:
            continue
        w, h = float(chart["attrs"]["width"]), float(chart["attrs"]["height"])
        for r, lines in enumerate(runs):
            if name.startswith("moe_experts.") and name != f"moe_experts.{r}":
                continue
            for key in keys:
                rows = [l for l in lines if not l.get("setup") and isinstance(value(l, key), (int, float))]
                drawn = [p for p in chart["lines"] if p["data-run"] == str(r) and p["data-series"] == key]
                if not rows:
                    if drawn:
                        errors.append(f"{name}: run {r} {key} drawn without data")
                    continue
                if len(drawn) != 1:
                    errors.append(f"{name}: run {r} {key}: {len(drawn)} polylines, expected 1")
                    continue
                pts = [tuple(map(float, p.split(","))) for p in drawn[0]["points"].split()]
                if len(pts) != len(rows):
                    errors.append(f"{name}: run {r} {key}: {len(pts)} points for {len(rows)} lines")
                    continue
                points += len(pts)
                if any(not (0 <= x <= w and 0 <= y <= h) for x, y in pts):
                    errors.append(f"{name}: run {r} {key}: a point outside the chart")
                steps = [float(l["step"]) for l in rows]
                vals = [float(value(l, key)) for l in rows]
                if len(set(steps)) > 1:
                    _, bx, rx = fit(steps, [p[0] for p in pts])
                    if bx <= 0 or rx > 0.011:
                        errors.append(f"{name}: run {r} {key}: x is not an increasing linear map of the step (slope {bx:.4g}, residual {rx:.3g} px)")
                if len(set(vals)) > 1:
                    _, by, ry = fit(vals, [p[1] for p in pts])
                    if by >= 0 or ry > 0.011:
                        errors.append(f"{name}: run {r} {key}: y is not a decreasing linear map of the value (slope {by:.4g}, residual {ry:.3g} px)")
    memory = page.charts.get("memory")
    if memory is not None:
        for r, lines in enumerate(runs):
            setup = next((l for l in lines if l.get("setup")), {})
            for rect in (x for x in memory["rects"] if x["data-run"] == str(r)):
                want_bytes = setup.get(MEM[rect["data-category"]])
                if want_bytes is None or abs(float(rect["data-bytes"]) - want_bytes) > 0.5:
                    errors.append(f"memory: run {r} {rect['data-category']} {rect['data-bytes']} bytes, setup line says {want_bytes}")
            drawn = {x["data-category"] for x in memory["rects"] if x["data-run"] == str(r)}
            nonzero = {c for c, k in MEM.items() if setup.get(k, 0) > 0}
            if drawn != nonzero:
                errors.append(f"memory: run {r} draws {sorted(drawn)}, the setup line has {sorted(nonzero)}")
    return errors, points


def png_pixels(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, f"PNG type {ctype}/{depth}/{interlace}"
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride = zlib.decompress(idat), width * bpp
    prev, out, i = bytearray(stride), [], 0
    for _ in range(height):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out.append(bytes(line))
        prev = line
    return [(row[x], row[x + 1], row[x + 2]) for row in out for x in range(0, stride, bpp)]


def check_png(path, colors):
    pixels = png_pixels(path)
    counts = {}
    for p in pixels:
        counts[p] = counts.get(p, 0) + 1
    background = max(counts, key=counts.get)
    share = 1 - counts[background] / len(pixels)
    errors = []
    if share < 0.03:
        errors.append(f"screenshot nearly blank: {share:.1%} of pixels differ from the background")
    for c in colors:
        rgb = tuple(int(c[i:i + 2], 16) for i in (1, 3, 5))
        if counts.get(rgb, 0) < 20:
            errors.append(f"screenshot lacks the colour {c} ({counts.get(rgb, 0)} pixels)")
    return errors, share


def main():
    args = sys.argv[1:]
    if args and args[0] == "--png":
        errors, share = check_png(args[1], args[2:])
        what = f"{share:.1%} of pixels drawn, colours {' '.join(args[2:])} present"
    else:
        moe = "--moe" in args
        args = [a for a in args if a != "--moe"]
        errors, points = check_page(args[0], args[1:], moe)
        what = f"{points} points, each on its exact place"
    if errors:
        print("; ".join(errors[:5]))
        sys.exit(1)
    print(what)


if __name__ == "__main__":
    main()
