#include "train/step_report.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace precis::train {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", (long long)s);
  return buf;
}

std::string StepReport::line() const {
  char buf[512];
  int width = static_cast<int>(std::to_string(max_steps).size());
  int n = std::snprintf(buf, sizeof buf,
                        "step %*lld/%lld %5.1f%% | loss %.4f | lr %.2e | norm %6.3f | %7.1f ms | %9.0f %s/s", width,
                        (long long)step, (long long)max_steps, 100.0 * step / std::max<int64_t>(max_steps, 1), loss, lr,
                        grad_norm, ms, items_per_s, item_unit.c_str());
  std::string out(buf, n);
  if (accuracy) {
    std::snprintf(buf, sizeof buf, " | acc %.2f%%", 100.0 * *accuracy);
    out += buf;
  }
  if (val_loss) {
    std::snprintf(buf, sizeof buf, " | val %.4f", *val_loss);
    out += buf;
  }
  if (val_accuracy) {
    std::snprintf(buf, sizeof buf, " acc %.2f%%", 100.0 * *val_accuracy);
    out += buf;
  }
  if (loss_scale) {
    std::snprintf(buf, sizeof buf, " | scale %g skipped %lld", *loss_scale, static_cast<long long>(skipped_steps));
    out += buf;
  } else if (skipped_steps > 0) {
    std::snprintf(buf, sizeof buf, " | skipped %lld (inf/NaN)", static_cast<long long>(skipped_steps));
    out += buf;
  }
  if (!phase_ms.empty()) {
    out += " |";
    for (const auto& [name, value] : phase_ms) {
      std::snprintf(buf, sizeof buf, " %s %.1f", name.c_str(), value);
      out += buf;
    }
    out += " ms";
  }
  if (tflops) {
    if (*tflops >= 1.0)
      std::snprintf(buf, sizeof buf, " | %.1f TFLOP/s", *tflops);
    else
      std::snprintf(buf, sizeof buf, " | %.1f GFLOP/s", *tflops * 1000.0);
    out += buf;
  }
  if (mfu) {
    std::snprintf(buf, sizeof buf, " MFU %.1f%%", 100.0 * *mfu);
    out += buf;
  }
  if (peak_memory_bytes > 0) {
    std::snprintf(buf, sizeof buf, " | peak %.2f GiB", static_cast<double>(peak_memory_bytes) / (1 << 30));
    out += buf;
  }
  if (step < max_steps) out += " | eta " + format_duration(eta_s);
  return out;
}

Json StepReport::json() const {
  Json j = Json::object();
  j["step"] = step;
  j["loss"] = loss;
  j["lr"] = lr;
  j["grad_norm"] = grad_norm;
  j["ms"] = ms;
  j[item_unit == "img" ? "images_per_s" : "tokens_per_s"] = items_per_s;
  Json phases = Json::object();
  for (const auto& [name, value] : phase_ms) phases[name] = value;
  j["phase_ms"] = phases;
  if (val_loss) j["val_loss"] = *val_loss;
  if (accuracy) j["accuracy"] = *accuracy;
  if (val_accuracy) j["val_accuracy"] = *val_accuracy;
  if (loss_scale) j["loss_scale"] = *loss_scale;
  if (loss_scale || skipped_steps > 0) j["skipped_steps"] = skipped_steps;
  if (tflops) j["tflops"] = *tflops;
  if (mfu) j["mfu"] = *mfu;
  if (peak_memory_bytes > 0) j["peak_memory_bytes"] = peak_memory_bytes;
  if (interval_peak_memory_bytes > 0) j["interval_peak_memory_bytes"] = interval_peak_memory_bytes;
  if (reserved_memory_bytes > 0) {
    j["reserved_memory_bytes"] = reserved_memory_bytes;
    j["allocator_system_allocs"] = system_allocs;
    j["allocator_system_frees"] = system_frees;
  }
  return j;
}

void JsonlWriter::open(const std::string& path, bool append) {
  path_ = path;
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  PRECIS_CHECK(out_.is_open(), "cannot write '", path, "': check that its directory exists and is writable");
}

void JsonlWriter::write(const Json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  PRECIS_CHECK(out_.good(), "writing '", path_, "' failed (disk full?)");
}

}  // namespace precis::train
