#!/usr/bin/env python3
"""An independent forward pass of a Hugging Face-layout model, in numpy (float64).

  reference_forward.py MODEL --tokens SHARD.bin [--samples N]
  reference_forward.py make DIR --arch gpt2|llama|mixtral [--dtype F32|BF16|F16] [--shards N]
                       [--seed S] [--vocab V] [--positions T] [--layers L] [--d-model C]
                       [--heads H] [--kv-heads K] [--d-ff F] [--untied]
                       [--rope-scaling FACTOR --rope-original N] [--experts E --top-k K]

Reads MODEL (a .safetensors file, or a directory holding model.safetensors or a sharded model's
model.safetensors.index.json) and the config.json beside it (what `cooktrain export` writes, or a
Hugging Face checkpoint of the same architecture), takes the first N samples (default 8) of the
token shard in file order as `cooktrain eval` does (sample k: tokens [k*T, k*T + T] as inputs and
shifted targets, T = the config's context length), and prints

  loss X

the mean cross-entropy per token, computed in float64 from the file's values (bf16 tensors
widened exactly). It shares no code with cooktrain: it follows the architecture as Hugging Face
defines it, so agreement with `cooktrain eval` checks the export's layout and every op of the
forward pass at once. Architectures:
  - GPT-2 (model_type "gpt2"): learned positions, LayerNorm, tanh GELU, the head tied to the
    embedding unless config.json says otherwise (then lm_head.weight); Conv1D weights stored
    (in, out);
  - Llama (model_type "llama"): RMSNorm, rotary positions in Hugging Face's half-split form
    (rotate_half: dims i and i + hd/2 pair up, cos/sin tables cat(freqs, freqs)), grouped-query
    attention (query head j reads key/value head j // (n_head / n_kv_head)), SwiGLU MLP
    down(silu(gate(x)) * up(x)), nn.Linear weights stored (out, in), the LM head tied to the
    embedding unless config.json says otherwise (then lm_head.weight);
  - Mixtral (model_type "mixtral"): Llama with every MLP a sparse mixture of num_local_experts
    SwiGLU experts (w1 gate, w3 up, w2 down): softmax over the router's logits, the
    num_experts_per_tok most probable (the lower index first among equals), their probabilities
    renormalised to weigh the experts' outputs.

`make` writes a random model of that shape in Hugging Face's layout the way the safetensors
library does (keys sorted, no padding; split over N files with an index when --shards N > 1), so
that `cooktrain import` is checked on files cooktrain did not write.

Needs python3-numpy (scripts/setup.sh installs it). Exit status 2 with a message on input it
cannot read.
"""
import json
import os
import struct
import sys

import numpy as np


def fail(msg, hint):
    sys.stderr.write("reference_forward: %s\nhint: %s\n" % (msg, hint))
    sys.exit(2)


def load_safetensors(path):
    """{name: float64 array} of every tensor of a safetensors file (F32 or BF16)."""
    raw = open(path, "rb").read()
    if len(raw) < 8:
        fail("%s is too short for a safetensors file" % path, "pass a file cooktrain export wrote")
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        if h["dtype"] == "F32":
            v = np.frombuffer(data[a:b], dtype="<f4").astype(np.float64)
        elif h["dtype"] == "BF16":  # the top 16 bits of a float32: widening is exact
            v = (np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            v = v.astype(np.float64)
        elif h["dtype"] == "F16":
            v = np.frombuffer(data[a:b], dtype="<f2").astype(np.float64)
        else:
            fail("%s: tensor %s has dtype %s" % (path, name, h["dtype"]), "F32, BF16, F16 are read")
        out[name] = v.reshape(h["shape"])
    return out


def load_samples(path, T, n):
    """n samples of T + 1 tokens from a cooktrain token shard (core/data/data.h)."""
    raw = open(path, "rb").read()
    if raw[:8] != b"CTSHARD1":
        fail("%s is not a cooktrain token shard" % path, "pass a .bin that cooktrain prepare wrote")
    width = struct.unpack("<I", raw[16:20])[0]
    toks = np.frombuffer(raw[64:], dtype="<u2" if width == 2 else "<u4").astype(np.int64)
    if len(toks) < n * T + 1:
        fail("%s holds %d tokens, fewer than %d samples of %d" % (path, len(toks), n, T),
             "use fewer --samples")
    return np.stack([toks[k * T:k * T + T + 1] for k in range(n)])


def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def causal_attention(q, k, v, n_head):
    """q, k, v (B, T, C) -> (B, T, C), heads of C / n_head, scale 1/sqrt(head_dim)."""
    B, T, C = q.shape
    hd = C // n_head
    q, k, v = (x.reshape(B, T, n_head, hd).transpose(0, 2, 1, 3) for x in (q, k, v))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(B, T, C)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_logits(w, cfg, idx):
    C, H, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    T = idx.shape[1]
    x = w["wte.weight"][idx] + w["wpe.weight"][:T]
    for l in range(L):
        p = "h.%d." % l
        a = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: x @ W + b
        q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
        x = x + causal_attention(q, k, v, H) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = gelu_tanh(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    tied = cfg.get("tie_word_embeddings", True)
    return x @ (w["wte.weight"] if tied else w["lm_head.weight"]).T


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def sparse_moe(w, p, cfg, m):
    """Mixtral's sparse MLP: softmax over the experts' router logits, the top k (the lower index
    first among equals), their probabilities renormalised, each chosen SwiGLU expert
    w2(silu(w1 m) * w3 m) weighted by its probability."""
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    z = m @ w[p + "gate.weight"].T  # (B, T, E)
    pr = np.exp(z - z.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    top = np.argsort(-pr, axis=-1, kind="stable")[..., :k]
    gates = np.take_along_axis(pr, top, -1)
    gates /= gates.sum(-1, keepdims=True)
    out = np.zeros_like(m)
    for e in range(E):
        q = p + "experts.%d." % e
        g, u = m @ w[q + "w1.weight"].T, m @ w[q + "w3.weight"].T
        y = (g / (1.0 + np.exp(-g)) * u) @ w[q + "w2.weight"].T
        weight = (gates * (top == e)).sum(-1, keepdims=True)  # 0 where e was not chosen
        out += weight * y
    return out


def llama_logits(w, cfg, idx):
    C, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    KV = cfg.get("num_key_value_heads", H)
    hd, eps = C // H, cfg["rms_norm_eps"]
    B, T = idx.shape
    inv_freq = 1.0 / cfg.get("rope_theta", 10000.0) ** (np.arange(0, hd, 2) / hd)
    sc = cfg.get("rope_scaling")
    if sc:  # Llama 3.1 ("llama3"): long wavelengths stretched by factor, short kept, blended between
        if sc.get("rope_type", sc.get("type")) != "llama3":
            fail("rope_scaling of type %r" % sc, "this reference knows rope_type llama3")
        old, lo, hi = sc["original_max_position_embeddings"], sc["low_freq_factor"], sc["high_freq_factor"]
        wavelen = 2 * np.pi / inv_freq
        smooth = (old / wavelen - lo) / (hi - lo)
        blended = (1 - smooth) * inv_freq / sc["factor"] + smooth * inv_freq
        inv_freq = np.where(wavelen > old / lo, inv_freq / sc["factor"],
                            np.where(wavelen < old / hi, inv_freq, blended))
    freqs = np.arange(T)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)  # (T, hd)
    mask = np.tril(np.ones((T, T), dtype=bool))

    def heads(x, n):
        return x.reshape(B, T, n, hd).transpose(0, 2, 1, 3)  # (B, n, T, hd)

    x = w["model.embed_tokens.weight"][idx]
    for l in range(L):
        p = "model.layers.%d." % l
        a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = heads(a @ w[p + "self_attn.q_proj.weight"].T, H)
        k = heads(a @ w[p + "self_attn.k_proj.weight"].T, KV)
        v = heads(a @ w[p + "self_attn.v_proj.weight"].T, KV)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
        s = np.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd), -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        att = (pr @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if cfg.get("model_type") == "mixtral":
            x = x + sparse_moe(w, p + "block_sparse_moe.", cfg, m)
            continue
        g = m @ w[p + "mlp.gate_proj.weight"].T
        u = m @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return x @ head.T


def load_model(path):
    """Every tensor of a .safetensors file or a model directory (sharded or not)."""
    if not os.path.isdir(path):
        return load_safetensors(path)
    if os.path.exists(os.path.join(path, "model.safetensors")):
        return load_safetensors(os.path.join(path, "model.safetensors"))
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    w = {}
    for f in sorted(set(index["weight_map"].values())):
        w.update(load_safetensors(os.path.join(path, f)))
    return w


def save_safetensors(path, tensors, dtype):
    """tensors {name: float array} as the safetensors library writes them (sorted keys)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        v = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dtype == "BF16":  # round to nearest even
            u = v.view(np.uint32).astype(np.uint64)
            raw = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()
        elif dtype == "F16":
            raw = v.astype("<f2").tobytes()
        else:
            raw = v.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(v.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make_model(argv):
    arg = lambda flag, default: argv[argv.index(flag) + 1] if flag in argv else default
    out, kind, dtype = argv[2], arg("--arch", "llama"), arg("--dtype", "F32")
    rng = np.random.default_rng(int(arg("--seed", "1")))
    V, T, L = int(arg("--vocab", "256")), int(arg("--positions", "64")), int(arg("--layers", "2"))
    C, H = int(arg("--d-model", "64")), int(arg("--heads", "4"))
    K, F = int(arg("--kv-heads", str(H))), int(arg("--d-ff", str(4 * C)))
    hd = C // H
    untied = "--untied" in argv
    normal = lambda *shape: rng.normal(0.0, 0.05, shape)
    near1 = lambda n: 1.0 + rng.normal(0.0, 0.1, n)
    w = {}
    if kind == "gpt2":
        cfg = {"model_type": "gpt2", "vocab_size": V, "n_positions": T, "n_embd": C,
               "n_layer": L, "n_head": H, "n_inner": F, "activation_function": "gelu_new",
               "layer_norm_epsilon": 1e-5, "tie_word_embeddings": not untied}
        w["wte.weight"], w["wpe.weight"] = normal(V, C), normal(T, C)
        for l in range(L):
            p = "h.%d." % l
            w[p + "ln_1.weight"], w[p + "ln_1.bias"] = near1(C), normal(C)
            w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"] = normal(C, 3 * C), normal(3 * C)
            w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"] = normal(C, C), normal(C)
            w[p + "ln_2.weight"], w[p + "ln_2.bias"] = near1(C), normal(C)
            w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = normal(C, F), normal(F)
            w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = normal(F, C), normal(C)
        w["ln_f.weight"], w["ln_f.bias"] = near1(C), normal(C)
    else:
        mixtral = kind == "mixtral"
        E, k = int(arg("--experts", "4")), int(arg("--top-k", "2"))
        cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": V,
               "max_position_embeddings": T, "hidden_size": C, "intermediate_size": F,
               "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": K,
               "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
               "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": not untied}
        if "--rope-scaling" in argv:
            cfg["rope_scaling"] = {"rope_type": "llama3", "factor": float(arg("--rope-scaling", "8")),
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": int(arg("--rope-original", "16"))}
        if mixtral:
            cfg.update({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                        "num_local_experts": E, "num_experts_per_tok": k,
                        "router_aux_loss_coef": 0.02, "sliding_window": None})
        w["model.embed_tokens.weight"] = normal(V, C)
        for l in range(L):
            p = "model.layers.%d." % l
            w[p + "input_layernorm.weight"] = near1(C)
            w[p + "self_attn.q_proj.weight"] = normal(H * hd, C)
            w[p + "self_attn.k_proj.weight"] = normal(K * hd, C)
            w[p + "self_attn.v_proj.weight"] = normal(K * hd, C)
            w[p + "self_attn.o_proj.weight"] = normal(C, H * hd)
            w[p + "post_attention_layernorm.weight"] = near1(C)
            if mixtral:  # router logits spread wider than the weights': distinct choices
                w[p + "block_sparse_moe.gate.weight"] = rng.normal(0.0, 0.5, (E, C))
                for e in range(E):
                    q = p + "block_sparse_moe.experts.%d." % e
                    w[q + "w1.weight"], w[q + "w3.weight"] = normal(F, C), normal(F, C)
                    w[q + "w2.weight"] = normal(C, F)
                continue
            w[p + "mlp.gate_proj.weight"] = normal(F, C)
            w[p + "mlp.up_proj.weight"] = normal(F, C)
            w[p + "mlp.down_proj.weight"] = normal(C, F)
        w["model.norm.weight"] = near1(C)
    if untied:
        w["lm_head.weight"] = normal(V, C)
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    shards = int(arg("--shards", "1"))
    if shards == 1:
        save_safetensors(os.path.join(out, "model.safetensors"), w, dtype)
        return 0
    names, weight_map = sorted(w), {}
    for i in range(shards):
        f = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        part = names[i::shards]
        save_safetensors(os.path.join(out, f), {n: w[n] for n in part}, dtype)
        weight_map.update({n: f for n in part})
    json.dump({"metadata": {}, "weight_map": weight_map},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=2)
    return 0


def mean_loss(model_path, tokens_path, n_samples):
    base = model_path if os.path.isdir(model_path) else os.path.dirname(model_path) or "."
    cfg_path = os.path.join(base, "config.json")
    if not os.path.exists(cfg_path):
        fail("no config.json beside %s" % model_path, "cooktrain export writes one next to the model")
    cfg = json.load(open(cfg_path))
    kind = cfg.get("model_type")
    if kind not in ("gpt2", "llama", "mixtral"):
        fail("%s: model_type %r" % (cfg_path, kind), "this reference knows gpt2, llama and mixtral")
    w = load_model(model_path)
    T = cfg["n_positions"] if kind == "gpt2" else cfg["max_position_embeddings"]
    seq = load_samples(tokens_path, T, n_samples)
    idx, tgt = seq[:, :-1], seq[:, 1:]
    logits = (gpt2_logits if kind == "gpt2" else llama_logits)(w, cfg, idx)
    mx = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - mx).sum(-1)) + mx[..., 0]
    picked = np.take_along_axis(logits, tgt[..., None], -1)[..., 0]
    return float((lse - picked).mean())


def main(argv):
    if len(argv) > 2 and argv[1] == "make":
        return make_model(argv)
    if len(argv) < 2 or "--tokens" not in argv:
        fail("usage: reference_forward.py MODEL.safetensors --tokens SHARD.bin [--samples N]",
             "see the top of scripts/reference_forward.py")
    arg = lambda flag, default: argv[argv.index(flag) + 1] if flag in argv else default
    print("loss %.9f" % mean_loss(argv[1], arg("--tokens", None), int(arg("--samples", "8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
