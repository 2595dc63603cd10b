"""Per-launch table of an `ncu --csv --print-units base` log taken with the metrics
gpu__time_duration.sum, dram__bytes_read.sum, dram__bytes_write.sum, launch__grid_size and
launch__block_size: each launch's time, DRAM bytes and achieved bandwidth, then the sums by
kernel. Shows which shapes of a kernel run far below the memory's bandwidth (bench/NOTES.md).
Usage: python3 scripts/ncu_launches.py ncu.csv [top-N launches, default 40]
"""
import csv
import sys
from collections import defaultdict

from summarize_ncu import short

METRICS = {"gpu__time_duration.sum": "ns", "dram__bytes_read.sum": "read", "dram__bytes_write.sum": "write",
           "launch__grid_size": "grid", "launch__block_size": "block"}


def launches(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    by_id = {}
    for r in csv.DictReader(lines):
        key = METRICS.get(r.get("Metric Name"))
        if key is None:
            continue
        row = by_id.setdefault(r["ID"], {"kernel": short(r["Kernel Name"])})
        row[key] = float(r["Metric Value"].replace(",", ""))
    return [r for r in by_id.values() if "ns" in r]


def main():
    rows = launches(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    total = sum(r["ns"] for r in rows)
    print(f"{len(rows)} launches, {total / 1e6:.3f} ms")
    print(f"{'kernel':60} {'grid':>7} {'block':>5} {'us':>8} {'MB':>8} {'TB/s':>6}")
    for r in sorted(rows, key=lambda r: -r["ns"])[:top]:
        mb = (r.get("read", 0) + r.get("write", 0)) / 1e6
        print(f"{r['kernel']:60} {r.get('grid', 0):7.0f} {r.get('block', 0):5.0f} {r['ns'] / 1e3:8.1f} "
              f"{mb:8.1f} {mb / r['ns'] * 1e3:6.2f}")
    print(f"\n{'kernel':60} {'calls':>6} {'ms':>8} {'GB':>7} {'TB/s':>6}")
    by = defaultdict(lambda: [0, 0.0, 0.0])
    for r in rows:
        s = by[r["kernel"]]
        s[0] += 1
        s[1] += r["ns"]
        s[2] += r.get("read", 0) + r.get("write", 0)
    for name, (calls, ns, b) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:60} {calls:6d} {ns / 1e6:8.3f} {b / 1e9:7.2f} {b / ns * 1e-3:6.2f}")


if __name__ == "__main__":
    main()
