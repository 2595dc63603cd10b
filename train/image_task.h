// The image-classification task (`task: image_classification`, train/task.h): LeNet-5 or a
// ResNet (models/image_classifier.h) on MNIST, CIFAR-10 or synthetic images
// (data/image_dataset.h), the mean cross-entropy of the logits, accuracy, checkpoints in
// torchvision's names (the model's state_dict: parameters and batch-norm buffers).
//
// Normalisation per dataset, as the usual torchvision recipes: MNIST mean 0.1307, std
// 0.3081; CIFAR-10 mean (0.4914, 0.4822, 0.4465), std (0.2470, 0.2435, 0.2616);
// synthetic 0.5 and 0.5. Synthetic data is one batch, made once and given every step, so
// that a benchmark measures the model and not the loader. Validation is the test split, in order, without augmentation:
// eval_steps batches of micro_batch images, or all of it when eval_steps is 0.
// With channels_last the images enter the model in NHWC memory (ops/conv.h), and every
// layer keeps that layout; the convolutions' weights are laid out channels-last too
// (nn::to_channels_last), as PyTorch's model.to(memory_format=torch.channels_last) does.
// Checkpoints hold every tensor row-major, so a run resumes under either setting.
#pragma once

#include <memory>
#include <string>

#include "amp/precision_policy.h"
#include "data/image_dataset.h"
#include "models/image_classifier.h"
#include "train/config.h"
#include "train/task.h"

namespace precis::train {

class ImageTask : public Task {
 public:
  // `channels_last` is resolved by the trainer; the images enter the model in the policy's
  // compute dtype, and evaluation runs under its autocast as training does; `pinned`:
  // batches in pinned memory.
  ImageTask(const TrainConfig& config, int rank, int world_size, bool channels_last, const amp::PrecisionPolicy& policy,
            bool pinned);

  nn::Module& model() override { return *model_; }
  models::ImageClassifier& classifier() { return *model_; }
  TaskBatch next_batch() override;
  TaskLoss forward(const Tensor& inputs, const Tensor& targets, const Tensor& loss_gradient) override;
  std::optional<double> last_train_accuracy() override;
  bool has_validation() const override { return test_set_ != nullptr; }
  EvalTotals evaluate() override;
  CheckpointModel checkpoint_model() override;
  Json state() const override;
  void restore(const Json& state) override;
  std::string describe() const override;
  std::string data_description() const override;
  int64_t items_per_batch() const override { return config_.batch.micro_batch; }
  const char* item_unit() const override { return "img"; }
  bool channels_last() const { return channels_last_; }

 private:
  Tensor model_input(const Tensor& images) const;

  const TrainConfig& config_;
  int rank_, world_size_;
  bool channels_last_;
  DType input_dtype_;
  bool autocasts_;
  std::shared_ptr<const ImageSet> train_set_, test_set_;
  ImageNormalization normalization_;
  std::unique_ptr<ImageDataset> train_data_;
  std::shared_ptr<models::ImageClassifier> model_;
  TaskBatch fixed_batch_;              // synthetic data: the one batch of every step
  Tensor last_logits_, last_targets_;  // of the last training micro-batch, for its accuracy
};

// The fraction of rows whose largest logit (the first of equal ones) is at the target
// (logits [N, C] on any device, read back; targets [N] i32/i64).
double accuracy(const Tensor& logits, const Tensor& targets);
// The number of right predictions, as accuracy() but counted.
int64_t count_correct(const Tensor& logits, const Tensor& targets);

}  // namespace precis::train
