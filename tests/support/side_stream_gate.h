// Holds a device's side stream (core/cuda/side_stream.h) shut for a test: the side stream spins
// at a host function until the gate opens, when open() is called, when the gate is destroyed, or
// after 20 s. The last means that the host waited for the shut side stream (a synchronising call
// in the code under test); timed_out() then says so, and the test fails instead of hanging. The
// destructor waits for the side stream to pass the gate, so that the host function never reads a
// destroyed gate. Include only in files built with CUDA.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/cuda/side_stream.h"
#include "core/device.h"

namespace precis::testing {

class SideStreamGate {
 public:
  explicit SideStreamGate(Device device) : stream_(cuda::side_stream(device)) {
    EXPECT_EQ(cudaLaunchHostFunc(
                  stream_,
                  [](void* flag) {
                    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
                  },
                  &open_),
              cudaSuccess);
    watchdog_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!opened_.wait_for(lock, std::chrono::seconds(20), [this] { return open_.load(); })) {
        timed_out_ = true;
        open_ = true;
      }
    });
  }
  ~SideStreamGate() {
    open();
    watchdog_.join();
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  SideStreamGate(const SideStreamGate&) = delete;
  SideStreamGate& operator=(const SideStreamGate&) = delete;

  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }
  bool timed_out() const { return timed_out_; }

 private:
  cudaStream_t stream_;
  std::atomic<bool> open_{false}, timed_out_{false};
  std::mutex mutex_;
  std::condition_variable opened_;
  std::thread watchdog_;
};

}  // namespace precis::testing
