// The YAML config reader on arbitrary text: every input is a config or a precis::Error (no
// crash, hang, leak or undefined behaviour), and an accepted config written back as its
// resolved YAML reads back into the same YAML (the file a run saves in its folder).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  precis::train::TrainConfig config;
  try {
    config = precis::train::parse_config(text, {}, "fuzz.yaml");
  } catch (const precis::Error&) {
    return 0;
  }
  const std::string resolved = precis::train::resolved_config_yaml(config);
  const std::string again = precis::train::resolved_config_yaml(precis::train::parse_config(resolved, {}, "resolved"));
  if (again != resolved) std::abort();  // the resolved config must be a fixed point
  return 0;
}
