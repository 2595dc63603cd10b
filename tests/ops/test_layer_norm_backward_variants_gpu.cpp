// The temporary variants of the layer norm backward's stage 1 for uniform 16-bit rows of 257 to
// 768 values (ops/cuda/layer_norm.h's layer_norm_backward_kernel switch, PRECIS_AB_LN_BWD)
// against the warp kernel, which the other layer norm tests check against the CPU: `async` (12
// warps a block, the warp kernel's rows, lanes and order) must give its bits in every output;
// `async16` (16 warps: the rows' column sums in another order) its bits in dx and dr and its
// parameter sums within f32's tolerance. Over bf16 and f16, rows of 768, 512, 648, 264 values
// (and 300, which is not in 16-byte packs and takes the general kernel under every setting),
// 1, 7 and 16384 rows, with and without the sum's gradient g_sum and the residual bias's
// gradient, the weight in x's dtype or f32, and the sums written in f32, written in x's dtype
// (a 16-bit .grad) or added to an existing .grad. Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "core/copy.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/layer_norm.h"
#endif

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_near_magnitude;
using precis::testing::kGpu;
using precis::testing::random_f64;

#if PRECIS_WITH_CUDA

namespace {

using ops::cuda::LayerNormBackwardKernel;

Tensor values(const Shape& shape, uint64_t seed, DType dtype, double low = -1.0, double high = 1.0) {
  return random_f64(shape, seed, low, high).to(dtype).to(kGpu);
}

Tensor poisoned(const Shape& shape, DType dtype) { return full(shape, precis::testing::kNaN, dtype, kGpu); }

// The same bytes (so the same values, signs of zeros and NaNs included); an undefined pair agrees.
void expect_same_bits(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.defined(), expected.defined()) << what;
  if (!actual.defined()) return;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const Tensor a = actual.to(Device::cpu()), e = expected.to(Device::cpu());
  if (std::memcmp(a.raw_data(), e.raw_data(), a.nbytes()) == 0) return;
  ADD_FAILURE() << what << ": not the same bits";
  expect_close(a.to(DType::f64), e.to(DType::f64), 0, 0);  // names the first elements that differ
}

// Runs fn with the switch set to `kernel`, then puts it back as it was.
template <typename Fn>
auto with_kernel(LayerNormBackwardKernel kernel, Fn&& fn) {
  std::atomic<LayerNormBackwardKernel>& selected = ops::cuda::layer_norm_backward_kernel();
  const LayerNormBackwardKernel before = selected.load();
  selected = kernel;
  auto result = fn();
  selected = before;
  return result;
}

struct Outputs {
  Tensor ds, dr, dw, db, drb;
};

struct Inputs {
  DType dtype;
  int64_t rows, C;
  Tensor x, g, g_sum, weight, weight_f32, mean, rstd;
};

Inputs make_inputs(DType dtype, int64_t rows, int64_t C, uint64_t seed) {
  const Tensor weight_f32 = values({C}, seed + 3, DType::f32, 0.5, 1.5);
  Inputs in{dtype,
            rows,
            C,
            values({rows, C}, seed, dtype, -3, 3),
            values({rows, C}, seed + 1, dtype),
            values({rows, C}, seed + 2, dtype),
            weight_f32.to(dtype),
            weight_f32,
            poisoned({rows}, DType::f32),
            poisoned({rows}, DType::f32)};
  Tensor y = poisoned({rows, C}, dtype);
  ops::cuda::layer_norm_forward(in.x, in.weight_f32, zeros({C}, DType::f32, kGpu), 1e-5, y, in.mean, in.rstd);
  return in;
}

// The three calls a case makes: (0) ds and dr, the sums in f32 written over poison; (1) ds alone,
// the sums in x's dtype (a 16-bit .grad) written; (2) no ds, the sums in x's dtype added to 0.5.
Outputs backward(const Inputs& in, int call, bool with_g_sum, bool residual_bias, bool narrow_weight) {
  const DType sums_dtype = call == 0 ? DType::f32 : in.dtype;
  const bool accumulate = call == 2;
  auto sums = [&] { return accumulate ? full({in.C}, 0.5, sums_dtype, kGpu) : poisoned({in.C}, sums_dtype); };
  Outputs out{call == 2 ? Tensor() : poisoned({in.rows, in.C}, in.dtype),
              call == 0 ? poisoned({in.rows, in.C}, in.dtype) : Tensor(), sums(), sums(),
              residual_bias ? sums() : Tensor()};
  ops::cuda::layer_norm_backward(in.x, in.g, narrow_weight ? in.weight : in.weight_f32, in.mean, in.rstd, out.ds,
                                 out.dw, out.db, with_g_sum ? in.g_sum : Tensor(), out.dr, accumulate, accumulate,
                                 out.drb, accumulate);
  return out;
}

// Every case, each output of the variant `kernel` against the warp kernel's: the same bits, or
// (sums_same_bits false) the parameter sums within f32's tolerance relative to their magnitude.
void expect_variant_matches_warp_kernel(LayerNormBackwardKernel kernel, bool sums_same_bits) {
  uint64_t seed = 7000;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int64_t C : {768, 512, 648, 264, 300}) {
      for (int64_t rows : {1, 7, 16384}) {
        const Inputs in = make_inputs(dtype, rows, C, seed += 10);
        for (bool with_g_sum : {true, false}) {
          for (bool residual_bias : {true, false}) {
            for (bool narrow_weight : {true, false}) {
              for (int call : {0, 1, 2}) {
                const std::string what =
                    std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " + std::to_string(C) + "]" +
                    (with_g_sum ? ", g_sum" : "") + (residual_bias ? ", residual bias" : "") +
                    (narrow_weight ? ", weight in x's dtype" : ", f32 weight") + ", call " + std::to_string(call);
                SCOPED_TRACE(what);
                const Outputs expected = with_kernel(LayerNormBackwardKernel::warp, [&] {
                  return backward(in, call, with_g_sum, residual_bias, narrow_weight);
                });
                const Outputs actual =
                    with_kernel(kernel, [&] { return backward(in, call, with_g_sum, residual_bias, narrow_weight); });
                expect_same_bits(actual.ds, expected.ds, "ds");
                expect_same_bits(actual.dr, expected.dr, "dr");
                const std::vector<std::pair<const char*, std::pair<Tensor, Tensor>>> sums = {
                    {"dw", {actual.dw, expected.dw}}, {"db", {actual.db, expected.db}}};
                for (const auto& [name, pair] : sums) {
                  if (sums_same_bits) {
                    expect_same_bits(pair.first, pair.second, name);
                  } else {
                    // 16-bit sums: the f32 sums rounded once, a rounding apart where they differ.
                    const double tol = pair.first.dtype() == DType::f32 ? 1e-5 : 1e-2;
                    expect_near_magnitude(pair.first, pair.second, tol, name);
                  }
                }
                if (residual_bias) {
                  if (sums_same_bits)
                    expect_same_bits(actual.drb, expected.drb, "drb");
                  else
                    expect_near_magnitude(actual.drb, expected.drb, actual.drb.dtype() == DType::f32 ? 1e-5 : 1e-2,
                                          "drb");
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

#endif  // PRECIS_WITH_CUDA

TEST(LayerNormBackwardVariantsGpu, AsyncGivesTheWarpKernelsBits) {
  PRECIS_SKIP_WITHOUT_GPU();
#if PRECIS_WITH_CUDA
  expect_variant_matches_warp_kernel(LayerNormBackwardKernel::async, true);
#endif
}

TEST(LayerNormBackwardVariantsGpu, Async16GivesTheWarpKernelsGradientsAndNearlyItsSums) {
  PRECIS_SKIP_WITHOUT_GPU();
#if PRECIS_WITH_CUDA
  expect_variant_matches_warp_kernel(LayerNormBackwardKernel::async16, false);
#endif
}

TEST(LayerNormBackwardVariantsGpu, AsyncMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
#if PRECIS_WITH_CUDA
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t rows = 1030, C = 768;
    const Inputs in = make_inputs(dtype, rows, C, 9000);
    const Outputs out = with_kernel(LayerNormBackwardKernel::async, [&] { return backward(in, 0, true, true, true); });
    Tensor x64 = in.x.to(Device::cpu()).to(DType::f64).set_requires_grad();
    Tensor w64 = in.weight.to(Device::cpu()).to(DType::f64).set_requires_grad();
    Tensor b64 = zeros({C}, DType::f64).set_requires_grad();
    ops::layer_norm(x64, w64, b64).backward(in.g.to(Device::cpu()).to(DType::f64));
    const Tensor ds64 = x64.grad() + in.g_sum.to(Device::cpu()).to(DType::f64);
    expect_near_magnitude(out.ds, ds64, 1e-2, "ds");
    expect_near_magnitude(out.dr, ds64, 1e-2, "dr");
    expect_near_magnitude(out.dw, w64.grad(), 1e-4, "dw");
    expect_near_magnitude(out.db, b64.grad(), 1e-4, "db");
    expect_near_magnitude(out.drb, ops::sum_to_shape(ds64, Shape{C}), 1e-4, "drb");
  }
#endif
}
