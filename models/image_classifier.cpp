#include "models/image_classifier.h"

#include "core/error.h"
#include "models/lenet.h"
#include "models/resnet.h"

namespace precis::models {

const std::vector<std::string>& image_model_names() {
  static const std::vector<std::string> names = {"lenet5", "resnet18", "resnet34", "resnet50"};
  return names;
}

std::shared_ptr<ImageClassifier> make_image_model(const ImageModelConfig& config, uint64_t seed) {
  if (config.name == "lenet5") return std::make_shared<LeNet5>(config, seed);
  if (config.name.starts_with("resnet")) return std::make_shared<ResNet>(config, seed);
  PRECIS_FAIL("unknown image model '", config.name, "' (known: lenet5, resnet18, resnet34, resnet50)");
}

}  // namespace precis::models
