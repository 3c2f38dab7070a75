// A bounded channel for ranks-as-threads tests: packets are handed straight to the
// destination's BoundedReceiver, each dropped with a seeded probability, so OptiReduce
// mode can be tested over Gloo's TCP device without our transport. A deputy's request
// for a late leader's decision is answered by the leader's DecisionHandover at once.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "algorithms/bounded_channel.h"
#include "transport_dpdk/bounded/bounded_receiver.h"
#include "transport_dpdk/bounded/bounded_sources.h"
#include "transport_dpdk/bounded/decision_handover.h"

namespace optireduce {
namespace testing {

class InMemoryBoundedHub {
 public:
  InMemoryBoundedHub(int size, double drop, uint64_t seed, size_t payload = 1024);
  ~InMemoryBoundedHub();
  BoundedChannel* channel(int rank);
  // Also drops every packet for which `drop(src, dst, op, offset, repair)` is true (set
  // before the ranks start).
  using DropIf =
      std::function<bool(int src, int dst, uint64_t op, size_t offset, bool repair)>;
  void SetDropIf(DropIf drop) { drop_if_ = std::move(drop); }
  // `rank` sends as a paced transport may: the last packet of each of its phase-2 sends
  // (odd operation ids, see SiblingPhaseOp) waits in the channel until FinishSends for
  // that operation. Set before the ranks start.
  void HoldLastPhase2Packets(int rank);
  // `rank`'s process is gone: what it still holds is lost, and repair requests to it go
  // unanswered (its peers wait until their deadline).
  void Exit(int rank);
  transport::BoundedReceiverCounters counters(int rank) const;
  uint64_t sent_packets() const;
  uint64_t dropped_packets() const;

 private:
  class Endpoint;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  DropIf drop_if_;
};

}  // namespace testing
}  // namespace optireduce
