// Mixed precision end to end on the CPU (the demo-length convergence runs are in
// test_precision_convergence_slow.cpp), where f16/bf16 tensors are stored in
// 16 bits and computed in f32 with rounding on every store, exactly as the
// formats behave on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "support/demo_config.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace precis;
namespace fs = std::filesystem;
using test::demo_config;

namespace {

// The fraction of parameter gradients in the transformer blocks that underflowed
// in fp16: zero, or in fp16's subnormal range where precision is lost.
double block_gradient_underflow_fraction(const std::string& out_dir) {
  std::ifstream in(fs::path(out_dir) / "numerics.jsonl");
  std::string line;
  double zeros = 0, count = 0;
  while (std::getline(in, line)) {
    Json r = Json::parse(line);
    if (r.at("kind").as_string() != "gradient" || r.at("name").as_string().rfind("transformer.h.", 0) != 0) continue;
    double n = static_cast<double>(r.at("count").as_int());
    zeros += (r.at("zero").as_double() + r.at("fp16_subnormal").as_double()) * n;
    count += n;
  }
  return count > 0 ? zeros / count : std::nan("");
}

}  // namespace

TEST(PrecisionTraining, Fp16WithoutScalingShowsGradientUnderflowInTheReport) {
  auto scaled_config = demo_config("fp16_scaled", {"precision=fp16", "precision.report=true", "max_steps=4",
                                                   "precision.report_interval=2", "eval_interval=0"});
  auto unscaled_config =
      demo_config("fp16_unscaled", {"precision=fp16", "precision.loss_scaling=none", "precision.report=true",
                                    "max_steps=4", "precision.report_interval=2", "eval_interval=0"});
  train::Trainer scaled(scaled_config);
  scaled.run();
  train::Trainer unscaled(unscaled_config);
  unscaled.run();
  double with_scaling = block_gradient_underflow_fraction(scaled_config.out_dir);
  double without = block_gradient_underflow_fraction(unscaled_config.out_dir);
  EXPECT_LT(with_scaling, 0.01) << "with a loss scale of 2^16 almost no gradient is that small";
  EXPECT_GT(without, 0.05) << "unscaled fp16 gradients fall into the subnormal range";
}
