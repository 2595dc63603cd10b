#include "train/device_peak.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <tuple>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/gpu.h"
#include "core/pinned.h"
#include "core/random.h"
#include "ops/matmul.h"

namespace precis::train {

double measure_matmul_tflops(Device device, DType compute, bool tf32, int64_t n, int reps) {
  NoGradGuard no_grad;
  Generator generator(0);
  Tensor a = rand({n, n}, compute, &generator, -1.0, 1.0).to(device);  // random data: zeros run faster
  Tensor b = rand({n, n}, compute, &generator, -1.0, 1.0).to(device);
  bool previous_tf32 = ops::allow_tf32();
  ops::set_allow_tf32(tf32);
  constexpr int kWarmup = 3;
  for (int i = 0; i < kWarmup; ++i) ops::matmul(a, b);
  synchronize(device);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) ops::matmul(a, b);
  synchronize(device);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ops::set_allow_tf32(previous_tf32);
  double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * reps;
  return flops / seconds / 1e12;
}

double device_peak_tflops(Device device, DType compute, bool tf32) {
  if (!device.is_cuda()) return 0.0;
  double known = peak_tflops(device.index, compute, tf32);
  if (known > 0) return known;
  static std::mutex mutex;
  static std::map<std::tuple<int, DType, bool>, double> measured;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_tuple(device.index, compute, tf32 && compute == DType::f32);
  auto found = measured.find(key);
  if (found != measured.end()) return found->second;
  double tflops = measure_matmul_tflops(device, compute, std::get<2>(key));
  measured.emplace(key, tflops);
  char note[256];
  std::snprintf(note, sizeof note, "note: peak measured: %.1f TFLOP/s (%s matmuls%s; '%s' is not in the peak table)",
                tflops, dtype_name(compute), std::get<2>(key) ? " with tf32" : "",
                cuda_device_name(device.index).c_str());
  std::cerr << note << std::endl;
  return tflops;
}

double Roofline::roof(double intensity, bool matrix) const {
  return std::min(compute(matrix), intensity * bytes_per_s);
}

double measure_copy_bytes_per_s(Device device, int64_t bytes, int reps) {
  NoGradGuard no_grad;
  Tensor source = zeros({bytes / 4}, DType::f32, device);
  Tensor copy = source.clone();  // warm-up: the pages are touched, the kernel loaded
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    synchronize(device);
    auto start = std::chrono::steady_clock::now();
    copy_(copy, source);
    synchronize(device);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * static_cast<double>(source.numel() * 4) / seconds);
  }
  return best;
}

Roofline device_roofline(Device device, DType compute, bool tf32) {
  Roofline r;
  if (device.is_cuda()) {
    r.matrix_flops = device_peak_tflops(device, compute, tf32) * 1e12;
    const double vector = peak_tflops(device.index, DType::f32, false);
    const double gbps = peak_memory_gbps(device.index);
    r.vector_flops = vector > 0 ? vector * 1e12 : measure_matmul_tflops(device, DType::f32, false, 4096, 5) * 1e12;
    r.bytes_per_s = gbps > 0 ? gbps * 1e9 : measure_copy_bytes_per_s(device);
    r.source = cuda_device_name(device.index) + (vector > 0 && gbps > 0 ? ": datasheet peaks" : ": measured peaks");
    return r;
  }
  // The CPU: one compute roof, the f32 matmul this build runs (Eigen), and a copy's bandwidth.
  r.matrix_flops = r.vector_flops = measure_matmul_tflops(device, DType::f32, false, 512, 3) * 1e12;
  r.bytes_per_s = measure_copy_bytes_per_s(device, int64_t{1} << 26, 5);
  r.source = "this CPU: measured (an f32 512x512 matmul, a 64 MiB copy)";
  return r;
}

}  // namespace precis::train
