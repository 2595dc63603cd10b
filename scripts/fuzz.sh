#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs each for FUZZ_SECONDS (default 30) from its seeds:
# tests/fuzz/corpus/<target> (and the shipped configs for the config reader) plus
# tests/fuzz/repro/<target>, the inputs of fixed crashes, replayed every time. A crash, a
# hang (-timeout), running out of memory or a sanitizer report fails the script; the input
# is left in $FUZZ_BUILD_DIR/artifacts/ (fix the bug, then add it to tests/fuzz/repro/<target>/).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-30}
build=${FUZZ_BUILD_DIR:-build-fuzz}
targets=(config safetensors token_file char_tokenizer gpt2_tokenizer)

cmake -S tests/fuzz -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)"
mkdir -p "$build/artifacts"

failed=()
for target in "${targets[@]}"; do
  corpus="$build/corpus/$target"  # what the run learns; the first corpus is the one written to
  mkdir -p "$corpus"
  seeds=("tests/fuzz/corpus/$target")
  [ -d "tests/fuzz/repro/$target" ] && seeds+=("tests/fuzz/repro/$target")
  [ "$target" = config ] && seeds+=(examples/configs)
  log="$build/$target.log"
  echo "fuzz: $target for ${seconds}s"
  if ! OMP_NUM_THREADS=1 "$build/fuzz_$target" "$corpus" "${seeds[@]}" -max_total_time="$seconds" -max_len=4096 \
      -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$build/artifacts/$target-" >"$log" 2>&1; then
    tail -n 60 "$log"
    failed+=("$target")
  else
    grep -E "^Done [0-9]+ runs" "$log" || true
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $build/artifacts/)" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets clean"
