#include "train/resume_check.h"

#include "core/dtype.h"
#include "core/error.h"

namespace precis::train {

namespace {

void check_same(const Json& saved_state, const char* state_key, const std::string& now, const char* config_key,
                const std::string& checkpoint) {
  if (!saved_state.contains(state_key)) return;
  const Json& saved = saved_state.at(state_key);
  const std::string then = saved.is_string() ? saved.as_string() : saved.dump();
  PRECIS_CHECK(then == now, "checkpoint.resume: ", checkpoint, " was written with ", config_key, " ", then,
               ", but this config has ", now, "; its optimizer state does not carry over. Resume with ", config_key,
               " ", then, ", or start a new run (another out_dir, or checkpoint.overwrite=true)");
}

}  // namespace

void check_resume_compatible(const Json& saved_state, const TrainConfig& config, const amp::PrecisionPolicy& policy,
                             const std::string& checkpoint) {
  if (!saved_state.is_object()) return;
  check_same(saved_state, "optimizer", config.optimizer.name, "optimizer.name", checkpoint);
  check_same(saved_state, "param_dtype", dtype_name(policy.param_dtype), "precision.params", checkpoint);
  check_same(saved_state, "master_weights", policy.master_weights ? "true" : "false", "precision.master_weights",
             checkpoint);
}

}  // namespace precis::train
