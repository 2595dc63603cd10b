// The Hopper forward of flash attention (ops/cuda/flash_attention_forward_sm90.cu):
// warpgroup tensor-core products (wgmma, sm_90a code) for f16/bf16 with head size 64 or
// 128. flash_attention_forward (ops/cuda/flash_attention_forward.cu) runs it where
// flash_attention_forward_sm90_supported says so; its results are the mma.sync kernel's
// (same O, lse and masking), so the backward is the same for both.
#pragma once

#include "core/tensor.h"

namespace precis::ops::cuda {

// Whether `device` is a compute-capability 9.0 GPU for which the driver loaded this
// build's sm_90a code (not its sm_90 or sm_80 code, or PTX compiled at load time).
bool sm90a_code_loaded(Device device);

// Whether the sm_90a forward serves q: a compute-capability 9.0 device for which the
// driver loaded this build's sm_90a code, f16 or bf16, a head size it has a kernel for.
bool flash_attention_forward_sm90_supported(const Tensor& q);

// The contract of flash_attention_forward (ops/cuda/flash_attention.h); requires
// flash_attention_forward_sm90_supported(q).
void flash_attention_forward_sm90(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                  const Tensor& out, const Tensor& lse);

// Probes of the two wgmma products of the forward, for tests (ops/cuda/flash_wgmma_probe.cu);
// one warpgroup, inputs contiguous on the GPU, a and b f16 or bf16, out f32 contiguous:
//   scores: out [64, N] = a [64, D] b [N, D]^T, a and b through shared memory as the
//           forward's Q and K tiles (both K-major); N 64 or 128, D 64 or 128.
//   values: out [64, D] = p [64, N] b [N, D], p f32 laid out in registers as score
//           accumulators and rounded to b's dtype there (as P), b through shared memory
//           as the forward's V tile (MN-major); N 64 or 128, D 64 or 128.
// Both require sm90a_code_loaded(b.device()).
void wgmma_probe_scores(const Tensor& a, const Tensor& b, const Tensor& out);
void wgmma_probe_values(const Tensor& p, const Tensor& b, const Tensor& out);

}  // namespace precis::ops::cuda
