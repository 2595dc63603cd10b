// Test-only kernels: probes of the wgmma building blocks of the sm_90a flash attention
// (ops/cuda/flash_wgmma.cuh), built into tests/ops/test_flash_wgmma_gpu.cpp's executable
// only (tests/CMakeLists.txt), in the sm_90a pass as the kernels they probe.
#pragma once

#include "core/tensor.h"

namespace precis::ops::cuda {

// Probes of the two wgmma products of the forward, for tests (tests/ops/flash_wgmma_probe.cu);
// one warpgroup, inputs contiguous on the GPU, a and b f16 or bf16, out f32 contiguous:
//   scores: out [64, N] = a [64, D] b [N, D]^T, a and b through shared memory as the
//           forward's Q and K tiles (both K-major); N 64 or 128, D 64 or 128.
//   values: out [64, D] = p [64, N] b [N, D], p f32 laid out in registers as score
//           accumulators and rounded to b's dtype there (as P), b through shared memory
//           as the forward's V tile (MN-major); N 64 or 128, D 64 or 128.
// And of the backward's dQ product:
//   transposed: out [64, 64] = a [128, 64]^T b [128, 64], a f32 laid out in registers as
//           accumulators (two 64-row halves), rounded to b's dtype and stored to shared
//           memory as the backward's dS^T tile, read transposed (MN-major A); b through
//           shared memory as its K tile (MN-major B), out's two 32-column halves in two
//           products as its two warpgroups take them.
// All require sm90a_code_loaded(b.device()).
void wgmma_probe_scores(const Tensor& a, const Tensor& b, const Tensor& out);
void wgmma_probe_values(const Tensor& p, const Tensor& b, const Tensor& out);
void wgmma_probe_transposed(const Tensor& a, const Tensor& b, const Tensor& out);

}  // namespace precis::ops::cuda
