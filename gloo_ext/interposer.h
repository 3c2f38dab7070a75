// gloo::allreduce interposition (liboptireduce_torch.so).
//
// This library defines gloo::allreduce(const gloo::AllreduceOptions&) itself. Loaded before
// libtorch_cpu (LD_PRELOAD, or `import optireduce` before torch: RTLD_GLOBAL), its
// definition is the one libtorch_cpu's call binds to. Each call is dispatched by GLOO_ALGO:
//   ring        -> forwarded to the real gloo::allreduce (dlsym(RTLD_NEXT, ...))
//   transpose   -> optireduce::allreduce (TAR, reliable, exact)
//   optireduce  -> RunOptiReduce (gloo_ext/optireduce_mode.h)
// when the data type and op are ones TAR handles (classified from the reduce function);
// anything else is forwarded, and every decision is counted.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <gloo/allreduce.h>

namespace optireduce {
namespace gloo_ext {

struct InterposerCounters {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> tar_calls{0};         // GLOO_ALGO=transpose, run by TAR
  std::atomic<uint64_t> optireduce_calls{0};  // GLOO_ALGO=optireduce, run by RunOptiReduce
  std::atomic<uint64_t> forwarded_calls{0};   // sum of the forwarded_* reasons below
  std::atomic<uint64_t> forwarded_ring{0};    // GLOO_ALGO=ring
  std::atomic<uint64_t> forwarded_explicit_algorithm{0};  // caller chose RING/BCUBE
  std::atomic<uint64_t> forwarded_unsupported_type{0};    // e.g. float16, custom types
  std::atomic<uint64_t> forwarded_unsupported_op{0};      // e.g. bitwise and/or/xor
  std::atomic<uint64_t> errors{0};            // calls that threw (any path)
  std::atomic<uint64_t> bytes_tar{0};
  std::atomic<uint64_t> bytes_optireduce{0};
  std::atomic<uint64_t> bytes_forwarded{0};
};

InterposerCounters& Counters();
void ResetCounters();
// {"calls": N, "tar_calls": N, ...}
std::string CountersJson();

// Runs TAR or OptiReduce when GLOO_ALGO asks and the call qualifies (true), or counts why
// not and returns false: the caller then runs stock Gloo's allreduce.
bool TryOptiReduce(const ::gloo::AllreduceOptions& opts);

// The dispatch behind the interposed gloo::allreduce: TryOptiReduce, else the real one.
void DispatchAllreduce(const ::gloo::AllreduceOptions& opts);

// The real gloo::allreduce of libgloo (never this library's). Throws if it cannot be found.
using AllreduceFn = void (*)(const ::gloo::AllreduceOptions&);
AllreduceFn RealAllreduce();

// True when the process's global lookup of gloo::allreduce finds this library's definition,
// i.e. libraries loaded from now on (libtorch_cpu) bind their calls to the interposer.
bool InterposerIsFirstInLookup();

}  // namespace gloo_ext
}  // namespace optireduce
