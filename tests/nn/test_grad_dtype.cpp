// A 16-bit flat gradient buffer (precision.grad_dtype) on the CPU: flatten_parameters with a
// gradient dtype makes the buffer of it and every .grad a view of it; the gradients in it are
// each add rounded once (grad_dtype_cases.h).
#include "grad_dtype_cases.h"

using namespace precis;

namespace grad_dtype_cases {
INSTANTIATE_TEST_SUITE_P(Cpu, GradDtype, ::testing::Values(Device::cpu()), precis::testing::device_name);
}  // namespace grad_dtype_cases

TEST(FlatGradDtype, Bf16GradientsAreBf16ViewsOfOneBf16Buffer) {
  grad_dtype_cases::TiedTableModel model(10, 12, 1);
  auto flat = nn::flatten_parameters(model, Device::cpu(), DType::bf16, /*shards=*/2, DType::bf16);
  ASSERT_EQ(flat->buffers().size(), 1u);
  const nn::FlatBuffer& buffer = flat->buffers()[0];
  EXPECT_EQ(buffer.data.dtype(), DType::bf16);
  EXPECT_EQ(buffer.grad.dtype(), DType::bf16);
  EXPECT_EQ(buffer.grad.numel(), buffer.data.numel());
  EXPECT_EQ(buffer.grad.numel() % (2 * 32), 0) << "two shards of whole 64-byte pieces";
  ASSERT_EQ(buffer.slots.size(), 7u);  // wte, the layer norm's two, the MLP's four
  for (const nn::FlatSlot& slot : buffer.slots) {
    const Tensor grad = slot.param.grad();
    ASSERT_TRUE(grad.defined()) << slot.name;
    EXPECT_EQ(grad.dtype(), DType::bf16) << slot.name;
    EXPECT_EQ(grad.storage(), buffer.grad.storage()) << slot.name;
    EXPECT_EQ(grad.offset(), slot.offset) << slot.name;
    EXPECT_EQ(grad.shape(), slot.param.shape()) << slot.name;
    EXPECT_EQ(slot.offset % 32, 0) << slot.name;
  }
  // f16 parameters take f16 gradients the same way; f32 parameters keep f32 whatever is asked.
  grad_dtype_cases::TiedTableModel half_model(10, 12, 1), f32_model(10, 12, 1);
  EXPECT_EQ(nn::flatten_parameters(half_model, Device::cpu(), DType::f16, 1, DType::f16)->buffers()[0].grad.dtype(),
            DType::f16);
  EXPECT_EQ(nn::flatten_parameters(f32_model, Device::cpu(), std::nullopt, 1, DType::bf16)->buffers()[0].grad.dtype(),
            DType::f32);
}

TEST(FlatGradDtype, TheRuleAndItsErrors) {
  EXPECT_EQ(nn::flat_grad_dtype(DType::bf16, DType::bf16), DType::bf16);
  EXPECT_EQ(nn::flat_grad_dtype(DType::bf16, DType::f32), DType::f32);
  EXPECT_EQ(nn::flat_grad_dtype(DType::f16, DType::f16), DType::f16);
  EXPECT_EQ(nn::flat_grad_dtype(DType::f32, DType::bf16), DType::f32);
  EXPECT_EQ(nn::flat_grad_dtype(DType::f64, DType::bf16), DType::f64);
  EXPECT_EQ(nn::flat_alignment_elements(DType::bf16, DType::bf16), 32);
  EXPECT_EQ(nn::flat_alignment_elements(DType::bf16, DType::f32), 32);
  EXPECT_EQ(nn::flat_alignment_elements(DType::f32, DType::f32), 16);
  try {
    nn::flat_grad_dtype(DType::bf16, DType::f16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "the gradients of bfloat16 parameters (precision.grad_dtype) must be float32 or bfloat16, got float16");
  }
}
