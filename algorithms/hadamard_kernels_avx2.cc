// AVX2 + FMA Hadamard kernel (8 floats / 4 doubles per vector, radix-8 passes: 8 data
// vectors plus constants fit the 16 ymm registers).
#include "algorithms/internal/hadamard_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma")

#include "algorithms/internal/hadamard_simd.h"

namespace optireduce {
namespace hadamard {
namespace internal {
namespace {

// One butterfly stage inside a vector: out = v * (+1 low half / -1 high half) + swapped(v)
// gives a + b in the low lane and a - b in the high lane, exactly (the product is exact).
struct Avx2Float {
  using Scalar = float;
  using Vec = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kLog2Lanes = 3;
  static constexpr int kMaxRadixLog2 = 3;
  static Vec Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec Add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec Sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec Mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec Set1(float s) { return _mm256_set1_ps(s); }
  static Vec Factor(uint64_t bits, float s) {
    // Shift lane i's bit into the lane's top bit: blendv only looks at that bit.
    const __m256i to_top = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
    const __m256i negate = _mm256_sllv_epi32(_mm256_set1_epi32(static_cast<int>(bits)), to_top);
    return _mm256_blendv_ps(_mm256_set1_ps(s), _mm256_set1_ps(-s), _mm256_castsi256_ps(negate));
  }
  static Vec InRegisterStages(Vec v) {
    const Vec s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const Vec s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const Vec s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    v = _mm256_fmadd_ps(v, s1, _mm256_permute_ps(v, 0xB1));
    v = _mm256_fmadd_ps(v, s2, _mm256_permute_ps(v, 0x4E));
    v = _mm256_fmadd_ps(v, s4, _mm256_permute2f128_ps(v, v, 0x01));
    return v;
  }
};

struct Avx2Double {
  using Scalar = double;
  using Vec = __m256d;
  static constexpr int kLanes = 4;
  static constexpr int kLog2Lanes = 2;
  static constexpr int kMaxRadixLog2 = 3;
  static Vec Load(const double* p) { return _mm256_loadu_pd(p); }
  static void Store(double* p, Vec v) { _mm256_storeu_pd(p, v); }
  static Vec Add(Vec a, Vec b) { return _mm256_add_pd(a, b); }
  static Vec Sub(Vec a, Vec b) { return _mm256_sub_pd(a, b); }
  static Vec Mul(Vec a, Vec b) { return _mm256_mul_pd(a, b); }
  static Vec Set1(double s) { return _mm256_set1_pd(s); }
  static Vec Factor(uint64_t bits, double s) {
    const __m256i to_top = _mm256_setr_epi64x(63, 62, 61, 60);
    const __m256i negate =
        _mm256_sllv_epi64(_mm256_set1_epi64x(static_cast<long long>(bits)), to_top);
    return _mm256_blendv_pd(_mm256_set1_pd(s), _mm256_set1_pd(-s), _mm256_castsi256_pd(negate));
  }
  static Vec InRegisterStages(Vec v) {
    const Vec s1 = _mm256_setr_pd(1, -1, 1, -1);
    const Vec s2 = _mm256_setr_pd(1, 1, -1, -1);
    v = _mm256_fmadd_pd(v, s1, _mm256_permute_pd(v, 0x5));
    v = _mm256_fmadd_pd(v, s2, _mm256_permute2f128_pd(v, v, 0x01));
    return v;
  }
};

}  // namespace

void TransformBlockAvx2(float* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  SimdHadamard<Avx2Float>::TransformBlock(x, log2n, seed, offset, dir);
}
void TransformBlockAvx2(double* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  SimdHadamard<Avx2Double>::TransformBlock(x, log2n, seed, offset, dir);
}

}  // namespace internal
}  // namespace hadamard
}  // namespace optireduce

#pragma GCC pop_options

#else  // not x86: never selected (KernelSupported is false), defined so the library links.

namespace optireduce {
namespace hadamard {
namespace internal {
void TransformBlockAvx2(float* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  TransformBlockScalar(x, log2n, seed, offset, dir);
}
void TransformBlockAvx2(double* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  TransformBlockScalar(x, log2n, seed, offset, dir);
}
}  // namespace internal
}  // namespace hadamard
}  // namespace optireduce

#endif
