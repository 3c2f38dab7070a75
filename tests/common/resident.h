// Resident memory of this process, for tests that bound what an operation keeps.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdio>

namespace optireduce {
namespace testing {

// Resident bytes of this process (/proc/self/statm); 0 when it cannot be read.
inline size_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

inline double ResidentMiB() { return ResidentBytes() / double(1 << 20); }

}  // namespace testing
}  // namespace optireduce
