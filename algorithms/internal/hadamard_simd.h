// Internal: the vector Hadamard algorithm, written once over a small "vector traits" type
// (VT) and instantiated by hadamard_kernels_avx2.cc and hadamard_kernels_avx512.cc. Include
// it only after `#pragma GCC target(...)` so the code is compiled for that instruction set;
// everything here has internal linkage, so no AVX code can leak into another translation
// unit through a shared inline symbol.
//
// VT provides: Scalar, Vec, kLanes, kLog2Lanes, kMaxRadixLog2 (cross-vector stages per
// pass, bounded by the register file), Load, Store, Add, Sub, Mul, Set1,
// Factor(sign_bits, s) (per lane: bit set ? -s : s) and InRegisterStages(v) (stages
// h = 1 .. kLanes/2 inside one vector with permutes; exact same arithmetic as scalar).
//
// Pass structure for a block of n = 2^L elements (order of stages per element unchanged):
//   for each L1-sized chunk: first pass = signs/scale + in-register stages + up to
//     kMaxRadixLog2 cross-vector stages on 2^r consecutive vectors; then radix passes
//     (2^r vectors at stride h, r stages in registers) until the chunk is done;
//   then radix passes over the whole block for the strides larger than a chunk.
// The inverse's sign flip is folded into whichever pass does the last stage.
#pragma once

#include "algorithms/internal/hadamard_kernels.h"

namespace optireduce {
namespace hadamard {
namespace internal {
namespace {

// Not std::min: standard-library templates instantiated under the target pragma would be
// shared (COMDAT) symbols carrying AVX code into other translation units.
inline int MinInt(int a, int b) { return a < b ? a : b; }

template <class VT>
class SimdHadamard {
 public:
  using T = typename VT::Scalar;
  using V = typename VT::Vec;
  static constexpr int kLanes = VT::kLanes;
  static constexpr int kLog2Lanes = VT::kLog2Lanes;
  static constexpr int kMaxRadixLog2 = VT::kMaxRadixLog2;
  static constexpr uint64_t kLaneMask = (uint64_t{1} << kLanes) - 1;
  // 16 KiB chunks: half of a 32 KiB L1d, leaving room for the streams of the next chunk.
  static constexpr int kChunkLog2 = 14 - (sizeof(T) == 8 ? 3 : 2);

  // Strides of a chunk (16 KiB) or more put every stream of a radix pass in the same L1 set
  // (set stride 4 KiB); more streams than the L1's 8 ways would evict lines between their
  // load and store. Measured (AVX-512, 2^16..2^18 blocks): radix 8 beats 4 and 16 here.
  static constexpr int kCrossRadixLog2 = kMaxRadixLog2 < 3 ? kMaxRadixLog2 : 3;

  static void TransformBlock(T* x, int log2n, uint64_t seed, uint64_t offset, Direction dir) {
    if (log2n < kLog2Lanes) {
      TransformBlockScalar(x, log2n, seed, offset, dir);
      return;
    }
    const bool inverse = dir == Direction::kInverse;
    const T scale = BlockScale<T>(log2n);
    const size_t n = size_t{1} << log2n;
    const int chunk_log2 = MinInt(log2n, kChunkLog2);
    const size_t chunk = size_t{1} << chunk_log2;
    for (size_t c = 0; c < n; c += chunk) {
      int s = kLog2Lanes;
      int r = MinInt(kMaxRadixLog2, chunk_log2 - s);
      FirstPass(r, x + c, chunk, seed, offset + c, scale, !inverse, inverse && s + r == log2n);
      for (s += r; s < chunk_log2; s += r) {
        r = MinInt(kMaxRadixLog2, chunk_log2 - s);
        RadixPass(r, x + c, chunk, s, seed, offset + c, inverse && s + r == log2n);
      }
    }
    for (int s = chunk_log2, r = 0; s < log2n; s += r) {
      r = MinInt(kCrossRadixLog2, log2n - s);
      RadixPass(r, x, n, s, seed, offset, inverse && s + r == log2n);
    }
  }

 private:
  static V SignFactor(uint64_t seed, uint64_t index, T s) {
    return VT::Factor(SignBits(seed, index, kLanes), s);
  }

  // Stages h = kLanes, 2 kLanes, ..., 2^(r-1) kLanes across the 2^r vectors in v.
  template <int r>
  static inline void Butterflies(V* v) {
#pragma GCC unroll 16
    for (int s = 0; s < r; ++s) {
      const int d = 1 << s;
#pragma GCC unroll 16
      for (int m = 0; m < (1 << r); ++m) {
        if (m & d) continue;
        const V a = v[m];
        const V b = v[m + d];
        v[m] = VT::Add(a, b);
        v[m + d] = VT::Sub(a, b);
      }
    }
  }

  template <int r>
  static void FirstPassR(T* x, size_t len, uint64_t seed, uint64_t offset, T scale,
                         bool pre_signs, bool post_signs) {
    const V plain = VT::Set1(scale);
    for (size_t j = 0; j < len; j += size_t{kLanes} << r) {
      V v[1 << r];
      uint64_t word = 0;
#pragma GCC unroll 16
      for (int m = 0; m < (1 << r); ++m) {
        const size_t i = j + size_t{kLanes} * m;
        V f = plain;
        if (pre_signs) {
          // One splitmix64 per 64 elements: groups start 64-aligned when they span >= 64
          // elements, and lie inside one 64-element word otherwise.
          if (m == 0 || (kLanes * m) % 64 == 0) word = SignWord(seed, (offset + i) >> 6);
          f = VT::Factor((word >> ((offset + i) & 63)) & kLaneMask, scale);
        }
        v[m] = VT::InRegisterStages(VT::Mul(VT::Load(x + i), f));
      }
      Butterflies<r>(v);
#pragma GCC unroll 16
      for (int m = 0; m < (1 << r); ++m) {
        const size_t i = j + size_t{kLanes} * m;
        if (post_signs) v[m] = VT::Mul(v[m], SignFactor(seed, offset + i, T(1)));
        VT::Store(x + i, v[m]);
      }
    }
  }

  template <int r>
  static void RadixPassR(T* x, size_t len, int log2h, uint64_t seed, uint64_t offset,
                         bool post_signs) {
    const size_t h = size_t{1} << log2h;
    for (size_t j = 0; j < len; j += h << r) {
      for (size_t k = j; k < j + h; k += kLanes) {
        V v[1 << r];
#pragma GCC unroll 16
        for (int m = 0; m < (1 << r); ++m) v[m] = VT::Load(x + k + h * m);
        Butterflies<r>(v);
#pragma GCC unroll 16
        for (int m = 0; m < (1 << r); ++m) {
          const size_t i = k + h * m;
          if (post_signs) v[m] = VT::Mul(v[m], SignFactor(seed, offset + i, T(1)));
          VT::Store(x + i, v[m]);
        }
      }
    }
  }

  static void FirstPass(int r, T* x, size_t len, uint64_t seed, uint64_t offset, T scale,
                        bool pre_signs, bool post_signs) {
    switch (r) {
      case 0: return FirstPassR<0>(x, len, seed, offset, scale, pre_signs, post_signs);
      case 1: return FirstPassR<1>(x, len, seed, offset, scale, pre_signs, post_signs);
      case 2: return FirstPassR<2>(x, len, seed, offset, scale, pre_signs, post_signs);
      case 3: return FirstPassR<3>(x, len, seed, offset, scale, pre_signs, post_signs);
      default:
        if constexpr (kMaxRadixLog2 >= 4) {
          return FirstPassR<4>(x, len, seed, offset, scale, pre_signs, post_signs);
        }
    }
  }

  static void RadixPass(int r, T* x, size_t len, int log2h, uint64_t seed, uint64_t offset,
                        bool post_signs) {
    switch (r) {
      case 1: return RadixPassR<1>(x, len, log2h, seed, offset, post_signs);
      case 2: return RadixPassR<2>(x, len, log2h, seed, offset, post_signs);
      case 3: return RadixPassR<3>(x, len, log2h, seed, offset, post_signs);
      default:
        if constexpr (kMaxRadixLog2 >= 4) {
          return RadixPassR<4>(x, len, log2h, seed, offset, post_signs);
        }
    }
  }
};

}  // namespace
}  // namespace internal
}  // namespace hadamard
}  // namespace optireduce
