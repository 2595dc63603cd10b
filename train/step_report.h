// StepReport: what one log interval measured, printed as one line and written
// as one JSON object per line to out_dir/metrics.jsonl.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/json.h"

namespace precis::train {

struct StepReport {
  int64_t step = 0;  // optimizer steps completed
  int64_t max_steps = 0;
  double loss = 0;  // this step's training loss (mean over its micro-batches)
  double lr = 0;
  double grad_norm = 0;
  double ms = 0;                                         // mean wall time per step over the interval
  double items_per_s = 0;                                // tokens or images per second
  std::string item_unit = "tok";                         // "tok" (metrics key tokens_per_s) or "img" (images_per_s)
  std::vector<std::pair<std::string, double>> phase_ms;  // mean per step
  std::optional<double> val_loss;
  std::optional<double> accuracy;          // classification: of the step's last micro-batch
  std::optional<double> val_accuracy;      // classification: on the validation batches
  std::optional<double> tflops;            // achieved, from the model's FLOP count
  std::optional<double> mfu;               // fraction of the device's peak
  int64_t peak_memory_bytes = 0;           // the most memory allocated since training began
  int64_t interval_peak_memory_bytes = 0;  // the most allocated during this interval's steps
  // The device allocator's statistics (the log's, metrics.jsonl): bytes held from the system
  // now (reserved - allocated is its cache), and allocations from / returns to the system so far.
  int64_t reserved_memory_bytes = 0;
  int64_t system_allocs = 0, system_frees = 0;
  std::optional<double> loss_scale;  // with loss scaling
  int64_t skipped_steps = 0;         // steps skipped for inf/NaN gradients so far (any policy)
  double eta_s = 0;

  std::string line() const;
  Json json() const;
};

// Appends one JSON object per line to a file, flushed after each record.
class JsonlWriter {
 public:
  JsonlWriter() = default;
  // `append`: keep what is there (a resumed run); otherwise start the file anew.
  void open(const std::string& path, bool append);
  void write(const Json& record);
  bool is_open() const { return out_.is_open(); }

 private:
  std::ofstream out_;
  std::string path_;
};

std::string format_duration(double seconds);  // "3m57s", "1h02m", "42s"

}  // namespace precis::train
