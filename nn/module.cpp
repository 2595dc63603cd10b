#include "nn/module.h"

#include <set>
#include <sstream>

#include "core/autograd.h"
#include "core/copy.h"

namespace precis::nn {

Tensor Module::forward(const Tensor&) {
  PRECIS_FAIL(type_name_, " has no single-input forward(x); call its own forward");
}

void Module::check_new_name(const std::string& name) const {
  PRECIS_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": bad member name '", name,
               "' (must be non-empty, without dots)");
  auto taken = [&](const auto& list) {
    for (const auto& item : list)
      if (item.name == name) return true;
    return false;
  };
  bool child = false;
  for (const auto& [child_name, module] : children_) child |= child_name == name;
  PRECIS_CHECK(!taken(parameters_) && !taken(buffers_) && !child, type_name_, ": '", name, "' is registered twice");
}

Tensor& Module::register_parameter(const std::string& name, Tensor tensor, bool weight_decay) {
  check_new_name(name);
  PRECIS_CHECK(tensor.defined(), type_name_, ": parameter '", name, "' is undefined");
  if (!tensor.requires_grad()) tensor.set_requires_grad(true);
  parameters_.push_back({name, tensor});
  parameter_decays_.push_back(weight_decay);
  return parameters_.back().tensor;
}

Tensor& Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name);
  buffers_.push_back({name, tensor});
  return buffers_.back().tensor;
}

void Module::collect(const std::string& prefix, std::vector<NamedTensor>& out, bool buffers) const {
  for (const auto& p : buffers ? buffers_ : parameters_) out.push_back({prefix + p.name, p.tensor});
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, buffers);
}

std::vector<NamedTensor> Module::named_parameters() const {
  std::vector<NamedTensor> out;
  collect("", out, false);
  // A parameter shared by two modules (tied embeddings) is listed once, under its first name.
  std::set<TensorImpl*> seen;
  std::vector<NamedTensor> unique;
  for (auto& p : out)
    if (seen.insert(p.tensor.impl()).second) unique.push_back(p);
  return unique;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& p : named_parameters()) out.push_back(p.tensor);
  return out;
}

std::vector<NamedTensor> Module::named_buffers() const {
  std::vector<NamedTensor> out;
  collect("", out, true);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  apply([&](Module& m, const std::string& name) { out.emplace_back(name, &m); });
  return out;
}

bool Module::decays(const std::string& parameter_name) const {
  size_t dot = parameter_name.find('.');
  if (dot == std::string::npos) {
    for (size_t i = 0; i < parameters_.size(); ++i)
      if (parameters_[i].name == parameter_name) return parameter_decays_[i];
    PRECIS_FAIL(type_name_, " has no parameter '", parameter_name, "'");
  }
  std::string head = parameter_name.substr(0, dot);
  for (const auto& [name, child] : children_)
    if (name == head) return child->decays(parameter_name.substr(dot + 1));
  PRECIS_FAIL(type_name_, " has no child module '", head, "'");
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) n += p.tensor.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (const Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    fill_(p.grad(), 0.0);
  }
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> state;
  std::vector<NamedTensor> all;
  collect("", all, false);
  collect("", all, true);
  for (auto& t : all) state.emplace(t.name, t.tensor.detach());
  return state;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  std::map<std::string, Tensor> own = state_dict();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, tensor] : own) {
    auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
    } else if (it->second.shape() != tensor.shape()) {
      std::ostringstream m;
      m << name << " (checkpoint " << it->second.shape() << ", model " << tensor.shape() << ")";
      mismatched.push_back(m.str());
    }
  }
  for (const auto& [name, tensor] : state)
    if (!own.count(name)) unexpected.push_back(name);
  auto list = [](const std::vector<std::string>& names) {
    std::string s;
    for (size_t i = 0; i < names.size() && i < 8; ++i) s += (i ? ", " : "") + names[i];
    if (names.size() > 8) s += ", ... (" + std::to_string(names.size()) + " in all)";
    return s;
  };
  PRECIS_CHECK(mismatched.empty(), "load_state_dict: shape mismatch for ", list(mismatched),
               "; the checkpoint was made for a different model configuration");
  PRECIS_CHECK(!strict || missing.empty(), "load_state_dict: missing from the state: ", list(missing));
  PRECIS_CHECK(!strict || unexpected.empty(), "load_state_dict: not in the model: ", list(unexpected));
  NoGradGuard no_grad;
  for (const auto& [name, tensor] : own) {
    auto it = state.find(name);
    if (it != state.end()) copy_(tensor, it->second);
  }
}

void Module::apply(const std::function<void(Module&, const std::string&)>& fn) {
  std::function<void(Module&, const std::string&)> visit = [&](Module& m, const std::string& name) {
    fn(m, name);
    for (auto& [child_name, child] : m.children_) visit(*child, name.empty() ? child_name : name + "." + child_name);
  };
  visit(*this, "");
}

}  // namespace precis::nn
