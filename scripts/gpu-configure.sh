#!/usr/bin/env bash
# Configures a GPU build folder (Release, sm_90 only) for the device scripts.
#   bash scripts/gpu-configure.sh BUILD_DIR [SOURCE_DIR]
# With Ninja where the machine has it: CMake's Makefiles build the targets named on one
# command line one after another (their top level is .NOTPARALLEL), so `--target precis_cli
# test_a test_b ...` linked the test binaries in series (a fresh H100 ran past 430 s on
# precis_cli and 8 of them, where the whole tree, built in parallel, took 290 s); Ninja builds
# them side by side. A folder already configured keeps its generator.
set -euo pipefail
build=$1
source=${2:-.}
generator=()
if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$source" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DPRECIS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
