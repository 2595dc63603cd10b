// Is there a usable GPU? Every answer is safe to ask on a machine without a
// CUDA driver: "no driver" means "no GPU", never a crash.
#pragma once

#include <string>

#include "core/device.h"
#include "core/dtype.h"

namespace precis {

// Number of usable CUDA devices (0 without a CUDA build, a driver or a device).
int cuda_device_count();
// One line: "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" or why there is no GPU.
std::string cuda_status();

// The compute capability of GPU `index` as major*10+minor (90 for an H100); 0 without a GPU.
int cuda_compute_capability(int index = 0);

// The dense tensor-core peak of GPU `index` in TFLOP/s for matmuls in `compute`
// (f16/bf16, or f32 with tf32 on/off), from the vendor's datasheet, keyed by the
// device name (H100 SXM, H100 PCIe, H200, A100). 0 when the GPU is unknown.
double peak_tflops(int index, DType compute, bool tf32);
std::string cuda_device_name(int index = 0);
// The memory bandwidth of GPU `index` in GB/s (1e9 bytes/s), from the same datasheets; 0 when unknown.
double peak_memory_gbps(int index);

// Resolves a `device:` setting: "auto" picks cuda:0 when a GPU is present, else
// the CPU (printing a one-line note); "cuda[:N]" without that GPU is an error.
Device resolve_device(const std::string& setting, bool quiet = false);

}  // namespace precis
