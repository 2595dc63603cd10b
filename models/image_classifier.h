// The image classifiers (LeNet-5, ResNet-18/34/50) and how a run names and builds them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace precis::models {

struct ImageModelConfig {
  std::string name = "resnet18";  // lenet5 | resnet18 | resnet34 | resnet50
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  // ResNet: the CIFAR stem (3x3 conv, stride 1, no max-pool) instead of ImageNet's
  // (7x7 conv, stride 2, 3x3 max-pool, stride 2).
  bool cifar_stem = false;
};

// A module whose forward maps images [N, C, H, W] to logits [N, num_classes].
class ImageClassifier : public nn::Module {
 public:
  using nn::Module::Module;
  virtual const ImageModelConfig& config() const = 0;
};

const std::vector<std::string>& image_model_names();
// The model `config.name` names, initialised from `seed`.
std::shared_ptr<ImageClassifier> make_image_model(const ImageModelConfig& config, uint64_t seed);

}  // namespace precis::models
