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

#include "common/counter_list.h"

namespace optireduce {
namespace gloo_ext {

// The interposer's counters, by name (see common/counter_list.h): CountersJson
// exports them under these names.
#define OPTIREDUCE_INTERPOSER_COUNTERS(X)                                            \
  X(calls)                                                                           \
  X(hook_calls)                   /* of calls: from a patched Gloo (patches/gloo) */ \
  X(tar_calls)                    /* GLOO_ALGO=transpose, run by TAR */              \
  X(optireduce_calls)             /* GLOO_ALGO=optireduce, run by RunOptiReduce */   \
  X(forwarded_calls)              /* sum of the forwarded_* reasons below */         \
  X(forwarded_ring)               /* GLOO_ALGO=ring */                               \
  X(forwarded_explicit_algorithm) /* caller chose RING/BCUBE */                      \
  X(forwarded_unsupported_type)   /* e.g. float16, custom types */                   \
  X(forwarded_unsupported_op)     /* e.g. bitwise and/or/xor */                      \
  X(errors)                       /* calls that threw (any path) */                  \
  X(bytes_tar) X(bytes_optireduce) X(bytes_forwarded)

struct InterposerCounters {
  OPTIREDUCE_INTERPOSER_COUNTERS(OPTIREDUCE_ATOMIC_COUNTER_FIELD)
  void Reset() { OPTIREDUCE_INTERPOSER_COUNTERS(OPTIREDUCE_COUNTER_RESET) }
  // Calls fn(name, value) for every counter, in list order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    OPTIREDUCE_INTERPOSER_COUNTERS(OPTIREDUCE_COUNTER_VISIT)
  }
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
