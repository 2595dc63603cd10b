#include "models/resnet.h"

#include "core/random.h"
#include "nn/init.h"
#include "nn/observer.h"
#include "nn/parameter_gate.h"
#include "ops/pool.h"

namespace precis::models {

namespace {

std::shared_ptr<nn::Conv2d> conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return std::make_shared<nn::Conv2d>(
      in, out, nn::Conv2dOptions{.kernel = kernel, .stride = stride, .padding = kernel / 2, .bias = false});
}

// torchvision's downsample: conv1x1(stride) + batch norm, when the block changes the shape.
std::shared_ptr<nn::Sequential> downsample(int64_t in_planes, int64_t out_planes, int64_t stride) {
  if (stride == 1 && in_planes == out_planes) return nullptr;
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(conv(in_planes, out_planes, 1, stride));
  seq->push_back(std::make_shared<nn::BatchNorm2d>(out_planes));
  return seq;
}

// relu(bn(out) + identity) in one op (ops::batch_norm_add_relu), in out's memory format; the
// identity is x or downsample(x).
Tensor bn_add_relu(nn::BatchNorm2d& bn, const Tensor& out, const Tensor& x,
                   const std::shared_ptr<nn::Sequential>& down) {
  return bn.forward_add_relu(out, down ? down->forward(x) : x);
}

struct Depths {
  std::vector<int64_t> blocks;
  bool bottleneck;
};

Depths depths_of(const std::string& name) {
  if (name == "resnet18") return {{2, 2, 2, 2}, false};
  if (name == "resnet34") return {{3, 4, 6, 3}, false};
  if (name == "resnet50") return {{3, 4, 6, 3}, true};
  PRECIS_FAIL("ResNet: unknown model '", name, "' (known: resnet18, resnet34, resnet50)");
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride) : nn::Module("BasicBlock") {
  conv1_ = register_module("conv1", conv(in_planes, planes, 3, stride));
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2_ = register_module("conv2", conv(planes, planes, 3, 1));
  bn2_ = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  downsample_ = downsample(in_planes, planes * kExpansion, stride);
  if (downsample_) register_module("downsample", downsample_);
}

Tensor BasicBlock::forward(const Tensor& x) {
  nn::gate_parameters(*this);  // the block's convolutions, norms and downsample
  Tensor out = bn1_->forward_relu(conv1_->forward(x));
  return bn_add_relu(*bn2_, conv2_->forward(out), x, downsample_);
}

Bottleneck::Bottleneck(int64_t in_planes, int64_t planes, int64_t stride) : nn::Module("Bottleneck") {
  conv1_ = register_module("conv1", conv(in_planes, planes, 1, 1));
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2_ = register_module("conv2", conv(planes, planes, 3, stride));
  bn2_ = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  conv3_ = register_module("conv3", conv(planes, planes * kExpansion, 1, 1));
  bn3_ = register_module("bn3", std::make_shared<nn::BatchNorm2d>(planes * kExpansion));
  downsample_ = downsample(in_planes, planes * kExpansion, stride);
  if (downsample_) register_module("downsample", downsample_);
}

Tensor Bottleneck::forward(const Tensor& x) {
  nn::gate_parameters(*this);
  Tensor out = bn1_->forward_relu(conv1_->forward(x));
  out = bn2_->forward_relu(conv2_->forward(out));
  return bn_add_relu(*bn3_, conv3_->forward(out), x, downsample_);
}

ResNet::ResNet(const ImageModelConfig& config, uint64_t seed) : ImageClassifier("ResNet"), config_(config) {
  const Depths depths = depths_of(config.name);
  PRECIS_CHECK(config.in_channels > 0 && config.num_classes > 1, "ResNet: in_channels must be positive and ",
               "num_classes > 1, got ", config.in_channels, " and ", config.num_classes);
  conv1_ = register_module("conv1",
                           config.cifar_stem ? conv(config.in_channels, 64, 3, 1) : conv(config.in_channels, 64, 7, 2));
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(64));
  const int64_t expansion = depths.bottleneck ? Bottleneck::kExpansion : BasicBlock::kExpansion;
  int64_t in_planes = 64;
  for (size_t i = 0; i < depths.blocks.size(); ++i) {
    const int64_t planes = 64 << i, first_stride = i == 0 ? 1 : 2;
    auto layer = std::make_shared<nn::Sequential>();
    for (int64_t b = 0; b < depths.blocks[i]; ++b) {
      const int64_t stride = b == 0 ? first_stride : 1;
      if (depths.bottleneck) {
        layer->push_back(std::make_shared<Bottleneck>(in_planes, planes, stride));
      } else {
        layer->push_back(std::make_shared<BasicBlock>(in_planes, planes, stride));
      }
      in_planes = planes * expansion;
    }
    layers_.push_back(register_module("layer" + std::to_string(i + 1), layer));
  }
  fc_ = register_module("fc", std::make_shared<nn::Linear>(in_planes, config.num_classes));

  // torchvision's initialisation, in parameter order from one seeded generator.
  Generator gen(seed);
  apply([&](nn::Module& m, const std::string&) {
    if (auto* c = dynamic_cast<nn::Conv2d*>(&m)) nn::init::kaiming_normal_fan_out_(c->weight, &gen);
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(&m)) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  });
  nn::init::default_uniform_(fc_->weight, fc_->bias, &gen);
}

Tensor ResNet::forward(const Tensor& images) {
  PRECIS_CHECK(images.dim() == 4 && images.size(1) == config_.in_channels, "ResNet: expects images [N, ",
               config_.in_channels, ", H, W], got ", images.shape());
  nn::gate_parameters(*conv1_);
  nn::gate_parameters(*bn1_);
  Tensor h = bn1_->forward_relu(conv1_->forward(images));
  if (!config_.cifar_stem) h = ops::max_pool2d(h, {3, 3}, {2, 2}, {1, 1});
  h = nn::observe("stem", h);
  for (size_t i = 0; i < layers_.size(); ++i) h = nn::observe("layer" + std::to_string(i + 1), layers_[i]->forward(h));
  h = ops::adaptive_avg_pool2d(h, {1, 1});
  nn::gate_parameters(*fc_);
  return fc_->forward(h.reshape({h.size(0), -1}));
}

}  // namespace precis::models
