// Flat parameter and gradient buffers (docs/architecture.md, "Modules and flat buffers").
//
// flatten_parameters(model, device, param_dtype) packs every parameter of
// `model` into one contiguous buffer per dtype on `device` and rebinds each
// parameter to a view of it (the module's Tensor handles see the change, since
// they share the TensorImpl). Gradients get a matching buffer, so after
// backward all gradients of a dtype are one dense range: the fused optimizer,
// the global grad norm, DDP buckets and checkpoints work on slices of it. It is
// also how a model moves to a device.
//
// With `param_dtype`, every floating parameter is converted to it (values
// rounded to nearest-even, the TensorImpl's dtype rebound too). Gradients of
// f16/bf16 parameters live in a buffer of `grad_dtype` (a precision policy's
// precision.grad_dtype) with the same element offsets: f32 by default, so
// low-precision gradients sum unrounded (across micro-steps too), or the
// parameters' own dtype (half the bytes, as llm.c and PyTorch keep a bf16
// parameter's .grad; each add then rounds). Backward accumulates into an existing
// .grad converting to its dtype, and the optimizers take either for a
// low-precision parameter. On the GPU the products, layer norm and the embedding
// write their parameters' gradients into these views themselves, in either dtype,
// rounding once from their f32 sums (core/autograd.h, take_grad_destination):
// written over where stale, added to otherwise.
//
// A parameter dense in another order of its dims than row-major (a 4-D weight laid out
// channels-last by to_channels_last) keeps that order in its slot: numel elements of the
// buffer in the parameter's memory order, the parameter and its .grad view with its strides.
// What works on the buffers (the gradient norm, DDP's buckets, ZeRO-1's shards) or on a
// parameter's memory (the optimizers, whose state is made in the parameter's layout) pairs
// elements by their place in memory; what reads a parameter by index (checkpoints, copy_)
// sees the same values in either layout.
//
// With `shards` > 1 (ZeRO-1, distributed/zero.h) each buffer ends in zeros up to a
// multiple of shards x (64 bytes' worth of elements), as llm.c pads its buffers, so
// it splits into `shards` equal pieces that each start on a 64-byte boundary. The
// padding belongs to no parameter: its gradient stays zero and its value too.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"

namespace precis::nn {

struct FlatSlot {
  std::string name;  // dotted parameter name
  Tensor param;      // the parameter (a view into FlatBuffer::data)
  int64_t offset;    // in elements, within the buffer
  int64_t numel;
  bool weight_decay;
};

struct FlatBuffer {
  DType dtype;  // of the parameters
  Tensor data;  // 1-D, all parameters of this dtype
  Tensor grad;  // 1-D, their gradients, same layout; of flat_grad_dtype(dtype, grad_dtype)
  std::vector<FlatSlot> slots;
};

class FlatParameters {
 public:
  std::vector<FlatBuffer>& buffers() { return buffers_; }
  const std::vector<FlatBuffer>& buffers() const { return buffers_; }
  Device device() const { return device_; }
  int64_t numel() const;
  // Fills every gradient buffer with zeros (one fill per dtype).
  void zero_grad();
  // zero_grad without the fill: each gradient is marked stale, so the first gradient a
  // parameter then receives is written over it rather than added to it (0 + g = g, with
  // no pass writing zeros and no read of them); settle_grads(), after the backward(s),
  // zeroes the gradients of the parameters that received none. Between the two, a
  // gradient not yet received holds the last step's values.
  void zero_grad_lazily();
  void settle_grads();

 private:
  friend std::shared_ptr<FlatParameters> flatten_parameters(Module&, Device, std::optional<DType>, int64_t,
                                                            std::optional<DType>, std::shared_ptr<Allocator>);
  std::vector<FlatBuffer> buffers_;
  Device device_;
};

// Each parameter starts on a 64-byte boundary, so vector loads never straddle two.
inline constexpr size_t kFlatAlignmentBytes = 64;

// The dtype a flat gradient buffer has for parameters of `param_dtype`: for f16/bf16 ones
// `grad_dtype` where given (f32 or `param_dtype`, else an error), f32 otherwise; other
// parameters' gradients keep their dtype.
DType flat_grad_dtype(DType param_dtype, std::optional<DType> grad_dtype = std::nullopt);
// kFlatAlignmentBytes in elements of the narrower of a buffer's data and gradient: every
// slot's offset is a multiple of it, and with `shards` every buffer's size is shards times one.
int64_t flat_alignment_elements(DType param_dtype, DType grad_dtype);

// Lays every 4-D floating parameter of `model` out channels-last ([K, C, R, S] stored as K,
// R, S, C: the filter layout of cuDNN's channels-last convolutions), with the same values, as
// PyTorch's model.to(memory_format=torch.channels_last) does, so that a channels-last network's
// weight casts and weight gradients are channels-last already. Call it before
// flatten_parameters, which keeps the layout (afterwards the parameters are views of the flat
// buffers, and new storage would take them out of the buffers), and before any backward: a
// parameter with a gradient is an error.
void to_channels_last(Module& model);

// `param_dtype` must be floating; non-floating parameters keep their dtype. `shards` >= 1.
// `grad_dtype`: the gradient buffer's dtype for f16/bf16 parameters (flat_grad_dtype).
// `data_allocator`, where given, allocates the parameter buffers (ProcessGroup::
// registered_allocator: memory the collectives that fill them read and write in place);
// else the device's own memory.
std::shared_ptr<FlatParameters> flatten_parameters(Module& model, Device device = Device::cpu(),
                                                   std::optional<DType> param_dtype = std::nullopt, int64_t shards = 1,
                                                   std::optional<DType> grad_dtype = std::nullopt,
                                                   std::shared_ptr<Allocator> data_allocator = nullptr);

}  // namespace precis::nn
