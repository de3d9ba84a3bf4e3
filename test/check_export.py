#!/usr/bin/env python3
"""Checks a `cooktrain export` file against the parameters it came from.

  check_export.py MODEL.safetensors DUMP.bin [--bf16] [--tokens VAL.bin --samples N --loss X]

DUMP.bin is the --dump-params of the run whose last checkpoint was exported (the same
parameters, as cooktrain's global tensors). Checks, printing "ok ..." / "FAIL ..." lines
("skip ..." for one that cannot run here):
  - the safetensors header: an 8-byte little-endian length, JSON, every tensor's dtype, shape
    and data_offsets tiling the data exactly, config.json beside it;
  - every value: HF's GPT-2 layout of ours (wte without the padding rows; c_attn = [wq; wk; wv]
    transposed, c_proj, c_fc, c_proj transposed); exact in fp32, and in bf16 each value is,
    bit for bit, the round-to-nearest-even of the fp32 one (computed here from its bits);
  - in fp32, with python3-torch installed (skipped with a reason otherwise) and --tokens: a plain
    PyTorch GPT-2 written for HF's layout (Conv1D: x @ W + b), on the export's tensors, gives
    on the first N samples of VAL.bin (in file order) the loss X `cooktrain eval` printed for
    the checkpoint, to 1e-6 relative (torch_check says why).
"""
import json
import math
import os
import struct
import sys


def load_dump(path):
    index = json.load(open(path + ".index.json"))
    data = open(path, "rb").read()
    values = struct.unpack("<%df" % (len(data) // 4), data)
    return {e["name"]: (tuple(e["shape"]), values[e["offset"]:e["offset"] + e["shape"][0] * e["shape"][1]])
            for e in index}


def load_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    return header, data


def bf16_bits(x):
    """The bf16 bits of float32 x, rounded to nearest even (finite x)."""
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def expected(name, dump, vocab):
    """The HF tensor `name` from the dump, as (shape, row-major values)."""
    def get(n):
        return dump[n]
    def transpose(shape, vals):
        r, c = shape
        return (c, r), [vals[i * c + j] for j in range(c) for i in range(r)]
    if name == "wte.weight":
        (r, c), v = get("wte")
        return (vocab, c), list(v[:vocab * c])
    if name == "wpe.weight":
        return get("wpe")
    if name.startswith("ln_f."):
        (r, c), v = get("lnf." + name.split(".")[1])
        return (r,), list(v)
    _, layer, *rest = name.split(".")
    key = ".".join(rest)
    L = "layers.%s." % layer
    one = {"ln_1.weight": "ln1.weight", "ln_1.bias": "ln1.bias", "ln_2.weight": "ln2.weight",
           "ln_2.bias": "ln2.bias", "attn.c_proj.bias": "attn.bo", "mlp.c_fc.bias": "mlp.b_up",
           "mlp.c_proj.bias": "mlp.b_down"}
    if key in one:
        (r, c), v = get(L + one[key])
        return (r,), list(v)
    if key == "attn.c_attn.bias":
        vals = []
        for s in ("bq", "bk", "bv"):
            vals += list(get(L + "attn." + s)[1])
        return (len(vals),), vals
    if key == "attn.c_attn.weight":
        rows, vals = 0, []
        for s in ("wq", "wk", "wv"):
            (r, c), v = get(L + "attn." + s)
            rows += r
            vals += list(v)
        return transpose((rows, c), vals)
    mats = {"attn.c_proj.weight": "attn.wo", "mlp.c_fc.weight": "mlp.w_up",
            "mlp.c_proj.weight": "mlp.w_down"}
    return transpose(*get(L + mats[key]))


def torch_check(header, data, cfg, tokens_path, n_samples, cooktrain_loss, out):
    """The loss of a plain PyTorch GPT-2, built on the exported tensors in HF's layout, on the
    first n_samples samples of tokens_path in file order, against `cooktrain eval`'s."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        out.append("skip torch loss check: python3-torch is not installed")
        return True
    torch.set_num_threads(1)

    def st(name):
        h = header[name]
        a, b = h["data_offsets"]
        return torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).view(*h["shape"])

    C, H, L, V = cfg["n_embd"], cfg["n_head"], cfg["n_layer"], cfg["vocab_size"]
    raw = open(tokens_path, "rb").read()
    width = struct.unpack("<I", raw[16:20])[0]
    toks = struct.unpack("<%d%s" % ((len(raw) - 64) // width, "H" if width == 2 else "I"), raw[64:])
    # cooktrain's samples (core/data/data.h): sample k is tokens [k·T, k·T + T], inputs and shifted
    # targets; `cooktrain eval` reads them in file order
    T, B = cfg["n_positions"], n_samples
    seq = torch.tensor([toks[k * T:k * T + T + 1] for k in range(B)], dtype=torch.long)
    idx, tgt = seq[:, :T], seq[:, 1:]
    mask = torch.tril(torch.ones(T, T))

    def attention(q, k, v):
        q, k, v = (x.view(B, T, H, C // H).transpose(1, 2) for x in (q, k, v))
        a = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        a = F.softmax(a.masked_fill(mask == 0, float("-inf")), dim=-1)
        return (a @ v).transpose(1, 2).reshape(B, T, C)

    def conv1d(x, name):  # HF's Conv1D: y = x @ W + b
        return x @ st(name + ".weight") + st(name + ".bias")

    def norm(x, name):
        return F.layer_norm(x, (C,), st(name + ".weight"), st(name + ".bias"), 1e-5)

    with torch.no_grad():
        x = st("wte.weight")[idx] + st("wpe.weight")[:T]
        for l in range(L):
            p = "h.%d." % l
            q, k, v = conv1d(norm(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
            x = x + conv1d(attention(q, k, v), p + "attn.c_proj")
            h = F.gelu(conv1d(norm(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
            x = x + conv1d(h, p + "mlp.c_proj")
        logits = norm(x, "ln_f") @ st("wte.weight").t()
        loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), reduction="sum").double()
        loss = loss.item() / (B * T)
    # Both are fp32 forwards of the same weights that differ only in summation order (GEMMs,
    # softmax, norm statistics, the loss sum), so they agree to float32 rounding: each op adds a
    # few epsilons (2^-24 ≈ 6e-8) of relative error, and the mean over B·T token losses averages
    # them out — measured 1e-7 relative on the suite's model (at the 7 printed decimals). 1e-6
    # relative (16 epsilons) leaves that margin and still fails a LayerNorm epsilon of 1e-6 for
    # 1e-5 (1e-5 relative) or an anti-causal mask (2e-3).
    if math.isfinite(loss) and abs(loss - cooktrain_loss) <= 1e-6 * abs(cooktrain_loss):
        out.append("ok a plain PyTorch GPT-2 on the export gives cooktrain eval's loss on %d samples "
                   "(%.7f vs %.7f)" % (B, loss, cooktrain_loss))
        return True
    out.append("FAIL PyTorch loss %.7f on the export differs from cooktrain eval's %.7f" % (loss, cooktrain_loss))
    return False


def main(argv):
    path, dump_path = argv[1], argv[2]
    bf16 = "--bf16" in argv
    out = []
    dump = load_dump(dump_path)
    header, data = load_safetensors(path)
    cfg = json.load(open(os.path.join(os.path.dirname(path) or ".", "config.json")))
    meta = header.pop("__metadata__", {})
    out.append("%s header: %d tensors, producer %s" % ("ok" if header else "FAIL", len(header), meta.get("producer")))
    # offsets tile the data in order
    end, ok = 0, True
    for name, h in header.items():
        a, b = h["data_offsets"]
        size = 2 if h["dtype"] == "BF16" else 4
        ok = ok and a == end and b - a == size * math.prod(h["shape"]) and h["dtype"] == ("BF16" if bf16 else "F32")
        end = b
    ok = ok and end == len(data)
    out.append(("ok" if ok else "FAIL") + " dtypes, shapes and data_offsets tile the data exactly")
    want_names = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"} | {
        "h.%d.%s" % (l, k) for l in range(cfg["n_layer"]) for k in (
            "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
            "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
            "mlp.c_proj.weight", "mlp.c_proj.bias")}
    out.append(("ok" if set(header) == want_names else "FAIL") + " the tensor names are GPT-2's")
    worst, bad = 0.0, []
    for name, h in header.items():
        shape, vals = expected(name, dump, cfg["vocab_size"])
        a, b = h["data_offsets"]
        if tuple(h["shape"]) != tuple(shape):
            bad.append("%s shape %s, expected %s" % (name, h["shape"], shape))
            continue
        if bf16:
            got = struct.unpack("<%dH" % ((b - a) // 2), data[a:b])
            for x, y in zip(vals, got):
                if not math.isfinite(x) or bf16_bits(x) != y:
                    bad.append("%s: 0x%04x is not the bf16 rounding of %r" % (name, y, x))
                    break
        else:
            got = struct.unpack("<%df" % ((b - a) // 4), data[a:b])
            if list(got) != list(vals):
                bad.append("%s: values differ" % name)
    out.append(("FAIL " + "; ".join(bad[:3])) if bad else
               "ok every value is the checkpoint's (%s)" % ("bf16 rounding" if bf16 else "bit-exact"))
    if "--tokens" in argv and not bf16:
        arg = lambda flag: argv[argv.index(flag) + 1]
        torch_check(header, data, cfg, arg("--tokens"), int(arg("--samples")), float(arg("--loss")), out)
    print("\n".join(out))
    return 0 if not any(l.startswith("FAIL") for l in out) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
