// add, sub, mul, div of two tensors with numpy broadcasting:
//   out[i] = a[i'] op b[i''], where i' and i'' are i with the broadcast dims of a and b
//   pinned to 0 (stride 0). Both operands are first converted to the result dtype; half
//   types compute in f32, integers in their own type (truncating division, as the CPU).
// Same-shape dense operands (the bulk of a training step) take the 16-byte dense kernel.
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/elementwise.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

template <BinaryOp op>
struct BinaryFn {
  template <typename C>
  __device__ __forceinline__ C operator()(C a, C b) const {
    if constexpr (op == BinaryOp::add) {
      return a + b;
    } else if constexpr (op == BinaryOp::sub) {
      return a - b;
    } else if constexpr (op == BinaryOp::mul) {
      return a * b;
    } else {
      static_assert(op == BinaryOp::div);
      return a / b;
    }
  }
};

const char* name_of(BinaryOp op) {
  switch (op) {
    case BinaryOp::add:
      return "add";
    case BinaryOp::sub:
      return "sub";
    case BinaryOp::mul:
      return "mul";
    case BinaryOp::div:
      return "div";
  }
  return "binary";
}

template <BinaryOp op>
Tensor binary_as(const Tensor& a_in, const Tensor& b_in, DType dtype) {
  const char* name = name_of(op);
  Shape shape = broadcast_shapes(a_in.shape(), b_in.shape(), name);
  Tensor a = broadcast_view(converted(a_in, dtype), shape, name);
  Tensor b = broadcast_view(converted(b_in, dtype), shape, name);
  Tensor out = empty(shape, dtype, a_in.device());
  dispatch_numeric(dtype, name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map<T, 2>(name, out, {a, b}, BinaryFn<op>{});
  });
  return out;
}

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, DType dtype) {
  switch (op) {
    case BinaryOp::add:
      return binary_as<BinaryOp::add>(a, b, dtype);
    case BinaryOp::sub:
      return binary_as<BinaryOp::sub>(a, b, dtype);
    case BinaryOp::mul:
      return binary_as<BinaryOp::mul>(a, b, dtype);
    case BinaryOp::div:
      return binary_as<BinaryOp::div>(a, b, dtype);
  }
  PRECIS_FAIL("binary: unknown op");
}

}  // namespace precis::ops::cuda
