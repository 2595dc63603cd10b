// A run's metrics.jsonl (train/step_report.h) as plots and a table: `precis plot` and the
// precision sweep draw runs with this. Each run is a folder with metrics.jsonl (or the file).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "train/svg_plot.h"

namespace precis::train {

// The metrics plotted, in panel order: metrics.jsonl's keys.
const std::vector<std::string>& plotted_metrics();

struct RunMetrics {
  std::string label;  // the run folder's name
  // metric -> step -> value, for the steps whose row has the metric. A step logged twice
  // (a resumed run redoing steps) keeps its last row.
  std::map<std::string, std::map<int64_t, double>> values;
};

// Reads RUN_DIR/metrics.jsonl (or the .jsonl file given); errors name the file and line.
RunMetrics read_run_metrics(const std::string& run_dir_or_file);

// One panel per metric that some run logged (loss, val loss, lr, grad norm, log2 of the loss
// scale, skipped steps, tokens/s or images/s), one line per run, steps on the x axis.
std::vector<PlotPanel> metric_panels(const std::vector<RunMetrics>& runs);
void write_metrics_svg(const std::string& path, const std::string& title, const std::vector<RunMetrics>& runs);
// run,step and a column per metric of plotted_metrics(); a value a row did not log is empty.
void write_metrics_csv(const std::string& path, const std::vector<RunMetrics>& runs);

}  // namespace precis::train
