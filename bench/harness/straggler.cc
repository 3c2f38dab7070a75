#include "bench/harness/straggler.h"

#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace optireduce {
namespace bench {

absl::StatusOr<StragglerDist> StragglerDist::Parse(const std::string& spec) {
  const std::string allowed =
      "const:X, exp:MEAN, uniform:A:B, normal:MEAN:STD, pareto:SCALE:SHAPE or "
      "spike:P:MS (probability P in [0, 1] of a delay MS, else none), in ms, non-negative";
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  std::vector<double> nums;
  for (size_t i = 1; i < parts.size(); i++) {
    double x = 0;
    if (!absl::SimpleAtod(parts[i], &x) || !std::isfinite(x) || x < 0) {
      return absl::InvalidArgumentError(allowed);
    }
    nums.push_back(x);
  }
  StragglerDist d;
  d.spec_ = spec;
  const std::string& kind = parts[0];
  if (kind == "const" && nums.size() == 1) {
    d.kind_ = Kind::kConst;
  } else if (kind == "exp" && nums.size() == 1) {
    d.kind_ = Kind::kExp;
  } else if (kind == "uniform" && nums.size() == 2 && nums[0] <= nums[1]) {
    d.kind_ = Kind::kUniform;
  } else if (kind == "normal" && nums.size() == 2) {
    d.kind_ = Kind::kNormal;
  } else if (kind == "pareto" && nums.size() == 2 && nums[0] > 0 && nums[1] > 0) {
    d.kind_ = Kind::kPareto;
  } else if (kind == "spike" && nums.size() == 2 && nums[0] <= 1) {
    d.kind_ = Kind::kSpike;
  } else {
    return absl::InvalidArgumentError(allowed);
  }
  d.a_ = nums[0];
  d.b_ = nums.size() > 1 ? nums[1] : 0;
  return d;
}

double StragglerDist::Draw(std::mt19937_64& rng) const {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double x = 0;
  switch (kind_) {
    case Kind::kConst: x = a_; break;
    case Kind::kExp: x = a_ > 0 ? std::exponential_distribution<double>(1.0 / a_)(rng) : 0; break;
    case Kind::kUniform: x = a_ + (b_ - a_) * u(rng); break;
    case Kind::kNormal: x = std::normal_distribution<double>(a_, b_)(rng); break;
    case Kind::kPareto: x = a_ / std::pow(1.0 - u(rng), 1.0 / b_); break;
    case Kind::kSpike: x = u(rng) < a_ ? b_ : 0; break;
  }
  return x > 0 ? x : 0;
}

}  // namespace bench
}  // namespace optireduce
