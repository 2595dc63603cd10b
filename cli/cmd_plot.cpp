// precis plot RUN_DIR [RUN_DIR ...] [--out FILE.svg] [--csv FILE.csv]: the runs' metrics.jsonl
// as SVG panels, one line per run (train/run_plot.h), and the same numbers as CSV.
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/usage.h"
#include "train/run_plot.h"

namespace precis::cli {

int plot_command(const Args& args) {
  Options o = parse_options(args, {"out", "csv"}, "plot");
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
  return 0;
}

}  // namespace precis::cli
