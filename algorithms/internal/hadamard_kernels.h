// Internal: the per-block entry points of the Hadamard kernels and the pieces every kernel
// must compute identically (sign bits, scale) so that all kernels agree bit for bit.
//
// Every kernel performs, for one block of 2^log2n elements starting at global element
// index `offset` (a multiple of 2^log2n):
//   forward: x <- (±s) * x  (sign from SignWord, s = BlockScale), then stages h = 1, 2, 4, ...
//   inverse: x <- s * x, then stages h = 1, 2, 4, ..., then x <- (±1) * x
// where stage h maps (a, b) = (x[i], x[i+h]) to (a + b, a - b). Keeping this exact order of
// floating-point operations (and no FMA contraction: see algorithms/CMakeLists.txt) makes
// SIMD and scalar results identical, which the tests check.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "algorithms/internal/splitmix64.h"

namespace optireduce {
namespace hadamard {
namespace internal {

enum class Direction { kForward, kInverse };

using ::optireduce::internal::kSplitMix64Gamma;
using ::optireduce::internal::Mix64;

// 64 sign bits (1 = negate) for elements [64 * word_index, 64 * word_index + 64). One
// splitmix64 step per 64 elements: the signs cost almost nothing next to the butterflies.
inline uint64_t SignWord(uint64_t seed, uint64_t word_index) {
  return Mix64(seed + (word_index + 1) * kSplitMix64Gamma);
}

// The sign bits of `count` (<= 64, dividing 64) consecutive elements starting at `index`,
// where index is a multiple of count (blocks are aligned to their size).
inline uint64_t SignBits(uint64_t seed, uint64_t index, int count) {
  const uint64_t word = SignWord(seed, index >> 6);
  const uint64_t mask = count == 64 ? ~0ULL : ((1ULL << count) - 1);
  return (word >> (index & 63)) & mask;
}

// Orthonormal scale of a 2^log2n block, computed the same way for every kernel.
template <typename T>
inline T BlockScale(int log2n) {
  return static_cast<T>(1.0 / std::sqrt(static_cast<double>(1ULL << log2n)));
}

// Per-kernel block transforms. The SIMD kernels hand blocks smaller than one vector to the
// scalar kernel. A kernel that was not compiled in (non-x86 build) is never called.
void TransformBlockScalar(float* x, int log2n, uint64_t seed, uint64_t offset, Direction dir);
void TransformBlockScalar(double* x, int log2n, uint64_t seed, uint64_t offset, Direction dir);
void TransformBlockAvx2(float* x, int log2n, uint64_t seed, uint64_t offset, Direction dir);
void TransformBlockAvx2(double* x, int log2n, uint64_t seed, uint64_t offset, Direction dir);
void TransformBlockAvx512(float* x, int log2n, uint64_t seed, uint64_t offset, Direction dir);
void TransformBlockAvx512(double* x, int log2n, uint64_t seed, uint64_t offset, Direction dir);

}  // namespace internal
}  // namespace hadamard
}  // namespace optireduce
