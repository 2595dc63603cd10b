#!/usr/bin/env bash
# Why AdamW runs ~1.34 ms inside GPT-2's step and ~0.98 ms alone (bench/NOTES.md, ninth session,
# item 4): the timing test alone (random data in three memory layouts, back to back and after an
# idle GPU), then Nsight Compute on one AdamW launch of that test and on one launch inside an
# eager training step, with the same sections, and one table: duration, DRAM throughput and
# bytes, L2 hit rate, achieved occupancy, SM clock. Same numbers in both rows: the step's context (heat, power, the kernels
# before it) costs the difference; different bytes or hit rates: the step's buffers do.
# Builds nothing: run it after building precis_cli and optim_test_adamw_timing_gpu.
#   BUILD=build dir (default build-gpu)   OUT=folder for the reports (default $OUT or /tmp/adamw-ncu)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/adamw-ncu}
mkdir -p "$OUT"
TEST=$BUILD/tests/optim_test_adamw_timing_gpu
"$TEST" | grep -E "^adamw |OK|FAILED"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats"
KERNEL="--kernel-name-base function -k regex:adamw_kernel"
# The test's first launch is the timing's untimed warm-up; the step's: step 3's optimizer.
ncu $SECTIONS $KERNEL -c 1 -f -o "$OUT/alone" "$TEST" >"$OUT/alone.log" 2>&1 || tail -5 "$OUT/alone.log"
ncu $SECTIONS $KERNEL -s 2 -c 1 -f -o "$OUT/in-step" "$BUILD/precis" bench gpt2 --preset gpt2 --batch 16 \
  --seq 1024 --precision bf16-pure --steps 2 --warmup 2 --device cuda precision.grad_dtype=bfloat16 \
  >"$OUT/in-step.log" 2>&1 || tail -5 "$OUT/in-step.log"
metrics="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second"
printf "%-8s %10s %8s %10s %10s %8s %8s %10s\n" run us dram% readMB writeMB L2hit% occup% smMHz
for run in alone in-step; do
  [[ -f "$OUT/$run.ncu-rep" ]] || { echo "$run: no report"; continue; }
  ncu --import "$OUT/$run.ncu-rep" --csv --page raw --metrics "$metrics" 2>/dev/null | python3 -c '
import csv, sys
head, units, values = list(csv.reader(sys.stdin))[:3]
# To microseconds, megabytes and megahertz, whatever prefix ncu chose.
scale = {"nsecond": 1e-3, "usecond": 1, "msecond": 1e3, "second": 1e6, "byte": 1e-6, "Kbyte": 1e-3,
         "Mbyte": 1, "Gbyte": 1e3, "hz": 1e-6, "Khz": 1e-3, "Mhz": 1, "Ghz": 1e3, "cycle/nsecond": 1e3,
         "cycle/usecond": 1, "cycle/second": 1e-6, "%": 1, "": 1}
def get(name):
    i = head.index(name)
    return float(values[i].replace(",", "")) * scale.get(units[i], scale.get(units[i].lower(), 1))
print("%-8s %10.1f %8.1f %10.1f %10.1f %8.1f %8.1f %10.0f" % (sys.argv[1], get("gpu__time_duration.sum"),
      get("dram__throughput.avg.pct_of_peak_sustained_elapsed"), get("dram__bytes_read.sum"),
      get("dram__bytes_write.sum"), get("lts__t_sector_hit_rate.pct"),
      get("sm__warps_active.avg.pct_of_peak_sustained_active"), get("sm__cycles_elapsed.avg.per_second")))
' "$run" || echo "$run: could not read the report"
done
