#!/usr/bin/env python3
"""The PyTorch peers of cooktrain's GPU benchmark (scripts/bench_gpu.sh), on one CUDA device.

The same GPT-2 as cooktrain's model and scripts/torch_gpt2.py: learned token + position
embeddings, pre-LayerNorm blocks (eps 1e-5) with causal multi-head attention (one fused q|k|v
projection with bias) and a tanh-GELU MLP, final LayerNorm, LM head tied to the token embedding,
vocabulary padded to a multiple of 128 (the padded logits set to -inf, never predicted); AdamW
with decoupled weight decay 0.1 on >= 2-D tensors only, global-norm clipping at 1.0; one optimizer
step per batch of B sequences. With --arch llama it is cooktrain's model.arch: llama instead
(scripts/torch_gpt2.py's Llama): no position embedding, RMSNorm (eps 1e-5, nn.RMSNorm) in place
of LayerNorm, no biases, rotary positions on q and k (theta 10000, pairs (i, i + hd/2) as Hugging
Face rotates them, cos/sin tables made once in float64), --kv-heads key/value heads
(grouped-query attention, SDPA's enable_gqa where this PyTorch has it, else the heads repeated)
and a SwiGLU MLP of width --ffn (gate and up one fused projection), LM head tied as in GPT-2.
Written the way a PyTorch 2.x user writes it for a GPU:

  - attention through F.scaled_dot_product_attention(is_causal=True) (flash attention in bf16),
    the optimizer torch.optim.AdamW(fused=True);
  - mode "eager", or "compile": the model under torch.compile(dynamic=False) (one graph per
    batch shape, no dynamic-shape code), the optimizer as in eager;
  - precision "bf16": torch.autocast("cuda", torch.bfloat16) around forward and loss, fp32
    parameters, gradients and optimizer state; "fp32": fp32 everywhere with TF32 off
    (torch.backends.cuda.matmul.allow_tf32 = False, the same for cuDNN, float32 matmul precision
    "highest"), so that its matmuls are true fp32 as cooktrain's fp32 GEMMs are.

Timed like cooktrain: the synchronized wall time of each whole step (zero_grad, forward,
backward, clip, update) on random tokens made on the device beforehand; the rate is the median
over the steps after --warmup (the first compiled step includes the compilation). Peak memory is
torch.cuda.max_memory_allocated() over the run (the caching allocator's tensors, not its cached
free blocks nor the CUDA context).

Also, before the training runs: the matmul rate of an N x N x N product (--gemm N, per
precision: TFLOP/s = 2·N³ / time, median of timed runs) and causal SDPA at the model's attention
shape (B, heads, T, head dim; --kv-heads key/value heads) forward + backward in milliseconds per
layer (--sdpa), through each kernel PyTorch has for the precision: in bf16 flash attention
(FlashAttention-2), cuDNN's attention and PyTorch's default choice (what the models above run:
cuDNN's on an H100/H200 with PyTorch 2.11); in fp32 the memory-efficient kernel and the default.

  torch_gpt2_gpu.py --batches 16 64 --precisions bf16 fp32 --modes eager compile --steps 20 \
      --gemm 8192 --sdpa

A failure of one run (out of memory; torch.compile without a working C compiler or Triton) is
reported on its row and the next run goes on. Besides one "step ..." line per step, it prints
the lines scripts/bench_gpu.sh reads, space-separated:

  device NAME...                         torch.cuda.get_device_name(0)
  gemm PRECISION N TFLOPS
  sdpa PRECISION B MS_PER_LAYER KERNEL   forward + backward of one layer's attention (KERNEL:
                                         flash, cudnn, efficient or default)
  row MODE PRECISION B TOKENS_PER_S PEAK_BYTES NOTE...   (TOKENS_PER_S and PEAK_BYTES are "-"
                                                          when the run failed; NOTE says why)
"""
import argparse
import contextlib
import gc
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

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).contiguous().view(B, T, C))
        x = x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))
        return x


def sdpa_gqa(q, k, v):
    """Causal SDPA with fewer key/value heads than query heads (q: B, H, T, hd; k, v: B, KV, T, hd)."""
    if k.size(1) == q.size(1):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    try:  # torch >= 2.5
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    except TypeError:
        rep = q.size(1) // k.size(1)
        return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, dim=1),
                                              v.repeat_interleave(rep, dim=1), is_causal=True)


class RMSNorm(nn.Module):
    """nn.RMSNorm's computation, for a PyTorch older than 2.4 that lacks it."""

    def __init__(self, d, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rms_norm(d):
    return nn.RMSNorm(d, eps=1e-5) if hasattr(nn, "RMSNorm") else RMSNorm(d, 1e-5)


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.hd, self.ffn = heads, kv_heads, d // heads, ffn
        self.n1 = rms_norm(d)
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.n2 = rms_norm(d)
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        hd = self.hd
        q, k, v = self.qkv(self.n1(x)).split([self.heads * hd, self.kv_heads * hd, self.kv_heads * hd], dim=2)
        q = q.view(B, T, self.heads, hd).transpose(1, 2)
        k = k.view(B, T, self.kv_heads, hd).transpose(1, 2)
        v = v.view(B, T, self.kv_heads, hd).transpose(1, 2)

        def rotate(t):  # pairs (i, i + hd/2)
            t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
            return t * cos[:T] + torch.cat((-t2, t1), dim=-1) * sin[:T]

        y = sdpa_gqa(rotate(q).to(v.dtype), rotate(k).to(v.dtype), v)
        x = x + self.o(y.transpose(1, 2).contiguous().view(B, T, C))
        g, u = self.gate_up(self.n2(x)).split(self.ffn, dim=2)
        return x + self.down(F.silu(g) * u)


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, d, heads, llama=False, kv_heads=0, ffn=0):
        super().__init__()
        padded = (vocab + 127) // 128 * 128
        self.vocab, self.llama = vocab, llama
        self.wte = nn.Embedding(padded, d)
        if llama:
            self.blocks = nn.ModuleList([LlamaBlock(d, heads, kv_heads or heads, ffn) for _ in range(layers)])
            self.lnf = rms_norm(d)
            hd = d // heads
            inv = 1.0 / 10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", ang.cos().float(), persistent=False)
            self.register_buffer("sin", ang.sin().float(), persistent=False)
        else:
            self.wpe = nn.Embedding(seq, d)
            self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
            self.lnf = nn.LayerNorm(d, eps=1e-5)
            self.register_buffer("pos", torch.arange(seq), persistent=False)
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
                x = b(x, self.cos, self.sin)
        else:
            x = self.wte(idx) + self.wpe(self.pos[:T])
            for b in self.blocks:
                x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        logits[..., self.vocab:] = float("-inf")  # padded rows are never predicted
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def one_line(e):
    """An exception as one short line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, text[0][:160] if text else "")


def train_run(a, mode, precision, batch):
    """Median tokens/s over the steps after the warmup, and the peak allocated bytes."""
    torch.manual_seed(1337)
    model = GPT(a.vocab, a.seq, a.layers, a.d, a.heads, a.arch == "llama", a.kv_heads, a.ffn).cuda()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    forward = torch.compile(model, dynamic=False) if mode == "compile" else model
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    tokens = batch * a.seq
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    rates = []
    for step in range(a.steps):
        idx = torch.randint(0, a.vocab, (batch, a.seq), device="cuda", generator=gen)
        tgt = torch.randint(0, a.vocab, (batch, a.seq), device="cuda", generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = forward(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rates.append(tokens / dt)
        print("step %s %s B=%d %d loss %.4f %.4f s %.1f tokens/s"
              % (mode, precision, batch, step + 1, loss.item(), dt, tokens / dt), flush=True)
    return statistics.median(rates[a.warmup:]), torch.cuda.max_memory_allocated()


def dtype_of(precision):
    return torch.bfloat16 if precision == "bf16" else torch.float32


def gemm_tflops(precision, n, reps=10):
    """Rate of an n x n x n matmul in the precision (fp32: TF32 off), median of `reps` runs."""
    a = torch.randn(n, n, device="cuda", dtype=dtype_of(precision))
    b = torch.randn(n, n, device="cuda", dtype=dtype_of(precision))
    c = torch.empty(n, n, device="cuda", dtype=dtype_of(precision))
    for _ in range(3):
        torch.matmul(a, b, out=c)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2.0 * n ** 3 / statistics.median(times) / 1e12


def sdpa_only(kernel):
    """A context that lets SDPA use only `kernel` ("flash", "efficient" or "cudnn"), or any
    ("default": PyTorch's own choice, the one the models above get)."""
    if kernel == "default":
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # torch >= 2.3
    except ImportError:
        if kernel == "cudnn":
            raise RuntimeError("this PyTorch has no cuDNN attention")
        return torch.backends.cuda.sdp_kernel(enable_flash=kernel == "flash",
                                              enable_mem_efficient=kernel == "efficient",
                                              enable_math=False)
    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}
    if not hasattr(SDPBackend, names[kernel]):
        raise RuntimeError("this PyTorch has no SDPBackend.%s" % names[kernel])
    return sdpa_kernel(getattr(SDPBackend, names[kernel]))


def sdpa_kernels(precision):
    """The SDPA kernels timed in a precision: flash and cuDNN attention have no fp32 kernels."""
    return ("flash", "cudnn", "default") if precision == "bf16" else ("efficient", "default")


def sdpa_ms(precision, batch, heads, kv_heads, seq, hd, kernel, reps=20):
    """Causal SDPA forward + backward at (batch, heads, seq, hd) with kv_heads key/value heads,
    through `kernel` (sdpa_only): median milliseconds. Raises where the kernel cannot run."""
    q, k, v = (torch.randn(batch, h, seq, hd, device="cuda", dtype=dtype_of(precision),
                           requires_grad=True) for h in (heads, kv_heads, kv_heads))
    dout = torch.randn_like(q)

    def once():
        out = sdpa_gqa(q, k, v)
        torch.autograd.grad(out, (q, k, v), dout)

    times = []
    with sdpa_only(kernel):
        for _ in range(3):
            once()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            once()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def release():
    gc.collect()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("vocab", 50257), ("seq", 1024), ("layers", 12), ("d", 768),
                          ("heads", 12), ("steps", 20), ("warmup", 3), ("gemm", 8192)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
    ap.add_argument("--ffn", type=int, default=0, help="llama: the SwiGLU width")
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--precisions", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    ap.add_argument("--modes", nargs="+", choices=("eager", "compile"), default=["eager", "compile"])
    ap.add_argument("--sdpa", action="store_true", help="time causal SDPA at the model's shape")
    a = ap.parse_args()
    if a.arch == "llama" and a.ffn <= 0:
        ap.error("--arch llama needs --ffn (the SwiGLU width)")
    a.kv_heads = a.kv_heads or a.heads
    if a.heads % a.kv_heads:
        ap.error("--kv-heads %d does not divide --heads %d" % (a.kv_heads, a.heads))
    if a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup (%d): the median skips the warmup steps" % a.warmup)
    if not torch.cuda.is_available():
        raise SystemExit("torch_gpt2_gpu: torch.cuda.is_available() is false")
    # fp32 means fp32: no TF32 in matmuls or convolutions (bf16 runs are unaffected)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    print("device %s" % torch.cuda.get_device_name(0))
    print("torch %s, CUDA %s" % (torch.__version__, torch.version.cuda), flush=True)

    if a.gemm > 0:
        for precision in a.precisions:
            try:
                print("gemm %s %d %.1f" % (precision, a.gemm, gemm_tflops(precision, a.gemm)), flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on
                print("# gemm %s failed: %s" % (precision, one_line(e)), flush=True)
            release()
    if a.sdpa:
        for precision in a.precisions:
            for batch in a.batches:
                for kernel in sdpa_kernels(precision):
                    try:
                        ms = sdpa_ms(precision, batch, a.heads, a.kv_heads, a.seq, a.d // a.heads, kernel)
                        print("sdpa %s %d %.4f %s" % (precision, batch, ms, kernel), flush=True)
                    except Exception as e:  # noqa: BLE001
                        print("# sdpa %s B=%d %s failed: %s" % (precision, batch, kernel, one_line(e)), flush=True)
                    release()

    for precision in a.precisions:
        for batch in a.batches:
            for mode in a.modes:
                try:
                    rate, peak = train_run(a, mode, precision, batch)
                    row = "%.1f %d ok" % (rate, peak)
                except torch.cuda.OutOfMemoryError as e:
                    row = "- - out of memory (%s)" % one_line(e)[:80]
                except Exception as e:  # noqa: BLE001 - a failed compile is a row, not the end
                    row = "- - failed: %s" % one_line(e)
                print("row %s %s %d %s" % (mode, precision, batch, row), flush=True)
                if mode == "compile":
                    torch._dynamo.reset()
                release()


if __name__ == "__main__":
    main()
