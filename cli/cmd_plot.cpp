// precis plot RUN_DIR [RUN_DIR ...] [--out FILE.svg] [--csv FILE.csv] [--numerics FILE.svg]:
// the runs' metrics.jsonl as SVG panels, one line per run (train/run_plot.h), and the same
// numbers as CSV; --numerics draws the runs' numerics reports (numerics.jsonl) over the steps.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/json.h"
#include "train/run_plot.h"
#include "train/svg_plot.h"

namespace precis::cli {

namespace {

// One panel of the numerics plot: the rows of one kind, one of their fractions.
struct NumericsPanel {
  const char* kind;   // "act grad"
  const char* field;  // "fp16_subnormal"
  const char* title;
};

const NumericsPanel kNumericsPanels[] = {
    {"act grad", "fp16_subnormal", "activation gradients below fp16's normal range (%)"},
    {"act grad", "fp16_underflow", "activation gradients that round to 0 in fp16 (%)"},
    {"gradient", "fp16_subnormal", "weight gradients below fp16's normal range (%)"},
    {"update", "lost", "lost updates (%)"},
};

// Each report step's fraction of `field` over all elements of the rows of `kind` (the
// layers' fractions weighted by their element counts), as a percentage.
train::PlotSeries numerics_series(const std::string& label, const std::vector<Json>& rows, const NumericsPanel& panel) {
  std::map<int64_t, std::pair<double, double>> sums;  // step -> (sum of fraction x count, count)
  for (const Json& row : rows) {
    if (row.at("kind").as_string() != panel.kind || !row.contains(panel.field)) continue;
    auto& [weighted, count] = sums[row.at("step").as_int()];
    weighted += row.at(panel.field).as_double() * row.at("count").as_double();
    count += row.at("count").as_double();
  }
  train::PlotSeries s{label, {}, {}};
  for (const auto& [step, sum] : sums) {
    s.x.push_back(static_cast<double>(step));
    s.y.push_back(sum.second > 0 ? 100.0 * sum.first / sum.second : 0.0);
  }
  return s;
}

void write_numerics_svg(const std::string& path, const std::string& title, const std::vector<std::string>& run_dirs) {
  std::vector<train::PlotPanel> panels;
  for (const NumericsPanel& p : kNumericsPanels) panels.push_back({p.title, "step", "%", {}});
  for (const std::string& dir : run_dirs) {
    const std::filesystem::path file = std::filesystem::path(dir) / "numerics.jsonl";
    std::ifstream in(file);
    usage_check(in.good(), "plot",
                "--numerics: no " + file.string() + " (train with precision.report=true, or use `precis numerics`)");
    std::vector<Json> rows;
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      if (!line.empty()) rows.push_back(Json::parse(line, file.string() + ":" + std::to_string(n)));
    const std::string label = std::filesystem::path(dir).filename().string();
    for (size_t i = 0; i < panels.size(); ++i)
      panels[i].series.push_back(numerics_series(label, rows, kNumericsPanels[i]));
  }
  train::write_svg_panels(path, title, panels);
}

}  // namespace

int plot_command(const Args& args) {
  Options o = parse_options(args, {"out", "csv", "numerics"}, "plot");
  usage_check(!o.positional.empty(), "plot", "give at least one run folder (an out_dir of `precis train`)");
  std::vector<train::RunMetrics> runs;
  for (const std::string& run : o.positional) runs.push_back(train::read_run_metrics(run));
  std::filesystem::path first(o.positional[0]);
  if (!std::filesystem::is_directory(first)) first = first.parent_path();
  const std::string svg = o.get("out", (first / "metrics.svg").string());
  const std::string csv = o.get("csv", (first / "metrics.csv").string());
  std::string title = runs[0].label;
  for (size_t i = 1; i < runs.size(); ++i) title += " vs " + runs[i].label;
  train::write_metrics_svg(svg, title, runs);
  train::write_metrics_csv(csv, runs);
  std::cout << "written: " << svg << " (" << train::metric_panels(runs).size() << " panels), " << csv << "\n";
  const std::string numerics = o.get("numerics", "");
  if (!numerics.empty()) {
    write_numerics_svg(numerics, "numerics: " + title, o.positional);
    std::cout << "written: " << numerics << " (the numerics reports)\n";
  }
  return 0;
}

}  // namespace precis::cli
