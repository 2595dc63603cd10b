// The global gradient norm, sum over all gradients of sum_i g_i^2, and the in-place
// scaling that clips it (as llm.c's global_norm.cuh, but deterministic):
//   stage 1: block b sums the squares of one chunk of one tensor in f64 and writes
//            partial[b] (one launch per batch of tensors of one dtype);
//   stage 2: one block adds all partials in a fixed order; the total is copied back,
//            or, for the sync-free step, turned into the norm and the clip factor on
//            the device.
// Bytes: each gradient read once (stage 1); 8 bytes per block of partials (stage 2).
// Scaling reads and writes each gradient once.
#include <math_constants.h>

#include <algorithm>
#include <map>

#include "core/cuda/launch.cuh"
#include "ops/cuda/global_norm.h"
#include "ops/cuda/nn_kernels.h"

namespace precis::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;  // elements per block

template <typename T>
struct TensorBatch {
  T* data[kGlobalNormBatch];
  int64_t n[kGlobalNormBatch];
  int64_t first_block[kGlobalNormBatch + 1];
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

// out = {norm, clip / scale} and the inf/NaN flag from the total of the scaled squares
// (global_norm_and_clip_factor's rule, global_norm.h), in f64.
__global__ void norm_and_factor_kernel(const double* total, double max_norm, const double* scale, double* found_inf,
                                       double* out) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const double sum = total != nullptr ? *total : 0.0, s = scale != nullptr ? *scale : 1.0;
  const bool finite = isfinite(sum);
  if (found_inf != nullptr) *found_inf = finite ? 0.0 : 1.0;
  const double norm = finite ? sqrt(sum) / s : CUDART_INF;
  out[0] = norm;
  out[1] = (max_norm > 0 && finite && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0) / s;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) scale_kernel(const __grid_constant__ TensorBatch<T> batch, double factor) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  T* data;
  int64_t n;
  chunk_of_block(batch, data, n);
  for_each_in_row<Packed128<T>::size>(data, n, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    Pack<T, W> v = load_pack<W>(data + i);
#pragma unroll
    for (int k = 0; k < W; ++k) v.v[k] = convert_to<T>(convert_to<double>(v.v[k]) * factor);
    store_pack<W>(data + i, v);
  });
}

// Calls launch(batch, blocks) for each batch of up to kGlobalNormBatch tensors of `tensors`
// (all of dtype T), in order; returns the blocks launched in all.
template <typename T, typename Launch>
int64_t for_each_batch(const std::vector<const Tensor*>& tensors, Launch&& launch) {
  int64_t launched = 0;
  for (size_t first = 0; first < tensors.size(); first += kGlobalNormBatch) {
    TensorBatch<T> batch{};
    batch.count = static_cast<int>(std::min<size_t>(kGlobalNormBatch, tensors.size() - first));
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

// The tensors grouped by dtype (each group in the given order); all must be dense and on one device.
std::map<DType, std::vector<const Tensor*>> by_dtype(const std::vector<Tensor>& tensors, const char* op) {
  std::map<DType, std::vector<const Tensor*>> groups;
  for (const Tensor& t : tensors) {
    PRECIS_CHECK(t.is_contiguous() && t.device() == tensors.front().device(), op,
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

double sum_of_squares(const std::vector<Tensor>& tensors) {
  const char* op = "clip_grad_norm";
  if (tensors.empty()) return 0.0;
  cudaStream_t stream = stream_for(tensors.front());
  const int64_t blocks = blocks_for(tensors);
  Tensor buffer = empty({blocks + 1}, DType::f64, tensors.front().device());  // the partials, then the total
  double* partial = static_cast<double*>(buffer.raw_data());
  sum_of_squares_into(tensors, partial, partial + blocks, stream);
  double total = 0;
  PRECIS_CUDA_CHECK(cudaMemcpyAsync(&total, partial + blocks, sizeof(total), cudaMemcpyDeviceToHost, stream), op);
  PRECIS_CUDA_CHECK(cudaStreamSynchronize(stream), op);
  return total;
}

void global_norm_and_clip_factor(const std::vector<Tensor>& tensors, double max_norm, const Tensor& scale,
                                 const Tensor& found_inf, const Tensor& out) {
  const char* op = "clip_grad_norm";
  PRECIS_CHECK(out.is_cuda() && out.is_contiguous() && out.dtype() == DType::f64 && out.numel() == 2, op,
               ": the result must be a dense f64 [2] on the GPU, got ", describe(out));
  for (const Tensor* scalar : {&scale, &found_inf})
    PRECIS_CHECK(!scalar->defined() ||
                     (scalar->dtype() == DType::f64 && scalar->numel() == 1 && scalar->device() == out.device()),
                 op, ": the loss scale and the inf/NaN flag must be f64 scalars beside the result, got ",
                 describe(*scalar));
  cudaStream_t stream = stream_for(out);
  Tensor buffer;  // the partials, then the total
  double* total = nullptr;
  if (!tensors.empty()) {
    const int64_t blocks = blocks_for(tensors);
    buffer = empty({blocks + 1}, DType::f64, out.device());
    double* partial = static_cast<double*>(buffer.raw_data());
    total = partial + blocks;
    sum_of_squares_into(tensors, partial, total, stream);
  }
  precis::cuda::launch(norm_and_factor_kernel, 1, 1, 0, stream, total, max_norm,
                       scale.defined() ? scale.data<double>() : nullptr,
                       found_inf.defined() ? found_inf.data<double>() : nullptr, out.data<double>());
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void scale_(const std::vector<Tensor>& tensors, double factor) {
  const char* op = "clip_grad_norm";
  if (tensors.empty()) return;
  cudaStream_t stream = stream_for(tensors.front());
  for (const auto& [dtype, group] : by_dtype(tensors, op)) {
    dispatch_floating(dtype, op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for_each_batch<T>(group, [&](const TensorBatch<T>& batch, int64_t count, int64_t) {
        precis::cuda::launch(scale_kernel<T>, static_cast<unsigned>(count), kThreads, 0, stream, batch, factor);
        PRECIS_CUDA_CHECK_LAUNCH(op);
      });
    });
  }
}

}  // namespace precis::ops::cuda
