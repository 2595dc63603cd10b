#include "nn/linear.h"

#include "nn/init.h"
#include "ops/matmul.h"

namespace precis::nn {

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options) : Module("Linear") {
  PRECIS_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in=", in_features,
               " out=", out_features);
  weight = register_parameter("weight", empty({out_features, in_features}, options.dtype), /*weight_decay=*/true);
  if (options.bias) bias = register_parameter("bias", empty({out_features}, options.dtype));
  init::default_uniform_(weight, bias);
}

Tensor Linear::forward(const Tensor& x) { return ops::linear(x, weight, bias); }

}  // namespace precis::nn
