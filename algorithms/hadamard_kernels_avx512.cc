// AVX-512F Hadamard kernel (16 floats / 8 doubles per vector, radix-16 passes: 16 data
// vectors plus constants fit the 32 zmm registers). Only AVX-512F instructions are used.
#include "algorithms/internal/hadamard_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f")
// GCC 12 flags the deliberately undefined source of _mm512_permute*/shuffle* intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "algorithms/internal/hadamard_simd.h"

namespace optireduce {
namespace hadamard {
namespace internal {
namespace {

// In-register stages: out = v * (+1 low / -1 high) + swapped(v), exact (see avx2 file).
struct Avx512Float {
  using Scalar = float;
  using Vec = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kLog2Lanes = 4;
  static constexpr int kMaxRadixLog2 = 4;
  static Vec Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec Add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec Sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec Mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec Set1(float s) { return _mm512_set1_ps(s); }
  static Vec Factor(uint64_t bits, float s) {
    return _mm512_mask_blend_ps(static_cast<__mmask16>(bits), _mm512_set1_ps(s),
                                _mm512_set1_ps(-s));
  }
  static Vec InRegisterStages(Vec v) {
    const Vec s1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
    const Vec s2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1);
    const Vec s4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1);
    const Vec s8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);
    v = _mm512_fmadd_ps(v, s1, _mm512_permute_ps(v, 0xB1));         // swap neighbours
    v = _mm512_fmadd_ps(v, s2, _mm512_permute_ps(v, 0x4E));         // swap pairs
    v = _mm512_fmadd_ps(v, s4, _mm512_shuffle_f32x4(v, v, 0xB1));   // swap 128-bit lanes
    v = _mm512_fmadd_ps(v, s8, _mm512_shuffle_f32x4(v, v, 0x4E));   // swap 256-bit halves
    return v;
  }
};

struct Avx512Double {
  using Scalar = double;
  using Vec = __m512d;
  static constexpr int kLanes = 8;
  static constexpr int kLog2Lanes = 3;
  static constexpr int kMaxRadixLog2 = 4;
  static Vec Load(const double* p) { return _mm512_loadu_pd(p); }
  static void Store(double* p, Vec v) { _mm512_storeu_pd(p, v); }
  static Vec Add(Vec a, Vec b) { return _mm512_add_pd(a, b); }
  static Vec Sub(Vec a, Vec b) { return _mm512_sub_pd(a, b); }
  static Vec Mul(Vec a, Vec b) { return _mm512_mul_pd(a, b); }
  static Vec Set1(double s) { return _mm512_set1_pd(s); }
  static Vec Factor(uint64_t bits, double s) {
    return _mm512_mask_blend_pd(static_cast<__mmask8>(bits), _mm512_set1_pd(s),
                                _mm512_set1_pd(-s));
  }
  static Vec InRegisterStages(Vec v) {
    const Vec s1 = _mm512_setr_pd(1, -1, 1, -1, 1, -1, 1, -1);
    const Vec s2 = _mm512_setr_pd(1, 1, -1, -1, 1, 1, -1, -1);
    const Vec s4 = _mm512_setr_pd(1, 1, 1, 1, -1, -1, -1, -1);
    v = _mm512_fmadd_pd(v, s1, _mm512_permute_pd(v, 0x55));         // swap neighbours
    v = _mm512_fmadd_pd(v, s2, _mm512_permutex_pd(v, 0x4E));        // swap pairs
    v = _mm512_fmadd_pd(v, s4, _mm512_shuffle_f64x2(v, v, 0x4E));   // swap 256-bit halves
    return v;
  }
};

}  // namespace

void TransformBlockAvx512(float* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  SimdHadamard<Avx512Float>::TransformBlock(x, log2n, seed, offset, dir);
}
void TransformBlockAvx512(double* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  SimdHadamard<Avx512Double>::TransformBlock(x, log2n, seed, offset, dir);
}

}  // namespace internal
}  // namespace hadamard
}  // namespace optireduce

#pragma GCC diagnostic pop
#pragma GCC pop_options

#else  // not x86: never selected (KernelSupported is false), defined so the library links.

namespace optireduce {
namespace hadamard {
namespace internal {
void TransformBlockAvx512(float* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  TransformBlockScalar(x, log2n, seed, offset, dir);
}
void TransformBlockAvx512(double* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
  TransformBlockScalar(x, log2n, seed, offset, dir);
}
}  // namespace internal
}  // namespace hadamard
}  // namespace optireduce

#endif
