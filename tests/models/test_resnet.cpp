// ResNet and LeNet-5: torchvision's names, shapes and parameter counts, its initialisation,
// the stems, and a checkpoint that round-trips under those names (the file
// torchvision.models.resnet18().load_state_dict reads).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "core/autograd.h"
#include "core/random.h"
#include "models/image_classifier.h"
#include "models/resnet.h"
#include "nn/flat_parameters.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"

using namespace precis;
namespace fs = std::filesystem;

namespace {

using Table = std::map<std::string, Shape>;

Table names_and_shapes(const nn::Module& model) {
  Table table;
  for (const auto& [name, tensor] : model.state_dict()) table[name] = tensor.shape();
  return table;
}

// torchvision.models.resnet's state_dict, from its source's rules (resnet.py): the stem's
// conv1/bn1; _make_layer(planes, blocks, stride) with a downsample (conv1x1 + BatchNorm2d)
// on a block whose stride is not 1 or whose input width is not planes * expansion; BasicBlock
// conv1 3x3 (stride), conv2 3x3; Bottleneck conv1 1x1, conv2 3x3 (stride), conv3 1x1 to
// planes * 4; every BatchNorm2d with weight, bias, running_mean, running_var and
// num_batches_tracked (a 0-d tensor); fc [classes, 512 * expansion].
Table torchvision_resnet(const std::vector<int64_t>& blocks, bool bottleneck, int64_t classes, int64_t stem_kernel) {
  Table t;
  auto bn = [&](const std::string& prefix, int64_t c) {
    for (const char* name : {"weight", "bias", "running_mean", "running_var"}) t[prefix + "." + name] = {c};
    t[prefix + ".num_batches_tracked"] = {};
  };
  t["conv1.weight"] = {64, 3, stem_kernel, stem_kernel};
  bn("bn1", 64);
  const int64_t expansion = bottleneck ? 4 : 1;
  int64_t inplanes = 64;
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t planes = 64 * (1 << layer);
    for (int64_t b = 0; b < blocks[layer]; ++b) {
      const int64_t stride = b == 0 && layer > 0 ? 2 : 1;
      const std::string p = "layer" + std::to_string(layer + 1) + "." + std::to_string(b) + ".";
      if (bottleneck) {
        t[p + "conv1.weight"] = {planes, inplanes, 1, 1};
        t[p + "conv2.weight"] = {planes, planes, 3, 3};
        t[p + "conv3.weight"] = {planes * 4, planes, 1, 1};
        bn(p + "bn3", planes * 4);
      } else {
        t[p + "conv1.weight"] = {planes, inplanes, 3, 3};
        t[p + "conv2.weight"] = {planes, planes, 3, 3};
      }
      bn(p + "bn1", planes);
      bn(p + "bn2", planes);
      if (stride != 1 || inplanes != planes * expansion) {
        t[p + "downsample.0.weight"] = {planes * expansion, inplanes, 1, 1};
        bn(p + "downsample.1", planes * expansion);
      }
      inplanes = planes * expansion;
    }
  }
  t["fc.weight"] = {classes, 512 * expansion};
  t["fc.bias"] = {classes};
  return t;
}

std::shared_ptr<models::ImageClassifier> make(const std::string& name, int64_t classes, bool cifar_stem = false,
                                              uint64_t seed = 1) {
  return models::make_image_model({name, 3, classes, cifar_stem}, seed);
}

}  // namespace

// The counts torchvision reports: sum(p.numel() for p in resnetXX().parameters()) and
// len(resnetXX().state_dict()).
TEST(ResNet, TorchvisionNamesShapesAndCounts) {
  struct Case {
    const char* name;
    std::vector<int64_t> blocks;
    bool bottleneck;
    int64_t parameters;
    size_t state_entries;
  };
  for (const Case& c :
       {Case{"resnet18", {2, 2, 2, 2}, false, 11689512, 122}, Case{"resnet34", {3, 4, 6, 3}, false, 21797672, 218},
        Case{"resnet50", {3, 4, 6, 3}, true, 25557032, 320}}) {
    auto model = make(c.name, 1000);
    EXPECT_EQ(model->num_parameters(), c.parameters) << c.name;
    EXPECT_EQ(model->state_dict().size(), c.state_entries) << c.name;
    EXPECT_EQ(names_and_shapes(*model), torchvision_resnet(c.blocks, c.bottleneck, 1000, 7)) << c.name;
  }
  const auto state = make("resnet18", 1000)->state_dict();
  EXPECT_EQ(state.at("bn1.num_batches_tracked").dtype(), DType::i64);
  EXPECT_EQ(state.at("layer2.0.downsample.0.weight").shape(), (Shape{128, 64, 1, 1}));
  EXPECT_FALSE(state.count("layer1.0.downsample.0.weight")) << "layer1 keeps the width: no downsample";
}

TEST(ResNet, CifarStemAndForwardShapes) {
  auto cifar = make("resnet18", 10, /*cifar_stem=*/true);
  EXPECT_EQ(cifar->state_dict().at("conv1.weight").shape(), (Shape{64, 3, 3, 3}));
  cifar->eval();
  NoGradGuard no_grad;
  EXPECT_EQ(cifar->forward(randn({2, 3, 16, 16})).shape(), (Shape{2, 10}));
  auto imagenet = make("resnet18", 7);
  imagenet->eval();
  EXPECT_EQ(imagenet->forward(randn({1, 3, 64, 64})).shape(), (Shape{1, 7}));
  auto lenet = models::make_image_model({"lenet5", 1, 10, false}, 1);
  EXPECT_EQ(lenet->forward(randn({3, 1, 28, 28})).shape(), (Shape{3, 10}));
  EXPECT_EQ(lenet->num_parameters(), 61706) << "6*25+6 + 16*150+16 + 400*120+120 + 120*84+84 + 84*10+10";
}

// torchvision: kaiming_normal_(fan_out, relu) convolutions, BN weight 1 and bias 0, fc
// uniform in +-1/sqrt(512); a seed fixes the model.
TEST(ResNet, TorchvisionInitialisation) {
  auto model = make("resnet18", 10);
  auto state = model->state_dict();
  auto stats = [](const Tensor& t) {
    std::vector<float> v = t.to_vector<float>();
    double sum = 0, sq = 0;
    for (float x : v) sum += x, sq += double(x) * x;
    const double mean = sum / v.size();
    return std::pair<double, double>{mean, std::sqrt(sq / v.size() - mean * mean)};
  };
  auto [mean, std] = stats(state.at("layer3.0.conv1.weight"));  // [256, 128, 3, 3]: fan_out 2304
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(std, std::sqrt(2.0 / 2304), 0.03 * std::sqrt(2.0 / 2304));
  EXPECT_EQ(state.at("layer3.0.bn1.weight").to_vector<float>(), std::vector<float>(256, 1.0f));
  EXPECT_EQ(state.at("layer3.0.bn1.bias").to_vector<float>(), std::vector<float>(256, 0.0f));
  EXPECT_EQ(state.at("layer3.0.bn1.running_var").to_vector<float>(), std::vector<float>(256, 1.0f));
  for (float w : state.at("fc.weight").to_vector<float>()) EXPECT_LE(std::abs(w), 1.0 / std::sqrt(512.0));
  EXPECT_EQ(make("resnet18", 10, false, 1)->state_dict().at("conv1.weight").to_vector<float>(),
            state.at("conv1.weight").to_vector<float>());
  EXPECT_NE(make("resnet18", 10, false, 2)->state_dict().at("conv1.weight").to_vector<float>(),
            state.at("conv1.weight").to_vector<float>());
}

// A checkpoint holds the state_dict under torchvision's names (batch-norm buffers included,
// as they were after a training forward) and loads back into a fresh model.
TEST(ResNet, CheckpointRoundTripsUnderTorchvisionNames) {
  const fs::path dir = fs::temp_directory_path() / "precis_test_resnet_checkpoint";
  fs::remove_all(dir);
  auto model = make("resnet18", 10, /*cifar_stem=*/true, 3);
  Tensor images = randn({4, 3, 8, 8});
  model->forward(images);  // training mode: the running statistics move, one batch counted
  Json config = Json::object();
  config["model"] = "resnet18";
  const std::string folder = train::save_checkpoint(dir.string(), 1, train::module_checkpoint_model(*model, config),
                                                    nullptr, Json::object(), 2);

  train::SafetensorsFile file = train::read_safetensors((fs::path(folder) / "model.safetensors").string());
  Table saved;
  for (const auto& [name, tensor] : file.tensors) saved[name] = tensor.shape();
  EXPECT_EQ(saved, torchvision_resnet({2, 2, 2, 2}, false, 10, 3));
  const auto state = model->state_dict();
  for (const auto& [name, tensor] : file.tensors) {
    ASSERT_EQ(tensor.dtype(), state.at(name).dtype()) << name;
    if (tensor.dtype() == DType::i64) {
      EXPECT_EQ(tensor.to_vector<int64_t>(), std::vector<int64_t>{1}) << name;
    } else {
      EXPECT_EQ(tensor.to_vector<float>(), state.at(name).to_vector<float>()) << name;
    }
  }
  EXPECT_NE(state.at("bn1.running_mean").to_vector<float>(), std::vector<float>(64, 0.0f));

  auto fresh = make("resnet18", 10, /*cifar_stem=*/true, 4);
  train::load_checkpoint(dir.string(), train::module_checkpoint_model(*fresh, config));
  const auto loaded = fresh->state_dict();
  for (const auto& [name, tensor] : state) {
    if (tensor.dtype() == DType::i64) {
      EXPECT_EQ(loaded.at(name).to_vector<int64_t>(), tensor.to_vector<int64_t>()) << name;
    } else {
      EXPECT_EQ(loaded.at(name).to_vector<float>(), tensor.to_vector<float>()) << name;
    }
  }
  model->eval();
  fresh->eval();
  NoGradGuard no_grad;
  EXPECT_EQ(fresh->forward(images).to_vector<float>(), model->forward(images).to_vector<float>());

  auto other = make("resnet34", 10, true);
  EXPECT_THROW(train::load_checkpoint(dir.string(), train::module_checkpoint_model(*other, config)), Error);
  fs::remove_all(dir);
}

// Weights laid out channels-last (nn::to_channels_last, as a channels-last run does) are saved
// row-major, as torchvision reads them: the file holds a row-major twin's tensors, and it loads
// into a row-major model and into a channels-last one with the same values.
TEST(ResNet, ChannelsLastWeightsAreSavedRowMajor) {
  const fs::path dir = fs::temp_directory_path() / "precis_test_resnet_checkpoint_channels_last";
  fs::remove_all(dir);
  auto model = make("resnet18", 10, /*cifar_stem=*/true, 3), twin = make("resnet18", 10, /*cifar_stem=*/true, 3);
  nn::to_channels_last(*model);
  ASSERT_FALSE(model->state_dict().at("layer1.0.conv1.weight").is_contiguous());
  Json config = Json::object();
  config["model"] = "resnet18";
  const std::string folder = train::save_checkpoint(dir.string(), 1, train::module_checkpoint_model(*model, config),
                                                    nullptr, Json::object(), 2);

  train::SafetensorsFile file = train::read_safetensors((fs::path(folder) / "model.safetensors").string());
  const auto reference = twin->state_dict();
  for (const auto& [name, tensor] : file.tensors) {
    ASSERT_TRUE(tensor.is_contiguous()) << name;
    if (tensor.dtype() == DType::i64) continue;
    // The file's bytes in order: the row-major reading of the logical tensor.
    const float* bytes = tensor.data<float>();
    EXPECT_EQ(std::vector<float>(bytes, bytes + tensor.numel()), reference.at(name).to_vector<float>()) << name;
  }

  for (bool channels_last : {false, true}) {
    auto fresh = make("resnet18", 10, /*cifar_stem=*/true, 4);
    if (channels_last) nn::to_channels_last(*fresh);
    train::load_checkpoint(dir.string(), train::module_checkpoint_model(*fresh, config));
    const auto loaded = fresh->state_dict();
    for (const auto& [name, tensor] : reference) {
      if (tensor.dtype() == DType::i64) continue;
      EXPECT_EQ(loaded.at(name).to_vector<float>(), tensor.to_vector<float>()) << name;
    }
    EXPECT_EQ(loaded.at("conv1.weight").is_contiguous(), !channels_last) << "loading keeps the model's layout";
  }
  fs::remove_all(dir);
}

// The shortcut-stream switch (models::set_shortcut_stream) moves a GPU block's downsample to the
// side stream only: a CPU ResNet-18's output, gradients and batch-norm statistics are the same
// bits with it set either way.
TEST(ResNet, ShortcutStreamSwitchLeavesTheCpuPathAlone) {
  using models::ShortcutStream;
  const Tensor images = randn({2, 3, 8, 8}), gy = randn({2, 10});
  std::map<ShortcutStream, std::map<std::string, std::vector<float>>> results;
  const ShortcutStream previous = models::shortcut_stream();
  for (ShortcutStream where : {ShortcutStream::off, ShortcutStream::forward, ShortcutStream::forward_and_backward}) {
    models::set_shortcut_stream(where);
    auto model = make("resnet18", 10, /*cifar_stem=*/true, 7);
    Tensor out = model->forward(images);
    out.backward(gy);
    results[where]["output"] = out.detach().to_vector<float>();
    for (const auto& p : model->named_parameters())
      results[where][p.name + ".grad"] = p.tensor.grad().to_vector<float>();
    for (const auto& [name, tensor] : model->state_dict())
      if (tensor.dtype() == DType::f32) results[where][name] = tensor.to_vector<float>();
  }
  models::set_shortcut_stream(previous);
  EXPECT_EQ(results[ShortcutStream::forward], results[ShortcutStream::off]);
  EXPECT_EQ(results[ShortcutStream::forward_and_backward], results[ShortcutStream::off]);
}
