#!/usr/bin/env python3
"""NCCL's own times through PyTorch: the reference for our collectives (issue 19).

Reduce-scatter, all-gather and all-reduce of GPT-2 124M's bf16 gradient buffer
(249 MB), each the mean of 20 calls after 5 warm-ups, with the bus bandwidth
as nccl-tests defines it. Run one process per GPU:

    torchrun --nproc_per_node N scripts/torch_nccl_reference.py
"""
import torch
import torch.distributed as dist

GPT2_PARAMETERS = 124475904


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    n = GPT2_PARAMETERS // world * world
    full = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    shard = torch.empty(n // world, device="cuda", dtype=torch.bfloat16)
    collectives = (
        ("reduce_scatter", (world - 1) / world, lambda: dist.reduce_scatter_tensor(shard, full)),
        ("all_gather", (world - 1) / world, lambda: dist.all_gather_into_tensor(full, shard)),
        ("all_reduce", 2 * (world - 1) / world, lambda: dist.all_reduce(full)),
    )
    for name, bus_factor, call in collectives:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            call()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / 20
        if rank == 0:
            busbw = n * 2 * bus_factor / ms / 1e6
            print(f"torch-nccl {world} GPUs {name:14s} {n * 2 / 1e6:.1f} MB: {ms:.3f} ms, busbw {busbw:.0f} GB/s",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
