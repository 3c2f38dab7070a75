// op_sink.h — where the engine reports completions of a buffer's operations
// and where the Gloo adapter waits for them. One per UnboundBuffer/Buffer.
//
// Lock order: the engine calls into a sink while holding the engine lock; a
// waiter holds only the sink lock and never calls the engine while holding it
// (Engine::DriveWait, handed the held lock, releases it before it takes the engine's).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>

namespace optireduce {
namespace transport {

struct OpSink {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> sends_done;  // peer rank of each completed send, in order
  std::deque<int> recvs_done;  // peer rank of each completed recv, in order
  std::deque<std::string> errors;  // failures to raise from the next wait
  bool abort_send = false, abort_recv = false;
  // Waits for a recv blocked right now (WaitForCompletion). Read by the engine
  // without the sink lock: an old-style recv buffer that someone waits on is
  // pending with its peer (liveness) even when nothing is arriving yet.
  std::atomic<int> blocked_recv_waits{0};

  struct Pending {
    std::string what;  // description for timeout messages
    bool done = false;
    int rank = -1;
  };
  // Outstanding operations by op id (ids grow in posting order).
  std::map<uint64_t, Pending> pending_sends, pending_recvs;

  void AddPending(bool send, uint64_t op, std::string what) {
    std::lock_guard<std::mutex> lock(mu);
    (send ? pending_sends : pending_recvs)[op].what = std::move(what);
  }
  // Completions are released in posting order: Gloo's algorithms keep
  // several operations in flight on one buffer and, like TCP, expect the
  // first wait to report the first operation posted, even when a later one
  // finished first (possible here after a loss).
  void Complete(bool send, uint64_t op, int rank) {
    std::lock_guard<std::mutex> lock(mu);
    auto& pending = send ? pending_sends : pending_recvs;
    auto& done = send ? sends_done : recvs_done;
    auto it = pending.find(op);
    if (it == pending.end()) {
      done.push_back(rank);  // untracked op (old-style recv buffer)
    } else {
      it->second.done = true;
      it->second.rank = rank;
    }
    while (!pending.empty() && pending.begin()->second.done) {
      done.push_back(pending.begin()->second.rank);
      pending.erase(pending.begin());
    }
    cv.notify_all();
  }
  void Fail(bool send, uint64_t op, std::string what) {
    std::lock_guard<std::mutex> lock(mu);
    auto& pending = send ? pending_sends : pending_recvs;
    auto& done = send ? sends_done : recvs_done;
    pending.erase(op);
    while (!pending.empty() && pending.begin()->second.done) {
      done.push_back(pending.begin()->second.rank);
      pending.erase(pending.begin());
    }
    errors.push_back(std::move(what));
    cv.notify_all();
  }
};

}  // namespace transport
}  // namespace optireduce
