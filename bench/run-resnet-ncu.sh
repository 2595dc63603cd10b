#!/usr/bin/env bash
# Each memory-bound kernel launch of one ResNet training step under Nsight Compute: its time,
# DRAM bytes and achieved bandwidth, by shape (scripts/ncu_launches.py), to find the batch-norm
# and pooling launches that run far below the memory's bandwidth (bench/NOTES.md). One step,
# not replayed from a graph, bf16 channels-last, synthetic images; the convolutions are left
# out (KERNELS, an ncu regex, picks the kernels). Needs ncu (the lent GPU machines have it).
# Usage: bash bench/run-resnet-ncu.sh BUILD_DIR [resnet18|resnet50]
set -uo pipefail
BUILD=${1:-build-gpu}
MODEL=${2:-resnet50}
OUT_DIR=${OUT_DIR:-/tmp/precis-resnet-ncu}
KERNELS=${KERNELS:-"packed|pool_|finalize|sgd|copy_|accumulate"}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
mkdir -p "$OUT_DIR"
case $MODEL in
  resnet50) shape=(--image 224 --batch 128) ;;
  *) shape=(--image 32 --batch 256) ;;
esac
"$NCU" --clock-control none --kernel-name "regex:$KERNELS" --csv --print-units base \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size \
  "$BUILD/precis" bench resnet --model "$MODEL" "${shape[@]}" --precision bf16 --channels-last --steps 1 --warmup 0 \
  --device cuda --out "$OUT_DIR/run-$MODEL" >"$OUT_DIR/ncu-$MODEL.csv" 2>"$OUT_DIR/ncu-$MODEL.err" || {
  tail -20 "$OUT_DIR/ncu-$MODEL.err"; exit 1; }
python3 "$(dirname "$0")/../scripts/ncu_launches.py" "$OUT_DIR/ncu-$MODEL.csv" 60 | tee "$OUT_DIR/ncu-$MODEL.txt"
