#include <algorithm>
#include <cctype>
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
#include "core/gpu.h"
#include "train/config.h"
#include "train/run_plot.h"
#include "train/trainer.h"

namespace precis::cli {

namespace {

struct SweepRow {
  std::string policy;
  double train_loss = 0, items_per_s = 0;
  std::optional<double> val_loss;      // the last validation, when the run evaluated
  std::optional<double> val_accuracy;  // classification
  int64_t peak_bytes = 0, skipped = 0;
};

std::vector<std::string> split_list(const std::string& text, char separator) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, separator))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The policies to run: --precisions' items, separated by ';' when it has one or names a
// custom policy (whose own separator is ','), else by ','; then each --policy as given.
std::vector<std::string> sweep_policies(const Options& o) {
  std::vector<std::string> policies;
  bool listed = false;
  for (const auto& [name, value] : o.named) {
    if (name == "policy") {
      policies.push_back(value);
    } else if (name == "precisions") {
      listed = true;
      const bool custom = value.find(';') != std::string::npos || value.find('=') != std::string::npos;
      for (const std::string& p : split_list(value, custom ? ';' : ',')) policies.push_back(p);
    }
  }
  if (policies.empty() && !listed) policies = {"fp32", "tf32", "fp16", "bf16"};
  return policies;
}

// A policy as a folder name: "params=float32,compute=bfloat16" -> "params-float32_compute-bfloat16".
std::string folder_name(const std::string& policy) {
  std::string out;
  for (char c : policy)
    out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : c == '=' ? '-' : '_';
  return out;
}

// The last validation a run logged, if any.
std::optional<double> last_val_loss(const std::vector<train::StepReport>& reports) {
  for (auto r = reports.rbegin(); r != reports.rend(); ++r)
    if (r->val_loss) return r->val_loss;
  return std::nullopt;
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
    std::snprintf(line, sizeof line, "| %s | %.4f |", r.policy.c_str(), r.train_loss);
    out += line;
    if (r.val_loss) {
      std::snprintf(line, sizeof line, " %.4f |", *r.val_loss);
      out += line;
    } else {
      out += " not evaluated |";
    }
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
  // key=value overrides, except an option's value (a custom policy has '=' in it).
  std::vector<std::string> overrides;
  Args rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool option = a.rfind("--", 0) == 0;
    if (!option && a.find('=') != std::string::npos) {
      overrides.push_back(a);
      continue;
    }
    rest.push_back(a);
    if (option && a.find('=') == std::string::npos && i + 1 < args.size()) rest.push_back(args[++i]);
  }
  Options o = parse_options(rest, {"precisions", "policy"}, "sweep");
  usage_check(o.positional.size() == 1, "sweep", "give one config file");
  std::vector<std::string> policies = sweep_policies(o);
  usage_check(!policies.empty(), "sweep", "--precisions lists no policy");

  std::vector<SweepRow> rows;
  std::vector<train::RunMetrics> runs;
  std::string out_dir, unit = "tokens";
  std::vector<std::string> emulated;  // policies computing in fp16/bf16 on the CPU
  for (const std::string& policy : policies) {
    std::vector<std::string> run_overrides = overrides;
    run_overrides.push_back("precision=" + policy);
    run_overrides.push_back("sample.tokens=0");
    train::TrainConfig config = train::load_config(o.positional[0], run_overrides);
    out_dir = config.out_dir;
    config.out_dir = (std::filesystem::path(out_dir) / ("sweep-" + folder_name(policy))).string();
    // Each sweep is a new comparison: its runs replace the last sweep's (train/run_folder.h).
    if (!config.checkpoint.resume) config.checkpoint.overwrite = true;
    std::cout << "==== sweep: " << policy << " ====" << std::endl;
    train::Trainer trainer(config);
    trainer.run();
    SweepRow row;
    row.policy = policy;
    row.train_loss = trainer.losses().empty() ? std::nan("") : trainer.losses().back();
    row.val_loss = last_val_loss(trainer.reports());
    if (!resolve_device(config.device, /*quiet=*/true).is_cuda() &&
        (trainer.policy().compute_dtype == DType::f16 || trainer.policy().compute_dtype == DType::bf16))
      emulated.push_back(policy);
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
  if (!emulated.empty()) {
    std::string names;
    for (const std::string& p : emulated) names += (names.empty() ? "" : ", ") + p;
    table +=
        "\nOn the CPU, fp16 and bf16 are emulated (stored in 16 bits, each op computing in fp32 and rounding its "
        "result): the losses "
        "of " +
        names + " are what the format gives, but their speed means nothing; compare speeds on a GPU.\n";
  }
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
