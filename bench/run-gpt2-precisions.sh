#!/usr/bin/env bash
# GPT-2 124M (B=16, T=1024) for 12 steps under each precision preset on the GPU,
# on GPT-2 BPE tokens of tinyshakespeare. Prints the sweep's markdown table; the
# last line is a one-line summary (tokens/s per policy) for scripts/gpu-check.sh.
# Usage: bash bench/run-gpt2-precisions.sh BUILD_DIR
set -euo pipefail
BUILD=${1:-build-gpu}
OUT_DIR=${OUT_DIR:-/tmp/precis-bench-gpt2}
"$BUILD/precis" sweep examples/configs/gpt2-small.yaml --precisions fp32,tf32,fp16,bf16,bf16-pure \
  data.train_bin= data.val_bin= data.text_file=assets/tinyshakespeare.txt data.tokenizer=gpt2 \
  max_steps=12 batch.tokens_per_step=0 batch.grad_accum=1 eval_interval=12 eval_steps=4 sample.tokens=0 \
  log_interval=4 checkpoint.keep_last=1 out_dir="$OUT_DIR" >"$OUT_DIR.log" 2>&1 || { tail -20 "$OUT_DIR.log"; exit 1; }
cat "$OUT_DIR/sweep.md"
awk -F'|' '/^\| [a-z]/ && $2 !~ /precision/ { printf "%s %s tok/s;", $2, $5 } END { print "" }' "$OUT_DIR/sweep.md"
