// Parameter gate: a hook a model's forward calls with each module (an embedding, a block, a
// norm, a classifier) just before it reads that module's parameters, so parameters that are
// still arriving can be waited for as late as possible: ZeRO-1 with
// distributed.gather_overlap (distributed/zero.h) all-gathers the updated parameters behind
// the next step's forward, bucket by bucket, and its gate makes the compute stream wait for
// the buckets of the module about to run (docs/distributed.md, "ZeRO-1").
//
// The gate is given the module and must make its parameters and its descendants' ready for
// the work queued after it; it is called again for the same module (micro-batches, a tied
// weight read twice) and must then be cheap. Models call gate_parameters at the granularity
// they read parameters: GPT-2 per embedding, block, final norm and head; the ResNets per stem,
// residual block and classifier. With no gate set (every run but ZeRO-1's gather_overlap, and
// every forward outside a training step) gate_parameters only tests an empty function.
#pragma once

#include <functional>

namespace precis::nn {

class Module;

using ParameterGate = std::function<void(const Module& module)>;

// Sets the gate for this thread (an empty function clears it).
void set_parameter_gate(ParameterGate gate);
// Calls the gate with `module`, if one is set.
void gate_parameters(const Module& module);

// Sets a gate for a scope and clears it at its end.
class ParameterGateScope {
 public:
  explicit ParameterGateScope(ParameterGate gate) { set_parameter_gate(std::move(gate)); }
  ~ParameterGateScope() { set_parameter_gate(nullptr); }
  ParameterGateScope(const ParameterGateScope&) = delete;
  ParameterGateScope& operator=(const ParameterGateScope&) = delete;
};

}  // namespace precis::nn
