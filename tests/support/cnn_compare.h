// The CNN ops on the GPU against the CPU (tests/ops/test_cnn_ops_gpu.cpp,
// tests/ops/test_conv_graph_gpu.cpp): both devices get the very same values in the dtype
// under test; the CPU computes in f32 and rounds once, the GPU accumulates in f32, so results
// are compared relative to the magnitude of the whole result (expect_near_magnitude): 1e-4
// for f32 (TF32 off, the default), 2e-2 for f16/bf16. Outputs land in poisoned (NaN) memory,
// so an element left unwritten fails.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ops/conv.h"
#include "support/gpu_compare.h"

namespace precis::testing {

using CnnFn = std::function<Tensor(const std::vector<Tensor>&)>;

inline const DType kCnnDtypes[] = {DType::f32, DType::f16, DType::bf16};
inline const ops::MemoryFormat kCnnFormats[] = {ops::MemoryFormat::contiguous, ops::MemoryFormat::channels_last};

inline double cnn_tolerance(DType dtype) { return dtype == DType::f32 ? 1e-4 : 2e-2; }

inline std::string cnn_case_name(DType dtype, ops::MemoryFormat format) {
  return std::string(dtype_name(dtype)) + (format == ops::MemoryFormat::channels_last ? " channels-last" : " NCHW");
}

// fn on the CPU and on the GPU, from the same values of `inputs` (f64, converted to dtype;
// f32 where keep_f32[i]); fn puts its first input into the memory format under test. The
// outputs, their layouts and every input's gradient (from one random output gradient) agree,
// within `tol` (cnn_tolerance(dtype) unless given).
inline void expect_gpu_matches_cpu(const CnnFn& fn, const std::vector<Tensor>& inputs, DType dtype,
                                   const std::string& what, const std::vector<bool>& keep_f32 = {},
                                   std::optional<double> tol = std::nullopt) {
  std::vector<Tensor> cpu, gpu;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool f32 = i < keep_f32.size() && keep_f32[i];
    Tensor value = inputs[i].to(f32 ? DType::f32 : dtype);
    cpu.push_back(value.detach());
    gpu.push_back(value.to(kGpu));
    cpu.back().set_requires_grad();
    gpu.back().set_requires_grad();
  }
  const Tensor y_cpu = fn(cpu);
  poison(y_cpu.shape(), y_cpu.dtype());
  const Tensor y_gpu = fn(gpu);
  ASSERT_TRUE(y_gpu.is_cuda()) << what;
  ASSERT_EQ(y_gpu.dtype(), y_cpu.dtype()) << what;
  EXPECT_EQ(ops::is_channels_last(y_gpu), ops::is_channels_last(y_cpu)) << what;
  const double t = tol.value_or(cnn_tolerance(dtype));
  expect_near_magnitude(y_gpu, y_cpu, t, what + ": output");
  const Tensor gy = random_f64(y_cpu.shape(), 999).to(y_cpu.dtype());
  y_cpu.backward(gy);
  y_gpu.backward(gy.to(kGpu));
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(gpu[i].grad().defined()) << what << ": input " << i << " got no gradient on the GPU";
    EXPECT_TRUE(gpu[i].grad().is_cuda()) << what;
    expect_near_magnitude(gpu[i].grad(), cpu[i].grad(), t, what + ": gradient of input " + std::to_string(i));
  }
}

}  // namespace precis::testing
