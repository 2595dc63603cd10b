#!/usr/bin/env bash
# The labs of docs/labs/ at the H100 sizes, each into OUT_DIR/NN-name/, for one device call:
#   bash scripts/labs-gpu.sh [BUILD_DIR] [OUT_DIR]       (defaults: build-gpu, /tmp/precis-labs)
# then paste OUT_DIR/NN-name/*.md into the 'H100' sections of docs/labs/NN-name.md and copy
# the SVGs next to them. Lab 6's DDP half needs 2 GPUs (it says so and skips on one).
#   LABS        which labs, in order (default: all six)
#   DEADLINE_S  seconds from the start after which a running lab is stopped and no other starts
# The tables, plots and logs (not the run folders' checkpoints) end in OUT_DIR.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${2:-/tmp/precis-labs}
mkdir -p "$OUT"
start=$(date +%s)
for lab in ${LABS:-01-formats 02-loss-scaling 03-tensor-cores 04-attention 05-ladder 06-cnn-ddp}; do
  left=$((${DEADLINE_S:-100000} - ($(date +%s) - start)))
  if ((left <= 0)); then echo "$lab: not run (DEADLINE_S)"; continue; fi
  echo "######## $lab ########"
  PRECIS=$(realpath "$BUILD/precis") LAB_SIZE=h100 timeout "$left" bash "scripts/labs/$lab.sh" "$OUT/$lab" \
    >"$OUT/$lab.log" 2>&1
  echo "$lab: exit $? after $(($(date +%s) - start)) s"
done
(cd "$OUT" && find . \( -name '*.md' -o -name '*.svg' -o -name '*.csv' -o -name '*.log' -o -name 'metrics.jsonl' -o -name 'numerics.jsonl' \) |
  tar czf "$OUT.tgz" -T -)
