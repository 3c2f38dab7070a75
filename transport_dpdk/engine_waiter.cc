// Waiter-driven receive: a user thread that waits for a completion (Gloo's waitRecv,
// waitSend, pollRecv) polls the device itself (Engine::DriveWait), so the thread that
// needs an arrival takes it in, with no hand-off from the progress thread. While it does,
// the progress thread waits for Wake() only (engine_loop.cc), with a short timeout that
// doubles while the waiter stays, and takes the input over when the waiter leaves.
// On backends that wake on input (udp, loop) the waiter sleeps until input or its next
// timer; on timer-only ones (dpdk) it backs off as the progress thread would, so that of
// the two threads that used to poll per rank only one does.
#include <sched.h>

#include "transport_dpdk/engine_impl.h"

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
  // The same policy as the progress thread's: the thread entered after posting work, so
  // it first spins (input_spin, or spin on a timer-only backend; each empty poll yields
  // the core), then sleeps until input, its next timer, WakeWaiter or `until` (a
  // timer-only backend: for at most `backoff`, from 16 µs doubling up to max_sleep, or
  // idle_sleep once idle).
  const us spin = e.wakes_on_input ? e.opts.input_spin : e.opts.spin;
  us backoff = kFirstBackoff;
  auto last_work = Clock::now();
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
      if (e.progress_waits_for_wake && e.sleeping_until > now + e.waiter_handoff) e.io->Wake();
      return done ? DriveResult::kReady : DriveResult::kTimedOut;
    }
    sink_lock.unlock();
    if (worked) {
      last_work = now;
      backoff = kFirstBackoff;
    }
    const auto due = std::min(deadline, until);
    lock.unlock();
    if (now - last_work < spin) {
      Bump(e.stats.progress_yields);
      sched_yield();
    } else if (due > now) {
      us wait = std::chrono::duration_cast<us>(due - now) + us(1);
      if (!e.wakes_on_input) {
        wait = std::min(wait, backoff);
        // Idle (a wait for a peer that is late by far): up to idle_sleep, as the progress
        // thread would.
        const us cap = now - last_work >= kIdleAfter ? std::max(e.opts.idle_sleep, e.opts.max_sleep)
                                                     : e.opts.max_sleep;
        backoff = std::min(backoff * 2, std::max(cap, kFirstBackoff));
      }
      e.io->WaitAsWaiter(wait);
      slept = Clock::now() - now < wait ? 1 : 2;
    }
    lock.lock();
  }
}

void Engine::WakeWaiter() {
  if (impl_->waiter_active.load(std::memory_order_relaxed)) impl_->io->WakeWaiter();
}

}  // namespace transport
}  // namespace optireduce
