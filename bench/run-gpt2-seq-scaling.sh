#!/usr/bin/env bash
# GPT-2 124M at longer sequences (issue 6): bf16, 16384 tokens per step
# (B x T = 16 x 1024, 8 x 2048, 4 x 4096), block_size raised to T, flash
# attention against the reference, with `precis bench gpt2`. Prints a markdown
# table; the last line is a one-line summary for scripts/gpu-check.sh. Each
# run's full output is in $OUT_DIR/<attention>-<T>.log.
# Usage: bash bench/run-gpt2-seq-scaling.sh BUILD_DIR [more bench options]
set -uo pipefail
BUILD=${1:-build-gpu}
shift || true
OUT_DIR=${OUT_DIR:-/tmp/precis-bench-seq}
mkdir -p "$OUT_DIR"

field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"; }

table="| T | B | attention | tokens/s | ms/step | peak GiB |
|---|---|---|---|---|---|"
summary=""
for shape in 1024:16 2048:8 4096:4; do
  seq=${shape%%:*}
  batch=${shape##*:}
  for attention in flash reference; do
    log="$OUT_DIR/$attention-$seq.log"
    "$BUILD/precis" bench gpt2 --preset gpt2 --batch "$batch" --seq "$seq" --precision bf16 --steps 10 --warmup 3 \
      --attention "$attention" --device cuda --out "$OUT_DIR/$attention-$seq" "$@" >"$log" 2>&1
    result=$(grep '^result: ' "$log" | tail -1)
    if [ -z "$result" ]; then
      why=$(grep -m1 -o -E 'out of memory|[Ee]rror[^.]*' "$log" | head -1)
      table+=$'\n'"| $seq | $batch | $attention | failed: ${why:-see $log} | | |"
      summary+="T=$seq $attention failed; "
      continue
    fi
    tokens=$(field tokens_per_s "$result")
    table+=$'\n'"| $seq | $batch | $attention | $tokens | $(printf %.1f "$(field ms_per_step "$result")") | $(printf %.2f "$(field peak_gib "$result")") |"
    summary+="T=$seq $attention $(awk -v t="$tokens" 'BEGIN { printf "%.0fK", t / 1000 }'); "
  done
done
echo "$table"
echo "${summary%; }"
