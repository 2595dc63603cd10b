#!/usr/bin/env bash
# Every lab of docs/labs/ into OUT_DIR/NN-name/, at LAB_SIZE (tiny|cpu|h100, default cpu).
#   bash scripts/labs/run-all.sh OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${1:?usage: bash $0 OUT_DIR}
for lab in 01-formats 02-loss-scaling 03-tensor-cores 04-attention 05-ladder 06-cnn-ddp; do
  echo "######## $lab ########"
  bash "$here/$lab.sh" "$OUT/$lab"
done
