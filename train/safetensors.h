// safetensors (https://github.com/huggingface/safetensors): the file format of
// Hugging Face checkpoints, so other tools read our weights and we read theirs.
//
//   [8 bytes: N, little-endian u64][N bytes: JSON header][tensor data]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (byte offsets into the data section) and may hold "__metadata__", a
// string-to-string map. Tensors are stored contiguous, row-major, little-endian,
// and together cover the data section exactly.
//
// Files written here also carry a CRC-32C of each tensor's bytes (core/crc32c.h) in the
// metadata, under "precis.crc32c" (a JSON object: tensor name -> 8 hex digits). Other tools
// ignore it; read_safetensors verifies it when present, so a flipped byte in a checkpoint
// is an error naming the file and the tensor, not a silently different model. The key is
// not among the metadata returned.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "nn/module.h"

namespace precis::train {

using SafetensorsMetadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  std::vector<nn::NamedTensor> tensors;  // on the CPU, in the header's order
  SafetensorsMetadata metadata;
};

// Writes `tensors` (any device, any strides: they are copied to the host) in the
// given order. The bytes go to `path + ".tmp"`, are flushed and fsync'ed, and the
// file is then renamed over `path`, so a crash or an error never leaves a partial
// file at `path`: it holds either the old contents or the new ones.
void write_safetensors(const std::string& path, const std::vector<nn::NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata = {});

// Reads and validates a whole file. Errors (precis::Error) name the file and the problem.
SafetensorsFile read_safetensors(const std::string& path);

// Reads and validates only the header, returning the metadata (no tensor data is read).
SafetensorsMetadata read_safetensors_metadata(const std::string& path);

}  // namespace precis::train
