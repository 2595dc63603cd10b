#include "nn/flat_parameters.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/memory_format.h"

namespace precis::nn {

int64_t FlatParameters::numel() const {
  int64_t n = 0;
  for (const auto& b : buffers_)
    for (const auto& s : b.slots) n += s.numel;
  return n;
}

void FlatParameters::zero_grad() {
  for (auto& b : buffers_) {
    fill_(b.grad, 0.0);
    for (auto& s : b.slots) s.param.impl()->grad_is_stale = false;
  }
}

void FlatParameters::zero_grad_lazily() {
  for (auto& b : buffers_)
    for (auto& s : b.slots) s.param.impl()->grad_is_stale = true;
}

void FlatParameters::settle_grads() {
  for (auto& b : buffers_) {
    for (auto& s : b.slots) {
      TensorImpl* impl = s.param.impl();
      if (!impl->grad_is_stale) continue;
      fill_(Tensor(impl->grad), 0.0);
      impl->grad_is_stale = false;
    }
  }
}

namespace {

// Points `tensor` at `storage` from `offset` on with `strides`, keeping its shape, as `dtype`.
void rebind(const Tensor& tensor, const std::shared_ptr<Storage>& storage, int64_t offset, const Shape& strides,
            DType dtype) {
  TensorImpl* impl = tensor.impl();
  impl->storage = storage;
  impl->offset = offset;
  impl->strides = strides;
  impl->dtype = dtype;
}

// The strides of a parameter in its flat slot: its own where it is dense (row-major, or in
// another order of its dims: a channels-last weight stays channels-last, with the very strides
// the convolutions' channels-last tensors have), else row-major.
Shape slot_strides(const Tensor& param) {
  return is_non_overlapping_and_dense(param) ? param.strides() : contiguous_strides(param.shape());
}

}  // namespace

void to_channels_last(Module& model) {
  NoGradGuard no_grad;
  for (const NamedTensor& p : model.named_parameters()) {
    if (p.tensor.dim() != 4 || !is_floating(p.tensor.dtype())) continue;
    PRECIS_CHECK(!p.tensor.grad().defined(), "to_channels_last: parameter ", p.name,
                 " has a gradient already (a flat buffer's, or a backward's); lay the weights out channels-last "
                 "before flatten_parameters and before the first backward");
    const Tensor laid_out =
        ops::empty_in(p.tensor.shape(), ops::MemoryFormat::channels_last, p.tensor.dtype(), p.tensor.device());
    copy_(laid_out, p.tensor);
    rebind(p.tensor, laid_out.storage(), laid_out.offset(), laid_out.strides(), laid_out.dtype());
  }
}

int64_t flat_alignment_elements(DType param_dtype, DType grad_dtype) {
  const size_t narrowest = std::min(element_size(param_dtype), element_size(grad_dtype));
  return static_cast<int64_t>(kFlatAlignmentBytes / narrowest);
}

DType flat_grad_dtype(DType param_dtype, std::optional<DType> grad_dtype) {
  if (param_dtype != DType::f16 && param_dtype != DType::bf16) return param_dtype;
  if (!grad_dtype) return DType::f32;
  PRECIS_CHECK(*grad_dtype == DType::f32 || *grad_dtype == param_dtype, "the gradients of ", param_dtype,
               " parameters (precision.grad_dtype) must be float32 or ", param_dtype, ", got ", *grad_dtype);
  return *grad_dtype;
}

std::shared_ptr<FlatParameters> flatten_parameters(Module& model, Device device, std::optional<DType> param_dtype,
                                                   int64_t shards, std::optional<DType> grad_dtype,
                                                   std::shared_ptr<Allocator> data_allocator) {
  PRECIS_CHECK(!param_dtype || is_floating(*param_dtype),
               "flatten_parameters: param_dtype must be a floating dtype, got ", *param_dtype);
  PRECIS_CHECK(shards >= 1, "flatten_parameters: shards must be >= 1, got ", shards);
  auto flat = std::make_shared<FlatParameters>();
  flat->device_ = device;
  NoGradGuard no_grad;
  std::vector<NamedTensor> params = model.named_parameters();
  for (const NamedTensor& p : params) {
    DType dtype = param_dtype && is_floating(p.tensor.dtype()) ? *param_dtype : p.tensor.dtype();
    FlatBuffer* buffer = nullptr;
    for (auto& b : flat->buffers_)
      if (b.dtype == dtype) buffer = &b;
    if (!buffer) buffer = &flat->buffers_.emplace_back(FlatBuffer{dtype, Tensor(), Tensor(), {}});
    const int64_t align = flat_alignment_elements(dtype, flat_grad_dtype(dtype, grad_dtype));
    int64_t offset = 0;
    if (!buffer->slots.empty()) {
      const FlatSlot& last = buffer->slots.back();
      offset = (last.offset + last.numel + align - 1) / align * align;
    }
    buffer->slots.push_back({p.name, p.tensor, offset, p.tensor.numel(), model.decays(p.name)});
  }
  for (auto& b : flat->buffers_) {
    const FlatSlot& last = b.slots.back();
    const DType b_grad_dtype = flat_grad_dtype(b.dtype, grad_dtype);
    const int64_t multiple = shards * flat_alignment_elements(b.dtype, b_grad_dtype);
    const int64_t total = (last.offset + last.numel + multiple - 1) / multiple * multiple;
    if (data_allocator) {
      PRECIS_CHECK(data_allocator->device() == device, "flatten_parameters: the data allocator gives memory on ",
                   data_allocator->device(), ", not on ", device);
      b.data = empty_from(data_allocator, {total}, b.dtype);
      fill_(b.data, 0.0);  // the padding stays zero
    } else {
      b.data = zeros({total}, b.dtype, device);
    }
    b.grad = zeros({total}, b_grad_dtype, device);
    for (const FlatSlot& s : b.slots) {
      const Shape strides = slot_strides(s.param);
      copy_(b.data.as_strided(s.param.shape(), strides, s.offset), s.param);
      rebind(s.param, b.data.storage(), s.offset, strides, b.dtype);
      Tensor grad_view = b.grad.as_strided(s.param.shape(), strides, s.offset);
      s.param.impl()->grad = grad_view.impl_ptr();
    }
  }
  // Buffers (non-trainable state) move to the device one by one.
  for (const NamedTensor& buf : model.named_buffers()) {
    if (buf.tensor.device() == device) continue;
    Tensor moved = empty(buf.tensor.shape(), buf.tensor.dtype(), device);
    copy_(moved, buf.tensor);
    rebind(buf.tensor, moved.storage(), 0, moved.strides(), buf.tensor.dtype());
  }
  return flat;
}

}  // namespace precis::nn
