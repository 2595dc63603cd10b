#!/usr/bin/env python3
"""Kernel times of two traced steps (`profile.trace`), summed by name, side by side.

    python3 scripts/trace_diff.py A.json B.json [N]

Prints each trace's busy time per stream, then the N kernels (default 25) whose summed
duration differs most between A and B: where a step of B spends what A's does not.
"""
import collections
import sys

import trace_timeline


def kernel_sums(path):
    """Each kernel's summed duration (ms), each GPU stream's busy time, and each kernel's calls."""
    events, names = trace_timeline.load(path)
    by_kernel = collections.defaultdict(float)
    by_stream = collections.defaultdict(float)
    counts = collections.Counter()
    for e in events:
        if e.get("ph") != "X":
            continue
        stream = names.get((e["pid"], e["tid"]), str(e["tid"]))
        if "host" in stream.lower() or "phase" in stream.lower():
            continue
        by_kernel[e["name"][:90]] += e["dur"] / 1000.0
        counts[e["name"][:90]] += 1
        by_stream[stream] += e["dur"] / 1000.0
    return by_kernel, by_stream, counts


def main(a_path, b_path, n=25):
    a, a_streams, a_counts = kernel_sums(a_path)
    b, b_streams, b_counts = kernel_sums(b_path)
    for label, streams in (("A", a_streams), ("B", b_streams)):
        print(label, " ".join(f"{s}={t:.3f}ms" for s, t in sorted(streams.items())))
    print(f"{'A ms':>8} {'B ms':>8} {'B-A':>8} {'nA':>4} {'nB':>4}  kernel")
    keys = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0) - a.get(k, 0)))
    for k in keys[:n]:
        print(f"{a.get(k, 0):8.3f} {b.get(k, 0):8.3f} {b.get(k, 0) - a.get(k, 0):+8.3f} {a_counts[k]:4d} {b_counts[k]:4d}  {k}")
    print(f"{sum(a.values()):8.3f} {sum(b.values()):8.3f} {sum(b.values()) - sum(a.values()):+8.3f}  all kernels")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 25)
