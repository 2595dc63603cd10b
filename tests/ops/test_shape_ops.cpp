#include <gtest/gtest.h>

#include "core/copy.h"
#include "ops/ops.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::error_of;
using precis::testing::expect_close;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

TEST(Cat, HandComputedValues) {
  Tensor a = tensor({1, 2, 3, 4, 5, 6}).reshape({2, 3});
  Tensor b = tensor({7, 8}).reshape({2, 1});
  Tensor c = tensor({9, 10, 11, 12}).reshape({2, 2});
  expect_close(ops::cat({a, b, c}, 1), tensor({1, 2, 3, 7, 9, 10, 4, 5, 6, 8, 11, 12}).reshape({2, 6}));
  expect_close(ops::cat({a, b, c}, -1), tensor({1, 2, 3, 7, 9, 10, 4, 5, 6, 8, 11, 12}).reshape({2, 6}));
  Tensor d = tensor({-1, -2, -3});
  expect_close(ops::cat({a, d.reshape({1, 3})}, 0), tensor({1, 2, 3, 4, 5, 6, -1, -2, -3}).reshape({3, 3}));
  Tensor one = ops::cat({a}, 0);
  expect_close(one, a);
  EXPECT_NE(one.storage(), a.storage()) << "cat returns a new tensor, not a view";
}

TEST(Cat, StridedInputsAndEmptyPieces) {
  Tensor a = random_f64({4, 3}, 1);
  Tensor at = a.t();  // [3, 4], not contiguous
  Tensor empty_piece = zeros({3, 0}, DType::f64);
  Tensor out = ops::cat({at, empty_piece, at}, 1);
  ASSERT_EQ(out.shape(), Shape({3, 8}));
  auto av = a.to_vector<double>(), ov = out.to_vector<double>();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) {
      EXPECT_EQ(ov[r * 8 + c], av[c * 3 + r]);
      EXPECT_EQ(ov[r * 8 + 4 + c], av[c * 3 + r]);
    }
}

TEST(Cat, IntegerTensors) {
  Tensor out = ops::cat({arange(0, 3), arange(10, 12)}, 0);
  EXPECT_EQ(out.dtype(), DType::i64);
  EXPECT_EQ(out.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 10, 11}));
}

TEST(Cat, GradientsMatchFiniteDifferences) {
  Tensor a = random_f64({3, 5, 7}, 2), b = random_f64({3, 2, 7}, 3), c = random_f64({3, 1, 7}, 4);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::cat(in, 1); }, {a, b, c});
  Tensor x = random_f64({3, 5, 7}, 5), y = random_f64({3, 5, 2}, 6);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::cat(in, -1); }, {x, y});
  Tensor p = random_f64({1, 5, 7}, 7);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::cat({in[0], in[1], in[0]}, 0); }, {a, p});
}

TEST(Cat, GradientOnlyForInputsThatRequireIt) {
  Tensor a = random_f64({2, 3}, 8).set_requires_grad(true);
  Tensor b = random_f64({4, 3}, 9);
  Tensor out = ops::cat({a, b}, 0);
  ASSERT_TRUE(out.requires_grad());
  ops::sum(ops::mul(out, out)).backward();
  expect_close(a.grad(), ops::mul(a.detach(), 2.0));
  EXPECT_FALSE(b.grad().defined());
}

TEST(Cat, Errors) {
  Tensor a = zeros({2, 3}), b = zeros({2, 4}), c = zeros({3, 3});
  EXPECT_EQ(error_of([&] {
              ops::cat({a, b}, 0);
            }),
            "cat: tensor 1 has shape [2, 4] but tensor 0 has shape [2, 3]; shapes must match in every dim except "
            "dim 0");
  EXPECT_EQ(error_of([&] {
              ops::cat({a, zeros({2, 3, 1})}, 1);
            }),
            "cat: tensor 1 has shape [2, 3, 1] but tensor 0 has shape [2, 3]; shapes must match in every dim "
            "except dim 1");
  EXPECT_NO_THROW(ops::cat({a, c}, 0));
  EXPECT_EQ(error_of([&] { ops::cat({}, 0); }), "cat: expected a non-empty list of tensors");
  EXPECT_EQ(error_of([&] {
              ops::cat({a, zeros({2, 3}, DType::f64)}, 0);
            }),
            "cat: tensor 1 is float64[2, 3] on cpu but tensor 0 is float32[2, 3] on cpu; all tensors must have "
            "one dtype (convert with .to(dtype))");
  EXPECT_EQ(error_of([&] { ops::cat({a, Tensor()}, 0); }), "cat: tensor 1 is an undefined tensor");
  EXPECT_NE(error_of([&] { ops::cat({a, a}, 2); }).find("cat: dim 2 is out of range"), std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::cat({scalar_tensor(1), scalar_tensor(2)}, 0);
            }).find("cat: zero-dim"),
            std::string::npos);
}

TEST(Stack, HandComputedValues) {
  Tensor a = tensor({1, 2, 3}), b = tensor({4, 5, 6});
  expect_close(ops::stack({a, b}, 0), tensor({1, 2, 3, 4, 5, 6}).reshape({2, 3}));
  expect_close(ops::stack({a, b}, 1), tensor({1, 4, 2, 5, 3, 6}).reshape({3, 2}));
  expect_close(ops::stack({a, b}, -1), tensor({1, 4, 2, 5, 3, 6}).reshape({3, 2}));
  Tensor s = ops::stack({scalar_tensor(7), scalar_tensor(8)}, 0);
  expect_close(s, tensor({7, 8}));
}

TEST(Stack, GradientsMatchFiniteDifferences) {
  Tensor a = random_f64({3, 5, 7}, 10), b = random_f64({3, 5, 7}, 11), c = random_f64({3, 5, 7}, 12);
  for (int64_t dim : {0, 1, 2, 3, -1}) {
    expect_gradients_match([dim](const std::vector<Tensor>& in) { return ops::stack(in, dim); }, {a, b, c});
  }
}

TEST(Stack, Errors) {
  EXPECT_EQ(error_of([&] {
              ops::stack({zeros({2, 3}), zeros({3, 2})}, 0);
            }),
            "stack: tensor 1 has shape [3, 2] but tensor 0 has shape [2, 3]; stack needs tensors of one shape");
  EXPECT_EQ(error_of([&] { ops::stack({}, 0); }), "stack: expected a non-empty list of tensors");
  EXPECT_NE(error_of([&] { ops::stack({zeros({2, 3})}, 3); }).find("stack: dim 3 is out of range"), std::string::npos);
}

TEST(Split, BySizeGivesViewsWithASmallerLastPiece) {
  Tensor x = arange(0, 14, 1, DType::f64).reshape({2, 7});
  std::vector<Tensor> pieces = ops::split(x, 3, 1);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].shape(), Shape({2, 3}));
  EXPECT_EQ(pieces[1].shape(), Shape({2, 3}));
  EXPECT_EQ(pieces[2].shape(), Shape({2, 1}));
  expect_close(pieces[0], tensor({0, 1, 2, 7, 8, 9}, DType::f64).reshape({2, 3}));
  expect_close(pieces[1], tensor({3, 4, 5, 10, 11, 12}, DType::f64).reshape({2, 3}));
  expect_close(pieces[2], tensor({6, 13}, DType::f64).reshape({2, 1}));
  for (const Tensor& p : pieces) EXPECT_EQ(p.storage(), x.storage());
  EXPECT_EQ(pieces[1].offset(), 3);
  // Writing through a view shows in the input.
  fill_(pieces[2], -1.0);
  EXPECT_EQ(x.to_vector<double>()[6], -1.0);
  EXPECT_EQ(x.to_vector<double>()[13], -1.0);

  std::vector<Tensor> rows = ops::split(x, 5, 0);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].shape(), Shape({2, 7}));
}

TEST(Split, BySizesGivesViews) {
  Tensor x = arange(0, 10, 1, DType::f64);
  std::vector<Tensor> pieces = ops::split(x, std::vector<int64_t>{2, 0, 5, 3}, 0);
  ASSERT_EQ(pieces.size(), 4u);
  expect_close(pieces[0], tensor({0, 1}, DType::f64));
  EXPECT_EQ(pieces[1].shape(), Shape({0}));
  expect_close(pieces[2], tensor({2, 3, 4, 5, 6}, DType::f64));
  expect_close(pieces[3], tensor({7, 8, 9}, DType::f64));
  for (const Tensor& p : pieces) EXPECT_EQ(p.storage(), x.storage());
}

TEST(Split, GradientsMatchFiniteDifferences) {
  Tensor x = random_f64({3, 5, 7}, 13);
  // Each piece is weighted differently so a gradient routed to the wrong piece shows.
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> p = ops::split(in[0], 3, 2);
        return ops::cat({p[2] * 3.0, p[0], p[1] * 2.0}, 2);
      },
      {x});
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> p = ops::split(in[0], std::vector<int64_t>{1, 4}, 1);
        return ops::mul(p[0], p[1]);
      },
      {x});
}

TEST(Split, Errors) {
  Tensor x = zeros({3, 5});
  EXPECT_EQ(error_of([&] {
              ops::split(x, std::vector<int64_t>{2, 2}, 1);
            }),
            "split: sizes [2, 2] sum to 4 but dim 1 of shape [3, 5] has size 5");
  EXPECT_EQ(error_of([&] {
              ops::split(x, std::vector<int64_t>{4, -1}, 0);
            }),
            "split: sizes [4, -1] contain a negative size");
  EXPECT_EQ(error_of([&] { ops::split(x, 0, 1); }),
            "split: split_size must be positive, got 0 for dim 1 of shape [3, 5]");
  EXPECT_NE(error_of([&] { ops::split(x, 2, -3); }).find("split: dim -3 is out of range"), std::string::npos);
}

TEST(Chunk, MatchesTorchChunk) {
  Tensor x = arange(0, 7, 1, DType::f64);
  std::vector<Tensor> pieces = ops::chunk(x, 3, 0);  // ceil(7/3) = 3: sizes 3, 3, 1
  ASSERT_EQ(pieces.size(), 3u);
  expect_close(pieces[0], tensor({0, 1, 2}, DType::f64));
  expect_close(pieces[1], tensor({3, 4, 5}, DType::f64));
  expect_close(pieces[2], tensor({6}, DType::f64));
  // As torch.chunk: 6 elements in 4 chunks gives 3 pieces of 2.
  EXPECT_EQ(ops::chunk(arange(0, 6), 4, 0).size(), 3u);
  // An empty dim gives `chunks` empty pieces.
  std::vector<Tensor> empties = ops::chunk(zeros({2, 0}), 3, 1);
  ASSERT_EQ(empties.size(), 3u);
  for (const Tensor& p : empties) EXPECT_EQ(p.shape(), Shape({2, 0}));
  for (const Tensor& p : pieces) EXPECT_EQ(p.storage(), x.storage());
  EXPECT_EQ(error_of([&] { ops::chunk(x, 0, 0); }), "chunk: chunks must be positive, got 0");
}

TEST(Chunk, GradientsMatchFiniteDifferences) {
  Tensor x = random_f64({3, 5, 7}, 14);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> p = ops::chunk(in[0], 2, 1);  // sizes 3 and 2
        return ops::stack({p[0].narrow(1, 0, 2) * p[1], p[1]}, 0);
      },
      {x});
}
