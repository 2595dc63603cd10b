#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "train/config.h"
#include "train/run_plot.h"
#include "train/trainer.h"

namespace precis::cli {

namespace {

struct SweepRow {
  std::string policy;
  double train_loss = 0, val_loss = 0, items_per_s = 0;
  std::optional<double> val_accuracy;  // classification
  int64_t peak_bytes = 0, skipped = 0;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Median tokens/s over the log lines after the first (which includes warm-up).
double steady_items_per_s(const std::vector<train::StepReport>& reports) {
  std::vector<double> v;
  for (size_t i = reports.size() > 1 ? 1 : 0; i < reports.size(); ++i) v.push_back(reports[i].items_per_s);
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `unit`: what the throughput counts ("tokens", "images").
std::string markdown_table(const std::vector<SweepRow>& rows, const std::string& unit) {
  const bool accuracy = !rows.empty() && rows.front().val_accuracy.has_value();
  std::string out =
      "| precision | final train loss | final val loss |" + std::string(accuracy ? " val accuracy |" : "") + " " +
      unit + "/s | peak memory (MiB) | skipped steps |\n" + (accuracy ? "|---" : "") + "|---|---|---|---|---|---|\n";
  char line[256];
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "| %s | %.4f | %.4f |", r.policy.c_str(), r.train_loss, r.val_loss);
    out += line;
    if (accuracy) {
      std::snprintf(line, sizeof line, " %.2f%% |", 100.0 * r.val_accuracy.value_or(std::nan("")));
      out += line;
    }
    std::snprintf(line, sizeof line, " %.0f | %.1f | %lld |\n", r.items_per_s,
                  static_cast<double>(r.peak_bytes) / (1 << 20), static_cast<long long>(r.skipped));
    out += line;
  }
  return out;
}

}  // namespace

// Trains CONFIG once per precision policy and compares them.
int sweep_command(const Args& args) {
  std::vector<std::string> overrides;
  Args rest;
  for (const auto& a : args)
    (a.find('=') != std::string::npos && a.rfind("--", 0) != 0 ? overrides : rest).push_back(a);
  Options o = parse_options(rest, {"precisions"}, "sweep");
  usage_check(o.positional.size() == 1, "sweep", "give one config file");
  std::vector<std::string> policies = split_list(o.get("precisions", "fp32,tf32,fp16,bf16"));
  PRECIS_CHECK(!policies.empty(), "sweep: --precisions lists no policy");

  std::vector<SweepRow> rows;
  std::vector<train::RunMetrics> runs;
  std::string out_dir, unit = "tokens";
  for (const std::string& policy : policies) {
    std::vector<std::string> run_overrides = overrides;
    run_overrides.push_back("precision=" + policy);
    run_overrides.push_back("sample.tokens=0");
    train::TrainConfig config = train::load_config(o.positional[0], run_overrides);
    out_dir = config.out_dir;
    config.out_dir = (std::filesystem::path(out_dir) / ("sweep-" + policy)).string();
    std::cout << "==== sweep: " << policy << " ====" << std::endl;
    train::Trainer trainer(config);
    trainer.run();
    SweepRow row;
    row.policy = policy;
    row.train_loss = trainer.losses().empty() ? std::nan("") : trainer.losses().back();
    row.val_loss = trainer.final_val_loss();
    row.items_per_s = steady_items_per_s(trainer.reports());
    row.val_accuracy = trainer.last_val_accuracy();
    unit = trainer.task().item_unit() == std::string("img") ? "images" : "tokens";
    row.peak_bytes = trainer.peak_memory_bytes();
    row.skipped = trainer.scaler().skipped_steps();
    rows.push_back(row);
    runs.push_back(train::read_run_metrics(config.out_dir));
    runs.back().label = policy;
    train::write_metrics_svg((std::filesystem::path(config.out_dir) / "metrics.svg").string(), "precision " + policy,
                             {runs.back()});
  }
  std::string table = markdown_table(rows, unit);
  std::cout << "\n" << table;
  std::filesystem::path dir(out_dir);
  std::ofstream(dir / "sweep.md") << "# Precision sweep: " << o.positional[0] << "\n\n" << table;
  train::write_metrics_svg((dir / "sweep.svg").string(), "precision sweep: " + o.positional[0], runs);
  train::write_metrics_csv((dir / "sweep.csv").string(), runs);
  std::cout << "written: " << (dir / "sweep.md").string() << ", " << (dir / "sweep.svg").string() << ", "
            << (dir / "sweep.csv").string() << " and a metrics.svg per policy\n";
  return 0;
}

}  // namespace precis::cli
