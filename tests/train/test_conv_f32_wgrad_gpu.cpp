// ops::set_conv_f32_weight_grads (PRECIS_EXP_CONV_F32_WGRAD, experimental) in training: the tiny
// ResNet under bf16 and fp16, channels-last, eager and replayed from a CUDA graph, with cuDNN's
// graph API writing each convolution's f32 weight gradient into the flat f32 gradient buffer,
// trains as the run that computes a 16-bit weight gradient and widens it: the losses to 1% (the
// weight gradients now skip one 16-bit rounding, so the bits differ), and the weight gradients
// of the run were written in f32 by cuDNN (ops::cuda::conv_graph_stats), none left to the
// widening path. Skipped, with the reason, where no GPU is usable.
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

TrainedRun run_tiny_resnet(const std::string& precision, bool graphs, bool f32_wgrad, const std::string& name) {
  ops::set_conv_f32_weight_grads(f32_wgrad);
  TrainedRun run = precis::testing::train_tiny_resnet(
      fs::temp_directory_path() / ("precis_conv_f32_wgrad_gpu_" + name),
      {"device=cuda", "precision=" + precision, "channels_last=true",
       std::string("cuda_graphs=") + (graphs ? "true" : "false"), "max_steps=6"});
  ops::set_conv_f32_weight_grads(false);
  return run;
}

}  // namespace

TEST(ConvF32WgradGpu, TrainsAsTheRunThatWidensA16BitWeightGradient) {
  PRECIS_SKIP_WITHOUT_GPU();
  ops::set_cudnn_conv_api(ops::CudnnConvApi::graph);
  for (const std::string precision : {"bf16", "fp16"})
    for (const bool graphs : {false, true}) {
      const std::string name = precision + (graphs ? "_graphs" : "_eager");
      SCOPED_TRACE(name);
      const TrainedRun widened = run_tiny_resnet(precision, graphs, false, name + "_widened");
      const ops::cuda::ConvGraphStats before = ops::cuda::conv_graph_stats();
      const TrainedRun f32 = run_tiny_resnet(precision, graphs, true, name + "_f32");
      const ops::cuda::ConvGraphStats after = ops::cuda::conv_graph_stats();
      ASSERT_EQ(widened.losses.size(), 6u);
      precis::testing::expect_trained_as(f32, widened, /*bit_for_bit=*/false, graphs);
      // ResNet-18's 20 convolutions, each with a weight gradient in every eager micro-step.
      EXPECT_GE(after.wider_out - before.wider_out, 20) << "weight gradients not written in f32 by cuDNN:\n" << f32.out;
      EXPECT_EQ(after.fell_back, before.fell_back) << f32.out;
    }
}
#endif  // PRECIS_WITH_CUDA
