#!/usr/bin/env bash
# Builds llm.c (karpathy/llm.c, the peer of bench/RESULTS.md's data-parallel and GPT-2 bars)
# with cuDNN attention, MPI and NCCL, from the snapshot in .peers/ (git-ignored, never
# committed: fetch karpathy/llm.c into .peers/llm.c and NVIDIA/cudnn-frontend's include/
# into .peers/cudnn-frontend/include). Builds in BUILD_DIR (default build-llmc/), so the
# snapshot stays as fetched. Prints the binary's path last.
#   scripts/llmc-build.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
src=.peers/llm.c
frontend=$PWD/.peers/cudnn-frontend/include
out=${1:-build-llmc}
[[ -f $src/train_gpt2.cu && -d $frontend ]] || {
  echo "llmc-build: $src or $frontend is missing; fetch karpathy/llm.c and NVIDIA/cudnn-frontend there" >&2
  exit 1
}
rm -rf "$out" && mkdir -p "$out" && cp -r "$src"/. "$out"/
ln -s "$(dirname "$frontend")" "$out"/cudnn-frontend  # where llm.c's Makefile looks for it
# CUDA 13 takes the preferred location of cudaMemAdvise as a cudaMemLocation, not a device id.
sed -i 's/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
  "$out"/llmc/cuda_utils.cuh
# Its Makefile looks for NCCL with dpkg; ours may come from elsewhere (CMake found it): say it is there.
sed -i 's/$(shell dpkg -l | grep -q nccl \&\& echo "exists")/exists/' "$out"/Makefile
# Newer cudnn-frontend headers compile some kernels at run time with NVRTC.
sed -i 's/^    NVCC_LDFLAGS += -lcudnn$/    NVCC_LDFLAGS += -lcudnn -lnvrtc/' "$out"/Makefile
grep -q -- "-lcudnn -lnvrtc" "$out"/Makefile || { echo "llmc-build: the -lnvrtc patch did not apply" >&2; exit 1; }
grep -q cudaMemLocationTypeHost "$out"/llmc/cuda_utils.cuh || { echo "llmc-build: the cudaMemAdvise patch did not apply" >&2; exit 1; }
make -C "$out" train_gpt2cu USE_CUDNN=1 CUDNN_FRONTEND_PATH="$frontend" GPU_COMPUTE_CAPABILITY=${GPU_COMPUTE_CAPABILITY:-90} \
  -j"$(nproc)" >"$out"/build.log 2>&1 || { tail -30 "$out"/build.log >&2; exit 1; }
echo "$out/train_gpt2cu"
