// The CNN ops on the GPU (cuDNN's conv2d, our batch norm and pooling kernels) against the CPU,
// forward and backward, for f32, f16 and bf16, NCHW and channels-last inputs, compared as
// tests/support/cnn_compare.h says. Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "ops/autocast.h"
#include "ops/batch_norm.h"
#include "ops/conv.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "ops/pool.h"
#include "ops/residual.h"
#include "support/cnn_compare.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"

using namespace precis;
using precis::testing::cnn_case_name;
using precis::testing::expect_gpu_matches_cpu;
using precis::testing::expect_near_magnitude;
using precis::testing::kGpu;
using precis::testing::random_f64;

namespace {

const auto& kDtypes = precis::testing::kCnnDtypes;
const auto& kFormats = precis::testing::kCnnFormats;

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
        std::vector<Tensor> inputs = {random_f64(c.x, seed++), random_f64(c.w, seed++, -0.5, 0.5),
                                      random_f64({c.w[0]}, seed++)};
        if (!c.bias) inputs.pop_back();
        expect_gpu_matches_cpu(
            [options, format](const std::vector<Tensor>& in) {
              return ops::conv2d(ops::to_memory_format(in[0], format), in[1], in.size() > 2 ? in[2] : Tensor(),
                                 options);
            },
            inputs, dtype,
            "conv2d x " + ::testing::PrintToString(c.x) + " w " + ::testing::PrintToString(c.w) + " " +
                cnn_case_name(dtype, format));
      }
    }
  }
}

TEST(CnnOpsGpu, Conv2dWithTheHeuristicsChoiceMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  ops::set_cudnn_benchmark(false);  // the heuristic's first answer instead of the fastest timed one
  uint64_t seed = 30;
  for (DType dtype : kDtypes) {
    for (auto format : kFormats) {
      expect_gpu_matches_cpu(
          [format](const std::vector<Tensor>& in) {
            return ops::conv2d(ops::to_memory_format(in[0], format), in[1], in[2], {{2, 1}, {1, 1}, {1, 1}, 1});
          },
          {random_f64({4, 8, 15, 16}, seed++), random_f64({16, 8, 3, 3}, seed++, -0.5, 0.5), random_f64({16}, seed++)},
          dtype, "conv2d without benchmark " + cnn_case_name(dtype, format));
    }
  }
  ops::set_cudnn_benchmark(true);
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
  // 5 channels take the one-channel-a-thread kernels; 16, channels-last, the 16-byte packs.
  for (const Shape& shape : {Shape{3, 5, 13, 11}, Shape{2, 16, 13, 11}})
    for (DType dtype : kDtypes) {
      for (auto format : kFormats) {
        const std::string n = cnn_case_name(dtype, format) + " C=" + std::to_string(shape[1]);
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
        // 272 places a window: i32 indices (a byte holds those of windows up to 256 cells)
        expect_gpu_matches_cpu(
            [format](const std::vector<Tensor>& in) {
              return ops::max_pool2d(ops::to_memory_format(in[0], format), {17, 16}, {3, 3}, {8, 8});
            },
            {random_f64(shape, seed++)}, dtype, "max_pool2d 17x16 " + n);
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
                                   (training ? "training " : "eval ") + cnn_case_name(dtype, format);
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
                          on_gpu ? gpu_var : cpu_var, training, 0.1, 1e-5, Tensor());
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

// On the GPU batch_norm_relu recomputes its relu's mask from x instead of keeping y. Its
// gradients must be those of batch_norm's backward fed gy masked by y > 0, bit for bit (the same
// sums of the same values), in training and eval, every dtype and layout (channels-last C = 16:
// the packed kernels; C = 5: the plain ones). A third of x is exactly 0 and eval normalises with
// mean 0, so there the value is the bias alone: 1e-9 for channel 0, below f16's smallest
// subnormal, where y rounds to 0 and the recomputed mask must block the gradient too.
TEST(CnnOpsGpu, BatchNormReluMaskFromXIsTheMaskOfY) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 900;
  for (const Shape& shape : {Shape{4, 16, 6, 5}, Shape{3, 5, 7, 4}}) {
    const int64_t C = shape[1];
    std::vector<double> xs = random_f64(shape, seed++, -1, 1).to_vector<double>();
    for (size_t i = 0; i < xs.size(); i += 3) xs[i] = 0;
    std::vector<double> biases = random_f64({C}, seed++, -0.2, 0.2).to_vector<double>();
    biases[0] = 1e-9;
    const Tensor x0 = from_vector(xs, shape), w0 = random_f64({C}, seed++, 0.5, 1.5), b0 = from_vector(biases, {C});
    const Tensor gy0 = random_f64(shape, seed++);
    for (DType dtype : kDtypes) {
      for (auto format : kFormats) {
        for (bool training : {true, false}) {
          const std::string what = std::string(training ? "training " : "eval ") + ::testing::PrintToString(shape) +
                                   " " + cnn_case_name(dtype, format);
          // one run: the op, its input's, weight's and bias's gradients, and y
          auto run = [&](bool relu, const Tensor& gy) {
            Tensor x = ops::to_memory_format(x0.to(dtype).to(kGpu), format).detach();
            Tensor w = w0.to(DType::f32).to(kGpu), b = b0.to(DType::f32).to(kGpu);
            for (Tensor* t : {&x, &w, &b}) t->set_requires_grad();
            Tensor mean = zeros({C}, DType::f32, kGpu), var = ones({C}, DType::f32, kGpu);
            auto op = relu ? ops::batch_norm_relu : ops::batch_norm;
            const Tensor y = op(x, w, b, mean, var, training, 0.1, 1e-5, Tensor());
            y.backward(gy.to(dtype).to(kGpu));
            return std::vector<Tensor>{x.grad(), w.grad(), b.grad(), y.detach()};
          };
          const std::vector<Tensor> with_relu = run(true, gy0);
          // gy masked by y > 0 on the host, from the y the relu variant wrote
          const std::vector<double> y = with_relu[3].to_vector<double>(), g = gy0.to(dtype).to_vector<double>();
          std::vector<double> masked(g.size());
          for (size_t i = 0; i < g.size(); ++i) masked[i] = y[i] > 0 ? g[i] : 0.0;
          const std::vector<Tensor> reference = run(false, from_vector(masked, shape));
          const char* names[] = {"dx", "dw", "db"};
          for (int k = 0; k < 3; ++k) expect_near_magnitude(with_relu[k], reference[k], 0.0, what + ": " + names[k]);
        }
      }
    }
  }
}

// What the mask from x is for: a ResNet stem's y = batch_norm_relu(x) feeds only a max-pool,
// which keeps its indices, so once the caller lets go of y nothing holds it (a ResNet-50 at
// B=128 frees 196 MiB of its peak so). Its backward still runs from what was kept.
TEST(CnnOpsGpu, BatchNormReluKeepsNoReferenceToItsOutput) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Shape shape{8, 16, 32, 32};
  Tensor x =
      ops::to_memory_format(random_f64(shape, 950).to(DType::bf16).to(kGpu), ops::MemoryFormat::channels_last).detach();
  Tensor w = random_f64({16}, 951, 0.5, 1.5).to(DType::f32).to(kGpu), b = zeros({16}, DType::f32, kGpu);
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad();
  Tensor y = ops::batch_norm_relu(x, w, b, Tensor(), Tensor(), true, 0.1, 1e-5, Tensor());
  const Tensor pooled = ops::max_pool2d(y, {3, 3}, {2, 2}, {1, 1});
  const size_t y_bytes = static_cast<size_t>(y.numel()) * element_size(y.dtype());
  const size_t before = allocator_for(kGpu).stats().allocated_bytes;
  y = Tensor();
  const size_t after = allocator_for(kGpu).stats().allocated_bytes;
  EXPECT_GE(before - after, y_bytes) << "y is still held after the caller let it go";
  ops::sum(pooled).backward();
  ASSERT_TRUE(x.grad().defined());
  double grad_size = 0;
  for (double v : x.grad().to_vector<double>()) grad_size += std::abs(v);
  EXPECT_GT(grad_size, 0.0);
}

// Channels-last batch norms whose C is a multiple of 16 bytes' worth of channels take the packed
// kernels: 8 or 72 channels (one tile of 1 or 9 packs in bf16), 12 (f32 packs only), 264 (tiles
// of 32 packs and a partial one), many cells a thread; the plain, relu and add-relu variants,
// training and eval.
TEST(CnnOpsGpu, BatchNormPackedChannelsLastMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 700;
  for (const Shape& shape : {Shape{16, 72, 12, 12}, Shape{4, 264, 5, 5}, Shape{3, 12, 9, 7}, Shape{64, 8, 16, 16}}) {
    const int64_t C = shape[1];
    for (DType dtype : kDtypes) {
      for (int variant = 0; variant < 3; ++variant) {
        for (bool training : {true, false}) {
          const std::string what = std::string(variant == 0   ? "batch_norm "
                                               : variant == 1 ? "batch_norm_relu "
                                                              : "batch_norm_add_relu ") +
                                   (training ? "training " : "eval ") + ::testing::PrintToString(shape) + " " +
                                   cnn_case_name(dtype, ops::MemoryFormat::channels_last);
          const Tensor mean0 = random_f64({C}, seed++).to(DType::f32),
                       var0 = random_f64({C}, seed++, 0.5, 2).to(DType::f32);
          Tensor cpu_mean = mean0.clone(), cpu_var = var0.clone();
          Tensor gpu_mean = mean0.to(kGpu), gpu_var = var0.to(kGpu);
          expect_gpu_matches_cpu(
              [&, variant, training](const std::vector<Tensor>& in) {
                const bool on_gpu = in[0].is_cuda();
                const Tensor x = ops::to_memory_format(in[0], ops::MemoryFormat::channels_last);
                Tensor& mean = on_gpu ? gpu_mean : cpu_mean;
                Tensor& var = on_gpu ? gpu_var : cpu_var;
                if (variant == 2)
                  return ops::batch_norm_add_relu(x, ops::to_memory_format(in[3], ops::MemoryFormat::channels_last),
                                                  in[1], in[2], mean, var, training, 0.1, 1e-5);
                auto op = variant == 1 ? ops::batch_norm_relu : ops::batch_norm;
                return op(x, in[1], in[2], mean, var, training, 0.1, 1e-5, Tensor());
              },
              variant == 2 ? std::vector<Tensor>{random_f64(shape, seed++, -1, 3), random_f64({C}, seed++),
                                                 random_f64({C}, seed++), random_f64(shape, seed++)}
                           : std::vector<Tensor>{random_f64(shape, seed++, -1, 3), random_f64({C}, seed++),
                                                 random_f64({C}, seed++)},
              dtype, what, {false, true, true, false});
          expect_near_magnitude(gpu_mean, cpu_mean, 1e-5, what + ": running mean");
          expect_near_magnitude(gpu_var, cpu_var, 1e-4, what + ": running var");
        }
      }
    }
  }
}

// A training forward adds 1 to num_batches_tracked on the GPU, in whichever variant and path
// (packed channels-last, plain); eval adds nothing.
TEST(CnnOpsGpu, BatchNormCountsTrainingBatchesOnTheGpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor count = zeros({}, DType::i64).to(kGpu);
  const Tensor x = random_f64({4, 16, 5, 5}, 900).to(DType::bf16).to(kGpu);
  const Tensor cl = ops::to_memory_format(x, ops::MemoryFormat::channels_last);
  const Tensor mean = zeros({16}).to(kGpu), var = ones({16}).to(kGpu);
  ops::batch_norm(x, Tensor(), Tensor(), mean, var, true, 0.1, 1e-5, count);
  ops::batch_norm_relu(cl, Tensor(), Tensor(), mean, var, true, 0.1, 1e-5, count);
  ops::batch_norm_add_relu(cl, cl, Tensor(), Tensor(), mean, var, true, 0.1, 1e-5, count);
  ops::batch_norm(cl, Tensor(), Tensor(), mean, var, false, 0.1, 1e-5, count);
  EXPECT_EQ(count.to(Device::cpu()).to_vector<int64_t>(), std::vector<int64_t>{3});
}

// batch_norm_add_relu with x NCHW, and with its residual in the other layout than x.
TEST(CnnOpsGpu, BatchNormAddReluMatchesTheCpuInEitherLayout) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 800;
  for (DType dtype : kDtypes) {
    for (auto format : kFormats) {
      expect_gpu_matches_cpu(
          [format](const std::vector<Tensor>& in) {
            return ops::batch_norm_add_relu(ops::to_memory_format(in[0], format), in[3], in[1], in[2], Tensor(),
                                            Tensor(), true);
          },
          {random_f64({6, 16, 7, 5}, seed++), random_f64({16}, seed++), random_f64({16}, seed++),
           random_f64({6, 16, 7, 5}, seed++)},
          dtype, "batch_norm_add_relu " + cnn_case_name(dtype, format), {false, true, true, false});
    }
  }
}

TEST(CnnOpsGpu, BatchNormOfOtherRanksAndLargeMeansMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kDtypes) {
    for (bool relu : {false, true}) {
      auto op = relu ? ops::batch_norm_relu : ops::batch_norm;
      // [N, C] (a classifier head's features) and [N, C, L]
      for (const Shape& shape : {Shape{37, 8}, Shape{5, 8, 13}}) {
        expect_gpu_matches_cpu(
            [op](const std::vector<Tensor>& in) {
              return op(in[0], in[1], in[2], Tensor(), Tensor(), true, 0.1, 1e-5, Tensor());
            },
            {random_f64(shape, 400), random_f64({8}, 401), random_f64({8}, 402)}, dtype,
            std::string(relu ? "batch_norm_relu " : "batch_norm ") + ::testing::PrintToString(shape) + " " +
                dtype_name(dtype),
            {false, true, true});
      }
    }
  }
  // values around 100 with a spread of 1: the variance must not cancel away
  expect_gpu_matches_cpu(
      [](const std::vector<Tensor>& in) {
        return ops::batch_norm(ops::to_memory_format(in[0], ops::MemoryFormat::channels_last), Tensor(), Tensor(),
                               Tensor(), Tensor(), true);
      },
      {random_f64({16, 8, 9, 9}, 403, 99, 101)}, DType::f32, "batch_norm of values near 100");
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

TEST(CnnOpsGpu, Conv2dUnderAutocastRunsInBf16AndGivesF32WeightsTheirGradient) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Result {
    Tensor y, weight_grad;
  };
  // the output and the f32 weight's gradient on `device`
  auto run = [](Device device, ops::MemoryFormat format) {
    Tensor x = ops::to_memory_format(random_f64({4, 8, 10, 10}, 500).to(DType::f32).to(device), format);
    Tensor w = random_f64({16, 8, 3, 3}, 501, -0.5, 0.5).to(DType::f32).to(device);
    w.set_requires_grad();
    Tensor y;
    {
      ops::autocast::Scope scope(DType::bf16);
      y = ops::conv2d(x, w, Tensor(), {{1, 1}, {1, 1}, {1, 1}, 1});
    }
    ops::sum(ops::mul(y.to(DType::f32), random_f64(y.shape(), 502).to(DType::f32).to(device))).backward();
    ops::autocast::clear_cache();
    return Result{y, w.grad()};
  };
  for (auto format : kFormats) {
    const Result cpu = run(Device::cpu(), format), gpu = run(kGpu, format);
    EXPECT_EQ(gpu.y.dtype(), DType::bf16);
    EXPECT_EQ(ops::is_channels_last(gpu.y), format == ops::MemoryFormat::channels_last);
    ASSERT_TRUE(gpu.weight_grad.defined());
    EXPECT_EQ(gpu.weight_grad.dtype(), DType::f32);
    expect_near_magnitude(gpu.y, cpu.y, 2e-2, "conv2d under autocast: output");
    expect_near_magnitude(gpu.weight_grad, cpu.weight_grad, 2e-2, "conv2d under autocast: weight gradient");
  }
}

TEST(CnnOpsGpu, AddReluMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 600;
  for (DType dtype : kDtypes) {
    for (auto format : kFormats) {
      expect_gpu_matches_cpu(
          [format](const std::vector<Tensor>& in) {
            // the residual comes NCHW: add_relu copies it into x's layout
            return ops::add_relu(ops::to_memory_format(in[0], format), in[1]);
          },
          {random_f64({4, 6, 7, 5}, seed++), random_f64({4, 6, 7, 5}, seed++)}, dtype,
          "add_relu " + cnn_case_name(dtype, format));
    }
  }
}
