// A residual block's downsample on the device's side stream (models::set_shortcut_stream,
// core/cuda/side_stream.h), its forward only and its forward and backward, against the same on
// the compute stream: the same kernels on another stream, recorded in the same order for
// autograd and run in the same order by it, so the same bits.
//  - A tiny ResNet-18 (CIFAR stem, 8x8 images: three downsampling blocks) trained 6 steps by the
//    Trainer in fp32 and under bf16 autocast, NCHW and channels-last, eagerly and with its step
//    captured in a CUDA graph and replayed (the capture ends with the side stream joined, or
//    fails), off, forward, forward_and_backward and off again: losses, gradient norms, the final
//    parameters and batch-norm statistics (the downsample's updated on the side stream) equal
//    bit for bit. Twice more with the weight gradients on the side stream too
//    (ops::set_conv_wgrad_stream). Where cuDNN's engines are not deterministic (the two runs on
//    the compute stream differ), the side-stream runs are held to the loss tolerance of the
//    CPU/GPU training test instead, and the test says so.
//  - One BasicBlock whose side stream is held at a gate during its forward (and, with
//    forward_and_backward, during its backward): the compute stream waits for it before the add
//    (and before conv1's backward adds into the shortcut's gradient of x): it is still busy while
//    the gate is shut; and the output, the input's and the parameters' gradients and the running
//    statistics equal the compute stream's bits, with an input unlike the one before (a block
//    left over from that one would show).
// Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "core/autograd.h"
#include "core/copy.h"
#include "models/resnet.h"
#include "nn/flat_parameters.h"
#include "ops/conv.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gradcheck.h"
#include "support/tiny_run.h"
#include "train/config.h"
#include "train/trainer.h"

#if PRECIS_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/runtime.h"
#include "core/cuda/side_stream.h"
#include "support/side_stream_gate.h"
#endif

using namespace precis;
namespace fs = std::filesystem;

#if PRECIS_WITH_CUDA

namespace {

using precis::testing::TrainedRun;

const Device kGpu = Device::cuda(0);

using models::ShortcutStream;

using precis::testing::SideStreamGate;

// Sets the switches for a scope and restores the previous settings however a test ends.
struct SideStreamSettings {
  SideStreamSettings(ShortcutStream shortcut, bool wgrad)
      : previous_shortcut(models::shortcut_stream()), previous_wgrad(ops::conv_wgrad_stream()) {
    models::set_shortcut_stream(shortcut);
    ops::set_conv_wgrad_stream(wgrad);
  }
  ~SideStreamSettings() {
    models::set_shortcut_stream(previous_shortcut);
    ops::set_conv_wgrad_stream(previous_wgrad);
  }
  ShortcutStream previous_shortcut;
  bool previous_wgrad;
};

const char* name_of(ShortcutStream where) {
  switch (where) {
    case ShortcutStream::off:
      return "off";
    case ShortcutStream::forward:
      return "forward";
    case ShortcutStream::forward_and_backward:
      return "forward_and_backward";
  }
  return "?";
}

struct Case {
  std::string precision;
  bool channels_last, graphs;
  bool wgrad = false;  // the weight gradients on the side stream too (in the switch-on run)
};

std::string name_of(const Case& c) {
  return c.precision + (c.channels_last ? "_ChannelsLast" : "_Nchw") + (c.graphs ? "_Graphs" : "_Eager") +
         (c.wgrad ? "_AndWgradStream" : "");
}
void PrintTo(const Case& c, std::ostream* out) { *out << name_of(c); }

TrainedRun train(const Case& c, ShortcutStream where) {
  const bool side = where != ShortcutStream::off;
  SideStreamSettings settings(where, side && c.wgrad);
  return precis::testing::train_tiny_resnet(
      fs::temp_directory_path() / ("precis_shortcut_stream_" + name_of(c) + "_" + name_of(where)),
      {"device=cuda", "precision=" + c.precision, std::string("channels_last=") + (c.channels_last ? "true" : "false"),
       std::string("cuda_graphs=") + (c.graphs ? "true" : "false"), "optimizer.grad_clip=1.0", "max_steps=6"});
}

class ShortcutStreamTraining : public ::testing::TestWithParam<Case> {};

TEST_P(ShortcutStreamTraining, SameBitsAsOnTheComputeStream) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const TrainedRun off = train(c, ShortcutStream::off);
  std::map<ShortcutStream, TrainedRun> ons;
  for (ShortcutStream where : {ShortcutStream::forward, ShortcutStream::forward_and_backward})
    ons[where] = train(c, where);
  const TrainedRun off_again = train(c, ShortcutStream::off);
  ASSERT_EQ(off.losses.size(), 6u);
  const bool deterministic = precis::testing::runs_agree(off, off_again);
  for (const auto& [where, on] : ons) {
    SCOPED_TRACE(name_of(where));
    precis::testing::expect_trained_as(on, off, deterministic, c.graphs);
  }
}

INSTANTIATE_TEST_SUITE_P(PrecisionLayoutGraphs, ShortcutStreamTraining,
                         ::testing::Values(Case{"fp32", false, false}, Case{"fp32", false, true},
                                           Case{"fp32", true, false}, Case{"fp32", true, true},
                                           Case{"bf16", false, false}, Case{"bf16", false, true},
                                           Case{"bf16", true, false}, Case{"bf16", true, true},
                                           Case{"fp32", false, false, true}, Case{"bf16", true, true, true}),
                         [](const ::testing::TestParamInfo<Case>& info) { return name_of(info.param); });

struct BlockRun {
  std::vector<float> y, x_grad;
  std::map<std::string, std::vector<double>> grads, state;
};

TEST(ShortcutStreamGpu, TheComputeStreamWaitsForTheGatedSideStream) {
  PRECIS_SKIP_WITHOUT_GPU();
  // 64 -> 128 channels at stride 2: a downsampling block, as layer2.0 of a ResNet-18.
  const Shape image{8, 64, 16, 16};
  const Tensor x1 = precis::testing::random_f64(image, 1).to(DType::f32).to(kGpu);
  const Tensor x2 = precis::testing::random_f64(image, 2).to(DType::f32).to(kGpu);
  const Tensor gy = precis::testing::random_f64({8, 128, 8, 8}, 3).to(DType::f32).to(kGpu);
  models::BasicBlock reference_block(64, 128, 2);
  const std::map<std::string, Tensor> initial = reference_block.state_dict();

  auto run = [&](ShortcutStream where) {
    const bool side = where != ShortcutStream::off;
    models::BasicBlock block(64, 128, 2);
    block.load_state_dict(initial);
    auto flat = nn::flatten_parameters(block, kGpu);
    auto forward_backward = [&](const Tensor& x_values, bool gated) {
      Tensor x = x_values.clone();
      x.set_requires_grad();
      Tensor y;
      {
        SideStreamSettings settings(where, false);
        std::unique_ptr<SideStreamGate> gate = gated ? std::make_unique<SideStreamGate>(kGpu) : nullptr;
        y = block.forward(x);
        if (gated) {
          // The add waits for the shortcut, which waits at the gate (the main branch does not).
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          EXPECT_EQ(cudaStreamQuery(cuda::compute_stream(kGpu)), cudaErrorNotReady)
              << "the compute stream ran past the add while the side stream was held";
          cudaGetLastError();
          gate->open();
          EXPECT_FALSE(gate->timed_out()) << "the forward waited for the held side stream";
        }
      }
      {
        // The shortcut's backward on the side stream, held: the main branch's conv1 adds its
        // gradient of x into the shortcut's, so it waits for the side stream.
        const bool gated_backward = gated && where == ShortcutStream::forward_and_backward;
        std::unique_ptr<SideStreamGate> gate = gated_backward ? std::make_unique<SideStreamGate>(kGpu) : nullptr;
        y.backward(gy);
        if (gated_backward) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          EXPECT_EQ(cudaStreamQuery(cuda::compute_stream(kGpu)), cudaErrorNotReady)
              << "the compute stream finished the backward while the side stream was held";
          cudaGetLastError();
          gate->open();
          EXPECT_FALSE(gate->timed_out()) << "the backward waited for the held side stream";
        }
      }
      return std::make_pair(y, x.grad());
    };
    forward_backward(x1, false);  // chooses cuDNN's plans and fills the cache: nothing syncs at the gate
    auto [y, x_grad] = forward_backward(x2, side);
    BlockRun out;
    out.y = y.to(Device::cpu()).to_vector<float>();
    out.x_grad = x_grad.to(Device::cpu()).to_vector<float>();
    for (const auto& p : block.named_parameters())
      out.grads[p.name] = p.tensor.grad().to(Device::cpu()).to(DType::f64).to_vector<double>();
    for (const auto& [name, tensor] : block.state_dict())
      out.state[name] = tensor.to(Device::cpu()).to(DType::f64).to_vector<double>();
    return out;
  };
  const BlockRun off = run(ShortcutStream::off);
  std::map<ShortcutStream, BlockRun> ons;
  for (ShortcutStream where : {ShortcutStream::forward, ShortcutStream::forward_and_backward}) ons[where] = run(where);
  const BlockRun off_again = run(ShortcutStream::off);
  const bool deterministic = off.x_grad == off_again.x_grad && off.grads == off_again.grads;
  if (!deterministic) {
    std::cout << "note: two backwards on the compute stream differ (cuDNN engines that are not deterministic); "
                 "the side-stream runs' input gradients are compared to 1e-5 of their largest value\n";
  }
  for (const auto& [where, on] : ons) {
    SCOPED_TRACE(name_of(where));
    EXPECT_EQ(on.y, off.y) << "the block's output";
    for (const auto& [name, values] : off.state) EXPECT_EQ(on.state.at(name), values) << name;
    if (deterministic) {
      EXPECT_EQ(on.x_grad, off.x_grad);
      for (const auto& [name, values] : off.grads) EXPECT_EQ(on.grads.at(name), values) << name;
    } else {
      float magnitude = 0;
      for (float v : off.x_grad) magnitude = std::max(magnitude, std::abs(v));
      ASSERT_EQ(on.x_grad.size(), off.x_grad.size());
      for (size_t i = 0; i < off.x_grad.size(); ++i)
        ASSERT_NEAR(on.x_grad[i], off.x_grad[i], 1e-5f * magnitude) << "input gradient element " << i;
    }
  }
}

}  // namespace

#endif  // PRECIS_WITH_CUDA
