#include "transport_dpdk/gloo/op_wait.h"

#include <gloo/common/error.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport_dpdk/engine/engine.h"

namespace optireduce {
namespace transport {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Waits (sink lock held) until ready() holds or `until` (max: no limit); false if it timed
// out. Polls the engine itself where it can (Engine::DriveWait), else waits on the sink.
template <typename Ready>
bool WaitReady(OpSink& sink, std::unique_lock<std::mutex>& lock, Ready& ready,
               SteadyClock::time_point until, Engine* engine) {
  if (ready()) return true;
  if (engine) {
    switch (engine->DriveWait(lock, ready, until)) {
      case Engine::DriveResult::kReady:
        return true;
      case Engine::DriveResult::kTimedOut:
        return false;
      case Engine::DriveResult::kNotDriven:
        break;
    }
  }
  if (until == SteadyClock::time_point::max()) {
    sink.cv.wait(lock, ready);
    return true;
  }
  return sink.cv.wait_until(lock, until, ready);
}

}  // namespace

bool WaitForCompletion(OpSink& sink, bool send, int* rank,
                       std::chrono::milliseconds timeout,
                       const std::function<std::string()>& diagnostics,
                       const std::function<void(const std::string&)>& on_timeout,
                       Engine* engine) {
  std::unique_lock<std::mutex> lock(sink.mu);
  auto& done = send ? sink.sends_done : sink.recvs_done;
  bool& aborted = send ? sink.abort_send : sink.abort_recv;
  auto ready = [&] { return !done.empty() || aborted || !sink.errors.empty(); };
  // Counted while blocked (OpSink::blocked_recv_waits).
  struct Blocked {
    std::atomic<int>* n;
    explicit Blocked(std::atomic<int>* c) : n(c) {
      if (n) n->fetch_add(1, std::memory_order_relaxed);
    }
    ~Blocked() {
      if (n) n->fetch_sub(1, std::memory_order_relaxed);
    }
  } blocked(!send && !ready() ? &sink.blocked_recv_waits : nullptr);
  const auto until = timeout.count() <= 0 ? SteadyClock::time_point::max()
                                          : SteadyClock::now() + timeout;
  if (!WaitReady(sink, lock, ready, until, engine)) {
    const auto& pending = send ? sink.pending_sends : sink.pending_recvs;
    std::vector<std::string> what;
    for (const auto& kv : pending) {
      if (!kv.second.done) what.push_back(kv.second.what);
    }
    lock.unlock();
    const std::string message = absl::StrCat(
        "Timed out after ", timeout.count(), " ms waiting for ",
        what.empty() ? std::string(send ? "a send" : "a recv") : absl::StrJoin(what, "; "));
    const std::string state = diagnostics ? " [transport state: " + diagnostics() + "]" : "";
    if (on_timeout) on_timeout(message);
    GLOO_THROW_IO_EXCEPTION(message, state);
  }
  // As over Gloo's TCP: a completion that is ready is returned even when the
  // context failed since (its bytes landed before), unless an abort interrupts
  // this one wait (the completion then goes to the next); without one, the
  // failure raises.
  if (!done.empty() || sink.errors.empty()) {
    if (aborted) {
      aborted = false;
      return false;
    }
    if (rank) *rank = done.front();
    done.pop_front();
    return true;
  }
  std::string e = std::move(sink.errors.front());
  sink.errors.pop_front();
  GLOO_THROW_IO_EXCEPTION(e);
}

PollResult PollForCompletion(OpSink& sink, bool send, int* rank,
                             std::chrono::milliseconds slice, Engine* engine) {
  {
    std::unique_lock<std::mutex> lock(sink.mu);
    auto& done = send ? sink.sends_done : sink.recvs_done;
    const bool& aborted = send ? sink.abort_send : sink.abort_recv;
    auto ready = [&] { return !done.empty() || aborted || !sink.errors.empty(); };
    if (!WaitReady(sink, lock, ready, SteadyClock::now() + slice, engine)) {
      return PollResult::kNotYet;
    }
  }
  // Something is ready: the wait takes it as WaitForCompletion does (it cannot time out).
  return WaitForCompletion(sink, send, rank, std::chrono::milliseconds(0))
             ? PollResult::kCompleted
             : PollResult::kAborted;
}

}  // namespace transport
}  // namespace optireduce
