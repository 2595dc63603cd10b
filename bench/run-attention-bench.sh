#!/usr/bin/env bash
# Attention alone (issue 6): our flash kernels and the reference, bf16, causal, H=12,
# D=64, 16384 tokens, T from 512 to 16384, with `precis bench attention`; then PyTorch's
# flash backend timed the same way (scripts/torch_attention_reference.py) when torch
# with CUDA is installed. The last line is a one-line summary for scripts/gpu-check.sh.
# Usage: bash bench/run-attention-bench.sh BUILD_DIR
set -uo pipefail
BUILD=${1:-build-gpu}
OUT_DIR=${OUT_DIR:-/tmp/precis-bench-attention}
mkdir -p "$OUT_DIR"
cd "$(dirname "$0")/.."

"$BUILD/precis" bench attention --impl both | tee "$OUT_DIR/precis.log"
summary="precis fwd+bwd ms:"
summary+=$(awk -F'|' '$2 ~ /^ *[0-9]+ *$/ && $4 ~ /flash/ { printf " T=%d %.3f", $2, $7 }' "$OUT_DIR/precis.log")
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  python3 scripts/torch_attention_reference.py | tee "$OUT_DIR/torch.log"
  summary+="; torch:"
  summary+=$(awk -F'|' '$2 ~ /^ *[0-9]+ *$/ { printf " T=%d %.3f", $2, $6 }' "$OUT_DIR/torch.log")
else
  echo "(torch with CUDA not found: no PyTorch comparison)"
fi
echo "$summary"
