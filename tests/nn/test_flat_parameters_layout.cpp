// Parameters laid out channels-last (nn::to_channels_last) keep their layout in the flat
// buffers: the parameter and its .grad view with the same strides, numel elements of the
// buffer in the parameter's memory order, the values unchanged; row-major parameters are
// flattened as before; a backward fills the channels-last .grad with the row-major model's
// gradient values.
#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/copy.h"
#include "nn/conv.h"
#include "nn/flat_parameters.h"
#include "nn/linear.h"
#include "ops/autocast.h"
#include "ops/memory_format.h"
#include "ops/ops.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_error;
using precis::testing::random_f64;

namespace {

// A 3x3 conv over 3 channels, a 1x1 conv (its height and width of 1 make both layouts one
// memory order) and a conv over 1 channel, then a linear layer: 4-D and 2-D parameters.
class ConvNet : public nn::Module {
 public:
  ConvNet() : nn::Module("ConvNet") {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(3, 4, nn::Conv2dOptions{.padding = 1}));
    pointwise = register_module("pointwise", std::make_shared<nn::Conv2d>(4, 2, nn::Conv2dOptions{.kernel = 1}));
    gray = register_module("gray", std::make_shared<nn::Conv2d>(1, 3, nn::Conv2dOptions{.bias = false}));
    fc = register_module("fc", std::make_shared<nn::Linear>(2 * 5 * 5, 3));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = ops::relu(pointwise->forward(ops::relu(conv->forward(x))));
    return fc->forward(y.reshape({y.size(0), -1}));
  }
  std::shared_ptr<nn::Conv2d> conv, pointwise, gray;
  std::shared_ptr<nn::Linear> fc;
};

Shape channels_last_strides(const Shape& shape) {
  return ops::empty_in(shape, ops::MemoryFormat::channels_last, DType::f32, Device::cpu()).strides();
}

}  // namespace

TEST(FlatParametersLayout, ToChannelsLastLaysOutEvery4DParameterWithTheSameValues) {
  ConvNet model;
  std::map<std::string, std::vector<float>> before;
  for (const auto& p : model.named_parameters()) before[p.name] = p.tensor.to_vector<float>();
  nn::to_channels_last(model);
  for (const auto& p : model.named_parameters()) {
    EXPECT_EQ(p.tensor.to_vector<float>(), before[p.name]) << p.name;
    if (p.tensor.dim() == 4) {
      EXPECT_EQ(p.tensor.strides(), channels_last_strides(p.tensor.shape())) << p.name;
      EXPECT_EQ(p.tensor.offset(), 0) << p.name;
    } else {
      EXPECT_TRUE(p.tensor.is_contiguous()) << p.name;
    }
  }
  EXPECT_EQ(model.conv->weight.strides(), (Shape{27, 1, 9, 3})) << "[4, 3, 3, 3] stored K, R, S, C";
  EXPECT_TRUE(model.conv->weight.same(model.named_parameters()[0].tensor)) << "the module's handle sees the layout";
}

TEST(FlatParametersLayout, AChannelsLastParameterKeepsItsStridesInItsSlot) {
  ConvNet row_major, channels_last;
  nn::to_channels_last(channels_last);
  std::map<std::string, std::vector<float>> before;
  for (const auto& p : channels_last.named_parameters()) before[p.name] = p.tensor.to_vector<float>();
  auto flat_rm = nn::flatten_parameters(row_major);
  auto flat_cl = nn::flatten_parameters(channels_last);
  ASSERT_EQ(flat_cl->buffers().size(), 1u);
  const nn::FlatBuffer &rm = flat_rm->buffers()[0], &cl = flat_cl->buffers()[0];
  EXPECT_EQ(cl.data.numel(), rm.data.numel()) << "each slot is numel elements in either layout";
  ASSERT_EQ(cl.slots.size(), rm.slots.size());
  for (size_t i = 0; i < cl.slots.size(); ++i) {
    const nn::FlatSlot &s = cl.slots[i], &r = rm.slots[i];
    const Tensor& p = s.param;
    EXPECT_EQ(s.offset, r.offset) << s.name;
    EXPECT_EQ(s.numel, p.numel()) << s.name;
    // The row-major model's slots as before flattening kept any layout: row-major views.
    EXPECT_EQ(r.param.strides(), contiguous_strides(r.param.shape())) << r.name;
    EXPECT_EQ(r.param.grad().strides(), contiguous_strides(r.param.shape())) << r.name;
    const Shape expected = p.dim() == 4 ? channels_last_strides(p.shape()) : contiguous_strides(p.shape());
    EXPECT_EQ(p.strides(), expected) << s.name;
    EXPECT_EQ(p.storage(), cl.data.storage()) << s.name;
    EXPECT_EQ(p.offset(), s.offset) << s.name;
    EXPECT_EQ(p.to_vector<float>(), before[s.name]) << s.name;
    const Tensor g = p.grad();
    ASSERT_TRUE(g.defined()) << s.name;
    EXPECT_EQ(g.storage(), cl.grad.storage()) << s.name;
    EXPECT_EQ(g.offset(), s.offset) << s.name;
    EXPECT_EQ(g.strides(), p.strides()) << s.name;
  }
  // conv.weight [4, 3, 3, 3]: element (k, c, r, s) at k*27 + r*9 + s*3 + c of its slot.
  const nn::FlatSlot& conv = cl.slots[0];
  ASSERT_EQ(conv.name, "conv.weight");
  const std::vector<float> logical = conv.param.to_vector<float>();
  const std::vector<float> memory = cl.data.slice(0, conv.offset, conv.offset + conv.numel).to_vector<float>();
  for (int64_t k = 0; k < 4; ++k)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t s = 0; s < 3; ++s)
          ASSERT_EQ(memory[k * 27 + r * 9 + s * 3 + c], logical[k * 27 + c * 9 + r * 3 + s]) << k << c << r << s;
}

// The backward writes the gradients' values, in the parameter's layout, into the flat .grad.
TEST(FlatParametersLayout, BackwardFillsChannelsLastGradientsWithTheSameValues) {
  ConvNet row_major, channels_last;
  channels_last.load_state_dict(row_major.state_dict());
  nn::to_channels_last(channels_last);
  auto flat_rm = nn::flatten_parameters(row_major);
  auto flat_cl = nn::flatten_parameters(channels_last);
  const Tensor x = ops::to_memory_format(random_f64({2, 3, 5, 5}, 7).to(DType::f32), ops::MemoryFormat::channels_last);
  for (int pass = 0; pass < 2; ++pass) {  // written over stale gradients, then added to them
    if (pass == 0) flat_rm->zero_grad_lazily(), flat_cl->zero_grad_lazily();
    ops::sum(row_major.forward(x)).backward();
    ops::sum(channels_last.forward(x)).backward();
  }
  const auto rm = row_major.named_parameters(), cl = channels_last.named_parameters();
  for (size_t i = 0; i < rm.size(); ++i) {
    if (rm[i].name == "gray.weight") {
      EXPECT_EQ(cl[i].tensor.grad().to_vector<float>(), std::vector<float>(27, 0.0f)) << "unused: stays zero";
      continue;
    }
    EXPECT_EQ(cl[i].tensor.grad().to_vector<float>(), rm[i].tensor.grad().to_vector<float>()) << rm[i].name;
    EXPECT_EQ(cl[i].tensor.grad().strides(), cl[i].tensor.strides()) << rm[i].name;
  }
}

TEST(FlatParametersLayout, ToChannelsLastAfterFlatteningIsAnError) {
  ConvNet model;
  auto flat = nn::flatten_parameters(model);
  expect_error([&] { nn::to_channels_last(model); },
               "to_channels_last: parameter conv.weight has a gradient already (a flat buffer's, or a backward's); "
               "lay the weights out channels-last before flatten_parameters");
}

// A leaf's first gradient, where no flat buffer gives it one, takes the leaf's layout.
TEST(FlatParametersLayout, AFreshGradientTakesTheLeafsLayout) {
  Tensor w = ops::to_memory_format(random_f64({4, 3, 3, 3}, 3).to(DType::f32), ops::MemoryFormat::channels_last);
  w.set_requires_grad();
  ops::sum(ops::conv2d(random_f64({1, 3, 5, 5}, 4).to(DType::f32), w, Tensor())).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().strides(), w.strides());
}

// What the GPU's conv2d does with a channels-last network's weights (ops/conv.cpp), checked
// here where it needs no GPU: the precached bf16 cast of each weight is already dense in the
// channels-last format the convolution asks for (dense_in gives it back, no copy), and the
// weight gradient cuDNN writes (empty_in, channels-last) has its .grad's layout, so copying or
// adding it into .grad is one flat pass (same_dense_layout: core/cuda/copy.cu's flat kernel).
TEST(FlatParametersLayout, TheConvolutionsFindTheirWeightAndGradientLayoutsReady) {
  ConvNet model;
  nn::to_channels_last(model);
  auto flat = nn::flatten_parameters(model);
  const nn::FlatBuffer& b = flat->buffers()[0];
  std::vector<Tensor> leaves;
  for (const nn::FlatSlot& s : b.slots) leaves.push_back(s.param);
  ops::autocast::clear_cache();
  ops::autocast::precache(b.data, leaves, DType::bf16);
  ops::autocast::Scope scope(DType::bf16);
  for (const nn::FlatSlot& s : b.slots) {
    if (s.param.dim() != 4) continue;
    const Tensor cast = ops::autocast::to_compute(s.param);
    EXPECT_TRUE(ops::dense_in(cast, ops::MemoryFormat::channels_last, DType::bf16).same(cast)) << s.name;
    const Tensor dw = ops::empty_in(s.param.shape(), ops::MemoryFormat::channels_last, DType::bf16, Device::cpu());
    EXPECT_TRUE(same_dense_layout(dw, s.param.grad())) << s.name;
  }
  ops::autocast::clear_cache();
}
