// The Hopper GELU products (ops/cuda/gemm_gelu_sm90.cu): a persistent, warp-specialized
// sm_90a kernel for the two bf16 products of a GELU MLP whose epilogue carries the GELU,
// taken by linear and linear_gelu_input_backward (ops/cuda/matmul.cu) instead of
// cuBLASLt's GELU_AUX_BIAS and DGELU epilogues under ops::gemm_gelu_sm90() (ops/matmul.h,
// PRECIS_EXP_GEMM_GELU=1; an experiment, off by default) where the problem qualifies.
// Plain C++ declarations; every CUDA type stays in the .cu file.
#pragma once

#include "core/tensor.h"

namespace precis::ops::cuda {

// Whether the kernel serves out = gelu(x W^T + bias), pre = x W^T + bias: bf16 on a device
// for which the driver loaded the sm_90a code; x [M, K] and weight [N, K] row-major with unit
// column stride, out contiguous [M, N], pre [M, N] with unit column stride; bias [N]
// contiguous or undefined; M a multiple of 128, N of 128 (or of the block tile's columns,
// set_gemm_gelu_sm90_tile), K of 64; every base address and row stride a multiple of 16 bytes.
bool linear_gelu_sm90_supported(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                const Tensor& pre);
// Requires linear_gelu_sm90_supported.
void linear_gelu_sm90(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& pre);

// Whether the kernel serves grad_pre = (grad_out weight) * gelu'(pre): bf16 on such a device;
// grad_out [M, K] and weight [K, N] row-major with unit column stride, pre [M, N] with unit
// column stride, grad_pre contiguous [M, N]; the same multiples and alignments.
bool linear_gelu_input_backward_sm90_supported(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& weight,
                                               const Tensor& pre);
// Requires linear_gelu_input_backward_sm90_supported.
void linear_gelu_input_backward_sm90(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& weight,
                                     const Tensor& pre);

// The blocks of a cluster, 1 or 2: with 2, two blocks (on one GPC) take the two 128-row tiles
// above each other of one 128-column tile, and each loads half of the shared B tile into
// both (TMA multicast), so a block reads (128 + 64) x K values from L2 per tile instead of
// (128 + 128) x K. Where M is not a multiple of 256, 1. Until set (tests, A/B runs), the
// environment's PRECIS_EXP_GEMM_GELU_CLUSTER=1 asks for 1 (read once); 2 by default.
void set_gemm_gelu_sm90_cluster(int ctas);
int gemm_gelu_sm90_cluster();

// The epilogue's stores: true (default) through a shared tile of each consumer and the copy
// engine (cp.async.bulk.tensor stores of whole lines; the forward then keeps 5 stages instead
// of 6); false, each thread's bf16 pairs straight from registers (4 bytes a lane: a warp's
// store covers 8 rows x 16 bytes, half sectors). Until set (tests, A/B runs), the
// environment's PRECIS_EXP_GEMM_GELU_EPI=reg asks for false (read once). Same results.
void set_gemm_gelu_sm90_tma_store(bool on);
bool gemm_gelu_sm90_tma_store();
// The block tile's columns, 128, 192 or 256: 128 (default), a 128 x 128 tile per consumer
// warpgroup, the two in ping-pong (two m64n128k16 a k-step); 192, a 128 x 192 tile per consumer,
// still in ping-pong (two m64n192k16, 192 accumulators a thread; 3 stages of 40 KiB); 256, a
// 128 x 256 tile shared by both consumers (cooperative: 64 x 256 each, one m64n256k16 a
// k-step, B read by both; 3 stages of 48 KiB). 192 and 256 have the shared-tile epilogue only
// (whatever set_gemm_gelu_sm90_tma_store says) and need N a multiple of theirs (else 128).
// Until set (tests, A/B runs), the environment's PRECIS_EXP_GEMM_GELU_TILE=128x192 or 128x256
// asks for them (read once). Same results.
void set_gemm_gelu_sm90_tile(int columns);
int gemm_gelu_sm90_tile();
// A diagnosis, for timing only (GemmGeluGpu.TimesAtGpt2Shape): on, the shared-tile epilogues skip
// gelu and gelu' (the forward writes the sum twice, the backward the product): WRONG results,
// the kernel's time without its epilogue's math. Off by default; no environment variable.
void set_gemm_gelu_sm90_timing_without_gelu(bool on);

}  // namespace precis::ops::cuda
