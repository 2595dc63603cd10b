// Where a tensor lives: the CPU or one CUDA device.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace precis {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  // "cpu", "cuda", "cuda:1"
  static Device parse(const std::string& text);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;
  bool operator==(const Device&) const = default;
};

inline std::ostream& operator<<(std::ostream& out, const Device& d) { return out << d.str(); }

}  // namespace precis
