#!/usr/bin/env python3
"""A training step's GPU kernels (or, without a GPU, its ops) grouped into the categories that
compare two frameworks' ResNet steps, and the comparison side by side.

Both sides write the same tab-separated profile (per-step means, times in ms):
    kind    op    name    calls    ms
  step    -     -     1      the measured step
  op      the op (and pass)  -  calls  its time (Precis: event time; PyTorch on the CPU: self time)
  kernel  the op that launched it, or "-"   the kernel   calls   its GPU time
  copy    same, for memcpy and memset
Precis writes it as OUT_DIR/profile.tsv (`precis bench resnet --profile`, train/profile_tsv.h),
scripts/torch_resnet_profile.py for PyTorch. A side's kernels and copies are grouped when it has
any, else its ops (a CPU run).

    python3 scripts/kernel_categories.py precis/profile.tsv torch.tsv --labels Precis,PyTorch

prints, per category, each side's ms per step and share of its step, and the difference.
"""
import argparse
import re

CONV = "convolution & fc"
NORM = "batch norm / elementwise"
OPTIM = "optimizer"
COPY = "copies & layout"
OTHER = "other"
CATEGORIES = [CONV, NORM, OPTIM, COPY, OTHER]


def _has(text, *parts):
    return any(p in text for p in parts)


# Inductor's kernels are named after the ops they fuse ("triton_poi_fused__native_batch_norm_
# legit_functional_relu_3"); one that fuses only casts, copies or a convolution's layout is a copy;
# triton_tem_ kernels are max-autotune's templates (products, convolutions).
_TRITON_COMPUTE = ("batch_norm", "relu", "threshold", "add", "mul", "sum", "mean", "div", "sub", "sqrt", "var",
                   "pool", "max", "avg", "softmax", "nll", "exp", "log", "where", "sigmoid")
_TRITON_COPY = ("copy", "clone", "convolution", "permute", "cat")


def category(kind, op, name):
    """The category of one profile row: a kernel or copy by its name (and the op that launched
    it), an op (CPU profiles) by the op's name."""
    text = (name if name not in ("", "-") else op).lower()
    op = op.lower()
    if kind == "copy" or text.startswith(("memcpy", "memset")):
        return COPY
    if op.endswith(" step") or "optimizer" in op or _has(text, "optim", "sgd", "adam", "multi_tensor_apply",
                                                          "foreach", "grad_norm", "norm_and_factor"):
        return OPTIM
    if text.startswith("triton_tem"):  # max-autotune's product and convolution templates
        return CONV
    if text.startswith("triton"):
        if _has(text, *_TRITON_COMPUTE):
            return NORM
        return COPY if _has(text, *_TRITON_COPY) else NORM
    if _has(text, "batch_norm", "batchnorm", "bn_fw", "bn_bw", "welford"):
        return NORM
    if _has(text, "copy", "fill", "transpose", "nchwtonhwc", "nhwctonchw", "permute", "clone", "contiguous",
            "accumulate", "convert", "cast", "aten::to", "aten::zero_"):
        return COPY
    if _has(text, "conv", "cudnn", "xmma", "cutlass", "nvjet", "implicit_gemm", "gemm", "wgrad", "dgrad", "fprop",
            "cublas", "mkldnn", "matmul", "addmm", "aten::mm", "linear", "sm90_", "sm80_"):
        return CONV
    if re.search(r"aten::(empty|view|as_strided|reshape|resize_|detach|t|expand|unsqueeze|flatten|select|slice"
                 r"|_unsafe_view|transpose|set_)\b", text):
        return OTHER
    if _has(text, "elementwise", "relu", "threshold", "add", "mul", "pool", "softmax", "cross_entropy", "nll",
            "reduce", "sum", "mean", "where", "clamp", "log", "div", "precis::ops::", "at::native::", "aten::"):
        return NORM
    return OTHER


def read_profile(path):
    """(step ms, rows) of a profile file; each row a dict of kind, op, name, calls, ms."""
    step_ms, rows = None, []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#") or line.startswith("kind\t"):
                continue
            kind, op, name, calls, ms = line.split("\t")
            if kind == "step":
                step_ms = float(ms)
            else:
                rows.append({"kind": kind, "op": op, "name": name, "calls": float(calls), "ms": float(ms)})
    if step_ms is None:
        raise SystemExit(f"{path}: no step row (is it a profile written by precis or torch_resnet_profile.py?)")
    return step_ms, rows


def by_category(rows):
    """(what was grouped: "kernels" or "ops", {category: [calls, ms]}) for one side's rows."""
    device_rows = [r for r in rows if r["kind"] in ("kernel", "copy")]
    grouped = device_rows or [r for r in rows if r["kind"] == "op"]
    totals = {c: [0.0, 0.0] for c in CATEGORIES}
    for r in grouped:
        t = totals[category(r["kind"], r["op"], r["name"])]
        t[0] += r["calls"]
        t[1] += r["ms"]
    return ("kernels" if device_rows else "ops"), totals


def format_categories(step_ms, source, totals):
    """One side's category table: calls, ms per step and share of the step per category."""
    lines = [f"{'category (' + source + ')':34} {'calls':>8} {'ms/step':>9} {'% step':>7}"]
    summed = 0.0
    for c in CATEGORIES:
        calls, ms = totals[c]
        summed += ms
        lines.append(f"{c:34} {calls:8.0f} {ms:9.3f} {100 * ms / step_ms:6.1f}%")
    lines.append(f"{'sum of the ' + source:34} {'':8} {summed:9.3f} {100 * summed / step_ms:6.1f}%")
    lines.append(f"{'step':34} {'':8} {step_ms:9.3f} {100.0:6.1f}%")
    return "\n".join(lines)


def format_side_by_side(sides):
    """sides: [(label, step ms, source, totals)]; the categories side by side, and with two
    sides the first minus the second."""
    head = f"{'category':28}" + "".join(f" {label + ' ms':>14} {'%':>6}" for label, *_ in sides)
    two = len(sides) == 2
    if two:
        head += f" {sides[0][0] + ' - ' + sides[1][0]:>20}"
    lines = [head]

    def row(title, values):
        line = f"{title:28}" + "".join(f" {v:14.3f} {100 * v / s[1]:5.1f}%" for v, s in zip(values, sides))
        if two:
            line += f" {values[0] - values[1]:+20.3f}"
        lines.append(line)

    for c in CATEGORIES:
        row(c, [totals[c][1] for _, _, _, totals in sides])
    row("sum (" + "/".join(s[2] for s in sides) + ")", [sum(t[1] for t in totals.values()) for *_, totals in sides])
    row("step", [s[1] for s in sides])
    row("step - sum (gaps, host)", [s[1] - sum(t[1] for t in s[3].values()) for s in sides])
    # Launches (or op calls) per step: in a replayed graph each costs a gap of the order of a microsecond.
    calls = [sum(t[0] for t in totals.values()) for *_, totals in sides]
    line = f"{'launches (calls) per step':28}" + "".join(f" {c:14.0f} {'':6}" for c in calls)
    lines.append(line + (f" {calls[0] - calls[1]:+20.0f}" if two else ""))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profiles", nargs="+", help="profile files (precis's profile.tsv, torch_resnet_profile.py's)")
    p.add_argument("--labels", help="comma-separated names of the sides (default: the file names)")
    p.add_argument("--step-ms", help="comma-separated steps (ms) the shares are of, an empty entry keeping the "
                   "profile's own (e.g. the step replayed from a CUDA graph, where the profile ran without)")
    a = p.parse_args()
    labels = a.labels.split(",") if a.labels else a.profiles
    steps = a.step_ms.split(",") if a.step_ms else [""] * len(a.profiles)
    if len(labels) != len(a.profiles) or len(steps) != len(a.profiles):
        raise SystemExit(f"--labels and --step-ms need one entry for each of the {len(a.profiles)} profiles")
    sides = []
    for label, path, step in zip(labels, a.profiles, steps):
        step_ms, rows = read_profile(path)
        step_ms = float(step) if step else step_ms
        source, totals = by_category(rows)
        sides.append((label, step_ms, source, totals))
    print(format_side_by_side(sides))


if __name__ == "__main__":
    main()
