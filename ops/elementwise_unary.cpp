// Unary elementwise ops. Each forward is one map_unary; each backward is
// written with ops so that it runs on any device and dtype.
//   neg:  d(-x)      = -g
//   exp:  d exp(x)   = g * exp(x)          (saves the output)
#include <cmath>

#include "core/autograd.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/elementwise.h"

namespace precis::ops {

namespace {
Tensor checked_input(const char* op, const Tensor& x) {
  require_defined(op, x);
  require_cpu(op, {&x});
  require_floating(op, x);
  return x;
}
}  // namespace

Tensor neg(const Tensor& x) {
  checked_input("neg", x);
  Tensor out = cpu::map_unary(x, "neg", [](auto v) { return -v; });
  autograd::record("neg", {x}, {out}, [](const BackwardArgs& g) { return std::vector<Tensor>{neg(g.grad())}; });
  return out;
}

Tensor exp(const Tensor& x) {
  checked_input("exp", x);
  Tensor out = cpu::map_unary(x, "exp", [](auto v) { return std::exp(v); });
  if (autograd::any_requires_grad({&x})) {
    autograd::record("exp", {x}, {out}, [out = out.detach()](const BackwardArgs& g) {
      return std::vector<Tensor>{mul(g.grad(), out)};
    });
  }
  return out;
}

}  // namespace precis::ops
