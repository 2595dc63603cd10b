// Optimizer base: parameter groups, learning rate, zero_grad, saveable state.
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
  void set_lr(double lr) { lr_ = lr; }
  int64_t step_count() const { return step_count_; }
  std::vector<ParamGroup>& param_groups() { return groups_; }

  // State as named tensors ("step", "state.<i>.<buffer>" with i the parameter's index
  // over all groups), for checkpoints. Loading checks names and shapes.
  virtual std::map<std::string, Tensor> state_dict() const;
  virtual void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  // Per-parameter state buffers, created lazily (zeros like the parameter, f32 or f64).
  Tensor& state_buffer(size_t param_index, const std::string& name, const Tensor& like);
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
  int64_t step_count_ = 0;

 private:
  std::vector<ParamGroup> groups_;
  std::map<std::string, Tensor> state_;
};

// nanoGPT's default groups: weight decay on the weights of Linear layers only;
// none on biases, LayerNorm weights and embeddings.
std::vector<ParamGroup> default_param_groups(const nn::Module& model, double weight_decay);

}  // namespace precis::optim
