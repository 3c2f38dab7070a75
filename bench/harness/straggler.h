// Straggler model: a per-iteration "compute" delay, in milliseconds, drawn from a
// distribution and slept by one rank before it enters each timed iteration, so the other
// ranks' timings include waiting for it (as with a slow worker in training).
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/statusor.h"

namespace optireduce {
namespace bench {

class StragglerDist {
 public:
  // "const:X", "exp:MEAN", "uniform:A:B", "normal:MEAN:STD" (negative draws become 0),
  // "pareto:SCALE:SHAPE", "spike:P:MS" (with probability P a delay of MS, else none: an
  // occasional straggler, the kind a bounded wait can absorb); all in milliseconds. The error
  // says what is allowed.
  static absl::StatusOr<StragglerDist> Parse(const std::string& spec);

  // One delay in milliseconds (>= 0).
  double Draw(std::mt19937_64& rng) const;
  const std::string& spec() const { return spec_; }

 private:
  enum class Kind { kConst, kExp, kUniform, kNormal, kPareto, kSpike };
  Kind kind_ = Kind::kConst;
  double a_ = 0, b_ = 0;
  std::string spec_;
};

}  // namespace bench
}  // namespace optireduce
