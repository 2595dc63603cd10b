#include "ops/broadcast.h"

namespace precis::ops {

Tensor broadcast_view(const Tensor& t, const Shape& shape, const char* op) {
  if (t.shape() == shape) return t;
  PRECIS_CHECK(static_cast<int64_t>(shape.size()) >= t.dim(), op, ": cannot broadcast shape ", t.shape(), " to ",
               shape);
  size_t lead = shape.size() - t.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < t.shape().size(); ++i) {
    int64_t from = t.shape()[i], to = shape[lead + i];
    PRECIS_CHECK(from == to || from == 1, op, ": cannot broadcast shape ", t.shape(), " to ", shape);
    strides[lead + i] = from == 1 ? 0 : t.strides()[i];
  }
  return t.as_strided(shape, strides, t.offset());
}

}  // namespace precis::ops
