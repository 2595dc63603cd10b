#!/usr/bin/env bash
# One call on a GPU machine: configure, build (sm_90 only, -j16), run the
# gpu-labelled tests and the benchmarks, and print a short table last.
# Usage: bash scripts/gpu-check.sh [build-dir]   (BENCHES="bench/run-a.sh ..." runs only those benchmarks)
# To time variants of one build against each other, see scripts/gpu-ab.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${OUT:-/tmp/precis-gpu-check}
mkdir -p "$OUT"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
bash scripts/gpu-configure.sh "$BUILD" \
  >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
grep "precis:" "$OUT/configure.log"
cmake --build "$BUILD" -j16 >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -40; exit 1; }
echo "build: ok"

(cd "$BUILD" && ctest -L gpu --output-on-failure -j4) >"$OUT/gpu-tests.log" 2>&1
tests_rc=$?
tail -25 "$OUT/gpu-tests.log"

bench_rows=()
if [ -x "$BUILD/precis" ]; then
  "$BUILD/precis" device | tee "$OUT/device.txt"
fi
# Each benchmark's per-run logs go to $LOGS/<name>/; they come back as one archive.
LOGS=/tmp/precis-gpu-check-logs
rm -rf "$LOGS" && mkdir -p "$LOGS"
for b in ${BENCHES:-bench/run-*.sh}; do
  [ -f "$b" ] || continue
  name=$(basename "$b" .sh)
  row=$(OUT_DIR="$LOGS/$name" bash "$b" "$BUILD" 2>&1 | tee -a "$OUT/bench.log" | tail -1)
  bench_rows+=("$name: $row")
done
# One traced bf16 step: the time of every kernel (the top 15 printed, all in the JSON).
"$BUILD/precis" bench gpt2 --precision bf16 --steps 3 --warmup 3 --device cuda --trace "$LOGS/trace-bf16.json" \
  --out "$LOGS/trace-run" >"$LOGS/trace-bf16.log" 2>&1
sed -n '/kernel launches/,/other kernels/p' "$LOGS/trace-bf16.log" >>"$OUT/bench.log"
(cd "$LOGS" && find . -maxdepth 2 \( -name '*.log' -o -name '*.json' \) | tar czf "$OUT/bench-logs.tgz" -T -)

echo
echo "==== gpu-check summary ===="
printf "%-24s %s\n" "gpu" "$(head -1 "$OUT/gpu.txt")"
printf "%-24s %s\n" "gpu tests" "$(grep -E 'tests passed|tests failed' "$OUT/gpu-tests.log" | tail -1) (rc=$tests_rc)"
for r in "${bench_rows[@]}"; do printf "%-24s %s\n" "${r%%:*}" "${r#*: }"; done
exit $tests_rc
