// LeNet-5 (LeCun et al. 1998) as it is trained today: ReLU and max-pooling in place of the
// scaled tanh and subsampling, a 5x5 padded first convolution so a 28x28 MNIST digit plays
// the role of the paper's 32x32 input:
//   conv1 (C -> 6, 5x5, padding 2) relu maxpool 2 -> conv2 (6 -> 16, 5x5) relu maxpool 2
//   -> flatten (16 x 5 x 5) -> fc1 (120) relu -> fc2 (84) relu -> fc3 (classes).
// Layers start as PyTorch's defaults (uniform in +-1/sqrt(fan_in)).
#pragma once

#include "models/image_classifier.h"
#include "nn/conv.h"
#include "nn/linear.h"

namespace precis::models {

class LeNet5 : public ImageClassifier {
 public:
  // Images of 28x28 (MNIST); other sizes change fc1's input and are rejected.
  LeNet5(const ImageModelConfig& config, uint64_t seed);
  Tensor forward(const Tensor& images) override;
  const ImageModelConfig& config() const override { return config_; }

 private:
  ImageModelConfig config_;
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::Linear> fc1_, fc2_, fc3_;
};

}  // namespace precis::models
