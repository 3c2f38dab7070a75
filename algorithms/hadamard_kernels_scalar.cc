// Portable scalar Hadamard kernel: the reference every SIMD kernel must match, the fallback
// on CPUs without AVX2, and the path for blocks smaller than one SIMD vector.
#include "algorithms/internal/hadamard_kernels.h"

namespace optireduce {
namespace hadamard {
namespace internal {
namespace {

// Stages below this many bytes run chunk by chunk so the chunk stays in L1; the order of
// operations per element is unchanged (stage h only mixes elements within 2h).
constexpr int kChunkLog2Bytes = 14;

// Stages [first_log2h, end_log2h): two at a time (radix 4: half the passes over the data),
// computing exactly what two radix-2 stages compute, in the same order.
template <typename T>
void Stages(T* x, size_t n, int first_log2h, int end_log2h) {
  int s = first_log2h;
  for (; s + 1 < end_log2h; s += 2) {
    const size_t h = size_t{1} << s;
    for (size_t j = 0; j < n; j += 4 * h) {
      for (size_t i = j; i < j + h; ++i) {
        const T a = x[i], b = x[i + h], c = x[i + 2 * h], d = x[i + 3 * h];
        const T ab = a + b, a_b = a - b, cd = c + d, c_d = c - d;
        x[i] = ab + cd;
        x[i + h] = a_b + c_d;
        x[i + 2 * h] = ab - cd;
        x[i + 3 * h] = a_b - c_d;
      }
    }
  }
  if (s < end_log2h) {
    const size_t h = size_t{1} << s;
    for (size_t j = 0; j < n; j += 2 * h) {
      for (size_t i = j; i < j + h; ++i) {
        const T a = x[i];
        const T b = x[i + h];
        x[i] = a + b;
        x[i + h] = a - b;
      }
    }
  }
}

// x[i] *= (sign bit set ? -scale : scale), or only the scale when with_signs is false.
template <typename T>
void ApplyFactor(T* x, size_t n, uint64_t seed, uint64_t offset, T scale, bool with_signs) {
  for (size_t base = 0; base < n; base += 64) {
    const int count = n - base < 64 ? static_cast<int>(n - base) : 64;
    const uint64_t bits = with_signs ? SignBits(seed, offset + base, count) : 0;
    const T factor[2] = {scale, -scale};  // indexed by the sign bit: no branch to mispredict
    for (int i = 0; i < count; ++i) x[base + i] *= factor[(bits >> i) & 1];
  }
}

template <typename T>
void TransformBlock(T* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  const size_t n = size_t{1} << log2n;
  const bool forward = dir == Direction::kForward;
  ApplyFactor(x, n, seed, offset, BlockScale<T>(log2n), forward);
  const int chunk_log2 = kChunkLog2Bytes - (sizeof(T) == 8 ? 3 : 2);
  if (log2n > chunk_log2) {
    const size_t chunk = size_t{1} << chunk_log2;
    for (size_t c = 0; c < n; c += chunk) Stages(x + c, chunk, 0, chunk_log2);
    Stages(x, n, chunk_log2, log2n);
  } else {
    Stages(x, n, 0, log2n);
  }
  if (!forward) ApplyFactor(x, n, seed, offset, T(1), true);
}

}  // namespace

void TransformBlockScalar(float* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  TransformBlock(x, log2n, seed, offset, dir);
}
void TransformBlockScalar(double* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  TransformBlock(x, log2n, seed, offset, dir);
}

}  // namespace internal
}  // namespace hadamard
}  // namespace optireduce
