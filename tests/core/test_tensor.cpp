#include <gtest/gtest.h>

#include <sstream>

#include "core/copy.h"
#include "core/random.h"
#include "core/tensor.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;

TEST(DType, SizesNamesAndPromotion) {
  EXPECT_EQ(element_size(DType::f32), 4u);
  EXPECT_EQ(element_size(DType::bf16), 2u);
  EXPECT_EQ(element_size(DType::i64), 8u);
  EXPECT_EQ(element_size(DType::boolean), 1u);
  EXPECT_STREQ(dtype_name(DType::bf16), "bfloat16");
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_dtype("BFloat16"), DType::bf16);
  EXPECT_THROW(parse_dtype("float8"), Error);
  EXPECT_EQ(promote_types(DType::f16, DType::bf16), DType::f32);
  EXPECT_EQ(promote_types(DType::f16, DType::f32), DType::f32);
  EXPECT_EQ(promote_types(DType::i64, DType::f16), DType::f16);
  EXPECT_EQ(promote_types(DType::i32, DType::i64), DType::i64);
  EXPECT_EQ(promote_types(DType::boolean, DType::u8), DType::u8);
  EXPECT_EQ(promote_types(DType::f64, DType::f32), DType::f64);
}

TEST(Device, ParsesAndPrints) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda:1"), Device::cuda(1));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_THROW(Device::parse("gpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
}

TEST(Tensor, FactoriesAndItem) {
  Tensor z = zeros({2, 3});
  EXPECT_EQ(z.shape(), Shape({2, 3}));
  EXPECT_EQ(z.strides(), Shape({3, 1}));
  EXPECT_EQ(z.numel(), 6);
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(full({2}, 3.5, DType::f64).to_vector<double>(), (std::vector<double>{3.5, 3.5}));
  EXPECT_EQ(arange(0, 5, 2).to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(arange(5, 0, -2).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, 1}));
  EXPECT_EQ(scalar_tensor(7.0).item<float>(), 7.0f);
  EXPECT_THROW(zeros({2}).item(), Error);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(empty({3}).raw_data()) % 64, 0u);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor x = arange(0, 12, 1, DType::f32).reshape({3, 4});
  Tensor t = x.t();
  EXPECT_EQ(t.storage(), x.storage());
  EXPECT_EQ(t.shape(), Shape({4, 3}));
  EXPECT_EQ(t.strides(), Shape({1, 4}));
  EXPECT_FALSE(t.is_contiguous());
  Tensor s = x.slice(1, 1, 4, 2);  // columns 1 and 3
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 3, 5, 7, 9, 11}));
  fill_(s, -1);
  EXPECT_EQ(x.to_vector<float>()[1], -1.0f) << "writing a view writes the base";
  EXPECT_EQ(x.select(0, -1).to_vector<float>(), (std::vector<float>{8, -1, 10, -1}));
  EXPECT_EQ(x.narrow(0, 1, 1).shape(), Shape({1, 4}));
  Tensor p = arange(0, 24, 1, DType::f32).reshape({2, 3, 4}).permute({2, 0, 1});
  EXPECT_EQ(p.shape(), Shape({4, 2, 3}));
  EXPECT_EQ(p.contiguous().to_vector<float>()[1], 4.0f);
  Tensor e = tensor({1, 2}).reshape({2, 1}).expand({2, 3});
  EXPECT_EQ(e.strides(), Shape({1, 0}));
  EXPECT_EQ(e.to_vector<float>(), (std::vector<float>{1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(x.unsqueeze(1).shape(), Shape({3, 1, 4}));
  EXPECT_EQ(x.unsqueeze(1).squeeze(1).shape(), Shape({3, 4}));
  EXPECT_EQ(arange(0, 24).reshape({2, 3, 4}).flatten(1).shape(), Shape({2, 12}));
}

TEST(Tensor, ReshapeCopiesOnlyWhenItMust) {
  Tensor x = zeros({4, 6});
  EXPECT_EQ(x.reshape({2, 12}).storage(), x.storage());
  EXPECT_EQ(x.reshape({-1}).shape(), Shape({24}));
  EXPECT_NE(x.t().reshape({24}).storage(), x.storage());
  EXPECT_THROW(x.t().view({24}), Error);
  EXPECT_EQ(x.slice(0, 0, 2).view({12}).storage(), x.storage());
  EXPECT_THROW(x.reshape({5, -1}), Error);
  EXPECT_THROW(x.reshape({-1, -1}), Error);
  EXPECT_EQ(scalar_tensor(1).reshape({1}).shape(), Shape({1}));
}

TEST(Tensor, DtypeConversionRounds) {
  Tensor x = tensor({1.0, 1.0 / 3, 65504, 70000}, DType::f32);
  auto h = x.to(DType::f16).to_vector<double>();
  EXPECT_EQ(h[0], 1.0);
  EXPECT_NEAR(h[1], 1.0 / 3, 1e-3);
  EXPECT_NE(h[1], static_cast<double>(1.0f / 3));
  EXPECT_EQ(h[2], 65504.0);       // largest f16
  EXPECT_TRUE(std::isinf(h[3]));  // overflow
  auto b = x.to(DType::bf16).to_vector<double>();
  EXPECT_EQ(b[3], 70144.0);  // bf16 keeps range, loses digits (8 bits of mantissa)
  EXPECT_EQ(tensor({2.7, -1.2}).to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{2, -1}));
  EXPECT_EQ(tensor({0, 2}).to(DType::boolean).to_vector<bool>(), (std::vector<bool>{false, true}));
}

TEST(Tensor, PrintsReadably) {
  std::ostringstream out;
  out << tensor({1, 2.5, 3, 4}).reshape({2, 2});
  EXPECT_EQ(out.str(), "tensor([[1.0000, 2.5000],\n        [3.0000, 4.0000]], dtype=float32)");
  std::ostringstream ints;
  ints << arange(0, 10);
  EXPECT_EQ(ints.str(), "tensor([0, 1, 2, ..., 7, 8, 9], dtype=int64)");
  EXPECT_EQ(describe(zeros({2, 3}, DType::bf16)), "bfloat16[2, 3] on cpu");
}

TEST(Tensor, ErrorsSayWhatWasWrong) {
  try {
    zeros({2, 3}).transpose(0, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "transpose: dim 2 is out of range for a tensor of 2 dims (expected a dim in [-2, 1])");
  }
  EXPECT_THROW(zeros({2}).data<double>(), Error);
  EXPECT_THROW(arange(0, 3).set_requires_grad(), Error);
  EXPECT_THROW(zeros({2, 3}).expand({4, 3}), Error);
  EXPECT_THROW(empty({2}, DType::f32, Device::cuda(0)), Error);
}

TEST(Tensor, GradientsFlowThroughViews) {
  using precis::testing::expect_gradients_match;
  using precis::testing::random_f64;
  Tensor x = random_f64({3, 4, 5}, 3);
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0].transpose(0, 2).reshape({5, 12}); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0].permute({1, 2, 0}).contiguous(); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0].slice(1, 1, 4, 2).select(2, -1); }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0].narrow(0, 1, 2).unsqueeze(0).squeeze(0); },
                         {x});
  Tensor y = random_f64({3, 1}, 4);
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0].expand({2, 3, 5}); }, {y});
  expect_gradients_match([](const std::vector<Tensor>& in) { return in[0].to(DType::f32).to(DType::f64); }, {y}, 1e-3,
                         1e-5, 1e-4);
}

TEST(Tensor, DenseLayoutsAreThoseThatFillTheirSpanOnce) {
  const Shape shape{2, 3, 4, 5};
  Tensor t = empty(shape);
  EXPECT_TRUE(is_non_overlapping_and_dense(t));
  EXPECT_TRUE(is_non_overlapping_and_dense(t.as_strided(shape, {60, 1, 15, 3}, 0)));  // channels-last
  EXPECT_TRUE(is_non_overlapping_and_dense(t.transpose(0, 3)));
  EXPECT_FALSE(is_non_overlapping_and_dense(t.slice(3, 0, 4)));                       // gaps
  EXPECT_FALSE(is_non_overlapping_and_dense(t.as_strided(shape, {60, 1, 1, 3}, 0)));  // overlaps
  EXPECT_FALSE(is_non_overlapping_and_dense(tensor({1.0}).expand({3})));
  // Size-1 dims are never stepped over, whatever their stride.
  EXPECT_TRUE(is_non_overlapping_and_dense(empty({3, 1, 4}).as_strided({3, 1, 4}, {4, 99, 1}, 0)));

  const Tensor channels_last = empty_with_layout_of(t.as_strided(shape, {60, 1, 15, 3}, 0), DType::f64);
  EXPECT_EQ(channels_last.strides(), (Shape{60, 1, 15, 3}));
  EXPECT_EQ(channels_last.dtype(), DType::f64);
  EXPECT_TRUE(empty_with_layout_of(t.slice(3, 0, 4), DType::f32).is_contiguous());
}
