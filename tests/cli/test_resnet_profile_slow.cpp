// bench/run-resnet-profile.sh end to end on the CPU (DEVICE=cpu: ResNet-18 at 16x16, B=2, PyTorch
// eager): Precis's bench and profile and scripts/torch_resnet_profile.py run, each log is kept,
// and the side-by-side category table comes last with both sides' convolutions in it. Needs
// python3 with torch and torchvision; skips, saying so, where they do not import.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>

#include "core/source_dir.h"
#include "support/cli.h"

namespace fs = std::filesystem;

TEST(ResnetProfileScript, RunsBothSidesAndPrintsTheCategoriesLast) {
  if (std::system("python3 -c 'import torch, torchvision' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 cannot import torch and torchvision (pip install torch torchvision), so the "
                    "PyTorch side of bench/run-resnet-profile.sh cannot run here";
  const fs::path out = fs::temp_directory_path() / "precis_resnet_profile_script";
  fs::remove_all(out);
  const auto r =
      precis::testing::run_command("DEVICE=cpu OUT_DIR=" + out.string() + " bash " + PRECIS_SOURCE_DIR +
                                   "/bench/run-resnet-profile.sh " + fs::path(PRECIS_CLI_PATH).parent_path().string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* file :
       {"precis-resnet18-graphs.log", "precis-resnet18-profile.log", "precis-resnet18-profile/profile.tsv",
        "torch-resnet18.log", "torch-resnet18.tsv", "torch-resnet18-trace.json.gz", "summary.txt"})
    EXPECT_TRUE(fs::exists(out / file)) << file << "\n" << r.output;
  const size_t table = r.output.rfind("ms per step by category ====");
  ASSERT_NE(table, std::string::npos) << r.output;
  const std::string last = r.output.substr(table);
  // Both sides' convolutions took time (Precis's conv2d ops, PyTorch's mkldnn convolutions).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(last, m, std::regex(R"(\nconvolution & fc +([0-9.]+) +[0-9.]+% +([0-9.]+) )"))) << last;
  EXPECT_GT(std::stod(m[1]), 0.0) << last;
  EXPECT_GT(std::stod(m[2]), 0.0) << last;
  for (const char* row : {"batch norm / elementwise", "optimizer", "copies & layout", "other", "sum (ops/ops)",
                          "step - sum (gaps, host)"})
    EXPECT_NE(last.find(row), std::string::npos) << row << "\n" << last;
  EXPECT_EQ(last.find("==== "), last.rfind("==== ")) << "the category table is not the last thing printed:\n" << last;
}
