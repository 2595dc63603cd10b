// `precis profile`, `precis bench gpt2 --profile` and `precis bench resnet --profile` on the
// CPU: the per-op table, the Amdahl table and the roofline plot come out, the table's ops and
// the time outside them add up to the step, profile.tsv holds the same figures, and wrong
// arguments are one clear line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "support/cli.h"

namespace fs = std::filesystem;
using precis::testing::run_cli;
using precis::testing::write_tiny_config;

namespace {

// The "step S ms (mean of N): ops O ms (P%), outside ops R ms (Q%" line.
struct StepLine {
  double step = 0, ops = 0, outside = 0;
  bool found = false;
};
StepLine step_line(const std::string& output) {
  std::smatch m;
  StepLine s;
  if (std::regex_search(output, m,
                        std::regex(R"(step ([0-9.]+) ms \(mean of [0-9]+\): ops ([0-9.]+) ms \([0-9.]+%\), outside )"
                                   R"(ops (-?[0-9.]+) ms)"))) {
    s = {std::stod(m[1]), std::stod(m[2]), std::stod(m[3]), true};
  }
  return s;
}

// Runs `precis bench MODEL_ARGS --profile --out OUT` (OUT made empty) on the CPU and checks that
// it succeeds and prints the op table after the bench's figures ("==== precis bench NAME ====").
precis::testing::CliResult run_bench_profile(const std::string& name, const std::string& model_args,
                                             const fs::path& out) {
  fs::remove_all(out);
  auto r = run_cli("bench " + name + " " + model_args + " --device cpu --profile --out " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  size_t figures = r.output.find("==== precis bench " + name + " ===="), table = r.output.find("==== ops per step");
  EXPECT_NE(figures, std::string::npos) << r.output;
  EXPECT_NE(table, std::string::npos) << r.output;
  EXPECT_LT(figures, table) << r.output;
  return r;
}

}  // namespace

TEST(ProfileCommand, PrintsTheOpTablesAndWritesTheRoofline) {
  fs::path dir = write_tiny_config("profile");
  auto r = run_cli("profile " + (dir / "tiny.yaml").string() + " --steps 2 --warmup 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* label : {"==== ops per step", "linear", "fwd", "bwd", "% roof", "==== Amdahl",
                            "roofs (this CPU: measured", "roofline     "})
    EXPECT_NE(r.output.find(label), std::string::npos) << label << "\n" << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\nadamw +step +1 )"))) << r.output;  // once per step
  StepLine s = step_line(r.output);
  ASSERT_TRUE(s.found) << r.output;
  EXPECT_NEAR(s.ops + s.outside, s.step, 0.002 + 1e-6 * s.step);
  EXPECT_GE(s.outside, 0.0);
  EXPECT_TRUE(fs::exists(dir / "out" / "roofline.svg"));
  // No checkpoint or sample: the profile changes nothing on disk but the metrics and the plot.
  EXPECT_FALSE(fs::exists(dir / "out" / "checkpoints")) << r.output;
}

TEST(ProfileCommand, BenchProfilePrintsTheTablesAfterTheFigures) {
  const fs::path out = fs::temp_directory_path() / "precis_bench_profile";
  auto r = run_bench_profile("gpt2", "--preset tiny --batch 2 --seq 32 --precision fp32 --steps 2 --warmup 1", out);
  EXPECT_TRUE(step_line(r.output).found) << r.output;
  EXPECT_TRUE(fs::exists(out / "roofline.svg"));
}

// ResNet's step is all ops on the CPU (the optimizer's gradient norm and update included), so
// the ops cover the step but for the host's glue; profile.tsv repeats the step and the ops.
TEST(ProfileCommand, BenchResnetProfileCoversTheStepAndWritesTheTsv) {
  const fs::path out = fs::temp_directory_path() / "precis_bench_resnet_profile";
  auto r =
      run_bench_profile("resnet", "--model resnet18 --batch 2 --image 16 --precision fp32 --steps 2 --warmup 1", out);
  ASSERT_EQ(r.exit_code, 0);
  for (const char* label : {"==== Amdahl", "==== memory over the last profiled step", "roofline     "})
    EXPECT_NE(r.output.find(label), std::string::npos) << label << "\n" << r.output;
  for (const char* op : {R"(\nconv2d +fwd +20 )", R"(\nconv2d +bwd +20 )", R"(\nbatch_norm_add_relu +fwd +8 )",
                         R"(\nsgd +step +1 )", R"(\ngrad_norm +step +1 )"})
    EXPECT_TRUE(std::regex_search(r.output, std::regex(op))) << op << "\n" << r.output;
  StepLine s = step_line(r.output);
  ASSERT_TRUE(s.found) << r.output;
  EXPECT_NEAR(s.ops + s.outside, s.step, 0.002 + 1e-6 * s.step);
  EXPECT_GE(s.ops, 0.95 * s.step) << r.output;

  std::ifstream tsv(out / "profile.tsv");
  ASSERT_TRUE(tsv.good()) << r.output;
  std::string line;
  double step_ms = -1, op_ms = 0;
  int op_rows = 0;
  while (std::getline(tsv, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("kind\t", 0) == 0) continue;
    std::istringstream fields(line);
    std::string kind, op, name, calls, ms;
    ASSERT_TRUE(std::getline(fields, kind, '\t') && std::getline(fields, op, '\t') &&
                std::getline(fields, name, '\t') && std::getline(fields, calls, '\t') && std::getline(fields, ms))
        << line;
    if (kind == "step") step_ms = std::stod(ms);
    if (kind == "op") op_ms += std::stod(ms), ++op_rows;
    EXPECT_NE(kind, "kernel") << "no kernels are traced on the CPU: " << line;
  }
  EXPECT_NEAR(step_ms, s.step, 0.002);
  EXPECT_NEAR(op_ms, s.ops, 0.001 * op_rows + 0.002);
}

TEST(ProfileCommand, WrongArgumentsAreOneLine) {
  auto none = run_cli("profile");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.output.find("profile: give a config file"), std::string::npos) << none.output;
  fs::path dir = write_tiny_config("profile_args");
  auto steps = run_cli("profile " + (dir / "tiny.yaml").string() + " --steps 0");
  EXPECT_EQ(steps.exit_code, 1);
  EXPECT_NE(steps.output.find("profile: --steps must be an integer >= 1, got '0'"), std::string::npos) << steps.output;
  auto graphs = run_cli("bench gpt2 --preset tiny --device cpu --profile --cuda-graphs");
  EXPECT_EQ(graphs.exit_code, 1);
  EXPECT_NE(graphs.output.find("set cuda_graphs=false"), std::string::npos) << graphs.output;
  auto resnet_graphs = run_cli("bench resnet --device cpu --profile --cuda-graphs");
  EXPECT_EQ(resnet_graphs.exit_code, 1);
  EXPECT_NE(resnet_graphs.output.find("set cuda_graphs=false"), std::string::npos) << resnet_graphs.output;
}
