// The CNN ops on the GPU (cuDNN conv2d and batch norm, our pooling kernels) against the CPU,
// forward and backward, for f32, f16 and bf16, NCHW and channels-last inputs.
//
// Both devices get the very same values in the dtype under test; the CPU computes in f32
// and rounds once, the GPU accumulates in f32 (cuDNN may pick FFT or Winograd algorithms),
// so results are compared relative to the magnitude of the whole result
// (expect_near_magnitude): 1e-4 for f32 (TF32 off, the default), 2e-2 for f16/bf16.
// Outputs land in poisoned (NaN) memory, so an element left unwritten fails.
// Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "ops/batch_norm.h"
#include "ops/conv.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "ops/pool.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"

using namespace precis;
using precis::testing::expect_near_magnitude;
using precis::testing::kGpu;
using precis::testing::random_f64;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};
const ops::MemoryFormat kFormats[] = {ops::MemoryFormat::contiguous, ops::MemoryFormat::channels_last};

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-4 : 2e-2; }

std::string name(DType dtype, ops::MemoryFormat format) {
  return std::string(dtype_name(dtype)) + (format == ops::MemoryFormat::channels_last ? " channels-last" : " NCHW");
}

// fn on the CPU and on the GPU, from the same values of `inputs` (f64, converted to dtype;
// f32 where keep_f32[i]); fn puts its first input into the memory format under test. The
// outputs, their layouts and every input's gradient (from one random output gradient) agree.
void expect_gpu_matches_cpu(const Fn& fn, const std::vector<Tensor>& inputs, DType dtype, const std::string& what,
                            const std::vector<bool>& keep_f32 = {}) {
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
  precis::testing::poison(y_cpu.shape(), y_cpu.dtype());
  const Tensor y_gpu = fn(gpu);
  ASSERT_TRUE(y_gpu.is_cuda()) << what;
  ASSERT_EQ(y_gpu.dtype(), y_cpu.dtype()) << what;
  EXPECT_EQ(ops::is_channels_last(y_gpu), ops::is_channels_last(y_cpu)) << what;
  const double tol = tolerance(dtype);
  expect_near_magnitude(y_gpu, y_cpu, tol, what + ": output");
  const Tensor gy = random_f64(y_cpu.shape(), 999).to(y_cpu.dtype());
  y_cpu.backward(gy);
  y_gpu.backward(gy.to(kGpu));
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(gpu[i].grad().defined()) << what << ": input " << i << " got no gradient on the GPU";
    EXPECT_TRUE(gpu[i].grad().is_cuda()) << what;
    expect_near_magnitude(gpu[i].grad(), cpu[i].grad(), tol, what + ": gradient of input " + std::to_string(i));
  }
}

struct ConvCase {
  Shape x, w;
  ops::Conv2dOptions options;
  bool bias;
};

}  // namespace

TEST(CnnOpsGpu, Conv2dMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<ConvCase> cases = {
      {{4, 8, 16, 16}, {16, 8, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}, true},   // a ResNet 3x3
      {{2, 3, 17, 15}, {8, 3, 7, 7}, {{2, 2}, {3, 3}, {1, 1}, 1}, false},   // the ImageNet stem, odd sizes
      {{3, 16, 9, 9}, {32, 16, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}, false},  // a strided 1x1 shortcut
      {{2, 8, 11, 10}, {12, 2, 3, 3}, {{1, 2}, {2, 1}, {2, 1}, 4}, true},   // groups, dilation, uneven options
      {{2, 6, 8, 8}, {6, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 6}, true},      // depthwise
      {{8, 1, 28, 28}, {6, 1, 5, 5}, {{1, 1}, {2, 2}, {1, 1}, 1}, true}};   // LeNet's first layer
  uint64_t seed = 1;
  for (const ConvCase& c : cases) {
    for (DType dtype : kDtypes) {
      for (auto format : kFormats) {
        const ops::Conv2dOptions options = c.options;
        std::vector<Tensor> inputs = {random_f64(c.x, seed++), random_f64(c.w, seed++, -0.5, 0.5)};
        if (c.bias) inputs.push_back(random_f64({c.w[0]}, seed++));
        expect_gpu_matches_cpu(
            [options, format](const std::vector<Tensor>& in) {
              return ops::conv2d(ops::to_memory_format(in[0], format), in[1], in.size() > 2 ? in[2] : Tensor(),
                                 options);
            },
            inputs, dtype,
            "conv2d x " + ::testing::PrintToString(c.x) + " w " + ::testing::PrintToString(c.w) + " " +
                name(dtype, format));
      }
    }
  }
}

TEST(CnnOpsGpu, Conv2dUnderTf32StaysCloseToF32) {
  PRECIS_SKIP_WITHOUT_GPU();
  ops::set_allow_tf32(true);
  for (auto format : kFormats) {
    expect_near_magnitude(
        ops::conv2d(ops::to_memory_format(random_f64({4, 16, 12, 12}, 50).to(DType::f32).to(kGpu), format),
                    random_f64({32, 16, 3, 3}, 51).to(DType::f32).to(kGpu), Tensor(), {{1, 1}, {1, 1}, {1, 1}, 1}),
        ops::conv2d(random_f64({4, 16, 12, 12}, 50).to(DType::f32), random_f64({32, 16, 3, 3}, 51).to(DType::f32),
                    Tensor(), {{1, 1}, {1, 1}, {1, 1}, 1}),
        5e-3, "conv2d under TF32");
  }
  ops::set_allow_tf32(false);
}

TEST(CnnOpsGpu, PoolsMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (DType dtype : kDtypes) {
    for (auto format : kFormats) {
      const std::string n = name(dtype, format);
      const Shape shape{3, 5, 13, 11};
      expect_gpu_matches_cpu(
          [format](const std::vector<Tensor>& in) {
            return ops::max_pool2d(ops::to_memory_format(in[0], format), {3, 3}, {2, 2}, {1, 1});
          },
          {random_f64(shape, seed++)}, dtype, "max_pool2d 3x3/2 pad 1 " + n);
      expect_gpu_matches_cpu(
          [format](const std::vector<Tensor>& in) {
            return ops::max_pool2d(ops::to_memory_format(in[0], format), {2, 3}, {1, 2}, {1, 0});
          },
          {random_f64(shape, seed++)}, dtype, "max_pool2d 2x3 " + n);
      expect_gpu_matches_cpu(
          [format](const std::vector<Tensor>& in) {
            return ops::avg_pool2d(ops::to_memory_format(in[0], format), {3, 2}, {2, 1}, {1, 1});
          },
          {random_f64(shape, seed++)}, dtype, "avg_pool2d " + n);
      for (auto out : {std::array<int64_t, 2>{1, 1}, std::array<int64_t, 2>{4, 3}, std::array<int64_t, 2>{15, 12}}) {
        expect_gpu_matches_cpu(
            [format, out](const std::vector<Tensor>& in) {
              return ops::adaptive_avg_pool2d(ops::to_memory_format(in[0], format), out);
            },
            {random_f64(shape, seed++)}, dtype, "adaptive_avg_pool2d " + n);
      }
    }
  }
}

TEST(CnnOpsGpu, BatchNormMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  const Shape shape{6, 8, 7, 5};
  for (DType dtype : kDtypes) {
    for (auto format : kFormats) {
      for (bool relu : {false, true}) {
        for (bool training : {true, false}) {
          const std::string what = std::string(relu ? "batch_norm_relu " : "batch_norm ") +
                                   (training ? "training " : "eval ") + name(dtype, format);
          auto op = relu ? ops::batch_norm_relu : ops::batch_norm;
          // running statistics on each device, starting equal
          const Tensor mean0 = random_f64({8}, seed++).to(DType::f32),
                       var0 = random_f64({8}, seed++, 0.5, 2).to(DType::f32);
          Tensor cpu_mean = mean0.clone(), cpu_var = var0.clone();
          Tensor gpu_mean = mean0.to(kGpu), gpu_var = var0.to(kGpu);
          expect_gpu_matches_cpu(
              [&, format, training](const std::vector<Tensor>& in) {
                const bool on_gpu = in[0].is_cuda();
                return op(ops::to_memory_format(in[0], format), in[1], in[2], on_gpu ? gpu_mean : cpu_mean,
                          on_gpu ? gpu_var : cpu_var, training, 0.1, 1e-5);
              },
              {random_f64(shape, seed++, -1, 3), random_f64({8}, seed++), random_f64({8}, seed++)}, dtype, what,
              {false, true, true});  // weight and bias in f32, as a mixed-precision policy keeps them
          expect_near_magnitude(gpu_mean, cpu_mean, 1e-5, what + ": running mean");
          expect_near_magnitude(gpu_var, cpu_var, 1e-4, what + ": running var");
        }
      }
    }
  }
}

TEST(CnnOpsGpu, BatchNormTakesParametersInTheInputsDtype) {
  PRECIS_SKIP_WITHOUT_GPU();
  // bf16-pure keeps the parameters in bf16; their gradients come back in bf16.
  expect_gpu_matches_cpu(
      [](const std::vector<Tensor>& in) {
        return ops::batch_norm(ops::to_memory_format(in[0], ops::MemoryFormat::channels_last), in[1], in[2], Tensor(),
                               Tensor(), true);
      },
      {random_f64({4, 6, 5, 5}, 300), random_f64({6}, 301), random_f64({6}, 302)}, DType::bf16,
      "batch_norm with bf16 parameters");
}
