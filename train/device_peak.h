// The peak matmul throughput of a GPU, the denominator of MFU (model FLOPs
// utilisation): the vendor's dense figure for GPUs in core/gpu.h's table, and
// for any other GPU a measurement, taken once per process and cached.
#pragma once

#include <cstdint>

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

}  // namespace precis::train
