#!/usr/bin/env python3
"""PyTorch's side of issue 20's CPU bar: the `make demo` model trained eagerly on the CPU.

The demo's character GPT (examples/configs/shakespeare-char.yaml): GPT-2 blocks (pre-norm,
GELU-tanh MLP of 4x width, causal attention through F.scaled_dot_product_attention), tied
embeddings, 4 layers, 4 heads, 128 wide, a block of 64 positions, the 65 characters of
tinyshakespeare as the vocabulary, no dropout; AdamW (lr 2e-3, betas 0.9/0.99, weight decay
0.1 on the matrices) with the gradient norm clipped to 1, all in fp32, on a batch of 16
sequences of 64 tokens drawn from the text each step. Threads: --threads (default 2, as the
bar pins both programs to two cores with taskset). Prints one line as the last line:
    result: bench=torch-cpu-demo threads=2 batch=16 seq=64 steps=... tokens_per_s=... ms_per_step=...

    taskset -c 0,1 python3 scripts/torch_cpu_reference.py [--steps 30] [--warmup 5] [--compile]
"""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.attn_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)

    def attend(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attend(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class CharGPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, dim):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(block, dim)
        self.h = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        # GPT-2's initialisation, as models/gpt2.cpp: N(0, 0.02), the residual projections
        # scaled by 1/sqrt(2 layers), biases zero.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied embeddings
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    with open(os.path.join(ROOT, "assets", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([lookup[c] for c in text], dtype=torch.long)

    model = CharGPT(len(chars), a.seq, a.layers, a.heads, a.dim)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=2e-3,
        betas=(0.9, 0.99),
    )
    loss_of = torch.compile(model) if a.compile else model

    def step():
        starts = torch.randint(0, len(data) - a.seq - 1, (a.batch,))
        idx = torch.stack([data[s : s + a.seq] for s in starts])
        targets = torch.stack([data[s + 1 : s + a.seq + 1] for s in starts])
        opt.zero_grad(set_to_none=True)
        loss = loss_of(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    ms = (time.perf_counter() - start) * 1000 / a.steps
    tokens = a.batch * a.seq * 1000 / ms
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model        char GPT: {a.layers} layers, {a.heads} heads, {a.dim} wide, {params / 1e6:.2f}M parameters, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads{', compiled' if a.compile else ''}"
    )
    print(f"last loss    {loss.item():.4f}")
    print(
        f"result: bench=torch-cpu-demo threads={a.threads} compile={str(a.compile).lower()} batch={a.batch} "
        f"seq={a.seq} steps={a.steps} warmup={a.warmup} tokens_per_s={tokens:.0f} ms_per_step={ms:.3f}"
    )


if __name__ == "__main__":
    main()
