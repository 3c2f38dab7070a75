// Data-parallel gradients for tests of OptiReduce mode, and how far a result is from the
// exact sum.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace optireduce {
namespace testing {

// Rank `rank`'s gradient of step `step`: a signal common to every rank plus `noise` times
// a per-rank deviation (gradients look alike across ranks), seeded by (rank, step).
inline std::vector<float> SyntheticGradient(int rank, uint64_t step, size_t count,
                                            double noise = 0.1) {
  std::mt19937_64 common(1000 + step), own(7 * rank + 31 * step + 1);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> x(count);
  for (size_t i = 0; i < count; i++) x[i] = g(common);
  for (size_t i = 0; i < count; i++) x[i] += static_cast<float>(noise) * g(own);
  return x;
}

// Every rank's gradient of every step and their exact sums, computed once: a test builds
// it before its ranks' threads start (computed inside them, ranks would be stragglers of
// each other on two cores).
class GradientSet {
 public:
  GradientSet(int ranks, uint64_t steps, size_t count, double noise = 0.1)
      : grad_(steps), sum_(steps, std::vector<double>(count, 0)) {
    for (uint64_t step = 0; step < steps; step++) {
      for (int r = 0; r < ranks; r++) {
        grad_[step].push_back(SyntheticGradient(r, step, count, noise));
        for (size_t i = 0; i < count; i++) sum_[step][i] += grad_[step][r][i];
      }
    }
  }
  const std::vector<float>& Gradient(int rank, uint64_t step) const { return grad_[step][rank]; }
  const std::vector<double>& Sum(uint64_t step) const { return sum_[step]; }

 private:
  std::vector<std::vector<std::vector<float>>> grad_;  // [step][rank]
  std::vector<std::vector<double>> sum_;               // [step]
};

// ||got - want|| / ||want||.
inline double RelL2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

}  // namespace testing
}  // namespace optireduce
