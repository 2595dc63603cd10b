// The safetensors reader on arbitrary bytes: a file reads (every tensor within the file and
// matching its checksum when it has one) or is a precis::Error naming the problem.
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "fuzz_file.h"
#include "train/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz_input_file(data, size, ".safetensors");
  try {
    precis::train::SafetensorsFile file = precis::train::read_safetensors(path);
    for (const auto& [name, t] : file.tensors)
      if (t.nbytes() > size) std::abort();  // a tensor larger than the file it came from
  } catch (const precis::Error&) {
  }
  try {
    precis::train::read_safetensors_metadata(path);
  } catch (const precis::Error&) {
  }
  return 0;
}
