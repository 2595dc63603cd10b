#!/usr/bin/env bash
# Issue 20's CPU bar: the `make demo` model (examples/configs/shakespeare-char.yaml: char GPT,
# 4 layers, 4 heads, 128 wide, B=16 x T=64, AdamW with the gradient clipped at 1, fp32) trained
# by `precis bench gpt2` and by PyTorch eager (scripts/torch_cpu_reference.py, 2 threads), both
# pinned to the same cores with taskset, ROUNDS rounds taken alternately (Precis, then
# PyTorch) so that a load on the machine falls on both. Each run: STEPS measured steps after
# WARMUP warm-up steps. Prints a markdown table, one row per round, and the median ratio.
# BASELINE=OTHER_BUILD_DIR adds a run of that build's precis to each round (before and after
# a change, under the same load).
# Usage: bash bench/run-cpu-demo-bench.sh [BUILD_DIR] [more precis bench options]
#   env: CORES (0,1), ROUNDS (5), STEPS (30), WARMUP (5), PRECISION (fp32), PYTHON (python3),
#        BASELINE (none)
set -uo pipefail
BUILD=${1:-build}
shift || true
CORES=${CORES:-0,1}
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-5}
PRECISION=${PRECISION:-fp32}
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-/tmp/precis-cpu-demo-bench}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT_DIR"

# The value of key $1 in a "result: key=value ..." line.
field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"; }

# `precis bench gpt2` takes the demo's shape as settings over its `tiny` preset; the rest of the
# demo's training (AdamW, clipping at 1, no dropout) are the config's defaults.
demo_settings=(model.n_layer=4 model.n_head=4 model.n_embd=128 model.dropout=0 data.tokenizer=char
  optimizer.name=adamw optimizer.grad_clip=1.0)

echo "| round | Precis tokens/s | Precis ms/step | PyTorch tokens/s | PyTorch ms/step | Precis / PyTorch |"
echo "|---|---|---|---|---|---|"
BASELINE=${BASELINE:-}
ratios=()
failed=0
run_precis() {  # $1 build dir, $2 log
  local build=$1 log=$2
  shift 2
  taskset -c "$CORES" "$build/precis" bench gpt2 --preset tiny --batch 16 --seq 64 --precision "$PRECISION" \
    --device cpu --steps "$STEPS" --warmup "$WARMUP" --out "$OUT_DIR/run" "${demo_settings[@]}" "$@" >"$log" 2>&1
}
for round in $(seq 1 "$ROUNDS"); do
  plog="$OUT_DIR/precis-$round.log"
  tlog="$OUT_DIR/torch-$round.log"
  run_precis "$BUILD" "$plog" "$@"
  baseline_text=""
  if [ -n "$BASELINE" ]; then
    run_precis "$BASELINE" "$OUT_DIR/baseline-$round.log" "$@"
    baseline_text=" (baseline $(grep '^result: ' "$OUT_DIR/baseline-$round.log" | tail -1 | tr ' ' '\n' | sed -n 's/^tokens_per_s=//p') tokens/s)"
  fi
  taskset -c "$CORES" "$PYTHON" "$ROOT/scripts/torch_cpu_reference.py" --threads 2 --batch 16 --seq 64 \
    --steps "$STEPS" --warmup "$WARMUP" >"$tlog" 2>&1
  presult=$(grep '^result: ' "$plog" | tail -1)
  tresult=$(grep '^result: ' "$tlog" | tail -1)
  if [ -z "$presult" ] || [ -z "$tresult" ]; then
    echo "round $round failed:"; tail -3 "$plog" "$tlog"
    failed=1
    continue
  fi
  ptok=$(field tokens_per_s "$presult")
  ttok=$(field tokens_per_s "$tresult")
  ratio=$(awk -v p="$ptok" -v t="$ttok" 'BEGIN { printf "%.2f", p / t }')
  ratios+=("$ratio")
  printf "| %d | %s%s | %.1f | %s | %.1f | %sx |\n" "$round" "$ptok" "$baseline_text" "$(field ms_per_step "$presult")" \
    "$ttok" "$(field ms_per_step "$tresult")" "$ratio"
done
if [ ${#ratios[@]} -gt 0 ]; then
  median=$(printf "%s\n" "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  echo "median Precis / PyTorch eager tokens/s over ${#ratios[@]} rounds ($PRECISION, cores $CORES): ${median}x"
fi
exit $failed
