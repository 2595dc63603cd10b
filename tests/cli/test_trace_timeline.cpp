// scripts/trace_timeline.py on a hand-written trace of one step (the format train/step_trace.cpp
// writes): each stream's busy time, the memsets still in the step, each with its bytes and the
// kernels on its stream just before and after it, and the compute stream's idle gaps, longest
// first. Needs python3 only.
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

// A trace of a compute stream: kernel_a, a 4-byte memset, kernel_b, a 64-byte memset, kernel_c
// (times in us); `with_memsets` false leaves the memsets out.
fs::path write_trace(const std::string& file, bool with_memsets) {
  const fs::path dir = fs::temp_directory_path() / "precis_trace_timeline";
  fs::create_directories(dir);
  std::ofstream out(dir / file);
  out << R"json({"traceEvents": [
  {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "stream 7 (compute)"}},
  {"ph": "X", "name": "step 3", "cat": "step", "pid": 0, "tid": 0, "ts": 0, "dur": 100},
  {"ph": "X", "name": "kernel_a", "cat": "kernel", "pid": 1, "tid": 7, "ts": 10, "dur": 20},
  {"ph": "X", "name": "kernel_b", "cat": "kernel", "pid": 1, "tid": 7, "ts": 40, "dur": 20},
  {"ph": "X", "name": "kernel_c", "cat": "kernel", "pid": 1, "tid": 7, "ts": 70, "dur": 20})json";
  if (with_memsets)
    out << R"json(,
  {"ph": "X", "name": "Memset", "cat": "memset", "pid": 1, "tid": 7, "ts": 32, "dur": 1.5, "args": {"bytes": 4}},
  {"ph": "X", "name": "Memset", "cat": "memset", "pid": 1, "tid": 7, "ts": 62, "dur": 2.5, "args": {"bytes": 64}})json";
  out << "\n]}\n";
  return dir / file;
}

std::string timeline(const fs::path& trace) {
  const auto r =
      run_command("python3 " + std::string(PRECIS_SOURCE_DIR) + "/scripts/trace_timeline.py " + trace.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

}  // namespace

TEST(TraceTimeline, ListsEachMemsetWithItsBytesAndItsNeighbours) {
  if (!python_available()) GTEST_SKIP() << "no python3 here; scripts/trace_timeline.py needs it";
  const std::string out = timeline(write_trace("memsets.json", true));
  EXPECT_NE(out.find("memsets: 2, 4.0 us together"), std::string::npos) << out;
  // In time order, the stream's kernels either side of each.
  const size_t first = out.find("         4    1.5  stream 7 (compute) / kernel_a / kernel_b");
  const size_t second = out.find("        64    2.5  stream 7 (compute) / kernel_b / kernel_c");
  EXPECT_NE(first, std::string::npos) << out;
  EXPECT_NE(second, std::string::npos) << out;
  EXPECT_LT(first, second) << out;
  // kernel_a ends at 30 us, the memset runs 32-33.5, kernel_b starts at 40: gaps of 2 and 6.5.
  EXPECT_NE(out.find("idle gaps on stream 7 (compute): 4, 16.0 us together"), std::string::npos) << out;
  const size_t longest = out.find("    0.034     6.5  Memset -> kernel_b");
  const size_t next = out.find("    0.065     5.5  Memset -> kernel_c");
  EXPECT_NE(longest, std::string::npos) << out;
  EXPECT_NE(next, std::string::npos) << out;
  EXPECT_LT(longest, next) << "longest first:\n" << out;
}

TEST(TraceTimeline, SaysWhenNoMemsetIsLeft) {
  if (!python_available()) GTEST_SKIP() << "no python3 here; scripts/trace_timeline.py needs it";
  const std::string out = timeline(write_trace("no_memsets.json", false));
  EXPECT_NE(out.find("memsets: none"), std::string::npos) << out;
  EXPECT_NE(out.find("idle gaps on stream 7 (compute): 2, 20.0 us together"), std::string::npos) << out;
  EXPECT_NE(out.find("stream 7 (compute)"), std::string::npos) << out;
}
