// Module: the base of every layer and model, as torch.nn.Module.
//
// A module owns named parameters, named buffers and named child modules, all
// reachable by dotted names ("h.0.attn.c_attn.weight"). Parameters are plain
// tensors with requires_grad; after a model is built, nn::flatten_parameters
// packs them into one buffer per dtype (docs/architecture.md, "Modules and flat buffers").
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace precis::nn {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // The single-input forward of simple layers (Linear, LayerNorm, GELU, ...).
  // Modules with other signatures (GPT-2's forward(idx, targets)) define their own.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // ---- registration (call from constructors)
  // `weight_decay`: whether AdamW's default groups decay this parameter.
  Tensor& register_parameter(const std::string& name, Tensor tensor, bool weight_decay = false);
  Tensor& register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    check_new_name(name);
    children_.emplace_back(name, module);
    return module;
  }

  // ---- access, recursively, with dotted names in registration order
  std::vector<NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::vector<NamedTensor> named_buffers() const;
  std::vector<std::pair<std::string, Module*>> named_modules();
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  bool decays(const std::string& parameter_name) const;  // dotted name
  int64_t num_parameters() const;

  // ---- modes and gradients
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Zeroes every gradient in place (gradients that live in a flat buffer stay there).
  void zero_grad();

  // ---- state: parameters and buffers by dotted name
  std::map<std::string, Tensor> state_dict() const;
  // Copies values in. Missing or unexpected names and shape mismatches are errors that list them.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

  // Calls fn(module, dotted_name) for this module and every descendant (pre-order).
  void apply(const std::function<void(Module&, const std::string&)>& fn);

 private:
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, std::vector<NamedTensor>& out, bool buffers) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<NamedTensor> parameters_;
  std::vector<bool> parameter_decays_;
  std::vector<NamedTensor> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace precis::nn
