// FUZZ_CHECK: an invariant of a fuzz target. Fails loudly (abort), so libFuzzer
// records the input as a crash and the corpus runner fails its ctest.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, ...)                                                \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__,       \
                   __LINE__, #cond);                                         \
      std::fprintf(stderr, __VA_ARGS__);                                     \
      std::fprintf(stderr, "\n");                                            \
      std::abort();                                                          \
    }                                                                        \
  } while (0)
