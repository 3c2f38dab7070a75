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
  Add(bytes, duration.count(), /*cut=*/false);
}

void TimeoutPolicy::RecordCut(size_t bytes, std::chrono::microseconds bound_in_effect) {
  Add(bytes, bound_in_effect.count(), /*cut=*/true);
}

void TimeoutPolicy::Add(size_t bytes, int64_t us, bool cut) {
  std::lock_guard<std::mutex> lock(mu_);
  History& h = by_size_[bytes];
  if (h.calibration_seen < options_.calibration_ops) h.calibration_seen++;
  h.samples.push_back({us, cut});
  while (h.samples.size() > options_.history) h.samples.pop_front();
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
  bool p_cut = false;
  TimeoutOptions options;
  {
    std::lock_guard<std::mutex> lock(mu_);
    options = options_;
    auto it = by_size_.find(bytes);
    if (it != by_size_.end() && !it->second.samples.empty()) {
      std::vector<History::Sample> v(it->second.samples.begin(), it->second.samples.end());
      const size_t idx = std::min(
          v.size() - 1, static_cast<size_t>(std::ceil(options.percentile * v.size())) - 1);
      // Among equal times an uncensored sample sorts first: it is the better evidence.
      std::nth_element(v.begin(), v.begin() + idx, v.end(),
                       [](const History::Sample& a, const History::Sample& b) {
                         return a.us != b.us ? a.us < b.us : (!a.cut && b.cut);
                       });
      p = v[idx].us;
      p_cut = v[idx].cut;
    }
  }
  TimeBound b;
  int64_t bound = p_cut ? p : static_cast<int64_t>(p * options.margin);
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
