#!/usr/bin/env python3
"""The timeline of one traced step (`profile.trace`, train/step_trace.h) as text.

Prints the host's phases, then for each GPU stream its busy time and first/last
kernel; the memsets still in the step, each with its size and the kernels on its
stream just before and after it (a memset between two kernels keeps the second
from starting early: core/cuda/graph_memsets.h); the compute stream's longest
idle gaps with the work either side (with `profile.trace_steps: 2` or more, the
gap between two steps among them); and the kernels of the
communication stream one by one with what the compute stream was doing
meanwhile: how much of each collective overlapped the step's own kernels.
docs/distributed.md shows one such timeline.

    python3 scripts/trace_timeline.py TRACE.json
"""
import json
import sys


def load(path):
    """A trace's events and its track names by (pid, tid)."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    return events, names


def print_memsets(by_track, names, ms):
    """Each memset of the step: when, how many bytes, and its stream's neighbours."""
    rows = []
    for key, items in by_track.items():
        work = sorted((e for e in items if e.get("cat") in ("kernel", "memset", "memcpy")), key=lambda e: e["ts"])
        for i, e in enumerate(work):
            if e.get("cat") != "memset":
                continue
            before = work[i - 1]["name"] if i > 0 else "-"
            after = work[i + 1]["name"] if i + 1 < len(work) else "-"
            rows.append((e["ts"], e, names.get(key, str(key)), before, after))
    if not rows:
        print("\nmemsets: none")
        return
    total = sum(e["dur"] for _, e, _, _, _ in rows)
    print(f"\nmemsets: {len(rows)}, {total:.1f} us together")
    print(f"{'start ms':>9} {'bytes':>10} {'us':>6}  stream / kernel before / kernel after")
    for _, e, stream, before, after in sorted(rows, key=lambda r: r[0]):
        print(f"{ms(e['ts']):9.3f} {e.get('args', {}).get('bytes', 0):10d} {e['dur']:6.1f}  "
              f"{stream} / {before[:60]} / {after[:60]}")


def print_gaps(by_track, names, ms, top=8):
    """The compute stream's longest idle gaps between two pieces of work, longest first."""
    for key, items in sorted(by_track.items()):
        name = names.get(key, str(key))
        if not name.endswith("(compute)"):
            continue
        work = sorted((e for e in items if e.get("cat") in ("kernel", "memset", "memcpy")), key=lambda e: e["ts"])
        gaps = []
        reach = None  # the latest end so far: work may overlap on one track
        for prev, nxt in zip(work, work[1:]):
            reach = max(reach or 0, prev["ts"] + prev["dur"])
            if nxt["ts"] > reach:
                gaps.append((nxt["ts"] - reach, reach, prev["name"], nxt["name"]))
        total = sum(g[0] for g in gaps)
        print(f"\nidle gaps on {name}: {len(gaps)}, {total:.1f} us together; the longest:")
        print(f"{'at ms':>9} {'us':>7}  between")
        for gap, at, before, after in sorted(gaps, reverse=True)[:top]:
            print(f"{ms(at):9.3f} {gap:7.1f}  {before[:60]} -> {after[:60]}")


def main(path):
    events, names = load(path)
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        sys.exit(f"{path}: no events")
    origin = min(e["ts"] for e in spans)

    def ms(us):
        return (us - origin) / 1000.0

    by_track = {}
    for e in spans:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    compute = []
    comm = []
    print(f"{'track':<40} {'busy ms':>9} {'first ms':>9} {'last ms':>9} {'events':>7}")
    for key, items in sorted(by_track.items()):
        name = names.get(key, str(key))
        items.sort(key=lambda e: e["ts"])
        busy = sum(e["dur"] for e in items if e.get("cat") != "step") / 1000.0
        print(f"{name:<40} {busy:9.3f} {ms(items[0]['ts']):9.3f} {ms(items[-1]['ts'] + items[-1]['dur']):9.3f} "
              f"{len(items):7d}")
        if name.endswith("(compute)"):
            compute = [e for e in items if e.get("cat") == "kernel"]
        if name.endswith("(communication)"):
            comm = [e for e in items if e.get("cat") == "kernel"]
    phases = [e for e in by_track.get((min(k[0] for k in by_track), 0), []) if e.get("cat") == "phase"]
    if phases:
        print("\nhost phases: " + ", ".join(f"{e['name']} {ms(e['ts']):.2f}-{ms(e['ts'] + e['dur']):.2f}"
                                            for e in sorted(phases, key=lambda e: e["ts"])))
    print_memsets(by_track, names, ms)
    print_gaps(by_track, names, ms)
    if not comm:
        return
    print(f"\n{'collective':<4} {'start ms':>9} {'end ms':>9} {'ms':>7} {'overlapped':>11}")
    for i, c in enumerate(comm):
        start, end = c["ts"], c["ts"] + c["dur"]
        overlap = 0.0
        for k in compute:
            lo, hi = max(start, k["ts"]), min(end, k["ts"] + k["dur"])
            if hi > lo:
                overlap += hi - lo
        share = 100.0 * overlap / c["dur"] if c["dur"] else 0.0
        print(f"{i:<4d} {ms(start):9.3f} {ms(end):9.3f} {c['dur'] / 1000.0:7.3f} {share:10.0f}%")
    # The time only the communication stream worked: the collectives the step's kernels did not hide.
    alone = 0.0
    for c in comm:
        cuts = sorted((max(c["ts"], k["ts"]), min(c["ts"] + c["dur"], k["ts"] + k["dur"])) for k in compute)
        covered, reach = 0.0, c["ts"]
        for lo, hi in cuts:
            lo = max(lo, reach)
            if hi > lo:
                covered += hi - lo
                reach = hi
        alone += c["dur"] - covered
    print(f"\ncommunication with no compute kernel beside it: {alone / 1000.0:.3f} ms (the exposed part)")

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
