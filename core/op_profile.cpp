#include "core/op_profile.h"

#include "core/error.h"
#include "core/pinned.h"

#if PRECIS_WITH_CUDA
#include "core/cuda/profiler_events.h"
#endif

namespace precis {

namespace {

// The scopes of this thread: the recording profile, how deep the open scopes nest, and the
// outermost forward op (its name and its backward cost, until a node takes it).
struct ScopeState {
  OpProfile* profile = nullptr;
  int depth = 0;
  const char* forward_op = nullptr;
  OpCost backward;
  bool backward_taken = false;
};
thread_local ScopeState t_scopes;

}  // namespace

#if PRECIS_WITH_CUDA
struct OpProfile::GpuEvents : cuda::PhaseEvents {
  using cuda::PhaseEvents::PhaseEvents;
};
#else
struct OpProfile::GpuEvents {};
#endif

const char* op_pass_name(OpPass pass) {
  switch (pass) {
    case OpPass::forward:
      return "fwd";
    case OpPass::backward:
      return "bwd";
    case OpPass::step:
      return "step";
  }
  return "?";
}

OpProfile::OpProfile(Device device, bool trace_kernels) : device_(device) {
#if PRECIS_WITH_CUDA
  if (device.is_cuda()) gpu_ = std::make_unique<GpuEvents>(device);
#endif
  if (trace_kernels && device.is_cuda() && kernel_trace_available()) kernels_ = std::make_unique<KernelTrace>();
}

OpProfile::~OpProfile() {
  if (t_scopes.profile == this) t_scopes = ScopeState{};
}

void OpProfile::begin_step() {
  PRECIS_CHECK(t_scopes.profile == nullptr, "OpProfile::begin_step: a profile already records on this thread");
  synchronize(device_);  // the previous step's work stays out of this one
  t_scopes = ScopeState{};
  t_scopes.profile = this;
  steps_.emplace_back();
  if (kernels_) {
    kernels_->start();
    steps_.back().traced = true;
    steps_.back().start_ns = KernelTrace::now_ns();
  }
  step_start_ = Clock::now();
  Allocator& allocator = allocator_for(device_);
  allocator.reset_peak();  // the step's own peak
  steps_.back().memory.start = allocator.stats();
  sample_memory("step <");
}

void OpProfile::sample_memory(std::string at) {
  const AllocatorStats s = allocator_for(device_).stats();
  steps_.back().memory.samples.push_back({std::chrono::duration<double, std::milli>(Clock::now() - step_start_).count(),
                                          static_cast<int64_t>(s.allocated_bytes),
                                          static_cast<int64_t>(s.reserved_bytes), std::move(at)});
}

void OpProfile::end_step() {
  PRECIS_CHECK(t_scopes.profile == this && t_scopes.depth == 0, "OpProfile::end_step without begin_step");
  synchronize(device_);
  sample_memory("step >");
  ProfiledStep& step = steps_.back();
  step.memory.end = allocator_for(device_).stats();
  step.memory.peak = static_cast<int64_t>(step.memory.end.peak_bytes);
  step.ms = std::chrono::duration<double, std::milli>(Clock::now() - step_start_).count();
  t_scopes = ScopeState{};
  if (kernels_) {
    step.end_ns = KernelTrace::now_ns();
    step.activities = kernels_->stop();
  }
#if PRECIS_WITH_CUDA
  if (gpu_) {
    // The events resolve in the order the ops began, the order of the samples.
    std::vector<std::pair<std::string, double>> times = gpu_->resolve();
    PRECIS_CHECK(times.size() == step.ops.size(), "OpProfile: ", times.size(), " timed ops for ", step.ops.size(),
                 " samples");
    for (size_t i = 0; i < times.size(); ++i) step.ops[i].ms = times[i].second;
  }
#endif
}

void OpProfile::begin_op(const char* op, OpPass pass, const OpCost& cost) {
  std::vector<OpSample>& ops = steps_.back().ops;
  if (kernels_) KernelTrace::push_scope(static_cast<int64_t>(ops.size()));
  ops.push_back({op, pass, cost, 0.0, 0.0});
  sample_memory(ops.back().op + " " + op_pass_name(pass) + " <");
#if PRECIS_WITH_CUDA
  if (gpu_) {
    gpu_->begin(op);
    return;
  }
#endif
  op_start_ = Clock::now();
  ops.back().start_ms = std::chrono::duration<double, std::milli>(op_start_ - step_start_).count();
}

void OpProfile::end_op() {
  OpSample& op = steps_.back().ops.back();
#if PRECIS_WITH_CUDA
  if (gpu_) {
    gpu_->end();
    if (kernels_) KernelTrace::pop_scope();
  }
#endif
  if (!gpu_) op.ms = std::chrono::duration<double, std::milli>(Clock::now() - op_start_).count();
  sample_memory(op.op + " " + op_pass_name(op.pass) + " >");  // after the op's clock: not in its time
}

bool OpScope::enter() {
  if (t_scopes.profile == nullptr) return false;
  entered_ = true;
  return ++t_scopes.depth == 1;
}

void OpScope::open(const char* op, OpPass pass, const OpCost& cost, const OpCost& backward) {
  timed_ = true;
  if (pass == OpPass::forward) {
    t_scopes.forward_op = op;
    t_scopes.backward = backward;
    t_scopes.backward_taken = false;
  }
  t_scopes.profile->begin_op(op, pass, cost);
}

OpScope::OpScope(const char* op, const OpCost& backward_cost) {
  if (enter()) open(op, OpPass::backward, backward_cost, {});
}

OpScope::~OpScope() {
  if (!entered_ || t_scopes.profile == nullptr) return;
  if (timed_) {
    t_scopes.profile->end_op();
    t_scopes.forward_op = nullptr;
  }
  --t_scopes.depth;
}

bool op_scope_label(const char** op, OpCost* backward_cost) {
  if (t_scopes.forward_op == nullptr) return false;
  *op = t_scopes.forward_op;
  *backward_cost = t_scopes.backward_taken ? OpCost{} : t_scopes.backward;
  t_scopes.backward_taken = true;
  return true;
}

}  // namespace precis
