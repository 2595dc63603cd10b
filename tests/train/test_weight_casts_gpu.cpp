// optimizer.writes_weight_casts on the GPU (test_weight_casts.cpp says what it is): the tiny
// ResNet under bf16 and fp16, eager and replayed from a CUDA graph (whose captured step has no
// cast pass: the replayed optimizer kernel writes the casts), trains as a run that casts at every
// step. Bit for bit where two runs that cast at every step agree; where cuDNN's engines are not
// deterministic, the losses to 1%.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <string>

#include "support/gpu.h"
#include "support/tiny_run.h"

using namespace precis;
namespace fs = std::filesystem;
using precis::testing::identical;
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
      ASSERT_EQ(on.losses.size(), 6u);
      if (graphs) {
        EXPECT_NE(on.out.find("cuda graphs: captured"), std::string::npos) << "the step was not replayed:\n" << on.out;
      }
      if (identical(off, off_again)) {
        EXPECT_TRUE(identical(on, off)) << "the casts the optimizer wrote differ from the cast pass's";
      } else {
        std::cout << "note: two runs that cast each step differ (cuDNN engines that are not deterministic); the "
                     "losses are compared to 1%\n";
        for (size_t step = 0; step < off.losses.size(); ++step)
          EXPECT_NEAR(on.losses[step], off.losses[step], 1e-2 * std::abs(off.losses[step])) << "step " << step + 1;
      }
      EXPECT_LT(on.losses.back(), on.losses.front()) << "it learns the fixed batch";
    }
}
