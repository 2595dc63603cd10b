#include "nn/flat_parameters.h"

#include "core/autograd.h"
#include "core/copy.h"

namespace precis::nn {

int64_t FlatParameters::numel() const {
  int64_t n = 0;
  for (const auto& b : buffers_)
    for (const auto& s : b.slots) n += s.numel;
  return n;
}

void FlatParameters::zero_grad() {
  for (auto& b : buffers_) fill_(b.grad, 0.0);
}

namespace {

// Points `param` at `storage` from `offset` on, contiguous, keeping its shape.
void rebind(const Tensor& param, const std::shared_ptr<Storage>& storage, int64_t offset) {
  TensorImpl* impl = param.impl();
  impl->storage = storage;
  impl->offset = offset;
  impl->strides = contiguous_strides(impl->shape);
}

}  // namespace

std::shared_ptr<FlatParameters> flatten_parameters(Module& model, Device device) {
  auto flat = std::make_shared<FlatParameters>();
  flat->device_ = device;
  NoGradGuard no_grad;
  std::vector<NamedTensor> params = model.named_parameters();
  for (const NamedTensor& p : params) {
    FlatBuffer* buffer = nullptr;
    for (auto& b : flat->buffers_)
      if (b.dtype == p.tensor.dtype()) buffer = &b;
    if (!buffer) buffer = &flat->buffers_.emplace_back(FlatBuffer{p.tensor.dtype(), Tensor(), Tensor(), {}});
    int64_t align = static_cast<int64_t>(kFlatAlignmentBytes / element_size(buffer->dtype));
    int64_t offset = 0;
    if (!buffer->slots.empty()) {
      const FlatSlot& last = buffer->slots.back();
      offset = (last.offset + last.numel + align - 1) / align * align;
    }
    buffer->slots.push_back({p.name, p.tensor, offset, p.tensor.numel(), model.decays(p.name)});
  }
  for (auto& b : flat->buffers_) {
    const FlatSlot& last = b.slots.back();
    int64_t total = last.offset + last.numel;
    b.data = zeros({total}, b.dtype, device);
    b.grad = zeros({total}, b.dtype, device);
    for (const FlatSlot& s : b.slots) {
      copy_(b.data.slice(0, s.offset, s.offset + s.numel).view(s.param.shape()), s.param);
      rebind(s.param, b.data.storage(), s.offset);
      Tensor grad_view = b.grad.as_strided(s.param.shape(), contiguous_strides(s.param.shape()), s.offset);
      s.param.impl()->grad = grad_view.impl_ptr();
    }
  }
  // Buffers (non-trainable state) move to the device one by one.
  for (const NamedTensor& buf : model.named_buffers()) {
    if (buf.tensor.device() == device) continue;
    Tensor moved = empty(buf.tensor.shape(), buf.tensor.dtype(), device);
    copy_(moved, buf.tensor);
    rebind(buf.tensor, moved.storage(), 0);
  }
  return flat;
}

}  // namespace precis::nn
