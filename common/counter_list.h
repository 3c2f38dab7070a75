// counter_list.h — counter structs whose counters are listed once.
//
// A counter struct names its counters in one X-macro list, `LIST(X)` expanding to X(name)
// per counter (a comment per counter goes in the list, as /* */). These macros expand the
// list into everything else a counter needs, so a new counter is one line in its list:
//   OPTIREDUCE_COUNTER_FIELD         `uint64_t name = 0;`  (the plain snapshot struct)
//   OPTIREDUCE_ATOMIC_COUNTER_FIELD  `std::atomic<uint64_t> name{0};`  (the live struct)
//   OPTIREDUCE_COUNTER_SNAPSHOT      `snapshot.name = <relaxed load of name>;`  (inside a
//                                    member of the live struct with a plain `snapshot`)
//   OPTIREDUCE_COUNTER_RESET         `name = 0` (relaxed store; live struct)
//   OPTIREDUCE_COUNTER_ADD           `name += other.name;`  (plain struct, `other` in scope)
//   OPTIREDUCE_COUNTER_VISIT         `fn("name", value);`  (either struct, `fn` in scope: the
//                                    name -> value walk exports are generated from)
// Live counters are relaxed atomics: written by one thread, read by anyone.
#pragma once

#include <atomic>
#include <cstdint>

namespace optireduce {

// Adds n to a live counter (relaxed: written by one thread, read by anyone).
inline void Bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
  c.fetch_add(n, std::memory_order_relaxed);
}

inline uint64_t CounterValue(uint64_t v) { return v; }
inline uint64_t CounterValue(const std::atomic<uint64_t>& v) {
  return v.load(std::memory_order_relaxed);
}

}  // namespace optireduce

#define OPTIREDUCE_COUNTER_FIELD(name) uint64_t name = 0;
#define OPTIREDUCE_ATOMIC_COUNTER_FIELD(name) std::atomic<uint64_t> name{0};
#define OPTIREDUCE_COUNTER_SNAPSHOT(name) snapshot.name = ::optireduce::CounterValue(name);
#define OPTIREDUCE_COUNTER_RESET(name) name.store(0, std::memory_order_relaxed);
#define OPTIREDUCE_COUNTER_ADD(name) name += other.name;
#define OPTIREDUCE_COUNTER_VISIT(name) fn(#name, ::optireduce::CounterValue(name));
