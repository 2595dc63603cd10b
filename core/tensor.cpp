#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/autograd.h"
#include "core/copy.h"

namespace precis {

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * element_size(dtype());
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = is_cpu() ? *this : to(Device::cpu());
  Tensor dense = empty(shape(), dtype_of<T>::value);
  copy_(dense, host);
  const T* p = dense.data<T>();
  return std::vector<T>(p, p + numel());
}

template <typename T>
T Tensor::item() const {
  PRECIS_CHECK(numel() == 1, "item(): the tensor has ", numel(), " elements (shape ", shape(),
               "); item() needs exactly one");
  return to_vector<T>()[0];
}

#define PRECIS_INSTANTIATE(T)                           \
  template std::vector<T> Tensor::to_vector<T>() const; \
  template T Tensor::item<T>() const;                   \
  template Tensor from_vector<T>(const std::vector<T>&, const Shape&);

Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t offset) const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  PRECIS_CHECK(!requires_grad || is_floating(dtype()), "requires_grad: only floating tensors can require ",
               "gradients, this one is ", dtype());
  PRECIS_CHECK(is_leaf(), "requires_grad: can only be set on leaf tensors (this one was made by ",
               "an op); use detach() first");
  impl_->requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::detach() const { return as_strided(shape(), strides(), offset()); }

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward(*this, gradient, retain_graph);
}

void Tensor::register_grad_ready_hook(GradReadyHook hook) const {
  PRECIS_CHECK(is_leaf() && requires_grad(), "register_grad_ready_hook: only leaf tensors that require grad ",
               "(parameters) have grad-ready hooks");
  impl_->grad_ready_hooks.push_back(std::move(hook));
}

// ---------------------------------------------------------------- factories

namespace {

// A contiguous [shape] tensor of dtype over all of `storage`.
Tensor contiguous_over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace

Tensor empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape) PRECIS_CHECK(s >= 0, "empty: negative size in shape ", shape);
  return contiguous_over(std::make_shared<Storage>(shape_numel(shape) * element_size(dtype), allocator_for(device)),
                         shape, dtype);
}

Tensor empty_from(std::shared_ptr<Allocator> allocator, const Shape& shape, DType dtype) {
  for (int64_t s : shape) PRECIS_CHECK(s >= 0, "empty_from: negative size in shape ", shape);
  return contiguous_over(std::make_shared<Storage>(shape_numel(shape) * element_size(dtype), std::move(allocator)),
                         shape, dtype);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  fill_(t, value);
  return t;
}

Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }

// Sorted by stride, the dims of size above 1 must each step over exactly the ones before them:
// strides 1, s0, s0 * s1, ... (size-1 dims are never stepped over, whatever their stride).
bool is_non_overlapping_and_dense(const Tensor& t) {
  if (t.numel() == 0) return true;
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.shape()[d] != 1) dims.push_back(d);
  std::sort(dims.begin(), dims.end(), [&](int64_t a, int64_t b) { return t.strides()[a] < t.strides()[b]; });
  int64_t expected = 1;
  for (int64_t d : dims) {
    if (t.strides()[d] != expected) return false;
    expected *= t.shape()[d];
  }
  return true;
}

bool same_dense_layout(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  if (a.is_contiguous() && b.is_contiguous()) return true;
  return a.strides() == b.strides() && is_non_overlapping_and_dense(a);
}

Tensor empty_with_layout_of(const Tensor& t, DType dtype) {
  Tensor out = empty(t.shape(), dtype, t.device());
  if (t.is_contiguous() || !is_non_overlapping_and_dense(t)) return out;
  return out.as_strided(t.shape(), t.strides(), 0);
}

Tensor scalar_tensor(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

Tensor arange(int64_t start, int64_t end, int64_t step, DType dtype) {
  PRECIS_CHECK(step != 0, "arange: step must not be zero");
  int64_t n = std::max<int64_t>(0, (end - start + step + (step > 0 ? -1 : 1)) / step);
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<double>(start + i * step);
  Tensor out = empty({n}, dtype);
  copy_(out, from_vector(values, {n}));
  return out;
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  PRECIS_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
               " values do not fill shape ", shape);
  Tensor t = empty(shape, dtype_of<T>::value);
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

Tensor tensor(std::initializer_list<double> values, DType dtype) {
  Tensor t = empty({static_cast<int64_t>(values.size())}, dtype);
  copy_(t, from_vector(std::vector<double>(values), {static_cast<int64_t>(values.size())}));
  return t;
}

PRECIS_INSTANTIATE(float)
PRECIS_INSTANTIATE(double)
PRECIS_INSTANTIATE(half)
PRECIS_INSTANTIATE(bfloat16)
PRECIS_INSTANTIATE(int32_t)
PRECIS_INSTANTIATE(int64_t)
PRECIS_INSTANTIATE(uint8_t)
#undef PRECIS_INSTANTIATE
// std::vector<bool> is bit-packed, so bool tensors are read through uint8.
template <>
std::vector<bool> Tensor::to_vector<bool>() const {
  std::vector<uint8_t> bytes = to(DType::u8).to_vector<uint8_t>();
  return std::vector<bool>(bytes.begin(), bytes.end());
}

// ---------------------------------------------------------------- printing

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  std::ostringstream out;
  out << dtype_name(t.dtype()) << t.shape() << " on " << t.device();
  return out.str();
}

namespace {
void print_values(std::ostream& out, const std::vector<double>& v, const Shape& shape, size_t dim, int64_t& at,
                  bool floating, int indent) {
  constexpr int64_t kEdge = 3;  // elements shown at each end of a long dim
  if (dim == shape.size()) {
    double x = v[at++];
    if (floating) {
      if (std::isfinite(x))
        out << std::fixed << std::setprecision(4) << x;
      else
        out << (std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf"));
    } else {
      out << static_cast<int64_t>(x);
    }
    return;
  }
  int64_t n = shape[dim];
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  out << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (n > 2 * kEdge && i == kEdge) {
      out << "...";
      at += (n - 2 * kEdge) * inner;
      i = n - kEdge - 1;
      out << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
      continue;
    }
    print_values(out, v, shape, dim + 1, at, floating, indent + 1);
    if (i + 1 < n) out << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  out << "]";
}
}  // namespace

std::ostream& operator<<(std::ostream& out, const Tensor& t) {
  if (!t.defined()) return out << "tensor(undefined)";
  std::vector<double> values = t.to_vector<double>();
  out << "tensor(";
  int64_t at = 0;
  print_values(out, values, t.shape(), 0, at, is_floating(t.dtype()), 7);
  out << ", dtype=" << dtype_name(t.dtype());
  if (!t.is_cpu()) out << ", device=" << t.device();
  if (t.requires_grad()) out << ", requires_grad=true";
  return out << ")";
}

}  // namespace precis
