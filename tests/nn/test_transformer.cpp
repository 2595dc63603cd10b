// The transformer block with c_proj's biases left to the norms that add its branches
// (nn::Branch, ops::add_layer_norm's residual_bias) against the same block computed with the
// biases inside the products (attn->forward, mlp->forward, then add and layer_norm): the same
// outputs and gradients, in f64; and with dropout after c_proj the bias stays in the product.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/random.h"
#include "nn/transformer.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::random_f64;

namespace {

nn::TransformerConfig config(double dropout) {
  nn::TransformerConfig c;
  c.n_embd = 16;
  c.n_head = 2;
  c.dropout = dropout;
  c.attention = "reference";
  return c;
}

// Every parameter rebound to an f64 copy with random values (biases non-zero, gains near 1).
void make_f64(nn::Module& model, uint64_t seed) {
  NoGradGuard no_grad;
  for (const auto& [name, p] : model.named_parameters()) {
    const bool gain = name.find("ln_") != std::string::npos && name.ends_with(".weight");
    Tensor values = random_f64(p.shape(), seed++, gain ? 0.6 : -0.6, gain ? 1.4 : 0.6);
    TensorImpl* impl = p.impl();
    impl->storage = values.storage();
    impl->dtype = DType::f64;
    impl->strides = values.strides();
    impl->offset = values.offset();
  }
}

// Two blocks and a final norm, as GPT-2's: fused, through Residual (branches and biases
// pending), or the reference, every branch added to the stream with its bias inside the product.
Tensor two_blocks(nn::Block& first, nn::Block& second, const nn::LayerNorm& final_norm, const Tensor& x, bool fused) {
  if (fused) {
    nn::Residual r = first.forward(nn::Residual{x, Tensor(), Tensor()});
    r = second.forward(r);
    const ops::AddLayerNorm out = ops::add_layer_norm(r.stream, r.branch, final_norm.weight, final_norm.bias,
                                                      final_norm.eps, std::nullopt, r.branch_bias);
    return out.normed * 0.5 + out.sum;
  }
  Tensor h = x;
  for (nn::Block* block : {&first, &second}) {
    h = h + block->attn->forward(ops::layer_norm(h, block->ln_1->weight, block->ln_1->bias, block->ln_1->eps));
    h = h + block->mlp->forward(ops::layer_norm(h, block->ln_2->weight, block->ln_2->bias, block->ln_2->eps));
  }
  return ops::layer_norm(h, final_norm.weight, final_norm.bias, final_norm.eps) * 0.5 + h;
}

struct Model {
  Model(double dropout, Generator* gen)
      : first(config(dropout), gen), second(config(dropout), gen), final_norm(16, true) {
    make_f64(first, 10);
    make_f64(second, 50);
    make_f64(final_norm, 90);
  }
  std::vector<nn::NamedTensor> parameters() const {
    std::vector<nn::NamedTensor> all;
    for (const nn::Module* m : {static_cast<const nn::Module*>(&first), static_cast<const nn::Module*>(&second),
                                static_cast<const nn::Module*>(&final_norm)})
      for (const auto& p : m->named_parameters()) all.push_back(p);
    return all;
  }
  nn::Block first, second;
  nn::LayerNorm final_norm;
};

// The output and the gradients of the input and every parameter, for a weighted sum of the output.
std::vector<Tensor> output_and_grads(Model& model, const Tensor& x_value, bool fused) {
  for (auto p : model.parameters()) p.tensor.zero_grad();
  Tensor x = x_value.detach().set_requires_grad();
  Tensor y = two_blocks(model.first, model.second, model.final_norm, x, fused);
  ops::sum(y * random_f64(y.shape(), 7)).backward();
  std::vector<Tensor> result = {y.detach(), x.grad()};
  for (const auto& p : model.parameters()) result.push_back(p.tensor.grad());
  return result;
}

}  // namespace

TEST(Transformer, BiasLeftToTheNormGivesTheSameOutputsAndGradients) {
  Model model(0.0, nullptr);
  const Tensor x = random_f64({2, 5, 16}, 3, -1, 1);
  const std::vector<Tensor> fused = output_and_grads(model, x, true), reference = output_and_grads(model, x, false);
  const std::vector<nn::NamedTensor> params = model.parameters();
  ASSERT_EQ(fused.size(), reference.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    const std::string what = i == 0 ? "output" : i == 1 ? "input gradient" : params[i - 2].name + " gradient";
    SCOPED_TRACE(what);
    ASSERT_TRUE(fused[i].defined());
    expect_close(fused[i], reference[i], 1e-12, 1e-10);
  }
  // The fused path did leave the mlp's bias pending (no dropout), c_proj's own tensor.
  const nn::Residual pending = model.first.forward(nn::Residual{x, Tensor(), Tensor()});
  ASSERT_TRUE(pending.branch_bias.defined());
  EXPECT_EQ(pending.branch_bias.impl(), model.first.mlp->c_proj->bias.impl());
  // The biases stay c_proj's parameters: the names of HF's GPT-2 checkpoints.
  const std::vector<nn::NamedTensor> first = model.first.named_parameters();
  std::vector<std::string> names;
  for (const auto& p : first) names.push_back(p.name);
  EXPECT_NE(std::find(names.begin(), names.end(), "attn.c_proj.bias"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "mlp.c_proj.bias"), names.end());

  // Block::forward(Tensor), through Residual::value(), is the reference block too.
  const Tensor one = model.first.forward(x);
  Tensor h = x + model.first.attn->forward(ops::layer_norm(x, model.first.ln_1->weight, model.first.ln_1->bias));
  h = h + model.first.mlp->forward(ops::layer_norm(h, model.first.ln_2->weight, model.first.ln_2->bias));
  expect_close(one, h, 1e-12, 1e-10);
}

TEST(Transformer, BranchesLeaveTheirBiasOnlyWhereNoDropoutFollows) {
  Generator gen(5);
  nn::Block block(config(0.25), &gen);
  make_f64(block, 20);
  const Tensor x = random_f64({2, 3, 16}, 4, -1, 1);
  // Training with dropout: dropout(z + b) is not dropout(z) + b, so the bias stays in the product.
  EXPECT_FALSE(block.attn->forward_branch(x).bias.defined());
  EXPECT_FALSE(block.mlp->forward_branch(x).bias.defined());
  // The same masks (the generator restarted) give the unfused block's values.
  gen.manual_seed(5);
  const Tensor fused = block.forward(x);
  gen.manual_seed(5);
  Tensor h = x + block.attn->forward(ops::layer_norm(x, block.ln_1->weight, block.ln_1->bias));
  h = h + block.mlp->forward(ops::layer_norm(h, block.ln_2->weight, block.ln_2->bias));
  expect_close(fused, h, 0, 0);
  // In eval mode dropout passes everything: the bias is left to the norm.
  block.eval();
  const nn::Branch a = block.attn->forward_branch(x), m = block.mlp->forward_branch(x);
  ASSERT_TRUE(a.bias.defined());
  ASSERT_TRUE(m.bias.defined());
  EXPECT_EQ(a.bias.impl(), block.attn->c_proj->bias.impl());
  EXPECT_EQ(m.bias.impl(), block.mlp->c_proj->bias.impl());
  expect_close(a.value + a.bias, block.attn->forward(x), 1e-12, 1e-12);
  expect_close(m.value + m.bias, block.mlp->forward(x), 1e-12, 1e-12);
}

TEST(Transformer, NoBiasLeavesNothingPending) {
  nn::TransformerConfig c = config(0.0);
  c.bias = false;
  nn::Block block(c);
  const Tensor x = random_f64({1, 4, 16}, 6, -1, 1).to(DType::f32);
  const nn::Residual r = block.forward(nn::Residual{x, Tensor(), Tensor()});
  EXPECT_TRUE(r.branch.defined());
  EXPECT_FALSE(r.branch_bias.defined());
}

TEST(Transformer, FlashAttentionTakesOverTheQkvBiasGradientWithTheSameValues) {
  // attention: flash on the CPU (f64) runs the packed attention, which makes c_attn's bias
  // gradient in its own backward (c_attn's product adds the bias detached): every gradient
  // as with the reference attention, c_attn's bias gradient included, and accumulated over
  // two backward passes as a micro-step would.
  auto grads_of = [](const std::string& attention) {
    nn::TransformerConfig c = config(0.0);
    c.attention = attention;
    nn::CausalSelfAttention attn(c);
    make_f64(attn, 20);
    std::vector<Tensor> grads;
    for (uint64_t pass = 0; pass < 2; ++pass) {
      Tensor x = random_f64({2, 9, 16}, 30 + pass, -1, 1).set_requires_grad();
      Tensor y = attn.forward(x);
      ops::sum(y * random_f64(y.shape(), 40 + pass)).backward();
      grads.push_back(x.grad());
    }
    for (const auto& p : attn.named_parameters()) grads.push_back(p.tensor.grad());
    return grads;
  };
  const std::vector<Tensor> flash = grads_of("flash"), reference = grads_of("reference");
  ASSERT_EQ(flash.size(), reference.size());
  for (size_t i = 0; i < flash.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(flash[i].defined());
    expect_close(flash[i], reference[i], 1e-12, 1e-10);
  }
}
