// Forward Hadamard throughput per kernel and block size on a 16 MiB float buffer (one
// core), next to memcpy of the same bytes. Bytes counted = buffer size per iteration for
// both (the transform reads and writes them in place; memcpy reads a source, writes a
// destination), so the ratio says how close the transform gets to streaming the data once.
//   ./build/bench/hadamard_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "algorithms/hadamard.h"

namespace {

using optireduce::hadamard::Kernel;

constexpr size_t kBytes = size_t{16} << 20;
constexpr size_t kFloats = kBytes / sizeof(float);

std::vector<float> RandomBuffer(size_t floats = kFloats) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(floats);
  for (auto& x : v) x = normal(rng);
  return v;
}

void BM_Memcpy(benchmark::State& state) {
  const auto src = RandomBuffer();
  std::vector<float> dst(kFloats);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kBytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kBytes));
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);

void BM_Forward(benchmark::State& state) {
  const auto kernel = static_cast<Kernel>(state.range(0));
  if (!optireduce::hadamard::KernelSupported(kernel)) {
    state.SkipWithError((std::string(optireduce::hadamard::KernelName(kernel)) +
                         " not supported on this CPU").c_str());
    return;
  }
  optireduce::hadamard::Options options;
  options.kernel = kernel;
  options.log2_block = static_cast<int>(state.range(1));
  const size_t bytes = state.range(2) << 10;
  auto data = RandomBuffer(bytes / sizeof(float));
  uint64_t seed = 1;
  for (auto _ : state) {
    // Orthonormal: repeated transforms keep the data's scale, no overflow.
    optireduce::hadamard::Forward(data.data(), data.size(), seed++, options);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
  state.SetLabel(optireduce::hadamard::KernelName(kernel));
}

// The 16 MiB runs are the headline (data streamed from memory, as in allreduce); the
// 1 MiB runs (buffer in L2) show the compute cost alone, for the SIMD kernels.
void KernelsAndBlocks(benchmark::internal::Benchmark* b) {
  b->ArgNames({"kernel", "log2_block", "KiB"});
  for (int64_t kib : {int64_t{16} << 10, int64_t{1} << 10}) {
    for (Kernel k : {Kernel::kScalar, Kernel::kAvx2, Kernel::kAvx512}) {
      if (kib < (16 << 10) && k == Kernel::kScalar) continue;
      for (int lb = 8; lb <= 18; ++lb) b->Args({static_cast<int64_t>(k), lb, kib});
    }
  }
}
BENCHMARK(BM_Forward)->Apply(KernelsAndBlocks)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
