#include "train/nonfinite.h"

#include <cmath>

#include "core/convert.h"
#include "core/copy.h"
#include "core/dtype.h"
#include "train/checkpoint.h"
#include "train/exit_codes.h"

namespace precis::train {

void enforce_nonfinite_rule(const TrainConfig& config, int64_t step, int64_t consecutive) {
  if (config.on_nonfinite != "stop" || consecutive < config.max_nonfinite_steps) return;
  const std::string& dir = config.checkpoint.dir;
  const std::string newest = has_checkpoint(dir)
                                 ? "the newest checkpoint, " + resolve_checkpoint(dir) + ", has finite weights"
                                 : "there is no checkpoint in '" + dir + "' yet";
  throw StoppedRun(detail::concat("training stopped at step ", step, ": the last ", consecutive,
                                  " steps had an inf or NaN loss or gradient and were skipped (on_nonfinite: stop, "
                                  "max_nonfinite_steps: ",
                                  config.max_nonfinite_steps, "); the weights are those of step ", step - consecutive,
                                  " and ", newest,
                                  ". The run diverged: lower optimizer.lr, raise schedule.warmup_steps or set "
                                  "optimizer.grad_clip, and resume with checkpoint.resume=true (or set on_nonfinite: "
                                  "skip to keep skipping such steps)"),
                   kExitNonFinite);
}

int64_t first_nonfinite(const Tensor& t) {
  if (!is_floating(t.dtype()) || t.numel() == 0) return -1;
  Tensor host = empty(t.shape(), t.dtype(), Device::cpu());
  copy_(host, t.detach());
  return dispatch_all(host.dtype(), "first_nonfinite", [&](auto tag) -> int64_t {
    using T = typename decltype(tag)::type;
    const T* p = host.data<T>();
    for (int64_t i = 0; i < host.numel(); ++i)
      if (!std::isfinite(convert<double>(p[i]))) return i;
    return -1;
  });
}

}  // namespace precis::train
