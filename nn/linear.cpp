#include "nn/linear.h"

#include <cmath>

#include "nn/init.h"
#include "ops/matmul.h"

namespace precis::nn {

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options) : Module("Linear") {
  PRECIS_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in=", in_features,
               " out=", out_features);
  double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  Tensor w = empty({out_features, in_features}, options.dtype);
  init::uniform_(w, -bound, bound);
  weight = register_parameter("weight", w, /*weight_decay=*/true);
  if (options.bias) {
    Tensor b = empty({out_features}, options.dtype);
    init::uniform_(b, -bound, bound);
    bias = register_parameter("bias", b);
  }
}

Tensor Linear::forward(const Tensor& x) { return ops::linear(x, weight, bias); }

}  // namespace precis::nn
