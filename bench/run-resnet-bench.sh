#!/usr/bin/env bash
# The ResNet bars of issue 18 with `precis bench resnet` on synthetic images: ResNet-18 with the
# CIFAR stem at 32x32, B=256, under fp32, tf32, fp16 and bf16, NCHW and channels-last, eager
# and replayed from a CUDA graph; then ResNet-50 at 224x224, B=128, bf16 channels-last.
# 20 measured steps after 5 warm-up steps each. Prints a markdown table; each run's full
# output is in $OUT_DIR/<model>-<precision>-<layout>-<mode>.log.
# RUNS="model:image:batch:precision:layout:mode ..." runs only those; TORCH_RUNS="model:image:
# batch:precision:layout:eager|compile ..." adds PyTorch's figures with the same settings
# (scripts/torch_resnet_reference.py), run after Precis's in the same call.
# Usage: bash bench/run-resnet-bench.sh BUILD_DIR [more bench options]
set -uo pipefail
BUILD=${1:-build-gpu}
shift || true
OUT_DIR=${OUT_DIR:-/tmp/precis-bench-resnet}
mkdir -p "$OUT_DIR"
: >"$OUT_DIR/rows.md"

# The value of key $1 in the bench's last line ("result: key=value ...").
field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"; }

table="| model | image | batch | precision | layout | step | images/s | ms/step | peak GiB |
|---|---|---|---|---|---|---|---|---|"
failed=0
run() {  # model image batch precision layout mode
  local flags=()
  [ "$5" = channels-last ] && flags+=(--channels-last)
  [ "$6" = graphs ] && flags+=(--cuda-graphs)
  local log="$OUT_DIR/$1-$4-$5-$6.log"
  "$BUILD/precis" bench resnet --model "$1" --image "$2" --batch "$3" --precision "$4" --steps 20 --warmup 5 \
    --device cuda --out "$OUT_DIR/$1-$4-$5-$6" "${flags[@]}" "${EXTRA[@]}" >"$log" 2>&1
  local result
  result=$(grep '^result: ' "$log" | tail -1)
  if [ -z "$result" ]; then
    echo "$1 $4 $5 $6 failed:"; tail -5 "$log"
    failed=1
    return
  fi
  table+=$'\n'"| $1 | $2 | $3 | $4 | $5 | $6 | $(field images_per_s "$result") | $(printf %.2f "$(field ms_per_step "$result")") | $(printf %.2f "$(field peak_gib "$result")") |"
  echo "${table##*$'\n'}" >>"$OUT_DIR/rows.md"  # each row as it comes (a run cut short keeps them)
}
# PyTorch with the same settings: model image batch precision layout eager|compile.
torch_run() {
  local flags=()
  [ "$5" = channels-last ] && flags+=(--channels-last)
  [ "$6" = compile ] && flags+=(--compile)
  local log="$OUT_DIR/torch-$1-$4-$5-$6.log"
  python3 "$(dirname "$0")/../scripts/torch_resnet_reference.py" --model "$1" --image "$2" --batch "$3" \
    --precision "$4" "${flags[@]}" >"$log" 2>&1
  local result
  result=$(grep '^result: ' "$log" | tail -1)
  if [ -z "$result" ]; then
    echo "torch $1 $4 $5 $6 failed:"; tail -5 "$log"
    return
  fi
  table+=$'\n'"| torch $1 | $2 | $3 | $4 | $5 | $6 | $(field images_per_s "$result") | $(printf %.2f "$(field ms_per_step "$result")") | $(printf %.2f "$(field peak_gib "$result")") |"
  echo "${table##*$'\n'}" >>"$OUT_DIR/rows.md"
}
EXTRA=("$@")
if [ -n "${RUNS:-}" ]; then
  for r in $RUNS; do IFS=: read -r m i b p l mode <<<"$r"; run "$m" "$i" "$b" "$p" "$l" "$mode"; done
else
  for precision in fp32 tf32 fp16 bf16; do
    for layout in nchw channels-last; do
      for mode in eager graphs; do run resnet18 32 256 "$precision" "$layout" "$mode"; done
    done
  done
  for mode in eager graphs; do run resnet50 224 128 bf16 channels-last "$mode"; done
fi
for r in ${TORCH_RUNS:-}; do IFS=: read -r m i b p l mode <<<"$r"; torch_run "$m" "$i" "$b" "$p" "$l" "$mode"; done
echo "$table"
exit $failed
