// poll_backoff.h — what a thread that polls the device does after each poll: the progress
// thread (engine_loop.cc) and a user thread that polls while it waits for a completion
// (engine_waiter.cc) follow the same policy.
//
// After a poll that found work, poll again at once. Within the spin that follows the last
// work (input_spin where the backend's wait returns on input, spin elsewhere), yield the
// core: on a host with more busy threads than cores, the thread that produces the input
// needs it. Then sleep until the next timer:
// - backends whose wait returns on input (IoWaits::WakesOnInput): at most max_sleep,
//   or the liveness interval once idle (kIdleAfter without work); an arrival ends it;
// - timer-only backends: kFirstBackoff, doubling after each sleep up to max_sleep, or
//   idle_sleep once idle.
#pragma once

#include <algorithm>
#include <chrono>

#include "transport_dpdk/engine/engine_options.h"

namespace optireduce {
namespace transport {

class PollBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  using us = std::chrono::microseconds;
  // The first sleep after the spin on a timer-only backend.
  static constexpr us kFirstBackoff{16};
  // Without work this long, the device is idle (EngineOptions::idle_sleep).
  static constexpr std::chrono::milliseconds kIdleAfter{100};

  enum class Next { kPollNow, kYield, kSleep };

  PollBackoff(const EngineOptions& o, bool wakes_on_input, Clock::duration liveness_every,
              Clock::time_point now)
      : wakes_on_input_(wakes_on_input),
        spin_(wakes_on_input ? o.input_spin : o.spin),
        max_sleep_(o.max_sleep),
        idle_cap_(wakes_on_input ? std::chrono::duration_cast<us>(liveness_every)
                                 : std::max(o.idle_sleep, o.max_sleep)),
        last_work_(now) {}

  // Work was queued from outside (a user's post): spin again from `now`.
  void Restart(Clock::time_point now) { last_work_ = now; }

  // After a poll at `now` that found work (`worked`) or not, with the next timer due at
  // `due`: poll again at once, yield once, or sleep for *wait (set only then).
  Next After(Clock::time_point now, bool worked, Clock::time_point due, us* wait) {
    if (worked) {
      last_work_ = now;
      sleep_ = kFirstBackoff;
      return Next::kPollNow;
    }
    if (now - last_work_ < spin_) return Next::kYield;
    if (due <= now) return Next::kPollNow;
    const us cap = now - last_work_ >= kIdleAfter ? idle_cap_ : max_sleep_;
    const us until_due = std::chrono::duration_cast<us>(due - now) + us(1);
    *wait = std::min(wakes_on_input_ ? cap : std::min(sleep_, cap), until_due);
    // A timer-only backend's next sleep is twice as long.
    if (!wakes_on_input_) sleep_ = std::min(sleep_ * 2, idle_cap_);
    return Next::kSleep;
  }

 private:
  const bool wakes_on_input_;
  const us spin_;
  const us max_sleep_;
  const us idle_cap_;  // the longest sleep, once idle
  Clock::time_point last_work_;
  us sleep_ = kFirstBackoff;
};

}  // namespace transport
}  // namespace optireduce
