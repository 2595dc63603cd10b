// ZeRO-1's gather_overlap gate (distributed/zero.h, nn/parameter_gate.h) orders the forward
// after the gathers it needs. One process plays rank 0 of 2 with a group whose all_gather
// stays in flight until waited for: launching one writes NaN over the other rank's chunk,
// and its wait writes the true values there. So a module that read a parameter before its
// bucket was waited for would make the output NaN: a GPT-2 and a ResNet forward under the
// gate give exactly the output of their whole parameters, while the same forward without
// the gate gives NaN (the test can fail). The gathers launch in forward order and are
// waited for as the forward reaches them, not all at its start.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/copy.h"
#include "distributed/reducer.h"
#include "distributed/zero.h"
#include "models/gpt2.h"
#include "models/image_classifier.h"
#include "nn/parameter_gate.h"
#include "nn/transformer.h"

using namespace precis;

namespace {

// Rank 0 of 2 whose all_gathers land on wait(): the other rank's chunk is NaN until then, and
// `truth`'s values (the flat buffers as they were made) after. Only all_gather is used here.
class DeferredGatherGroup final : public distributed::ProcessGroup {
 public:
  explicit DeferredGatherGroup(const nn::FlatParameters& flat) {
    for (const nn::FlatBuffer& buffer : flat.buffers()) buffers_.push_back({buffer.data, buffer.data.clone()});
  }
  std::vector<int64_t> launched, waited;  // the gathers' offsets in their buffer, in order

  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  Device device() const override { return Device::cpu(); }
  std::string backend_name() const override { return "deferred"; }
  std::shared_ptr<distributed::Work> all_gather(const Tensor& out, const Tensor& in, distributed::Launch) override {
    for (const auto& [data, truth] : buffers_) {
      const int64_t offset = out.data<float>() - data.data<float>();
      if (offset < 0 || offset >= data.numel()) continue;
      launched.push_back(offset);
      const Tensor other = out.slice(0, in.numel(), out.numel());
      fill_(other, std::numeric_limits<double>::quiet_NaN());
      return std::make_shared<Landing>(other, truth.slice(0, offset + in.numel(), offset + out.numel()), offset,
                                       waited);
    }
    ADD_FAILURE() << "an all_gather outside the flat buffers";
    return std::make_shared<distributed::CompletedWork>();
  }
  std::shared_ptr<distributed::Work> all_reduce(const Tensor&, distributed::ReduceOp, Profiler*,
                                                distributed::Launch) override {
    return unused("all_reduce");
  }
  std::shared_ptr<distributed::Work> broadcast(const Tensor&, int) override { return unused("broadcast"); }
  std::shared_ptr<distributed::Work> reduce_scatter(const Tensor&, const Tensor&, distributed::ReduceOp, Profiler*,
                                                    distributed::Launch) override {
    return unused("reduce_scatter");
  }
  void barrier() override {}

 private:
  class Landing final : public distributed::Work {
   public:
    Landing(Tensor dst, Tensor src, int64_t offset, std::vector<int64_t>& log)
        : dst_(std::move(dst)), src_(std::move(src)), offset_(offset), log_(log) {}
    void wait() override {
      if (done_) return;
      done_ = true;
      copy_(dst_, src_);
      log_.push_back(offset_);
    }

   private:
    Tensor dst_, src_;
    int64_t offset_;
    std::vector<int64_t>& log_;
    bool done_ = false;
  };
  static std::shared_ptr<distributed::Work> unused(const char* what) {
    ADD_FAILURE() << what << " is not part of this test";
    return std::make_shared<distributed::CompletedWork>();
  }
  std::vector<std::pair<Tensor, Tensor>> buffers_;  // {a flat buffer's data, its true values}
};

bool all_finite(const Tensor& t) {
  for (double v : t.to(DType::f64).to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

// `forward()` of a model (its flat buffers `flat`, in f32, in buckets of about `bucket_bytes`) three ways after a
// gather is launched: under the gate (the output of the whole parameters, bit for bit), without it (NaN), and after
// complete_gather (whole again). Returns how many buckets were still in flight when the first
// module of type `late_type` was gated (the forward did not wait for everything at its start).
template <typename Forward>
size_t expect_the_gate_orders(const std::shared_ptr<nn::FlatParameters>& flat, int64_t bucket_bytes,
                              const std::string& late_type, Forward forward) {
  NoGradGuard no_grad;
  const Tensor whole = forward();
  EXPECT_TRUE(all_finite(whole));
  const std::vector<float> expected = whole.template to_vector<float>();
  auto group = std::make_shared<DeferredGatherGroup>(*flat);
  distributed::ReducerOptions options;
  options.bucket_sizes = {bucket_bytes, bucket_bytes};
  options.shard = true;
  distributed::Reducer reducer(flat, group, options);
  distributed::Zero1 zero(flat, group, reducer);
  const size_t gathers = reducer.buckets().size();
  EXPECT_GE(gathers, 4u) << "the test needs several buckets";

  zero.launch_gather();
  // Forward order: the reducer's buckets run from the buffer's end back, so their offsets rise.
  EXPECT_EQ(group->launched.size(), gathers);
  for (size_t i = 1; i < group->launched.size(); ++i) EXPECT_LT(group->launched[i - 1], group->launched[i]);
  size_t in_flight_at_late = 0;
  bool seen_late = false;
  {
    nn::ParameterGateScope gate([&](const nn::Module& module) {
      if (!seen_late && module.type_name() == late_type) {
        seen_late = true;
        in_flight_at_late = gathers - group->waited.size();
      }
      zero.wait_for(module);
    });
    EXPECT_EQ(forward().template to_vector<float>(), expected) << "under the gate";
  }
  EXPECT_TRUE(seen_late) << late_type << " never gated";
  EXPECT_EQ(group->waited, group->launched) << "waited for in the order the forward reached them";

  zero.launch_gather();
  EXPECT_FALSE(all_finite(forward())) << "without the gate the forward reads the NaN of gathers in flight";
  zero.complete_gather();
  EXPECT_EQ(forward().template to_vector<float>(), expected) << "after complete_gather";
  EXPECT_FALSE(zero.gather_pending());
  return in_flight_at_late;
}

}  // namespace

TEST(ParameterGate, GptForwardWaitsForEachBlocksBuckets) {
  models::GPT2Config config;
  config.vocab_size = 64;
  config.block_size = 16;
  config.n_layer = 3;
  config.n_head = 2;
  config.n_embd = 32;
  config.attention = "reference";
  models::GPT2 model(config, 7);
  auto flat = nn::flatten_parameters(model, Device::cpu(), std::nullopt, /*shards=*/2);
  std::vector<int32_t> tokens(2 * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 5) % 64);
  const Tensor idx = from_vector<int32_t>(tokens, {2, 16});
  // The logits: the head reads wte (tied) again after the blocks and ln_f.
  const size_t in_flight = expect_the_gate_orders(flat, 8 << 10, "Block", [&] { return model.forward(idx).logits; });
  EXPECT_GT(in_flight, 0u) << "the first block was gated with every gather already waited for";
}

TEST(ParameterGate, ResNetForwardWaitsForEachBlocksBuckets) {
  const auto model = models::make_image_model({"resnet18", 3, 10, /*cifar_stem=*/true}, 3);
  auto flat = nn::flatten_parameters(*model, Device::cpu(), std::nullopt, /*shards=*/2);
  std::vector<float> pixels(2 * 3 * 8 * 8);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>((i * 13) % 17) / 17.0f - 0.5f;
  const Tensor images = from_vector<float>(pixels, {2, 3, 8, 8});
  const size_t in_flight = expect_the_gate_orders(flat, 4 << 20, "BasicBlock", [&] { return model->forward(images); });
  EXPECT_GT(in_flight, 0u) << "the first block was gated with every gather already waited for";
}
