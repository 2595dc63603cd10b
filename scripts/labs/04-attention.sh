#!/usr/bin/env bash
# Lab 4 (docs/labs/04-attention.md): flash vs reference attention over the sequence length
# (B = 1) and over the batch (T fixed): time, peak memory, log-log slopes.
# Writes OUT_DIR/seq/ and OUT_DIR/batch/ (attention.md, attention-time.svg, attention-memory.svg).
source "$(dirname "$0")/common.sh"
case $LAB_SIZE in
  tiny) common=(--heads 2 --head-dim 16 --dtype f32 --iters 1) seqs=32,64 seq=32 batches=1,2 ;;
  cpu) common=(--heads 4 --head-dim 64 --dtype f32 --iters 3) seqs=128,256,512,1024 seq=256 batches=1,2,4,8 ;;
  h100) common=(--heads 12 --head-dim 64 --dtype bf16 --iters 20) seqs=512,1024,2048,4096,8192,16384 seq=2048 batches=1,2,4,8,16,32 ;;
esac
"$PRECIS" bench attention --device "$DEVICE" "${common[@]}" --batch 1 --seq "$seqs" --out "$OUT/seq"
"$PRECIS" bench attention --device "$DEVICE" "${common[@]}" --batch "$batches" --seq "$seq" --out "$OUT/batch"
