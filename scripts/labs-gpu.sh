#!/usr/bin/env bash
# The labs of docs/labs/ at the H100 sizes, all into one folder, for one device call:
#   bash scripts/labs-gpu.sh [BUILD_DIR] [OUT_DIR]       (defaults: build-gpu, /tmp/precis-labs)
# then paste OUT_DIR/NN-name/*.md into the 'H100' sections of docs/labs/NN-name.md and copy
# the SVGs next to them. Lab 6's DDP half needs 2 GPUs (it says so and skips on one).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${2:-/tmp/precis-labs}
PRECIS=$(realpath "$BUILD/precis") LAB_SIZE=h100 bash scripts/labs/run-all.sh "$OUT" 2>&1 | tee "$OUT.log"
