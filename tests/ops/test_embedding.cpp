#include <gtest/gtest.h>

#include "core/random.h"
#include "ops/ops.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::error_of;
using precis::testing::expect_close;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

Tensor indices_of(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::i64) {
  return from_vector(values, shape).to(dtype);
}

}  // namespace

TEST(Embedding, HandComputedRows) {
  Tensor weight = tensor({0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32}).reshape({4, 3});
  for (DType index_dtype : {DType::i64, DType::i32}) {
    Tensor out = ops::embedding(weight, indices_of({3, 0, 3, 1}, {2, 2}, index_dtype));
    EXPECT_EQ(out.shape(), Shape({2, 2, 3}));
    EXPECT_EQ(out.dtype(), DType::f32);
    expect_close(out, tensor({30, 31, 32, 0, 1, 2, 30, 31, 32, 10, 11, 12}).reshape({2, 2, 3}));
  }
  // A single index (zero-dim) gives one row.
  expect_close(ops::embedding(weight, scalar_tensor(2, DType::i64)), tensor({20, 21, 22}));
  // Empty indices give an empty [..., C].
  EXPECT_EQ(ops::embedding(weight, zeros({0, 5}, DType::i64)).shape(), Shape({0, 5, 3}));
}

TEST(Embedding, StridedWeightAndIndicesAndHalfTypes) {
  Tensor base = tensor({0, 10, 20, 1, 11, 21}).reshape({2, 3});
  Tensor weight = base.t();                                            // [3, 2], rows 0..2 are {0,1}, {10,11}, {20,21}
  Tensor idx = indices_of({2, 9, 0, 9, 1, 9}, {6}).slice(0, 0, 6, 2);  // {2, 0, 1}, stride 2
  expect_close(ops::embedding(weight, idx), tensor({20, 21, 0, 1, 10, 11}).reshape({3, 2}));
  for (DType dt : {DType::bf16, DType::f16, DType::f64}) {
    Tensor out = ops::embedding(weight.to(dt), idx);
    EXPECT_EQ(out.dtype(), dt);
    expect_close(out, tensor({20, 21, 0, 1, 10, 11}).reshape({3, 2}));
  }
}

TEST(Embedding, RepeatedIndicesAccumulateGradients) {
  Tensor weight = zeros({3, 2}, DType::f64).set_requires_grad(true);
  Tensor out = ops::embedding(weight, indices_of({1, 1, 1, 0}, {4}));
  ops::sum(out).backward();
  expect_close(weight.grad(), tensor({1, 1, 3, 3, 0, 0}, DType::f64).reshape({3, 2}));
}

TEST(Embedding, GradientsMatchFiniteDifferences) {
  Tensor weight = random_f64({5, 7}, 1);
  Tensor idx = indices_of({4, 0, 2, 2, 4, 4, 1, 0, 3, 2, 0, 4}, {3, 4});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::embedding(in[0], in[1]); }, {weight, idx});
  // Non-contiguous weight, i32 indices.
  Tensor weight_t = random_f64({7, 5}, 2).t();
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::embedding(in[0], in[1]); },
                         {weight_t, idx.to(DType::i32)});
  // Composed with other ops downstream.
  Tensor single = random_f64({3, 1}, 3);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Tensor e = ops::embedding(in[0], in[1]);
        return ops::mul(e, e);
      },
      {single, indices_of({0, 2, 2, 1, 0}, {5})});
}

TEST(Embedding, ParallelBackwardMatchesSerialSum) {
  // Large enough for the OpenMP paths (N * C above the parallel grain, several column bands).
  const int64_t V = 50, C = 300, N = 200;
  Tensor weight = random_f64({V, C}, 4).set_requires_grad(true);
  Generator gen(5);
  Tensor idx = randint(0, V, {N}, DType::i64, &gen);
  Tensor grad_out = random_f64({N, C}, 6);
  Tensor out = ops::embedding(weight, idx);
  out.backward(grad_out);

  std::vector<int64_t> iv = idx.to_vector<int64_t>();
  std::vector<double> wv = weight.detach().to_vector<double>(), ov = out.to_vector<double>();
  std::vector<double> gv = grad_out.to_vector<double>(), expected(V * C, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_EQ(ov[n * C + c], wv[iv[n] * C + c]);
      expected[iv[n] * C + c] += gv[n * C + c];
    }
  std::vector<double> actual = weight.grad().to_vector<double>();
  for (int64_t i = 0; i < V * C; ++i) ASSERT_DOUBLE_EQ(actual[i], expected[i]) << "element " << i;
}

TEST(Embedding, Errors) {
  Tensor weight = zeros({5, 3});
  EXPECT_EQ(error_of([&] {
              ops::embedding(weight, indices_of({1, 7, 2}, {3}));
            }),
            "embedding: index 7 (at position 1 of the flattened indices) is out of range for a weight of 5 rows "
            "[5, 3]; indices must be in [0, 5)");
  EXPECT_EQ(error_of([&] { ops::embedding(weight, indices_of({-1}, {1}, DType::i32)); }),
            "embedding: index -1 (at position 0 of the flattened indices) is out of range for a weight of 5 rows "
            "[5, 3]; indices must be in [0, 5)");
  EXPECT_EQ(error_of([&] { ops::embedding(weight, tensor({1.0})); }),
            "embedding: indices must be int32 or int64, got float32[1] on cpu");
  EXPECT_EQ(error_of([&] { ops::embedding(zeros({5}), indices_of({1}, {1})); }),
            "embedding: weight must be [num_embeddings, embedding_dim], got [5]");
  EXPECT_EQ(error_of([&] {
              ops::embedding(zeros({5, 3}, DType::i64), indices_of({1}, {1}));
            }),
            "embedding: weight must be a floating tensor, got int64[5, 3] on cpu");
  EXPECT_EQ(error_of([&] { ops::embedding(Tensor(), indices_of({1}, {1})); }),
            "embedding: weight is an undefined tensor");
}
