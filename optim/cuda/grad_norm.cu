// The global gradient norm, sum over all gradients of sum_i g_i^2 (as llm.c's
// global_norm.cuh, but deterministic), and the clip factor:
//   stage 1: block b sums the squares of one chunk of one tensor in f64 and writes
//            partial[b] (one launch per batch of tensors of one dtype);
//   stage 2: one block adds all partials in a fixed order;
//   stage 3: one thread turns the total into the norm, the factor and the overflow
//            flag (optim/grad_norm_rule.h, the CPU's rule).
// Bytes: each gradient read once (stage 1); 8 bytes per block of partials (stage 2).
#include <algorithm>
#include <map>

#include "core/cuda/block_reduce.cuh"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "core/cuda/tensor_batch.cuh"
#include "optim/cuda/grad_norm.h"
#include "optim/grad_norm_rule.h"

namespace precis::optim::cuda {

using namespace precis::cuda;  // the device toolkit: batched launches, packs, reductions

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;  // elements per block

template <typename T>
struct TensorBatch {
  T* data[kGradNormBatch];
  int64_t n[kGradNormBatch];
  int64_t first_block[kGradNormBatch + 1];
  int count;
};

template <typename T>
__device__ __forceinline__ void chunk_of_block(const TensorBatch<T>& batch, T*& data, int64_t& n) {
  const int s = tensor_of_block(batch.first_block, batch.count, blockIdx.x);
  const int64_t start = (blockIdx.x - batch.first_block[s]) * kChunk;
  data = batch.data[s] + start;
  n = batch.n[s] - start < kChunk ? batch.n[s] - start : kChunk;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    sum_of_squares_kernel(const __grid_constant__ TensorBatch<const T> batch, double* partial) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const T* data;
  int64_t n;
  chunk_of_block(batch, data, n);
  double sum = 0;
  for_each_in_row<Packed128<T>::size>(data, n, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> v = load_pack<W>(data + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const double x = convert_to<double>(v.v[k]);
      sum += x * x;
    }
  });
  sum = block_all_reduce(sum, SumOp{});
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// total = sum of partial[0 .. count), each thread taking every blockDim-th in order, then a fixed tree.
__global__ void __launch_bounds__(1024) sum_partials_kernel(const double* partial, int64_t count, double* total) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  double sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
  sum = block_all_reduce(sum, SumOp{});
  if (threadIdx.x == 0) *total = sum;
}

// out = {norm, factor} and the inf/NaN flag from the total of the scaled squares.
__global__ void norm_and_factor_kernel(const double* total, double max_norm, const double* scale, double* found_inf,
                                       double* out) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const GradNorm r = grad_norm_from_sum(total != nullptr ? *total : 0.0, max_norm, scale != nullptr ? *scale : 1.0);
  if (found_inf != nullptr) *found_inf = r.found_inf;
  out[0] = r.norm;
  out[1] = r.factor;
}

// Calls launch(batch, blocks) for each batch of up to kGradNormBatch tensors of `tensors`
// (all of dtype T), in order; returns the blocks launched in all.
template <typename T, typename Launch>
int64_t for_each_batch(const std::vector<const Tensor*>& tensors, Launch&& launch) {
  int64_t launched = 0;
  for (size_t first = 0; first < tensors.size(); first += kGradNormBatch) {
    TensorBatch<T> batch{};
    batch.count = static_cast<int>(std::min<size_t>(kGradNormBatch, tensors.size() - first));
    for (int s = 0; s < batch.count; ++s) {
      const Tensor& t = *tensors[first + s];
      batch.data[s] = static_cast<T*>(t.raw_data());
      batch.n[s] = t.numel();
      batch.first_block[s + 1] = batch.first_block[s] + (t.numel() + kChunk - 1) / kChunk;
    }
    const int64_t blocks = batch.first_block[batch.count];
    PRECIS_CHECK(blocks <= INT32_MAX, "clip_grad_norm: ", blocks, " blocks in one launch");
    if (blocks > 0) launch(batch, blocks, launched);
    launched += blocks;
  }
  return launched;
}

// The tensors grouped by dtype (each group in the given order); all must be dense (in any order of
// their dims: a sum of squares reads each element once, wherever it is) and on one device.
std::map<DType, std::vector<const Tensor*>> by_dtype(const std::vector<Tensor>& tensors, const char* op) {
  std::map<DType, std::vector<const Tensor*>> groups;
  for (const Tensor& t : tensors) {
    PRECIS_CHECK(is_non_overlapping_and_dense(t) && t.device() == tensors.front().device(), op,
                 ": gradients must be dense and on one device, got ", describe(t), " and ", describe(tensors.front()));
    groups[t.dtype()].push_back(&t);
  }
  return groups;
}

int64_t blocks_for(const std::vector<Tensor>& tensors) {
  int64_t blocks = 0;
  for (const Tensor& t : tensors) blocks += (t.numel() + kChunk - 1) / kChunk;
  return blocks;
}

// Queues the two stages: partial[b] for each of the blocks_for(tensors) blocks, then their sum into *total.
void sum_of_squares_into(const std::vector<Tensor>& tensors, double* partial, double* total, cudaStream_t stream) {
  const char* op = "clip_grad_norm";
  const int64_t blocks = blocks_for(tensors);
  int64_t done = 0;
  for (const auto& [dtype, group] : by_dtype(tensors, op)) {
    dispatch_floating(dtype, op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      done += for_each_batch<const T>(group, [&](const TensorBatch<const T>& batch, int64_t count, int64_t offset) {
        precis::cuda::launch(sum_of_squares_kernel<T>, static_cast<unsigned>(count), kThreads, 0, stream, batch,
                             partial + done + offset);
        PRECIS_CUDA_CHECK_LAUNCH(op);
      });
    });
  }
  precis::cuda::launch(sum_partials_kernel, 1, 1024, 0, stream, partial, blocks, total);
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace

void grad_norm_and_factor(const std::vector<Tensor>& tensors, double max_norm, const Tensor& scale,
                          const Tensor& found_inf, const Tensor& out,
                          const std::function<void(const Tensor&)>& reduce_sum) {
  const char* op = "clip_grad_norm";
  cudaStream_t stream = stream_for(out);
  Tensor buffer;  // the partials, then the total
  double* total = nullptr;
  if (!tensors.empty()) {
    const int64_t blocks = blocks_for(tensors);
    buffer = empty({blocks + 1}, DType::f64, out.device());
    double* partial = static_cast<double*>(buffer.raw_data());
    total = partial + blocks;
    sum_of_squares_into(tensors, partial, total, stream);
    if (reduce_sum) reduce_sum(buffer.slice(0, blocks, blocks + 1));
  } else if (reduce_sum) {
    // No gradients here, but this rank's zero still joins the other ranks' sum.
    buffer = zeros({1}, DType::f64, out.device());
    total = static_cast<double*>(buffer.raw_data());
    reduce_sum(buffer);
  }
  precis::cuda::launch(norm_and_factor_kernel, 1, 1, 0, stream, total, max_norm,
                       scale.defined() ? scale.data<double>() : nullptr,
                       found_inf.defined() ? found_inf.data<double>() : nullptr, out.data<double>());
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::optim::cuda
