#!/usr/bin/env bash
# A/B timing on a GPU machine in one call: one build of this tree (sm_90, Release), a few
# GPU test binaries, then `precis bench gpt2` for each variant in alternating rounds (so a
# drift of the card's clocks hits every variant alike), optional traced steps and the whole
# gpu-labelled suite. Variants are environment settings of the same binary: a permanent
# switch (PRECIS_PDL=0) or a temporary one added for the comparison and removed after.
# Everything it writes lands in one archive, $OUT/ab.tgz (traces in $OUT/traces.tgz), so that
# every log comes back from the device tool.
#
# Usage (all settings are environment variables):
#   VARIANTS="new:X=1 old:PRECIS_PDL=0"   name:VAR=value[,VAR=value] each (X=1: no setting)
#   PRECS="bf16-pure bf16"                 precisions benched with --cuda-graphs (default bf16-pure)
#   SETTINGS="precision.grad_dtype=bfloat16"  config settings added to every bench run
#   SETTINGS_bf16_pure="..."               settings added to one precision's runs only (its name with
#                                          '-' as '_'): bf16 gradients are refused for bf16's f32 parameters
#   ROUNDS="1 2"                           rounds of all variants (default "1 2")
#   EAGER_VARIANTS="new:X=1"               variants also benched eagerly (bf16-pure)
#   TRACE_VARIANTS="new:X=1"               variants of which one bf16-pure step is traced
#   FOCUS_TESTS="ops_test_nn_kernels_gpu"  test binaries built first and run (GTEST_ARGS passed)
#   TEST_REGEX="AddLayerNormGpu" TEST_VARIANTS="new:X=1 old:PRECIS_AB_OLD=1"
#                                          then `ctest -R TEST_REGEX` under each variant's settings
#   FULL_BUILD=1 CTEST=1                   build everything, then run `ctest -L gpu` last
#   RUN_TIMEOUT_S=240                      each bench run's limit (a hung run costs only that); a run
#                                          whose steps went non-finite is flagged VOID
#   BASE_TREE=.base                        also build another tree (e.g. `git archive REV` unpacked into
#                                          a git-ignored, carried folder) into build-base; a variant with
#                                          the setting BIN=base runs its binary: "new:X=1 old:BIN=base"
#   bash scripts/gpu-ab.sh
set -u
cd "$(dirname "$0")/.." || exit 1
O=$(mktemp -d /tmp/precis-ab.XXXX)
OUT=${OUT:-/tmp/precis-ab-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$O/gpu.txt"
T0=$SECONDS
bash scripts/gpu-configure.sh build-ab >"$O/configure.log" 2>&1 ||
  tail -20 "$O/configure.log"
cmake --build build-ab -j16 --target precis_cli ${FOCUS_TESTS:-} >"$O/build.log" 2>&1
echo "build rc=$? at $((SECONDS - T0))s"
grep -E "error" "$O/build.log" | head -20
for t in ${FOCUS_TESTS:-}; do
  ./build-ab/tests/$t ${GTEST_ARGS:-} >"$O/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|  SKIPPED) ' "$O/$t.log" | head -4 | tr '\n' ' ')"
done
# The focus tests' ctest cases again under each variant's settings (a kernel behind a switch
# is tested before it is timed).
if [ -n "${TEST_REGEX:-}" ]; then
  for v in ${TEST_VARIANTS:-base:X=1}; do
    IFS=',' read -ra settings <<<"${v#*:}"
    (cd build-ab && env "${settings[@]}" ctest -R "$TEST_REGEX" -j4 --output-on-failure >"$O/tests-${v%%:*}.log" 2>&1)
    echo "tests ${v%%:*}: $(grep -E 'tests passed|tests failed' "$O/tests-${v%%:*}.log" | tail -1)"
    grep -E "\(Failed\)|\*\*\*Timeout" "$O/tests-${v%%:*}.log" | head -5
  done
fi
if [ -n "${BASE_TREE:-}" ]; then
  bash scripts/gpu-configure.sh build-base "$BASE_TREE" >"$O/configure-base.log" 2>&1 || tail -20 "$O/configure-base.log"
  cmake --build build-base -j16 --target precis_cli >"$O/build-base.log" 2>&1
  echo "base build rc=$? at $((SECONDS - T0))s"
fi
if [ -n "${FULL_BUILD:-}" ]; then
  cmake --build build-ab -j16 >>"$O/build.log" 2>&1
  echo "full build rc=$? at $((SECONDS - T0))s"
fi

# The settings of one precision (SETTINGS_<precision, '-' as '_'>), or nothing.
precision_settings() {
  local variable="SETTINGS_${1//-/_}"
  echo "${!variable:-}"
}

# One bench run: name, settings, precision, extra options; prints the result's key figures.
run_variant() {
  local name=$1 precision=$3 log settings bin=./build-ab/precis
  IFS=',' read -ra settings <<<"$2"
  shift 3
  if [[ " ${settings[*]} " == *" BIN=base "* ]]; then bin=./build-base/precis; fi
  log="$O/bench-$name-$precision-$ROUND.log"
  # A hung run (a replayed graph that never ends) costs its own RUN_TIMEOUT_S, not the call.
  timeout "${RUN_TIMEOUT_S:-240}" env "${settings[@]}" "$bin" bench gpt2 --preset gpt2 --batch 16 --seq 1024 \
    --precision "$precision" --steps 20 --warmup 5 --device cuda --out "$O/run-$name" "$@" ${SETTINGS:-} \
    $(precision_settings "$precision") >"$log" 2>&1
  echo "$ROUND $name $precision: $(grep '^result:' "$log" | tail -1 | tr ' ' '\n' |
    grep -E 'tokens_per_s|ms_per_step|graph_ms|forward_ms|backward_ms' | tr '\n' ' ')$(
    tail -1 "$O/run-$name/metrics.jsonl" 2>/dev/null | grep -oE '"loss":[0-9.e+-]+')"
  # A step that went non-finite was skipped, and a skipped step is fast: such a figure is void.
  if grep -qE 'skipped [0-9]+ \(inf/NaN\)|norm +(inf|nan)' "$log"; then
    echo "  VOID: $name's steps went non-finite (skipped or norm inf/nan in $(basename "$log")): not a result"
  fi
}
for ROUND in ${ROUNDS:-1 2}; do
  for precision in ${PRECS:-bf16-pure}; do
    for v in ${VARIANTS:-base:X=1}; do run_variant "${v%%:*}" "${v#*:}" "$precision" --cuda-graphs; done
  done
done
for v in ${EAGER_VARIANTS:-}; do ROUND=eager run_variant "${v%%:*}" "${v#*:}" bf16-pure; done
for v in ${TRACE_VARIANTS:-}; do
  name=${v%%:*}
  IFS=',' read -ra settings <<<"${v#*:}"
  env "${settings[@]}" ./build-ab/precis bench gpt2 --precision bf16-pure --steps 3 --warmup 3 \
    --device cuda --trace "$O/trace-$name.json" --out "$O/trace-run-$name" ${SETTINGS:-} \
    $(precision_settings bf16-pure) >"$O/trace-$name.log" 2>&1
  echo "trace $name: $(grep -E 'kernel launches' "$O/trace-$name.log")"
done
if [ -n "${CTEST:-}" ]; then
  (cd build-ab && timeout "${CTEST_LIMIT:-240}" ctest -L gpu -j4 --output-on-failure >"$O/ctest.log" 2>&1
    echo "ctest rc=$?"
    grep -E "tests passed|tests failed|\(Failed\)|\*\*\*Timeout" "$O/ctest.log" | head -20)
fi
echo "total $((SECONDS - T0))s"
(cd "$O" && tar czf "$OUT/ab.tgz" --exclude='*.json' --exclude='run-*' --exclude='trace-run-*' . &&
  { ls ./*.json >/dev/null 2>&1 && tar czf "$OUT/traces.tgz" ./*.json || true; })
