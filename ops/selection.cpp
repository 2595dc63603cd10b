// where, masked_fill and causal_mask.
//
// Gradients (the selection passes g through unchanged to whichever input was picked):
//   where(c, a, b):        da = g where c, else 0;  db = g where !c, else 0
//                          (each then summed back over broadcast dims to its input's shape)
//   masked_fill(x, m, v):  dx = g where !m, else 0  (the filled positions came from v)
#include "core/autograd.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/cuda/elementwise.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace precis::ops {

namespace {

// g where cond == when, 0 elsewhere, in g's dtype and the broadcast shape of cond and g.
Tensor picked_grad(const Tensor& cond, const Tensor& grad, bool when, const char* op) {
#if PRECIS_WITH_CUDA
  if (grad.is_cuda()) return cuda::where_scalar(cond, grad, when, 0.0);
#endif
  Tensor zero = scalar_tensor(0.0, grad.dtype());
  return cpu::map_ternary(cond, grad, zero, grad.dtype(), op,
                          [when](bool c, auto g, auto z) { return c == when ? g : z; });
}

// cond ? a : b (broadcast, in `dtype`) on the inputs' device.
Tensor select(const Tensor& cond, const Tensor& a, const Tensor& b, DType dtype) {
#if PRECIS_WITH_CUDA
  if (a.is_cuda()) return cuda::where(cond, a, b, dtype);
#endif
  return cpu::map_ternary(cond, a, b, dtype, "where", [](bool c, auto x, auto y) { return c ? x : y; });
}

// mask ? value : x, in x's dtype, on x's device.
Tensor fill_where(const Tensor& mask, const Tensor& x, double value) {
#if PRECIS_WITH_CUDA
  if (x.is_cuda()) return cuda::where_scalar(mask, x, false, value);
#endif
  return cpu::map_ternary(mask, scalar_tensor(value, x.dtype()), x, x.dtype(), "masked_fill",
                          [](bool m, auto v, auto y) { return m ? v : y; });
}

// g where cond == when, 0 elsewhere, summed back to `shape` and converted to `dtype`.
Tensor selected_grad(const Tensor& cond, const Tensor& grad, bool when, const Shape& shape, DType dtype,
                     const char* op) {
  Tensor reduced = sum_to_shape(picked_grad(cond, grad, when, op), shape);
  return reduced.dtype() == dtype ? reduced : reduced.to(dtype);
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  require_defined("where", cond, "condition");
  require_defined("where", a, "first operand");
  require_defined("where", b, "second operand");
  common_device("where", {&cond, &a, &b});
  require_floating("where", a, "first operand");
  require_floating("where", b, "second operand");
  DType dtype = promote_types(a.dtype(), b.dtype());
  Tensor out = select(cond, a, b, dtype);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record(
        "where", {a, b}, {out},
        [cond = cond.detach(), sa = a.shape(), sb = b.shape(), da = a.dtype(), db = b.dtype()](const BackwardArgs& g) {
          return std::vector<Tensor>{g.needs(0) ? selected_grad(cond, g.grad(), true, sa, da, "where") : Tensor(),
                                     g.needs(1) ? selected_grad(cond, g.grad(), false, sb, db, "where") : Tensor()};
        });
  }
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  require_defined("masked_fill", x);
  require_defined("masked_fill", mask, "mask");
  common_device("masked_fill", {&x, &mask});
  require_floating("masked_fill", x);
  PRECIS_CHECK(mask.dtype() == DType::boolean, "masked_fill: mask must be a bool tensor, got ", describe(mask));
  PRECIS_CHECK(broadcast_shapes(x.shape(), mask.shape(), "masked_fill") == x.shape(), "masked_fill: mask of shape ",
               mask.shape(), " does not broadcast to the input's shape ", x.shape());
  Tensor out = fill_where(mask, x, value);
  if (autograd::any_requires_grad({&x})) {
    autograd::record("masked_fill", {x}, {out},
                     [mask = mask.detach(), shape = x.shape(), dtype = x.dtype()](const BackwardArgs& g) {
                       return std::vector<Tensor>{selected_grad(mask, g.grad(), false, shape, dtype, "masked_fill")};
                     });
  }
  return out;
}

Tensor causal_mask(int64_t T, Device device) {
  PRECIS_CHECK(T >= 0, "causal_mask: T must be non-negative, got ", T);
#if PRECIS_WITH_CUDA
  if (device.is_cuda()) return cuda::causal_mask(T, device);
#endif
  Tensor mask = empty({T, T}, DType::boolean);
  bool* m = mask.data<bool>();
#pragma omp parallel for schedule(static) if (T * T >= kParallelGrain)
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) m[i * T + j] = j > i;
  return mask.to(device);
}

}  // namespace precis::ops
