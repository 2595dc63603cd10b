#!/usr/bin/env python3
"""PyTorch's ResNet training step (scripts/torch_resnet_reference.py's model, data and step)
under torch.profiler: the step's CUDA kernels summed by name, and the same kernels grouped into
the categories of scripts/kernel_categories.py, to set beside `precis bench resnet --profile`.

    python3 scripts/torch_resnet_profile.py --model resnet18 --image 32 --batch 256 --precision bf16 \\
        --channels-last [--compile [--compile-mode default]] [--warmup 5] [--steps 20] \\
        [--profile-steps 5] [--tsv OUT.tsv] [--trace OUT.json[.gz]]

After --warmup steps, --steps steps are timed without the profiler (the step time the tables'
shares are of), then --profile-steps steps are profiled; the tables are means per step. The
kernels' durations do not depend on how they were launched, so torch.compile's default mode
(no CUDA graphs) has the kernels of mode reduce-overhead; the profile's kernels are what PyTorch's
graphs replay. --tsv writes the profile in kernel_categories.py's format (--trace: the Chrome
trace, for Perfetto). With --device cpu (for checking on a machine without a GPU) the CPU ops
are profiled instead, by self time, those under optimizer.step() marked as the optimizer's.
"""
import argparse
import collections
import gzip
import json
import os
import re
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_categories  # noqa: E402
import torch_resnet_reference as reference  # noqa: E402

DEVICE_EVENTS = {"kernel": "kernel", "gpu_memcpy": "copy", "gpu_memset": "copy"}


def short_name(name):
    """A demangled kernel name without "void ", its parameter list and anonymous namespaces
    (as Precis's kernel table, train/kernel_table.h)."""
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                if i > 0:
                    name = name[:i]
                break
    if name.startswith("void "):
        name = name[5:]
    return name.replace("(anonymous namespace)::", "")


def device_rows(events, steps):
    """Kernels and copies of the trace summed by (kind, short name), per step."""
    totals = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        kind = DEVICE_EVENTS.get(e.get("cat"))
        if kind is None or e.get("ph") != "X":
            continue
        t = totals[(kind, short_name(e["name"]) if kind == "kernel" else e["name"])]
        t[0] += 1
        t[1] += e.get("dur", 0) / 1000.0
    return [{"kind": k, "op": "-", "name": n, "calls": c / steps, "ms": ms / steps} for (k, n), (c, ms) in totals.items()]


def cpu_op_rows(events, steps):
    """CPU ops by self time (their duration less their direct children's), per step; `op` is
    "optimizer" for those run inside optimizer.step() (its "Optimizer.step#..." annotation)."""
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    by_thread = collections.defaultdict(list)
    for e in spans:
        by_thread[(e["pid"], e["tid"])].append(e)
    totals = collections.defaultdict(lambda: [0, 0.0])
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack, selves = [], []  # the open spans; self time per span
        for i, e in enumerate(thread):
            while stack and thread[stack[-1]]["ts"] + thread[stack[-1]]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                selves[stack[-1]] -= e["dur"]
            selves.append(e["dur"])
            e["_optimizer"] = e["name"].startswith("Optimizer.step") or bool(
                stack and thread[stack[-1]]["_optimizer"])
            stack.append(i)
        for e, self_us in zip(thread, selves):
            if e["cat"] == "cpu_op":
                t = totals[("optimizer" if e["_optimizer"] else "-", e["name"])]
                t[0] += 1
                t[1] += self_us / 1000.0
    return [{"kind": "op", "op": op, "name": name, "calls": c / steps, "ms": ms / steps}
            for (op, name), (c, ms) in totals.items()]


def profile_rows(trace_path, steps):
    with (gzip.open if trace_path.endswith(".gz") else open)(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    rows = device_rows(events, steps)
    return rows if rows else cpu_op_rows(events, steps)


def write_tsv(path, step_ms, rows, steps):
    with open(path, "w") as f:
        f.write(f"# torch_resnet_profile.py: per-step means over {steps} profiled step(s), times in ms\n")
        f.write("kind\top\tname\tcalls\tms\n")
        f.write(f"step\t-\t-\t1\t{step_ms:.6f}\n")
        for r in sorted(rows, key=lambda r: -r["ms"]):
            name = r["name"].replace("\t", " ")
            f.write(f"{r['kind']}\t{r['op']}\t{name}\t{r['calls']:.6g}\t{r['ms']:.6f}\n")


def format_rows(rows, step_ms, top):
    """The `top` rows with the most time, then one line for the rest."""
    rows = sorted(rows, key=lambda r: -r["ms"])
    what = "kernel" if rows and rows[0]["kind"] != "op" else "op (self time)"
    lines = [f"{'#':>3}  {what:90} {'calls':>7} {'ms/step':>9} {'% step':>7}  category"]
    for i, r in enumerate(rows[:top]):
        name = r["name"] if r["kind"] != "op" else (r["name"] + (" [optimizer]" if r["op"] == "optimizer" else ""))
        name = name if len(name) <= 90 else name[:87] + "..."
        cat = kernel_categories.category(r["kind"], r["op"], r["name"])
        lines.append(f"{i + 1:3}  {name:90} {r['calls']:7.1f} {r['ms']:9.3f} {100 * r['ms'] / step_ms:6.1f}%  {cat}")
    rest = rows[top:]
    if rest:
        ms = sum(r["ms"] for r in rest)
        lines.append(f"{'':3}  {'(' + str(len(rest)) + ' more)':90} {sum(r['calls'] for r in rest):7.1f} {ms:9.3f} "
                     f"{100 * ms / step_ms:6.1f}%")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    reference.add_arguments(p)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--tsv", help="write the profile here (kernel_categories.py's format)")
    p.add_argument("--trace", help="keep the Chrome trace of the profiled steps here (gzipped if it ends in .gz)")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_resnet_profile.py: no CUDA device; --device cpu profiles the CPU ops")
    step = reference.make_step(a)
    step_ms = reference.time_steps(a, step)

    activities = [torch.profiler.ProfilerActivity.CPU]
    if a.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(a.profile_steps):
            step()
        reference.synchronize(a.device)
        profiled_ms = (time.perf_counter() - start) * 1000 / a.profile_steps
    trace = a.trace or os.path.join(tempfile.mkdtemp(prefix="torch-resnet-profile-"), "trace.json")
    prof.export_chrome_trace(trace)
    rows = profile_rows(trace, a.profile_steps)
    if not a.trace:
        os.remove(trace)
    if a.tsv:
        write_tsv(a.tsv, step_ms, rows, a.profile_steps)

    layout = "channels-last" if a.channels_last else "nchw"
    mode = a.compile_mode if a.compile else "eager"
    print(f"==== torch {torch.__version__} {a.model} {a.image}x{a.image} B={a.batch} {a.precision} {layout} {mode} "
          f"on {a.device}: {step_ms:.3f} ms a step (mean of {a.steps}, unprofiled; {profiled_ms:.3f} profiled) ====")
    source, totals = kernel_categories.by_category(rows)
    print(f"\n==== {'kernels' if source == 'kernels' else 'CPU ops'} per step (mean of {a.profile_steps} "
          f"profiled steps; % of the unprofiled step) ====")
    print(format_rows(rows, step_ms, a.top))
    print(f"\n==== by category ====\n{kernel_categories.format_categories(step_ms, source, totals)}")
    summed = sum(t[1] for t in totals.values())
    if a.device == "cuda" and summed < 0.5 * step_ms:
        print(f"note: the kernels sum to {summed:.3f} ms of a {step_ms:.3f} ms step: the step waits on the host "
              "(eager or compile's default mode), or the profiler missed kernels replayed from CUDA graphs")
    print(f"result: bench=torch-resnet-profile model={a.model} image={a.image} batch={a.batch} "
          f"precision={a.precision} layout={layout} compile={mode} device={a.device} ms_per_step={step_ms:.3f} "
          f"{source}_ms={summed:.3f}" + "".join(
              f" {re.sub('[^a-z]+', '_', c)}_ms={totals[c][1]:.3f}" for c in kernel_categories.CATEGORIES))


if __name__ == "__main__":
    main()
