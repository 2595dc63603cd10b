// conv2d's weight gradient on the device's side stream (ops::set_conv_wgrad_stream,
// core/cuda/side_stream.h) against the same on the compute stream: the same kernels on another
// stream, so the same bits.
//  - A tiny ResNet-18 (CIFAR stem, 8x8 images: residual blocks, strided downsamples) trained 6
//    steps by the Trainer in fp32 and under bf16 autocast, NCHW and channels-last, eagerly and
//    with its step captured in a CUDA graph and replayed: losses, gradient norms, the final
//    parameters and batch-norm statistics equal bit for bit. Two micro-batches a step (the
//    second adds into .grad on the side stream) and gradient clipping (reads every .grad after
//    the backward). Where cuDNN's engines are not deterministic (two runs on the compute stream
//    differ), the side-stream run is held to the loss tolerance of the CPU/GPU training test
//    instead, and the test says so.
//  - One convolution whose weight is also used by another op and carries a grad-ready hook: the
//    engine joins the side stream before adding the other use's gradient and before the hook,
//    which sees the final value; a stale .grad is written over, a held one added to.
//  - A convolution whose side stream is held at a gate: once the backward has dropped its saved
//    input and its output gradient, their blocks are not handed out again (record_stream) while
//    the side stream may still read them.
// Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/conv.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gradcheck.h"
#include "support/tiny_run.h"
#include "train/config.h"
#include "train/trainer.h"

#if PRECIS_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/side_stream.h"
#include "support/side_stream_gate.h"
#endif

using namespace precis;
namespace fs = std::filesystem;

#if PRECIS_WITH_CUDA

namespace {

using precis::testing::TrainedRun;

const Device kGpu = Device::cuda(0);

using precis::testing::SideStreamGate;

// Sets the switch for a scope and restores the previous setting however a test ends.
struct WgradStreamSetting {
  explicit WgradStreamSetting(bool on) : previous(ops::conv_wgrad_stream()) { ops::set_conv_wgrad_stream(on); }
  ~WgradStreamSetting() { ops::set_conv_wgrad_stream(previous); }
  bool previous;
};

struct Case {
  std::string precision;
  bool channels_last, graphs;
};

std::string name_of(const Case& c) {
  return c.precision + (c.channels_last ? "_ChannelsLast" : "_Nchw") + (c.graphs ? "_Graphs" : "_Eager");
}
void PrintTo(const Case& c, std::ostream* out) { *out << name_of(c); }

TrainedRun train(const Case& c, bool side) {
  WgradStreamSetting setting(side);
  return precis::testing::train_tiny_resnet(
      fs::temp_directory_path() / ("precis_wgrad_stream_" + name_of(c) + (side ? "_side" : "")),
      {"device=cuda", "precision=" + c.precision, std::string("channels_last=") + (c.channels_last ? "true" : "false"),
       std::string("cuda_graphs=") + (c.graphs ? "true" : "false"), "optimizer.grad_clip=1.0", "max_steps=6"});
}

class WgradStreamTraining : public ::testing::TestWithParam<Case> {};

TEST_P(WgradStreamTraining, SameBitsAsOnTheComputeStream) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const TrainedRun off = train(c, false), on = train(c, true), off_again = train(c, false);
  ASSERT_EQ(off.losses.size(), 6u);
  precis::testing::expect_trained_as(on, off, precis::testing::runs_agree(off, off_again), c.graphs);
}

INSTANTIATE_TEST_SUITE_P(PrecisionLayoutGraphs, WgradStreamTraining,
                         ::testing::Values(Case{"fp32", false, false}, Case{"fp32", false, true},
                                           Case{"fp32", true, false}, Case{"fp32", true, true},
                                           Case{"bf16", false, false}, Case{"bf16", false, true},
                                           Case{"bf16", true, false}, Case{"bf16", true, true}),
                         [](const ::testing::TestParamInfo<Case>& info) { return name_of(info.param); });

Tensor random_on_gpu(const Shape& shape, uint64_t seed) {
  return precis::testing::random_f64(shape, seed).to(DType::f32).to(kGpu);
}

// A weight leaf with a stale .grad, as zero_grad_lazily leaves a flat buffer's.
Tensor weight_leaf(const Tensor& values) {
  Tensor w = values.clone();
  w.set_requires_grad();
  w.set_grad(full(values.shape(), std::nan(""), DType::f32, kGpu));
  w.impl()->grad_is_stale = true;
  return w;
}

TEST(WgradStreamGpu, AnotherUseAndAHookWaitForTheSideStream) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Tensor x = random_on_gpu({4, 8, 16, 16}, 1), w0 = random_on_gpu({16, 8, 3, 3}, 2);
  std::map<bool, std::vector<std::vector<float>>> grads, hooked;  // per setting, per backward
  for (bool side : {false, true}) {
    WgradStreamSetting setting(side);
    Tensor w = weight_leaf(w0);
    int calls = 0;
    w.impl()->grad_ready_hooks.push_back([&](const Tensor& grad) {
      ++calls;
      hooked[side].push_back(grad.to(Device::cpu()).to_vector<float>());
    });
    const ops::Conv2dOptions options{{1, 1}, {1, 1}, {1, 1}, 1};
    // The weight used by the convolution and by a product: its AccumulateGrad adds the
    // product's gradient to the one written on the side stream, then fires the hook.
    Tensor y = ops::conv2d(x, w, Tensor(), options);
    ops::add(ops::sum(ops::mul(y, y)), ops::sum(ops::mul(w, w))).backward();
    EXPECT_EQ(calls, 1);
    grads[side].push_back(w.grad().to(Device::cpu()).to_vector<float>());
    // A second backward adds into the held .grad, on the side stream.
    ops::sum(ops::mul(ops::conv2d(x, w, Tensor(), options), y.detach())).backward();
    EXPECT_EQ(calls, 2);
    grads[side].push_back(w.grad().to(Device::cpu()).to_vector<float>());
    for (float v : grads[side].back()) ASSERT_FALSE(std::isnan(v)) << "a stale .grad was not written over";
  }
  EXPECT_EQ(grads[true], grads[false]);
  EXPECT_EQ(hooked[true], grads[true]) << "the hook saw the final gradient";
}

TEST(WgradStreamGpu, SavedTensorsAreNotReusedWhileTheSideStreamMayReadThem) {
  PRECIS_SKIP_WITHOUT_GPU();
  // 12 MiB each: blocks of their own segment, so a reuse would hand out the very address.
  const Shape image{4, 12, 256, 256};
  const Tensor x0 = random_on_gpu(image, 3), w0 = random_on_gpu({12, 12, 3, 3}, 4);
  const ops::Conv2dOptions options{{1, 1}, {1, 1}, {1, 1}, 1};
  auto weight_grad = [&](bool side, bool gated) {
    WgradStreamSetting setting(side);
    Tensor w = weight_leaf(w0);
    Tensor gy = random_on_gpu(image, 5);
    const void* gy_block = gy.raw_data();
    Tensor x = ops::mul(x0, 1.0);  // a block of the compute stream's, freed when the backward drops it
    const void* x_block = x.raw_data();
    Tensor y = ops::conv2d(x, w, Tensor(), options);
    x = Tensor();
    std::vector<Tensor> taken;
    if (gated) {
      // Cached blocks for the requests below: none may need cudaMalloc while the GPU waits at the gate.
      std::vector<Tensor> cache;
      for (int i = 0; i < 8; ++i) cache.push_back(empty(image, DType::f32, kGpu));
    }
    {
      std::unique_ptr<SideStreamGate> gate = gated ? std::make_unique<SideStreamGate>(kGpu) : nullptr;
      y.backward(gy);
      y = Tensor();
      gy = Tensor();
      if (gated) {
        EXPECT_FALSE(gate->timed_out()) << "the backward waited on the host for the shut side stream";
        for (int i = 0; i < 4; ++i) {
          taken.push_back(empty(image, DType::f32, kGpu));
          EXPECT_NE(taken.back().raw_data(), x_block) << "x's block handed out while the side stream may read it";
          EXPECT_NE(taken.back().raw_data(), gy_block) << "dy's block handed out while the side stream may read it";
        }
      }
    }
    return w.grad().to(Device::cpu()).to_vector<float>();
  };
  const std::vector<float> reference = weight_grad(false, false);
  weight_grad(true, false);  // chooses cuDNN's plans (timing runs wait for the side stream)
  // f32 weight-gradient engines may sum with atomics (nondeterministic order): seen on an H100,
  // differences of ~1e-7 relative. A block overwritten while the side stream read it would
  // make whole values wrong, far past that.
  const std::vector<float> gated = weight_grad(true, true);
  ASSERT_EQ(gated.size(), reference.size());
  float magnitude = 0;
  for (float v : reference) magnitude = std::max(magnitude, std::abs(v));
  for (size_t i = 0; i < reference.size(); ++i)
    ASSERT_NEAR(gated[i], reference[i], 1e-5f * magnitude) << "weight gradient element " << i;
}

}  // namespace

#endif  // PRECIS_WITH_CUDA
