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

void CheckLog2Block(int log2_block) {
  if (log2_block < kMinLog2Block || log2_block > kMaxLog2Block) {
    throw std::invalid_argument("hadamard: log2_block " + std::to_string(log2_block) +
                                " is outside [" + std::to_string(kMinLog2Block) + ", " +
                                std::to_string(kMaxLog2Block) + "]");
  }
}

// Calls fn(offset, log2_size) for every block of the layout, in order.
template <typename Fn>
void ForEachBlock(size_t n, int log2_block, Fn fn) {
  const size_t block = size_t{1} << log2_block;
  size_t offset = 0;
  for (; n - offset >= block; offset += block) fn(offset, log2_block);
  // Tail: descending powers of two, so each piece starts at a multiple of its own size
  // (the kernels rely on that for their sign-bit lookup).
  const size_t tail = n - offset;
  for (int b = log2_block - 1; b >= 0; --b) {
    const size_t piece = size_t{1} << b;
    if (tail & piece) {
      fn(offset, b);
      offset += piece;
    }
  }
}

template <typename T>
void Transform(T* data, size_t n, uint64_t seed, const Options& options, Direction dir) {
  CheckLog2Block(options.log2_block);
  if (n == 0) return;
  if (data == nullptr) {
    throw std::invalid_argument("hadamard: data is nullptr but n is " + std::to_string(n));
  }
  const BlockFn<T> block_fn = SelectKernel<T>(options.kernel);
  ForEachBlock(n, options.log2_block, [&](size_t offset, int log2_size) {
    block_fn(data + offset, log2_size, seed, offset, dir);
  });
}

template <typename T>
void TransformBlock(T* data, const Block& block, uint64_t seed, const Options& options,
                    Direction dir) {
  if (block.log2_size < 0 || block.log2_size > kMaxLog2Block ||
      block.offset % (size_t{1} << block.log2_size) != 0) {
    throw std::invalid_argument("hadamard: block at " + std::to_string(block.offset) +
                                " of 2^" + std::to_string(block.log2_size) +
                                " is not a block of the layout (Blocks)");
  }
  if (data == nullptr) throw std::invalid_argument("hadamard: data is nullptr");
  SelectKernel<T>(options.kernel)(data + block.offset, block.log2_size, seed, block.offset, dir);
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

std::vector<Block> Blocks(size_t n, const Options& options) {
  CheckLog2Block(options.log2_block);
  std::vector<Block> blocks;
  ForEachBlock(n, options.log2_block,
               [&](size_t offset, int log2_size) { blocks.push_back({offset, log2_size}); });
  return blocks;
}

void InverseBlock(float* data, const Block& block, uint64_t seed, const Options& options) {
  TransformBlock(data, block, seed, options, Direction::kInverse);
}

void InverseBlock(double* data, const Block& block, uint64_t seed, const Options& options) {
  TransformBlock(data, block, seed, options, Direction::kInverse);
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
