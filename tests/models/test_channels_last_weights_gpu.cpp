// A ResNet (ResNet-18, CIFAR stem, 8x8 images) trained on the GPU in bf16 with channels-last
// images, once with its weights row-major and once laid out channels-last (nn::to_channels_last,
// as a channels-last run does), from the same initial values, on the same batches, as the
// trainer steps: lazily zeroed flat gradients, the weight casts precached, SGD with momentum.
// The convolutions compute the same thing either way (the row-major run lays each weight out
// as KRSC for cuDNN, the channels-last one finds it so), so the first step's loss and
// gradients agree to bf16 round-off (they are expected equal, but cuDNN's weight-gradient
// algorithms may sum in a nondeterministic order) and later losses to bf16's amplified
// round-off; every weight gradient lies in its parameter's layout. Skipped, with the reason,
// where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/copy.h"
#include "core/random.h"
#include "models/image_classifier.h"
#include "nn/flat_parameters.h"
#include "ops/autocast.h"
#include "ops/memory_format.h"
#include "ops/nn_functional.h"
#include "optim/sgd.h"
#include "support/gpu.h"

using namespace precis;

namespace {

const Device kGpu = Device::cuda(0);

struct Training {
  explicit Training(bool channels_last_weights) {
    model = models::make_image_model({"resnet18", 3, 10, /*cifar_stem=*/true}, 5);
    if (channels_last_weights) nn::to_channels_last(*model);
    flat = nn::flatten_parameters(*model, kGpu);
    optimizer = std::make_unique<optim::SGD>(optim::default_param_groups(*model, 5e-4),
                                             optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  }
  double step(const Tensor& images, const Tensor& labels) {
    flat->zero_grad_lazily();
    ops::autocast::clear_cache();
    for (const nn::FlatBuffer& b : flat->buffers()) {
      std::vector<Tensor> leaves;
      for (const nn::FlatSlot& s : b.slots) leaves.push_back(s.param);
      ops::autocast::precache(b.data, leaves, DType::bf16);
    }
    Tensor loss;
    {
      ops::autocast::Scope autocast(DType::bf16);
      loss = ops::cross_entropy(model->forward(images), labels);
    }
    loss.backward();
    flat->settle_grads();
    const double value = loss.item<double>();
    grads.clear();
    for (const auto& p : model->named_parameters()) grads[p.name] = p.tensor.grad().to(Device::cpu()).to(DType::f64);
    optimizer->step();
    return value;
  }
  std::shared_ptr<models::ImageClassifier> model;
  std::shared_ptr<nn::FlatParameters> flat;
  std::unique_ptr<optim::SGD> optimizer;
  std::map<std::string, Tensor> grads;  // of the last step, before the update
};

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace

TEST(ChannelsLastWeightsGpu, Bf16ResNetTrainsAsWithRowMajorWeights) {
  PRECIS_SKIP_WITHOUT_GPU();
  Training row_major(false), channels_last(true);
  Generator gen(3);
  const Tensor images = ops::to_memory_format(randn({16, 3, 8, 8}, DType::f32, &gen).to(DType::bf16).to(kGpu),
                                              ops::MemoryFormat::channels_last);
  std::vector<int64_t> classes;
  for (int64_t i = 0; i < 16; ++i) classes.push_back(i % 10);
  const Tensor labels = from_vector<int64_t>(classes, {16}).to(kGpu);

  for (int step = 0; step < 4; ++step) {
    const double a = row_major.step(images, labels), b = channels_last.step(images, labels);
    EXPECT_NEAR(b, a, (step == 0 ? 1e-3 : 2e-2) * a) << "step " << step + 1 << "'s loss";
    if (step != 0) continue;
    for (const auto& p : channels_last.model->named_parameters()) {
      const Tensor& w = p.tensor;
      EXPECT_EQ(w.grad().strides(), w.strides()) << p.name;
      if (w.dim() == 4) {
        const int64_t C = w.size(1), H = w.size(2), W = w.size(3);
        EXPECT_EQ(w.strides(), (Shape{H * W * C, 1, W * C, C})) << p.name;
      }
      const std::vector<double> ga = row_major.grads.at(p.name).to_vector<double>(),
                                gb = channels_last.grads.at(p.name).to_vector<double>();
      double diff = 0;
      for (size_t i = 0; i < ga.size(); ++i) diff = std::max(diff, std::abs(ga[i] - gb[i]));
      EXPECT_LE(diff, 1e-2 * max_abs(ga) + 1e-6) << p.name << ": the first step's gradient";
    }
  }
  ops::autocast::clear_cache();
}
