#include "optim/optimizer.h"

#include "core/copy.h"
#include "core/pinned.h"
#include "nn/module.h"
#include "optim/low_precision.h"

namespace precis::optim {

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr) : lr_(lr), groups_(std::move(groups)) {
  bool first = true;
  for (const auto& g : groups_)
    for (const auto& p : g.params) {
      PRECIS_CHECK(p.defined() && p.requires_grad() && p.is_leaf(),
                   "optimizer: every parameter must be a leaf tensor with requires_grad");
      if (first) device_ = p.device();
      PRECIS_CHECK(p.device() == device_, "optimizer: parameters on ", device_, " and on ", p.device(),
                   "; one optimizer updates the parameters of one device");
      first = false;
    }
  lr_tensor_ = scalar_tensor(lr, DType::f64, device_);
  step_tensor_ = scalar_tensor(0.0, DType::i64, device_);
}

void Optimizer::set_lr(double lr) {
  lr_ = lr;
  // A pinned buffer per call: the allocator keeps it until the queued copy has run (an
  // ordinary copy on a CPU run).
  Tensor staged = empty_pinned({}, DType::f64);
  staged.data<double>()[0] = lr;
  copy_(lr_tensor_, staged);
}

int64_t Optimizer::step_count() const { return step_tensor_.item<int64_t>(); }

void Optimizer::check_inputs(const StepInputs& inputs, const char* op) const {
  for (const Tensor* t : {&inputs.grad_factor, &inputs.skip_if})
    PRECIS_CHECK(!t->defined() || (t->dtype() == DType::f64 && t->numel() == 1 && t->device() == device_), op,
                 ": the gradient factor and the skip flag must be f64 scalars on the parameters' device ", device_,
                 ", got ", describe(*t));
}

bool Optimizer::begin_cpu_step(const StepInputs& inputs, int64_t& step, double& grad_factor) {
  if (inputs.skip_if.defined() && inputs.skip_if.item<double>() != 0) return false;
  step = ++step_tensor_.data<int64_t>()[0];
  grad_factor = inputs.grad_factor.defined() ? inputs.grad_factor.item<double>() : 1.0;
  return true;
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params)
      if (p.grad().defined()) fill_(p.grad(), 0.0);
}

Tensor& Optimizer::state_buffer(size_t param_index, const std::string& name, const Tensor& like) {
  std::string key = "state." + std::to_string(param_index) + "." + name;
  auto it = state_.find(key);
  if (it == state_.end()) {
    DType dtype = like.dtype() == DType::f64 ? DType::f64 : DType::f32;
    Tensor buffer = empty_with_layout_of(like, dtype);
    fill_(buffer, 0.0);
    it = state_.emplace(key, buffer).first;
  }
  return it->second;
}

Tensor& Optimizer::master_buffer(size_t param_index, const Tensor& param) {
  std::string key = "state." + std::to_string(param_index) + ".master";
  auto it = state_.find(key);
  if (it == state_.end()) {
    Tensor master = empty_with_layout_of(param, DType::f32);
    copy_(master, param);
    it = state_.emplace(key, master).first;
  }
  return it->second;
}

void Optimizer::check_layout(size_t index, const Tensor& param, const char* op) {
  const Tensor& grad = param.grad();
  PRECIS_CHECK(is_non_overlapping_and_dense(param) && same_dense_layout(param, grad), op, ": parameter ", index,
               " and its gradient must be dense in one layout, got ", describe(param), " with strides ",
               param.strides(), " and ", describe(grad), " with strides ", grad.strides());
}

void Optimizer::set_compute_copies(std::vector<Tensor> copies) {
  size_t index = 0;
  for (const ParamGroup& group : groups_)
    for (const Tensor& p : group.params) {
      const Tensor& copy = index < copies.size() ? copies[index] : Tensor();
      if (copy.defined()) {
        PRECIS_CHECK(p.dtype() == DType::f32 && is_low_precision(copy.dtype()), "set_compute_copies: parameter ", index,
                     " is ", describe(p), " and its copy ", describe(copy),
                     "; copies are f16 or bf16, of f32 parameters");
        PRECIS_CHECK(copy.device() == p.device() && copy.shape() == p.shape() && copy.strides() == p.strides(),
                     "set_compute_copies: parameter ", index, "'s copy ", describe(copy),
                     " must have the shape, "
                     "strides and device of the parameter ",
                     describe(p));
      }
      ++index;
    }
  PRECIS_CHECK(copies.size() <= index, "set_compute_copies: ", copies.size(), " copies for ", index, " parameters");
  compute_copies_ = std::move(copies);
}

int64_t compute_copy_bytes(const Tensor& copy) {
  return copy.defined() ? copy.numel() * static_cast<int64_t>(element_size(copy.dtype())) : 0;
}

Tensor Optimizer::compute_copy(size_t param_index) const {
  return param_index < compute_copies_.size() ? compute_copies_[param_index] : Tensor();
}

void Optimizer::set_peer_copies(std::vector<std::vector<int64_t>> peer_offsets) {
  size_t count = 0;
  for (const ParamGroup& group : groups_) count += group.params.size();
  PRECIS_CHECK(peer_offsets.size() <= count, "set_peer_copies: ", peer_offsets.size(), " lists for ", count,
               " parameters");
  for (size_t i = 0; i < peer_offsets.size(); ++i) {
    if (peer_offsets[i].empty()) continue;
    PRECIS_CHECK(supports_peer_copies(), "set_peer_copies: this optimizer does not store into peer copies; ZeRO-1's ",
                 "fused gather needs AdamW");
    PRECIS_CHECK(device_.is_cuda(), "set_peer_copies: peer copies are GPU memory, the parameters are on ", device_);
    PRECIS_CHECK(peer_offsets[i].size() <= kMaxPeerCopies, "set_peer_copies: parameter ", i, " has ",
                 peer_offsets[i].size(), " peer copies, more than ", kMaxPeerCopies);
  }
  peer_copies_ = std::move(peer_offsets);
}

const std::vector<int64_t>& Optimizer::peer_copies(size_t param_index) const {
  static const std::vector<int64_t> none;
  return param_index < peer_copies_.size() ? peer_copies_[param_index] : none;
}

Tensor Optimizer::master(size_t param_index) const {
  auto it = state_.find("state." + std::to_string(param_index) + ".master");
  return it == state_.end() ? Tensor() : it->second;
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [key, value] : state_) bytes += value.numel() * static_cast<int64_t>(element_size(value.dtype()));
  return bytes;
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> out = state_;
  Tensor step = empty({}, DType::i64);  // a copy: the saved count does not move on with the optimizer
  copy_(step, step_tensor_);
  out["step"] = step;
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto step = state.find("step");
  PRECIS_CHECK(step != state.end(), "optimizer state: no 'step' entry; is this an optimizer checkpoint?");
  size_t num_params = 0;
  std::vector<Tensor> flat;
  for (auto& g : groups_)
    for (auto& p : g.params) {
      flat.push_back(p);
      ++num_params;
    }
  std::map<std::string, Tensor> loaded;
  for (const auto& [key, value] : state) {
    if (key == "step") continue;
    size_t dot1 = key.find('.'), dot2 = key.find('.', dot1 + 1);
    PRECIS_CHECK(key.rfind("state.", 0) == 0 && dot2 != std::string::npos, "optimizer state: unexpected entry '", key,
                 "'");
    size_t index = std::stoul(key.substr(dot1 + 1, dot2 - dot1 - 1));
    PRECIS_CHECK(index < num_params, "optimizer state: entry '", key, "' is for parameter ", index, " but there are ",
                 num_params, " parameters; the checkpoint was made for a different model");
    PRECIS_CHECK(value.shape() == flat[index].shape(), "optimizer state: '", key, "' has shape ", value.shape(),
                 " but parameter ", index, " has shape ", flat[index].shape());
    if (key.substr(dot2 + 1) == "master") {
      PRECIS_CHECK(is_low_precision(flat[index].dtype()) && value.dtype() == DType::f32, "optimizer state: '", key,
                   "' is a ", value.dtype(), " master copy but parameter ", index, " is ", flat[index].dtype(),
                   "; master copies are float32 copies of float16/bfloat16 parameters, so the checkpoint was "
                   "made with another precision policy");
    }
    // In the parameter's layout, which the update pairs it with element by element; the saved
    // value's own layout (row-major from a checkpoint) does not matter.
    Tensor buffer = empty_with_layout_of(flat[index], value.dtype());
    copy_(buffer, value);
    loaded[key] = buffer;
  }
  state_ = std::move(loaded);
  copy_(step_tensor_, step->second);
}

std::vector<ParamGroup> default_param_groups(const nn::Module& model, double weight_decay) {
  ParamGroup decay{{}, weight_decay}, no_decay{{}, 0.0};
  for (const auto& p : model.named_parameters()) (model.decays(p.name) ? decay : no_decay).params.push_back(p.tensor);
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(decay);
  if (!no_decay.params.empty()) groups.push_back(no_decay);
  return groups;
}

}  // namespace precis::optim
