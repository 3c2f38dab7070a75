// A bounded channel for ranks-as-threads tests: packets are handed straight to the
// destination's BoundedReceiver, each dropped with a seeded probability, so OptiReduce
// mode can be tested over Gloo's TCP device without our transport. A deputy's request
// for a late leader's decision is answered by the leader's DecisionHandover at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <set>
#include <tuple>
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
  // The first answer to a deputy's request for a leader's decision is lost: `lost(leader,
  // deputy, op)` runs on the deputy's thread after the leader's side answered and before
  // the deputy learns nothing came back (a test makes the leader begin meanwhile).
  // Set before the ranks start.
  using LostCedeAnswer = std::function<void(int leader, int deputy, uint64_t op)>;
  void LoseFirstCedeAnswer(LostCedeAnswer lost) { lost_cede_answer_ = std::move(lost); }
  // Waits until `src` has sent `dst` its data of operation `op`, at most `timeout`; true if
  // it has.
  bool WaitSent(int src, int dst, uint64_t op, std::chrono::milliseconds timeout);
  transport::BoundedReceiverCounters counters(int rank) const;
  // The loss fractions `rank`'s operations reported to the incast control, in order.
  std::vector<double> loss_reports(int rank) const;
  uint64_t sent_packets() const;
  uint64_t dropped_packets() const;

 private:
  class Endpoint;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  DropIf drop_if_;
  LostCedeAnswer lost_cede_answer_;
  std::atomic<bool> cede_answer_lost_{false};
  std::mutex sent_mu_;
  std::condition_variable sent_cv_;
  std::set<std::tuple<int, int, uint64_t>> sent_;  // (src, dst, op) of every Send
};

}  // namespace testing
}  // namespace optireduce
