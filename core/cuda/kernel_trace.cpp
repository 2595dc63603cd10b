// KernelTrace on CUPTI's Activity API: CUPTI fills buffers we hand it with one
// record per kernel, memcpy and memset (GPU start and end in ns on CUPTI's
// clock) and hands each full buffer back through a callback, possibly on a
// thread of its own; stop() forces out the last partly filled ones.
#if PRECIS_WITH_CUPTI

#include "core/kernel_trace.h"

#include <cuda_runtime.h>
#include <cupti.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "core/cuda/cuda_check.h"
#include "core/cuda/runtime.h"

#define PRECIS_CUPTI_CHECK(call, op)                                          \
  do {                                                                        \
    CUptiResult precis_cupti_status_ = (call);                                \
    if (precis_cupti_status_ != CUPTI_SUCCESS) {                              \
      const char* precis_cupti_text_ = "unknown error";                       \
      cuptiGetResultString(precis_cupti_status_, &precis_cupti_text_);        \
      PRECIS_FAIL(op, ": CUPTI error (", precis_cupti_text_, ") in ", #call); \
    }                                                                         \
  } while (0)

namespace precis {

namespace {

// The newest record layouts of this CUPTI; CUPTI only ever appends fields.
#if CUPTI_API_VERSION >= 130000
using KernelRecord = CUpti_ActivityKernel10;
using MemcpyRecord = CUpti_ActivityMemcpy6;
#else
using KernelRecord = CUpti_ActivityKernel9;
using MemcpyRecord = CUpti_ActivityMemcpy5;
#endif
using MemsetRecord = CUpti_ActivityMemset4;
using CorrelationRecord = CUpti_ActivityExternalCorrelation;
constexpr CUpti_ExternalCorrelationKind kScopeKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;

constexpr size_t kBufferBytes = 8 << 20;
constexpr size_t kBufferAlignment = 8;
// CUPTI writes an external correlation record (scope id -> correlation id) beside the record
// of the runtime or driver API call that launched the work, so those API records must be on
// too (they are read past); without them no kernel gets its op (seen on an H100).
const CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,    CUPTI_ACTIVITY_KIND_MEMCPY,  CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER};

std::mutex g_mutex;
std::vector<GpuActivity> g_records;  // filled by the completion callback
// Each record's CUPTI correlation id (parallel to g_records), and the scope id pushed when
// the API call with that correlation id ran (from the external correlation records).
std::vector<uint32_t> g_correlations;
std::unordered_map<uint32_t, int64_t> g_scopes;
bool g_callbacks_registered = false;
bool g_running = false;

const char* memcpy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "Memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "Memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "Memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "Memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "Memcpy PtoP";
    default:
      return "Memcpy";
  }
}

uint32_t correlation_of(const CUpti_Activity* record) {
  if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL)
    return reinterpret_cast<const KernelRecord*>(record)->correlationId;
  if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) return reinterpret_cast<const MemcpyRecord*>(record)->correlationId;
  return reinterpret_cast<const MemsetRecord*>(record)->correlationId;
}

GpuActivity from_record(const CUpti_Activity* record) {
  GpuActivity a;
  if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
    auto* k = reinterpret_cast<const KernelRecord*>(record);
    a = {GpuActivity::Kind::kernel,    demangle(k->name), static_cast<int64_t>(k->start),
         static_cast<int64_t>(k->end), k->streamId,       0};
  } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
    auto* m = reinterpret_cast<const MemcpyRecord*>(record);
    a = {GpuActivity::Kind::memcpy,
         memcpy_name(m->copyKind),
         static_cast<int64_t>(m->start),
         static_cast<int64_t>(m->end),
         m->streamId,
         static_cast<int64_t>(m->bytes)};
  } else {
    auto* m = reinterpret_cast<const MemsetRecord*>(record);
    a = {GpuActivity::Kind::memset,    "Memset",    static_cast<int64_t>(m->start),
         static_cast<int64_t>(m->end), m->streamId, static_cast<int64_t>(m->bytes)};
  }
  return a;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlignment, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  std::vector<GpuActivity> parsed;
  std::vector<uint32_t> correlations;
  std::vector<std::pair<uint32_t, int64_t>> scopes;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL ||
        record->kind == CUPTI_ACTIVITY_KIND_MEMCPY || record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      parsed.push_back(from_record(record));
      correlations.push_back(correlation_of(record));
    } else if (record->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
      auto* c = reinterpret_cast<const CorrelationRecord*>(record);
      if (c->externalKind == kScopeKind) scopes.emplace_back(c->correlationId, static_cast<int64_t>(c->externalId));
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.insert(g_records.end(), parsed.begin(), parsed.end());
  g_correlations.insert(g_correlations.end(), correlations.begin(), correlations.end());
  for (const auto& [correlation, scope] : scopes) g_scopes[correlation] = scope;
}

}  // namespace

bool kernel_trace_available() { return true; }
std::string kernel_trace_unavailable_reason() { return ""; }

KernelTrace::~KernelTrace() {
  if (!running_) return;
  try {
    stop();
  } catch (...) {  // a destructor must not throw; the trace is lost either way
  }
}

void KernelTrace::start() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    PRECIS_CHECK(!g_running, "kernel trace: another trace is already recording (one at a time per process)");
    g_records.clear();
    g_correlations.clear();
    g_scopes.clear();
    g_running = running_ = true;
  }
  // Outside the lock: CUPTI may deliver a buffer from inside its own calls.
  if (!g_callbacks_registered) {
    PRECIS_CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "kernel trace");
    g_callbacks_registered = true;
  }
  for (CUpti_ActivityKind kind : kKinds) PRECIS_CUPTI_CHECK(cuptiActivityEnable(kind), "kernel trace");
  precis::cuda::pause_dependent_launch(true);  // each kernel timed alone (core/cuda/runtime.h)
}

std::vector<GpuActivity> KernelTrace::stop() {
  PRECIS_CHECK(running_, "kernel trace: stop() without start()");
  running_ = false;
  precis::cuda::pause_dependent_launch(false);
  PRECIS_CUDA_CHECK(cudaDeviceSynchronize(), "kernel trace");
  PRECIS_CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "kernel trace");
  for (CUpti_ActivityKind kind : kKinds) PRECIS_CUPTI_CHECK(cuptiActivityDisable(kind), "kernel trace");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_running = false;
  std::vector<GpuActivity> out = std::move(g_records);
  g_records.clear();
  for (size_t i = 0; i < out.size(); ++i) {
    auto scope = g_scopes.find(g_correlations[i]);
    if (scope != g_scopes.end()) out[i].scope = scope->second;
  }
  g_correlations.clear();
  g_scopes.clear();
  // CUPTI's ids of this device's two streams (the ids its records carry).
  int device = 0;
  PRECIS_CUDA_CHECK(cudaGetDevice(&device), "kernel trace");
  uint32_t compute = 0, communication = 0;
  PRECIS_CUPTI_CHECK(cuptiGetStreamIdEx(nullptr, precis::cuda::compute_stream(Device::cuda(device)), 0, &compute),
                     "kernel trace stream ids");
  PRECIS_CUPTI_CHECK(cuptiGetStreamIdEx(nullptr, precis::cuda::comm_stream(Device::cuda(device)), 0, &communication),
                     "kernel trace stream ids");
  for (GpuActivity& a : out)
    a.role = a.stream == compute         ? GpuActivity::Stream::compute
             : a.stream == communication ? GpuActivity::Stream::communication
                                         : GpuActivity::Stream::other;
  std::sort(out.begin(), out.end(), [](const GpuActivity& a, const GpuActivity& b) { return a.start_ns < b.start_ns; });
  return out;
}

int64_t KernelTrace::now_ns() {
  uint64_t timestamp = 0;
  PRECIS_CUPTI_CHECK(cuptiGetTimestamp(&timestamp), "kernel trace clock");
  return static_cast<int64_t>(timestamp);
}

void KernelTrace::push_scope(int64_t id) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_running) return;
  }
  PRECIS_CUPTI_CHECK(cuptiActivityPushExternalCorrelationId(kScopeKind, static_cast<uint64_t>(id)),
                     "kernel trace scope");
}

void KernelTrace::pop_scope() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_running) return;
  }
  uint64_t last = 0;
  PRECIS_CUPTI_CHECK(cuptiActivityPopExternalCorrelationId(kScopeKind, &last), "kernel trace scope");
}

}  // namespace precis

#endif  // PRECIS_WITH_CUPTI
