// The memory formats of [N, C, H, W] tensors (ops/conv.h): contiguous NCHW, strides
// [C*H*W, H*W, W, 1], and channels-last (NHWC in memory), strides [H*W*C, 1, W*C, C].
// A tensor whose size-1 dims make both readings true (C == 1, or H == W == 1) has the same
// memory either way; it counts as contiguous.
// to_memory_format is a copy, so its gradient is the incoming one, in whatever layout it comes.
#include "ops/memory_format.h"

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/checks.h"

namespace precis::ops {

Shape strides_of(const Shape& shape, MemoryFormat format) {
  const int64_t C = shape[1], H = shape[2], W = shape[3];
  if (format == MemoryFormat::channels_last) return {H * W * C, 1, W * C, C};
  return {C * H * W, H * W, W, 1};
}

void require_image(const char* op, const Tensor& x, const char* what) {
  require_defined(op, x, what);
  PRECIS_CHECK(x.dim() == 4, op, ": ", what, " must be a 4-D [N, C, H, W] tensor, got ", describe(x));
}

bool is_dense_in(const Tensor& t, MemoryFormat format) {
  if (t.dim() != 4) return false;
  const Shape expected = strides_of(t.shape(), format);
  for (int64_t d = 0; d < 4; ++d)
    if (t.shape()[d] != 1 && t.strides()[d] != expected[d]) return false;
  return true;
}

bool is_channels_last(const Tensor& x) {
  return is_dense_in(x, MemoryFormat::channels_last) && !is_dense_in(x, MemoryFormat::contiguous);
}

MemoryFormat suggest_memory_format(const Tensor& x) {
  return is_channels_last(x) ? MemoryFormat::channels_last : MemoryFormat::contiguous;
}

Tensor empty_in(const Shape& shape, MemoryFormat format, DType dtype, Device device) {
  if (format == MemoryFormat::contiguous) return empty(shape, dtype, device);
  const int64_t N = shape[0], C = shape[1], H = shape[2], W = shape[3];
  return empty({N, H, W, C}, dtype, device).as_strided(shape, strides_of(shape, format), 0);
}

Tensor dense_in(const Tensor& t, MemoryFormat format, DType dtype) {
  if (t.dtype() == dtype && is_dense_in(t, format)) return t;
  Tensor out = empty_in(t.shape(), format, dtype, t.device());
  copy_(out, t);
  return out;
}

Tensor to_memory_format(const Tensor& x, MemoryFormat format) {
  require_image("to_memory_format", x);
  if (is_dense_in(x, format)) return x;
  Tensor y = dense_in(x, format, x.dtype());
  if (autograd::any_requires_grad({&x})) {
    autograd::record("to_memory_format", {x}, {y}, [](const BackwardArgs& g) { return std::vector<Tensor>{g.grad()}; });
  }
  return y;
}

}  // namespace precis::ops
