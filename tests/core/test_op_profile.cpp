// OpProfile and OpScope (core/op_profile.h) on the CPU: only the outermost op is
// timed, an op's backward is named after it and carries its cost once, the op
// times fit inside the step, and nothing is recorded without a profile.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "core/autograd.h"
#include "core/op_profile.h"
#include "core/random.h"
#include "ops/matmul.h"
#include "ops/nn_functional.h"
#include "ops/op_cost.h"
#include "ops/reduce.h"

using namespace precis;
namespace cost = precis::ops::cost;

namespace {

struct Totals {
  int calls = 0;
  double flops = 0, bytes = 0, ms = 0;
};

std::map<std::string, Totals> by_label(const ProfiledStep& step) {
  std::map<std::string, Totals> out;
  for (const OpSample& s : step.ops) {
    Totals& t = out[s.op + " " + op_pass_name(s.pass)];
    t.calls += 1, t.flops += s.cost.flops, t.bytes += s.cost.bytes, t.ms += s.ms;
  }
  return out;
}

}  // namespace

TEST(OpProfile, LinearIsOneOpEachWayWithTheCostModelsFigures) {
  Generator gen(1);
  Tensor x = randn({6, 8}, DType::f32, &gen).set_requires_grad();
  Tensor w = randn({5, 8}, DType::f32, &gen).set_requires_grad();
  Tensor b = randn({5}, DType::f32, &gen).set_requires_grad();
  OpProfile profile(Device::cpu());
  profile.begin_step();
  Tensor loss = ops::sum(ops::linear(x, w, b));
  loss.backward();
  profile.end_step();
  ASSERT_EQ(profile.steps().size(), 1u);
  std::map<std::string, Totals> ops = by_label(profile.steps()[0]);
  // On the CPU linear is a matmul and an add: one forward row, not three.
  EXPECT_EQ(ops.count("matmul fwd"), 0u);
  EXPECT_EQ(ops.count("add fwd"), 0u);
  ASSERT_EQ(ops["linear fwd"].calls, 1);
  const OpWork expected = cost::linear(6, 5, 8, true, false, DType::f32);
  EXPECT_DOUBLE_EQ(ops["linear fwd"].flops, expected.forward.flops);
  EXPECT_DOUBLE_EQ(ops["linear fwd"].flops, 2.0 * 6 * 5 * 8 + 6 * 5);
  EXPECT_DOUBLE_EQ(ops["linear fwd"].bytes, expected.forward.bytes);
  // Its nodes' backwards are linear's, the backward cost counted once over them.
  ASSERT_GE(ops["linear bwd"].calls, 1);
  EXPECT_DOUBLE_EQ(ops["linear bwd"].flops, expected.backward.flops);
  EXPECT_DOUBLE_EQ(ops["sum fwd"].flops, 0);  // no cost model given: timed, not costed
  // The ops fit in the step they ran in.
  double op_ms = 0;
  for (const OpSample& s : profile.steps()[0].ops) {
    EXPECT_GE(s.ms, 0);
    op_ms += s.ms;
  }
  EXPECT_LE(op_ms, profile.steps()[0].ms);
}

TEST(OpProfile, MatmulFlopsAreTwoMnkForBatchedProducts) {
  Generator gen(2);
  Tensor a = randn({3, 7, 9}, DType::f32, &gen), b = randn({9, 4}, DType::f32, &gen);
  OpProfile profile(Device::cpu());
  profile.begin_step();
  ops::matmul(a, b);
  profile.end_step();
  std::map<std::string, Totals> ops = by_label(profile.steps()[0]);
  ASSERT_EQ(ops["matmul fwd"].calls, 1);
  EXPECT_DOUBLE_EQ(ops["matmul fwd"].flops, 2.0 * 3 * 7 * 4 * 9);
}

TEST(OpProfile, AnOpTakesItsTimeAndNothingIsRecordedOutsideAStep) {
  Generator gen(3);
  Tensor a = randn({64, 64}, DType::f32, &gen);
  OpProfile profile(Device::cpu());
  ops::matmul(a, a);  // not recording
  EXPECT_TRUE(profile.steps().empty());
  profile.begin_step();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // outside ops
  ops::softmax(a, -1);
  profile.end_step();
  const ProfiledStep& step = profile.steps()[0];
  ASSERT_EQ(step.ops.size(), 1u);
  EXPECT_EQ(step.ops[0].op, "softmax");
  EXPECT_GE(step.ms, 20.0);
  EXPECT_LT(step.ops[0].ms, step.ms - 19.0);
  EXPECT_DOUBLE_EQ(step.ops[0].cost.flops, cost::softmax(64, 64, DType::f32).forward.flops);
  // A second step while one records on this thread is a mistake.
  profile.begin_step();
  OpProfile other(Device::cpu());
  EXPECT_THROW(other.begin_step(), Error);
  profile.end_step();
}
