#include "algorithms/timeout_policy.h"

#include <algorithm>
#include <cmath>
#include <optional>
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

TimeoutPolicy::History& TimeoutPolicy::Recorded(size_t bytes) {
  auto it = by_size_.find(bytes);
  if (it == by_size_.end()) {
    if (by_size_.size() >= kMaxSizes) {
      auto oldest = by_size_.begin();
      for (auto i = by_size_.begin(); i != by_size_.end(); ++i) {
        if (i->second.last_used < oldest->second.last_used) oldest = i;
      }
      by_size_.erase(oldest);
    }
    it = by_size_.emplace(bytes, History{}).first;
  }
  it->second.last_used = ++uses_;
  return it->second;
}

size_t TimeoutPolicy::Sizes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_size_.size();
}

void TimeoutPolicy::Add(size_t bytes, int64_t us, bool cut) {
  std::lock_guard<std::mutex> lock(mu_);
  History& h = Recorded(bytes);
  if (h.calibration_seen < options_.calibration_ops) h.calibration_seen++;
  h.samples.push_back({us, cut});
  while (h.samples.size() > options_.history) h.samples.pop_front();
}

void TimeoutPolicy::RecordStartLag(size_t bytes, std::chrono::microseconds lag, bool gave_up) {
  std::lock_guard<std::mutex> lock(mu_);
  History& h = Recorded(bytes);
  h.start_lags.push_back({std::max<int64_t>(0, lag.count()), gave_up});
  while (h.start_lags.size() > options_.history) h.start_lags.pop_front();
}

namespace {

// The `percentile` of `v` (non-empty); among equal times an uncensored sample sorts first:
// it is the better evidence.
template <typename Sample>
Sample Percentile(std::vector<Sample> v, double percentile) {
  const size_t idx =
      std::min(v.size() - 1, static_cast<size_t>(std::ceil(percentile * v.size())) - 1);
  std::nth_element(v.begin(), v.begin() + idx, v.end(), [](const Sample& a, const Sample& b) {
    return a.us != b.us ? a.us < b.us : (!a.cut && b.cut);
  });
  return v[idx];
}

}  // namespace

TimeoutOptions TimeoutPolicy::options() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_;
}

void TimeoutPolicy::Configure(const TimeoutOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  options_ = options;
  by_size_.clear();
  uses_ = 0;
}

TimeBound TimeoutPolicy::BoundFor(size_t bytes) const {
  return Bound(bytes, std::nullopt, false);
}

TimeBound TimeoutPolicy::BoundWith(size_t bytes, std::chrono::microseconds agreed,
                                   bool capped) const {
  return Bound(bytes, agreed, capped);
}

std::optional<std::chrono::microseconds> TimeoutPolicy::Proposal(size_t bytes) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_size_.find(bytes);
    if (it == by_size_.end() || it->second.samples.empty()) return std::nullopt;
  }
  return Bound(bytes, std::nullopt, false).bound;
}

TimeBound TimeoutPolicy::Bound(size_t bytes, std::optional<std::chrono::microseconds> agreed,
                               bool agreed_capped) const {
  int64_t p = 0;
  bool p_cut = false;
  std::optional<History::Sample> lag;
  TimeoutOptions options;
  {
    std::lock_guard<std::mutex> lock(mu_);
    options = options_;
    auto it = by_size_.find(bytes);
    if (!agreed && it != by_size_.end() && !it->second.samples.empty()) {
      const History::Sample s = Percentile(
          std::vector<History::Sample>(it->second.samples.begin(), it->second.samples.end()),
          options.percentile);
      p = s.us;
      p_cut = s.cut;
    }
    if (options.learn_start_grace && it != by_size_.end() && !it->second.start_lags.empty() &&
        it->second.start_lags.size() >= options.start_history_min) {
      lag = Percentile(std::vector<History::Sample>(it->second.start_lags.begin(),
                                                    it->second.start_lags.end()),
                       options.start_percentile);
    }
  }
  TimeBound b;
  int64_t bound = 0;
  if (agreed) {
    // Agreed by the ranks (operation_ledger.h): already within every rank's cap.
    bound = std::max<int64_t>(1, agreed->count());
    b.capped = agreed_capped;
  } else {
    bound = p_cut ? p : static_cast<int64_t>(p * options.margin);
    bound = std::max<int64_t>(bound, options.min_bound.count());
    b.capped = bound >= options.hard_cap.count();
    bound = std::min<int64_t>(bound, options.hard_cap.count());
  }
  b.bound = std::chrono::microseconds(bound);
  b.quiet = std::chrono::microseconds(std::min<int64_t>(
      options.max_quiet.count(),
      std::max<int64_t>(100, static_cast<int64_t>(bound * options.early_quiet_fraction))));
  b.peer_factor = options.peer_timeout_factor;
  b.repair_budget =
      std::chrono::microseconds(static_cast<int64_t>(bound * options.repair_budget_fraction));
  const int64_t latest_start = bound / 2 + b.repair_budget.count();
  b.start_grace = std::chrono::microseconds(latest_start);
  if (lag) {
    // A censored percentile is where earlier operations gave up: no margin on top, or
    // every straggler given up would stretch the next grace.
    const int64_t grace = lag->cut ? lag->us : static_cast<int64_t>(lag->us * options.margin);
    b.start_grace = std::chrono::microseconds(std::min(grace, latest_start));
    b.start_grace_learned = true;
  }
  return b;
}

}  // namespace optireduce
