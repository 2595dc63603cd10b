#!/usr/bin/env bash
# Per-kernel GPU time of GPT-2 124M training steps (B=16, T=1024), measured with
# Nsight Compute (one metric, gpu__time_duration, so one replay per kernel),
# summed by kernel name. Needs ncu (the lent GPU machines have it).
# Usage: bash bench/profile-kernels.sh BUILD_DIR [precision] [extra key=value ...]
set -euo pipefail
BUILD=${1:-build-gpu}
PRECISION=${2:-bf16}
shift 2 || true
OUT_DIR=${OUT:-/tmp}/profile-$PRECISION
mkdir -p "$OUT_DIR"
ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  "$BUILD/precis" train examples/configs/gpt2-small.yaml data.train_bin= data.val_bin= \
  data.text_file=assets/tinyshakespeare.txt data.tokenizer=gpt2 max_steps=2 batch.tokens_per_step=0 \
  batch.grad_accum=1 eval_interval=0 sample.tokens=0 log_interval=1 checkpoint.interval=0 \
  out_dir="$OUT_DIR/run" precision="$PRECISION" "$@" >"$OUT_DIR/ncu.csv" 2>"$OUT_DIR/ncu.err" || {
  tail -20 "$OUT_DIR/ncu.err"; tail -5 "$OUT_DIR/ncu.csv"; exit 1; }
python3 scripts/summarize_ncu.py "$OUT_DIR/ncu.csv" | tee "$OUT_DIR/summary.txt"
