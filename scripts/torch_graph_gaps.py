#!/usr/bin/env python3
"""What makes a replayed CUDA graph's kernels start later on a data-parallel rank (issue 19).

The eleventh session's traces (bench/NOTES.md) found every kernel of our multi-GPU step graph
starting ~0.6-1.4 us later after the one before it than in the 1-GPU graph: ~0.5 ms a GPT-2
step, with the same kernels and the same durations. This separates the suspects, each the
mean time of one kernel of a chain of KERNELS small kernels replayed from one graph:
  no-nccl        the chain, before NCCL exists in the process;
  nccl-idle      the same, after NCCL has connected to its peers (their memory mapped here);
  nccl-same      the chain with an NCCL all-reduce at its end, on the same stream;
  fork-plain     the chain, and a forked stream that runs one small kernel and joins back;
  fork-nccl      the chain, and a forked stream that runs the all-reduce and joins back
                 (our step: the reduce-scatter and all-gather on the communication stream);
  fork-first     one fork at the chain's start instead of its end;
  forks-20       twenty forks spread along the chain (ResNet's side streams fork in every block);
  split          the chain as one graph and the fork as a second graph replayed after it:
                 whether a step cut into a one-stream graph and a forked one keeps the
                 chain's speed (the time of both, per chain kernel);
  two-graphs     concurrency without a fork: the chain as one graph with an external event
                 record node halfway and an external event wait node at its end, and the side
                 kernel as a second one-stream graph (wait, kernel, record) replayed on another
                 stream: whether graphs tied by external events keep the chain's speed.
Run one process per GPU (rank 0 prints), also with NCCL_MEM_SYNC_DOMAIN=0 (NCCL's kernels in
the compute kernels' memory synchronisation domain instead of the remote one):

    torchrun --nproc_per_node 2 scripts/torch_graph_gaps.py
"""
import os

import torch
import torch.distributed as dist

KERNELS = 400
REPLAYS = 30


def per_kernel_us(graph):
    """The best of three: the mean replay time divided by KERNELS, in us."""
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000.0 / REPLAYS / KERNELS)
    return best


def captured(body):
    graph = torch.cuda.CUDAGraph()
    body()  # warm-up outside the capture (NCCL and the kernels' first launches)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        body()
    return graph


def main():
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    x = torch.randn(1 << 16, device="cuda")
    small = torch.ones(1024, device="cuda")
    side = torch.cuda.Stream()

    def chain():
        for _ in range(KERNELS):
            x.mul_(1.0000001)

    def fork(work):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            work()
        torch.cuda.current_stream().wait_stream(side)

    def forked(work):
        def body():
            chain()
            fork(work)
        return body

    def side_kernel():
        small.mul_(1.0)

    def fork_first():
        fork(side_kernel)
        chain()

    def forks_20():
        for _ in range(20):
            for _ in range(KERNELS // 20):
                x.mul_(1.0000001)
            fork(side_kernel)

    class Split:
        """Two graphs replayed one after the other, timed as one."""

        def __init__(self):
            self.first, self.second = captured(chain), captured(lambda: fork(side_kernel))

        def replay(self):
            self.first.replay()
            self.second.replay()

    class TwoGraphs:
        """A one-stream main graph and a one-stream side graph, tied by external events."""

        def __init__(self):
            half = torch.cuda.Event(external=True)
            done = torch.cuda.Event(external=True)

            def main_body():
                for _ in range(KERNELS // 2):
                    x.mul_(1.0000001)
                half.record()
                for _ in range(KERNELS - KERNELS // 2):
                    x.mul_(1.0000001)
                torch.cuda.current_stream().wait_event(done)

            def side_body():
                torch.cuda.current_stream().wait_event(half)
                side_kernel()
                done.record()

            self.side_graph = captured(side_body)
            self.main_graph = captured(main_body)

        def replay(self):
            with torch.cuda.stream(side):
                self.side_graph.replay()
            self.main_graph.replay()

    # Each row is printed as soon as it is measured (rank 0), so that a crash shows where.
    printing = int(os.environ.get("RANK", 0)) == 0
    world = int(os.environ.get("WORLD_SIZE", 1))
    domain = os.environ.get("NCCL_MEM_SYNC_DOMAIN", "default")

    def row(name, measure):
        us = measure()
        if printing:
            print(f"graph gaps {world} GPUs, NCCL_MEM_SYNC_DOMAIN {domain}: {name:11s} {us:.3f} us a kernel",
                  flush=True)

    row("no-nccl", lambda: per_kernel_us(captured(chain)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    dist.all_reduce(small)  # connects to the peers
    torch.cuda.synchronize()
    row("nccl-idle", lambda: per_kernel_us(captured(chain)))

    def same():
        chain()
        dist.all_reduce(small)
    row("nccl-same", lambda: per_kernel_us(captured(same)))
    row("fork-plain", lambda: per_kernel_us(captured(forked(side_kernel))))
    row("fork-nccl", lambda: per_kernel_us(captured(forked(lambda: dist.all_reduce(small)))))
    row("fork-first", lambda: per_kernel_us(captured(fork_first)))
    row("forks-20", lambda: per_kernel_us(captured(forks_20)))
    row("split", lambda: per_kernel_us(Split()))
    # Last: the first run with the variants after no-nccl crashed (SIGSEGV on rank 0) before
    # printing anything (bench/NOTES.md, the twelfth session); this one was measured second.
    try:
        row("two-graphs", lambda: per_kernel_us(TwoGraphs()))
    except Exception as e:  # noqa: BLE001 - an older PyTorch without external events
        print(f"two-graphs: not run ({type(e).__name__}: {e})", flush=True)
    if printing:
        print("graph gaps: all rows measured", flush=True)
    # Both ranks died of SIGSEGV in the twelfth and thirteenth sessions, whether before the
    # first row or at the teardown of graphs that hold NCCL kernels is not known: leave without
    # the interpreter's teardown once every row is out (run with `2>&1 | grep "graph gaps"`).
    torch.cuda.synchronize()
    os._exit(0)


if __name__ == "__main__":
    main()
