#!/usr/bin/env python3
"""The PyTorch peer of cooktrain's CPU benchmark (scripts/bench_cpu.sh --compare-torch).

The same GPT-2 as cooktrain's model: learned token + position embeddings, pre-LayerNorm blocks
(eps 1e-5) with causal multi-head attention (one fused q|k|v projection with bias, as cooktrain
and nanoGPT have it) and a tanh-GELU MLP, final LayerNorm, LM head tied to the token embedding,
vocabulary padded to a multiple of 128; fp32, or with --autocast bf16 mixed precision the way PyTorch users run it on a CPU
(torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss: matmuls in bf16 through
oneDNN, fp32 parameters, optimizer and reductions); AdamW with decoupled weight decay on >= 2-D
tensors only, global-norm clipping at 1.0; one optimizer step per batch of B sequences. It is
written the way a careful PyTorch 1.13 user would (nanoGPT's structure; 1.13 has no fused
scaled_dot_product_attention). Timed like cooktrain: wall time of each whole step (forward,
backward, clip, update); prints one line per step and the median.

  torch_gpt2.py --vocab 50257 --seq 256 --layers 12 --d 768 --heads 12 --batch 4 --steps 6

With --arch llama it is the same Llama as cooktrain's model.arch: llama: RMSNorm (eps 1e-5; 1.13
has no nn.RMSNorm, so x·rsqrt(mean x² + eps)·w, as Hugging Face's LlamaRMSNorm computes it),
rotary positions (theta 10000, cos/sin tables built once), grouped-query attention (--kv-heads
key/value heads, each repeated for its query heads), one fused q|k|v projection and one fused
gate|up projection without biases (as cooktrain's), SwiGLU down(silu(gate)·up) of width --ffn,
no position table, the LM head tied to the token embedding.

It first prints the BLAS and CPU lines of torch.__config__.show(), so a ratio against cooktrain
can be explained by the library underneath. With --gemm-rate it instead measures PyTorch's own
GEMM rate at this model's shapes (fp32, or bf16 with --autocast) the way `cooktrain train --gemm-rate` measures cooktrain's:
every linear layer's forward (x·Wᵀ), input-gradient (dy·W) and weight-gradient (dyᵀ·x) matmul for
a batch of B·T tokens, operands in cache, median of a few runs, weighted by how often a step
runs it; it prints "gemm_flops_per_s X" and "flops_per_token X" (6 × GEMM parameters, the
tied LM head included, plus causal attention 6·L·T·C, as cooktrain counts them).
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, C = x.shape
        h = self.ln1(x)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.qkv(h).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads))
        att = att.masked_fill(mask[:T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.o(y)
        x = x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))
        return x


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.hd, self.ffn = heads, kv_heads, d // heads, ffn
        self.n1 = nn.Parameter(torch.ones(d))
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.n2 = nn.Parameter(torch.ones(d))
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    @staticmethod
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def forward(self, x, mask, cos, sin):
        B, T, C = x.shape
        h = self.rms(x, self.n1)
        q, k, v = self.qkv(h).split([self.heads * self.hd, self.kv_heads * self.hd,
                                     self.kv_heads * self.hd], dim=2)
        q = q.view(B, T, self.heads, self.hd).transpose(1, 2)
        k = k.view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = v.view(B, T, self.kv_heads, self.hd).transpose(1, 2)

        def rotate(t):  # half-split pairs (i, i + hd/2), Hugging Face's form
            t1, t2 = t[..., : self.hd // 2], t[..., self.hd // 2:]
            return t * cos[:T] + torch.cat((-t2, t1), dim=-1) * sin[:T]

        q, k = rotate(q), rotate(k)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(mask[:T, :T] == 0, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.o(y)
        g, u = self.gate_up(self.rms(x, self.n2)).split(self.ffn, dim=2)
        return x + self.down(F.silu(g) * u)


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, d, heads, llama=False, kv_heads=0, ffn=0):
        super().__init__()
        padded = (vocab + 127) // 128 * 128
        self.vocab, self.llama = vocab, llama
        self.wte = nn.Embedding(padded, d)
        if llama:
            self.blocks = nn.ModuleList([LlamaBlock(d, heads, kv_heads, ffn)
                                         for _ in range(layers)])
            self.nf = nn.Parameter(torch.ones(d))
            hd = d // heads
            inv = 1.0 / 10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", ang.cos().float())
            self.register_buffer("sin", ang.sin().float())
        else:
            self.wpe = nn.Embedding(seq, d)
            self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
            self.lnf = nn.LayerNorm(d, eps=1e-5)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)))
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("o.weight", "down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        if self.llama:
            x = self.wte(idx)
            for b in self.blocks:
                x = b(x, self.mask, self.cos, self.sin)
            x = LlamaBlock.rms(x, self.nf)
        else:
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for b in self.blocks:
                x = b(x, self.mask)
            x = self.lnf(x)
        logits = x @ self.wte.weight.t()
        logits[..., self.vocab:] = float("-inf")  # padded rows are never predicted
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def print_backend():
    """The library lines of PyTorch's build configuration: which BLAS, which CPU kernels."""
    print("torch %s" % torch.__version__)
    for line in torch.__config__.show().splitlines():
        line = line.strip(" -")
        if line.startswith("Build settings:"):
            settings = dict(kv.split("=", 1) for kv in line[len("Build settings:"):].split(", ")
                            if "=" in kv)
            line = "build: " + ", ".join("%s=%s" % (k.strip(), settings[k].strip(" ,"))
                                         for k in settings
                                         if k.strip() in ("BLAS_INFO", "LAPACK_INFO",
                                                          "USE_MKLDNN", "USE_OPENMP"))
        elif not any(k in line for k in ("MKL", "OpenMP", "CPU capability", "oneDNN")):
            continue
        print("torch config: " + line)
    # "generic" BLAS is whatever libblas.so.3 the system links: name the file really loaded.
    torch.ones(64, 64) @ torch.ones(64, 64)
    try:
        libs = sorted(set(line.split()[-1] for line in open("/proc/self/maps")
                          if "blas" in line.lower() and "/" in line))
        print("torch BLAS loaded: " + (", ".join(libs) or "none found in /proc/self/maps"))
    except OSError:
        pass
    print("torch threads: %d" % torch.get_num_threads(), flush=True)


def gemm_rate(a):
    """FLOP/s of matmul (fp32, or bf16 with --autocast) at the model's linear shapes, weighted
    like cooktrain's."""
    dtype = torch.bfloat16 if a.autocast else torch.float32
    n, c = a.batch * a.seq, a.d
    vp = (a.vocab + 127) // 128 * 128
    if a.arch == "llama":
        f, kv = a.ffn, a.kv_heads * (a.d // a.heads)
        # fused q|k|v, attention out, fused gate|up, down, the LM head
        linears = [(c + 2 * kv, c, a.layers), (c, c, a.layers), (2 * f, c, a.layers),
                   (c, f, a.layers), (vp, c, 1)]
    else:
        f = 4 * a.d
        # (out, in, times per step): fused q|k|v, attention out, MLP up, MLP down, the LM head
        linears = [(3 * c, c, a.layers), (c, c, a.layers), (f, c, a.layers), (c, f, a.layers),
                   (vp, c, 1)]

    def median_seconds(fn, reps=5):
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    flops = seconds = 0.0
    with torch.no_grad():
        for out, inp, count in linears:
            x = torch.full((n, inp), 0.01, dtype=dtype)
            w = torch.full((out, inp), 0.02, dtype=dtype)
            dy = torch.full((n, out), 0.01, dtype=dtype)
            t = (median_seconds(lambda: x @ w.t()) + median_seconds(lambda: dy @ w) +
                 median_seconds(lambda: dy.t() @ x))
            flops += 3 * 2.0 * n * out * inp * count
            seconds += t * count
    n_matmul = sum(o * i * k for o, i, k in linears)
    print("gemm_flops_per_s %.6e" % (flops / seconds))
    print("flops_per_token %.6e" % (6.0 * n_matmul + 6.0 * a.layers * a.seq * c))


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("vocab", 50257), ("seq", 256), ("layers", 12), ("d", 768),
                          ("heads", 12), ("batch", 4), ("steps", 6), ("threads", 2)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
    ap.add_argument("--ffn", type=int, default=0, help="llama: the SwiGLU width")
    ap.add_argument("--gemm-rate", action="store_true")
    ap.add_argument("--autocast", action="store_true", help="bf16 autocast (mixed precision)")
    a = ap.parse_args()
    a.kv_heads = a.kv_heads or a.heads
    torch.manual_seed(1337)
    torch.set_num_threads(a.threads)
    print_backend()
    if a.gemm_rate:
        gemm_rate(a)
        return
    model = GPT(a.vocab, a.seq, a.layers, a.d, a.heads, a.arch == "llama", a.kv_heads, a.ffn)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    tokens = a.batch * a.seq
    rates = []
    for step in range(a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq))
        tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        rates.append(tokens / dt)
        print("step %d loss %.4f %.3f s %.1f tokens/s" % (step + 1, loss.item(), dt, tokens / dt),
              flush=True)
    print("median_tokens_per_s %.1f" % statistics.median(rates[2:] if len(rates) > 2 else rates))


if __name__ == "__main__":
    main()
