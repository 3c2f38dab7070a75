#include "algorithms/recursive_doubling.h"

#include <algorithm>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/strings/str_cat.h"

namespace optireduce {
namespace {

using Clock = std::chrono::steady_clock;

class Exchange {
 public:
  explicit Exchange(const RecursiveDoublingArgs& a)
      : a_(a), bytes_(a.elements * a.element_size), scratch_(std::max<size_t>(1, bytes_)) {
    if (a.timeout.count() > 0) end_ = Clock::now() + a.timeout;
    send_ = a.context->createUnboundBuffer(a.data, bytes_);
    recv_ = a.context->createUnboundBuffer(scratch_.data(), bytes_);
  }

  // Sends this rank's data to `to` (if >= 0) and receives `from`'s (if >= 0) into scratch.
  void Swap(int to, int from, const char* step) {
    if (from >= 0) recv_->recv(from, a_.slot, 0, bytes_);
    if (to >= 0) send_->send(to, a_.slot, 0, bytes_);
    if (from >= 0) Wait(*recv_, true, step, from);
    if (to >= 0) Wait(*send_, false, step, to);
  }
  // data = reduce(lower rank's operand, higher rank's operand), the peer's in scratch. The
  // output is always the first operand (reduce functions may assume out == a, as the
  // wrapper of gloo::AllreduceTranspose does).
  void ReduceWith(int peer) {
    if (peer > a_.context->rank) {
      a_.reduce(a_.data, a_.data, scratch_.data(), a_.elements);
    } else {
      a_.reduce(scratch_.data(), scratch_.data(), a_.data, a_.elements);
      TakeScratch();
    }
  }
  void TakeScratch() { std::copy(scratch_.begin(), scratch_.begin() + bytes_, a_.data); }

 private:
  void Wait(gloo::transport::UnboundBuffer& buf, bool recv, const char* step, int peer) {
    std::chrono::milliseconds left = gloo::transport::kUnsetTimeout;
    if (a_.timeout.count() > 0) {
      // Past the deadline the wait still runs, with the shortest timeout: the transport
      // times it out and fails the context, as a Gloo wait timeout does.
      left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()),
                      std::chrono::milliseconds(1));
    }
    bool ok = false;
    try {
      ok = recv ? buf.waitRecv(nullptr, left) : buf.waitSend(nullptr, left);
    } catch (const gloo::IoException& e) {
      throw gloo::IoException(absl::StrCat("optireduce::allreduce (tag ", a_.tag,
                                           ", recursive doubling) failed in the ", step,
                                           " with rank ", peer, ": ", e.what()));
    }
    if (!ok) {
      GLOO_THROW_IO_EXCEPTION("optireduce::allreduce (tag ", a_.tag, ", recursive doubling) "
                              "aborted in the ", step, " with rank ", peer);
    }
  }

  const RecursiveDoublingArgs& a_;
  const size_t bytes_;
  std::vector<char> scratch_;
  Clock::time_point end_{};
  std::unique_ptr<gloo::transport::UnboundBuffer> send_, recv_;
};

}  // namespace

void RecursiveDoublingAllreduce(const RecursiveDoublingArgs& a) {
  GLOO_ENFORCE(a.context != nullptr && a.reduce, "recursive doubling: no context or reduce");
  const int n = a.context->size;
  const int me = a.context->rank;
  if (n < 2 || a.elements == 0) return;
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  Exchange x(a);
  // Ranks p2.. hand their data to rank - p2 and wait for the result.
  if (me >= p2) {
    x.Swap(me - p2, -1, "fold-in");
    x.Swap(-1, me - p2, "fold-out");
    x.TakeScratch();
    return;
  }
  if (me < extra) {
    x.Swap(-1, me + p2, "fold-in");
    x.ReduceWith(me + p2);
  }
  for (int mask = 1; mask < p2; mask <<= 1) {
    const int peer = me ^ mask;
    x.Swap(peer, peer, "exchange");
    x.ReduceWith(peer);
  }
  if (me < extra) x.Swap(me + p2, -1, "fold-out");
}

}  // namespace optireduce
