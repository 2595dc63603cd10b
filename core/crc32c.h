// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected: 0x82F63B78), the checksum of iSCSI,
// ext4 and Snappy frames: it catches every burst of up to 32 flipped bits and any odd number
// of them. Checkpoints store one per tensor (train/safetensors.h) and verify it on load.
#pragma once

#include <cstddef>
#include <cstdint>

namespace precis {

// The CRC-32C of `size` bytes, continuing from `crc` (the value of the bytes before them;
// 0 to start): crc32c(b, crc32c(a)) == crc32c(a followed by b).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace precis
