#!/usr/bin/env bash
# Fails, naming the files, when a tracked C++/CUDA source differs from clang-format's
# layout (.clang-format). `make format` rewrites them. CI runs this before the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format is not installed (make setup)" >&2; exit 1; }
bad=()
while IFS= read -r f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} file(s) differ from clang-format's layout; run 'make format':" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-format: $(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | wc -l) files formatted"
