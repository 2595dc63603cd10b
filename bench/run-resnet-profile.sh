#!/usr/bin/env bash
# Where Precis's ResNet step loses to torch.compile's, kernel category by kernel category, in
# one GPU call (issue 18; bench/NOTES.md, "ResNet-18 step"). Per model:
#   1. precis bench resnet ... --cuda-graphs: the step as the bench measures it (replayed graph);
#   2. precis bench resnet ... --profile: the same step profiled without graphs (a replayed graph
#      has no ops to time); its kernels, each with its GPU time, in profile.tsv;
#   3. scripts/torch_resnet_profile.py --compile --compile-mode reduce-overhead: PyTorch's step
#      replayed from its graphs, timed, then its kernels under torch.profiler (if they sum to
#      under half its step, the profiler missed the graphs' kernels: rerun in the default mode,
#      whose kernels are the same, launched one by one);
# and last, the kernels of both grouped into the same categories (scripts/kernel_categories.py),
# as shares of each side's replayed step. ResNet-18: CIFAR stem, 32x32, B=256, bf16,
# channels-last; with --resnet50 also ResNet-50, 224x224, B=128. Estimated (not yet run on a GPU): 2.5 minutes on an H100
# for ResNet-18 (most of it torch.compile), 5 with ResNet-50.
# Each log is kept under $OUT_DIR (default /tmp/precis-resnet-profile): precis-M-graphs.log,
# precis-M-profile.log (its profile.tsv in precis-M-profile/), torch-M.log, torch-M.tsv,
# torch-M-trace.json.gz (Perfetto), and summary.txt, the tables printed last.
# DEADLINE_S: seconds from the script's start by which it must be done; ResNet-50 is skipped,
# saying so, when fewer than 240 remain after ResNet-18 (whose table is printed, and kept, as
# soon as it is ready).
# DEVICE=cpu runs the same pipeline on the CPU at toy sizes (ResNet-18, 16x16, B=2, no graphs,
# PyTorch eager), to check the script where there is no GPU.
# Usage: bash bench/run-resnet-profile.sh BUILD_DIR [--resnet50]
set -uo pipefail
BUILD=${1:-build-gpu}
shift || true
RESNET50=false
for arg in "$@"; do
  case $arg in
    --resnet50) RESNET50=true ;;
    *) echo "usage: bash bench/run-resnet-profile.sh BUILD_DIR [--resnet50]" >&2; exit 2 ;;
  esac
done
DEVICE=${DEVICE:-cuda}
OUT_DIR=${OUT_DIR:-/tmp/precis-resnet-profile}
SCRIPTS=$(cd "$(dirname "$0")/../scripts" && pwd)
mkdir -p "$OUT_DIR"
: >"$OUT_DIR/summary.txt"

# The value of key $1 in a "result: key=value ..." line $2.
field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p"; }
result_of() { grep '^result: ' "$1" | tail -1; }

failed=0
profile_model() {  # model image batch
  local m=$1 image=$2 batch=$3
  local common=(--model "$m" --image "$image" --batch "$batch" --precision bf16 --channels-last)
  local graphs=(--cuda-graphs) torch_mode=(--compile --compile-mode reduce-overhead --warmup 10 --steps 50)
  local torch_label="torch.compile reduce-overhead" precis_label="replayed from a graph"
  if [ "$DEVICE" = cpu ]; then
    image=16 batch=2
    common=(--model "$m" --image "$image" --batch "$batch" --precision bf16 --channels-last)
    graphs=() torch_mode=(--warmup 1 --steps 2) torch_label="torch eager" precis_label="unprofiled"
  fi

  echo "== $m: Precis, the step $precis_label"
  local log="$OUT_DIR/precis-$m-graphs.log"
  "$BUILD/precis" bench resnet "${common[@]}" --steps 20 --warmup 5 --device "$DEVICE" --out "$OUT_DIR/precis-$m-graphs" \
    "${graphs[@]}" >"$log" 2>&1
  local precis_step
  precis_step=$(field ms_per_step "$(result_of "$log")")
  [ -n "$precis_step" ] || { echo "failed:"; tail -5 "$log"; failed=1; }

  echo "== $m: Precis, profiled (no graphs)"
  log="$OUT_DIR/precis-$m-profile.log"
  "$BUILD/precis" bench resnet "${common[@]}" --steps 5 --warmup 5 --device "$DEVICE" \
    --out "$OUT_DIR/precis-$m-profile" --profile >"$log" 2>&1
  [ -s "$OUT_DIR/precis-$m-profile/profile.tsv" ] || { echo "failed:"; tail -5 "$log"; failed=1; }

  echo "== $m: PyTorch ($torch_label), timed and profiled"
  log="$OUT_DIR/torch-$m.log"
  python3 "$SCRIPTS/torch_resnet_profile.py" "${common[@]}" "${torch_mode[@]}" --device "$DEVICE" --profile-steps 5 \
    --tsv "$OUT_DIR/torch-$m.tsv" --trace "$OUT_DIR/torch-$m-trace.json.gz" >"$log" 2>&1
  local torch_result
  torch_result=$(result_of "$log")
  if [ "$DEVICE" = cuda ] && [ -n "$torch_result" ] &&
    awk -v k="$(field kernels_ms "$torch_result")" -v s="$(field ms_per_step "$torch_result")" 'BEGIN { exit !(k < 0.5 * s) }'; then
    echo "   its kernels sum to $(field kernels_ms "$torch_result") of $(field ms_per_step "$torch_result") ms: profiling the default mode instead"
    mv "$log" "$OUT_DIR/torch-$m-reduce-overhead.log"
    python3 "$SCRIPTS/torch_resnet_profile.py" "${common[@]}" --compile --compile-mode default --warmup 10 --steps 20 \
      --device "$DEVICE" --profile-steps 5 --tsv "$OUT_DIR/torch-$m.tsv" --trace "$OUT_DIR/torch-$m-trace.json.gz" >"$log" 2>&1
    torch_label="torch.compile default (its kernels; step: reduce-overhead's)"
    # The shares stay of the replayed step, measured in the first run.
    sed -i "s/^step\t-\t-\t1\t.*/step\t-\t-\t1\t$(field ms_per_step "$torch_result")/" "$OUT_DIR/torch-$m.tsv"
  fi
  [ -s "$OUT_DIR/torch-$m.tsv" ] || { echo "failed:"; tail -5 "$log"; failed=1; return; }
  [ -n "$precis_step" ] && [ -s "$OUT_DIR/precis-$m-profile/profile.tsv" ] || return

  {
    echo
    echo "==== $m, $image x $image, B=$batch, bf16 channels-last on $DEVICE: ms per step by category ===="
    echo "Precis: kernels of the profiled step (no graphs), shares of the ${precis_step} ms step $precis_label"
    echo "PyTorch: $torch_label"
    python3 "$SCRIPTS/kernel_categories.py" "$OUT_DIR/precis-$m-profile/profile.tsv" "$OUT_DIR/torch-$m.tsv" \
      --labels Precis,PyTorch --step-ms "$precis_step,"
  } | tee -a "$OUT_DIR/summary.txt"
}

profile_model resnet18 32 256
if [ "$RESNET50" = true ]; then
  if [ -n "${DEADLINE_S:-}" ] && [ $((DEADLINE_S - SECONDS)) -lt 240 ]; then
    echo "resnet50 skipped: $((DEADLINE_S - SECONDS)) s left of DEADLINE_S=$DEADLINE_S, and it needs about 4 minutes"
  else
    profile_model resnet50 224 128
  fi
fi
for m in resnet18 resnet50; do
  [ -f "$OUT_DIR/precis-$m-profile.log" ] || continue
  echo
  echo "==== $m: Precis's kernels per step (from its profile; the step there is unreplayed) ===="
  sed -n '/^==== kernels per step/,/^==== kernels by op/p' "$OUT_DIR/precis-$m-profile.log" | sed '$d'
  echo "==== $m: PyTorch's kernels per step ===="
  sed -n '/per step (mean of/,/^==== by category/p' "$OUT_DIR/torch-$m.log" | sed '1d;$d'
done
cat "$OUT_DIR/summary.txt"
exit $failed
