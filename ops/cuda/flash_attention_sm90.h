// The Hopper forward and backward of flash attention (ops/cuda/flash_attention_*_sm90.cu):
// warpgroup tensor-core products (wgmma, sm_90a code) for f16/bf16 with head size 64 or
// 128. flash_attention_forward (ops/cuda/flash_attention_forward.cu) runs it where
// flash_attention_forward_sm90_supported says so; its results are the mma.sync kernel's
// (same O, lse and masking), so the backward is the same for both.
#pragma once

#include "core/tensor.h"
#include "ops/cuda/flash_attention.h"

namespace precis::ops::cuda {

// Whether `device` is a compute-capability 9.0 GPU for which the driver loaded this
// build's sm_90a code (not its sm_90 or sm_80 code, or PTX compiled at load time).
bool sm90a_code_loaded(Device device);

// Whether the sm_90a forward serves q: a compute-capability 9.0 device for which the
// driver loaded this build's sm_90a code, f16 or bf16, a head size it has a kernel for.
bool flash_attention_forward_sm90_supported(const Tensor& q);

// The contract of flash_attention_forward (ops/cuda/flash_attention.h); requires
// flash_attention_forward_sm90_supported(q). Runs the tensor-copy kernel where
// flash_forward_sm90_tensor_copy() and it can, else the cp.async kernel.
void flash_attention_forward_sm90(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                  const Tensor& out, const Tensor& lse);

// The same forward with the K and V tiles brought by the copy engine into a ring of stages
// (ops/cuda/flash_attention_forward_sm90_tma.cu): the same bits of out and lse. Returns false,
// having launched nothing, where the copy engine cannot describe q, k or v (an address or
// stride that is not a multiple of 16 bytes), k has no keys, or the device does not give a
// block the kernel's shared memory; requires
// flash_attention_forward_sm90_supported(q).
bool flash_attention_forward_sm90_tensor_copy(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                              double scale, const Tensor& out, const Tensor& lse);

// Whether flash_attention_forward_sm90 tries the tensor-copy kernel first: yes, unless
// PRECIS_AB_OLD_FLASH_FWD=1 (read once per process) or the setter said no. Temporary, for
// A/B runs and for the test that compares both kernels in one process.
bool flash_forward_sm90_tensor_copy();
void set_flash_forward_sm90_tensor_copy(bool on);

// Whether the sm_90a backward serves q: as the forward, head size 64 only.
bool flash_attention_backward_sm90_supported(const Tensor& q);

// The contract of flash_attention_backward (ops/cuda/flash_attention.h) with the sm_90a
// key-block kernel between its delta and dQ-rounding kernels; requires
// flash_attention_backward_sm90_supported(q). Defined in flash_attention_backward.cu.
void flash_attention_backward_sm90(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                   const Tensor& lse, const Tensor& dout, bool causal, double scale, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv, const FlashGradSums& grad_sums = {});

// The keys of one block of that key-block kernel.
inline constexpr int kSm90BackwardBlockKeys = 128;

// That key-block kernel (ops/cuda/flash_attention_backward_sm90.cu): dk, dv, and each key
// block's share of dQ added into dq_accum ([B H Tq, D] f32, zeroed), from delta ([B H Tq]
// f32, rowsum(dout * out)) and the forward's lse. With kv_partial defined (dense f32
// [B key_blocks, 2 H D], key_blocks = ceil(Tk / kSm90BackwardBlockKeys)), block (b, h, n)
// also writes the column sums of the dk and dv it wrote, as rounded, to
// kv_partial[b key_blocks + n, p H D + h D + d] (p = 0 dk, 1 dv): FlashGradSums' partial rows.
void flash_backward_key_blocks_sm90(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                    const Tensor& lse, const Tensor& delta, const Tensor& dq_accum, bool causal,
                                    double scale, const Tensor& dk, const Tensor& dv,
                                    const Tensor& kv_partial = Tensor());

}  // namespace precis::ops::cuda
