#!/usr/bin/env bash
# Lab 3 (docs/labs/03-tensor-cores.md): matrix products over shapes and dtypes on the roofline.
# Writes OUT_DIR/matmul.md and OUT_DIR/roofline.svg.
source "$(dirname "$0")/common.sh"
case $LAB_SIZE in
  tiny) args=(--shapes tiny,gpt2-b1 --dtypes fp32,bf16 --iters 1) ;;
  cpu) args=(--iters 3) ;;
  h100) args=(--shapes tiny,1001x1001x1001,unaligned,1024x1024x1024,aligned,8192x8192x8192,gpt2-b1,gpt2-b64,65536x3072x768
              --iters 20) ;;
esac
"$PRECIS" bench matmul --device "$DEVICE" "${args[@]}" --out "$OUT"
