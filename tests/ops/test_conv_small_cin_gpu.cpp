// The small-channel convolution path (ops::set_small_cin_conv, ops/cuda/conv_small_cin.cu: a
// 3x3, stride 1, padding 1 convolution of a 2- to 4-channel channels-last image as an im2col and
// cuBLASLt products) against the CPU: the output and the weight's gradient for f32, f16 and
// bf16, 2, 3 and 4 input channels, 8, 24, 64 and 128 output channels, odd image sizes (the
// padding's edges) and a batch whose weight gradient spans many chunks with a partial last one
// (one batched product and one more); the input's gradient comes
// from cuDNN as before. ops::cuda::small_cin_conv_runs() shows the kernels ran (no silent
// cuDNN), and NCHW, 1-channel images (NCHW too), 5x5 filters, strides and 8 input channels
// are left to cuDNN. Skipped, with
// the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/conv.h"
#include "ops/memory_format.h"
#include "support/cnn_compare.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/conv.h"
#endif

using namespace precis;
using precis::testing::cnn_case_name;
using precis::testing::expect_gpu_matches_cpu;
using precis::testing::kCnnDtypes;
using precis::testing::random_f64;

#if PRECIS_WITH_CUDA
namespace {

// The path on for the scope (it is by default, unless PRECIS_SMALL_CIN_CONV=0), as before after it.
struct SmallCinConv {
  bool before = ops::small_cin_conv();
  SmallCinConv() { ops::set_small_cin_conv(true); }
  ~SmallCinConv() { ops::set_small_cin_conv(before); }
};

// conv2d of a channels-last x with w, as ResNet's CIFAR stem calls it.
void expect_matches_cpu(const Shape& x, int64_t cout, DType dtype, uint64_t seed, const ops::Conv2dOptions& options,
                        const std::string& what) {
  expect_gpu_matches_cpu(
      [options](const std::vector<Tensor>& in) {
        return ops::conv2d(ops::to_memory_format(in[0], ops::MemoryFormat::channels_last), in[1], Tensor(), options);
      },
      {random_f64(x, seed),
       random_f64({cout, x[1], options.padding[0] == 2 ? 5 : 3, options.padding[0] == 2 ? 5 : 3}, seed + 1, -0.5, 0.5)},
      dtype, what + ", " + cnn_case_name(dtype, ops::MemoryFormat::channels_last));
}

const ops::Conv2dOptions kStem{{1, 1}, {1, 1}, {1, 1}, 1};

}  // namespace

TEST(SmallCinConvGpu, ForwardAndWeightGradientMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  SmallCinConv on;
  uint64_t seed = 1;
  int64_t expected = 0;
  const int64_t before = ops::cuda::small_cin_conv_runs();
  for (DType dtype : kCnnDtypes) {
    for (int64_t cin : {2, 3, 4}) {
      expect_matches_cpu({3, cin, 7, 5}, 8, dtype, seed += 2, kStem, "3 x 7 x 5, " + std::to_string(cin) + " -> 8");
      expect_matches_cpu({2, cin, 9, 11}, 64, dtype, seed += 2, kStem, "2 x 9 x 11, " + std::to_string(cin) + " -> 64");
      expected += 4;  // two forwards, two weight gradients
    }
    // ResNet's stem at a batch whose weight gradient spans many blocks, the last tile partial.
    expect_matches_cpu({37, 3, 16, 16}, 64, dtype, seed += 2, kStem, "the CIFAR stem, 37 x 16 x 16");
    expect_matches_cpu({4, 3, 6, 6}, 128, dtype, seed += 2, kStem, "3 -> 128");
    expect_matches_cpu({2, 3, 5, 5}, 24, dtype, seed += 2, kStem, "3 -> 24");
    expected += 6;
  }
  EXPECT_EQ(ops::cuda::small_cin_conv_runs() - before, expected) << "convolutions left to cuDNN";
}

TEST(SmallCinConvGpu, OtherProblemsAreLeftToCudnn) {
  PRECIS_SKIP_WITHOUT_GPU();
  SmallCinConv on;
  const int64_t before = ops::cuda::small_cin_conv_runs();
  // NCHW.
  expect_gpu_matches_cpu([](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], Tensor(), kStem); },
                         {random_f64({2, 3, 8, 8}, 90), random_f64({16, 3, 3, 3}, 91, -0.5, 0.5)}, DType::bf16, "NCHW");
  // A 1-channel image (NCHW and NHWC at once: it counts as NCHW), a 5x5 filter, a stride of 2,
  // 8 input channels.
  expect_matches_cpu({2, 1, 8, 8}, 16, DType::bf16, 98, kStem, "1 input channel");
  expect_matches_cpu({2, 3, 8, 8}, 16, DType::bf16, 92, {{1, 1}, {2, 2}, {1, 1}, 1}, "5x5");
  expect_matches_cpu({2, 3, 8, 8}, 16, DType::bf16, 94, {{2, 2}, {1, 1}, {1, 1}, 1}, "stride 2");
  expect_matches_cpu({2, 8, 8, 8}, 16, DType::bf16, 96, kStem, "8 input channels");
  EXPECT_EQ(ops::cuda::small_cin_conv_runs(), before);
}
#endif  // PRECIS_WITH_CUDA
