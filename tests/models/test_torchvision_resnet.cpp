// A Precis ResNet checkpoint in torchvision: scripts/check_torchvision_resnet.py loads the
// checkpoint's model.safetensors with torchvision.models.resnetXX().load_state_dict(strict=True)
// and checks that torchvision computes, on the same images, the logits Precis computed here
// (eval mode and a training-mode forward) and the running statistics that forward left; also
// from a model whose weights were laid out channels-last, which are saved row-major.
// Needs python3 with torch and torchvision; skips, saying so, where they do not import.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/random.h"
#include "models/image_classifier.h"
#include "nn/batch_norm.h"
#include "nn/flat_parameters.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"

using namespace precis;
namespace fs = std::filesystem;

namespace {

bool torchvision_importable() { return std::system("python3 -c 'import torchvision' >/dev/null 2>&1") == 0; }

// Batch-norm parameters and running statistics away from their initial 1 and 0, so that the
// eval forward depends on every one of them being read under the right name.
void randomise_batch_norms(nn::Module& model, Generator& gen) {
  NoGradGuard no_grad;
  model.apply([&](nn::Module& m, const std::string&) {
    auto* bn = dynamic_cast<nn::BatchNorm2d*>(&m);
    if (!bn) return;
    const Shape shape = bn->weight.shape();
    copy_(bn->weight, rand(shape, DType::f32, &gen, 0.5, 1.5));
    copy_(bn->bias, randn(shape, DType::f32, &gen, 0.0, 0.1));
    copy_(bn->running_mean, randn(shape, DType::f32, &gen, 0.0, 0.1));
    copy_(bn->running_var, rand(shape, DType::f32, &gen, 0.5, 1.5));
  });
}

struct Case {
  const char* model;
  bool cifar_stem;
  int64_t image;
  bool channels_last = false;  // the weights laid out channels-last (nn::to_channels_last) before saving
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << (c.cifar_stem ? " (CIFAR stem)" : "") << " at " << c.image << "x" << c.image
      << (c.channels_last ? ", channels-last weights" : "");
}

class TorchvisionResNet : public ::testing::TestWithParam<Case> {};

TEST_P(TorchvisionResNet, LoadsAndComputesTheSameLogits) {
  if (!torchvision_importable())
    GTEST_SKIP() << "python3 cannot import torchvision (pip install torch torchvision), so "
                    "scripts/check_torchvision_resnet.py cannot run";
  const Case c = GetParam();
  const fs::path dir =
      fs::temp_directory_path() / (std::string("precis_torchvision_") + c.model +
                                   (c.cifar_stem ? "_cifar" : "_imagenet") + (c.channels_last ? "_channels_last" : ""));
  fs::remove_all(dir);
  Generator gen(7);
  auto model = models::make_image_model({c.model, 3, 10, c.cifar_stem}, 11);
  if (c.channels_last) nn::to_channels_last(*model);
  randomise_batch_norms(*model, gen);
  Json config = Json::object();
  config["model"] = c.model;
  const std::string folder = train::save_checkpoint(
      (dir / "run").string(), 1, train::module_checkpoint_model(*model, config), nullptr, Json::object(), 1);

  const Tensor images = randn({4, 3, c.image, c.image}, DType::f32, &gen);
  std::vector<nn::NamedTensor> reference{{"images", images}};
  {
    NoGradGuard no_grad;
    model->eval();
    reference.push_back({"eval_logits", model->forward(images)});
    model->train();
    reference.push_back({"train_logits", model->forward(images)});  // moves the running statistics
  }
  for (const auto& [name, tensor] : model->state_dict())
    if (name.ends_with("running_mean") || name.ends_with("running_var")) reference.push_back({"after." + name, tensor});
  const fs::path reference_path = dir / "reference.safetensors";
  train::write_safetensors(reference_path.string(), reference);

  const std::string command = std::string("python3 scripts/check_torchvision_resnet.py --checkpoint ") +
                              (fs::path(folder) / "model.safetensors").string() + " --reference " +
                              reference_path.string() + " --model " + c.model + (c.cifar_stem ? " --cifar-stem" : "");
  std::cout << command << std::endl;
  EXPECT_EQ(std::system(command.c_str()), 0) << "torchvision disagrees (its output above): " << command;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, TorchvisionResNet,
                         ::testing::Values(Case{"resnet18", true, 32}, Case{"resnet18", false, 64},
                                           Case{"resnet50", false, 64}, Case{"resnet18", true, 32, true}),
                         [](const auto& info) {
                           return std::string(info.param.model) + (info.param.cifar_stem ? "_cifar" : "_imagenet") +
                                  (info.param.channels_last ? "_channels_last" : "");
                         });

}  // namespace
