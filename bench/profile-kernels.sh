#!/usr/bin/env bash
# Per-kernel GPU time of GPT-2 124M training steps (B=16, T=1024), measured with
# Nsight Compute (one metric, gpu__time_duration, so one replay per kernel),
# summed by kernel name. Needs ncu (the lent GPU machines have it).
# Usage: bash bench/profile-kernels.sh BUILD_DIR [precision] [extra key=value ...]
# Environment:
#   KERNELS  an ncu regex (e.g. "layer_norm|cross_entropy"): only those kernels, each launch with
#            its DRAM bytes and achieved bandwidth too (scripts/ncu_launches.py), to see which run
#            far below the memory's bandwidth
#   DETAIL   an ncu regex: one launch of each kernel (and launch shape) it matches, with the
#            occupancy, warp stall reasons and memory workload sections (is a memory-bound
#            kernel short of loads in flight, or held by its arithmetic?)
set -euo pipefail
BUILD=${1:-build-gpu}
PRECISION=${2:-bf16}
shift 2 || true
OUT_DIR=${OUT:-/tmp}/profile-$PRECISION
mkdir -p "$OUT_DIR"
TRAIN=("$BUILD/precis" train examples/configs/gpt2-small.yaml data.train_bin= data.val_bin=
  data.text_file=assets/tinyshakespeare.txt data.tokenizer=gpt2 max_steps=2 batch.tokens_per_step=0
  batch.grad_accum=1 eval_interval=0 sample.tokens=0 log_interval=1 checkpoint.interval=0
  out_dir="$OUT_DIR/run" precision="$PRECISION" "$@")
metrics=gpu__time_duration.sum
filter=()
if [[ -n ${KERNELS:-} ]]; then
  metrics+=,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size
  filter=(--kernel-name "regex:$KERNELS")
fi
ncu --clock-control none "${filter[@]}" --metrics "$metrics" --csv --print-units base "${TRAIN[@]}" \
  >"$OUT_DIR/ncu.csv" 2>"$OUT_DIR/ncu.err" || { tail -20 "$OUT_DIR/ncu.err"; tail -5 "$OUT_DIR/ncu.csv"; exit 1; }
if [[ -n ${KERNELS:-} ]]; then
  python3 scripts/ncu_launches.py "$OUT_DIR/ncu.csv" 60 | tee "$OUT_DIR/summary.txt"
else
  python3 scripts/summarize_ncu.py "$OUT_DIR/ncu.csv" | tee "$OUT_DIR/summary.txt"
fi
if [[ -n ${DETAIL:-} ]]; then
  # The second launch of each launch configuration (kernel, grid, block, shared memory) it
  # matches: the first may pay first-use costs.
  ncu --clock-control none --kernel-name "regex:$DETAIL" --launch-skip 1 --launch-count 1 \
    --filter-mode per-launch-config \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats "${TRAIN[@]}" \
    >"$OUT_DIR/detail.txt" 2>"$OUT_DIR/detail.err" || { tail -20 "$OUT_DIR/detail.err"; exit 1; }
  grep -v "^step " "$OUT_DIR/detail.txt"  # the sections, without the training's step lines
fi
