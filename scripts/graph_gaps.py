#!/usr/bin/env python3
"""Where a replayed step's time goes between kernels: from an Nsight Systems trace of CUDA-graph
replays (`nsys profile --cuda-graph-trace=node`), exported with
`nsys stats --report cuda_gpu_trace --format csv`.

Steps are cut at each launch of MARKER (a kernel that runs once a step, e.g. adamw_kernel); for
the last steps it prints the step's span, the time some kernel or memset ran (overlaps merged),
the idle rest, the launches, and the largest idle gaps with the two kernels around them.

    python3 scripts/graph_gaps.py TRACE_cuda_gpu_trace.csv [--marker adamw_kernel] [--steps 3]
"""
import argparse
import csv
import re


def short(name):
    name = re.sub(r"\(.*", "", name)
    return name[-70:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--marker", default="adamw_kernel")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    rows = []
    with open(args.csv) as f:
        for r in csv.DictReader(f):
            start, duration = int(r["Start (ns)"]), int(r["Duration (ns)"])
            rows.append((start, start + duration, r["Name"]))
    rows.sort()
    ends = [i for i, (_, _, name) in enumerate(rows) if args.marker in name]
    if len(ends) < 2:
        raise SystemExit(f"fewer than two launches of {args.marker}")
    for a, b in list(zip(ends, ends[1:]))[-args.steps:]:
        step = rows[a + 1:b + 1]
        span = step[-1][1] - rows[a][1]
        busy, gaps, last_end, last_name = 0, [], rows[a][1], short(rows[a][2])
        for start, end, name in step:
            if start > last_end:
                gaps.append((start - last_end, last_name, short(name)))
            if end > last_end:
                busy += end - max(start, last_end)
                last_end, last_name = end, short(name)
        idle = span - busy
        print(f"step: span {span / 1e6:.3f} ms, busy {busy / 1e6:.3f} ms, idle {idle / 1e6:.3f} ms "
              f"in {len(gaps)} gaps, {len(step)} launches")
    gaps.sort(reverse=True)
    print(f"largest gaps of the last step (us: the launch before -> the one after):")
    for g, before, after in gaps[:args.top]:
        print(f"  {g / 1e3:7.2f}  {before}  ->  {after}")
    by_kind = {}
    for g, before, after in gaps:
        key = ("cuBLASLt" if re.search(r"nvjet|xmma|splitK|cublas", after) else
               "memset" if "memset" in after.lower() else "ours")
        by_kind[key] = by_kind.get(key, 0) + g
    print("idle before each kind of launch (ms):", {k: round(v / 1e6, 3) for k, v in by_kind.items()})


if __name__ == "__main__":
    main()
