#include "models/lenet.h"

#include "core/random.h"
#include "nn/init.h"
#include "nn/observer.h"
#include "nn/parameter_gate.h"
#include "ops/elementwise.h"
#include "ops/pool.h"

namespace precis::models {

LeNet5::LeNet5(const ImageModelConfig& config, uint64_t seed) : ImageClassifier("LeNet5"), config_(config) {
  conv1_ = register_module(
      "conv1", std::make_shared<nn::Conv2d>(config.in_channels, 6, nn::Conv2dOptions{.kernel = 5, .padding = 2}));
  conv2_ = register_module("conv2", std::make_shared<nn::Conv2d>(6, 16, nn::Conv2dOptions{.kernel = 5}));
  fc1_ = register_module("fc1", std::make_shared<nn::Linear>(16 * 5 * 5, 120));
  fc2_ = register_module("fc2", std::make_shared<nn::Linear>(120, 84));
  fc3_ = register_module("fc3", std::make_shared<nn::Linear>(84, config.num_classes));
  // PyTorch's defaults, drawn again from the run's seed so that the seed alone fixes the model.
  Generator gen(seed);
  for (nn::Conv2d* conv : {conv1_.get(), conv2_.get()}) nn::init::default_uniform_(conv->weight, conv->bias, &gen);
  for (nn::Linear* fc : {fc1_.get(), fc2_.get(), fc3_.get()}) nn::init::default_uniform_(fc->weight, fc->bias, &gen);
}

Tensor LeNet5::forward(const Tensor& images) {
  PRECIS_CHECK(images.dim() == 4 && images.size(2) == 28 && images.size(3) == 28, "LeNet5: expects images [N, ",
               config_.in_channels, ", 28, 28], got ", images.shape());
  nn::gate_parameters(*this);  // a model this small waits for all its parameters at once
  Tensor h = ops::max_pool2d(ops::relu(conv1_->forward(images)), {2, 2});
  h = nn::observe("conv1", h);
  h = ops::max_pool2d(ops::relu(conv2_->forward(h)), {2, 2});
  h = nn::observe("conv2", h);
  h = h.reshape({h.size(0), -1});
  h = nn::observe("fc1", ops::relu(fc1_->forward(h)));
  h = nn::observe("fc2", ops::relu(fc2_->forward(h)));
  return fc3_->forward(h);
}

}  // namespace precis::models
