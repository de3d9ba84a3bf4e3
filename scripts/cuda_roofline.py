#!/usr/bin/env python3
"""The CUDA backend's roofline at GPT-2 124M shapes, as the Markdown table of cuda/README.md.

  python3 scripts/cuda_roofline.py [--batch B] [--seq T] [--bandwidth TB/s] [--peak TFLOP/s]

For every op of one training step (forward and backward of the 12 layers, the LM head and its
loss, and the optimizer), in bf16 mixed precision: the bytes it must move to and from device
memory at least (each operand read once, each result written once: bf16 activations and
parameters, fp32 gradients, statistics and optimizer state) and the FLOPs it must do, the time
each takes at the device's memory bandwidth and at its peak (H100 SXM by default: 3.35 TB/s HBM3,
989 TFLOP/s dense bf16 on tensor cores, 67 TFLOP/s fp32 off them), and the larger of the two —
the roofline time, a lower bound. So the first GPU run can be judged at once: an op far above its
bound is where to look. Counts are per step of B sequences of T tokens; GEMM FLOPs are 2·M·N·K,
attention's are the causal half of 4·B·H·T²·d forward (two GEMMs) and 2.5 times that backward
(five GEMMs; the recomputed scores counted once).

test/cli/cli_cuda.sh checks that cuda/README.md holds this script's output.
"""
import argparse

# GPT-2 124M
L, C, H, V_PAD, V = 12, 768, 12, 50304, 50257
HD = C // H
BF16, F32, I32 = 2, 4, 4


def ops(B, T):
    N = B * T
    P_layer = 12 * C * C + 13 * C  # qkv, proj, fc, fc-proj weights and biases, two norms
    P = L * P_layer + V_PAD * C + T * C + 2 * C
    attn_fwd = 2 * B * H * T * T * HD  # causal half of 4·B·H·T²·d
    rows = []

    def op(name, count, bytes_, flops, tensor_cores=False):
        rows.append((name, count, bytes_, flops, tensor_cores))

    def gemm(name, count, M, Nn, K, c_bytes=BF16):
        op(name, count, (M * K + K * Nn) * BF16 + M * Nn * c_bytes, 2 * M * Nn * K, True)

    # forward
    op("embedding + position fwd", 1, N * I32 + 2 * N * C * BF16 + T * C * BF16, N * C)
    op("layernorm fwd", 2 * L + 1, 2 * N * C * BF16 + 2 * C * BF16 + 2 * N * F32, 8 * N * C)
    gemm("gemm qkv fwd", L, N, 3 * C, C)
    op("attention fwd", L, N * 3 * C * BF16 + N * C * BF16 + B * H * T * F32, attn_fwd, True)
    gemm("gemm attn proj fwd", L, N, C, C)
    gemm("gemm fc fwd", L, N, 4 * C, C)
    op("gelu fwd", L, 2 * N * 4 * C * BF16, 10 * N * 4 * C)
    gemm("gemm fc proj fwd", L, N, C, 4 * C)
    gemm("gemm lm head fwd", 1, N, V_PAD, C)
    # loss: rowmax reads the logits, sumexp reads them, finish reads them and writes dlogits
    op("cross-entropy fwd+bwd (3 passes)", 1, 4 * N * V_PAD * BF16, 6 * N * V_PAD)
    # backward: dX = dY·W (M=N, N=K_in, K=N_out) and dW += dYᵀ·X (fp32 accumulate)
    for name, n_out, n_in, count in (("lm head", V_PAD, C, 1), ("fc proj", C, 4 * C, L),
                                     ("fc", 4 * C, C, L), ("attn proj", C, C, L),
                                     ("qkv", 3 * C, C, L)):
        gemm("gemm %s bwd dX" % name, count, N, n_in, n_out)
        op("gemm %s bwd dW" % name, count,
           (N * n_out + N * n_in) * BF16 + 2 * n_out * n_in * F32, 2 * N * n_in * n_out, True)
    op("gelu bwd (+ fc bias grad)", L, 3 * N * 4 * C * BF16, 20 * N * 4 * C)
    op("attention bwd", L, (N * 3 * C + 2 * N * C) * BF16 + N * 3 * C * BF16 + B * H * T * F32,
       int(2.5 * attn_fwd), True)
    op("layernorm bwd", 2 * L + 1, 3 * N * C * BF16 + 2 * N * F32 + 2 * C * F32, 12 * N * C)
    op("bias grads + residual adds", 4 * L, 2 * N * C * BF16, N * C)
    op("embedding + position bwd", 1, N * C * BF16 + N * I32 + 2 * N * C * F32, N * C)
    # optimizer: param, grad, m, v read; param, m, v written (fp32); the bf16 copy written
    op("adamw (fp32 master, bf16 copy)", 1, P * (7 * F32 + BF16), 12 * P)
    op("grad norm (sum of squares)", 1, P * F32, 2 * P)
    return rows, P


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--bandwidth", type=float, default=3.35, help="TB/s")
    ap.add_argument("--peak", type=float, default=989.0, help="dense bf16 TFLOP/s")
    ap.add_argument("--peak-fp32", type=float, default=67.0, help="fp32 TFLOP/s off tensor cores")
    a = ap.parse_args()
    rows, P = ops(a.batch, a.seq)
    bw, peak, peak32 = a.bandwidth * 1e12, a.peak * 1e12, a.peak_fp32 * 1e12
    print("B = %d, T = %d (%d tokens per step), %.1fM parameters; bandwidth %.2f TB/s, peak %.0f "
          "TFLOP/s bf16 tensor, %.0f fp32." % (a.batch, a.seq, a.batch * a.seq, P / 1e6,
                                                a.bandwidth, a.peak, a.peak_fp32))
    print()
    print("| op | calls | MB moved | GFLOP | ms at bandwidth | ms at peak | bound ms | bound by |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    total = 0.0
    for name, count, b, f, tc in rows:
        t_mem = count * b / bw * 1e3
        t_flop = count * f / (peak if tc else peak32) * 1e3
        bound = max(t_mem, t_flop)
        total += bound
        print("| %s | %d | %.1f | %.1f | %.3f | %.3f | %.3f | %s |" % (
            name, count, count * b / 1e6, count * f / 1e9, t_mem, t_flop, bound,
            "memory" if t_mem >= t_flop else "compute"))
    flops = sum(c * f for _, c, _, f, _ in rows)
    print()
    print("Sum of the bounds: %.2f ms per step, %.0f tokens/s; the step's %.1f TFLOP at that time "
          "would be %.0f%% of peak (the MFU ceiling of this op mix)." % (
              total, a.batch * a.seq / (total / 1e3), flops / 1e12,
              100.0 * flops / (total / 1e3) / peak))


if __name__ == "__main__":
    main()
