#!/usr/bin/env python3
"""The card's clocks and power beside a run: what nvidia-smi sampled while it ran, summed up.

A GPU's step slows as its clocks fall from boost (the power limit, then heat), so a throughput
figure reads best with the clocks it ran at (bench/NOTES.md, seventeenth session). Sampling:

    nvidia-smi --query-gpu=$(python3 scripts/clock_samples.py --fields) \\
        --format=csv,noheader,nounits -lms 100 > RUN.csv &
    ... the run ...; kill %1
    python3 scripts/clock_samples.py RUN.csv [GPU ...]

(scripts/clock-sampler.sh wraps the first and last lines.) A sample counts when kernels ran on
its card for at least half of the sample's period (utilization.gpu >= 50%): the run's steps, not
its start-up or its end. (A power threshold missed launch-bound runs: PyTorch's eager ResNet-18
keeps an H200 busy at under 180 W.) Files without the utilization column count the samples over
250 W. Prints one line for each GPU named
(default: every GPU in the file): the busy samples, the mean SM clock in MHz over them and over
each third of them, the mean power in W likewise, the temperature at the first and the last, and
the clock-event reasons seen (nvidia-smi's bit masks).
"""
import os
import statistics
import sys

FIELDS = "index,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active,utilization.gpu"
BUSY_UTILIZATION = 50.0  # percent
BUSY_WATTS = 250.0  # files written without the utilization column


def busy_samples(path):
    """{GPU index: [(sm MHz, W, deg C, reasons), ...]} of the file's busy samples, in order
    ({} where the sampler wrote no file)."""
    by_gpu = {}
    if not os.path.exists(path):
        return by_gpu
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) < 5:
                continue
            try:
                gpu, mhz, watts, temp = int(cells[0]), float(cells[1]), float(cells[2]), float(cells[3])
            except ValueError:  # a header, or "[N/A]"
                continue
            try:
                busy = float(cells[5]) >= BUSY_UTILIZATION
            except (IndexError, ValueError):  # no utilization column, or "[N/A]"
                busy = watts > BUSY_WATTS
            by_gpu.setdefault(gpu, [])
            if busy:
                by_gpu[gpu].append((mhz, watts, temp, cells[4]))
    return by_gpu


def summary(samples):
    """One line for one GPU's busy samples."""
    if not samples:
        return "no busy samples"
    n = len(samples)
    thirds = [samples[: n // 3], samples[n // 3 : 2 * n // 3], samples[2 * n // 3 :]]

    def mean(rows, i):
        return statistics.mean(r[i] for r in rows) if rows else float("nan")

    reasons = " ".join(sorted({r[3] for r in samples}))
    return (
        f"{n} busy samples, SM {mean(samples, 0):.0f} MHz (thirds "
        f"{' '.join(f'{mean(t, 0):.0f}' for t in thirds)}), {mean(samples, 1):.0f} W (thirds "
        f"{' '.join(f'{mean(t, 1):.0f}' for t in thirds)}), {samples[0][2]:.0f}->{samples[-1][2]:.0f} C, "
        f"reasons {reasons}"
    )


def main(argv):
    if argv[1:] == ["--fields"]:
        print(FIELDS)
        return 0
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    by_gpu = busy_samples(argv[1])
    gpus = [int(g) for g in argv[2:]] or sorted(by_gpu)
    for gpu in gpus:
        print(f"GPU {gpu}: {summary(by_gpu.get(gpu, []))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
