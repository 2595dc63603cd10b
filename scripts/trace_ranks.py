#!/usr/bin/env python3
"""The collectives of one traced data-parallel step, rank beside rank (issue 19).

Every rank writes its trace (`profile.trace: step.json`: rank 0 to step.json, rank k to
step.rankK.json, train/step_trace.h). A collective's kernel starts on each rank when that
rank gets there and ends on all of them together, so its time on a rank is the wait for
the last rank plus the transfer itself. For the i-th NCCL kernel of the step this prints,
per rank, its start and end (ms from the earliest start over all ranks) and its duration,
then the transfer (last start to first end) and how long each rank waited (last start
minus its start). Each trace's times start at its own rank's step; the file says where that
time 0 lies on the host's steady clock (otherData.origin_steady_ns), which puts the ranks on
one clock (a trace without it is aligned on its first collective's end, and says so). The
ends' spread checks the alignment: it should be a few microseconds.

    python3 scripts/trace_ranks.py step.json step.rank1.json [step.rank2.json ...]
"""
import json
import sys


def nccl_kernels(path):
    """The NCCL kernels of a trace, in start order, as (start_us, end_us, name), and where the
    trace's time 0 lies on the host's steady clock (us; None if the file does not say)."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    origin_ns = trace.get("otherData", {}).get("origin_steady_ns") if isinstance(trace, dict) else None
    kernels = [e for e in events if e.get("ph") == "X" and "nccl" in e.get("name", "").lower()]
    return sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in kernels), (
        None if origin_ns is None else origin_ns / 1e3)


def on_one_clock(traces):
    """Each rank's kernels shifted onto one clock: the host's steady clock where every trace
    gives its origin, else (said) the first collective's end, common to all ranks."""
    origins = [origin for _, origin in traces]
    if all(o is not None for o in origins):
        shifts = [o - min(origins) for o in origins]
        print("clock: the host's steady clock (each trace's origin_steady_ns)")
    else:
        ends = [kernels[0][1] for kernels, _ in traces]
        shifts = [max(ends) - end for end in ends]
        print("clock: NOT shared (a trace without origin_steady_ns): aligned on collective 0's end")
    return [[(s + shift, e + shift, n) for s, e, n in kernels] for (kernels, _), shift in zip(traces, shifts)]


def main(paths):
    traces = [nccl_kernels(p) for p in paths]
    counts = {len(k) for k, _ in traces}
    if len(counts) != 1:
        sys.exit(f"the traces hold different numbers of NCCL kernels: {[len(k) for k, _ in traces]}")
    if not traces[0][0]:
        sys.exit("no NCCL kernel in the traces")
    ranks = on_one_clock(traces)
    origin = min(k[0][0] for k in ranks)
    for i in range(len(ranks[0])):
        starts = [k[i][0] for k in ranks]
        ends = [k[i][1] for k in ranks]
        name = ranks[0][i][2].split("(")[0][:60]
        print(f"collective {i}: {name}")
        for r, k in enumerate(ranks):
            start, end, _ = k[i]
            print(f"  rank {r}: start {(start - origin) / 1e3:9.3f} ms  end {(end - origin) / 1e3:9.3f}  "
                  f"{(end - start) / 1e3:7.3f} ms, waited {(max(starts) - start) / 1e3:6.3f}")
        print(f"  transfer (last start to first end) {(min(ends) - max(starts)) / 1e3:.3f} ms; "
              f"ends spread {(max(ends) - min(ends)):.1f} us")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1:])
