#!/usr/bin/env python3
"""NCCL's own times through PyTorch: the reference for our collectives (issue 19).

Reduce-scatter, all-gather and all-reduce of GPT-2 124M's bf16 gradient buffer
(249 MB), each the mean of 20 calls after 5 warm-ups, with the bus bandwidth
as nccl-tests defines it, for each buffer mode asked for:
  plain       buffers from PyTorch's caching allocator (cudaMalloc), calls one by one;
  registered  buffers from NCCL's own allocator (ncclMemAlloc: cuMem memory) registered
              with the communicator (ncclCommRegister through register_mem_pool): NCCL may
              then read and write them in place instead of through its own buffers;
  graph       plain buffers, the 20 calls captured in one CUDA graph and replayed;
  graph-registered  both (under capture NCCL also registers cuMem buffers itself).
Run one process per GPU:

    torchrun --nproc_per_node N scripts/torch_nccl_reference.py [--modes plain,registered,...]
"""
import argparse

import torch
import torch.distributed as dist

GPT2_PARAMETERS = 124475904
CALLS = 20


def buffers(n, world, pool):
    def make():
        full = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        shard = torch.empty(n // world, device="cuda", dtype=torch.bfloat16)
        return full, shard

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
    dist.init_process_group("nccl", device_id=None)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    dist.barrier()
    n = GPT2_PARAMETERS // world * world
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    for mode in args.modes.split(","):
        pool = None
        try:
            if "registered" in mode:
                pool = torch.cuda.MemPool(backend.mem_allocator)
            full, shard = buffers(n, world, pool)
            if pool is not None:
                backend.register_mem_pool(pool)
        except Exception as e:  # an older PyTorch, or NCCL without the allocator
            if rank == 0:
                print(f"torch-nccl {mode}: not available ({type(e).__name__}: {e})", flush=True)
            continue
        collectives = (
            ("reduce_scatter", (world - 1) / world, lambda: dist.reduce_scatter_tensor(shard, full)),
            ("all_gather", (world - 1) / world, lambda: dist.all_gather_into_tensor(full, shard)),
            ("all_reduce", 2 * (world - 1) / world, lambda: dist.all_reduce(full)),
        )
        for name, bus_factor, call in collectives:
            ms = time_ms(call, graph=mode.startswith("graph"))
            if rank == 0:
                busbw = n * 2 * bus_factor / ms / 1e6
                print(f"torch-nccl {world} GPUs {mode:17s} {name:14s} {n * 2 / 1e6:.1f} MB: {ms:.3f} ms, "
                      f"busbw {busbw:.0f} GB/s", flush=True)
        if pool is not None:
            backend.deregister_mem_pool(pool)
        del full, shard
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
