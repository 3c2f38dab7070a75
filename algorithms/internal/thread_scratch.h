// Scratch memory of the calling thread, by use: grown, never shrunk, and touched when it
// grows. One thread's operations run one at a time, so a slot is never shared; threads
// running allreduces concurrently each have their own. Fresh memory page-faults, which on
// a VM costs more than a bounded phase's deadline for tens of MiB: growing writes every
// new byte (zero) at once, and keeps what the slot held.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include <gloo/common/error.h>

namespace optireduce {
namespace internal {

enum class ScratchSlot : int {
  kReliableSteps,  // reliable TAR: one peer's shard per step
  kBoundedPeers,   // bounded TAR: the peers' phase-1 contributions to this rank's shard
  kBoundedShards,  // bounded TAR: the other owners' phase-2 shards
  kCount,
};

// At least `bytes` bytes of the calling thread's `slot`, 64-byte aligned; valid until the
// next call for the same slot on this thread.
inline char* ThreadScratch(ScratchSlot slot, size_t bytes) {
  struct Memory {
    char* data = nullptr;
    size_t size = 0;
    ~Memory() { std::free(data); }
  };
  thread_local Memory slots[static_cast<int>(ScratchSlot::kCount)];
  Memory& m = slots[static_cast<int>(slot)];
  if (m.size < bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    char* grown = static_cast<char*>(std::aligned_alloc(64, rounded));
    GLOO_ENFORCE(grown != nullptr, "optireduce: cannot allocate ", rounded,
                 " bytes of scratch memory");
    if (m.size > 0) std::memcpy(grown, m.data, m.size);
    std::memset(grown + m.size, 0, rounded - m.size);
    std::free(m.data);
    m.data = grown;
    m.size = rounded;
  }
  return m.data;
}

}  // namespace internal
}  // namespace optireduce
