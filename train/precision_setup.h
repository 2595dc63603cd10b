// From the `precision` section of a config to the policy and loss scaler it describes.
#pragma once

#include "amp/grad_scaler.h"
#include "amp/precision_policy.h"
#include "train/config.h"

namespace precis::train {

// The named policy, refined by the section's explicit fields.
amp::PrecisionPolicy policy_from_config(const PrecisionConfig& config);
// The scaler settings for a policy that scales its loss (static: a fixed scale).
amp::GradScalerOptions scaler_options_from_config(const PrecisionConfig& config, const amp::PrecisionPolicy& policy);

}  // namespace precis::train
