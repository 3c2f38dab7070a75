// Public Hadamard entry points: argument checks, kernel selection and the block layout
// (full blocks, then the tail in descending power-of-two blocks). The butterflies live in
// hadamard_kernels_{scalar,avx2,avx512}.cc.
#include "algorithms/hadamard.h"

#include <stdexcept>
#include <string>

#include "algorithms/internal/hadamard_kernels.h"

namespace optireduce {
namespace hadamard {
namespace {

using internal::Direction;

struct CpuFeatures {
  bool avx2_fma = false;
  bool avx512f = false;
};

const CpuFeatures& Cpu() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();  // may run before libgcc's own constructor did
    f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.avx512f = __builtin_cpu_supports("avx512f");
#endif
    return f;
  }();
  return features;
}

template <typename T>
using BlockFn = void (*)(T*, int, uint64_t, uint64_t, Direction);

template <typename T>
BlockFn<T> SelectKernel(Kernel requested) {
  // An unsupported request falls back to the best kernel this CPU has, never a crash.
  const Kernel kernel = KernelSupported(requested) ? requested : BestKernel();
  switch (kernel) {
    case Kernel::kAvx512: return &internal::TransformBlockAvx512;
    case Kernel::kAvx2: return &internal::TransformBlockAvx2;
    case Kernel::kScalar: break;
  }
  return &internal::TransformBlockScalar;
}

template <typename T>
void Transform(T* data, size_t n, uint64_t seed, const Options& options, Direction dir) {
  const int log2_block = options.log2_block;
  if (log2_block < kMinLog2Block || log2_block > kMaxLog2Block) {
    throw std::invalid_argument("hadamard: log2_block " + std::to_string(log2_block) +
                                " is outside [" + std::to_string(kMinLog2Block) + ", " +
                                std::to_string(kMaxLog2Block) + "]");
  }
  if (n == 0) return;
  if (data == nullptr) {
    throw std::invalid_argument("hadamard: data is nullptr but n is " + std::to_string(n));
  }
  const BlockFn<T> block_fn = SelectKernel<T>(options.kernel);
  const size_t block = size_t{1} << log2_block;
  size_t offset = 0;
  for (; n - offset >= block; offset += block) {
    block_fn(data + offset, log2_block, seed, offset, dir);
  }
  // Tail: descending powers of two, so each piece starts at a multiple of its own size
  // (the kernels rely on that for their sign-bit lookup).
  const size_t tail = n - offset;
  for (int b = log2_block - 1; b >= 0; --b) {
    const size_t piece = size_t{1} << b;
    if (tail & piece) {
      block_fn(data + offset, b, seed, offset, dir);
      offset += piece;
    }
  }
}

}  // namespace

Kernel BestKernel() {
  if (Cpu().avx512f) return Kernel::kAvx512;
  if (Cpu().avx2_fma) return Kernel::kAvx2;
  return Kernel::kScalar;
}

const char* KernelName(Kernel kernel) {
  switch (kernel) {
    case Kernel::kScalar: return "scalar";
    case Kernel::kAvx2: return "avx2";
    case Kernel::kAvx512: return "avx512";
  }
  return "unknown";
}

bool KernelSupported(Kernel kernel) {
  switch (kernel) {
    case Kernel::kScalar: return true;
    case Kernel::kAvx2: return Cpu().avx2_fma;
    case Kernel::kAvx512: return Cpu().avx512f;
  }
  return false;
}

uint64_t OperationSeed(uint64_t base_seed, uint64_t operation) {
  // Both Mix64 calls are bijections, so for a fixed base different operations always give
  // different seeds (and vice versa); the constants keep (b, op) and (op, b) apart.
  return internal::Mix64(internal::Mix64(base_seed ^ 0x2545F4914F6CDD1DULL) +
                         internal::Mix64(operation + 0x9E3779B97F4A7C15ULL));
}

void Forward(float* data, size_t n, uint64_t seed, const Options& options) {
  Transform(data, n, seed, options, Direction::kForward);
}
void Inverse(float* data, size_t n, uint64_t seed, const Options& options) {
  Transform(data, n, seed, options, Direction::kInverse);
}
void Forward(double* data, size_t n, uint64_t seed, const Options& options) {
  Transform(data, n, seed, options, Direction::kForward);
}
void Inverse(double* data, size_t n, uint64_t seed, const Options& options) {
  Transform(data, n, seed, options, Direction::kInverse);
}

}  // namespace hadamard
}  // namespace optireduce
