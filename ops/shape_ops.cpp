// cat, stack, split and chunk.
//
// cat copies each input into its slice of the output along `dim`; the output is
// out[..., offset_i : offset_i + n_i, ...] = x_i, so the gradient of x_i is the
// same slice of the output's gradient (a view, no copy). stack is cat of the
// inputs unsqueezed at `dim`, and the unsqueeze views carry the gradient back.
// split and chunk return narrow() views of the input, which record their own
// backward; no node of their own is needed.
#include "ops/shape_ops.h"

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/checks.h"

namespace precis::ops {

namespace {

// The list is non-empty and its tensors are defined, of one dtype, on one device.
void check_joinable(const char* op, const std::vector<Tensor>& tensors) {
  PRECIS_CHECK(!tensors.empty(), op, ": expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i)
    PRECIS_CHECK(tensors[i].defined(), op, ": tensor ", i, " is an undefined tensor");
  const Tensor& first = tensors[0];
  for (size_t i = 1; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    PRECIS_CHECK(t.dtype() == first.dtype(), op, ": tensor ", i, " is ", describe(t), " but tensor 0 is ",
                 describe(first), "; all tensors must have one dtype (convert with .to(dtype))");
    PRECIS_CHECK(t.device() == first.device(), op, ": tensor ", i, " is ", describe(t), " but tensor 0 is ",
                 describe(first), "; all tensors must be on one device (move them with .to(device))");
  }
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  check_joinable("cat", tensors);
  const Tensor& first = tensors[0];
  PRECIS_CHECK(first.dim() > 0, "cat: zero-dim tensors cannot be concatenated; unsqueeze them or use stack");
  const int64_t d = wrap_dim(dim, first.dim(), "cat");
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    bool fits = t.dim() == first.dim();
    for (int64_t k = 0; fits && k < t.dim(); ++k) fits = k == d || t.shape()[k] == first.shape()[k];
    PRECIS_CHECK(fits, "cat: tensor ", i, " has shape ", t.shape(), " but tensor 0 has shape ", first.shape(),
                 "; shapes must match in every dim except dim ", d);
    out_shape[d] += t.shape()[d];
  }

  Tensor out = empty(out_shape, first.dtype(), first.device());
  std::vector<int64_t> offsets(tensors.size());
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    offsets[i] = offset;
    copy_(out.narrow(d, offset, tensors[i].shape()[d]), tensors[i]);
    offset += tensors[i].shape()[d];
  }

  std::vector<int64_t> lengths(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) lengths[i] = tensors[i].shape()[d];
  autograd::record("cat", tensors, {out}, [d, offsets, lengths](const BackwardArgs& g) {
    std::vector<Tensor> grads(offsets.size());
    for (size_t i = 0; i < offsets.size(); ++i)
      if (g.needs(i)) grads[i] = g.grad().narrow(d, offsets[i], lengths[i]);
    return grads;
  });
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  check_joinable("stack", tensors);
  const Tensor& first = tensors[0];
  for (size_t i = 1; i < tensors.size(); ++i)
    PRECIS_CHECK(tensors[i].shape() == first.shape(), "stack: tensor ", i, " has shape ", tensors[i].shape(),
                 " but tensor 0 has shape ", first.shape(), "; stack needs tensors of one shape");
  const int64_t d = wrap_dim(dim, first.dim() + 1, "stack");
  std::vector<Tensor> unsqueezed;
  unsqueezed.reserve(tensors.size());
  for (const Tensor& t : tensors) unsqueezed.push_back(t.unsqueeze(d));
  return cat(unsqueezed, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  require_defined("split", x);
  PRECIS_CHECK(x.dim() > 0, "split: cannot split a zero-dim tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.shape()[d];
  PRECIS_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be positive, got ", split_size,
               " for dim ", d, " of shape ", x.shape());
  // A size-0 dim still gives one (empty) piece, as torch.split does.
  const int64_t pieces = n == 0 ? 1 : (n + split_size - 1) / split_size;
  std::vector<Tensor> out;
  out.reserve(pieces);
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t start = i * split_size;
    out.push_back(x.narrow(d, start, std::min(split_size, n - start)));
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  require_defined("split", x);
  PRECIS_CHECK(x.dim() > 0, "split: cannot split a zero-dim tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    PRECIS_CHECK(s >= 0, "split: sizes ", sizes, " contain a negative size");
    total += s;
  }
  PRECIS_CHECK(total == x.shape()[d], "split: sizes ", sizes, " sum to ", total, " but dim ", d, " of shape ",
               x.shape(), " has size ", x.shape()[d]);
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(x.narrow(d, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  require_defined("chunk", x);
  PRECIS_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  PRECIS_CHECK(x.dim() > 0, "chunk: cannot chunk a zero-dim tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.shape()[d];
  // An empty dim gives `chunks` empty pieces, as torch.chunk does (split would give one).
  if (n == 0) return split(x, std::vector<int64_t>(chunks, 0), d);
  return split(x, (n + chunks - 1) / chunks, d);
}

}  // namespace precis::ops
