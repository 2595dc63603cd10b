// precis eval on a tiny model the test trains: the loss of the run's own validation batches
// must be the one training logged, --data as a shard or as text must read the same tokens,
// and the perplexity is exp(loss).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json.h"
#include "support/cli.h"

namespace fs = std::filesystem;

namespace {

// The value after "result: ... key=" in precis eval's last line.
double result_value(const std::string& output, const std::string& key) {
  const size_t line = output.rfind("result: ");
  EXPECT_NE(line, std::string::npos) << output;
  const size_t at = output.find(" " + key + "=", line);
  EXPECT_NE(at, std::string::npos) << output;
  return std::stod(output.substr(at + key.size() + 2));
}

double last_val_loss(const fs::path& metrics) {
  std::ifstream in(metrics);
  double val = NAN;
  for (std::string line; std::getline(in, line);) {
    precis::Json row = precis::Json::parse(line);
    if (row.contains("val_loss")) val = row.at("val_loss").as_double();
  }
  return val;
}

}  // namespace

class CliEval : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A folder of this process's own: ctest runs each case as a process, several at once.
    dir_ = precis::testing::write_tiny_config("eval_" + std::to_string(::getpid()));
    auto r = precis::testing::run_cli("train " + (dir_ / "tiny.yaml").string() + " sample.tokens=0");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static precis::testing::CliResult eval(const std::string& args) {
    return precis::testing::run_cli("eval " + (dir_ / "out").string() + " --device cpu " + args);
  }
  static fs::path dir_;
};
fs::path CliEval::dir_;

TEST_F(CliEval, TheRunsValidationBatchesGiveTheLossTrainingLogged) {
  // tiny.yaml validates on eval_steps: 1 batch of 2 x 16 from the start of the split.
  auto r = eval("--steps 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double loss = result_value(r.output, "loss");
  EXPECT_NEAR(loss, last_val_loss(dir_ / "out" / "metrics.jsonl"), 1e-5) << r.output;
  EXPECT_NEAR(result_value(r.output, "perplexity"), std::exp(loss), 1e-3 * std::exp(loss));
  EXPECT_EQ(result_value(r.output, "tokens"), 32);
  // The checkpoint directory itself, and a bf16 forward (close, not equal).
  auto direct = precis::testing::run_cli("eval " + (dir_ / "out" / "checkpoints").string() + " --device cpu --steps 1");
  ASSERT_EQ(direct.exit_code, 0) << direct.output;
  EXPECT_DOUBLE_EQ(result_value(direct.output, "loss"), loss);
  auto bf16 = eval("--steps 1 --precision bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_NEAR(result_value(bf16.output, "loss"), loss, 0.05);
}

TEST_F(CliEval, DataAsTextIsTokenisedWithTheCheckpointsTokenizer) {
  // The char vocabulary of the whole text is the one training built, so the text and the
  // train shard `precis tokenize` writes from it start with the same tokens.
  auto shards = precis::testing::run_cli("tokenize --tokenizer char assets/tinyshakespeare.txt " +
                                         (dir_ / "shake").string() + " --val-fraction 0.1");
  ASSERT_EQ(shards.exit_code, 0) << shards.output;
  auto text = eval("--data assets/tinyshakespeare.txt --steps 3 --batch 4");
  auto shard = eval("--data " + (dir_ / "shake_train.bin").string() + " --steps 3 --batch 4");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  ASSERT_EQ(shard.exit_code, 0) << shard.output;
  EXPECT_DOUBLE_EQ(result_value(text.output, "loss"), result_value(shard.output, "loss"));
  EXPECT_EQ(result_value(text.output, "tokens"), 3 * 4 * 16);
}

TEST_F(CliEval, MistakesSayWhatToGive) {
  auto none = precis::testing::run_cli("eval");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  auto long_seq = eval("--seq 64");
  EXPECT_EQ(long_seq.exit_code, 1);
  EXPECT_NE(long_seq.output.find("eval: --seq 64 is longer than the model's block_size 16"), std::string::npos)
      << long_seq.output;
  auto not_a_checkpoint = precis::testing::run_cli("eval " + dir_.string() + " --device cpu");
  EXPECT_EQ(not_a_checkpoint.exit_code, 1) << not_a_checkpoint.output;
}

// model.init_from (train/pretrained.h) end to end: a run started from this run's weights with
// a learning rate too small to move an fp32 weight evaluates exactly as its source.
TEST_F(CliEval, InitFromStartsAFreshRunFromTheWeights) {
  const std::string finetune = (dir_ / "finetune").string();
  auto r = precis::testing::run_cli("train " + (dir_ / "tiny.yaml").string() +
                                    " model.init_from=" + (dir_ / "out").string() + " out_dir=" + finetune +
                                    " optimizer.lr=1e-30 schedule.kind=constant max_steps=1 sample.tokens=0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("init_from: Hugging Face / Precis checkpoint weights of " + (dir_ / "out").string()),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("step 1/1"), std::string::npos) << "a fresh run, from step 0: " << r.output;
  auto source = eval("--steps 2");
  auto tuned = precis::testing::run_cli("eval " + finetune + " --device cpu --steps 2");
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_DOUBLE_EQ(result_value(tuned.output, "loss"), result_value(source.output, "loss"));

  auto contradiction = precis::testing::run_cli("train " + (dir_ / "tiny.yaml").string() + " model.init_from=" +
                                                (dir_ / "out").string() + " out_dir=" + finetune + "2 model.n_embd=32");
  EXPECT_EQ(contradiction.exit_code, 1);
  EXPECT_NE(contradiction.output.find("'model.n_embd' (32) contradicts the weights of 'model.init_from' (16 in"),
            std::string::npos)
      << contradiction.output;
}
