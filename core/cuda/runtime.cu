// Streams of each device, created once, on first use, by whichever thread asks
// first (std::call_once), and kept for the life of the process: kernels queued
// on them may outlive any object that could own them.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"

namespace precis::cuda {

int device_count();  // core/cuda/device_query.cu

namespace {

struct DeviceStreams {
  std::once_flag once;
  std::atomic<bool> created{false};
  cudaStream_t compute = nullptr;
  cudaStream_t comm = nullptr;
};

// One entry per device, never freed (see the top of the file).
DeviceStreams* stream_table() {
  static DeviceStreams* table = new DeviceStreams[device_count() > 0 ? device_count() : 1];
  return table;
}

DeviceStreams& streams_of(Device device) {
  PRECIS_CHECK(device.is_cuda() && device.index >= 0 && device.index < device_count(), "no CUDA stream for device ",
               device, ": ", device_count(), " GPU(s) are usable");
  DeviceStreams& streams = stream_table()[device.index];
  std::call_once(streams.once, [&] {
    DeviceGuard guard(device);
    PRECIS_CUDA_CHECK(cudaStreamCreateWithFlags(&streams.compute, cudaStreamNonBlocking), "create compute stream");
    PRECIS_CUDA_CHECK(cudaStreamCreateWithFlags(&streams.comm, cudaStreamNonBlocking), "create comm stream");
    streams.created.store(true, std::memory_order_release);
  });
  return streams;
}

}  // namespace

cudaStream_t compute_stream(Device device) { return streams_of(device).compute; }

cudaStream_t comm_stream(Device device) { return streams_of(device).comm; }

void set_device(Device device) {
  int current = -1;
  PRECIS_CUDA_CHECK(cudaGetDevice(&current), "set device");
  if (current != device.index) PRECIS_CUDA_CHECK(cudaSetDevice(device.index), "set device");
}

void synchronize(Device device) { PRECIS_CUDA_CHECK(cudaStreamSynchronize(compute_stream(device)), "synchronize"); }

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PRECIS_CUDA_CHECK(cudaStreamIsCapturing(stream, &status), "query graph capture");
  return status != cudaStreamCaptureStatusNone;
}

// Decided once, for the device current at the first launch (kept cheap, as it
// runs per launch): a process driving GPUs of different generations gets the
// answer of the first one for all of them.
namespace {
std::atomic<bool> g_dependent_launch_paused{false};  // pause_dependent_launch
}  // namespace

void pause_dependent_launch(bool paused) { g_dependent_launch_paused.store(paused, std::memory_order_relaxed); }

bool dependent_launch_enabled() {
  static const bool capable = [] {
    const char* setting = std::getenv("PRECIS_PDL");
    if (setting != nullptr && std::strcmp(setting, "0") == 0) return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();  // no usable device: the launch itself will fail and say so
      return false;
    }
    return major >= 9;
  }();
  return capable && !g_dependent_launch_paused.load(std::memory_order_relaxed);
}

int resident_blocks_per_sm(const void* kernel, int threads) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> resident;  // by kernel and block size
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = resident.try_emplace({kernel, threads}, 0);
  if (fresh) {
    PRECIS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, threads, 0), "occupancy");
    it->second = std::max(it->second, 1);
  }
  return it->second;
}

bool any_capture_underway() {
  DeviceStreams* table = stream_table();
  for (int i = 0; i < device_count(); ++i) {
    if (!table[i].created.load(std::memory_order_acquire)) continue;
    if (is_capturing(table[i].compute) || is_capturing(table[i].comm)) return true;
  }
  return false;
}

}  // namespace precis::cuda
