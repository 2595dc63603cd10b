#!/usr/bin/env bash
# Issue 18's ResNet table, Precis and PyTorch in one call, on synthetic images (`precis bench
# resnet` and scripts/torch_resnet_reference.py with the same settings: SGD lr 0.1, momentum 0.9,
# weight decay 5e-4, cudnn.benchmark, autocast for fp16/bf16). By default:
#   ResNet-18, CIFAR stem, 32x32, B=256: fp32, tf32, fp16 and bf16 x NCHW and channels-last,
#     Precis replayed from a CUDA graph (and bf16 channels-last eager too), PyTorch eager;
#     torch.compile bf16 channels-last, default mode and reduce-overhead (CUDA graphs, as ours;
#     where the host launches slowly the default mode is launch-bound, bench/NOTES.md);
#   ResNet-50, 224x224, B=128, bf16 channels-last: Precis graphs and eager, PyTorch eager and
#     torch.compile (both modes);
# then the bars' ratios (Precis bf16 channels-last graphs / torch.compile's best mode, same call). About
# 7-8 minutes on an H100 (most of it the processes' start, cuDNN's algorithm timing and
# torch.compile). 20 measured steps after 5 warm-up steps each. Each run's full output is in
# $OUT_DIR/<model>-<precision>-<layout>-<mode>.log (torch-... for PyTorch's).
# RUNS="model:image:batch:precision:layout:eager|graphs ..." runs only those Precis rows;
# TORCH_RUNS="model:image:batch:precision:layout:eager|compile ..." only those PyTorch rows
# (TORCH_RUNS= , set and empty: none). Each Precis run is stopped after RUN_TIMEOUT_S (240) seconds,
# and one whose steps went non-finite (skipped, norm inf) counts as failed, not as a row.
# Each row says the mean SM clock of GPU 0 over the run's busy samples (scripts/clock-sampler.sh;
# the samples stay beside its log as .clocks.csv): a step slows as the clocks fall.
# Usage: bash bench/run-resnet-bench.sh BUILD_DIR [more bench options]
set -uo pipefail
BUILD=${1:-build-gpu}
shift || true
OUT_DIR=${OUT_DIR:-/tmp/precis-bench-resnet}
mkdir -p "$OUT_DIR"
: >"$OUT_DIR/rows.md"

source "$(dirname "$0")/../scripts/clock-sampler.sh"
# The mean SM clock of GPU 0 over the busy samples of CSV $1, or nothing.
sm_clock() { python3 "$(dirname "$0")/../scripts/clock_samples.py" "$1" 0 | sed -nE 's/.* SM ([0-9]+) MHz.*/\1/p'; }

# The value of key $1 in the bench's last line ("result: key=value ...").
field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"; }

table="| model | image | batch | precision | layout | step | images/s | ms/step | peak GiB | peak from start GiB | SM MHz |
|---|---|---|---|---|---|---|---|---|---|---|"
failed=0
run() {  # model image batch precision layout mode
  local flags=()
  [ "$5" = channels-last ] && flags+=(--channels-last)
  [ "$6" = graphs ] && flags+=(--cuda-graphs)
  local log="$OUT_DIR/$1-$4-$5-$6.log"
  start_clock_sampler "${log%.log}.clocks.csv"
  # A hung run (a replayed graph that never ends) costs its own RUN_TIMEOUT_S, not the call.
  timeout "${RUN_TIMEOUT_S:-240}" "$BUILD/precis" bench resnet --model "$1" --image "$2" --batch "$3" --precision "$4" --steps 20 --warmup 5 \
    --device cuda --out "$OUT_DIR/$1-$4-$5-$6" "${flags[@]}" "${EXTRA[@]}" >"$log" 2>&1
  stop_clock_sampler
  local result
  result=$(grep '^result: ' "$log" | tail -1)
  if [ -z "$result" ]; then
    echo "$1 $4 $5 $6 failed:"; tail -5 "$log"
    failed=1
    return
  fi
  # A step that went non-finite was skipped, and a skipped step is fast: such a row is void.
  if grep -qE 'skipped [0-9]+ \(inf/NaN\)|norm +(inf|nan)' "$log"; then
    echo "$1 $4 $5 $6 VOID: its steps went non-finite (skipped or norm inf/nan in $log): not a result"
    failed=1
    return
  fi
  # The peak over the measured steps, as PyTorch's script reads its own (max_memory_allocated
  # after a reset at the end of the warm-up), and the run's peak from its start.
  local peak
  peak=$(field measured_peak_gib "$result")
  table+=$'\n'"| $1 | $2 | $3 | $4 | $5 | $6 | $(field images_per_s "$result") | $(printf %.2f "$(field ms_per_step "$result")") | $(printf %.3f "${peak:-$(field peak_gib "$result")}") | $(printf %.3f "$(field peak_gib "$result")") | $(sm_clock "${log%.log}.clocks.csv") |"
  echo "${table##*$'\n'}" >>"$OUT_DIR/rows.md"  # each row as it comes (a run cut short keeps them)
}
# PyTorch with the same settings: model image batch precision layout and eager, compile (the
# default mode), compile-reduce-overhead or compile-max-autotune. Compiled runs time 50 steps
# after 10 (their first calls compile, record graphs and autotune).
torch_run() {
  local flags=()
  [ "$5" = channels-last ] && flags+=(--channels-last)
  case $6 in
    compile) flags+=(--compile --steps 50 --warmup 10) ;;
    compile-*) flags+=(--compile --compile-mode "${6#compile-}" --steps 50 --warmup 10) ;;
  esac
  local log="$OUT_DIR/torch-$1-$4-$5-$6.log"
  start_clock_sampler "${log%.log}.clocks.csv"
  python3 "$(dirname "$0")/../scripts/torch_resnet_reference.py" --model "$1" --image "$2" --batch "$3" \
    --precision "$4" "${flags[@]}" >"$log" 2>&1
  stop_clock_sampler
  local result
  result=$(grep '^result: ' "$log" | tail -1)
  if [ -z "$result" ]; then
    echo "torch $1 $4 $5 $6 failed:"; tail -5 "$log"
    return
  fi
  local start_peak
  start_peak=$(field start_peak_gib "$result")
  table+=$'\n'"| torch $1 | $2 | $3 | $4 | $5 | $6 | $(field images_per_s "$result") | $(printf %.2f "$(field ms_per_step "$result")") | $(printf %.3f "$(field peak_gib "$result")") | ${start_peak:-} | $(sm_clock "${log%.log}.clocks.csv") |"
  echo "${table##*$'\n'}" >>"$OUT_DIR/rows.md"
}
EXTRA=("$@")
R18=resnet18:32:256 R50=resnet50:224:128
default_runs=""
for precision in fp32 tf32 fp16 bf16; do
  for layout in nchw channels-last; do default_runs+=" $R18:$precision:$layout:graphs"; done
done
default_runs+=" $R18:bf16:channels-last:eager $R50:bf16:channels-last:graphs $R50:bf16:channels-last:eager"
default_torch_runs=""
for precision in fp32 tf32 fp16 bf16; do
  for layout in nchw channels-last; do default_torch_runs+=" $R18:$precision:$layout:eager"; done
done
default_torch_runs+=" $R18:bf16:channels-last:compile $R18:bf16:channels-last:compile-reduce-overhead"
default_torch_runs+=" $R50:bf16:channels-last:eager $R50:bf16:channels-last:compile $R50:bf16:channels-last:compile-reduce-overhead"
for r in ${RUNS:-$default_runs}; do IFS=: read -r m i b p l mode <<<"$r"; run "$m" "$i" "$b" "$p" "$l" "$mode"; done
for r in ${TORCH_RUNS-$default_torch_runs}; do IFS=: read -r m i b p l mode <<<"$r"; torch_run "$m" "$i" "$b" "$p" "$l" "$mode"; done
echo "$table"
# The bars: Precis bf16 channels-last with graphs over torch.compile's best mode, per model.
images_per_s() {  # row prefix ("| resnet18 |" or "| torch resnet18 |"), mode (a regex): the best
  awk -F'|' -v who="$1" -v mode="$2" '$2 == " " who " " && $5 == " bf16 " && $6 == " channels-last " &&
    $7 ~ "^ " mode " $" && $8 + 0 > best { best = $8 + 0 } END { if (best) print best }' <<<"$table"
}
# The memory bar: the peak of Precis bf16 channels-last with graphs against PyTorch eager's, per
# model, over the measured steps and from the runs' start. Precis's peaks count the memory its
# captured graph keeps (every replay writes it); torch.compile reduce-overhead's
# max_memory_allocated leaves its graph pool out, so eager's is PyTorch's reading to compare with.
peak_gib() {  # row prefix, mode, column (10: over the measured steps, 11: from the start)
  awk -F'|' -v who="$1" -v mode="$2" -v column="$3" '$2 == " " who " " && $5 == " bf16 " &&
    $6 == " channels-last " && $7 == " " mode " " { if ($column ~ /[0-9]/) print $column + 0; exit }' <<<"$table"
}
at_most() { awk -v a="$1" -v b="$2" 'BEGIN { print (a <= b) ? "at most PyTorch'"'"'s" : "over PyTorch'"'"'s" }'; }
for model in resnet18 resnet50; do
  ours=$(images_per_s "$model" graphs) theirs=$(images_per_s "torch $model" "compile(-[a-z-]+)?")
  if [ -n "$ours" ] && [ -n "$theirs" ]; then
    echo "$model bf16 channels-last: Precis graphs / torch.compile (its best mode) = $(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.3f", a / b }')x"
  fi
  for reading in "10:over the measured steps" "11:from the start"; do
    ours=$(peak_gib "$model" graphs "${reading%%:*}") theirs=$(peak_gib "torch $model" eager "${reading%%:*}")
    if [ -n "$ours" ] && [ -n "$theirs" ]; then
      echo "$model bf16 channels-last: peak ${reading#*:}, Precis graphs $ours GiB, PyTorch eager $theirs GiB ($(at_most "$ours" "$theirs"))"
    fi
  done
done
