#include "ops/tap.h"

#include "core/autograd.h"

namespace precis::ops {

Tensor tap(const Tensor& x, const TapFn& on_forward, const TapFn& on_backward) {
  if (on_forward) on_forward(x);
  Tensor out = x.detach();
  autograd::record(
      "tap", {x}, {out},
      [on_backward](const BackwardArgs& g) {
        if (on_backward && g.grad().defined()) on_backward(g.grad());
        return std::vector<Tensor>{g.grad()};
      },
      /*saves_tensors=*/false);
  return out;
}

}  // namespace precis::ops
