#!/usr/bin/env python3
"""check_report.py — reads a `cooktrain report` page back and checks it against the metrics it
was drawn from (test/cli/cli_report.sh).

  python3 test/tools/check_report.py REPORT.html METRICS.jsonl... [--moe] [--names A,B...]
                                     [--steps R:FIRST-LAST]... [--resumes R:S1,S2...]...
  python3 test/tools/check_report.py --png SHOT.png COLOR...

The metrics are stitched as the report must (html_report.c): every setup line starts a segment at
its start_step (without one, the step after the last seen, 1 at first), and drops the earlier
segments' lines of steps from there on; a segment resumed from a checkpoint (resumed_from, or a
start past 1) or started over (a later one at 1) is a resume. A resume past steps already logged
says how many were lost (run before and again), and one from a local checkpoint
(local_restore_step) how many rank files came from partners' copies.

The page: self-contained (no script, no link, no src or href, no url(), nothing but the SVG
namespace naming http); one chart per metric (loss, lr, grad_norm, tokens_per_s, mfu, comm,
mem_bytes, memory, rank_compute.R per run R of several ranks: a polyline per rank,
"rank_compute_s.E", drawn from element E of the progress lines' rank_compute_s, legend "rank E";
and with --moe only, moe_load and moe_experts.R per run R: a polyline per
expert, "moe_tokens_per_expert.E", drawn from element E of the lines' moe_tokens_per_expert, and
every line's array agreeing with its moe_load_min, _max and _mean: the same extremes, a sum of
n_experts times the mean, to the mean's 6 printed digits); in every chart, each run's series holds
one point per stitched metrics line that has the key, in order, x an exact linear map of the step
and y an exact linear map of the value with y growing downward (least-squares fit within the 0.01
px the page rounds to, slope of the right sign), inside the plot; the memory bars carry the last
setup line's bytes per category.

Readable at a glance: no "nan" or "inf" anywhere in the page; no text says "bytes": byte counts
are in MiB, or GiB from 1 GiB up — the unit on the memory charts' titles and axis, the backend
memory axis's ticks times the unit bracketing the data (at most twice its largest value), each
run's memory total equal to its categories' sum in that unit; every <text> inside its chart, at
0.6 em a character (0.62 bold; rotated ones vertically), every used memory category and (--moe)
every expert up to 32 a complete legend label; a total does not overlap a bar; the tick labels of
an axis in one format (fixed with N decimals, or scientific with N), the step axis's whole numbers
each at the step it names; each run's label the table's first cell and the memory chart's
(--names: these, in order); each run's table cell "N segment(s)[: resumed at S, ..., started
over at S]" from the stitching, and in every step chart holding its points, a <line
class="resume"> and the text "resumed at step S" (or "started over at step S") for each resume.
--steps R:FIRST-LAST: run R's loss curve, mapped back through the chart's plot area and
data-x0/x1, is exactly the steps FIRST..LAST, each once, in order; --resumes R:S1,S2: run R's
resumes are exactly these steps.

The screenshot (--png): a PNG decoded here (zlib, the five filters) that is not blank: at least 3%
of its pixels not the background and every COLOR (#rrggbb: the runs' colours) present.
"""
import json
import re
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
        self.charts = {}  # name -> {"attrs", "lines", "rects", "texts", "resumes"}
        self.current = None
        self.problems = []
        self.text = None  # the <text> being read: [attrs, content]
        self.rows, self.cell = [], None  # the table: a list of cells per row

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
            self.current = {"attrs": a, "lines": [], "rects": [], "texts": [], "resumes": [],
                            "bars": []}
            self.charts[a["data-chart"]] = self.current
        elif tag == "polyline" and self.current is not None:
            self.current["lines"].append(a)
        elif tag == "rect" and self.current is not None and "data-category" in a:
            self.current["rects"].append(a)
        elif tag == "rect" and self.current is not None and a.get("fill") == "none":
            self.current["frame"] = a  # the plot area
        elif tag == "line" and self.current is not None and a.get("class") == "resume":
            self.current["resumes"].append(a)
        elif tag == "text" and self.current is not None:
            self.text = [a, ""]
        elif tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th") and self.rows:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "svg":
            self.current = None
        elif tag == "text" and self.text is not None:
            self.current["texts"].append(tuple(self.text))
            self.text = None
        elif tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.text is not None:
            self.text[1] += data
        if self.cell is not None:
            self.cell += data
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


def stitch(lines):
    """The lines as the report draws them, and the resumes [(kind, step)]: a setup line starts a
    segment at start_step (else after the last step seen) and drops the earlier lines of steps
    from there on."""
    kept, resumes, segments = [], [], 0
    for l in lines:
        if l.get("setup"):
            last = max((k["step"] for k in kept if "step" in k and "val_loss" not in k), default=0)
            start = l.get("start_step", last + 1)
            if l.get("resumed_from") or start > 1:
                # after a crash: the steps run before and again (lost), and from a local
                # checkpoint, how many rank files came from partners' copies
                local = l.get("local_restore_step", -1)
                resumes.append(("resumed", start, max(last - start + 1, 0),
                                l.get("local_restore_from_partners", 0) if local >= 0 else None))
            elif segments:
                resumes.append(("started over", start, 0, None))
            segments += 1
            kept = [k for k in kept if "step" not in k or k["step"] < start]
        kept.append(l)
    return kept, resumes, max(segments, 1)


def check_page(path, metrics, moe):
    page = Page()
    page.feed(open(path, encoding="utf-8").read())
    errors = list(page.problems)
    runs = [stitch([json.loads(l) for l in open(m) if l.strip()])[0] for m in metrics]
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
    for r, lines in enumerate(runs):  # each rank's compute per step, at the progress steps
        n = max((len(l.get("rank_compute_s", [])) for l in lines), default=0)
        if n:
            want.append(f"rank_compute.{r}")
            keys_of[f"rank_compute.{r}"] = [f"rank_compute_s.{e}" for e in range(n)]
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
            if name.partition(".")[0] in ("moe_experts", "rank_compute") and name.partition(".")[2] != str(r):
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
            setup = ([l for l in lines if l.get("setup")] or [{}])[-1]
            for rect in (x for x in memory["rects"] if x["data-run"] == str(r)):
                want_bytes = setup.get(MEM[rect["data-category"]])
                if want_bytes is None or abs(float(rect["data-bytes"]) - want_bytes) > 0.5:
                    errors.append(f"memory: run {r} {rect['data-category']} {rect['data-bytes']} bytes, setup line says {want_bytes}")
            drawn = {x["data-category"] for x in memory["rects"] if x["data-run"] == str(r)}
            nonzero = {c for c, k in MEM.items() if setup.get(k, 0) > 0}
            if drawn != nonzero:
                errors.append(f"memory: run {r} draws {sorted(drawn)}, the setup line has {sorted(nonzero)}")
    return errors, points, page

MIB, GIB = 1024.0 ** 2, 1024.0 ** 3
STEP_CHARTS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "comm", "mem_bytes", "moe_load")


def text_box(attrs, text):
    """(left, right) of a horizontal text, or (top, bottom) of a rotated one, at 0.6 em a
    character (0.62 bold)."""
    size = float(attrs.get("font-size", 16))
    width = len(text) * size * (0.62 if attrs.get("font-weight") == "bold" else 0.6)
    x, y = float(attrs.get("x", 0)), float(attrs.get("y", 0))
    anchor = attrs.get("text-anchor", "start")
    if "rotate" in attrs.get("transform", ""):
        return y - width / 2, y + width / 2
    left = x - width if anchor == "end" else x - width / 2 if anchor == "middle" else x
    return left, left + width


def tick_format(label):
    """('e', N) for scientific with N mantissa decimals, ('f', N) for fixed with N decimals."""
    m = re.fullmatch(r"-?\d+(?:\.(\d+))?(e[+-]\d+)?", label)
    if not m:
        return ("?", label)
    return ("e" if m.group(2) else "f", len(m.group(1) or ""))


def step_at(chart, x):
    """The step at x px in a step chart (its plot area and data-x0, data-x1)."""
    x0, x1 = float(chart["attrs"]["data-x0"]), float(chart["attrs"]["data-x1"])
    left, width = float(chart["frame"]["x"]), float(chart["frame"]["width"])
    return x0 + (x - left) / width * (x1 - x0)


def check_readable(page, source, metrics, names, want_steps, want_resumes):
    errors = []
    for word in ("nan", "inf"):
        for m in re.finditer(r"\b%s\b" % word, source, re.IGNORECASE):
            errors.append(f"the page says {source[max(0, m.start() - 40):m.end() + 10]!r}")
            break
    runs = [stitch([json.loads(l) for l in open(m) if l.strip()]) for m in metrics]
    rows = page.rows[1:]  # under the header
    for name, chart in page.charts.items():
        w, h = float(chart["attrs"]["width"]), float(chart["attrs"]["height"])
        for attrs, text in chart["texts"]:
            if re.search(r"\bbytes\b", text):
                errors.append(f"{name}: {text!r} is in bytes, not MiB or GiB")
            lo, hi = text_box(attrs, text)
            if lo < 0 or hi > (h if "rotate" in attrs.get("transform", "") else w):
                errors.append(f"{name}: {text!r} does not fit in the chart ({lo:.0f} to {hi:.0f} px of {w:.0f})")
        for axis in ("xtick", "ytick"):
            labels = [t for a, t in chart["texts"] if a.get("class") == axis]
            formats = sorted(set(tick_format(t) for t in labels))
            if len(formats) > 1:
                errors.append(f"{name}: {axis} labels in {len(formats)} formats: {' '.join(labels)}")
            if axis == "xtick" and any(f != ("f", 0) for f in formats):
                errors.append(f"{name}: steps not whole: {' '.join(labels)}")
        # each step tick at the step it names
        for a, t in chart["texts"]:
            if a.get("class") == "xtick" and tick_format(t) == ("f", 0):
                at = step_at(chart, float(a["x"]))
                if abs(at - float(t)) > 0.01:
                    errors.append(f"{name}: the tick {t!r} stands at step {at:.3g}")
    # byte counts: MiB below 1 GiB, GiB from there; the axis is in that unit
    mem = page.charts.get("mem_bytes")
    values = [l["mem_bytes"] for lines, _, _ in runs for l in lines if "mem_bytes" in l]
    if mem is not None and values:
        unit = "GiB" if max(values) >= GIB else "MiB"
        scale = GIB if unit == "GiB" else MIB
        units = [t for a, t in mem["texts"] if a.get("class") == "yunit"]
        title = next((t for a, t in mem["texts"] if a.get("class") == "title"), "")
        if units != [unit] or not title.endswith(f"({unit})"):
            errors.append(f"mem_bytes: axis {units}, title {title!r}, expected {unit} for up to {max(values):.0f} bytes")
        ticks = [float(t) for a, t in mem["texts"] if a.get("class") == "ytick"]
        if not ticks or min(ticks) * scale > min(values) or not max(values) <= max(ticks) * scale <= 2 * max(values):
            errors.append(f"mem_bytes: ticks {ticks} {unit} do not span {min(values):.0f} to {max(values):.0f} bytes")
    memory = page.charts.get("memory")
    if memory is not None:
        setups = [([l for l in lines if l.get("setup")] or [{}])[-1] for lines, _, _ in runs]
        sums = [sum(s.get(k, 0) for k in MEM.values()) for s in setups]
        unit = "GiB" if max(sums) >= GIB else "MiB"
        scale = GIB if unit == "GiB" else MIB
        title = next((t for a, t in memory["texts"] if a.get("class") == "title"), "")
        if not title.endswith(f"({unit})"):
            errors.append(f"memory: title {title!r}, expected {unit} for up to {max(sums):.0f} bytes")
        totals = [(a, t) for a, t in memory["texts"] if a.get("class") == "total"]
        shown = [t for _, t in totals]
        want = [f"{s / scale:.{2 if unit == 'GiB' else 1}f} {unit}" for s in sums]
        if shown != want:
            errors.append(f"memory: totals {shown}, expected {want}")
        legend = [t for a, t in memory["texts"] if a.get("class") == "legend"]
        used = [c for c, k in MEM.items() if any(s.get(k, 0) > 0 for s in setups)]
        if sorted(legend) != sorted(used):
            errors.append(f"memory: legend {legend}, expected {used}")
        for a, t in totals:
            lo, hi = text_box(a, t)
            y = float(a["y"])
            for rect in memory["rects"]:
                rx, ry = float(rect["x"]), float(rect["y"])
                rw, rh = float(rect["width"]), float(rect["height"])
                if lo < rx + rw and rx < hi and y - 11 < ry + rh and ry < y:
                    errors.append(f"memory: the total {t!r} is drawn over a bar")
                    break
    for name, chart in page.charts.items():
        if name.startswith(("moe_experts.", "rank_compute.")):
            who = "expert" if name.startswith("moe_") else "rank"
            n = len(chart["lines"])
            legend = [t for a, t in chart["texts"] if a.get("class") == "legend"]
            want = [f"{who} {e}" for e in range(min(n, 32))] + ([f"+{n - 32} more"] if n > 32 else [])
            if legend != want:
                errors.append(f"{name}: legend {legend}, expected {want}")
    # run labels
    labels = [r[0] for r in rows]
    if memory is not None:
        bar_labels = [t for a, t in memory["texts"] if a.get("text-anchor") == "end" and a.get("fill")]
        if bar_labels != labels:
            errors.append(f"memory: runs labelled {bar_labels}, the table {labels}")
    if names is not None and labels != names:
        errors.append(f"runs labelled {labels}, expected {names}")
    # segments and resumes
    for r, (lines, resumes, segments) in enumerate(runs):
        said, parts = None, []
        for kind, step, lost, partners in resumes:
            part = f"{kind + ' at ' if kind != said else ''}{step}"
            lost_s = f"{lost} step{'' if lost == 1 else 's'} lost"
            if partners is not None:
                part += (f" (a local checkpoint, {partners} rank file{'' if partners == 1 else 's'}"
                         f" from partners' copies; {lost_s})")
            elif kind == "resumed" and lost > 0:
                part += f" ({lost_s})"
            parts.append(part)
            said = kind
        want = f"{segments} segment{'' if segments == 1 else 's'}" + (": " + ", ".join(parts) if parts else "")
        if r < len(rows) and want not in rows[r]:
            errors.append(f"run {r}: the table says {rows[r][2] if len(rows[r]) > 2 else rows[r]!r}, expected {want!r}")
        if r in want_resumes and [x[1] for x in resumes] != want_resumes[r]:
            errors.append(f"run {r}: resumes {resumes}, the test expects {want_resumes[r]}")
        for name, chart in page.charts.items():
            if not any(p["data-run"] == str(r) for p in chart["lines"]) or name == "memory":
                continue
            drawn = sorted(int(a["data-step"]) for a in chart["resumes"] if a["data-run"] == str(r))
            texts = sorted(t for a, t in chart["texts"] if a.get("class") == "resume")
            want_texts = sorted(set(f"{k} at step {s}{'' if p is None else ' (local checkpoint)'}"
                                    for k, s, _, p in resumes))
            if drawn != sorted(set(x[1] for x in resumes)) or not set(want_texts) <= set(texts):
                errors.append(f"{name}: run {r} resumes drawn at {drawn} labelled {texts}, expected {want_texts}")
    for r, (first, last) in want_steps.items():
        chart = page.charts["loss"]
        line = [p for p in chart["lines"] if p["data-run"] == str(r) and p["data-series"] == "loss"]
        xs = [float(p.split(",")[0]) for p in line[0]["points"].split()] if line else []
        steps = [round(step_at(chart, x), 1) for x in xs]
        if steps != [float(s) for s in range(first, last + 1)]:
            errors.append(f"run {r}: the loss curve's steps are {steps}, expected {first}..{last} once each")
    return errors


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
        names, steps, resumes, files = None, {}, {}, []
        i = 0
        while i < len(args):
            a = args[i]
            if a == "--moe":
                pass
            elif a == "--names":
                names, i = args[i + 1].split(","), i + 1
            elif a == "--steps":
                r, span = args[i + 1].split(":")
                steps[int(r)], i = tuple(int(x) for x in span.split("-")), i + 1
            elif a == "--resumes":
                r, at = args[i + 1].split(":")
                resumes[int(r)], i = [int(x) for x in at.split(",") if x], i + 1
            else:
                files.append(a)
            i += 1
        errors, points, page = check_page(files[0], files[1:], moe)
        errors += check_readable(page, open(files[0], encoding="utf-8").read(), files[1:], names,
                                 steps, resumes)
        what = f"{points} points, each on its exact place; readable"
    if errors:
        print("; ".join(errors[:5]))
        sys.exit(1)
    print(what)


if __name__ == "__main__":
    main()
