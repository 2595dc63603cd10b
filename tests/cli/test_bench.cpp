// `precis bench gpt2` on the CPU with the tiny preset: the figures block and
// the machine-readable last line agree with each other, warm-up is left out,
// nothing is checkpointed, and wrong arguments are one clear line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/json.h"
#include "support/cli.h"

namespace fs = std::filesystem;
using precis::Json;
using precis::testing::run_cli;

namespace {

// The key=value pairs of the line starting with "result:".
std::map<std::string, std::string> result_fields(const std::string& output) {
  std::map<std::string, std::string> fields;
  size_t at = output.rfind("\nresult: ");
  if (at == std::string::npos) return fields;
  std::istringstream line(output.substr(at + 9, output.find('\n', at + 1) - at - 9));
  std::string pair;
  while (line >> pair) {
    size_t eq = pair.find('=');
    if (eq != std::string::npos) fields[pair.substr(0, eq)] = pair.substr(eq + 1);
  }
  return fields;
}

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("precis_bench_" + name);
  fs::remove_all(dir);
  return dir;
}

}  // namespace

TEST(Bench, TinyPresetOnTheCpuPrintsTheFigures) {
  fs::path dir = fresh_dir("cpu");
  auto r = run_cli(
      "bench gpt2 --preset tiny --batch 2 --seq 32 --precision fp32 --steps 2 --warmup 1 --device cpu "
      "--out " +
      dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* label : {"==== precis bench gpt2 ====", "tokens/s", "ms/step", "forward", "backward", "optimizer",
                            "achieved", "MFU          n/a", "peak memory", "measured     2 steps after 1 warm-up"})
    EXPECT_NE(r.output.find(label), std::string::npos) << label << "\n" << r.output;

  std::map<std::string, std::string> f = result_fields(r.output);
  ASSERT_FALSE(f.empty()) << r.output;
  EXPECT_EQ(f["device"], "cpu");
  EXPECT_EQ(f["preset"], "tiny");
  EXPECT_EQ(f["steps"], "2");
  EXPECT_EQ(f["mfu"], "n/a");
  // tokens/s is the batch's tokens over the mean step time.
  double ms = std::stod(f["ms_per_step"]), tokens_per_s = std::stod(f["tokens_per_s"]);
  EXPECT_GT(ms, 0);
  EXPECT_NEAR(tokens_per_s, 2 * 32 * 1000.0 / ms, 1.0 + 1e-3 * tokens_per_s);
  // Phases are parts of a step.
  double phases =
      std::stod(f["data_ms"]) + std::stod(f["forward_ms"]) + std::stod(f["backward_ms"]) + std::stod(f["optimizer_ms"]);
  EXPECT_GT(phases, 0);
  EXPECT_LE(phases, ms * 1.01);
  EXPECT_GT(std::stod(f["peak_gib"]), 0);
  // The exact peak (ZeRO-1's memory bar is read to the MiB) agrees with the GiB figure and holds
  // the optimizer's state: AdamW's two f32 moments of the tiny model's ~6.6M parameters (50257 x
  // 128 token embeddings and two 128-wide layers).
  const double peak_bytes = std::stod(f["peak_bytes"]), state_bytes = std::stod(f["optimizer_state_bytes"]);
  EXPECT_NEAR(peak_bytes / (1 << 30), std::stod(f["peak_gib"]), 0.0006);
  EXPECT_GE(state_bytes, 2 * 4 * 6.4e6);
  EXPECT_LE(state_bytes, 2 * 4 * 7.0e6);
  EXPECT_GE(peak_bytes, state_bytes);

  EXPECT_TRUE(fs::exists(dir / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir / "checkpoints")) << "the benchmark writes no checkpoint";
  // Three steps ran (one warm-up), logged at the warm-up boundary and at the end.
  EXPECT_NE(r.output.find("step 1/3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 3/3"), std::string::npos) << r.output;
}

// `precis bench resnet` on the CPU at a toy size: the figures and the record agree, images/s
// is the batch over the measured step time.
TEST(Bench, ResnetOnTheCpuPrintsImagesPerSecond) {
  fs::path dir = fresh_dir("resnet");
  auto r = run_cli(
      "bench resnet --model resnet18 --batch 2 --image 8 --steps 2 --warmup 1 --precision fp32 "
      "--device cpu --out " +
      dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("==== precis bench resnet ===="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ResNet-18 (CIFAR stem)"), std::string::npos) << r.output;
  auto f = result_fields(r.output);
  ASSERT_FALSE(f.empty()) << r.output;
  EXPECT_EQ(f["bench"], "resnet");
  EXPECT_EQ(f["channels_last"], "false");
  EXPECT_EQ(f["steps"], "2");
  const double ms = std::stod(f["ms_per_step"]), images_per_s = std::stod(f["images_per_s"]);
  EXPECT_NEAR(images_per_s, 2 * 1000.0 / ms, 1.0 + 1e-3 * images_per_s);
  EXPECT_GT(std::stod(f["forward_ms"]) + std::stod(f["backward_ms"]), 0);
  // The measured steps' own peak (PyTorch's reading) is at most the run's; the metrics' rows
  // carry each interval's.
  EXPECT_GT(std::stod(f["measured_peak_gib"]), 0);
  EXPECT_LE(std::stod(f["measured_peak_gib"]), std::stod(f["peak_gib"]));
  std::ifstream metrics(dir / "metrics.jsonl");
  std::string row;
  for (std::string line; std::getline(metrics, line);) row = line;
  const Json last = Json::parse(row);
  EXPECT_LE(last.at("interval_peak_memory_bytes").as_int(), last.at("peak_memory_bytes").as_int());
  EXPECT_FALSE(fs::exists(dir / "checkpoints")) << "the benchmark writes no checkpoint";
  auto bad = run_cli("bench resnet --model vgg16");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("bench: unknown --model 'vgg16' (known: resnet18, resnet34, resnet50)"), std::string::npos)
      << bad.output;
}

TEST(Bench, ConfigSettingsAfterTheModelApplyToTheRun) {
  fs::path dir = fresh_dir("settings");
  auto r = run_cli(
      "bench gpt2 batch.grad_accum=2 --preset tiny --batch 2 --seq 32 --precision fp32 --steps 1 --warmup 1 "
      "--device cpu --out " +
      dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, std::string> f = result_fields(r.output);
  ASSERT_FALSE(f.empty()) << r.output;
  // Two micro-batches of 2 x 32 tokens a step.
  double ms = std::stod(f["ms_per_step"]), tokens_per_s = std::stod(f["tokens_per_s"]);
  EXPECT_NEAR(tokens_per_s, 2 * 2 * 32 * 1000.0 / ms, 1.0 + 1e-3 * tokens_per_s);

  auto bad = run_cli("bench gpt2 --preset tiny --device cpu distributed.bucket=5");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("distributed.bucket"), std::string::npos) << bad.output;
}

// A bad value is an error (exit 1); a command line that does not fit is a usage error (exit 2,
// the message followed by the command's usage).
TEST(Bench, WrongArgumentsAreOneClearLine) {
  struct Case {
    std::string args, message;
    int exit_code = 1;
  };
  std::vector<Case> cases = {
      {"bench", "bench: give the model to benchmark, gpt2, resnet or attention (none given)", 2},
      {"bench llama", "bench: give the model to benchmark, gpt2, resnet or attention (got 'llama')", 2},
      {"bench gpt2 gpt2", "bench: give the model to benchmark, gpt2, resnet or attention (got 'gpt2 gpt2')", 2},
      {"bench gpt2 --preset huge",
       "bench: unknown --preset 'huge' (known: gpt2, gpt2-medium, gpt2-large, gpt2-xl, tiny)"},
      {"bench gpt2 --batch 0", "bench: --batch must be an integer >= 1, got '0'"},
      {"bench gpt2 --steps ten", "bench: --steps must be an integer >= 1, got 'ten'"},
      {"bench gpt2 --warmup -1", "bench: --warmup must be an integer >= 0, got '-1'"},
      {"bench gpt2 --batchsize 4", "bench: unknown option --batchsize", 2},
      {"bench gpt2 --precision fp8 --device cpu",
       "'precision.policy' must be one of fp32, tf32, fp16, bf16, bf16-pure"},
      {"bench gpt2 --attention fast --device cpu", "'model.attention' must be one of"},
      {"bench gpt2 --seq 0", "bench: --seq must be an integer >= 1, got '0'"},
      {"bench gpt2 --device tpu", "'device' must be one of auto, cpu, cuda, cuda:N, got 'tpu'"},
      {"bench gpt2 --zero 2 --device cpu", "'distributed.zero' must be 0 or 1, got 2"},
      {"bench gpt2 --preset tiny --device cpu --trace /no-such-dir/t.json",
       "cannot write profile.trace '/no-such-dir/t.json'"},
  };
  for (const Case& c : cases) {
    auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << c.args << "\n" << r.output;
  }
}
