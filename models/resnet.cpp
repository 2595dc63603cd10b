// ResNet's blocks and stems (models/resnet.h).
//
// The shortcut on the side stream (set_shortcut_stream, an experiment). A downsampling block's
// shortcut, bn(conv1x1_s(x)), needs only x, and its main branch, bn2(conv2(relu(bn1(conv1(x))))),
// needs only x too, until the two are added. Their late-layer kernels are small (a few hundred
// thread blocks) and latency-bound, so the shortcut's are queued on the device's side stream
// (core/cuda/side_stream.h) to fill the GPU beside the main branch's:
//   - the block forks the side stream (fork_side_stream) before it queues the main branch, so the
//     shortcut waits for x only; it queues the shortcut after the main branch, in a scope that
//     does not fork again (SideStreamScope::Fork::made), so that autograd records the block's
//     nodes in the order the compute stream alone gives, and the backward runs them in the usual
//     order and computes the same bits (the order decides which of x's two gradients cuDNN adds
//     into the other); under a CUDA graph the kernels' host order does not matter, and eagerly
//     the host is ahead of the GPU;
//   - the compute stream waits for the side stream (join_side_stream) before the add, which is
//     also before the block returns: a capture never ends with the side stream unjoined;
//   - x (a block of the compute stream's pool) needs no record_stream: the block holds it until
//     after the join, so the compute stream reaches any later use of its block after the reads;
//   - the shortcut's tensors (its convolution's output, which the batch norm saves, the norm's
//     statistics and output) are blocks of the side stream's pool, read later on the compute
//     stream and freed by the host after those reads are queued: the pool gives such a block to
//     side-stream work only, queued after a later fork, which waits for those reads (between a
//     block's fork and its scope the main branch frees no such block: fork_side_stream's rule);
//   - the batch norm's running statistics are updated on the side stream; nothing reads them
//     before the join.
// With ShortcutStream::forward_and_backward the shortcut's autograd nodes run their backward on
// the side stream too (SideStreamScope::Backward::on_side_stream; core/autograd.cpp, "Backward
// on the side stream"), beside the main branch's backward; the compute stream waits for them
// where conv1's backward adds its gradient of x into the shortcut's.
#include "models/resnet.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "core/random.h"
#include "nn/init.h"
#include "nn/observer.h"
#include "nn/parameter_gate.h"
#include "ops/pool.h"

#if PRECIS_WITH_CUDA
#include "core/cuda/side_stream.h"
#endif

namespace precis::models {

namespace {

std::atomic<int> g_shortcut_stream{-1};  // a ShortcutStream, -1 until set or read from the environment

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

// A block's identity: x, or downsample(x). Made before the main branch is queued, it forks the
// side stream where the downsample runs there (see the top); take() queues the downsample and
// joins. Joins when destroyed otherwise (the main branch threw).
class Shortcut {
 public:
  Shortcut(const Tensor& x, const std::shared_ptr<nn::Sequential>& down) : x_(x), down_(down) {
#if PRECIS_WITH_CUDA
    if (down_ && x_.device().is_cuda() && shortcut_stream() != ShortcutStream::off) {
      cuda::fork_side_stream(x_.device());
      forked_ = true;
    }
#endif
  }
  ~Shortcut() {
    try {
      join();
    } catch (...) {  // the error that is unwinding says more
    }
  }
  Shortcut(const Shortcut&) = delete;
  Shortcut& operator=(const Shortcut&) = delete;

  Tensor take() {
    if (!down_) return x_;
    if (!forked_) return down_->forward(x_);
    Tensor identity;
#if PRECIS_WITH_CUDA
    {
      using Scope = cuda::SideStreamScope;
      Scope on_side(x_.device(), Scope::Fork::made,
                    shortcut_stream() == ShortcutStream::forward_and_backward ? Scope::Backward::on_side_stream
                                                                              : Scope::Backward::on_compute_stream);
      identity = down_->forward(x_);
    }
#endif
    join();
    return identity;
  }

 private:
  void join() {
#if PRECIS_WITH_CUDA
    if (forked_) cuda::join_side_stream(x_.device());
#endif
    forked_ = false;
  }

  Tensor x_;
  std::shared_ptr<nn::Sequential> down_;
  bool forked_ = false;
};

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

void set_shortcut_stream(ShortcutStream where) { g_shortcut_stream = static_cast<int>(where); }

ShortcutStream shortcut_stream() {
  int where = g_shortcut_stream.load(std::memory_order_relaxed);
  if (where < 0) {
    const char* setting = std::getenv("PRECIS_SHORTCUT_STREAM");
    const std::string value = setting ? setting : "1";
    PRECIS_CHECK(value == "0" || value == "1" || value == "2", "PRECIS_SHORTCUT_STREAM is '", value,
                 "': set it to 0 (the downsample on the compute stream), 1 (its forward on the side stream, the "
                 "default) or 2 (its forward and backward there), or unset it");
    const ShortcutStream read = value == "2"   ? ShortcutStream::forward_and_backward
                                : value == "1" ? ShortcutStream::forward
                                               : ShortcutStream::off;
    int unset = -1;
    g_shortcut_stream.compare_exchange_strong(unset, static_cast<int>(read));
    where = g_shortcut_stream.load();
  }
  return static_cast<ShortcutStream>(where);
}

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride) : nn::Module("BasicBlock") {
  conv1_ = register_module("conv1", conv(in_planes, planes, 3, stride));
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2_ = register_module("conv2", conv(planes, planes, 3, 1));
  bn2_ = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  downsample_ = downsample(in_planes, planes * kExpansion, stride);
  if (downsample_) register_module("downsample", downsample_);
}

// relu(bn2(conv2(...)) + identity) in one op (ops::batch_norm_add_relu), in out's memory format.
Tensor BasicBlock::forward(const Tensor& x) {
  nn::gate_parameters(*this);  // the block's convolutions, norms and downsample
  Shortcut shortcut(x, downsample_);
  Tensor out = bn1_->forward_relu(conv1_->forward(x));
  out = conv2_->forward(out);
  return bn2_->forward_add_relu(out, shortcut.take());
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
  Shortcut shortcut(x, downsample_);
  Tensor out = bn1_->forward_relu(conv1_->forward(x));
  out = bn2_->forward_relu(conv2_->forward(out));
  out = conv3_->forward(out);
  return bn3_->forward_add_relu(out, shortcut.take());
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
