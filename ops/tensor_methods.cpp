// The Tensor methods that take part in autograd: views and conversions.
// A view shares storage with its input; its backward maps the gradient back
// to the input's shape (reshape back, transpose back, scatter into a zero
// tensor for slices, sum over the broadcast dims for expand).
#include <numeric>

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/reduce.h"

namespace precis {

namespace {

// The strides that view `t` as `shape` without copying, if there are such strides
// (the same rule as torch.Tensor.view: each run of merged dims must be contiguous).
bool view_strides(const Tensor& t, const Shape& shape, Shape& strides) {
  strides.assign(shape.size(), 0);
  if (t.numel() == 0 || t.dim() == 0) {
    strides = contiguous_strides(shape);
    return true;
  }
  const Shape& old_shape = t.shape();
  const Shape& old_strides = t.strides();
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    // A chunk of old dims ends where the next outer dim is not contiguous with this one.
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      PRECIS_CHECK(infer_at < 0, op, ": only one dim may be -1 in shape ", shape);
      infer_at = static_cast<int64_t>(i);
    } else {
      PRECIS_CHECK(out[i] >= 0, op, ": negative size in shape ", shape);
      known *= out[i];
    }
  }
  if (infer_at >= 0) {
    PRECIS_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape, " is invalid for ", numel, " elements");
    out[infer_at] = numel / known;
  }
  PRECIS_CHECK(shape_numel(out) == numel, op, ": shape ", shape, " is invalid for a tensor of ", numel, " elements");
  return out;
}

// Records a view: the gradient of the input is `back(grad_of_view)`.
Tensor record_view(const char* op, const Tensor& input, Tensor view, std::function<Tensor(const Tensor&)> back) {
  autograd::record(op, {input}, {view},
                   [back = std::move(back)](const BackwardArgs& g) { return std::vector<Tensor>{back(g.grad())}; });
  return view;
}

}  // namespace

Tensor Tensor::view(const Shape& shape_in) const {
  Shape shape = infer_shape(shape_in, numel(), "view");
  Shape strides;
  PRECIS_CHECK(view_strides(*this, shape, strides), "view: cannot view a tensor of shape ", this->shape(),
               " and strides ", this->strides(), " as ", shape,
               " without a copy; use reshape() (or contiguous() first)");
  Shape old_shape = this->shape();
  return record_view("view", *this, as_strided(shape, strides, offset()),
                     [old_shape](const Tensor& g) { return g.reshape(old_shape); });
}

Tensor Tensor::reshape(const Shape& shape_in) const {
  Shape shape = infer_shape(shape_in, numel(), "reshape");
  Shape strides;
  if (view_strides(*this, shape, strides)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  int64_t d0 = wrap_dim(dim0, dim(), "transpose"), d1 = wrap_dim(dim1, dim(), "transpose");
  Shape shape = this->shape(), strides = this->strides();
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  return record_view("transpose", *this, as_strided(shape, strides, offset()),
                     [d0, d1](const Tensor& g) { return g.transpose(d0, d1); });
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  PRECIS_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: got ", dims.size(), " dims for a tensor of ",
               dim(), " dims");
  Shape shape(dims.size()), strides(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    PRECIS_CHECK(inverse[d] < 0, "permute: dim ", d, " appears twice in the permutation");
    inverse[d] = static_cast<int64_t>(i);
    shape[i] = this->shape()[d];
    strides[i] = this->strides()[d];
  }
  return record_view("permute", *this, as_strided(shape, strides, offset()),
                     [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::slice(int64_t dim_in, int64_t start, int64_t end, int64_t step) const {
  int64_t d = wrap_dim(dim_in, dim(), "slice");
  PRECIS_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = this->shape(), strides = this->strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  Shape old_shape = this->shape();
  DType dt = dtype();
  return record_view("slice", *this, as_strided(shape, strides, offset() + start * this->strides()[d]),
                     [=](const Tensor& g) {
                       Tensor full_grad = zeros(old_shape, dt, g.device());
                       copy_(full_grad.slice(d, start, end, step), g);
                       return full_grad;
                     });
}

Tensor Tensor::narrow(int64_t dim_in, int64_t start, int64_t length) const {
  int64_t d = wrap_dim(dim_in, dim(), "narrow");
  PRECIS_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d], "narrow: [", start, ", ", start + length,
               ") is out of range for dim ", d, " of size ", shape()[d]);
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t dim_in, int64_t index) const {
  int64_t d = wrap_dim(dim_in, dim(), "select");
  int64_t n = shape()[d];
  PRECIS_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d, " of size ", n);
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& shape_in) const {
  PRECIS_CHECK(shape_in.size() >= shape().size(), "expand: cannot expand shape ", shape(), " to ", shape_in,
               " (fewer dims)");
  size_t lead = shape_in.size() - shape().size();
  Shape shape = shape_in, strides(shape_in.size(), 0);
  for (size_t i = 0; i < shape_in.size(); ++i) {
    if (i < lead) {
      PRECIS_CHECK(shape_in[i] >= 0, "expand: new leading dims must be sized, got ", shape_in);
      continue;
    }
    int64_t from = this->shape()[i - lead];
    if (shape[i] == -1) shape[i] = from;
    PRECIS_CHECK(from == shape[i] || from == 1, "expand: cannot expand shape ", this->shape(), " to ", shape_in,
                 " (dim ", i, ")");
    strides[i] = from == 1 && shape[i] != 1 ? 0 : this->strides()[i - lead];
  }
  Shape old_shape = this->shape();
  return record_view("expand", *this, as_strided(shape, strides, offset()),
                     [old_shape](const Tensor& g) { return ops::sum_to_shape(g, old_shape); });
}

Tensor Tensor::unsqueeze(int64_t dim_in) const {
  int64_t d = wrap_dim(dim_in, dim() + 1, "unsqueeze");
  Shape shape = this->shape(), strides = this->strides();
  int64_t stride = d < dim() ? shape[d] * strides[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  Shape old_shape = this->shape();
  return record_view("unsqueeze", *this, as_strided(shape, strides, offset()),
                     [old_shape](const Tensor& g) { return g.reshape(old_shape); });
}

Tensor Tensor::squeeze(int64_t dim_in) const {
  int64_t d = wrap_dim(dim_in, dim(), "squeeze");
  if (shape()[d] != 1) return *this;
  Shape shape = this->shape(), strides = this->strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  Shape old_shape = this->shape();
  return record_view("squeeze", *this, as_strided(shape, strides, offset()),
                     [old_shape](const Tensor& g) { return g.reshape(old_shape); });
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  int64_t s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  PRECIS_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape shape(this->shape().begin(), this->shape().begin() + s);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= this->shape()[d];
  shape.push_back(merged);
  shape.insert(shape.end(), this->shape().begin() + e + 1, this->shape().end());
  return reshape(shape);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  copy_(out, *this);
  autograd::record("clone", {*this}, {out}, [](const BackwardArgs& g) { return std::vector<Tensor>{g.grad()}; });
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = empty(shape(), target, device());
  copy_(out, *this);
  DType source = dtype();
  // The gradient of a leaf's cast (autocast's bf16 copy of an f32 weight, say) goes to the
  // leaf's AccumulateGrad as it is: that widens it while adding it into .grad, one pass over
  // the gradient instead of a cast and then an add.
  const bool into_leaf = is_leaf() && requires_grad();
  autograd::record(
      "to", {*this}, {out},
      [source, into_leaf](const BackwardArgs& g) {
        return std::vector<Tensor>{into_leaf ? g.grad() : g.grad().to(source)};
      },
      /*saves_tensors=*/false);
  return out;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor out = empty(shape(), dtype(), target);
  copy_(out, contiguous());
  Device source = device();
  autograd::record("to", {*this}, {out},
                   [source](const BackwardArgs& g) { return std::vector<Tensor>{g.grad().to(source)}; });
  return out;
}

}  // namespace precis
