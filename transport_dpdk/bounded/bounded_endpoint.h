// The bounded service of one Gloo context on our transport: implements the
// optireduce::BoundedChannel that OptiReduce mode uses, on the engine's packet path.
//   receive side: engine -> on_data hook -> BoundedReceiver (regions, staging, waits)
//   send side:    Send -> BoundedSources (valid memory) + Engine::SendBounded (paced)
//   repairs:      BoundedReceive::Repair -> Engine::RequestRepair -> the peer's engine
//                 re-sends the ranges from its BoundedSources
//   hand-over:    AskToCede -> Engine::AskToCede -> the leader's DecisionHandover answers
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "algorithms/bounded_channel.h"
#include "transport_dpdk/bounded/bounded_receiver.h"
#include "transport_dpdk/bounded/bounded_sources.h"
#include "transport_dpdk/bounded/decision_handover.h"
#include "transport_dpdk/bounded/incast_control.h"
#include "transport_dpdk/engine/engine.h"

namespace optireduce {
namespace transport {

class BoundedEndpoint : public BoundedChannel {
 public:
  BoundedEndpoint(std::shared_ptr<Engine> engine, uint32_t ctx);
  ~BoundedEndpoint() override;

  void BeginOperation(uint64_t op, uint64_t bytes) override;
  std::unique_ptr<BoundedReceive> PostReceive(uint64_t op,
                                              std::vector<BoundedRegion> regions) override;
  void Send(int peer, uint64_t op, const void* src, size_t nbytes, bool estimated) override;
  void Detach(uint64_t op) override;
  void ReserveDetach(size_t bytes) override { sources_.Reserve(bytes); }
  void Release(uint64_t op) override { sources_.Release(op); }
  void FinishSends(uint64_t op, BoundedClock::time_point deadline) override;
  size_t PacketPayload() const override;
  void WithdrawSends(::gloo::transport::UnboundBuffer& buf) override;
  std::optional<bool> PollRecv(::gloo::transport::UnboundBuffer& buf, int* rank,
                               std::chrono::milliseconds slice) override;
  bool HasUnpostedData(uint64_t op) const override { return receiver_.HasStaged(op); }
  void OnOperationDone(double loss_fraction, bool late) override;
  CedeAnswer AskToCede(int leader, uint64_t op, BoundedClock::time_point deadline) override;
  bool Ceded(uint64_t op) const override { return handover_.Ceded(op); }

  // The transport's liveness reports `peer` gone: bounded waits for it end and the
  // allreduce raises gloo::IoException naming it (BoundedReceive::PeerStatus).
  void OnPeerFailed(int peer, const absl::Status& status);

  BoundedReceiverCounters counters() const { return receiver_.counters(); }
  // OK while the context works; UNAVAILABLE naming the gone peer's rank (or the timed-out
  // wait) once it failed. The bounded service itself absorbs a failed context as loss (a
  // failed context sends and applies nothing): OptiReduce mode asks here to tell.
  absl::Status ContextFailure() const { return engine_->ContextFailure(ctx_); }
  // Peers the engine sends this context's bounded data to at once (incast control).
  int ConcurrentSenders() const { return engine_->BoundedSenders(ctx_); }

 private:
  std::shared_ptr<Engine> engine_;
  const uint32_t ctx_;
  BoundedReceiver receiver_;
  BoundedSources sources_;
  DecisionHandover handover_;
  std::mutex incast_mu_;  // orders OnOperationDone's update of the engine's limit
  IncastControl incast_;
  // The allreduce size of recent operations (BeginOperation), by phase-1 id, oldest first;
  // a few are kept (operations run at once on several threads).
  uint64_t OperationBytes(uint64_t op) const;
  mutable std::mutex sizes_mu_;
  std::deque<std::pair<uint64_t, uint64_t>> sizes_;
  static constexpr size_t kSizesKept = 64;
};

}  // namespace transport
}  // namespace optireduce
