#!/usr/bin/env bash
# Installs the Debian packages Precis builds with, only those that are missing.
# Idempotent; runs as root without sudo (or with sudo when not root).
set -euo pipefail

# clang and libclang-rt-dev: the libFuzzer targets (scripts/fuzz.sh). libopenblas-openmp-dev: the
# CPU products (optional to the build, cmake/PrecisBlas.cmake; its OpenMP build shares OpenMP's threads).
packages=(cmake make g++ ccache pkg-config clang-format libeigen3-dev libyaml-cpp-dev libgtest-dev libgmock-dev
          libopenmpi-dev openmpi-bin python3 clang libclang-rt-dev libopenblas-openmp-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all build packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
