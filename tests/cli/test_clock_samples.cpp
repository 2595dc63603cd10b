// scripts/clock_samples.py on hand-written nvidia-smi samples (the CSV scripts/clock-sampler.sh
// writes): only the samples where kernels ran at least half the time count (over 250 W in files
// without the utilization column), each GPU on its own line, the mean SM clock and
// power over them and over each third, the first and last temperature and the reasons seen;
// headers and "[N/A]" cells are skipped, and a missing file reads as no samples. Needs python3.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/source_dir.h"
#include "support/cli.h"

namespace {

namespace fs = std::filesystem;
using precis::testing::python_available;
using precis::testing::run_command;

std::string summed(const std::string& csv_text, const std::string& args = "") {
  const fs::path path = fs::temp_directory_path() / "precis_clock_samples.csv";
  std::ofstream(path) << csv_text;
  const auto r =
      run_command("python3 " + std::string(PRECIS_SOURCE_DIR) + "/scripts/clock_samples.py " + path.string() + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

}  // namespace

TEST(ClockSamples, AveragesEachGpusBusySamplesWholeAndByThirds) {
  if (!python_available()) GTEST_SKIP() << "no python3 here; scripts/clock_samples.py needs it";
  const std::string out = summed(
      "index, clocks.current.sm [MHz], power.draw [W], temperature.gpu, clocks_event_reasons.active\n"
      "0, 1980, 120.0, 35, 0x0000000000000000\n"  // start-up: under 250 W, left out
      "0, 1980, 600.0, 40, 0x0000000000000000\n"
      "1, 1900, 650.0, 38, 0x0000000000000000\n"
      "0, 1755, 690.0, 45, 0x0000000000000004\n"
      "0, [N/A], 700.0, 46, 0x0000000000000004\n"
      "0, 1701, 702.0, 47, 0x0000000000000004\n");
  EXPECT_NE(out.find("GPU 0: 3 busy samples, SM 1812 MHz (thirds 1980 1755 1701), 664 W (thirds 600 690 702), "
                     "40->47 C, reasons 0x0000000000000000 0x0000000000000004"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("GPU 1: 1 busy samples, SM 1900 MHz (thirds nan nan 1900), 650 W"), std::string::npos) << out;
}

// A launch-bound run keeps the card busy at low power: the utilization decides, not the watts.
TEST(ClockSamples, CountsTheSamplesWhereKernelsRanHalfTheTime) {
  if (!python_available()) GTEST_SKIP() << "no python3 here; scripts/clock_samples.py needs it";
  const std::string out = summed(
      "index, clocks.current.sm [MHz], power.draw [W], temperature.gpu, clocks_event_reasons.active, "
      "utilization.gpu [%]\n"
      "0, 1980, 80.0, 35, 0x0, 0\n"  // idle
      "0, 1980, 170.0, 40, 0x0, 98\n"
      "0, 1950, 175.0, 41, 0x0, 50\n"
      "0, 1900, 690.0, 42, 0x0, 49\n"       // the end of the run: under half, left out
      "0, 1800, 700.0, 43, 0x0, [N/A]\n");  // no utilization read: the watts decide
  EXPECT_NE(out.find("GPU 0: 3 busy samples, SM 1910 MHz (thirds 1980 1950 1800), 348 W"), std::string::npos) << out;
}

TEST(ClockSamples, NamesOnlyTheGpusAskedForAndReadsAMissingFileAsNoSamples) {
  if (!python_available()) GTEST_SKIP() << "no python3 here; scripts/clock_samples.py needs it";
  const std::string out = summed("0, 1980, 600.0, 40, 0x0\n1, 1900, 650.0, 38, 0x0\n", " 1");
  EXPECT_EQ(out,
            "GPU 1: 1 busy samples, SM 1900 MHz (thirds nan nan 1900), 650 W (thirds nan nan 650), 38->38 C, "
            "reasons 0x0\n");
  const auto missing = run_command("python3 " + std::string(PRECIS_SOURCE_DIR) +
                                   "/scripts/clock_samples.py /nonexistent/precis_clocks.csv 0");
  EXPECT_EQ(missing.exit_code, 0) << missing.output;
  EXPECT_EQ(missing.output, "GPU 0: no busy samples\n");
}
