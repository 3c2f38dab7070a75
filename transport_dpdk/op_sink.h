// op_sink.h — where the engine reports completions of a buffer's operations
// and where the Gloo adapter waits for them. One per UnboundBuffer/Buffer.
//
// Lock order: the engine calls into a sink while holding the engine lock; a
// waiter holds only the sink lock and never calls the engine while holding it.
#pragma once

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
  // Outstanding operations (op id -> description), for timeout messages.
  std::map<uint64_t, std::string> pending_sends, pending_recvs;

  void AddPending(bool send, uint64_t op, std::string what) {
    std::lock_guard<std::mutex> lock(mu);
    (send ? pending_sends : pending_recvs)[op] = std::move(what);
  }
  void Complete(bool send, uint64_t op, int rank) {
    std::lock_guard<std::mutex> lock(mu);
    if (send) {
      pending_sends.erase(op);
      sends_done.push_back(rank);
    } else {
      pending_recvs.erase(op);
      recvs_done.push_back(rank);
    }
    cv.notify_all();
  }
  void Fail(bool send, uint64_t op, std::string what) {
    std::lock_guard<std::mutex> lock(mu);
    (send ? pending_sends : pending_recvs).erase(op);
    errors.push_back(std::move(what));
    cv.notify_all();
  }
};

}  // namespace transport
}  // namespace optireduce
