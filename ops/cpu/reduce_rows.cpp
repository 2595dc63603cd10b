#include "ops/cpu/reduce_rows.h"

namespace precis::ops::cpu {

ReductionRows reduction_rows(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  ReductionRows r;
  r.reduced.assign(x.dim(), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, x.dim(), op);
    if (x.dim() == 0) continue;
    PRECIS_CHECK(!r.reduced[w], op, ": dim ", d, " appears twice in the reduction dims");
    r.reduced[w] = true;
  }
  std::vector<int64_t> order;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (r.reduced[d]) {
      r.inner *= x.shape()[d];
      r.keepdim_shape.push_back(1);
    } else {
      order.push_back(d);
      r.outer *= x.shape()[d];
      r.out_shape.push_back(x.shape()[d]);
      r.keepdim_shape.push_back(x.shape()[d]);
    }
  }
  for (int64_t d = 0; d < x.dim(); ++d)
    if (r.reduced[d]) order.push_back(d);
  // A permuted view (no autograd: callers record their own backward), then dense rows.
  Shape shape, strides;
  for (int64_t d : order) {
    shape.push_back(x.shape()[d]);
    strides.push_back(x.strides()[d]);
  }
  Tensor permuted = x.as_strided(shape, strides, x.offset());
  if (!permuted.is_contiguous()) {
    Tensor dense = empty(shape, x.dtype(), x.device());
    copy_(dense, permuted);
    permuted = dense;
  }
  r.rows = permuted.as_strided({r.outer, r.inner}, {r.inner, 1}, permuted.offset());
  return r;
}

}  // namespace precis::ops::cpu
