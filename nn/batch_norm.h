// BatchNorm2d, as torch.nn.BatchNorm2d, over ops::batch_norm (ops/batch_norm.h).
#pragma once

#include "nn/module.h"

namespace precis::nn {

// Batch normalisation over dims (N, H, W) per channel (torch.nn.BatchNorm2d): weight (ones)
// and bias (zeros) are parameters; running_mean (zeros), running_var (ones) and
// num_batches_tracked (an i64 scalar, counting training forwards) are buffers, saved in
// checkpoints but not trained. Training mode normalises with the batch's statistics and
// updates the running ones with `momentum`; eval mode uses the running statistics.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)) in one op (ops::batch_norm_relu).
  Tensor forward_relu(const Tensor& x);

  Tensor weight, bias;
  Tensor running_mean, running_var, num_batches_tracked;
  double eps, momentum;

 private:
  void count_batch();
  Tensor one_;  // an i64 1 on the buffers' device
};

}  // namespace precis::nn
