// The fuzz input as a file, for readers that take a path: one file per process (libFuzzer
// may run several jobs), rewritten for every input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

inline std::string fuzz_input_file(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string path = "/tmp/precis_fuzz_" + std::to_string(::getpid()) + suffix;
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, file) != size) std::abort();
  std::fclose(file);
  return path;
}
