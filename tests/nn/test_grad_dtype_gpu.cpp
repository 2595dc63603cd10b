// A 16-bit flat gradient buffer (precision.grad_dtype) on the GPU: the products (cuBLASLt with
// a 16-bit D, beta = 1 to add; the bias by its epilogue or column_sums), the layer norm's
// parameter sums and the embedding's backward write each parameter's .grad in its own dtype,
// each add rounded once from their f32 sums, the tied table's second contribution added to the
// first (grad_dtype_cases.h). Skipped, with the reason, where no GPU is usable.
#include "grad_dtype_cases.h"

using namespace precis;

namespace grad_dtype_cases {
INSTANTIATE_TEST_SUITE_P(Cuda, GradDtype, ::testing::Values(Device::cuda(0)), precis::testing::device_name);
}  // namespace grad_dtype_cases
