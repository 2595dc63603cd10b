// The small-channel convolution path (ops::set_small_cin_conv, ops/cuda/conv_small_cin.cu) in
// training: the tiny ResNet's CIFAR stem (3 channels, 8x8 images), channels-last, under fp32,
// bf16 and fp16, eagerly and replayed from a CUDA graph (the weight gradient on the side
// stream, two micro-steps a step), trains as with cuDNN's stem: the losses to 1% (other kernels
// sum in another order), and the run's stem did go through the path. At a learning rate of
// 0.005: at the tiny run's 0.05 the fixed batch is memorised within 4 steps (losses ~0.002),
// where a 16-bit weight gradient summed in another order moved fp16's third loss by 2% and
// its later ones by 10-15%, and bf16's sixth by 2% (bench/NOTES.md, seventeenth session). Skipped, with the
// reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "ops/conv.h"
#include "support/gpu.h"
#include "support/tiny_run.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/conv.h"
#endif

using namespace precis;
namespace fs = std::filesystem;
using precis::testing::TrainedRun;

#if PRECIS_WITH_CUDA
namespace {

// cuDNN's convolutions take their heuristic's first answer, not the fastest timed one: timings
// taken while other processes share the GPU (ctest -j8) may choose other algorithms from run to
// run, and then the two runs differ in more than the stem. (The full suite failed this test once
// under -j8, its output lost; it passed alone and in two -j8 runs of the CNN tests: bench/NOTES.md,
// nineteenth session.)
TrainedRun run_tiny_resnet(const std::string& precision, bool graphs, bool small_cin, const std::string& name) {
  const bool before = ops::small_cin_conv(), benchmark_before = ops::cudnn_benchmark();
  ops::set_small_cin_conv(small_cin);
  ops::set_cudnn_benchmark(false);
  TrainedRun run = precis::testing::train_tiny_resnet(
      fs::temp_directory_path() / ("precis_small_cin_conv_gpu_" + name),
      {"device=cuda", "precision=" + precision, "channels_last=true",
       std::string("cuda_graphs=") + (graphs ? "true" : "false"), "max_steps=6", "optimizer.lr=0.005"});
  ops::set_small_cin_conv(before);
  ops::set_cudnn_benchmark(benchmark_before);
  return run;
}

}  // namespace

TEST(SmallCinConvGpu, TinyResnetTrainsAsWithCudnnsStem) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (const std::string precision : {"fp32", "bf16", "fp16"})
    for (const bool graphs : {false, true}) {
      const std::string name = precision + (graphs ? "_graphs" : "_eager");
      SCOPED_TRACE(name);
      const TrainedRun cudnn = run_tiny_resnet(precision, graphs, false, name + "_cudnn");
      const int64_t before = ops::cuda::small_cin_conv_runs();
      const TrainedRun ours = run_tiny_resnet(precision, graphs, true, name + "_ours");
      ASSERT_EQ(cudnn.losses.size(), 6u);
      precis::testing::expect_trained_as(ours, cudnn, /*bit_for_bit=*/false, graphs);
      // The stem's forward and weight gradient in each eager micro-step (three eager steps
      // before a capture), and the forward of evaluation if any.
      EXPECT_GE(ops::cuda::small_cin_conv_runs() - before, 2 * 2 * 3) << ours.out;
    }
}
#endif  // PRECIS_WITH_CUDA
