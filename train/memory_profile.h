// Memory over a profiled step (docs/profiling.md): the allocator's allocated and
// reserved bytes at every op's start and end (reserved - allocated: what its cache
// holds free, the fragmentation), the owners of the step's peak, the allocator's
// statistics over the step, and a plot.
//
// The owners of the peak: parameters, their gradients and the optimizer's state (their
// sizes known from the model and the optimizer); what else was live when the step began
// (library workspaces such as cuBLASLt's, the batch buffers, cached casts: "workspace,
// buffers"); and what the step allocated above that at its peak (saved activations and
// temporaries: "activations"). The five sum to the allocator's peak.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/op_profile.h"

namespace precis::nn {
class Module;
}
namespace precis::optim {
class Optimizer;
}

namespace precis::train {

// The bytes of the long-lived tensors a step's memory is made of. `registered`: the part of
// `parameters` that lives outside the device allocator (ZeRO-1's flat parameter buffer in
// NCCL-registered memory, train::Trainer::registered_memory_bytes), so not in its peak.
struct MemoryOwners {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;
  int64_t registered = 0;
};
// `grad_dtype`: the precision policy's gradient dtype for f16/bf16 parameters (nn::flat_grad_dtype).
MemoryOwners memory_owners(const nn::Module& model, const optim::Optimizer& optimizer, DType grad_dtype);

struct MemoryBreakdown {
  int64_t peak = 0;  // the allocator's peak of live bytes in the step
  // parameters: those in the allocator (MemoryOwners::parameters less `registered`, which
  // stays outside the peak).
  int64_t parameters = 0, gradients = 0, optimizer_state = 0, workspace = 0, activations = 0;
  int64_t registered = 0;
  // The highest sample (at an op's start or end): where the peak falls, and the reserved bytes there.
  std::string peak_at;
  int64_t sampled_peak = 0, reserved_at_peak = 0;
  int64_t most_reserved = 0;  // over the step
};
MemoryBreakdown memory_breakdown(const StepMemory& memory, const MemoryOwners& owners);

// The breakdown of the last profiled step, the allocator's statistics over it, and the plot
// of allocated and reserved bytes over its time written to `svg_path` (its path printed).
void print_memory_profile(std::ostream& out, const std::vector<ProfiledStep>& steps, const MemoryOwners& owners,
                          const std::string& svg_path);

}  // namespace precis::train
