#include "train/image_task.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/error.h"
#include "core/pinned.h"
#include "core/source_dir.h"
#include "nn/flat_parameters.h"
#include "ops/autocast.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/memory_format.h"
#include "ops/nn_functional.h"

namespace precis::train {

namespace {

ImageNormalization normalization_for(const std::string& dataset, int64_t channels) {
  if (dataset == "mnist") return {{0.1307f}, {0.3081f}};
  if (dataset == "cifar10") return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
  return {std::vector<float>(channels, 0.5f), std::vector<float>(channels, 0.5f)};
}

std::shared_ptr<const ImageSet> load_split(const TrainConfig& config, bool train, int world_size) {
  const DataConfig& d = config.data;
  if (d.dataset == "mnist")
    return std::make_shared<ImageSet>(read_mnist(d.dir.empty() ? PRECIS_SOURCE_DIR "/assets/mnist" : d.dir, train));
  if (d.dataset == "cifar10") return std::make_shared<ImageSet>(read_cifar10(d.dir, train));
  // Synthetic: two global batches to train on, one to validate on (benchmarks).
  const int64_t count = (train ? 2 : 1) * config.batch.micro_batch * world_size;
  return std::make_shared<ImageSet>(
      synthetic_images(count, d.channels, d.image_size, d.num_classes, config.seed + (train ? 0 : 1)));
}

Json model_json(const models::ImageModelConfig& c) {
  Json json = Json::object();
  json["model"] = c.name;
  json["in_channels"] = c.in_channels;
  json["num_classes"] = c.num_classes;
  json["cifar_stem"] = c.cifar_stem;
  return json;
}

const char* display_name(const std::string& model) {
  if (model == "lenet5") return "LeNet-5";
  if (model == "resnet18") return "ResNet-18";
  if (model == "resnet34") return "ResNet-34";
  return "ResNet-50";
}

}  // namespace

int64_t count_correct(const Tensor& logits, const Tensor& targets) {
  PRECIS_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
               "accuracy: expects logits [N, C] and targets [N], got ", logits.shape(), " and ", targets.shape());
  const std::vector<float> values = logits.to(Device::cpu()).to(DType::f32).contiguous().to_vector<float>();
  const std::vector<int64_t> labels = targets.to(Device::cpu()).to(DType::i64).contiguous().to_vector<int64_t>();
  const int64_t N = logits.size(0), C = logits.size(1);
  int64_t correct = 0;
  for (int64_t n = 0; n < N; ++n) {
    const float* row = values.data() + n * C;
    correct += std::max_element(row, row + C) - row == labels[n];
  }
  return correct;
}

double accuracy(const Tensor& logits, const Tensor& targets) {
  return static_cast<double>(count_correct(logits, targets)) /
         static_cast<double>(std::max<int64_t>(logits.size(0), 1));
}

ImageTask::ImageTask(const TrainConfig& config, int rank, int world_size, bool channels_last,
                     const amp::PrecisionPolicy& policy, bool pinned)
    : config_(config),
      rank_(rank),
      world_size_(world_size),
      channels_last_(channels_last),
      input_dtype_(policy.compute_dtype),
      autocasts_(policy.autocasts()) {
  train_set_ = load_split(config, /*train=*/true, world_size);
  test_set_ = load_split(config, /*train=*/false, world_size);
  normalization_ = normalization_for(config.data.dataset, train_set_->channels);

  ImageDatasetOptions options;
  options.batch_size = config.batch.micro_batch;
  options.shuffle = config.data.order == "random";
  options.seed = config.seed;
  options.normalization = normalization_;
  options.crop_padding = config.data.crop_padding;
  options.flip = config.data.flip;
  options.prefetch = config.data.prefetch;
  options.pinned = pinned;
  options.rank = rank;
  options.world_size = world_size;
  // Synthetic data (benchmarks) is one batch made once and given every step, so the loader
  // costs nothing and the trainer copies it to the device only once.
  const bool synthetic = config.data.dataset == "synthetic";
  if (synthetic) options.prefetch = false;
  train_data_ = std::make_unique<ImageDataset>(train_set_, options);
  if (synthetic) {
    ImageBatch fixed = train_data_->next_batch();
    fixed_batch_ = {fixed.images, fixed.labels};
  }

  models::ImageModelConfig model_config = config.image_model;
  model_config.in_channels = train_set_->channels;
  model_config.num_classes = train_set_->num_classes;
  model_ = models::make_image_model(model_config, config.seed);
  // The weights channels-last too, before the trainer flattens them (which keeps the layout): the
  // convolutions then find their filters' casts in cuDNN's channels-last layout, and their
  // weight gradients go into .grad as they come.
  if (channels_last_) nn::to_channels_last(*model_);
}

TaskBatch ImageTask::next_batch() {
  if (fixed_batch_.inputs.defined()) return fixed_batch_;
  ImageBatch batch = train_data_->next_batch();
  return {batch.images, batch.labels};
}

// The images in the compute dtype (autocast's cast inside the first convolution would make a
// dense NCHW copy), laid out channels-last where the network is: both in one strided copy (the
// images need no gradient).
Tensor ImageTask::model_input(const Tensor& images) const {
  if (!channels_last_) return input_dtype_ == images.dtype() ? images : ops::cast(images, input_dtype_);
  const Tensor x = ops::empty_in(images.shape(), ops::MemoryFormat::channels_last, input_dtype_, images.device());
  copy_(x, images);
  return x;
}

TaskLoss ImageTask::forward(const Tensor& inputs, const Tensor& targets, const Tensor&) {
  Tensor logits = model_->forward(model_input(inputs));
  last_logits_ = logits.detach();
  last_targets_ = targets;
  return {ops::cross_entropy(logits, targets), Tensor(), Tensor()};
}

std::optional<double> ImageTask::last_train_accuracy() {
  if (!last_logits_.defined()) return std::nullopt;
  return accuracy(last_logits_, last_targets_);
}

EvalTotals ImageTask::evaluate() {
  const ImageSet& test = *test_set_;
  const int64_t B = config_.batch.micro_batch;
  const int64_t batches = (test.count + B - 1) / B;
  const int64_t steps = config_.eval_steps > 0 ? std::min(config_.eval_steps, batches) : batches;
  const Device device = model_->parameters().front().device();
  ops::autocast::Scope autocast(input_dtype_, autocasts_);  // the training step's precision
  EvalTotals totals;
  // Batch i is rank (i mod world_size)'s: the ranks' totals add up to the whole pass.
  for (int64_t i = rank_; i < steps; i += world_size_) {
    const int64_t first = i * B, count = std::min(B, test.count - first);
    ImageBatch batch = image_batch(test, first, count, normalization_, device.is_cuda());
    Tensor logits = model_->forward(model_input(batch.images.to(device)));
    const Tensor targets = batch.labels.to(device);
    totals.loss_sum += ops::cross_entropy(logits, targets).item() * static_cast<double>(count);
    totals.loss_count += static_cast<double>(count);
    totals.correct += static_cast<double>(count_correct(logits, targets));
    totals.examples += static_cast<double>(count);
  }
  return totals;
}

CheckpointModel ImageTask::checkpoint_model() {
  CheckpointModel m = module_checkpoint_model(*model_, model_json(model_->config()));
  m.check_config = [this](const Json& saved, const std::string& source) {
    const Json mine = model_json(model_->config());
    PRECIS_CHECK(saved.dump() == mine.dump(), "checkpoint '", source, "' was made for the model ", saved.dump(),
                 ", but this run builds ", mine.dump(), "; set model.name, model.cifar_stem and the data to match");
  };
  return m;
}

Json ImageTask::state() const {
  Json state = Json::object();
  state["data"] = train_data_->position().to_json();
  state["model"] = model_json(model_->config());
  return state;
}

void ImageTask::restore(const Json& state) { train_data_->restore(ImageDatasetPosition::from_json(state.at("data"))); }

std::string ImageTask::describe() const {
  const models::ImageModelConfig& c = model_->config();
  return detail::concat(display_name(c.name), c.name.starts_with("resnet") && c.cifar_stem ? " (CIFAR stem)" : "", ", ",
                        c.num_classes, " classes (", static_cast<double>(model_->num_parameters()) / 1e6,
                        "M parameters), ", channels_last_ ? "channels-last" : "NCHW");
}

std::string ImageTask::data_description() const {
  const ImageSet& s = *train_set_;
  return detail::concat(config_.batch.micro_batch, " images of ", s.channels, "x", s.height, "x", s.width, " x ",
                        config_.batch.grad_accum, " micro-steps per step; ", s.count, " training images (",
                        config_.data.dataset, ")");
}

}  // namespace precis::train
