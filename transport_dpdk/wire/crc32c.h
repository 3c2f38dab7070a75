// crc32c.h — CRC32C (Castagnoli) for packet integrity. Uses the SSE4.2
// instruction when the CPU has it, a table otherwise (chosen at run time).
#pragma once

#include <cstddef>
#include <cstdint>

namespace optireduce {
namespace transport {

// Extends crc (initially 0) over data[0..n).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) {
  return Crc32cExtend(0, data, n);
}

}  // namespace transport
}  // namespace optireduce
