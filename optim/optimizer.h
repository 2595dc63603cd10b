// Optimizer base: parameter groups, learning rate, zero_grad, saveable state.
//
// Low-precision (f16/bf16) parameters: optimizers keep their moments in f32
// and, with master weights, an f32 copy of the parameter ("state.<i>.master")
// that the update is applied to; the parameter then holds the copy rounded
// (optim/low_precision.h). The master copy is saved and restored with the rest
// of the state.
//
// The updates run over a parameter, its gradient and its state as flat arrays, element i of
// each in memory with element i of the others: a parameter may be laid out in any dense order
// of its dims (a channels-last weight) when its gradient has the same layout, and its state
// buffers are made in that layout too. state_dict() gives the state as it is held; a checkpoint
// writes it in row-major order (as every tensor), and load_state_dict lays it out as each
// parameter is, so a state resumes under either layout.
//
// The learning rate and the step count are 0-d tensors on the parameters' device
// (all parameters share one), made at construction, so that on a GPU an update
// waits for nothing on the host and a CUDA graph that holds it picks up each
// step's values: set_lr queues a copy of the new rate (from pinned memory,
// ordered on the compute stream; call it outside a capture), and step() advances
// the count where it lives, only for steps that are not skipped. step_count()
// reads it back (a sync on a GPU). One step() for both devices: a CPU loop or a
// CUDA kernel, the same arithmetic.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace precis::nn {
class Module;
}

namespace precis::optim {

// What a step takes from the rest of the step, as tensors on the parameters' device so that
// nothing is read back on a GPU; both optional.
struct StepInputs {
  // f64 scalar: each gradient is multiplied by it as it is read, rounded to the gradient's
  // dtype (clip_grad_norm's factor: the clip and the loss scale's 1/scale; its result's
  // element 1). Undefined: 1. The gradients themselves are not changed.
  Tensor grad_factor = Tensor();
  // f64 scalar: when nonzero nothing is updated and the step count stays (the loss
  // scaler's found_inf). Undefined: never skip.
  Tensor skip_if = Tensor();
  // A scaled 16-bit gradient is rounded to f32 instead of its own dtype: the gradients are
  // 16-bit copies of f32 ones, and the update must be the one the f32 gradients give
  // (ZeRO-1 reading its shard from the reduce's bf16/f16 staging, distributed/zero.h).
  // No effect on f32 or f64 gradients.
  bool round_scaled_grads_to_f32 = false;
};

struct ParamGroup {
  std::vector<Tensor> params;
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  // All parameters on one device (checked); `lr` the starting learning rate.
  Optimizer(std::vector<ParamGroup> groups, double lr);
  virtual ~Optimizer() = default;

  // Applies one update from the parameters' current .grad (parameters without a gradient are skipped).
  virtual void step(const StepInputs& inputs = {}) = 0;
  // Zeroes gradients in place (they may live in a flat buffer).
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);
  int64_t step_count() const;
  // Where the parameters and all the state live.
  Device device() const { return device_; }
  std::vector<ParamGroup>& param_groups() { return groups_; }

  // State as named tensors ("step", "state.<i>.<buffer>" with i the parameter's index
  // over all groups, "state.<i>.master" for master copies), for checkpoints.
  // Loading checks names, shapes, and that master copies are f32 and belong to
  // f16/bf16 parameters.
  virtual std::map<std::string, Tensor> state_dict() const;
  virtual void load_state_dict(const std::map<std::string, Tensor>& state);

  // The f32 master copy of parameter `param_index` (over all groups); undefined if it has none (yet).
  Tensor master(size_t param_index) const;
  // Compute copies: after each update that is not skipped, parameter i's new value is also
  // written to copies[i] rounded to nearest even, as a cast to the copy's dtype rounds it. So
  // the next forward's weight casts (ops/autocast.h precache) are ready without a pass over the
  // parameters of their own. copies[i] is undefined (none) or an f16/bf16 tensor of parameter
  // i's shape and strides, for an f32 parameter; indexed over all groups, as state_dict.
  void set_compute_copies(std::vector<Tensor> copies);
  // Peer copies (ZeRO-1's fused gather, distributed/zero.h): after each update that is not
  // skipped, parameter i's new value is also stored at each of peer_offsets[i]'s byte offsets
  // from its elements, as the parameter itself is written: the same elements of the other
  // ranks' copies of its buffer (ProcessGroup::peer_offsets). GPU parameters, at most
  // kMaxPeerCopies offsets each, and an optimizer whose supports_peer_copies(); indexed over
  // all groups, as state_dict. An empty list (or none) stores into nothing more.
  static constexpr size_t kMaxPeerCopies = 7;  // the other GPUs of an 8-GPU node
  virtual bool supports_peer_copies() const { return false; }
  void set_peer_copies(std::vector<std::vector<int64_t>> peer_offsets);
  // Bytes of state the optimizer keeps per element of a parameter of `param_dtype` once it
  // has stepped (moments, master copy), so a run can say what its state costs up front.
  virtual int64_t state_bytes_per_element(DType param_dtype) const = 0;
  // Bytes of per-parameter state it holds now (created on the first step).
  int64_t state_bytes() const;

 protected:
  // Per-parameter state buffers, created lazily (zeros like the parameter, f32 or f64, in its layout).
  Tensor& state_buffer(size_t param_index, const std::string& name, const Tensor& like);
  // The f32 master copy of a low-precision parameter (in its layout), a copy of it on first use.
  Tensor& master_buffer(size_t param_index, const Tensor& param);
  // Parameter `param_index`'s compute copy (set_compute_copies), or undefined.
  Tensor compute_copy(size_t param_index) const;
  // Parameter `param_index`'s peer offsets (set_peer_copies), or an empty list.
  const std::vector<int64_t>& peer_copies(size_t param_index) const;
  // Checks that parameter `index` and its gradient are dense in one layout, naming optimizer `op`.
  static void check_layout(size_t index, const Tensor& param, const char* op);
  // Checks `inputs` (f64 scalars on device()) for optimizer `op`.
  void check_inputs(const StepInputs& inputs, const char* op) const;
  // The CPU step's view of `inputs` and the step count: false when the step is skipped;
  // else advances the count and gives it, with the gradient factor (1 when none).
  bool begin_cpu_step(const StepInputs& inputs, int64_t& step, double& grad_factor);
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

  double lr_;  // the host's copy of lr_tensor_ (lr() reads nothing back)
  Device device_;
  // The learning rate (f64 scalar) and the step count (i64 scalar), on device_.
  Tensor lr_tensor_, step_tensor_;

 private:
  std::vector<ParamGroup> groups_;
  std::map<std::string, Tensor> state_;
  std::vector<Tensor> compute_copies_;             // by parameter index; empty: none
  std::vector<std::vector<int64_t>> peer_copies_;  // by parameter index; empty: none
};

// The bytes a step writes into `copy` (a compute copy, or undefined: 0), for the ops' cost.
int64_t compute_copy_bytes(const Tensor& copy);

// nanoGPT's default groups: weight decay on the weights of Linear layers only;
// none on biases, LayerNorm weights and embeddings.
std::vector<ParamGroup> default_param_groups(const nn::Module& model, double weight_decay);

}  // namespace precis::optim
