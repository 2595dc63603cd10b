// Streams of each device, created once, on first use, by whichever thread asks
// first (std::call_once), and kept for the life of the process: kernels queued
// on them may outlive any object that could own them. The side stream and its
// scope and join are core/cuda/side_stream.h's.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/side_stream.h"
#include "core/cuda/wait_watch.h"

namespace precis::cuda {

int device_count();  // core/cuda/device_query.cu

namespace {

struct DeviceStreams {
  std::once_flag once;
  std::atomic<bool> created{false};
  cudaStream_t compute = nullptr;
  cudaStream_t comm = nullptr;
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;  // reused: a wait takes the event's state when it is queued
  cudaEvent_t points[kSideStreamPoints] = {};  // mark_side_stream's ring
  std::atomic<unsigned> next_point{0};
  std::atomic<bool> side_unjoined{false};  // work queued on `side` since the last join
};

std::atomic<bool> g_any_side_unjoined{false};

// This thread's SideStreamScope: the stream compute_stream(cuda:t_side_device) returns.
thread_local cudaStream_t t_side_stream = nullptr;
thread_local int t_side_device = -1;
thread_local int t_side_backward_device = -1;  // SideStreamScope's Backward::on_side_stream

bool side_stream_low_priority() {
  static const bool on = [] {
    const char* setting = std::getenv("PRECIS_EXP_SIDE_STREAM_LOW_PRIORITY");
    return setting != nullptr && std::strcmp(setting, "1") == 0;
  }();
  return on;
}

// A non-blocking stream; at the device's greatest priority where `high` (side_stream.h, "Priority").
cudaStream_t make_stream(bool high, const char* what) {
  cudaStream_t stream = nullptr;
  if (!high) {
    PRECIS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), what);
    return stream;
  }
  int least = 0, greatest = 0;
  PRECIS_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), what);
  PRECIS_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest), what);
  return stream;
}

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
    const bool high = side_stream_low_priority();
    streams.compute = make_stream(high, "create compute stream");
    streams.comm = make_stream(high, "create comm stream");
    streams.side = make_stream(false, "create side stream");
    PRECIS_CUDA_CHECK(cudaEventCreateWithFlags(&streams.fork, cudaEventDisableTiming), "create side stream");
    PRECIS_CUDA_CHECK(cudaEventCreateWithFlags(&streams.join, cudaEventDisableTiming), "create side stream");
    for (cudaEvent_t& point : streams.points)
      PRECIS_CUDA_CHECK(cudaEventCreateWithFlags(&point, cudaEventDisableTiming), "create side stream");
    streams.created.store(true, std::memory_order_release);
  });
  return streams;
}

// Makes the compute stream wait for the side stream's work, where it has had any since the last join.
// Joined from inside a SideStreamScope of this thread, the scope's later work is still to join.
void join_if_unjoined(DeviceStreams& streams) {
  if (!streams.created.load(std::memory_order_acquire) || !streams.side_unjoined.exchange(false)) return;
  PRECIS_CUDA_CHECK(cudaEventRecord(streams.join, streams.side), "join the side stream");
  PRECIS_CUDA_CHECK(cudaStreamWaitEvent(streams.compute, streams.join, 0), "join the side stream");
  if (t_side_stream == streams.side) {
    streams.side_unjoined.store(true, std::memory_order_relaxed);
    g_any_side_unjoined.store(true, std::memory_order_release);
  }
}

}  // namespace

cudaStream_t compute_stream(Device device) {
  if (t_side_stream != nullptr && t_side_device == device.index) return t_side_stream;
  return streams_of(device).compute;
}

cudaStream_t comm_stream(Device device) { return streams_of(device).comm; }

void set_device(Device device) {
  int current = -1;
  PRECIS_CUDA_CHECK(cudaGetDevice(&current), "set device");
  if (current != device.index) PRECIS_CUDA_CHECK(cudaSetDevice(device.index), "set device");
}

void synchronize(Device device) {
  DeviceStreams& streams = streams_of(device);
  synchronize_stream(streams.compute, "synchronize");
  synchronize_stream(streams.side, "synchronize");
}

namespace {
std::atomic<WaitWatcher*> g_wait_watcher{nullptr};
}  // namespace

WaitWatcher* set_wait_watcher(WaitWatcher* watcher) { return g_wait_watcher.exchange(watcher); }

void clear_wait_watcher(WaitWatcher* watcher, WaitWatcher* previous) {
  g_wait_watcher.compare_exchange_strong(watcher, previous);
}

void synchronize_stream(cudaStream_t stream, const char* op) {
  WaitWatcher* watcher = g_wait_watcher.load();
  if (watcher == nullptr) {
    PRECIS_CUDA_CHECK(cudaStreamSynchronize(stream), op);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) PRECIS_CUDA_CHECK(state, op);
    const auto so_far = std::chrono::steady_clock::now() - start;
    watcher->waited(so_far);
    // Spin for the first millisecond (work about to complete), then let the core go, in short
    // sleeps: an eager step waits so twice (its index checks), a sleep past the end is lost time.
    if (so_far > std::chrono::milliseconds(1)) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

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
    if (is_capturing(table[i].compute) || is_capturing(table[i].comm) || is_capturing(table[i].side)) return true;
  }
  return false;
}

cudaStream_t side_stream(Device device) { return streams_of(device).side; }

void fork_side_stream(Device device) {
  DeviceStreams& streams = streams_of(device);
  PRECIS_CUDA_CHECK(cudaEventRecord(streams.fork, streams.compute), "fork the side stream");
  PRECIS_CUDA_CHECK(cudaStreamWaitEvent(streams.side, streams.fork, 0), "fork the side stream");
  streams.side_unjoined.store(true, std::memory_order_relaxed);
  g_any_side_unjoined.store(true, std::memory_order_release);
}

SideStreamScope::SideStreamScope(Device device, Fork fork, Backward backward)
    : previous_stream_(t_side_stream),
      previous_device_(t_side_device),
      previous_backward_device_(t_side_backward_device) {
  DeviceStreams& streams = streams_of(device);
  if (fork == Fork::now && compute_stream(device) != streams.side) {
    fork_side_stream(device);
  } else {
    streams.side_unjoined.store(true, std::memory_order_relaxed);
    g_any_side_unjoined.store(true, std::memory_order_release);
  }
  t_side_stream = streams.side;
  t_side_device = device.index;
  if (backward == Backward::on_side_stream) t_side_backward_device = device.index;
}

SideStreamScope::~SideStreamScope() {
  t_side_stream = previous_stream_;
  t_side_device = previous_device_;
  t_side_backward_device = previous_backward_device_;
}

int side_stream_backward_device() { return t_side_backward_device; }

SideStreamPoint mark_side_stream(Device device) {
  DeviceStreams& streams = streams_of(device);
  const int slot = static_cast<int>(streams.next_point.fetch_add(1, std::memory_order_relaxed) % kSideStreamPoints);
  PRECIS_CUDA_CHECK(cudaEventRecord(streams.points[slot], streams.side), "mark the side stream");
  return {device.index, slot};
}

void wait_for_side_stream(SideStreamPoint point) {
  if (point.device < 0) return;
  DeviceStreams& streams = streams_of(Device::cuda(point.device));
  PRECIS_CUDA_CHECK(cudaStreamWaitEvent(streams.compute, streams.points[point.slot], 0), "wait for the side stream");
}

void join_side_streams() {
  if (!g_any_side_unjoined.exchange(false, std::memory_order_acq_rel)) return;
  DeviceStreams* table = stream_table();
  for (int i = 0; i < device_count(); ++i) join_if_unjoined(table[i]);
}

void join_side_stream(Device device) {
  if (!device.is_cuda() || device.index < 0 || device.index >= device_count()) return;
  join_if_unjoined(stream_table()[device.index]);
}

}  // namespace precis::cuda
