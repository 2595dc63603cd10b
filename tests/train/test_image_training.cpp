// Image classification through the Trainer (task: image_classification) on the CPU: a tiny
// ResNet learns, a run resumed from a checkpoint continues exactly (data order, augmentation,
// batch-norm buffers, optimizer), the log and metrics count images and accuracy, and the
// config's mistakes are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/autograd.h"
#include "core/json.h"
#include "core/source_dir.h"
#include "ops/nn_functional.h"
#include "support/errors.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/image_task.h"
#include "train/trainer.h"

using namespace precis;
using precis::testing::expect_error;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("precis_test_image_training_" + name);
  fs::remove_all(dir);
  return dir;
}

// ResNet-18 with the CIFAR stem on one fixed batch of 8 synthetic 8x8 images of 4 classes.
const char* kTinyResNet = R"(
task: image_classification
model: {name: resnet18, cifar_stem: true}
data: {dataset: synthetic, image_size: 8, channels: 3, num_classes: 4}
optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.0, grad_clip: 1.0}
schedule: {kind: constant}
batch: {micro_batch: 8}
max_steps: 20
eval_interval: 0
log_interval: 5
device: cpu
threads: 2
)";

// LeNet-5 on shuffled, augmented MNIST batches.
const char* kLeNet = R"(
task: image_classification
model: {name: lenet5}
data: {dataset: mnist, order: random, crop_padding: 2, flip: true}
optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.01}
schedule: {kind: cosine, warmup_steps: 2, min_lr: 1.0e-4}
batch: {micro_batch: 16, grad_accum: 2}
max_steps: 6
eval_interval: 3
eval_steps: 4
log_interval: 1
device: cpu
threads: 2
)";

std::string read_file(const fs::path& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

}  // namespace

TEST(ImageTraining, TinyResNetLossDecreases) {
  const fs::path dir = fresh_dir("tiny_resnet");
  train::Trainer trainer(train::parse_config(kTinyResNet, {"out_dir=" + dir.string()}));
  trainer.run();
  const std::vector<double>& losses = trainer.losses();
  ASSERT_EQ(losses.size(), 20u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += losses[i], last += losses[15 + i];
  EXPECT_LT(last, 0.5 * first) << "the mean loss of the last 5 steps should be under half that of the first 5";
  EXPECT_NEAR(losses[0], std::log(4.0), 0.5) << "4 classes: the first loss is near ln 4";
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "latest"));
  // `precis sample` and other GPT-2 readers say what the checkpoint is.
  expect_error([&] { train::checkpoint_model_config((dir / "checkpoints").string()); },
               "holds an image classifier ({\"model\":\"resnet18\"");
}

TEST(ImageTraining, ResumeContinuesExactly) {
  // The tiny ResNet also with its weights channels-last: the optimizer state goes into the
  // checkpoint row-major and comes back in the parameters' layout.
  const std::pair<const char*, const char*> runs[] = {
      {kLeNet, "channels_last=false"}, {kTinyResNet, "channels_last=false"}, {kTinyResNet, "channels_last=true"}};
  for (const auto& [yaml, layout] : runs) {
    const fs::path whole = fresh_dir("whole"), split = fresh_dir("split");
    // One schedule of 6 steps for all three runs (a resume keeps the checkpoint's schedule end
    // rather than stretching it to a new max_steps: train/resume_schedule.h).
    train::Trainer straight(
        train::parse_config(yaml, {"out_dir=" + whole.string(), "max_steps=6", "schedule.decay_steps=6", layout}));
    straight.run();

    train::Trainer first(
        train::parse_config(yaml, {"out_dir=" + split.string(), "max_steps=3", "schedule.decay_steps=6", layout}));
    first.run();  // the final checkpoint at step 3
    train::Trainer second(
        train::parse_config(yaml, {"out_dir=" + split.string(), "max_steps=6", "checkpoint.resume=true", layout}));
    second.run();
    ASSERT_EQ(second.losses().size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(second.losses()[i], straight.losses()[3 + i]) << yaml << layout << " step " << 4 + i;
    // Parameters and the batch-norm buffers (running statistics, batch counts) end the same.
    const auto a = straight.model().state_dict(), b = second.model().state_dict();
    for (const auto& [name, tensor] : a) {
      if (tensor.dtype() == DType::i64) {
        EXPECT_EQ(b.at(name).to_vector<int64_t>(), tensor.to_vector<int64_t>()) << name;
      } else {
        EXPECT_EQ(b.at(name).to_vector<float>(), tensor.to_vector<float>()) << name;
      }
    }
  }
}

// channels_last: true on the CPU lays the images and the convolutions' weights out
// channels-last. The CPU's kernels compute in NCHW whatever the layout, and the optimizer
// updates each element alone, so with the gradients unclipped (the clip factor is the one
// number that depends on the layout: the norm sums the squares in memory order) both layouts
// give the same losses and parameters bit for bit.
TEST(ImageTraining, ChannelsLastWeightsTrainAsRowMajorOnesDo) {
  std::map<std::string, std::vector<double>> losses;
  std::map<std::string, std::map<std::string, Tensor>> states;
  for (const char* channels_last : {"false", "true"}) {
    const fs::path dir = fresh_dir(std::string("layout_") + channels_last);
    train::Trainer trainer(train::parse_config(
        kTinyResNet, {"out_dir=" + dir.string(), "max_steps=4", "optimizer.grad_clip=0", "checkpoint.save_final=false",
                      std::string("channels_last=") + channels_last}));
    trainer.run();
    losses[channels_last] = trainer.losses();
    states[channels_last] = trainer.model().state_dict();
    for (const auto& p : trainer.model().named_parameters()) {
      if (p.tensor.dim() != 4) continue;
      const Tensor w = p.tensor, g = p.tensor.grad();
      const int64_t C = w.size(1), H = w.size(2), W = w.size(3);
      if (channels_last == std::string("true"))
        EXPECT_EQ(w.strides(), (Shape{H * W * C, 1, W * C, C})) << p.name;
      else
        EXPECT_TRUE(w.is_contiguous()) << p.name;
      EXPECT_EQ(g.strides(), w.strides()) << p.name << ": the gradient in its parameter's layout";
    }
  }
  EXPECT_EQ(losses["true"], losses["false"]);
  for (const auto& [name, tensor] : states["false"]) {
    if (tensor.dtype() == DType::i64) continue;
    EXPECT_EQ(states["true"].at(name).to_vector<float>(), tensor.to_vector<float>()) << name;
  }
}

// A checkpoint holds the weights and the optimizer state row-major whatever the run's layout,
// so a run resumes under the other channels_last setting and continues exactly as one that
// never stopped (unclipped: see ChannelsLastWeightsTrainAsRowMajorOnesDo).
TEST(ImageTraining, ResumeUnderTheOtherWeightLayoutContinuesExactly) {
  const std::vector<std::string> common = {"optimizer.grad_clip=0", "schedule.decay_steps=6"};
  auto config = [&](const fs::path& dir, std::vector<std::string> more) {
    more.insert(more.end(), common.begin(), common.end());
    more.push_back("out_dir=" + dir.string());
    return train::parse_config(kTinyResNet, more);
  };
  train::Trainer straight(config(fresh_dir("layout_whole"), {"max_steps=6", "channels_last=false"}));
  straight.run();
  for (const auto& [before, after] :
       std::vector<std::pair<std::string, std::string>>{{"false", "true"}, {"true", "false"}}) {
    const fs::path split = fresh_dir("layout_split_" + before);
    train::Trainer first(config(split, {"max_steps=3", "channels_last=" + before}));
    first.run();
    train::Trainer second(config(split, {"max_steps=6", "checkpoint.resume=true", "channels_last=" + after}));
    second.run();
    ASSERT_EQ(second.losses().size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(second.losses()[i], straight.losses()[3 + i]) << before << " -> " << after << ", step " << 4 + i;
    const auto a = straight.model().state_dict(), b = second.model().state_dict();
    for (const auto& [name, tensor] : a) {
      if (tensor.dtype() == DType::i64) continue;
      EXPECT_EQ(b.at(name).to_vector<float>(), tensor.to_vector<float>()) << before << " -> " << after << ": " << name;
    }
  }
}

TEST(ImageTraining, LogAndMetricsCountImagesAndAccuracy) {
  const fs::path dir = fresh_dir("metrics");
  train::Trainer trainer(train::parse_config(kLeNet, {"out_dir=" + dir.string()}));
  ::testing::internal::CaptureStdout();
  trainer.run();
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("precis: LeNet-5"), std::string::npos) << out;
  EXPECT_NE(out.find("img/s | acc "), std::string::npos) << out;
  ASSERT_TRUE(trainer.last_val_accuracy().has_value());
  EXPECT_GE(*trainer.last_val_accuracy(), 0.0);
  EXPECT_LE(*trainer.last_val_accuracy(), 1.0);
  const std::string metrics = read_file(dir / "metrics.jsonl");
  for (const char* key : {"\"images_per_s\"", "\"accuracy\"", "\"val_accuracy\"", "\"val_loss\""})
    EXPECT_NE(metrics.find(key), std::string::npos) << key << " in " << metrics;
  EXPECT_EQ(metrics.find("tokens_per_s"), std::string::npos);
}

// The validation pass: 4 batches of 16 test images, in order, unaugmented.
TEST(ImageTraining, EvaluationMatchesTheModelOnTheTestImages) {
  const fs::path dir = fresh_dir("eval");
  train::Trainer trainer(train::parse_config(kLeNet, {"out_dir=" + dir.string(), "max_steps=2"}));
  trainer.run();
  const double loss = trainer.evaluate();
  const ImageSet test = read_mnist(PRECIS_SOURCE_DIR "/assets/mnist", false);
  ImageBatch batch = image_batch(test, 0, 64, {{0.1307f}, {0.3081f}});
  NoGradGuard no_grad;
  trainer.model().eval();
  auto& model = dynamic_cast<models::ImageClassifier&>(trainer.model());
  Tensor logits = model.forward(batch.images);
  EXPECT_NEAR(*trainer.last_val_accuracy(), train::accuracy(logits, batch.labels), 1e-12);
  EXPECT_NEAR(loss, ops::cross_entropy(logits, batch.labels).item(), 1e-5);
}

// Training and evaluation under each policy: the images enter in the compute dtype, and the
// validation pass runs under the same autocast as the step.
TEST(ImageTraining, EveryPrecisionPolicyTrainsAndEvaluates) {
  for (const char* precision : {"fp16", "bf16", "bf16-pure"}) {
    const fs::path dir = fresh_dir(std::string("policy_") + precision);
    train::Trainer trainer(train::parse_config(
        kLeNet, {"out_dir=" + dir.string(), "max_steps=2", "eval_interval=2", std::string("precision=") + precision}));
    trainer.run();
    EXPECT_TRUE(std::isfinite(trainer.losses().back())) << precision;
    EXPECT_TRUE(std::isfinite(trainer.final_val_loss())) << precision;
    ASSERT_TRUE(trainer.last_val_accuracy().has_value()) << precision;
  }
}

// The numerics report (precision.report) on a CNN under fp16: each stage's activations and
// their gradients, and a gradient row for every module with parameters, whose counts add up to
// the model's parameters; an inf it reports in a gradient is the overflow for which the loss
// scaler skipped that step (metrics.jsonl).
TEST(ImageTraining, TheNumericsReportCoversAConvolutionalNetwork) {
  const fs::path dir = fresh_dir("numerics");
  train::Trainer trainer(
      train::parse_config(kTinyResNet, {"out_dir=" + dir.string(), "max_steps=2", "log_interval=1", "precision=fp16",
                                        "precision.report=true", "precision.report_interval=1"}));
  trainer.run();
  std::map<std::string, int64_t> activations, act_grads;
  int64_t gradient_rows = 0, gradient_count = 0;
  bool inf_in_a_gradient = false;
  std::ifstream in(dir / "numerics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const Json r = Json::parse(line);
    if (r.at("step").as_int() != 1) continue;
    const std::string kind = r.at("kind").as_string(), name = r.at("name").as_string();
    const int64_t count = r.at("count").as_int();
    if (kind == "activation") activations[name] = count;
    if (kind == "act grad") act_grads[name] = count;
    if (kind == "gradient") {
      ++gradient_rows;
      gradient_count += count;
      inf_in_a_gradient = inf_in_a_gradient || r.at("inf").as_double() > 0;
    }
  }
  // 8 images of 8x8: the stem and layer1 64 channels at 8x8, then half the cells, twice the channels.
  const std::map<std::string, int64_t> expected = {{"stem", 8 * 64 * 64},
                                                   {"layer1", 8 * 64 * 64},
                                                   {"layer2", 8 * 128 * 16},
                                                   {"layer3", 8 * 256 * 4},
                                                   {"layer4", 8 * 512 * 1}};
  EXPECT_EQ(activations, expected);
  EXPECT_EQ(act_grads, expected);
  int64_t parameters = 0;
  for (const Tensor& p : trainer.model().parameters()) parameters += p.numel();
  EXPECT_EQ(gradient_count, parameters);
  EXPECT_EQ(gradient_rows, 41) << "the stem's conv and norm, 8 blocks of two of each, 3 downsamples of two, fc";
  std::ifstream metrics(dir / "metrics.jsonl");
  std::string first;
  std::getline(metrics, first);
  EXPECT_EQ(Json::parse(first).at("skipped_steps").as_int() > 0, inf_in_a_gradient) << first;
}

TEST(ImageTraining, AccuracyCountsTheFirstLargestLogit) {
  Tensor logits = from_vector<float>({0.1f, 0.9f, 0.0f, 2.0f, 2.0f, 1.0f, -1.0f, -3.0f, -2.0f}, {3, 3});
  EXPECT_EQ(train::count_correct(logits, from_vector<int32_t>({1, 0, 0}, {3})), 3);
  EXPECT_EQ(train::count_correct(logits, from_vector<int32_t>({1, 1, 2}, {3})), 1);
  EXPECT_NEAR(train::accuracy(logits, from_vector<int32_t>({2, 0, 0}, {3})), 2.0 / 3.0, 1e-12);
}

TEST(ImageTraining, ConfigMistakesAreClear) {
  expect_error([] { train::parse_config("task: image_classification\ndata: {dataset: cifar10}\n"); },
               "'data.dataset: cifar10' needs 'data.dir'");
  expect_error([] { train::parse_config("task: image_classification\nmodel: {name: vgg}\n"); },
               "'model.name' must be one of lenet5, resnet18, resnet34, resnet50, got 'vgg'");
  expect_error([] { train::parse_config("data: {text_file: a.txt}\nmodel: {name: resnet18}\n"); },
               "'model.name' is a setting of 'task: image_classification'; this run's task is language_model");
  expect_error([] { train::parse_config("task: image_classification\nmodel: {n_layer: 4}\n"); },
               "'model.n_layer' is a setting of 'task: language_model' (GPT-2)");
  expect_error([] { train::parse_config("task: images\n"); },
               "'task' must be one of language_model, image_classification");
  const fs::path dir = fresh_dir("cifar_missing");
  fs::create_directories(dir);
  expect_error(
      [&] {
        train::Trainer trainer(train::parse_config(
            "task: image_classification\nmodel: {name: resnet18}\ndata: {dataset: cifar10, dir: " + dir.string() +
            "}\ndevice: cpu\n"));
      },
      "lacks data_batch_1.bin, data_batch_2.bin, data_batch_3.bin, data_batch_4.bin, data_batch_5.bin");
}
