#include <gtest/gtest.h>

#include "core/copy.h"
#include "core/random.h"
#include "nn/flat_parameters.h"
#include "nn/linear.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "optim/adamw.h"

using namespace precis;

namespace {
class TwoLayer : public nn::Module {
 public:
  TwoLayer() : nn::Module("TwoLayer") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(3, 5));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(5, 2, nn::LinearOptions{.bias = false}));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(fc1->forward(x)); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

std::vector<float> bf16_rounded(const std::vector<float>& values) {
  std::vector<float> out;
  for (float v : values) out.push_back(static_cast<float>(bfloat16(v)));
  return out;
}
}  // namespace

TEST(FlatParametersDtype, ConvertsToViewsOfOneBf16BufferWithAnF32GradientBuffer) {
  TwoLayer model;
  std::map<std::string, std::vector<float>> original;
  for (const auto& p : model.named_parameters()) original[p.name] = p.tensor.to_vector<float>();
  auto flat = nn::flatten_parameters(model, Device::cpu(), DType::bf16);
  ASSERT_EQ(flat->buffers().size(), 1u);
  const nn::FlatBuffer& buffer = flat->buffers()[0];
  EXPECT_EQ(buffer.dtype, DType::bf16);
  EXPECT_EQ(buffer.data.dtype(), DType::bf16);
  EXPECT_EQ(buffer.grad.dtype(), DType::f32);
  EXPECT_EQ(buffer.grad.numel(), buffer.data.numel());
  ASSERT_EQ(buffer.slots.size(), 3u);
  for (const nn::FlatSlot& slot : buffer.slots) {
    const Tensor& p = slot.param;
    EXPECT_EQ(p.dtype(), DType::bf16) << slot.name;
    EXPECT_EQ(p.storage(), buffer.data.storage()) << slot.name;
    EXPECT_EQ(p.offset(), slot.offset) << slot.name;
    EXPECT_EQ(slot.offset % 32, 0) << slot.name;  // 64 bytes of bf16
    EXPECT_TRUE(p.is_contiguous()) << slot.name;
    EXPECT_EQ(p.to_vector<float>(), bf16_rounded(original[slot.name])) << slot.name;
    ASSERT_TRUE(p.grad().defined()) << slot.name;
    EXPECT_EQ(p.grad().dtype(), DType::f32) << slot.name;
    EXPECT_EQ(p.grad().storage(), buffer.grad.storage()) << slot.name;
    EXPECT_EQ(p.grad().offset(), slot.offset) << slot.name;
  }
  // The module's own handles share the TensorImpl, so they see the conversion.
  EXPECT_EQ(model.fc1->weight.dtype(), DType::bf16);
  EXPECT_TRUE(model.fc1->weight.same(buffer.slots[0].param));
  EXPECT_EQ(model.fc1->forward(ones({1, 3}, DType::bf16)).dtype(), DType::bf16);
}

TEST(FlatParametersDtype, BackwardAccumulatesBf16GradientsInF32) {
  nn::Linear layer(3, 2);
  auto flat = nn::flatten_parameters(layer, Device::cpu(), DType::bf16);
  // loss = sum(x W^T + b): dL/db = rows of x, dL/dW[j, k] = sum_i x[i, k].
  Tensor x = tensor({1, 2, 3, -1, 0, 4, 2, 2, 2, 0, 1, 0, 1, 1, 1, 3, 0, 0, 0, 0, 1}, DType::bf16).view({7, 3});
  const int backwards = 43;  // bias gradient 7 * 43 = 301: above 256, where bf16 holds only even integers
  for (int t = 0; t < backwards; ++t) ops::sum(ops::cast(layer.forward(x), DType::f32)).backward();
  EXPECT_EQ(layer.bias.grad().to_vector<float>(), std::vector<float>(2, 301.0f));
  std::vector<float> column_sums = {6 * 43.0f, 6 * 43.0f, 11 * 43.0f};
  std::vector<float> w_grad = layer.weight.grad().to_vector<float>();
  for (int j = 0; j < 2; ++j)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(w_grad[j * 3 + k], column_sums[k]) << j << ", " << k;
  // They are the flat buffer's: zeroing the buffer zeroes them.
  flat->zero_grad();
  EXPECT_EQ(layer.bias.grad().to_vector<float>(), std::vector<float>(2, 0.0f));

  // AdamW takes the f32 gradients and keeps an f32 master of the bf16 parameters.
  ops::sum(ops::cast(layer.forward(x), DType::f32)).backward();
  optim::AdamW opt({{layer.parameters(), 0.0}}, {.lr = 1e-3});
  std::vector<float> before = layer.weight.to_vector<float>();
  opt.step();
  std::vector<float> master = opt.master(0).to_vector<float>();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_NEAR(master[i], before[i] - 1e-3f, 1e-6) << i;
  EXPECT_EQ(layer.weight.to_vector<float>(), bf16_rounded(master));
}

TEST(FlatParametersDtype, GradientBufferDtypeFollowsTheParameterDtype) {
  EXPECT_EQ(nn::flat_grad_dtype(DType::bf16), DType::f32);
  EXPECT_EQ(nn::flat_grad_dtype(DType::f16), DType::f32);
  EXPECT_EQ(nn::flat_grad_dtype(DType::f32), DType::f32);
  EXPECT_EQ(nn::flat_grad_dtype(DType::f64), DType::f64);
  TwoLayer f64_model;
  auto flat = nn::flatten_parameters(f64_model, Device::cpu(), DType::f64);
  ASSERT_EQ(flat->buffers().size(), 1u);
  EXPECT_EQ(flat->buffers()[0].grad.dtype(), DType::f64);
  EXPECT_EQ(f64_model.fc2->weight.dtype(), DType::f64);
  TwoLayer kept;
  auto same = nn::flatten_parameters(kept);
  EXPECT_EQ(same->buffers()[0].dtype, DType::f32);
  EXPECT_EQ(same->buffers()[0].grad.dtype(), DType::f32);
}

TEST(FlatParametersDtype, NonFloatingParamDtypeIsAnError) {
  TwoLayer model;
  try {
    nn::flatten_parameters(model, Device::cpu(), DType::i32);
    FAIL() << "flattened to int32";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("param_dtype must be a floating dtype, got int32"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(model.fc1->weight.dtype(), DType::f32);  // untouched
}
