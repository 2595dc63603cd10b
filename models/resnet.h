// ResNet (He et al. 2015) laid out as torchvision.models.resnet, so that parameter and
// buffer names match its state_dict and a checkpoint loads with
// torchvision.models.resnet18().load_state_dict: conv1, bn1, layer1..layer4 (blocks
// 0, 1, ...: conv1, bn1, conv2, bn2[, conv3, bn3], downsample.0 (1x1 conv) and
// downsample.1 (batch norm) where the shape changes), fc. Convolutions have no bias.
//
// Stems: ImageNet's (conv1 7x7 stride 2 padding 3, bn1, relu, max-pool 3x3 stride 2
// padding 1) or, with cifar_stem, the usual CIFAR one (conv1 3x3 stride 1 padding 1, bn1,
// relu, no max-pool); the names are the same.
// Initialisation as torchvision: convolutions kaiming_normal_(fan_out, relu), batch norms
// weight 1 and bias 0, fc PyTorch's default (uniform in +-1/sqrt(fan_in)).
//
// Under set_shortcut_stream (an experiment, off by default) a block's downsample runs on the
// GPU's side stream (core/cuda/side_stream.h), beside the main branch: models/resnet.cpp.
#pragma once

#include <vector>

#include "models/image_classifier.h"
#include "nn/batch_norm.h"
#include "nn/containers.h"
#include "nn/conv.h"
#include "nn/linear.h"

namespace precis::models {

// conv3x3 -> bn -> relu -> conv3x3 -> bn, + identity (or downsample(x)), relu. ResNet-18/34.
class BasicBlock : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride);
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<nn::Sequential> downsample_;  // null when the shape stays
};

// conv1x1 -> bn -> relu -> conv3x3 (stride) -> bn -> relu -> conv1x1 (4x planes) -> bn,
// + identity (or downsample(x)), relu. ResNet-50 (torchvision's "v1.5": the stride on the 3x3).
class Bottleneck : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in_planes, int64_t planes, int64_t stride);
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_, conv3_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_, bn3_;
  std::shared_ptr<nn::Sequential> downsample_;
};

// Where a residual block's downsample (conv1x1 + batch norm) of a GPU input runs. forward: its
// forward is queued on the device's side stream, forked before the main branch and joined before
// the shortcut is added, so that its small kernels run beside the main branch's; its backward
// stays on the compute stream. forward_and_backward: its autograd nodes run their backward on the
// side stream too (core/autograd.cpp), joined where the block input's two gradients meet.
// forward is the default (ResNet-18's step -1.8% on top of the weight gradients' side stream;
// forward_and_backward measured slower, bench/NOTES.md); until set, the environment's
// PRECIS_SHORTCUT_STREAM=0 (off), 1 (forward) or 2 (forward_and_backward) chooses (read once).
enum class ShortcutStream { off, forward, forward_and_backward };
void set_shortcut_stream(ShortcutStream where);
ShortcutStream shortcut_stream();

class ResNet : public ImageClassifier {
 public:
  // config.name: resnet18 | resnet34 | resnet50.
  ResNet(const ImageModelConfig& config, uint64_t seed);
  Tensor forward(const Tensor& images) override;
  const ImageModelConfig& config() const override { return config_; }

 private:
  ImageModelConfig config_;
  std::shared_ptr<nn::Conv2d> conv1_;
  std::shared_ptr<nn::BatchNorm2d> bn1_;
  std::vector<std::shared_ptr<nn::Sequential>> layers_;
  std::shared_ptr<nn::Linear> fc_;
};

}  // namespace precis::models
