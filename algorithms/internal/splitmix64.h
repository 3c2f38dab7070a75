// splitmix64, the one 64-bit mixer of algorithms/: Hadamard signs and per-operation seeds
// (hadamard_kernels.h, hadamard.cc) and bounded operation ids (bounded_transpose.cc).
#pragma once

#include <cstdint>

namespace optireduce {
namespace internal {

// splitmix64's increment (2^64 / golden ratio, odd).
constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ULL;

// splitmix64's output function: a bijection on 64 bits with good avalanche.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// One splitmix64 step from state x: the output for state x + gamma.
inline uint64_t SplitMix64(uint64_t x) { return Mix64(x + kSplitMix64Gamma); }

}  // namespace internal
}  // namespace optireduce
