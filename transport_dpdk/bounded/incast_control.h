// How many peers a rank's bounded sends go to at once, adapted from observed loss and
// lateness.
//
// TAR's staggered order gives every receiver one sender per step when each rank sends to
// one peer at a time; more concurrent senders can use paths a single flow leaves idle but
// turn each phase into an N-to-1 burst at the receivers. Additive increase after a run of
// loss-free operations, multiplicative decrease on loss: where the receivers overflow the
// limit falls back to one sender per receiver; where nothing is lost it rises to N-1. An
// operation that lost nothing but ran late (a phase used most of its time although every
// peer had started: queues, not drops) takes one sender off and restarts the clean run.
// Thread-safe: a context's operations may run on several threads at once (ProcessGroupGloo
// runs two allreduces concurrently on one context), each reporting its outcome.
#pragma once

#include <mutex>

namespace optireduce {
namespace transport {

class IncastControl {
 public:
  // `max_senders`: peers of the context (N-1); `initial`: the starting limit.
  IncastControl(int max_senders, int initial);

  // The outcome of one operation on this rank; returns the new limit.
  int OnOperation(double loss_fraction, bool late = false);
  int senders() const;

  // Loss-free operations needed before one more concurrent sender.
  static constexpr int kCleanOpsToGrow = 16;

 private:
  const int max_;
  mutable std::mutex mu_;
  int senders_;
  int clean_ops_ = 0;
};

}  // namespace transport
}  // namespace optireduce
