// How fast the GPU AdamW runs alone at GPT-2 124M's size (issue 19): one step over its
// 124,475,904 bf16 parameters in its 148 tensors, bf16 gradients, f32 moments, stochastic
// rounding and a gradient factor, as the bf16-pure step runs it. In the traced training step
// the same launch took ~1.34 ms; alone, without the step's f32 master copy, ~0.98 ms
// (bench/NOTES.md, ninth and tenth sessions: the master's bytes were the difference). This
// times it alone on random data in four memory layouts:
//   separate   every tensor its own allocation;
//   flat       parameters and gradients views of two flat buffers at 64-byte slot boundaries
//              (nn::FlatParameters' layout in the trainer), the moments separate (AdamW's state);
//   all-flat   the moments flat too;
//   master     flat, with an f32 master copy (flat too), as the trainer's bf16-pure step;
// each back to back and after a 30 ms GPU hold (the kernel then starts on an idle memory
// system, as after the backward), printed as
//   adamw <layout> <back-to-back|after-hold> <ms> ms <TB/s> TB/s
// at ops::cost::adamw's bytes (22 an element, 28 with the master), and checks that the steps
// moved the parameters. Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include "support/gpu.h"

#if PRECIS_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/copy.h"
#include "core/cuda/runtime.h"
#include "core/cuda/timed_runs.h"
#include "core/random.h"
#include "core/tensor.h"
#include "ops/op_cost.h"
#include "optim/cuda/adamw.h"

using namespace precis;

namespace {

const Device kGpu = Device::cuda(0);

// GPT-2 124M's parameter sizes in registration order (llm.c's padded vocabulary).
std::vector<int64_t> gpt2_sizes() {
  std::vector<int64_t> sizes = {50304 * 768, 1024 * 768};
  for (int layer = 0; layer < 12; ++layer)
    for (int64_t n : {768, 768, 768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072, 3072 * 768, 768})
      sizes.push_back(n);
  sizes.push_back(768);
  sizes.push_back(768);
  return sizes;
}

enum class Layout { separate, flat, all_flat, master };

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::separate:
      return "separate";
    case Layout::flat:
      return "flat";
    case Layout::all_flat:
      return "all-flat";
    case Layout::master:
      return "master";
  }
  return "?";
}

// A [total] buffer's view for each size, each starting at a 64-byte boundary.
std::vector<Tensor> views_of_one_buffer(const std::vector<int64_t>& sizes, DType dtype) {
  const int64_t align = 64 / static_cast<int64_t>(element_size(dtype));
  int64_t total = 0;
  for (int64_t n : sizes) total += (n + align - 1) / align * align;
  Tensor buffer = zeros({total}, dtype, kGpu);
  std::vector<Tensor> views;
  int64_t offset = 0;
  for (int64_t n : sizes) {
    views.push_back(buffer.slice(0, offset, offset + n));
    offset += (n + align - 1) / align * align;
  }
  return views;
}

std::vector<Tensor> tensors_of(const std::vector<int64_t>& sizes, DType dtype, bool flat) {
  if (flat) return views_of_one_buffer(sizes, dtype);
  std::vector<Tensor> tensors;
  for (int64_t n : sizes) tensors.push_back(zeros({n}, dtype, kGpu));
  return tensors;
}

}  // namespace

TEST(AdamWTimingGpu, TimesAtGpt2Size) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<int64_t> sizes = gpt2_sizes();
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  ASSERT_EQ(total, 124475904);
  // The same random values for every layout (copied in on the GPU).
  Generator generator(7);
  const Tensor param_values = rand({total}, DType::f32, &generator, -1.0, 1.0).to(kGpu).to(DType::bf16);
  const Tensor grad_values = rand({total}, DType::f32, &generator, -0.01, 0.01).to(kGpu).to(DType::bf16);
  const optim::cuda::AdamWHyper hyper{0.9, 0.95, 1e-8, true, 1234};
  Tensor lr = full({}, 6e-4, DType::f64, kGpu), step = zeros({}, DType::i64, kGpu);
  Tensor factor = full({}, 0.5, DType::f64, kGpu), no_skip = full({}, 0.0, DType::f64, kGpu);
  optim::cuda::DeviceStepInputs inputs;
  inputs.lr = lr.data<double>();
  inputs.step = step.data<int64_t>();
  inputs.grad_factor = factor.data<double>();
  inputs.skip = no_skip.data<double>();
  const cudaStream_t stream = cuda::compute_stream(kGpu);
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  for (Layout layout : {Layout::separate, Layout::flat, Layout::all_flat, Layout::master}) {
    std::vector<optim::cuda::AdamWTensors> tensors;
    {
      const bool flat = layout != Layout::separate;
      const std::vector<Tensor> params = tensors_of(sizes, DType::bf16, flat);
      const std::vector<Tensor> grads = tensors_of(sizes, DType::bf16, flat);
      const bool flat_state = layout == Layout::all_flat || layout == Layout::master;
      const std::vector<Tensor> m = tensors_of(sizes, DType::f32, flat_state);
      const std::vector<Tensor> v = tensors_of(sizes, DType::f32, flat_state);
      const std::vector<Tensor> master =
          layout == Layout::master ? tensors_of(sizes, DType::f32, true) : std::vector<Tensor>(sizes.size());
      int64_t offset = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        const int64_t n = sizes[i];
        copy_(params[i], param_values.slice(0, offset, offset + n));
        copy_(grads[i], grad_values.slice(0, offset, offset + n));
        if (master[i].defined()) copy_(master[i], params[i]);
        offset += n;
        tensors.push_back({params[i], grads[i], m[i], v[i], master[i], Tensor(), n >= 768 * 768 ? 0.1 : 0.0, i, {}});
      }
    }
    const Tensor before = tensors[2].param.to(DType::f32).to(Device::cpu());
    auto report = [&](const char* when, float ms) {
      std::printf(
          "adamw %s %s %.3f ms %.3f TB/s\n", layout_name(layout), when, ms,
          ops::cost::adamw(total, DType::bf16, DType::bf16, layout == Layout::master).bytes / (ms * 1e-3) / 1e12);
      std::fflush(stdout);
    };
    report("back-to-back",
           cuda::fastest_run_ms(stream, 10, "adamw timing", [&] { optim::cuda::adamw_step(tensors, hyper, inputs); }));
    float after_hold = 1e30f;  // the best of 5 steps, each after 30 ms of a GPU hold
    for (int i = 0; i < 5; ++i) {
      cuda::hold_stream(stream, 30000.0, "adamw timing");
      ASSERT_EQ(cudaEventRecord(start, stream), cudaSuccess);
      optim::cuda::adamw_step(tensors, hyper, inputs);
      ASSERT_EQ(cudaEventRecord(stop, stream), cudaSuccess);
      ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
      float ms = 0;
      ASSERT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
      after_hold = std::min(after_hold, ms);
    }
    report("after-hold", after_hold);
    // The steps moved the weights (a kernel that returned early would time fast and do nothing).
    const Tensor after = tensors[2].param.to(DType::f32).to(Device::cpu());
    const float* b = before.data<float>();
    const float* a = after.data<float>();
    int64_t moved = 0;
    for (int64_t i = 0; i < before.numel(); ++i) moved += a[i] != b[i];
    EXPECT_GT(moved, before.numel() / 2) << layout_name(layout);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

#else

TEST(AdamWTimingGpu, NeedsTheCudaBackend) { GTEST_SKIP() << "this build of Precis has no CUDA backend"; }

#endif
