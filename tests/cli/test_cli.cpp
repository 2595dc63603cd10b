// The `precis` command line end to end: each subcommand on a tiny config, and
// the exit code and one-line message of a user mistake.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/cli.h"

namespace fs = std::filesystem;

namespace {

using Result = precis::testing::CliResult;
Result run(const std::string& args) { return precis::testing::run_cli(args); }
using precis::testing::write_tiny_config;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST(Cli, HelpListsTheCommands) {
  Result r = run("help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* command : {"train", "sample", "tokenize", "numerics", "sweep", "bench", "device"})
    EXPECT_NE(r.output.find(command), std::string::npos) << command;
}

TEST(Cli, TrainThenSampleFromTheCheckpoint) {
  fs::path dir = write_tiny_config("train");
  Result train = run("train " + (dir / "tiny.yaml").string() + " optimizer.lr=1e-3");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("step 4/4 100.0%"), std::string::npos) << train.output;
  EXPECT_NE(train.output.find("---- sample"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "out" / "metrics.jsonl"));
  Result sample = run("sample " + (dir / "out" / "checkpoints").string() + " --prompt ROMEO --tokens 5 --device cpu");
  ASSERT_EQ(sample.exit_code, 0) << sample.output;
  EXPECT_EQ(sample.output.rfind("ROMEO", 0), 0u) << sample.output;
}

TEST(Cli, TokenizeWritesShards) {
  fs::path dir = write_tiny_config("tokenize");
  Result r =
      run("tokenize --tokenizer char assets/tinyshakespeare.txt " + (dir / "shake").string() + " --val-fraction 0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "shake_train.bin"));
  EXPECT_TRUE(fs::exists(dir / "shake_val.bin"));
  EXPECT_TRUE(fs::exists(dir / "shake_vocab.json"));
}

TEST(Cli, SweepWritesATableAndPlots) {
  fs::path dir = write_tiny_config("sweep");
  Result r = run("sweep " + (dir / "tiny.yaml").string() + " --precisions fp32,bf16 max_steps=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string table = read_file(dir / "out" / "sweep.md");
  EXPECT_NE(table.find("| fp32 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| bf16 |"), std::string::npos) << table;
  const std::string svg = read_file(dir / "out" / "sweep.svg");
  for (const char* policy : {"fp32", "bf16"})
    EXPECT_NE(svg.find(std::string("<title>") + policy + "</title></polyline>"), std::string::npos) << policy;
  EXPECT_TRUE(fs::exists(dir / "out" / "sweep.csv"));
  EXPECT_TRUE(fs::exists(dir / "out" / "sweep-bf16" / "metrics.svg"));
}

TEST(Cli, NumericsPrintsTheReport) {
  fs::path dir = write_tiny_config("numerics");
  Result r = run("numerics " + (dir / "tiny.yaml").string() + " precision=fp16 max_steps=2 log_interval=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("numerics at step 1 (loss scale"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "out" / "numerics" / "numerics.jsonl"));
}

TEST(Cli, MistakesGiveOneClearLineAndTheirExitCode) {
  Result missing = run("train does-not-exist.yaml");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.output, "error: cannot read config file 'does-not-exist.yaml': No such file or directory\n");
  Result unknown = run("frobnicate");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("unknown command 'frobnicate'"), std::string::npos);
  fs::path dir = write_tiny_config("mistake");
  Result bad_override = run("train " + (dir / "tiny.yaml").string() + " optimizer.lr=fast");
  EXPECT_EQ(bad_override.exit_code, 1);
  EXPECT_NE(bad_override.output.find("'optimizer.lr' must be a number"), std::string::npos) << bad_override.output;
}

// --synthetic trains an image config's model on synthetic images: the CIFAR-10 config runs
// without the CIFAR-10 files, which without it are a clear error naming them.
TEST(Cli, TrainSyntheticRunsAnImageConfigWithoutItsDataset) {
  const fs::path dir = fs::temp_directory_path() / "precis_cli_synthetic";
  fs::remove_all(dir);
  const std::string config = "examples/configs/cifar10-resnet18.yaml";
  const std::string small =
      " device=cpu max_steps=1 batch.micro_batch=2 data.image_size=8 eval_interval=0 "
      "log_interval=1 data.dir=" +
      (dir / "no-cifar").string() + " out_dir=";
  Result synthetic = run("train " + config + " --synthetic" + small + (dir / "synthetic").string());
  ASSERT_EQ(synthetic.exit_code, 0) << synthetic.output;
  EXPECT_NE(synthetic.output.find("(synthetic)"), std::string::npos) << synthetic.output;
  EXPECT_NE(synthetic.output.find("step 1/1"), std::string::npos) << synthetic.output;
  Result without = run("train " + config + small + (dir / "cifar").string());
  EXPECT_EQ(without.exit_code, 1) << without.output;
  EXPECT_NE(without.output.find("data_batch_1.bin"), std::string::npos) << without.output;
}

TEST(Cli, SweepRunsCustomPolicyStringsAndSaysWhatWasNotEvaluated) {
  fs::path dir = write_tiny_config("sweep_custom");
  Result r = run("sweep " + (dir / "tiny.yaml").string() +
                 " --policy params=float32,compute=bfloat16,output=float32"
                 " --precisions 'fp32;params=float32,compute=float16,output=float32' max_steps=2 eval_interval=0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string table = read_file(dir / "out" / "sweep.md");
  for (const char* row : {"| params=float32,compute=bfloat16,output=float32 |", "| fp32 |",
                          "| params=float32,compute=float16,output=float32 |"})
    EXPECT_NE(table.find(row), std::string::npos) << row << "\n" << table;
  EXPECT_EQ(table.find("0.0000"), std::string::npos) << table;
  EXPECT_NE(table.find("| not evaluated |"), std::string::npos) << table;
  EXPECT_TRUE(fs::exists(dir / "out" / "sweep-params-float32_compute-bfloat16_output-float32" / "metrics.jsonl"));
  // On the CPU the 16-bit policies' speed is an emulation's.
  EXPECT_NE(table.find("On the CPU, fp16 and bf16 are emulated"), std::string::npos) << table;
  EXPECT_NE(table.find("the losses of params=float32,compute=bfloat16,output=float32, "
                       "params=float32,compute=float16,output=float32 are what"),
            std::string::npos)
      << table;
}
