// Gradients written into a 16-bit flat gradient buffer (precision.grad_dtype: a bf16 or f16
// parameter's .grad in its own dtype), on the CPU (test_grad_dtype.cpp) and the GPU
// (test_grad_dtype_gpu.cpp). A model with the writers of GPT-2's step: a table used by an
// embedding and by the head's product (GPT-2's tied wte: the head writes, the embedding then
// adds), a layer norm, and GPT-2's MLP (linear_gelu_linear: the first bias's gradient by the
// DGELU_BGRAD epilogue or column sums, the second's by BGRADB or column sums). Its parameters are flattened twice from
// the same values: with an f32 gradient buffer, which gives each contribution (the head's and the embedding's apart),
// and with a 16-bit one, whose .grad must equal
//   after the first backward (stale .grad: written over)   r(c1), then r(r(c1) + c2) for wte
//   after a second one (adds, as a micro-step does)          r(prev + c) for each contribution c
// with r rounding to the 16-bit dtype: each add rounded once. On the GPU the kernels add their
// f32 sums (c unrounded: cuBLASLt's accumulator with beta = 1, the layer norm's and the
// embedding's f32 sums; the reference run takes the 16-bit run's epilogues, so that both share
// their activations; the GPU's tolerance is explained at expect_matches); on the CPU the ops return each contribution
// in the parameter's dtype (c rounded first), the engine sums the table's two and adds the sum to .grad. The
// embedding's contribution is summed on the host from the gradient its rows received, in f64.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/convert.h"
#include "core/copy.h"
#include "core/random.h"
#include "nn/flat_parameters.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/nn_functional.h"
#include "ops/reduce.h"
#include "support/devices.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/matmul.h"
#endif

namespace grad_dtype_cases {

using namespace precis;
using precis::testing::OnDevice;

// On a GPU: cuBLASLt's epilogues on or off for the scope (the bias gradients by the epilogue, or
// by column_sums); nothing on the CPU.
class EpiloguesFused {
 public:
  explicit EpiloguesFused(bool fuse) {
#if PRECIS_WITH_CUDA
    ops::cuda::set_fuse_epilogues(fuse);
#endif
    (void)fuse;
  }
  ~EpiloguesFused() {
#if PRECIS_WITH_CUDA
    ops::cuda::set_fuse_epilogues(true);
#endif
  }
  EpiloguesFused(const EpiloguesFused&) = delete;
  EpiloguesFused& operator=(const EpiloguesFused&) = delete;
};

class TiedTableModel : public nn::Module {
 public:
  TiedTableModel(int64_t vocab, int64_t C, uint64_t seed) : nn::Module("TiedTableModel") {
    wte = register_parameter("wte", zeros({vocab, C}));
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(C));
    fc = register_module("fc", std::make_shared<nn::Linear>(C, 2 * C));
    proj = register_module("proj", std::make_shared<nn::Linear>(2 * C, C));
    Generator gen(seed);
    NoGradGuard no_grad;
    for (const nn::NamedTensor& p : named_parameters()) copy_(p.tensor, randn(p.tensor.shape(), DType::f32, &gen));
  }

  // Which of the table's uses carry its gradient.
  enum class Uses { both, head_only, embedding_only };
  struct Forward {
    Tensor loss;
    Tensor rows;  // the embedding's output: a leaf with requires_grad where the embedding's use is cut
  };
  // loss = sum(r * (proj(gelu(fc(ln(wte[idx])))) wte^T)).
  Forward forward(const Tensor& idx, const Tensor& r, Uses uses) {
    Forward f;
    f.rows = ops::embedding(uses == Uses::head_only ? wte.detach() : wte, idx);
    if (uses == Uses::head_only) f.rows.set_requires_grad();
    const Tensor h = ops::linear_gelu_linear(ln->forward(f.rows), fc->weight, fc->bias, proj->weight, proj->bias);
    const Tensor logits = ops::linear(h, uses == Uses::embedding_only ? wte.detach() : wte);
    f.loss = ops::sum(ops::mul(ops::cast(logits, DType::f32), r));
    return f;
  }

  Tensor wte;
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Linear> fc, proj;
};

// Each parameter's gradient as f64 values on the host.
inline std::map<std::string, std::vector<double>> gradients_of(nn::Module& model) {
  std::map<std::string, std::vector<double>> out;
  for (const nn::NamedTensor& p : model.named_parameters())
    out[p.name] = p.tensor.grad().to(DType::f64).to_vector<double>();
  return out;
}

// x (an f32 value: the kernels' sums) rounded to nearest-even in `dtype` (f16/bf16), as f64.
inline double rounded(double x, DType dtype) {
  const float f = static_cast<float>(x);
  return dtype == DType::bf16 ? convert<double>(convert<bfloat16>(f)) : convert<double>(convert<half>(f));
}

class GradDtype : public OnDevice {
 protected:
  // `fuse`: the 16-bit run's epilogues (GPU).
  void expect_rounded_once(DType dtype, int64_t vocab, int64_t C, int64_t N, bool fuse = true) {
    const Device dev = device();
    const bool rounded_contributions = dev.is_cpu();
    Generator gen(7);
    const Tensor idx = ops::cast(ops::mul(rand({N}, DType::f32, &gen), static_cast<double>(vocab)), DType::i64).to(dev);
    const Tensor r = randn({N, vocab}, DType::f32, &gen).to(dev);

    // The contributions, from the f32 gradient buffer.
    TiedTableModel reference(vocab, C, 3);
    auto reference_flat = nn::flatten_parameters(reference, dev, dtype, 1, DType::f32);
    TiedTableModel::Forward head;
    reference_flat->zero_grad_lazily();
    {
      // The same epilogues as the 16-bit run's, forward and backward: a fused GELU or DGELU
      // rounds at another place than the separate kernels, and the runs must share every
      // activation and activation gradient for their parameter gradients to be comparable.
      EpiloguesFused same(fuse);
      head = reference.forward(idx, r, TiedTableModel::Uses::head_only);
      head.loss.backward();
    }
    reference_flat->settle_grads();
    const std::map<std::string, std::vector<double>> c = gradients_of(reference);  // wte: the head's only
    // The embedding's: dwte[v] = sum of the gradient rows n with idx[n] == v.
    const std::vector<double> row_grads = head.rows.grad().to(DType::f64).to_vector<double>();
    const std::vector<int64_t> indices = idx.to_vector<int64_t>();
    std::vector<double> embedding_part(vocab * C, 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < C; ++j) embedding_part[indices[n] * C + j] += row_grads[n * C + j];

    TiedTableModel model(vocab, C, 3);
    auto flat = nn::flatten_parameters(model, dev, dtype, 1, dtype);
    ASSERT_EQ(flat->buffers().size(), 1u);
    ASSERT_EQ(flat->buffers()[0].grad.dtype(), dtype);
    std::map<std::string, std::vector<double>> expected;
    for (const auto& [name, values] : c) expected[name] = std::vector<double>(values.size(), 0.0);
    auto add = [&](std::vector<double>& held, const std::vector<double>& part) {
      for (size_t i = 0; i < held.size(); ++i)
        held[i] = rounded(held[i] + (rounded_contributions ? rounded(part[i], dtype) : part[i]), dtype);
    };
    flat->zero_grad_lazily();
    EpiloguesFused fused(fuse);
    for (int backward = 0; backward < 2; ++backward) {
      model.forward(idx, r, TiedTableModel::Uses::both).loss.backward();
      for (auto& [name, held] : expected) {
        if (name != "wte") {
          add(held, c.at(name));  // over the stale zeros of the first backward: r(c)
        } else if (rounded_contributions) {
          // The engine sums the table's two returned contributions, then adds the sum.
          std::vector<double> sum(held.size(), 0.0);
          add(sum, c.at(name));
          add(sum, embedding_part);
          add(held, sum);
        } else {
          add(held, c.at(name));      // the head's product writes (or adds) first,
          add(held, embedding_part);  // then the embedding adds
        }
      }
      const std::map<std::string, std::vector<double>> got = gradients_of(model);
      for (const auto& [name, want] : expected)
        expect_matches(got.at(name), want, dtype, name + " after backward " + std::to_string(backward + 1));
    }
  }

  // On the CPU every element equals the reference. On the GPU the two runs share their
  // activations but not every product's algorithm: cuBLASLt may pick another kernel (another
  // order of the f32 sums) for a 16-bit output, for a product that adds to its output, or for
  // another epilogue, and where such a sum feeds a rounding to 16 bits whose result is then
  // summed with cancellation (a bias's column sums), the difference grows past one unit in the
  // last place of the result while staying at the terms' precision. So the GPU checks the whole
  // gradient against the reference within a few units of the dtype's roundoff (norm-wise): a
  // missing, doubled or stale contribution is off by its own size and fails. Where single
  // rounding itself is checked, element by element, is the CPU.
  void expect_matches(const std::vector<double>& got, const std::vector<double>& want, DType dtype,
                      const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    const int mantissa_bits = dtype == DType::bf16 ? 8 : 11;
    const bool exact_everywhere = device().is_cpu();
    size_t within_ulp = 0;
    double error_squares = 0.0, want_squares = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      error_squares += (got[i] - want[i]) * (got[i] - want[i]);
      want_squares += want[i] * want[i];
      const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::abs(want[i]), 1e-30)) - (mantissa_bits - 1));
      if (std::abs(got[i] - want[i]) <= ulp) ++within_ulp;
      if (exact_everywhere) {
        EXPECT_EQ(got[i], want[i]) << what << " [" << i << "]";
      }
    }
    const double relative = std::sqrt(error_squares / std::max(want_squares, 1e-300));
    const double roundoff = std::ldexp(1.0, -mantissa_bits);
    std::cout << what << ": relative error " << relative << " (" << relative / roundoff << " roundoffs), " << within_ulp
              << " of " << got.size() << " within one ulp\n";
    EXPECT_LE(relative, 4 * roundoff) << what;
  }
};

TEST_P(GradDtype, SixteenBitGradientsAreEachAddRoundedOnce) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    for (bool fuse : {true, false}) {
      SCOPED_TRACE(fuse ? "epilogues" : "column sums");
      expect_rounded_once(dtype, /*vocab=*/40, /*C=*/48, /*N=*/64, fuse);  // runs of a few rows per table row
      expect_rounded_once(dtype, /*vocab=*/37, /*C=*/20, /*N=*/50, fuse);  // odd sizes: the unpacked kernels
    }
  }
}

TEST_P(GradDtype, LargerProductsToo) {
  // cuBLASLt's weight-gradient product at a size it tunes for, the fused bias gradient against column sums.
  expect_rounded_once(DType::bf16, /*vocab=*/256, /*C=*/256, /*N=*/512);
}

}  // namespace grad_dtype_cases
