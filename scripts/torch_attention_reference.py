"""PyTorch's scaled_dot_product_attention (flash backend), timed the way `precis bench
attention` times ours, for a comparison on the same GPU: causal, bf16, H=12, B*T=16384
tokens; 3 warm-up calls, then 5 rounds of 20 calls, each round timed with CUDA events,
the median round's mean per call. Forward under no_grad; forward+backward = the op, then
torch.autograd.grad for q, k, v (the gradients handed on, as in a model, no .grad).
A reference check, not part of the build: needs torch with CUDA.
Usage: python3 scripts/torch_attention_reference.py [--head-dim 64] [--seq 512,1024,...] [--backend flash|cudnn]
(cudnn: cuDNN's fused attention, which PyTorch's default picks on an H100 and llm.c calls)."""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, TOKENS, ITERS = 12, 16384, 20


def events_ms(fn):
    for _ in range(3):
        fn()
    rounds = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERS):
            fn()
        stop.record()
        stop.synchronize()
        rounds.append(start.elapsed_time(stop) / ITERS)
    return sorted(rounds)[2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seq", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--backend", choices=("flash", "cudnn"), default="flash")
    args = parser.parse_args()
    d = args.head_dim
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.backend}, causal bf16 H={HEADS} D={d} B*T={TOKENS}")
    print("| T | B | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |")
    print("|---|---|---|---|---|---|")
    backend = SDPBackend.FLASH_ATTENTION if args.backend == "flash" else SDPBackend.CUDNN_ATTENTION
    with sdpa_kernel(backend):
        for T in (int(t) for t in args.seq.split(",")):
            B = max(TOKENS // T, 1)
            torch.manual_seed(1)
            q, k, v, dout = (torch.randn(B, HEADS, T, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            for t in (q, k, v):
                t.requires_grad_(True)

            def forward():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def forward_backward():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(out, (q, k, v), dout)

            flops = 4.0 * B * HEADS * T * T * d / 2  # the products, halved by the causal mask
            f, fb = events_ms(forward), events_ms(forward_backward)
            print(f"| {T} | {B} | {f:.3f} | {flops / f / 1e9:.0f} | {fb:.3f} | {3.5 * flops / fb / 1e9:.0f} |", flush=True)


if __name__ == "__main__":
    main()
