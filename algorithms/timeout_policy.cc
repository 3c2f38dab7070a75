#include "algorithms/timeout_policy.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace optireduce {

bool TimeoutPolicy::Calibrating(size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_size_.find(bytes);
  return it == by_size_.end() || it->second.calibration_seen < options_.calibration_ops;
}

void TimeoutPolicy::Record(size_t bytes, std::chrono::microseconds duration) {
  std::lock_guard<std::mutex> lock(mu_);
  History& h = by_size_[bytes];
  if (h.calibration_seen < options_.calibration_ops) h.calibration_seen++;
  h.durations_us.push_back(duration.count());
  while (h.durations_us.size() > options_.history) h.durations_us.pop_front();
}

TimeoutOptions TimeoutPolicy::options() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_;
}

void TimeoutPolicy::Configure(const TimeoutOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  options_ = options;
  by_size_.clear();
}

TimeBound TimeoutPolicy::BoundFor(size_t bytes) const {
  int64_t p = 0;
  TimeoutOptions options;
  {
    std::lock_guard<std::mutex> lock(mu_);
    options = options_;
    auto it = by_size_.find(bytes);
    if (it != by_size_.end() && !it->second.durations_us.empty()) {
      std::vector<int64_t> v(it->second.durations_us.begin(), it->second.durations_us.end());
      const size_t idx = std::min(
          v.size() - 1, static_cast<size_t>(std::ceil(options.percentile * v.size())) - 1);
      std::nth_element(v.begin(), v.begin() + idx, v.end());
      p = v[idx];
    }
  }
  TimeBound b;
  int64_t bound = static_cast<int64_t>(p * options.margin);
  bound = std::max<int64_t>(bound, options.min_bound.count());
  b.capped = bound >= options.hard_cap.count();
  bound = std::min<int64_t>(bound, options.hard_cap.count());
  b.bound = std::chrono::microseconds(bound);
  b.quiet = std::chrono::microseconds(std::min<int64_t>(
      options.max_quiet.count(),
      std::max<int64_t>(100, static_cast<int64_t>(bound * options.early_quiet_fraction))));
  b.repair_budget =
      std::chrono::microseconds(static_cast<int64_t>(bound * options.repair_budget_fraction));
  return b;
}

}  // namespace optireduce
