#include "gloo_ext/interposer.h"

#include <dlfcn.h>

#include <mutex>

#include <gloo/common/logging.h>

#include "absl/strings/str_cat.h"
#include "algorithms/allreduce.h"
#include "algorithms/reduce_classifier.h"
#include "gloo_ext/config.h"
#include "gloo_ext/optireduce_mode.h"

namespace gloo {
// A hidden alias of this library's own gloo::allreduce (defined at the end of this file):
// taking &gloo::allreduce would give whichever definition won the global lookup.
extern void optireduce_own_allreduce(const AllreduceOptions& opts)
    __attribute__((alias("_ZN4gloo9allreduceERKNS_16AllreduceOptionsE"),
                   visibility("hidden")));
}  // namespace gloo

namespace optireduce {
namespace gloo_ext {
namespace {

constexpr const char kAllreduceSymbol[] = "_ZN4gloo9allreduceERKNS_16AllreduceOptionsE";

// Counts a call as an error when the path it took throws (the exception still propagates:
// torch turns it into a Python RuntimeError).
template <typename F>
void CountingErrors(F&& run) {
  try {
    run();
  } catch (...) {
    Counters().errors.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
}

// Counts a call that goes to stock Gloo, and why.
bool Forwarded(std::atomic<uint64_t>& reason, size_t bytes) {
  InterposerCounters& c = Counters();
  c.forwarded_calls.fetch_add(1, std::memory_order_relaxed);
  reason.fetch_add(1, std::memory_order_relaxed);
  c.bytes_forwarded.fetch_add(bytes, std::memory_order_relaxed);
  return false;
}

}  // namespace

InterposerCounters& Counters() {
  static InterposerCounters* counters = new InterposerCounters();  // never destroyed
  return *counters;
}

void ResetCounters() { Counters().Reset(); }

std::string CountersJson() {
  std::string json = "{";
  const char* separator = "";
  Counters().ForEach([&](const char* name, uint64_t value) {
    absl::StrAppend(&json, separator, "\"", name, "\": ", value);
    separator = ", ";
  });
  return json + "}";
}

AllreduceFn RealAllreduce() {
  static AllreduceFn real = []() -> AllreduceFn {
    AllreduceFn self = &::gloo::optireduce_own_allreduce;
    // The next definition after this library in the lookup order: libgloo's, since this
    // library is loaded before libgloo's users (that is what makes interposition work).
    auto next = reinterpret_cast<AllreduceFn>(dlsym(RTLD_NEXT, kAllreduceSymbol));
    if (next != nullptr && next != self) return next;
    // Fallback (e.g. an unusual load order where RTLD_NEXT finds nothing after us): ask
    // libgloo itself, which is loaded because this library links it.
    void* gloo = dlopen("libgloo.so.0", RTLD_NOW | RTLD_NOLOAD);
    if (gloo != nullptr) {
      auto direct = reinterpret_cast<AllreduceFn>(dlsym(gloo, kAllreduceSymbol));
      if (direct != nullptr && direct != self) return direct;
    }
    return nullptr;
  }();
  GLOO_ENFORCE(real != nullptr,
               "optireduce: cannot find the real gloo::allreduce (", kAllreduceSymbol,
               ") after liboptireduce_torch.so; is libgloo.so.0 loaded?");
  return real;
}

bool InterposerIsFirstInLookup() {
  return dlsym(RTLD_DEFAULT, kAllreduceSymbol) ==
         reinterpret_cast<void*>(&::gloo::optireduce_own_allreduce);
}

bool TryOptiReduce(const ::gloo::AllreduceOptions& opts) {
  InterposerCounters& c = Counters();
  c.calls.fetch_add(1, std::memory_order_relaxed);
  const Config& config = [&]() -> const Config& {
    try {
      return GetConfigOrThrow();
    } catch (...) {
      c.errors.fetch_add(1, std::memory_order_relaxed);
      throw;
    }
  }();
  const gloo::detail::AllreduceOptionsImpl& g = GlooOptionsOf(opts);
  const size_t bytes = g.elements * g.elementSize;
  if (config.algo == Algo::kRing) {
    return Forwarded(c.forwarded_ring, bytes);
  }
  if (g.algorithm != gloo::detail::AllreduceOptionsImpl::UNSPECIFIED) {
    // The caller asked Gloo for a specific algorithm: respect it.
    return Forwarded(c.forwarded_explicit_algorithm, bytes);
  }
  // Cached per function pointer; torch passes &gloo::sum<T> & co. compiled into libtorch.
  const ReduceKind kind = ClassifyReduce(g.reduce, g.elementSize);
  if (kind.type == DataType::kUnknown || kind.op == ReduceOp::kUnknown) {
    // The classifier knows 1-, 4- and 8-byte types; a function it cannot name at those
    // widths is an op it does not know (bitwise and/or/xor, custom), anything else a type.
    const bool known_width = g.elementSize == 1 || g.elementSize == 4 || g.elementSize == 8;
    return Forwarded(known_width ? c.forwarded_unsupported_op : c.forwarded_unsupported_type,
                     bytes);
  }
  if (config.algo == Algo::kTranspose) {
    c.tar_calls.fetch_add(1, std::memory_order_relaxed);
    c.bytes_tar.fetch_add(bytes, std::memory_order_relaxed);
    // The classification above is passed on, so the algorithm does not probe again.
    AllreduceOptions extras(g.context);
    extras.setDataType(kind.type);
    extras.setReduceOp(kind.op);
    extras.setHadamard(config.hadamard == HadamardSetting::kOn ? AllreduceOptions::Hadamard::kAuto
                                                               : AllreduceOptions::Hadamard::kOff);
    SetLayout(config.layout, &extras);
    CountingErrors([&] { optireduce::allreduce(opts, extras); });
    return true;
  }
  c.optireduce_calls.fetch_add(1, std::memory_order_relaxed);
  c.bytes_optireduce.fetch_add(bytes, std::memory_order_relaxed);
  CountingErrors([&] { RunOptiReduce(opts, kind); });
  return true;
}

void DispatchAllreduce(const ::gloo::AllreduceOptions& opts) {
  if (TryOptiReduce(opts)) return;
  AllreduceFn real = RealAllreduce();
  CountingErrors([&] { real(opts); });
}

}  // namespace gloo_ext
}  // namespace optireduce

// The hook of patches/gloo (a Gloo that torch links statically calls this through
// dlsym(RTLD_DEFAULT) when GLOO_ALGO asks): 1 = done here, 0 = run stock Gloo's allreduce.
// options_size guards against a Gloo whose AllreduceOptions differs from the one this
// library was compiled with.
extern "C" __attribute__((visibility("default"))) int optireduce_gloo_allreduce(
    const gloo::AllreduceOptions* opts, size_t options_size) {
  GLOO_ENFORCE(options_size == sizeof(gloo::AllreduceOptions),
               "optireduce: the calling Gloo's AllreduceOptions has ", options_size,
               " bytes, liboptireduce was built with ", sizeof(gloo::AllreduceOptions),
               ": rebuild optireduce against the same Gloo headers");
  optireduce::gloo_ext::Counters().hook_calls.fetch_add(1, std::memory_order_relaxed);
  return optireduce::gloo_ext::TryOptiReduce(*opts) ? 1 : 0;
}

// The interposed symbol: _ZN4gloo9allreduceERKNS_16AllreduceOptionsE.
namespace gloo {
__attribute__((visibility("default"))) void allreduce(const AllreduceOptions& opts) {
  optireduce::gloo_ext::DispatchAllreduce(opts);
}
}  // namespace gloo
