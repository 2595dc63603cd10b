// The peak matmul throughput of a GPU, the denominator of MFU (model FLOPs
// utilisation): the vendor's dense figure for GPUs in core/gpu.h's table, and
// for any other GPU a measurement, taken once per process and cached.
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"
#include "core/dtype.h"

namespace precis::train {

// TFLOP/s of matmuls in `compute` (f16/bf16, or f32 with tf32 on or off) on
// `device`: the datasheet figure when the GPU is known, else measured once
// (printing one note line). 0 for the CPU.
double device_peak_tflops(Device device, DType compute, bool tf32);

// Times `reps` products of two random n x n matrices in `compute` on `device`
// (after warm-up products) and returns the TFLOP/s they ran at (2 n^3 FLOPs each).
double measure_matmul_tflops(Device device, DType compute, bool tf32, int64_t n = 8192, int reps = 10);

// The roofs of a device for the op profile's roofline (docs/profiling.md): the FLOP/s of
// products in the compute dtype (Tensor Cores on a GPU), of the other arithmetic (f32 on the
// vector units), and the memory bandwidth. A known GPU's come from the datasheet; an unknown
// GPU's and the CPU's are measured once here (a matmul, a large copy), and `source` says which.
struct Roofline {
  double matrix_flops = 0;  // FLOP/s
  double vector_flops = 0;  // FLOP/s
  double bytes_per_s = 0;
  std::string source;
  double compute(bool matrix) const { return matrix ? matrix_flops : vector_flops; }
  // The attainable FLOP/s at `intensity` FLOPs per byte: min(compute peak, intensity x bandwidth).
  double roof(double intensity, bool matrix) const;
  // The intensity where the bandwidth roof meets the compute roof.
  double ridge(bool matrix) const { return compute(matrix) / bytes_per_s; }
};
Roofline device_roofline(Device device, DType compute, bool tf32);

// Bytes per second of copying a `bytes`-byte tensor on `device` (read plus write), best of `reps`.
double measure_copy_bytes_per_s(Device device, int64_t bytes = int64_t{1} << 28, int reps = 5);

}  // namespace precis::train
