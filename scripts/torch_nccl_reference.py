#!/usr/bin/env python3
"""NCCL's own times through PyTorch: the reference for our collectives (issue 19).

Reduce-scatter (summing, and averaging as ZeRO-1 does), all-gather and all-reduce of GPT-2 124M's bf16 gradient buffer
(249 MB), each the mean of 20 calls after 5 warm-ups, with the bus bandwidth
as nccl-tests defines it, for each buffer mode asked for:
  plain       buffers from PyTorch's caching allocator (cudaMalloc), calls one by one;
  registered  buffers from NCCL's own allocator (ncclMemAlloc: cuMem memory) registered
              with the communicator (ncclCommRegister through register_mem_pool): NCCL may
              then read and write them in place instead of through its own buffers;
  graph       plain buffers, the 20 calls captured in one CUDA graph and replayed;
  window      buffers in a symmetric NCCL window (ncclCommWindowRegister through PyTorch's
              NCCL symmetric-memory backend): NCCL's symmetric kernels may take the call;
  graph-registered  both (under capture NCCL also registers cuMem buffers itself).
A mode is a '+'- (or '-')-joined set of these words, and `inplace`: this rank's shard is its
chunk of the full buffer, as ZeRO-1's reduce-scatter and all-gather are (e.g. window+inplace,
graph+window+inplace). Run one process per GPU:

    torchrun --nproc_per_node N scripts/torch_nccl_reference.py [--modes plain,registered,...]
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_nccl_setup import GPT2_PARAMETERS, init_nccl  # noqa: E402

CALLS = 20


def buffers(n, world, rank, flags, pool):
    """The full buffer and this rank's shard, in the memory `flags` ask for."""
    chunk = n // world
    if "window" in flags:
        import torch.distributed._symmetric_memory as symm_mem
        group = dist.group.WORLD.group_name
        full = symm_mem.empty(n, dtype=torch.bfloat16, device="cuda")
        symm_mem.rendezvous(full, group)
        full.normal_()
        if "inplace" in flags:
            return full, full[rank * chunk:(rank + 1) * chunk]
        shard = symm_mem.empty(chunk, dtype=torch.bfloat16, device="cuda")
        symm_mem.rendezvous(shard, group)
        return full, shard

    def make():
        full = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        if "inplace" in flags:
            return full, full[rank * chunk:(rank + 1) * chunk]
        return full, torch.empty(chunk, device="cuda", dtype=torch.bfloat16)

    if pool is None:
        return make()
    with torch.cuda.use_mem_pool(pool):
        return make()


def time_ms(call, graph):
    """The mean time of one call, of CALLS run back to back (or replayed from one graph)."""
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    run = lambda: [call() for _ in range(CALLS)]
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        g.replay()
        torch.cuda.synchronize()
        run = g.replay
    dist.barrier()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / CALLS


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="plain")
    args = parser.parse_args()
    rank, world = init_nccl(windows="window" in args.modes)
    dist.barrier()
    n = GPT2_PARAMETERS // world * world
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    for mode in args.modes.split(","):
        flags = set(mode.replace("-", "+").split("+"))
        pool = None
        try:
            if "registered" in flags:
                pool = torch.cuda.MemPool(backend.mem_allocator)
            full, shard = buffers(n, world, rank, flags, pool)
            if pool is not None:
                backend.register_mem_pool(pool)
        except Exception as e:  # an older PyTorch, or NCCL without the allocator
            if rank == 0:
                print(f"torch-nccl {mode}: not available ({type(e).__name__}: {e})", flush=True)
            continue
        collectives = (
            ("reduce_scatter", (world - 1) / world, lambda: dist.reduce_scatter_tensor(shard, full)),
            # ZeRO-1's: the mean over ranks (NCCL's ncclAvg), which not every NCCL kernel serves.
            ("reduce_scatter_avg", (world - 1) / world,
             lambda: dist.reduce_scatter_tensor(shard, full, op=dist.ReduceOp.AVG)),
            ("all_gather", (world - 1) / world, lambda: dist.all_gather_into_tensor(full, shard)),
            ("all_reduce", 2 * (world - 1) / world, lambda: dist.all_reduce(full)),
        )
        for name, bus_factor, call in collectives:
            ms = time_ms(call, graph="graph" in flags)
            if rank == 0:
                busbw = n * 2 * bus_factor / ms / 1e6
                print(f"torch-nccl {world} GPUs {mode:24s} {name:18s} {n * 2 / 1e6:.1f} MB: {ms:.3f} ms, "
                      f"busbw {busbw:.0f} GB/s", flush=True)
        if pool is not None:
            backend.deregister_mem_pool(pool)
        del full, shard
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
