// The kernels of a traced step summed by name: which kernels the step's GPU
// time goes to, as the table printed after a trace (train/step_trace.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/kernel_trace.h"

namespace precis::train {

struct KernelTotal {
  std::string name;          // short_kernel_name of the kernel
  std::string tensor_cores;  // tensor_core_label (train/tensor_cores.h): "bf16", "tf32", ... or "no"
  int64_t calls = 0;
  double total_ms = 0;
};

// A demangled kernel name without its return type, parameter list and
// anonymous namespaces: "void precis::cuda::(anonymous namespace)::k<float>(float*, int)"
// -> "precis::cuda::k<float>". Template arguments stay: they tell f32 from bf16.
std::string short_kernel_name(const std::string& demangled);

// Kernel time by short name, the most time first (ties by name). Copies and sets are left out.
std::vector<KernelTotal> kernel_totals(const std::vector<GpuActivity>& activities);

// The `top` first rows of `totals` as a table with each kernel's share of a
// step of `step_ms`, whether it ran on Tensor Cores (and in which input type),
// and a last line for the kernels beyond them.
std::string kernel_table(const std::vector<KernelTotal>& totals, double step_ms, size_t top = 15);

}  // namespace precis::train
