// Randomized, orthonormal, blockwise fast Walsh–Hadamard transform (in place).
//
// Forward:  y = H · D · x   per block, where D is a diagonal of random ±1 signs and H the
//           orthonormal Walsh–Hadamard matrix of the block's size (H = H^T = H^-1).
// Inverse:  x = D · H · y.
// The transform is linear, so ranks may reduce (sum) in the transformed domain: the
// inverse of the sum of forward transforms is the sum of the inputs. A lost contiguous run
// of transformed coefficients (a dropped packet) turns into a small error spread over the
// whole block instead of a hole in the gradient.
//
// Blocks have 2^log2_block elements. The tail (n mod 2^log2_block elements) is cut into
// descending power-of-two blocks, each transformed on its own; this keeps the transform in
// place and orthonormal without communicating padding that the user's buffer cannot hold.
//
// Signs come from `seed`: every rank must pass the same seed for the same operation, and
// callers derive a fresh seed per operation (OperationSeed) — never one fixed sign vector.
// No allocation in the hot path. The kernel (scalar, AVX2, AVX-512) is chosen at run time
// from the CPU's features; all kernels give the same result up to float rounding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace optireduce {
namespace hadamard {

enum class Kernel { kScalar, kAvx2, kAvx512 };

// The fastest kernel this CPU supports.
Kernel BestKernel();
const char* KernelName(Kernel kernel);
bool KernelSupported(Kernel kernel);

// Block size (log2) used unless the caller asks otherwise; chosen by measurement (see
// bench/hadamard_bench.cc and the algorithms README). 2^15 floats = 128 KiB stays in L2 and
// costs no more than 2^14 (three passes over the block either way): forward on a 16 MiB
// float buffer, one core, AVX-512 ~15.9 GB/s at 2^15 vs 15.7 at 2^14 and 13.9 at 2^16
// (memcpy 27 GB/s); AVX2 ~9.5 GB/s at both 2^14 and 2^15. A lost 256-float packet then
// is spread over the whole block: its max error shrinks ~sqrt(2^15 / 256) ~ 11x (measured).
constexpr int kDefaultLog2Block = 15;
constexpr int kMinLog2Block = 1;
constexpr int kMaxLog2Block = 24;

struct Options {
  int log2_block = kDefaultLog2Block;
  Kernel kernel = BestKernel();
};

// A per-operation seed from a job-wide base seed and an operation counter that all ranks
// advance identically.
uint64_t OperationSeed(uint64_t base_seed, uint64_t operation);

void Forward(float* data, size_t n, uint64_t seed, const Options& options = Options());
void Inverse(float* data, size_t n, uint64_t seed, const Options& options = Options());
void Forward(double* data, size_t n, uint64_t seed, const Options& options = Options());
void Inverse(double* data, size_t n, uint64_t seed, const Options& options = Options());

// The blocks Forward/Inverse cut n elements into, in order. Transforming each of them with
// InverseBlock is exactly Inverse: a caller may interleave other work on a block (e.g.
// write its elements just before) while the block is in cache.
struct Block {
  size_t offset;
  int log2_size;
};
std::vector<Block> Blocks(size_t n, const Options& options = Options());
// `data` is the whole buffer (the block's signs depend on its offset in it).
void InverseBlock(float* data, const Block& block, uint64_t seed,
                  const Options& options = Options());
void InverseBlock(double* data, const Block& block, uint64_t seed,
                  const Options& options = Options());

}  // namespace hadamard
}  // namespace optireduce
