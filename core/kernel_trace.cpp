// The parts of core/kernel_trace.h that need no CUPTI, and the stand-in used
// when the build has none (core/cuda/kernel_trace.cpp is the real one).
#include "core/kernel_trace.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace precis {

const char* activity_kind_name(GpuActivity::Kind kind) {
  switch (kind) {
    case GpuActivity::Kind::kernel:
      return "kernel";
    case GpuActivity::Kind::memcpy:
      return "memcpy";
    case GpuActivity::Kind::memset:
      return "memset";
  }
  return "?";
}

const char* stream_role_name(GpuActivity::Stream role) {
  switch (role) {
    case GpuActivity::Stream::compute:
      return "compute";
    case GpuActivity::Stream::communication:
      return "communication";
    case GpuActivity::Stream::other:
      return "other";
  }
  return "?";
}

std::string demangle(const char* symbol) {
  if (!symbol) return "";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> plain(abi::__cxa_demangle(symbol, nullptr, nullptr, &status), std::free);
  return status == 0 && plain ? std::string(plain.get()) : std::string(symbol);
}

#if !PRECIS_WITH_CUPTI

bool kernel_trace_available() { return false; }

std::string kernel_trace_unavailable_reason() {
#if PRECIS_WITH_CUDA
  return "this build of Precis has no CUPTI (cupti.h and libcupti were not found when it was configured; they ship "
         "with the CUDA toolkit, under extras/CUPTI on some installs), so it cannot record GPU kernels";
#else
  return "this build of Precis has no CUDA backend, so it has no CUPTI to record GPU kernels with";
#endif
}

KernelTrace::~KernelTrace() = default;
void KernelTrace::start() { PRECIS_FAIL("kernel trace: ", kernel_trace_unavailable_reason()); }
std::vector<GpuActivity> KernelTrace::stop() { return {}; }
int64_t KernelTrace::now_ns() { return 0; }
void KernelTrace::push_scope(int64_t) {}
void KernelTrace::pop_scope() {}

#endif

}  // namespace precis
