// The op profile's tables and roofline (train/op_table.h) on made-up steps whose
// every figure is known, and on a tiny GPT-2 trained on the CPU: the ops add up
// to the measured step, and the products' FLOPs are the model's 2 x parameters
// per token.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "models/gpt2.h"
#include "support/demo_config.h"
#include "train/op_table.h"
#include "train/trainer.h"

using namespace precis;
using namespace precis::train;

namespace {

// A roofline with round numbers: 100 GFLOP/s matrix, 10 GFLOP/s vector, 10 GB/s.
Roofline round_roofline() { return Roofline{100e9, 10e9, 10e9, "test"}; }

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Two steps of 10 ms: a product (1 GFLOP, 10 MB: intensity 100) of 4 ms, a copy-like op
// (no FLOPs, 20 MB) of 3 ms, an uncosted op of 1 ms; 2 ms outside ops.
std::vector<ProfiledStep> made_up_steps() {
  ProfiledStep step;
  step.ms = 10;
  step.ops = {{"matmul", OpPass::forward, {0.5e9, 5e6, true}, 2.0},
              {"matmul", OpPass::forward, {0.5e9, 5e6, true}, 2.0},
              {"embedding", OpPass::backward, {0, 20e6, false}, 3.0},
              {"view", OpPass::backward, {}, 1.0}};
  return {step, step};
}

}  // namespace

TEST(OpTable, SumsPerOpAndPassAndPlacesEachOnTheRoofline) {
  OpTable table = op_table(made_up_steps());
  EXPECT_EQ(table.steps, 2);
  EXPECT_DOUBLE_EQ(table.step_ms, 10);
  EXPECT_DOUBLE_EQ(table.op_ms, 8);
  ASSERT_EQ(table.rows.size(), 3u);
  const OpRow& mm = table.rows[0];  // the most time first
  EXPECT_EQ(mm.op, "matmul");
  EXPECT_DOUBLE_EQ(mm.calls, 2);
  EXPECT_DOUBLE_EQ(mm.ms, 4);
  EXPECT_DOUBLE_EQ(mm.cost.flops, 1e9);
  RooflinePlace p = place(mm, round_roofline());
  ASSERT_TRUE(p.costed);
  EXPECT_DOUBLE_EQ(p.intensity, 100);
  EXPECT_DOUBLE_EQ(p.flops_per_s, 1e9 / 4e-3);  // 1 GFLOP in 4 ms
  // Intensity 100 is past the matrix ridge (10 FLOP/B): the roof is the 100 GFLOP/s peak,
  // 1 GFLOP takes 10 ms there, and 4 ms is 250% of it (made-up figures beat the roof).
  EXPECT_DOUBLE_EQ(p.roof, 100e9);
  EXPECT_FALSE(p.memory_bound);
  EXPECT_DOUBLE_EQ(p.ms_at_roof, 10);
  // The FLOP-free op is placed by bandwidth: 20 MB at 10 GB/s is 2 ms, 3 ms is 2/3 of the roof.
  RooflinePlace e = place(table.rows[1], round_roofline());
  EXPECT_TRUE(e.memory_bound);
  EXPECT_DOUBLE_EQ(e.ms_at_roof, 2);
  EXPECT_NEAR(e.of_roof, 2.0 / 3.0, 1e-12);
  EXPECT_FALSE(place(table.rows[2], round_roofline()).costed);

  const std::string text = format_op_table(table, round_roofline());
  EXPECT_NE(text.find("outside ops 2.000 ms (20.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("(no cost model)"), std::string::npos) << text;
  EXPECT_NE(text.find("memory"), std::string::npos) << text;
}

TEST(OpTable, AmdahlGivesTheStepWithOneOpAtItsRoof) {
  // A memory-bound op of 6 ms whose roof is 1 ms (10 MB at 10 GB/s), in a 10 ms step:
  // at its roof the step is 5 ms, twice as fast.
  ProfiledStep step;
  step.ms = 10;
  step.ops = {{"layer_norm", OpPass::forward, {1e6, 10e6, false}, 6.0}};
  OpTable table = op_table({step});
  std::vector<AmdahlRow> rows = amdahl_rows(table, round_roofline());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].label, "layer_norm fwd");
  EXPECT_DOUBLE_EQ(rows[0].ms_at_roof, 1);
  EXPECT_DOUBLE_EQ(rows[0].step_ms_after, 5);
  EXPECT_DOUBLE_EQ(rows[0].speedup, 2);
}

TEST(OpTable, RooflineSvgHasAPointPerOpTheRoofsAndTheRidges) {
  std::vector<ProfiledStep> steps = made_up_steps();
  steps[0].ops.push_back({"softmax", OpPass::forward, {5e6, 8e6, false}, 0.5});
  OpTable table = op_table(steps);
  const std::string path = (std::filesystem::temp_directory_path() / "precis_roofline_test.svg").string();
  write_roofline_svg(path, table, round_roofline(), "test");
  std::ifstream in(path);
  std::stringstream svg;
  svg << in.rdbuf();
  // matmul and softmax have FLOPs; the FLOP-free and the uncosted ops have no place.
  EXPECT_EQ(count(svg.str(), "class=\"point\""), 2u) << svg.str();
  EXPECT_NE(svg.str().find("<title>matmul fwd</title>"), std::string::npos);
  EXPECT_NE(svg.str().find("<title>softmax fwd</title>"), std::string::npos);
  EXPECT_EQ(count(svg.str(), "class=\"line\""), 2u);  // matrix and vector roofs
  EXPECT_EQ(count(svg.str(), "class=\"mark\""), 2u);  // their ridges
  EXPECT_NE(svg.str().find("matrix ridge 10 FLOP/B"), std::string::npos) << svg.str();
  EXPECT_NE(svg.str().find("vector ridge 1 FLOP/B"), std::string::npos) << svg.str();
}

TEST(OpTable, TinyGpt2OnTheCpuAddsUpToTheStep) {
  // Sized so that the ops' work (~tens of ms a step) dwarfs the host's between them even on 2
  // busy cores: at 64 wide and 2 x 32 tokens the gaps were 3-12% idle and 44% under ctest -j2.
  const int64_t B = 8, T = 64;
  TrainConfig config =
      test::demo_config("op_profile", {"model.n_layer=2", "model.n_head=4", "model.n_embd=128", "model.block_size=64",
                                       "batch.micro_batch=8", "batch.seq_len=64", "max_steps=4", "log_interval=4",
                                       "eval_interval=0", "checkpoint.save_final=false", "model.attention=reference"});
  Trainer trainer(config);
  OpProfile profile(Device::cpu());
  trainer.profile_ops(&profile, 2);
  trainer.run();
  ASSERT_EQ(profile.steps().size(), 3u);
  OpTable table = op_table(profile.steps());
  // The ops are the step, but for the host work between them (data, autograd's bookkeeping).
  EXPECT_LE(table.op_ms, table.step_ms);
  EXPECT_GT(table.op_ms, 0.85 * table.step_ms) << format_op_table(table, Roofline{1e11, 1e11, 1e10, "test"});
  // Every forward product of the model: 2 x its matmul parameters per token, plus the
  // epilogues (biases, gelu) and the attention's products, which come on top.
  const models::GPT2Config& model = trainer.gpt2().config();
  const double C = static_cast<double>(model.n_embd), tokens = static_cast<double>(B * T);
  const double products =
      2 * tokens *
      (static_cast<double>(model.n_layer) * 12 * C * C + static_cast<double>(model.padded_vocab_size()) * C);
  double linear_flops = 0, attention_flops = 0, adamw_flops = 0;
  for (const OpRow& r : table.rows) {
    if (r.op == "adamw" && r.pass == OpPass::step) adamw_flops += r.cost.flops;
    if (r.pass != OpPass::forward) continue;
    if (r.op.rfind("linear", 0) == 0) linear_flops += r.cost.flops;
    if (r.op == "attention") attention_flops += r.cost.flops;
  }
  EXPECT_GE(linear_flops, products);
  EXPECT_LE(linear_flops, 1.05 * products);
  // Reference attention: 4 T^2 C per layer and sequence for its two products, + 5 per score.
  const double scores = static_cast<double>(model.n_layer) * B * model.n_head * T * T;
  // AdamW: 16 FLOPs per parameter, once per step.
  EXPECT_DOUBLE_EQ(adamw_flops, 16.0 * static_cast<double>(trainer.gpt2().num_parameters()));
  EXPECT_DOUBLE_EQ(attention_flops, static_cast<double>(model.n_layer) * B * 4 * T * T * C + 5 * scores);
}
