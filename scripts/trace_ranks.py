#!/usr/bin/env python3
"""The collectives of one traced data-parallel step, rank beside rank (issue 19).

Every rank writes its trace (`profile.trace: step.json`: rank 0 to step.json, rank k to
step.rankK.json, train/step_trace.h). A collective's kernel starts on each rank when that
rank gets there and ends on all of them together, so its time on a rank is the wait for
the last rank plus the transfer itself. For the i-th NCCL kernel of the step this prints,
per rank, its start and end (ms from the earliest start over all ranks) and its duration,
then the transfer (last start to first end) and how long each rank waited (last start
minus its start). The ends' spread checks the premise that the ranks' traces share a clock
(CUPTI's timestamps on one host): it should be a few microseconds.

    python3 scripts/trace_ranks.py step.json step.rank1.json [step.rank2.json ...]
"""
import json
import sys


def nccl_kernels(path):
    """The NCCL kernels of a trace, in start order, as (start_us, end_us, name)."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = [e for e in events if e.get("ph") == "X" and "nccl" in e.get("name", "").lower()]
    return sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in kernels)


def main(paths):
    ranks = [nccl_kernels(p) for p in paths]
    counts = {len(k) for k in ranks}
    if len(counts) != 1:
        sys.exit(f"the traces hold different numbers of NCCL kernels: {[len(k) for k in ranks]}")
    if not ranks[0]:
        sys.exit("no NCCL kernel in the traces")
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
