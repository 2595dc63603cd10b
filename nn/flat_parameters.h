// Flat parameter and gradient buffers (DESIGN.md section 4).
//
// flatten_parameters(model, device) packs every parameter of `model` into one
// contiguous buffer per dtype on `device` and rebinds each parameter to a view
// of it (the module's Tensor handles see the change, since they share the
// TensorImpl). Gradients get a matching buffer, so after backward all gradients
// of a dtype are one dense range: the fused optimizer, the global grad norm,
// DDP buckets and checkpoints work on slices of it. It is also how a model
// moves to a device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace precis::nn {

struct FlatSlot {
  std::string name;  // dotted parameter name
  Tensor param;      // the parameter (a view into FlatBuffer::data)
  int64_t offset;    // in elements, within the buffer
  int64_t numel;
  bool weight_decay;
};

struct FlatBuffer {
  DType dtype;
  Tensor data;  // 1-D, all parameters of this dtype
  Tensor grad;  // 1-D, their gradients, same layout
  std::vector<FlatSlot> slots;
};

class FlatParameters {
 public:
  std::vector<FlatBuffer>& buffers() { return buffers_; }
  const std::vector<FlatBuffer>& buffers() const { return buffers_; }
  Device device() const { return device_; }
  int64_t numel() const;
  // Fills every gradient buffer with zeros (one fill per dtype).
  void zero_grad();

 private:
  friend std::shared_ptr<FlatParameters> flatten_parameters(Module&, Device);
  std::vector<FlatBuffer> buffers_;
  Device device_;
};

// Each parameter starts on a 64-byte boundary, so vector loads never straddle two.
inline constexpr size_t kFlatAlignmentBytes = 64;

std::shared_ptr<FlatParameters> flatten_parameters(Module& model, Device device = Device::cpu());

}  // namespace precis::nn
