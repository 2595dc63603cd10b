// optimizer.writes_weight_casts on the GPU (test_weight_casts.cpp says what it is): the tiny
// ResNet under bf16 and fp16, eager and replayed from a CUDA graph (whose captured step has no
// cast pass: the replayed optimizer kernel writes the casts), trains as a run that casts at every
// step: bit for bit where two runs that cast at every step agree, else the losses to 1%
// (expect_trained_as).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/gpu.h"
#include "support/tiny_run.h"

using namespace precis;
namespace fs = std::filesystem;
using precis::testing::TrainedRun;

namespace {

TrainedRun run_tiny_resnet(const std::string& precision, bool graphs, bool writes_casts, const std::string& name) {
  return precis::testing::train_tiny_resnet(
      fs::temp_directory_path() / ("precis_weight_casts_gpu_" + name),
      {"device=cuda", "precision=" + precision, "channels_last=true",
       std::string("cuda_graphs=") + (graphs ? "true" : "false"), "max_steps=6",
       std::string("optimizer.writes_weight_casts=") + (writes_casts ? "true" : "false")});
}

}  // namespace

TEST(WeightCastsGpu, RunsTrainAsOnesThatCastEachStep) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (const std::string precision : {"bf16", "fp16"})
    for (const bool graphs : {false, true}) {
      const std::string name = precision + (graphs ? "_graphs" : "_eager");
      SCOPED_TRACE(name);
      const TrainedRun off = run_tiny_resnet(precision, graphs, false, name + "_off");
      const TrainedRun on = run_tiny_resnet(precision, graphs, true, name + "_on");
      const TrainedRun off_again = run_tiny_resnet(precision, graphs, false, name + "_off_again");
      ASSERT_EQ(off.losses.size(), 6u);
      precis::testing::expect_trained_as(on, off, precis::testing::runs_agree(off, off_again), graphs);
    }
}
