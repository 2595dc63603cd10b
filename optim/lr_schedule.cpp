#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace precis::optim {

const std::vector<std::string>& LrSchedule::kinds() {
  static const std::vector<std::string> names = {"cosine", "constant", "linear", "wsd", "inverse_sqrt"};
  return names;
}

double LrSchedule::at(int64_t step) const {
  PRECIS_CHECK(std::find(kinds().begin(), kinds().end(), kind) != kinds().end(), "lr schedule: unknown kind '", kind,
               "' (use cosine, constant, linear, wsd or inverse_sqrt)");
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
  if (kind == "constant") return lr;
  if (kind == "inverse_sqrt")
    return lr * std::sqrt(static_cast<double>(warmup_steps + 1) / static_cast<double>(step + 1));
  if (step >= decay_steps || decay_steps <= warmup_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - warmup_steps);
  if (kind == "cosine") return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (lr - min_lr);
  if (kind == "linear") return lr + progress * (min_lr - lr);
  // wsd
  const int64_t decay_start =
      decay_steps - std::llround(decay_fraction * static_cast<double>(decay_steps - warmup_steps));
  if (step < decay_start) return lr;
  const double cooled = static_cast<double>(step - decay_start) / static_cast<double>(decay_steps - decay_start);
  return lr + cooled * (min_lr - lr);
}

std::string LrSchedule::describe() const {
  std::ostringstream out;
  out << kind;
  if (kind == "constant") {
    out << " at " << lr;
  } else if (kind == "inverse_sqrt") {
    out << " from " << lr << " at step " << warmup_steps;
  } else {
    out << " from " << lr << " to " << min_lr << " at step " << decay_steps;
    if (kind == "wsd") out << " (the last " << decay_fraction << " of it decaying)";
  }
  if (warmup_steps > 0) out << " after " << warmup_steps << " warmup steps";
  return out.str();
}

Json LrSchedule::to_json() const {
  Json json = Json::object();
  json["kind"] = kind;
  json["lr"] = lr;
  json["min_lr"] = min_lr;
  json["warmup_steps"] = warmup_steps;
  json["decay_steps"] = decay_steps;
  json["decay_fraction"] = decay_fraction;
  return json;
}

LrSchedule LrSchedule::from_json(const Json& json) {
  return LrSchedule{json.at("kind").as_string(),     json.at("lr").as_double(),
                    json.at("min_lr").as_double(),   json.at("warmup_steps").as_int(),
                    json.at("decay_steps").as_int(), json.at("decay_fraction").as_double()};
}

}  // namespace precis::optim
