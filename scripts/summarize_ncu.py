"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log by kernel name.

Only the kernels of the last training step are counted: the step boundary is the
last launch of the first kernel whose name contains 'adamw' (the optimizer ends a step).
Usage: python3 scripts/summarize_ncu.py ncu.csv
"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = name.replace("(anonymous namespace)", "").replace("<unnamed>", "")
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*", "", name)          # drop the argument list
    name = re.sub(r"<(.*)>", lambda m: "<" + re.sub(r"\w+::", "", m.group(1))[:40] + ">", name, count=1)
    head, _, tail = name.partition("<")
    return (head.split("::")[-1] + ("<" + tail if tail else ""))[:70]


def main():
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", ""))))
    adam = [i for i, (n, _) in enumerate(rows) if "adamw" in n.lower()]
    start = 0
    if len(adam) >= 2:
        # kernels after the second-last optimizer launch group: the last step
        groups = [adam[0]] + [b for a, b in zip(adam, adam[1:]) if b - a > 1]
        start = groups[-2] + 1 if len(groups) >= 2 else 0
        while start < len(rows) and "adamw" in rows[start][0].lower():
            start += 1
    step = rows[start:]
    total = sum(t for _, t in step)
    by = defaultdict(lambda: [0, 0.0])
    for n, t in step:
        by[short(n)][0] += 1
        by[short(n)][1] += t
    print(f"last step: {len(step)} kernels, {total / 1e6:.2f} ms of kernel time")
    print(f"{'kernel':72} {'calls':>6} {'ms':>8} {'%':>6}")
    for n, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:40]:
        print(f"{n:72} {c:6d} {t / 1e6:8.3f} {100 * t / total:6.1f}")


if __name__ == "__main__":
    main()
