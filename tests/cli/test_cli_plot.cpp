// precis plot: two tiny runs (fp32, and fp16 with loss scaling) drawn together; the CSV read
// back must hold every value of both metrics.jsonl files, and the SVG a line per run in each
// panel a run logged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/json.h"
#include "support/cli.h"

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split(const std::string& line, char separator) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  std::string field;
  while (std::getline(in, field, separator)) fields.push_back(field);
  if (!line.empty() && line.back() == separator) fields.push_back("");
  return fields;
}

// Trains the tiny config into DIR/out/<name> with a row per step and validation every 2 steps.
fs::path train_run(const fs::path& dir, const std::string& name, const std::string& precision) {
  fs::path out = dir / name;
  auto r = precis::testing::run_cli("train " + (dir / "tiny.yaml").string() + " out_dir=" + out.string() +
                                    " precision=" + precision + " log_interval=1 sample.tokens=0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return out;
}

}  // namespace

TEST(CliPlot, TwoRunsAsSvgPanelsAndACsvThatReadsBack) {
  fs::path dir = precis::testing::write_tiny_config("plot");
  fs::path fp32 = train_run(dir, "run-fp32", "fp32"), fp16 = train_run(dir, "run-fp16", "fp16");
  auto r = precis::testing::run_cli("plot " + fp32.string() + " " + fp16.string() + " --out " +
                                    (dir / "both.svg").string() + " --csv " + (dir / "both.csv").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The CSV: run,step,<metric>... with each run's rows; compare with metrics.jsonl itself.
  std::ifstream csv(dir / "both.csv");
  std::string header;
  std::getline(csv, header);
  const std::vector<std::string> columns = split(header, ',');
  ASSERT_GE(columns.size(), 3u);
  EXPECT_EQ(columns[0], "run");
  EXPECT_EQ(columns[1], "step");
  std::map<std::pair<std::string, int64_t>, std::vector<std::string>> rows;
  for (std::string line; std::getline(csv, line);) {
    std::vector<std::string> fields = split(line, ',');
    ASSERT_EQ(fields.size(), columns.size()) << line;
    rows[{fields[0], std::stoll(fields[1])}] = fields;
  }
  size_t compared = 0;
  for (const auto& [label, folder] : {std::pair{"run-fp32", fp32}, std::pair{"run-fp16", fp16}}) {
    std::ifstream metrics(folder / "metrics.jsonl");
    int64_t logged = 0;
    for (std::string line; std::getline(metrics, line); ++logged) {
      precis::Json row = precis::Json::parse(line);
      const int64_t step = row.at("step").as_int();
      ASSERT_TRUE(rows.count({label, step})) << label << " step " << step;
      const std::vector<std::string>& fields = rows[{label, step}];
      for (size_t c = 2; c < columns.size(); ++c) {
        if (!row.contains(columns[c])) {
          EXPECT_EQ(fields[c], "") << label << " " << columns[c];
          continue;
        }
        const double expected = row.at(columns[c]).as_double();
        EXPECT_NEAR(std::stod(fields[c]), expected, 1e-8 * std::max(1.0, std::fabs(expected)))
            << label << " step " << step << " " << columns[c];
        ++compared;
      }
    }
    EXPECT_EQ(logged, 4) << label;
  }
  EXPECT_GT(compared, 40u);
  // Only the fp16 run scales its loss; validation every 2 steps.
  auto cell = [&](const char* run, int64_t step, const char* column) {
    return rows[{run, step}][std::find(columns.begin(), columns.end(), column) - columns.begin()];
  };
  EXPECT_NE(cell("run-fp16", 1, "loss_scale"), "");
  EXPECT_EQ(cell("run-fp32", 1, "loss_scale"), "");
  EXPECT_EQ(cell("run-fp32", 1, "val_loss"), "");
  EXPECT_NE(cell("run-fp32", 2, "val_loss"), "");

  const std::string svg = read_file(dir / "both.svg");
  for (const char* panel : {"training loss", "validation loss", "learning rate", "gradient norm", "loss scale",
                            "skipped steps", "tokens/s"})
    EXPECT_NE(svg.find(panel), std::string::npos) << panel;
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t at = svg.find(needle); at != std::string::npos; at = svg.find(needle, at + 1)) ++n;
    return n;
  };
  // fp32: loss, val loss, lr, grad norm, tokens/s; fp16 also the loss scale and skipped steps.
  EXPECT_EQ(count("<title>run-fp32</title></polyline>"), 5u);
  EXPECT_EQ(count("<title>run-fp16</title></polyline>"), 7u);
}

TEST(CliPlot, DefaultsToTheFirstRunFolderAndNamesAMissingFile) {
  fs::path dir = precis::testing::write_tiny_config("plot_default");
  fs::path run = train_run(dir, "run", "fp32");
  auto r = precis::testing::run_cli("plot " + run.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(run / "metrics.svg"));
  EXPECT_TRUE(fs::exists(run / "metrics.csv"));
  fs::create_directories(dir / "nowhere");  // a folder without metrics.jsonl
  auto missing = precis::testing::run_cli("plot " + (dir / "nowhere").string());
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("plot: cannot read '" + (dir / "nowhere" / "metrics.jsonl").string() + "'"),
            std::string::npos)
      << missing.output;
}
