// Autocast: the op-entry half of a precision policy (docs/architecture.md, "Precision policies").
//
// While an autocast scope is active, ops cast their inputs as PyTorch's autocast
// lists say: matmul, linear, attention and conv2d run in the compute dtype (f16/bf16);
// softmax, log_softmax, layer_norm, cross_entropy, sum/mean and exp/log run in
// f32; batch_norm and the pools keep their input's dtype (batch_norm's statistics are
// f32); other elementwise ops promote. The policy object (amp/) opens the scope
// around the forward pass; ops only read it.
//
// Casts of weights (leaf tensors that require grad) are cached until
// clear_cache(), so a weight used by every micro-batch of a step is cast once.
// The cached cast's autograd node saves nothing, so every micro-batch's
// backward can run through it; its gradient arrives in the compute dtype and is
// accumulated into the f32 .grad in f32. It is a pass-through node
// (autograd::record_pass_through): a product may instead write the weight's
// gradient into the f32 .grad itself.
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"

namespace precis::ops::autocast {

bool enabled();
DType compute_dtype();  // meaningful when enabled()

class Scope {
 public:
  explicit Scope(DType compute_dtype, bool enabled = true);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool previous_enabled_;
  DType previous_dtype_;
};

// For matmul-like ops: a floating `t` in the compute dtype (cached for weights); `t` itself when off.
Tensor to_compute(const Tensor& t);
// For the f32 list: f16/bf16 `t` widened to f32 when autocast is on; `t` itself otherwise.
Tensor to_fp32(const Tensor& t);
// The dtype to_fp32 gives a tensor of `dtype`.
DType fp32_dtype(DType dtype);
// The dtype a linear casts its floating input to: the compute dtype while autocast is on,
// none (the input's own) while it is off. For ops that produce a linear's input and can
// store it in that dtype at once (layer_norm's out_dtype).
std::optional<DType> linear_input_dtype();
// Forgets cached weight casts; call once per optimizer step (the weights changed).
void clear_cache();
// Fills the cache for every leaf of `leaves` at once: `leaves` are dense views of the dense 1-D
// `buffer` (a flat parameter buffer, nn/flat_parameters.h) that require grad, row-major or in
// another order of their dims (channels-last weights), and each one's cast to `dtype` becomes a
// view of one cast of the whole buffer, with the leaf's strides and its own autograd node. One
// kernel instead of one per weight (GPT-2: 1 launch instead of ~110). A buffer already of
// `dtype` needs nothing. `cast`, when given, is that cast already made (a dense 1-D tensor of
// `dtype` as long as the buffer: the compute copies the optimizer wrote in the last step,
// optim::Optimizer::set_compute_copies), and no kernel runs.
void precache(const Tensor& buffer, const std::vector<Tensor>& leaves, DType dtype, const Tensor& cast = Tensor());
size_t cache_size();

}  // namespace precis::ops::autocast
