// `precis formats` and `precis bench matmul` from the command line: the known encodings in
// the printed tables, the files of --out, and the usage errors (exit code 2).
#include <gtest/gtest.h>

#include <filesystem>

#include "support/cli.h"

namespace {

namespace fs = std::filesystem;
using precis::testing::run_cli;

TEST(CliFormats, PrintsTheKnownEncodingsAndWritesTheTableAndPlot) {
  const fs::path out = fs::temp_directory_path() / "precis_cli_formats";
  fs::remove_all(out);
  const auto r = run_cli("formats 65504 1 70000 1e-8 --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| fp16 | 65504 | `0 11110 1111111111` | 0x7BFF |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| bf16 | 1 | `0 01111111 0000000` | 0x3F80 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| fp16 | inf |"), std::string::npos);  // 70000 overflows
  EXPECT_NE(r.output.find("underflow: 0"), std::string::npos);    // 1e-8 in fp16
  EXPECT_NE(r.output.find("| fp8 e4m3 | 1/4/3 | 4 | 1.2 | 448 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| fp8 e5m2 | 1/5/2 | 3 | 0.9 | 57344 |"), std::string::npos) << r.output;
  EXPECT_NE(precis::testing::read_text_file(out / "formats.md").find("0x7BFF"), std::string::npos);
  EXPECT_NE(precis::testing::read_text_file(out / "formats.svg").find("</svg>"), std::string::npos);
}

TEST(CliFormats, RejectsWhatIsNotANumber) {
  const auto r = run_cli("formats 1.5 pi");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'pi' is not a number"), std::string::npos) << r.output;
}

TEST(CliBenchMatmul, TimesEachShapeAndDtypeOnTheCpuAndPlacesThemOnTheRoofline) {
  const fs::path out = fs::temp_directory_path() / "precis_cli_bench_matmul";
  fs::remove_all(out);
  const auto r =
      run_cli("bench matmul --device cpu --shapes tiny,8x16x32 --dtypes fp32,bf16 --iters 1 --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* row : {"| tiny | 64x64x64 | fp32 |", "| tiny | 64x64x64 | bf16 |", "| 8x16x32 | 8x16x32 | fp32 |",
                          "| 8x16x32 | 8x16x32 | bf16 |"})
    EXPECT_NE(r.output.find(row), std::string::npos) << row << "\n" << r.output;
  // 64^3 in fp32: 2 x 64^3 FLOPs over 3 x 64^2 x 4 bytes = 10.7 FLOPs per byte.
  EXPECT_NE(r.output.find("| 10.7 |"), std::string::npos) << r.output;
  const std::string svg = precis::testing::read_text_file(out / "roofline.svg");
  size_t points = 0;
  for (size_t at = svg.find("class=\"point\""); at != std::string::npos; at = svg.find("class=\"point\"", at + 1))
    ++points;
  EXPECT_EQ(points, 4u);
}

TEST(CliBenchMatmul, RejectsAnUnknownShapeOrDtype) {
  EXPECT_EQ(run_cli("bench matmul --device cpu --shapes 3x3").exit_code, 2);
  EXPECT_EQ(run_cli("bench matmul --device cpu --dtypes fp64").exit_code, 2);
}

}  // namespace
