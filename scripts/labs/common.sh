# shellcheck shell=bash disable=SC2034  # sourced: DEVICE and the rest are for the lab scripts
# Shared by the labs (docs/labs/): the precis binary, the size, the output folder, and
# reading one number out of a JSON line. Sourced, not run.
#   PRECIS    the binary (default: build/precis of this checkout)
#   LAB_SIZE  tiny (the test's: seconds), cpu (the CPU output in docs/labs), h100
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PRECIS=${PRECIS:-$ROOT/build/precis}
LAB_SIZE=${LAB_SIZE:-cpu}
case $LAB_SIZE in
  tiny | cpu) DEVICE=cpu ;;
  h100) DEVICE=cuda ;;
  *)
    echo "LAB_SIZE is tiny, cpu or h100, not '$LAB_SIZE'" >&2
    exit 2
    ;;
esac
[[ -x $PRECIS ]] || {
  echo "no precis binary at $PRECIS (build it, or set PRECIS)" >&2
  exit 1
}
OUT=${1:?usage: bash $0 OUT_DIR   (LAB_SIZE=tiny|cpu|h100, default cpu)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"  # the configs name assets/ relative to the checkout

# json_number KEY < LINE: the number after "KEY": in a flat JSON line (empty when absent).
json_number() { sed -n "s/.*\"$1\":\([-0-9.eE+]*\).*/\1/p"; }
