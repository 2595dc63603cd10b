// GPU checks of the core runtime: device query, copies (device<->device and
// host<->device, any layout, every dtype pair), fill and accumulate on the
// device, pinned memory, each against the CPU. Skipped, with the reason, where
// no GPU is usable.
//
// The values used are k / 2 for small k, which every dtype pair converts
// exactly (no rounding, nothing out of range), so GPU results must equal the
// CPU's bit for bit. Destinations are poisoned first with values that differ
// from the expected result everywhere, so an element left unwritten fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/copy.h"
#include "core/gpu.h"
#include "core/pinned.h"
#include "core/random.h"
#include "support/gpu.h"
#include "support/gradcheck.h"

#if PRECIS_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/pinned_allocator.h"
#endif

using namespace precis;
using precis::testing::expect_close;

namespace {

const std::vector<DType> kAllDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                       DType::i32, DType::i64, DType::u8,  DType::boolean};
const std::vector<DType> kFloatDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

// Values k / 2 with k = 0..199 in a scrambled order (zeros included, so bool sees false).
Tensor exact_values(const Shape& shape, DType dtype, int seed) {
  std::vector<double> values(shape_numel(shape));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>((i * 37 + seed * 11) % 200) / 2;
  return from_vector(values, shape).to(dtype);
}

// A CPU tensor that differs from `t` in every element: t + 1, or !t for bool.
Tensor poison_of(const Tensor& t) {
  std::vector<double> values = t.to_vector<double>();
  for (double& v : values) v = t.dtype() == DType::boolean ? (v == 0 ? 1 : 0) : v + 1;
  return from_vector(values, t.shape()).to(t.dtype());
}

// actual (any device) equals expected (CPU) exactly, with the same dtype.
void expect_equal(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  int failures = 0;
  for (size_t i = 0; i < a.size() && failures < 5; ++i) {
    if (a[i] == e[i]) continue;
    ADD_FAILURE() << what << ": element " << i << " is " << a[i] << ", expected " << e[i];
    ++failures;
  }
}

std::string pair_name(DType src, DType dst) { return std::string(dtype_name(src)) + " -> " + dtype_name(dst); }

Tensor on(const Tensor& cpu, Device device) { return device.is_cpu() ? cpu.clone() : cpu.to(device); }

// The views the layout tests copy between, both of shape [7, 5, 3]: a permuted
// slice with a step of a [5, 6, 7] source, and a permuted slice of a [3, 7, 10]
// destination buffer (whose other elements must stay untouched).
Tensor source_view(const Tensor& base) { return base.permute({2, 0, 1}).slice(2, 1, 6, 2); }
Tensor destination_view(const Tensor& buffer) { return buffer.slice(2, 2, 7).permute({1, 2, 0}); }

// The destination buffer before an op writes `result` into destination_view:
// its view region differs from `result` everywhere, the rest holds other values.
Tensor poisoned_buffer(const Tensor& result) {
  Tensor buffer = exact_values({3, 7, 10}, result.dtype(), 5);
  copy_(destination_view(buffer), poison_of(result));
  return buffer;
}

}  // namespace

TEST(DeviceGpu, AutoFallsBackOrPicksTheGpu) {
  Device d = resolve_device("auto", /*quiet=*/true);
  if (cuda_device_count() == 0) {
    EXPECT_EQ(d, Device::cpu());
    try {
      resolve_device("cuda");
      FAIL() << "device: cuda without a GPU must be an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no GPU is usable"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_EQ(d, Device::cuda(0));
  }
}

TEST(DeviceGpu, CopiesRoundTripThroughTheDevice) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kAllDTypes) {
    Tensor host = exact_values({37, 5}, dtype, 1);
    Tensor device = host.to(Device::cuda(0));
    EXPECT_TRUE(device.is_cuda());
    expect_equal(device.to(Device::cpu()), host, dtype_name(dtype));
  }
  // A strided host view and a dtype conversion on the way.
  Tensor host = rand({6, 4}, DType::f64);
  Tensor device = empty({4, 6}, DType::f32, Device::cuda(0));
  copy_(device, host.t());
  expect_close(device.to(Device::cpu()), host.t().to(DType::f32), 0, 0);
}

// Every dtype pair, strided on both sides, in all three directions.
TEST(DeviceGpu, StridedConvertingCopiesMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  for (DType src_dtype : kAllDTypes) {
    Tensor source = exact_values({5, 6, 7}, src_dtype, 1);
    for (DType dst_dtype : kAllDTypes) {
      Tensor result = empty({7, 5, 3}, dst_dtype);
      copy_(result, source_view(source));  // the CPU reference
      Tensor before = poisoned_buffer(result);
      Tensor expected = before.clone();
      copy_(destination_view(expected), result);
      const struct {
        Device from, to;
        const char* name;
      } directions[] = {{gpu, gpu, "device to device"},
                        {Device::cpu(), gpu, "host to device"},
                        {gpu, Device::cpu(), "device to host"}};
      for (const auto& direction : directions) {
        Tensor buffer = on(before, direction.to);
        copy_(destination_view(buffer), source_view(on(source, direction.from)));
        expect_equal(buffer, expected, pair_name(src_dtype, dst_dtype) + ", " + direction.name);
      }
    }
  }
}

// Dense copies take the vectorised path when aligned (with an odd tail), and the
// element-wise one when a view starts one element in.
TEST(DeviceGpu, DenseConvertingCopiesMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t n = 100003;
  for (DType src_dtype : kAllDTypes) {
    Tensor source = exact_values({n + 1}, src_dtype, 2);
    Tensor source_gpu = source.to(gpu);
    for (DType dst_dtype : kAllDTypes) {
      for (int64_t start : {0, 1}) {
        Tensor expected = empty({n}, dst_dtype);
        copy_(expected, source.slice(0, start, start + n));
        Tensor before = exact_values({n + 1}, dst_dtype, 3);
        copy_(before.slice(0, start, start + n), poison_of(expected));
        Tensor whole = before.clone();
        copy_(whole.slice(0, start, start + n), expected);
        Tensor buffer = before.to(gpu);
        copy_(buffer.slice(0, start, start + n), source_gpu.slice(0, start, start + n));
        expect_equal(buffer, whole, pair_name(src_dtype, dst_dtype) + ", offset " + std::to_string(start));
      }
    }
  }
}

// The Tensor methods that GPU code relies on: contiguous(), to(dtype), clone of a slice.
TEST(DeviceGpu, ViewsOfGpuTensorsBecomeDenseOnTheDevice) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  Tensor host = rand({4, 6, 8}, DType::f32);
  Tensor device = host.to(gpu);
  Tensor transposed = device.transpose(0, 2).contiguous();
  EXPECT_TRUE(transposed.is_cuda());
  EXPECT_TRUE(transposed.is_contiguous());
  expect_equal(transposed, host.transpose(0, 2).contiguous(), "transpose(0, 2).contiguous()");
  expect_equal(device.to(DType::bf16), host.to(DType::bf16), "to(bf16)");
  expect_equal(device.slice(1, 1, 5, 3).clone(), host.slice(1, 1, 5, 3).clone(), "slice(1, 1, 5, 3).clone()");
  expect_equal(device.permute({1, 2, 0}).to(DType::f16).to(DType::f64),
               host.permute({1, 2, 0}).to(DType::f16).to(DType::f64), "permute, to(f16), to(f64)");
}

TEST(DeviceGpu, FillMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  for (DType dtype : kAllDTypes) {
    // Dense: vectorised stores and a tail; then one element in (misaligned).
    for (int64_t start : {0, 1}) {
      Tensor before = exact_values({1000004}, dtype, 4);
      copy_(before.slice(0, start, start + 1000003), poison_of(full({1000003}, 2.5, dtype)));
      Tensor expected = before.clone();
      fill_(expected.slice(0, start, start + 1000003), 2.5);
      Tensor buffer = before.to(gpu);
      fill_(buffer.slice(0, start, start + 1000003), 2.5);
      expect_equal(buffer, expected,
                   std::string("dense fill ") + dtype_name(dtype) + ", offset " + std::to_string(start));
    }
    // Strided: only the view changes.
    Tensor result = full({7, 5, 3}, 1.5, dtype);
    Tensor expected = poisoned_buffer(result);
    Tensor buffer = expected.to(gpu);
    fill_(destination_view(expected), 1.5);
    fill_(destination_view(buffer), 1.5);
    expect_equal(buffer, expected, std::string("strided fill ") + dtype_name(dtype));
  }
}

// Gradients are floating point: the GPU sums every pair of floating dtypes.
TEST(DeviceGpu, AccumulateMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  for (DType src_dtype : kFloatDTypes) {
    Tensor source = exact_values({5, 6, 7}, src_dtype, 3);
    Tensor dense_source = exact_values({4099}, src_dtype, 4);
    for (DType dst_dtype : kFloatDTypes) {
      const std::string name = pair_name(src_dtype, dst_dtype);
      // Strided on both sides; elements outside the view stay as they were.
      Tensor before = exact_values({3, 7, 10}, dst_dtype, 6);
      Tensor expected = before.clone();
      accumulate_(destination_view(expected), source_view(source));
      Tensor buffer = before.to(gpu);
      accumulate_(destination_view(buffer), source_view(source.to(gpu)));
      expect_equal(buffer, expected, "strided accumulate " + name);
      // Dense: vectorised, with a tail.
      Tensor dense_before = exact_values({4099}, dst_dtype, 7);
      Tensor dense_expected = dense_before.clone();
      accumulate_(dense_expected, dense_source);
      Tensor dense = dense_before.to(gpu);
      accumulate_(dense, dense_source.to(gpu));
      expect_equal(dense, dense_expected, "dense accumulate " + name);
    }
  }
}

// Two tensors of one dense non-row-major layout (channels-last here) copy and sum as flat
// arrays; the result must still land at the right [n, c, h, w] for every dtype pair. 5 x 7 x
// 3 x 16 = 1680 elements and a 3-element offset: a tail after the packs, and unaligned starts
// that take the strided kernel.
TEST(DeviceGpu, ChannelsLastPairsCopyAndAccumulateLikeTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const Shape shape{5, 16, 3, 7}, channels_last{16 * 3 * 7, 1, 7 * 16, 16};
  auto channels_last_copy = [&](const Tensor& values, Device device, int64_t offset) {
    Tensor t = empty({values.numel() + offset}, values.dtype(), device).as_strided(shape, channels_last, offset);
    copy_(t, values);
    return t;
  };
  for (DType src_dtype : kFloatDTypes) {
    const Tensor source = exact_values(shape, src_dtype, 3);
    for (DType dst_dtype : kFloatDTypes) {
      const std::string name = pair_name(src_dtype, dst_dtype);
      const Tensor before = exact_values(shape, dst_dtype, 6);
      Tensor expected = before.clone();
      accumulate_(expected, source);
      for (int64_t offset : {0, 3}) {
        Tensor copied = channels_last_copy(before, gpu, offset);
        copy_(copied, channels_last_copy(source, gpu, offset));
        expect_equal(copied, source.to(dst_dtype), "channels-last copy " + name);
        Tensor summed = channels_last_copy(before, gpu, offset);
        accumulate_(summed, channels_last_copy(source, gpu, offset));
        expect_equal(summed, expected, "channels-last accumulate " + name);
      }
    }
  }
}

TEST(DeviceGpu, AccumulateBf16GradientsIntoF32) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  Tensor grad = rand({1 << 20}, DType::f32).to(DType::bf16);
  Tensor master = rand({1 << 20}, DType::f32);
  Tensor expected = master.clone();
  accumulate_(expected, grad);
  Tensor device = master.to(gpu);
  accumulate_(device, grad.to(gpu));
  expect_equal(device, expected, "f32 += bf16");
}

TEST(DeviceGpu, AccumulateNeedsOneDeviceAndFloatingTypes) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor device = zeros({4}, DType::f32, Device::cuda(0));
  EXPECT_THROW(accumulate_(device, ones({4})), Error);
  Tensor integers = zeros({4}, DType::i32, Device::cuda(0));
  try {
    accumulate_(integers, integers);
    FAIL() << "accumulated integers on the GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("floating point"), std::string::npos) << e.what();
  }
}

TEST(DeviceGpu, PinnedTensorsAreOrdinaryWithoutAGpu) {
  Tensor pinned = empty_pinned({3, 4}, DType::f32);
  EXPECT_TRUE(pinned.is_cpu());
  EXPECT_EQ(pinned.shape(), Shape({3, 4}));
  EXPECT_EQ(is_pinned(pinned), cuda_device_count() > 0);
  EXPECT_FALSE(is_pinned(empty({3, 4})));
  fill_(pinned, 3.0);
  expect_equal(pinned, full({3, 4}, 3.0), "fill of a pinned tensor");
  synchronize(Device::cpu());
}

TEST(DeviceGpu, PinnedCopiesRunOnTheStream) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t n = 1 << 20;
  Tensor values = exact_values({n}, DType::f32, 8);
  Tensor device = poison_of(values).to(gpu);
  {
    Tensor staging = empty_pinned({n}, DType::f32);
    copy_(staging, values);
    copy_(device, staging);  // queued; the staging memory is not reused before it has run
  }
  Tensor back = empty_pinned({n}, DType::f32);
  fill_(back, -1.0);
  copy_(back, device);
  synchronize(gpu);
  expect_equal(back, values, "pinned -> device -> pinned");
  // A strided pinned destination is laid out on the host, after the data has arrived.
  Tensor strided = empty_pinned({2 * n}, DType::f32);
  fill_(strided, -1.0);
  copy_(strided.slice(0, 0, 2 * n, 2), device);
  expect_equal(strided.slice(0, 0, 2 * n, 2), values, "device -> strided pinned");
}

#if PRECIS_WITH_CUDA
TEST(DeviceGpu, PinnedAllocatorReusesItsBlocks) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  Allocator& pinned = cuda::pinned_allocator();
  Tensor device = zeros({1 << 18}, DType::f32, gpu);
  for (int step = 0; step < 3; ++step) {
    Tensor batch = empty_pinned({1 << 18}, DType::f32);
    copy_(device, batch);
  }
  synchronize(gpu);
  const AllocatorStats warm = pinned.stats();
  for (int step = 0; step < 20; ++step) {
    Tensor batch = empty_pinned({1 << 18}, DType::f32);
    fill_(batch, step);
    copy_(device, batch);
    synchronize(gpu);  // the copy done, its block is free for the next step
  }
  EXPECT_EQ(pinned.stats().num_system_allocs, warm.num_system_allocs);
  EXPECT_EQ(pinned.stats().allocated_bytes, warm.allocated_bytes);
  expect_equal(device, full({1 << 18}, 19.0), "last batch");
}
#endif

TEST(DeviceGpu, CopiesBetweenTwoGpus) {
  PRECIS_SKIP_WITHOUT_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  Tensor host = exact_values({5, 6, 7}, DType::f32, 9);
  Tensor on_first = host.to(Device::cuda(0));
  expect_equal(on_first.to(Device::cuda(1)), host, "cuda:0 -> cuda:1");
  Tensor result = empty({7, 5, 3}, DType::bf16);
  copy_(result, source_view(host));
  Tensor expected = poisoned_buffer(result);
  Tensor buffer = expected.to(Device::cuda(1));
  copy_(destination_view(expected), result);
  copy_(destination_view(buffer), source_view(on_first));
  expect_equal(buffer, expected, "strided f32 on cuda:0 -> bf16 on cuda:1");
}

// More than 2^31 elements: the strided kernels switch to 64-bit index math.
TEST(DeviceGpu, StridedKernelsIndexBeyondTwoToThe31) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t rows = 3, cols = (int64_t(1) << 30) + 5;  // 3 * cols > 2^31
#if PRECIS_WITH_CUDA
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < size_t(8) << 30) GTEST_SKIP() << "needs 8 GiB of free GPU memory";
#endif
  // Rows of cols + 1 bytes: a view of the first cols columns cannot be merged into one dim.
  Tensor source = zeros({rows, cols + 1}, DType::u8, gpu);
  const int64_t chunk = cols / 8 + 1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 8; ++c)
      fill_(source.select(0, r).narrow(0, c * chunk, std::min(chunk, cols + 1 - c * chunk)), 1 + r * 8 + c);
  Tensor destination = full({rows, cols + 2}, 255.0, DType::u8, gpu);
  copy_(destination.slice(1, 1, cols + 1), source.slice(1, 0, cols));
  fill_(source.slice(1, 0, cols), 200.0);
  // Samples around each row's ends and each chunk boundary; the untouched columns keep their values.
  for (int64_t r = 0; r < rows; ++r) {
    Tensor copied = destination.select(0, r);
    EXPECT_EQ(copied.slice(0, 0, 1).item<double>(), 255) << "row " << r;
    EXPECT_EQ(copied.slice(0, cols + 1, cols + 2).item<double>(), 255) << "row " << r;
    for (int64_t c = 0; c < 8; ++c) {
      int64_t first = c * chunk, last = std::min(cols, (c + 1) * chunk) - 1;
      for (int64_t at : {first, first + 1, last - 1, last}) {
        EXPECT_EQ(copied.slice(0, at + 1, at + 2).item<double>(), 1 + r * 8 + c) << "row " << r << " col " << at;
      }
    }
    std::vector<double> filled = source.select(0, r).slice(0, cols - 3, cols + 1).to_vector<double>();
    EXPECT_EQ(filled, std::vector<double>({200, 200, 200, static_cast<double>(1 + r * 8 + 7)})) << "row " << r;
  }
}

// A single row of more than 2^31 elements is cut again within the row.
TEST(DeviceGpu, StridedFillCutsRowsLongerThanTwoToThe31) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t length = (int64_t(1) << 31) + 10;
#if PRECIS_WITH_CUDA
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < size_t(6) << 30) GTEST_SKIP() << "needs 6 GiB of free GPU memory";
#endif
  Tensor wide = full({2, length + 1}, 9.0, DType::u8, gpu);
  fill_(wide.slice(1, 0, length), 4.0);  // rows of length + 1 bytes: the view is not contiguous
  for (int64_t r = 0; r < 2; ++r) {
    Tensor row = wide.select(0, r);
    for (int64_t at : {int64_t(0), int64_t(INT32_MAX) - 1, int64_t(INT32_MAX), int64_t(INT32_MAX) + 1, length - 1})
      EXPECT_EQ(row.slice(0, at, at + 1).item<double>(), 4) << "row " << r << " col " << at;
    EXPECT_EQ(row.slice(0, length, length + 1).item<double>(), 9) << "row " << r;
  }
}

TEST(DeviceGpu, AllocatorCountsBytes) {
  PRECIS_SKIP_WITHOUT_GPU();
  Allocator& alloc = allocator_for(Device::cuda(0));
  size_t before = alloc.stats().allocated_bytes;
  {
    Tensor t = empty({1 << 20}, DType::f32, Device::cuda(0));
    // A block may round up, by less than 1 MiB (a remainder too small to split off).
    EXPECT_GE(alloc.stats().allocated_bytes, before + (4u << 20));
    EXPECT_LT(alloc.stats().allocated_bytes, before + (5u << 20));
    EXPECT_GE(alloc.stats().peak_bytes, alloc.stats().allocated_bytes);
    EXPECT_GE(alloc.stats().reserved_bytes, alloc.stats().allocated_bytes);
  }
  EXPECT_EQ(alloc.stats().allocated_bytes, before);
}
