// The `make demo` configuration (examples/configs/shakespeare-char.yaml) on the CPU, for the
// end-to-end precision tests: its own out_dir under the temp folder (emptied first), no sample.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "train/config.h"

namespace precis::test {

// The CPU unless `overrides` name a device (a later override wins).
inline train::TrainConfig demo_config(const std::string& name, std::vector<std::string> overrides) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("precis_precision_" + name);
  std::filesystem::remove_all(dir);
  overrides.insert(overrides.begin(), "device=cpu");
  overrides.push_back("out_dir=" + dir.string());
  overrides.push_back("sample.tokens=0");
  return train::load_config("examples/configs/shakespeare-char.yaml", overrides);
}

}  // namespace precis::test
