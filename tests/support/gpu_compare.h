// GPU results against the CPU's: per-dtype tolerances, a comparison that checks the
// result is a GPU tensor of the CPU's dtype and shape, and poisoning of freed device
// blocks so that an output element a kernel leaves unwritten shows up.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/copy.h"
#include "core/tensor.h"
#include "support/gradcheck.h"

namespace precis::testing {

inline const Device kGpu = Device::cuda(0);
inline const Device kCpu = Device::cpu();
inline const double kNaN = std::numeric_limits<double>::quiet_NaN();
inline const DType kFloating[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

struct Tolerance {
  double atol, rtol;
};

inline Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return {1e-12, 1e-12};
    case DType::f32:
      return {1e-6, 1e-5};
    case DType::f16:
    case DType::bf16:
      return {1e-2, 1e-2};
    default:
      return {0, 0};
  }
}

// Fills freed device blocks of the size an output of `shape` and `dtype` takes with NaN
// (floating) or 0xAB bytes, so that the op's output most likely lands in poisoned memory.
inline void poison(const Shape& shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::vector<Tensor> blocks;
  for (int copy = 0; copy < 3; ++copy) {
    if (is_floating(dtype)) {
      blocks.push_back(full(shape, kNaN, dtype, kGpu));
    } else {
      Tensor bytes = empty({n * static_cast<int64_t>(element_size(dtype))}, DType::u8, kGpu);
      fill_(bytes, 0xAB);
      blocks.push_back(bytes);
    }
  }
}

// A GPU result against the CPU's: same shape and dtype, values within `tol`.
inline void expect_matches(const Tensor& gpu, const Tensor& cpu, Tolerance tol) {
  ASSERT_TRUE(gpu.defined());
  ASSERT_TRUE(gpu.is_cuda()) << describe(gpu);
  ASSERT_EQ(gpu.dtype(), cpu.dtype());
  ASSERT_EQ(gpu.shape(), cpu.shape());
  expect_close(gpu.to(kCpu), cpu, tol.atol, tol.rtol);
}

// The same, within the CPU dtype's tolerance.
inline void expect_matches(const Tensor& gpu, const Tensor& cpu) {
  expect_matches(gpu, cpu, tolerance_for(cpu.dtype()));
}

// |actual - expected| <= tol (max |expected| + |expected|) for every element: the dtype's
// relative error, measured against the magnitude of the whole result (a sum of products
// cancels, so single elements may be far smaller than their error bound). The first 5
// misses are reported.
inline void expect_near_magnitude(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();  // any device, any dtype
  double scale = 0;
  for (double v : e) scale = std::max(scale, std::abs(v));
  int misses = 0;
  for (size_t i = 0; i < a.size() && misses < 5; ++i) {
    if (!(std::abs(a[i] - e[i]) <= tol * (scale + std::abs(e[i])))) {
      ADD_FAILURE() << what << ": element " << i << " is " << a[i] << ", expected " << e[i] << " (tolerance " << tol
                    << " relative to the magnitude " << scale << ")";
      ++misses;
    }
  }
}

}  // namespace precis::testing
