#!/usr/bin/env python3
"""What an all-gather beside compute costs the compute (issue 19; bench/NOTES.md, tenth session, item 9).

ZeRO-1 all-gathers GPT-2's 249 MB of bf16 parameters every step. Behind the next forward it
would be hidden, but an NCCL kernel takes SMs from the forward's products for as long as it
runs (the sixth session: every SM-based overlap lost about what it hid). NCCL 2.28 can run an
all-gather on the copy engines instead (symmetric windows and NCCL_CTA_POLICY=2), with no SMs.
This measures, for each buffer mode, in place as ZeRO-1 gathers (this rank's chunk is a slice
of the output):
  gather    the mean all-gather alone;
  products  a run of bf16 products of the GELU layer's shape (16384 x 768 by 768 x 3072) alone;
  both      the same products on the compute stream while the all-gathers run on another:
            the products' time then, and how much of the gathers' time was hidden.
Modes: plain (PyTorch's caching allocator), registered (ncclMemAlloc + ncclCommRegister, through
register_mem_pool), window (symmetric memory on PyTorch's NCCL backend: ncclCommWindowRegister).
Run one process per GPU, once as is and once with NCCL_CTA_POLICY=2 (copy engines where NCCL
can):

    torchrun --nproc_per_node N scripts/torch_nccl_overlap.py [--modes plain,registered,window]
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_nccl_setup import GPT2_PARAMETERS, init_nccl  # noqa: E402

GATHERS = 10
PRODUCTS = 60


def gather_buffers(mode, n, world, rank, backend):
    """The flat buffer and this rank's chunk of it, in `mode`'s memory, and what keeps it alive."""
    if mode == "plain":
        full = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
        return full, full[rank * (n // world):(rank + 1) * (n // world)], None
    if mode == "registered":
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(pool):
            full = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
        backend.register_mem_pool(pool)
        return full, full[rank * (n // world):(rank + 1) * (n // world)], pool
    if mode == "window":
        import torch.distributed._symmetric_memory as symm_mem
        full = symm_mem.empty(n, dtype=torch.bfloat16, device="cuda")
        handle = symm_mem.rendezvous(full, dist.group.WORLD.group_name)
        full.zero_()
        return full, full[rank * (n // world):(rank + 1) * (n // world)], handle
    raise ValueError(f"unknown mode {mode}")


def timed(run, stream=None):
    """run()'s time on `stream` (default: the current stream) in ms."""
    stream = stream or torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        run()
        end.record()
    return start, end


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="plain,registered,window")
    args = parser.parse_args()
    rank, world = init_nccl(windows="window" in args.modes)
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    n = GPT2_PARAMETERS // world * world
    a = torch.randn(16384, 768, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(768, 3072, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(16384, 3072, device="cuda", dtype=torch.bfloat16)
    comm = torch.cuda.Stream()
    policy = os.environ.get("NCCL_CTA_POLICY", "default")
    for mode in args.modes.split(","):
        try:
            full, mine, keep = gather_buffers(mode, n, world, rank, backend)
        except Exception as e:  # noqa: BLE001 - reported, the next mode runs
            if rank == 0:
                print(f"overlap {world} GPUs policy {policy} {mode}: not available ({type(e).__name__}: {e})", flush=True)
            continue
        gather = lambda: [dist.all_gather_into_tensor(full, mine) for _ in range(GATHERS)]
        products = lambda: [torch.matmul(a, b, out=c) for _ in range(PRODUCTS)]
        with torch.cuda.stream(comm):
            gather()
        products()
        torch.cuda.synchronize()
        results = {}
        for _ in range(2):  # the second round is the one kept (warm clocks, warm caches)
            dist.barrier()
            torch.cuda.synchronize()
            g = timed(gather, comm)
            torch.cuda.synchronize()
            p = timed(products)
            torch.cuda.synchronize()
            dist.barrier()
            torch.cuda.synchronize()
            both_g = timed(gather, comm)
            both_p = timed(products)
            torch.cuda.synchronize()
            results = {k: s.elapsed_time(e) for k, (s, e) in
                       {"g": g, "p": p, "bg": both_g, "bp": both_p}.items()}
        if rank == 0:
            hidden = results["g"] + results["p"] - max(results["bg"], results["bp"])
            print(f"overlap {world} GPUs policy {policy} {mode:10s}: gather {results['g'] / GATHERS:.3f} ms alone, "
                  f"{results['bg'] / GATHERS:.3f} beside; products {results['p']:.2f} ms alone, {results['bp']:.2f} "
                  f"beside ({100 * (results['bp'] / results['p'] - 1):+.1f}%); of {results['g']:.2f} ms of gathers "
                  f"{hidden:.2f} hidden", flush=True)
        del full, mine, keep
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
