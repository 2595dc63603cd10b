// Mixed precision end to end on the CPU, where f16/bf16 tensors are stored in
// 16 bits and computed in f32 with rounding on every store, exactly as the
// formats behave on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "train/config.h"
#include "train/trainer.h"

using namespace precis;
namespace fs = std::filesystem;

namespace {

train::TrainConfig demo_config(const std::string& name, std::vector<std::string> overrides) {
  fs::path dir = fs::temp_directory_path() / ("precis_precision_" + name);
  fs::remove_all(dir);
  overrides.push_back("out_dir=" + dir.string());
  overrides.push_back("sample.tokens=0");
  overrides.push_back("device=cpu");
  return train::load_config("examples/configs/shakespeare-char.yaml", overrides);
}

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

TEST(PrecisionTraining, Fp16WithDynamicScalingMatchesFp32AfterTheDemo) {
  train::Trainer fp32(demo_config("fp32", {"precision=fp32"}));
  fp32.run();
  train::Trainer fp16(demo_config("fp16", {"precision=fp16"}));
  fp16.run();
  double a = fp32.final_val_loss(), b = fp16.final_val_loss();
  ASSERT_TRUE(std::isfinite(a) && std::isfinite(b));
  EXPECT_LT(a, 2.1) << "the demo's validation loss falls well below the uniform 4.17";
  EXPECT_LE(std::abs(b - a) / a, 0.03) << "fp32 " << a << ", fp16 " << b;
  EXPECT_GT(fp16.scaler().scale(), 1.0);
}

TEST(PrecisionTraining, Fp16WithoutScalingShowsGradientUnderflowInTheReport) {
  auto scaled_config = demo_config("fp16_scaled", {"precision=fp16", "precision.report=true", "max_steps=4",
                                                   "precision.report_interval=2", "eval_interval=0"});
  auto unscaled_config = demo_config("fp16_unscaled", {"precision=fp16", "precision.loss_scaling=none",
                                                       "precision.report=true", "max_steps=4",
                                                       "precision.report_interval=2", "eval_interval=0"});
  train::Trainer scaled(scaled_config);
  scaled.run();
  train::Trainer unscaled(unscaled_config);
  unscaled.run();
  double with_scaling = block_gradient_underflow_fraction(scaled_config.out_dir);
  double without = block_gradient_underflow_fraction(unscaled_config.out_dir);
  EXPECT_LT(with_scaling, 0.01) << "with a loss scale of 2^16 almost no gradient is that small";
  EXPECT_GT(without, 0.05) << "unscaled fp16 gradients fall into the subnormal range";
}

TEST(PrecisionTraining, Bf16PureConverges) {
  train::Trainer pure(demo_config("bf16_pure", {"precision=bf16-pure", "max_steps=150", "eval_interval=150"}));
  pure.run();
  EXPECT_EQ(pure.model().wte().dtype(), DType::bf16);
  EXPECT_LT(pure.final_val_loss(), 2.7) << "from 4.17 (uniform over 65 chars)";
}
