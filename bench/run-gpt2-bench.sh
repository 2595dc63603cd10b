#!/usr/bin/env bash
# GPT-2 124M training throughput (B=16, T=1024, on GPT-2 BPE tokens of
# tinyshakespeare) under bf16, bf16-pure (llm.c's policy: bf16 weights and
# activations, f32 master weights in AdamW), fp16, tf32 and fp32, each step run eagerly and
# replayed from a CUDA graph, with `precis bench gpt2`: 20 measured steps after
# 5 warm-up steps each, about two minutes on an H100. Prints a markdown table;
# the last line is a one-line summary for scripts/gpu-check.sh. Each run's full
# output is in $OUT_DIR/<precision>-<mode>.log.
# Usage: bash bench/run-gpt2-bench.sh BUILD_DIR [more bench options]
set -uo pipefail
BUILD=${1:-build-gpu}
shift || true
OUT_DIR=${OUT_DIR:-/tmp/precis-bench-gpt2}
mkdir -p "$OUT_DIR"

# The value of key $1 in the bench's last line ("result: key=value ...").
field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"; }

table="| precision | step | tokens/s | ms/step | MFU | peak GiB |
|---|---|---|---|---|---|"
summary=""
failed=0
for precision in bf16 bf16-pure fp16 tf32 fp32; do
  summary+="$precision"
  for mode in eager graphs; do
    log="$OUT_DIR/$precision-$mode.log"
    graphs=()
    [ "$mode" = graphs ] && graphs=(--cuda-graphs)
    "$BUILD/precis" bench gpt2 --preset gpt2 --batch 16 --seq 1024 --precision "$precision" --steps 20 --warmup 5 \
      --device cuda --out "$OUT_DIR/$precision-$mode" "${graphs[@]}" "$@" >"$log" 2>&1
    result=$(grep '^result: ' "$log" | tail -1)
    if [ -z "$result" ]; then
      echo "$precision ($mode) failed:"; tail -5 "$log"
      summary+=" $mode failed"
      failed=1
      continue
    fi
    tokens=$(field tokens_per_s "$result")
    mfu=$(field mfu "$result")
    mfu_text=$(awk -v m="$mfu" 'BEGIN { if (m == "n/a") print "n/a"; else printf "%.1f%%", 100 * m }')
    table+=$'\n'"| $precision | $mode | $tokens | $(printf %.1f "$(field ms_per_step "$result")") | $mfu_text | $(printf %.2f "$(field peak_gib "$result")") |"
    summary+=" $mode $(awk -v t="$tokens" 'BEGIN { printf "%.0fK", t / 1000 }')"
  done
  summary+="; "
done
echo "$table"
echo "tok/s: ${summary%; }"
exit $failed
