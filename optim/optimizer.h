// Optimizer base: parameter groups, learning rate, zero_grad, saveable state.
//
// Low-precision (f16/bf16) parameters: optimizers keep their moments in f32
// and, with master weights, an f32 copy of the parameter ("state.<i>.master")
// that the update is applied to; the parameter then holds the copy rounded
// (optim/low_precision.h). The master copy is saved and restored with the rest
// of the state.
//
// On a GPU the learning rate and the step count can live in device memory
// (keep_state_on_device), so that an update waits for nothing on the host and a
// CUDA graph that holds it picks up each step's values: set_lr queues a copy of
// the new rate (from pinned memory, ordered on the compute stream; call it
// outside a capture), and the step count advances on the device, only for steps
// that are not skipped (AdamW::step_on_device). step_count() reads it back.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace precis::nn {
class Module;
}

namespace precis::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;

  // Applies one update from the parameters' current .grad (parameters without a gradient are skipped).
  virtual void step() = 0;
  // Zeroes gradients in place (they may live in a flat buffer).
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);
  int64_t step_count() const;
  // Moves the learning rate and step count to `device` (a GPU) for good.
  void keep_state_on_device(Device device);
  bool state_on_device() const { return device_lr_.defined(); }
  std::vector<ParamGroup>& param_groups() { return groups_; }

  // State as named tensors ("step", "state.<i>.<buffer>" with i the parameter's index
  // over all groups, "state.<i>.master" for master copies), for checkpoints.
  // Loading checks names, shapes, and that master copies are f32 and belong to
  // f16/bf16 parameters.
  virtual std::map<std::string, Tensor> state_dict() const;
  virtual void load_state_dict(const std::map<std::string, Tensor>& state);

  // The f32 master copy of parameter `param_index` (over all groups); undefined if it has none (yet).
  Tensor master(size_t param_index) const;

 protected:
  // Per-parameter state buffers, created lazily (zeros like the parameter, f32 or f64).
  Tensor& state_buffer(size_t param_index, const std::string& name, const Tensor& like);
  // The f32 master copy of a low-precision parameter, a copy of it on first use.
  Tensor& master_buffer(size_t param_index, const Tensor& param);
  // Calls fn(index, param, weight_decay) for every parameter with a gradient.
  template <typename Fn>
  void for_each_param(Fn&& fn) {
    size_t index = 0;
    for (auto& group : groups_)
      for (auto& p : group.params) {
        if (p.grad().defined()) fn(index, p, group.weight_decay);
        ++index;
      }
  }

  double lr_ = 1e-3;
  int64_t step_count_ = 0;  // the count unless state_on_device()
  // keep_state_on_device: the learning rate (f64 scalar) and the step count (i64 scalar).
  Tensor device_lr_, device_step_;

 private:
  std::vector<ParamGroup> groups_;
  std::map<std::string, Tensor> state_;
};

// nanoGPT's default groups: weight decay on the weights of Linear layers only;
// none on biases, LayerNorm weights and embeddings.
std::vector<ParamGroup> default_param_groups(const nn::Module& model, double weight_decay);

}  // namespace precis::optim
