#!/usr/bin/env bash
# Lab 1 (docs/labs/01-formats.md): values in fp32, tf32, fp16, bf16 and fp8 e4m3/e5m2.
# Writes OUT_DIR/formats.md and OUT_DIR/formats.svg.
source "$(dirname "$0")/common.sh"
"$PRECIS" formats 3.14159 1e-8 65504 70000 1e-5 448 57344 0.1 --out "$OUT"
