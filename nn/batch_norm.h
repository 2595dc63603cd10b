// BatchNorm2d, as torch.nn.BatchNorm2d, over ops::batch_norm (ops/batch_norm.h).
#pragma once

#include "nn/module.h"

namespace precis::nn {

// Batch normalisation over dims (N, H, W) per channel (torch.nn.BatchNorm2d): weight (ones)
// and bias (zeros) are parameters; running_mean (zeros), running_var (ones) and
// num_batches_tracked (an i64 scalar, counting training forwards: the op adds 1 beside the
// statistics, so a captured step counts too) are buffers, saved in
// checkpoints but not trained. Training mode normalises with the batch's statistics and
// updates the running ones with `momentum`; eval mode uses the running statistics.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)) in one op (ops::batch_norm_relu).
  Tensor forward_relu(const Tensor& x);
  // relu(forward(x) + residual) in one op (ops::batch_norm_add_relu): a ResNet block's join.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);

  Tensor weight, bias;
  Tensor running_mean, running_var, num_batches_tracked;
  double eps, momentum;
};

}  // namespace precis::nn
