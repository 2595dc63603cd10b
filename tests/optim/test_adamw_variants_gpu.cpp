// The GPU AdamW's update kernels (optim/cuda/adamw.h's AdamWKernel, the A/B of issue 19:
// old, wide, wide_plain, wide_grid, pipe) against each other: every kernel must leave the same
// bits in the parameters and both moments as the old one, over several steps of
//  - bf16 parameters, bf16 gradients, f32 moments, stochastic rounding (GPT-2's), with sizes
//    1, 3, 4, 4097, 8193 and 100003 (tails shorter than a thread's 4 or 8 elements, blocks
//    past the first), views 1 and 4 elements into a larger buffer (not 16-byte aligned: the
//    wide kernels go element by element there, the old one too or 4 at a time), and one of
//    12000003 (more chunks than an H100 holds blocks at once: wide_grid's blocks loop);
//  - the same with a gradient factor (clip_grad_norm's) and with the scaled gradients rounded to
//    f32, a skipped step in the middle (nothing may change), and weight decay on some tensors;
//  - bf16 parameters with f32 gradients and nearest rounding, f32/f32, f16/f16, f64/f64;
//  - master weights (each kernel choice must then run the old kernel: the same bits, trivially).
// The reference is the old kernel's output (itself checked against the CPU in
// test_optimizers_gpu.cpp), so the comparison is exact: memcmp of the bytes.
// TimesAtGpt2Size prints each kernel's time for one step of GPT-2 124M's 124,475,904 bf16
// parameters in its 148 tensors (cudaEvents, best of 20 after 3 warm-ups) as
//   adamw <kernel> <ms> ms <TB/s> TB/s
// at 22 bytes an element (param 2 + grad 2 + m 4 + v 4 read, param 2 + m 4 + v 4 written).
// Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/copy.h"
#include "core/gpu.h"
#include "support/gpu.h"
#include "support/gradcheck.h"
#if PRECIS_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/runtime.h"
#include "optim/cuda/adamw.h"
#endif

using namespace precis;
using precis::testing::random_f64;

#if PRECIS_WITH_CUDA
namespace {

using optim::cuda::AdamWKernel;

const Device kGpu = Device::cuda(0);

const char* kernel_name(AdamWKernel k) {
  switch (k) {
    case AdamWKernel::old:
      return "old";
    case AdamWKernel::wide:
      return "wide";
    case AdamWKernel::wide_plain:
      return "wide_plain";
    case AdamWKernel::wide_grid:
      return "wide_grid";
    default:
      return "pipe";
  }
}

// Sets the kernel for a scope and restores the process's choice after it.
struct KernelScope {
  explicit KernelScope(AdamWKernel k) : was(optim::cuda::adamw_update_kernel()) {
    optim::cuda::set_adamw_update_kernel(k);
  }
  ~KernelScope() { optim::cuda::set_adamw_update_kernel(was); }
  AdamWKernel was;
};

// One parameter's arrays on the GPU: each `offset` elements into a buffer of its dtype (a
// view, so the array's address is offset * element size past the allocator's alignment).
struct Param {
  Tensor param, grad, m, v, master;
  double weight_decay = 0;
  int64_t offset = 0;
};

// A new GPU copy of `values` (host or GPU), `offset` elements into its buffer.
Tensor on_gpu(const Tensor& values, int64_t offset) {
  if (offset == 0) return values.is_cuda() ? values.clone() : values.to(kGpu);
  const int64_t n = values.numel();
  Tensor buffer = zeros({n + offset}, values.dtype(), kGpu);
  Tensor view = buffer.narrow(0, offset, n);
  copy_(view, values.is_cuda() ? values : values.to(kGpu));
  return view;
}

struct Case {
  DType param, grad;
  bool master = false, stochastic = false;
  std::vector<int64_t> sizes;
  std::vector<int64_t> offsets;  // per size (0 where absent)
};

std::vector<Param> make_params(const Case& c, uint64_t seed) {
  std::vector<Param> params;
  const DType moment = c.param == DType::f64 ? DType::f64 : DType::f32;
  for (size_t k = 0; k < c.sizes.size(); ++k) {
    const int64_t n = c.sizes[k];
    const int64_t offset = k < c.offsets.size() ? c.offsets[k] : 0;
    Param p;
    p.param = on_gpu(random_f64({n}, seed + 10 * k, -1, 1).to(c.param), offset);
    p.grad = on_gpu(random_f64({n}, seed + 10 * k + 1, -2, 2).to(c.grad), offset);
    p.m = on_gpu(random_f64({n}, seed + 10 * k + 2, -0.1, 0.1).to(moment), offset);
    p.v = on_gpu(random_f64({n}, seed + 10 * k + 3, 0, 0.01).to(moment), offset);
    if (c.master) p.master = on_gpu(p.param.to(DType::f32).to(Device::cpu()), offset);
    p.weight_decay = k % 2 == 0 ? 0.1 : 0.0;
    p.offset = offset;
    params.push_back(p);
  }
  return params;
}

// The arrays a step changes, copied to the host.
struct Result {
  std::vector<Tensor> arrays;
};

// Steps clones of `initial` with kernel `k`: step 1 plain, step 2 with the factor, step 3
// skipped, step 4 with the factor again (and the gradients rounded to f32 when `in_f32`).
Result run(AdamWKernel k, const std::vector<Param>& initial, const Case& c, double factor, bool in_f32) {
  KernelScope scope(k);
  std::vector<Param> params;
  for (const Param& p : initial) {
    Param q = p;  // the gradient is shared: no step writes it
    q.param = on_gpu(p.param, p.offset);
    q.m = on_gpu(p.m, p.offset);
    q.v = on_gpu(p.v, p.offset);
    if (p.master.defined()) q.master = on_gpu(p.master, p.offset);
    params.push_back(q);
  }
  std::vector<optim::cuda::AdamWTensors> tensors;
  for (size_t i = 0; i < params.size(); ++i)
    tensors.push_back({params[i].param, params[i].grad, params[i].m, params[i].v, params[i].master,
                       params[i].weight_decay, 3 * i + 1});
  const optim::cuda::AdamWHyper hyper{0.9, 0.95, 1e-8, c.stochastic, 1234};
  Tensor lr = full({}, 0.01, DType::f64, kGpu), step = zeros({}, DType::i64, kGpu);
  Tensor grad_factor = full({}, factor, DType::f64, kGpu);
  Tensor no_skip = full({}, 0.0, DType::f64, kGpu), skip = full({}, 1.0, DType::f64, kGpu);
  for (int s = 1; s <= 4; ++s) {
    optim::cuda::DeviceStepInputs inputs;
    inputs.lr = lr.data<double>();
    inputs.step = step.data<int64_t>();
    inputs.grad_factor = s % 2 == 0 ? grad_factor.data<double>() : nullptr;
    inputs.skip = s == 3 ? skip.data<double>() : no_skip.data<double>();
    inputs.round_scaled_grads_to_f32 = in_f32;
    optim::cuda::adamw_step(tensors, hyper, inputs);
  }
  Result r;
  for (const Param& p : params) {
    for (const Tensor& t : {p.param, p.m, p.v, p.master})
      if (t.defined()) r.arrays.push_back(t.contiguous().to(Device::cpu()));
  }
  r.arrays.push_back(step.to(Device::cpu()));
  return r;
}

void expect_same_bits(const Result& got, const Result& want, const char* kernel) {
  ASSERT_EQ(got.arrays.size(), want.arrays.size());
  for (size_t i = 0; i < want.arrays.size(); ++i) {
    const Tensor &a = got.arrays[i], &b = want.arrays[i];
    ASSERT_EQ(a.nbytes(), b.nbytes());
    if (std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0) continue;
    const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
    int64_t first = 0;
    while (first < static_cast<int64_t>(x.size()) && x[first] == y[first]) ++first;
    ADD_FAILURE() << kernel << ": array " << i << " (" << a.numel() << " elements) differs from old's, first at "
                  << first
                  << (first < static_cast<int64_t>(x.size())
                          ? ": " + std::to_string(x[first]) + " against " + std::to_string(y[first])
                          : std::string(" (a bit the doubles hide)"));
  }
}

void expect_all_kernels_agree(const Case& c, double factor, bool in_f32) {
  const std::vector<Param> initial = make_params(c, 100);
  const Result old = run(AdamWKernel::old, initial, c, factor, in_f32);
  ASSERT_EQ(old.arrays.back().item<int64_t>(), 3) << "the skipped step does not count";
  for (AdamWKernel k : {AdamWKernel::wide, AdamWKernel::wide_plain, AdamWKernel::wide_grid, AdamWKernel::pipe}) {
    SCOPED_TRACE(kernel_name(k));
    expect_same_bits(run(k, initial, c, factor, in_f32), old, kernel_name(k));
  }
}

const std::vector<int64_t> kSizes = {1, 3, 4, 4097, 8193, 100003, 4100, 4100};
const std::vector<int64_t> kOffsets = {0, 0, 0, 0, 0, 0, 1, 4};  // the last two not 16-byte aligned
// With one more: 733 chunks of 16384, more than the 132 SMs x 4 blocks resident at once.
std::vector<int64_t> with_a_large_one(std::vector<int64_t> sizes) {
  sizes.push_back(12000003);
  return sizes;
}

}  // namespace
#endif

TEST(AdamWVariantsGpu, Bf16StochasticMatchesTheOldKernelBitForBit) {
  PRECIS_SKIP_WITHOUT_GPU();
#if PRECIS_WITH_CUDA
  const Case c{DType::bf16, DType::bf16, false, true, with_a_large_one(kSizes), kOffsets};
  {
    SCOPED_TRACE("factor 1");
    expect_all_kernels_agree(c, 1.0, false);
  }
  {
    SCOPED_TRACE("factor 0.37");
    expect_all_kernels_agree(c, 0.37, false);
  }
  {
    SCOPED_TRACE("factor 0.37, scaled gradients rounded to f32");
    expect_all_kernels_agree(c, 0.37, true);
  }
#endif
}

TEST(AdamWVariantsGpu, OtherDtypesMatchTheOldKernelBitForBit) {
  PRECIS_SKIP_WITHOUT_GPU();
#if PRECIS_WITH_CUDA
  const Case cases[] = {{DType::bf16, DType::f32, false, false, kSizes, kOffsets},
                        {DType::bf16, DType::f32, false, true, kSizes, kOffsets},
                        {DType::f32, DType::f32, false, false, kSizes, kOffsets},
                        {DType::f32, DType::bf16, false, false, kSizes, kOffsets},
                        {DType::f16, DType::f16, false, false, kSizes, kOffsets},
                        {DType::f64, DType::f64, false, false, kSizes, kOffsets},
                        {DType::bf16, DType::bf16, true, true, kSizes, kOffsets},
                        {DType::f16, DType::f32, true, false, kSizes, kOffsets}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.param)) + " params, " + dtype_name(c.grad) + " grads" +
                 (c.master ? ", master weights" : "") + (c.stochastic ? ", stochastic rounding" : ""));
    expect_all_kernels_agree(c, 0.37, false);
  }
#endif
}

// The switch: set in process, and read from PRECIS_AB_ADAMW until set.
TEST(AdamWVariantsGpu, TheSwitchIsSetInProcess) {
#if PRECIS_WITH_CUDA
  for (AdamWKernel k :
       {AdamWKernel::old, AdamWKernel::wide, AdamWKernel::wide_plain, AdamWKernel::wide_grid, AdamWKernel::pipe}) {
    KernelScope scope(k);
    EXPECT_EQ(optim::cuda::adamw_update_kernel(), k);
  }
#else
  GTEST_SKIP() << "a build without CUDA";
#endif
}

TEST(AdamWVariantsGpu, TimesAtGpt2Size) {
  PRECIS_SKIP_WITHOUT_GPU();
#if PRECIS_WITH_CUDA
  // GPT-2 124M (llm.c's padded vocabulary 50304): 148 tensors, 124,475,904 parameters.
  std::vector<int64_t> sizes = {50304 * 768, 1024 * 768};
  for (int layer = 0; layer < 12; ++layer)
    for (int64_t n : {768, 768, 768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072, 3072 * 768, 768})
      sizes.push_back(n);
  sizes.push_back(768);
  sizes.push_back(768);
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  ASSERT_EQ(total, 124475904);
  std::vector<optim::cuda::AdamWTensors> tensors;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    tensors.push_back({full({n}, 0.5, DType::bf16, kGpu), full({n}, 0.01, DType::bf16, kGpu),
                       zeros({n}, DType::f32, kGpu), zeros({n}, DType::f32, kGpu), Tensor(),
                       sizes[i] >= 768 * 768 ? 0.1 : 0.0, i});
  }
  const optim::cuda::AdamWHyper hyper{0.9, 0.95, 1e-8, true, 1234};
  Tensor lr = full({}, 6e-4, DType::f64, kGpu), step = zeros({}, DType::i64, kGpu);
  Tensor factor = full({}, 0.5, DType::f64, kGpu), no_skip = full({}, 0.0, DType::f64, kGpu);
  optim::cuda::DeviceStepInputs inputs;
  inputs.lr = lr.data<double>();
  inputs.step = step.data<int64_t>();
  inputs.grad_factor = factor.data<double>();
  inputs.skip = no_skip.data<double>();
  cudaStream_t stream = cuda::compute_stream(kGpu);
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  for (AdamWKernel k :
       {AdamWKernel::old, AdamWKernel::wide, AdamWKernel::wide_plain, AdamWKernel::wide_grid, AdamWKernel::pipe}) {
    KernelScope scope(k);
    for (int i = 0; i < 3; ++i) optim::cuda::adamw_step(tensors, hyper, inputs);
    float best = 1e30f;
    for (int i = 0; i < 20; ++i) {
      // An untimed step first: the GPU is busy with it while the host queues the timed one.
      optim::cuda::adamw_step(tensors, hyper, inputs);
      ASSERT_EQ(cudaEventRecord(start, stream), cudaSuccess);
      optim::cuda::adamw_step(tensors, hyper, inputs);
      ASSERT_EQ(cudaEventRecord(stop, stream), cudaSuccess);
      ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
      float ms = 0;
      ASSERT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
      best = std::min(best, ms);
    }
    std::printf("adamw %s %.3f ms %.3f TB/s\n", kernel_name(k), best, 22.0 * total / (best * 1e-3) / 1e12);
    std::fflush(stdout);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  EXPECT_GT(step.to(Device::cpu()).item<int64_t>(), 0);
#endif
}
