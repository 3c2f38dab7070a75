// Waiter-driven receive: a user thread that waits for a completion (Gloo's waitRecv,
// waitSend, pollRecv) polls the device itself (Engine::DriveWait), so the thread that
// needs an arrival takes it in, with no hand-off from the progress thread. While it does,
// the progress thread waits for Wake() only (engine_loop.cc), with a short timeout that
// doubles while the waiter stays, and takes the input over when the waiter leaves.
// On backends that wake on input (udp, loop) the waiter sleeps until input or its next
// timer; on timer-only ones (dpdk) it backs off as the progress thread would, so that of
// the two threads that used to poll per rank only one does.
#include <sched.h>

#include "transport_dpdk/engine/engine_impl.h"
#include "transport_dpdk/engine/poll_backoff.h"

namespace optireduce {
namespace transport {
using namespace engine_internal;  // NOLINT: the engine's own state (engine_state.h)

Engine::DriveResult Engine::DriveWait(std::unique_lock<std::mutex>& sink_lock,
                                      const std::function<bool()>& ready,
                                      std::chrono::steady_clock::time_point until) {
  Impl& e = *impl_;
  if (e.opts.busy_poll) return DriveResult::kNotDriven;
  using us = std::chrono::microseconds;
  // Lock order: the engine's lock, then a sink's (the engine completes into sinks).
  sink_lock.unlock();
  std::unique_lock<std::mutex> lock(e.mu);
  if (e.waiter_active.load(std::memory_order_relaxed)) {
    sink_lock.lock();
    return DriveResult::kNotDriven;
  }
  e.waiter_active.store(true, std::memory_order_relaxed);
  // The progress thread's policy (poll_backoff.h): the thread entered after posting work,
  // so it first spins, then sleeps until input, its next timer, WakeWaiter or `until`.
  PollBackoff backoff(e.opts, e.wakes_on_input, e.liveness_every, Clock::now());
  int slept = 0;  // how the last sleep ended: 0 none, 1 early, 2 at its timeout
  for (;;) {
    Clock::time_point deadline;
    const uint64_t rx_before = e.stats.rx_packets.load(std::memory_order_relaxed);
    Bump(e.stats.waiter_polls);
    e.waiter_polling = true;
    const bool worked = e.Poll(&deadline);
    e.waiter_polling = false;
    const uint64_t received = e.stats.rx_packets.load(std::memory_order_relaxed) - rx_before;
    if (received) {
      Bump(e.stats.rx_by_waiter, received);
      if (slept != 0) Bump(slept == 1 ? e.stats.sleeps_woken_by_input : e.stats.late_inputs);
    }
    slept = 0;
    sink_lock.lock();
    const auto now = Clock::now();
    const bool done = ready();
    if (done || now >= until) {
      e.waiter_active.store(false, std::memory_order_relaxed);
      ++e.waiter_exits;
      // The progress thread watches the input again: at once if its wait for a wake
      // would last longer than a short sleep.
      if (e.progress_waits_for_wake && e.sleeping_until > now + e.waiter_handoff) e.waits.Wake();
      return done ? DriveResult::kReady : DriveResult::kTimedOut;
    }
    sink_lock.unlock();
    us wait{0};
    const PollBackoff::Next next = backoff.After(now, worked, std::min(deadline, until), &wait);
    lock.unlock();
    if (next == PollBackoff::Next::kYield) {
      Bump(e.stats.progress_yields);
      sched_yield();
    } else if (next == PollBackoff::Next::kSleep) {
      e.waits.WaitAsWaiter(wait);
      slept = Clock::now() - now < wait ? 1 : 2;
    }
    lock.lock();
  }
}

void Engine::WakeWaiter() {
  if (impl_->waiter_active.load(std::memory_order_relaxed)) impl_->waits.WakeWaiter();
}

}  // namespace transport
}  // namespace optireduce
