// Tensor: a strided view (shape, strides, offset) into a Storage, with a dtype,
// a device and the autograd fields of docs/architecture.md, "Tensors and autograd".
//
// A Tensor is a cheap handle (a shared pointer): copying it aliases the same
// data, as in PyTorch. Views share storage; `contiguous()` copies only when needed.
//
// The view and conversion methods that take part in autograd (reshape,
// transpose, slice, to, ...) are declared here and defined in ops/tensor_methods.cpp,
// as PyTorch's Tensor methods forward to ATen: core/ never includes ops/.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace precis {

class Node;
class Tensor;
using GradReadyHook = std::function<void(const Tensor& grad)>;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;

  // autograd
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  bool grad_is_stale = false;            // leaves: .grad holds no gradient yet; the next one is written, not added
  std::shared_ptr<Node> grad_fn;         // the op that produced this tensor (null for leaves)
  uint32_t output_nr = 0;                // which output of grad_fn this is
  std::weak_ptr<Node> grad_accumulator;  // leaves: the node that accumulates into .grad
  std::vector<GradReadyHook> grad_ready_hooks;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- metadata
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape_numel(impl_->shape); }
  int64_t offset() const { return impl_->offset; }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  size_t nbytes() const { return numel() * element_size(dtype()); }
  bool is_contiguous() const;
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }

  // ---- raw data (CPU pointers for CPU tensors, device pointers for CUDA tensors)
  void* raw_data() const;
  template <typename T>
  T* data() const {
    PRECIS_CHECK(dtype_of<T>::value == dtype(), "data<", dtype_name(dtype_of<T>::value), ">() called on a ",
                 dtype_name(dtype()), " tensor");
    return static_cast<T*>(raw_data());
  }
  // The single value of a one-element tensor, converted to T.
  template <typename T>
  T item() const;
  double item() const { return item<double>(); }
  // All values, converted to T, in row-major order (copies to the host if needed).
  template <typename T>
  std::vector<T> to_vector() const;

  // ---- views without autograd (the primitive every view is made of)
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t offset) const;

  // ---- views and conversions with autograd (defined in ops/tensor_methods.cpp)
  Tensor view(const Shape& shape) const;     // must be viewable without a copy
  Tensor reshape(const Shape& shape) const;  // copies when the strides demand it; one dim may be -1
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor clone() const;

  // ---- autograd
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& set_requires_grad(bool requires_grad = true);
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& grad) { impl_->grad = grad.impl_; }
  void zero_grad() { impl_->grad.reset(); }
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }
  // A tensor sharing this one's data, cut from the graph.
  Tensor detach() const;
  // Runs the backward pass from this tensor. A scalar gets gradient 1; others need `gradient`.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // Called with the final gradient of this leaf, once per backward, as soon as it is known.
  void register_grad_ready_hook(GradReadyHook hook) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// ---- factories. Random ones draw from a Philox generator (core/random.h).
Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
// An uninitialized contiguous tensor in memory from `allocator` (on its device), which the
// tensor's storage keeps alive: memory of a kind the device's own allocator does not give
// (distributed/cuda/registered_memory.h: buffers NCCL reads and writes in place).
Tensor empty_from(std::shared_ptr<Allocator> allocator, const Shape& shape, DType dtype);
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
// Whether t's elements fill the span of storage they start at exactly once, in some order of its
// dims: a contiguous tensor or a permutation of one (channels-last, a transpose). Such a tensor
// can be read, written and summed with another of the same strides as one flat array.
bool is_non_overlapping_and_dense(const Tensor& t);
// Whether a and b (of one shape) are two dense arrays whose i-th elements in memory correspond:
// both contiguous, or both non-overlapping and dense with the same strides (both channels-last).
// Elementwise kernels may then run over them as flat arrays.
bool same_dense_layout(const Tensor& a, const Tensor& b);
// A new tensor of `dtype` with t's strides when t is non-overlapping and dense, else contiguous
// (PyTorch's preserve_format): a copy of a channels-last tensor stays channels-last.
Tensor empty_with_layout_of(const Tensor& t, DType dtype);
Tensor arange(int64_t start, int64_t end, int64_t step = 1, DType dtype = DType::i64);
Tensor scalar_tensor(double value, DType dtype = DType::f32, Device device = Device::cpu());
// A CPU tensor holding `values` (row-major) with the given shape.
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape);
Tensor tensor(std::initializer_list<double> values, DType dtype = DType::f32);

// Readable printing, like PyTorch: tensor([[1.0000, 2.0000], ...], dtype=float32)
std::ostream& operator<<(std::ostream& out, const Tensor& t);
std::string describe(const Tensor& t);  // "float32[2, 3] on cpu", for error messages

}  // namespace precis
