#include "nn/parameter_gate.h"

namespace precis::nn {

namespace {
thread_local ParameterGate t_gate;
}

void set_parameter_gate(ParameterGate gate) { t_gate = std::move(gate); }

void gate_parameters(const Module& module) {
  if (t_gate) t_gate(module);
}

}  // namespace precis::nn
