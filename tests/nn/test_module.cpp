#include <gtest/gtest.h>

#include "core/copy.h"
#include "nn/containers.h"
#include "nn/flat_parameters.h"
#include "nn/linear.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;

namespace {
class TwoLayer : public nn::Module {
 public:
  TwoLayer() : nn::Module("TwoLayer") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(3, 4));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(4, 2, nn::LinearOptions{.bias = false}));
    register_buffer("steps", zeros({1}));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(fc1->forward(x)); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};
}  // namespace

TEST(Module, DottedNamesInRegistrationOrder) {
  TwoLayer m;
  std::vector<std::string> names;
  for (auto& p : m.named_parameters()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight"}));
  EXPECT_EQ(m.num_parameters(), 3 * 4 + 4 + 4 * 2);
  EXPECT_TRUE(m.decays("fc1.weight"));
  EXPECT_FALSE(m.decays("fc1.bias"));
  auto state = m.state_dict();
  EXPECT_EQ(state.size(), 4u);
  EXPECT_TRUE(state.count("steps"));
}

TEST(Module, TrainEvalPropagates) {
  TwoLayer m;
  m.eval();
  EXPECT_FALSE(m.fc1->is_training());
  m.train();
  EXPECT_TRUE(m.fc2->is_training());
}

TEST(Module, StateDictRoundTripGivesSameOutputs) {
  TwoLayer a, b;
  Tensor x = rand({5, 3});
  b.load_state_dict(a.state_dict());
  expect_close(b.forward(x), a.forward(x), 0, 0);
}

TEST(Module, LoadStateDictErrorsNameTheProblem) {
  TwoLayer m;
  auto state = m.state_dict();
  state["fc1.weight"] = zeros({5, 3});
  try {
    m.load_state_dict(state);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc1.weight (checkpoint [5, 3], model [4, 3])"), std::string::npos)
        << e.what();
  }
  state = m.state_dict();
  state.erase("fc2.weight");
  state["extra"] = zeros({1});
  try {
    m.load_state_dict(state);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing from the state: fc2.weight"), std::string::npos) << e.what();
  }
  state = m.state_dict();
  state["extra"] = zeros({1});
  EXPECT_THROW(m.load_state_dict(state), Error);
  m.load_state_dict(state, /*strict=*/false);
}

TEST(Module, LinearMatchesHandComputation) {
  nn::Linear fc(2, 3);
  copy_(fc.weight, tensor({1, 2, 3, 4, 5, 6}).reshape({3, 2}));
  copy_(fc.bias, tensor({0.5, -0.5, 1}));
  expect_close(fc.forward(tensor({1, -1}).reshape({1, 2})), tensor({-0.5, -1.5, 0}).reshape({1, 3}));
  EXPECT_THROW(fc.forward(zeros({2, 3})), Error);
}

TEST(FlatParameters, ParametersBecomeViewsOfOneBuffer) {
  TwoLayer m;
  auto before = m.state_dict();
  std::map<std::string, std::vector<float>> values;
  for (auto& [name, t] : before) values[name] = t.to_vector<float>();
  auto flat = nn::flatten_parameters(m);
  ASSERT_EQ(flat->buffers().size(), 1u);
  const auto& buffer = flat->buffers()[0];
  for (const auto& slot : buffer.slots) {
    EXPECT_EQ(slot.param.storage(), buffer.data.storage()) << slot.name;
    EXPECT_EQ(slot.offset % 16, 0) << "64-byte alignment for f32";
    EXPECT_EQ(slot.param.to_vector<float>(), values[slot.name]) << "values survive flattening";
    EXPECT_EQ(slot.param.grad().storage(), buffer.grad.storage());
  }
  // Backward writes straight into the flat gradient buffer.
  Tensor x = rand({4, 3});
  ops::sum(m.forward(x)).backward();
  double flat_sum = 0;
  for (double v : buffer.grad.to_vector<double>()) flat_sum += std::abs(v);
  EXPECT_GT(flat_sum, 0);
  EXPECT_EQ(m.fc2->weight.grad().storage(), buffer.grad.storage());
  // A reference gradient from an un-flattened copy.
  TwoLayer ref;
  ref.load_state_dict(m.state_dict());
  ops::sum(ref.forward(x)).backward();
  expect_close(m.fc1->weight.grad(), ref.fc1->weight.grad(), 1e-6, 1e-5);
  flat->zero_grad();
  for (double v : buffer.grad.to_vector<double>()) EXPECT_EQ(v, 0.0);
}

TEST(FlatParameters, LazyZeroGradWritesTheFirstGradientAndSettlesTheRest) {
  TwoLayer m;
  auto flat = nn::flatten_parameters(m);
  Tensor x = rand({4, 3}), y = rand({5, 3});
  // The reference: an un-flattened copy, gradients summed from zero over two backwards.
  TwoLayer ref;
  ref.load_state_dict(m.state_dict());
  for (int pass = 0; pass < 2; ++pass) ops::sum(ref.forward(x)).backward();
  ops::sum(ref.fc1->forward(y)).backward();  // fc1 only

  // Last step's gradients in the buffer: lazily zeroed, they must not show through.
  fill_(flat->buffers()[0].grad, 7.0);
  flat->zero_grad_lazily();
  for (int pass = 0; pass < 2; ++pass) ops::sum(m.forward(x)).backward();
  ops::sum(m.fc1->forward(y)).backward();
  flat->settle_grads();
  expect_close(m.fc1->weight.grad(), ref.fc1->weight.grad(), 1e-6, 1e-5);
  expect_close(m.fc1->bias.grad(), ref.fc1->bias.grad(), 1e-6, 1e-5);
  expect_close(m.fc2->weight.grad(), ref.fc2->weight.grad(), 1e-6, 1e-5);

  // A parameter no backward reached reads zero after settle_grads.
  fill_(flat->buffers()[0].grad, 7.0);
  flat->zero_grad_lazily();
  ops::sum(m.fc1->forward(y)).backward();
  flat->settle_grads();
  for (double v : m.fc2->weight.grad().to_vector<double>()) EXPECT_EQ(v, 0.0);
  TwoLayer only_fc1;
  only_fc1.load_state_dict(m.state_dict());
  ops::sum(only_fc1.fc1->forward(y)).backward();
  expect_close(m.fc1->weight.grad(), only_fc1.fc1->weight.grad(), 0, 0);
}
