// KernelTrace: every kernel, memcpy and memset that runs on the GPU between
// start() and stop(), with its GPU start and end times, recorded by CUPTI's
// Activity API (the mechanism Nsight Systems and the PyTorch profiler use).
//
// CUPTI is optional: builds without it (or without CUDA) compile this API and
// start() fails with a message saying so. It is set up lazily, on the first
// start(), so runs that trace nothing never load it. One trace at a time per
// process (CUPTI's activity buffers are process-wide).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace precis {

struct GpuActivity {
  enum class Kind { kernel, memcpy, memset };
  // Which of the device's streams (core/cuda/runtime.h) it ran on: compute, communication
  // (the collectives of data parallelism, overlapping the compute stream), or another.
  enum class Stream { compute, communication, other };
  Kind kind = Kind::kernel;
  std::string name;      // kernels: demangled ("void f<float>(float*, int)"); copies: "Memcpy HtoD"
  int64_t start_ns = 0;  // on KernelTrace::now_ns()'s clock
  int64_t end_ns = 0;
  uint32_t stream = 0;
  int64_t bytes = 0;  // memcpy and memset
  Stream role = Stream::other;
  // The scope the host launched it in (push_scope's id, e.g. the op profile's op index), or -1.
  int64_t scope = -1;
};

const char* activity_kind_name(GpuActivity::Kind kind);  // "kernel", "memcpy", "memset"
const char* stream_role_name(GpuActivity::Stream role);  // "compute", "communication", "other"

// Whether this build can record GPU activity, and if not, why not.
bool kernel_trace_available();
std::string kernel_trace_unavailable_reason();

class KernelTrace {
 public:
  KernelTrace() = default;
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  // Starts recording (initialising CUPTI on first use).
  void start();
  // Waits for the GPU, stops recording, and returns what ran, sorted by start time, each
  // activity's role told from the current device's compute and communication streams.
  std::vector<GpuActivity> stop();
  // CUPTI's clock, the one the activity timestamps use, in nanoseconds.
  static int64_t now_ns();
  // While a trace records: what this thread launches until pop_scope() carries `id` as its
  // GpuActivity::scope (CUPTI's external correlation ids, tying each kernel to the host code
  // that launched it). Scopes nest; no-ops when nothing records.
  static void push_scope(int64_t id);
  static void pop_scope();

 private:
  bool running_ = false;
};

// A C++ symbol demangled ("_Z3addPfi" -> "add(float*, int)"); other names unchanged.
std::string demangle(const char* symbol);

}  // namespace precis
