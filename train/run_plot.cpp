#include "train/run_plot.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/json.h"

namespace precis::train {

namespace fs = std::filesystem;

namespace {

struct MetricAxis {
  const char* key;
  const char* title;
  const char* y_label;
  bool log2;  // the loss scale spans 2^0..2^24: its exponent is what can be read
};

const std::vector<MetricAxis>& axes() {
  static const std::vector<MetricAxis> list = {
      {"loss", "training loss", "loss", false},
      {"val_loss", "validation loss", "loss", false},
      {"lr", "learning rate", "lr", false},
      {"grad_norm", "gradient norm (before clipping)", "norm", false},
      {"loss_scale", "loss scale", "log2 of the scale", true},
      {"skipped_steps", "skipped steps (inf/nan gradients), total", "steps", false},
      {"tokens_per_s", "throughput", "tokens/s", false},
      {"images_per_s", "throughput", "images/s", false},
  };
  return list;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

const std::vector<std::string>& plotted_metrics() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const MetricAxis& a : axes()) out.push_back(a.key);
    return out;
  }();
  return keys;
}

RunMetrics read_run_metrics(const std::string& run_dir_or_file) {
  fs::path path(run_dir_or_file);
  if (fs::is_directory(path)) path /= "metrics.jsonl";
  std::ifstream in(path);
  PRECIS_CHECK(in.is_open(), "plot: cannot read '", path.string(),
               "': give a run folder (out_dir of `precis train`) or its metrics.jsonl");
  RunMetrics run;
  fs::path folder = path.parent_path();
  run.label = (folder.empty() ? fs::current_path() : fs::absolute(folder)).filename().string();
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    Json row;
    try {
      row = Json::parse(line, path.string() + ":" + std::to_string(line_number));
    } catch (const Error& e) {
      // A run killed mid-write leaves a torn last line; any other bad line is an error.
      if (in.peek() == EOF) break;
      throw;
    }
    PRECIS_CHECK(row.is_object() && row.contains("step"), "plot: ", path.string(), ":", line_number,
                 ": a metrics row without a step");
    const int64_t step = row.at("step").as_int();
    for (const std::string& key : plotted_metrics())
      if (row.contains(key)) run.values[key][step] = row.at(key).as_double();
  }
  PRECIS_CHECK(!run.values.empty(), "plot: '", path.string(), "' holds no metrics rows yet");
  return run;
}

std::vector<PlotPanel> metric_panels(const std::vector<RunMetrics>& runs) {
  std::vector<PlotPanel> panels;
  for (const MetricAxis& axis : axes()) {
    PlotPanel panel{axis.title, "step", axis.y_label, {}};
    for (const RunMetrics& run : runs) {
      auto found = run.values.find(axis.key);
      if (found == run.values.end()) continue;
      PlotSeries series{run.label, {}, {}};
      for (const auto& [step, value] : found->second) {
        series.x.push_back(static_cast<double>(step));
        series.y.push_back(axis.log2 ? std::log2(value) : value);
      }
      panel.series.push_back(std::move(series));
    }
    if (!panel.series.empty()) panels.push_back(std::move(panel));
  }
  return panels;
}

void write_metrics_svg(const std::string& path, const std::string& title, const std::vector<RunMetrics>& runs) {
  write_svg_panels(path, title, metric_panels(runs));
}

void write_metrics_csv(const std::string& path, const std::vector<RunMetrics>& runs) {
  std::string text = "run,step";
  for (const std::string& key : plotted_metrics()) text += "," + key;
  text += "\n";
  char number[32];
  for (const RunMetrics& run : runs) {
    std::set<int64_t> steps;
    for (const auto& [key, by_step] : run.values)
      for (const auto& [step, value] : by_step) steps.insert(step);
    for (int64_t step : steps) {
      text += csv_field(run.label) + "," + std::to_string(step);
      for (const std::string& key : plotted_metrics()) {
        text += ",";
        auto metric = run.values.find(key);
        if (metric == run.values.end()) continue;
        auto value = metric->second.find(step);
        if (value == metric->second.end()) continue;
        std::snprintf(number, sizeof number, "%.9g", value->second);
        text += number;
      }
      text += "\n";
    }
  }
  write_plot_file(path, text);
}

}  // namespace precis::train
