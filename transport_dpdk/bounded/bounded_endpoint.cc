#include "transport_dpdk/bounded/bounded_endpoint.h"

#include <chrono>
#include <thread>

#include <gloo/common/error.h>

#include "transport_dpdk/gloo/unbound_buffer.h"

namespace optireduce {
namespace transport {

BoundedEndpoint::BoundedEndpoint(std::shared_ptr<Engine> engine, uint32_t ctx)
    : engine_(std::move(engine)),
      ctx_(ctx),
      incast_(engine_->ContextSize(ctx) - 1, engine_->BoundedSenders(ctx)) {
  BoundedHooks hooks;
  hooks.on_data = [this](int src, uint64_t op, uint64_t offset, const uint8_t* data,
                         size_t len, bool last, bool estimated, uint64_t total,
                         uint64_t op_bytes) {
    receiver_.OnData(op, src, offset, data, len, last, estimated, total, op_bytes);
  };
  hooks.read_source = [this](uint64_t op, int peer, const BoundedSources::ReadFn& fn) {
    return sources_.TryWith(op, peer, fn);
  };
  hooks.on_absent = [this](int src, uint64_t op, bool not_started) {
    receiver_.OnAbsent(op, src, not_started);
  };
  hooks.on_cede_ask = [this](int /*src*/, uint64_t op) { return handover_.OnAsk(op); };
  hooks.on_cede_answer = [this](int src, uint64_t op, bool ceded) {
    handover_.OnAnswer(src, op, ceded);
  };
  hooks.awaits = [this](int peer) { return receiver_.Awaits(peer); };
  hooks.on_failed = [this, size = engine_->ContextSize(ctx)](int /*blamed*/, const std::string& why) {
    // The context failed (a gone peer, `blamed`, or a wait that timed out): it sends and
    // applies nothing more, so no peer's data comes, not only the blamed one's; every wait
    // ends with the failure, whose reason names the blamed rank.
    const absl::Status failure = absl::UnavailableError(why);
    for (int peer = 0; peer < size; peer++) {
      receiver_.FailPeer(peer, failure);
    }
  };
  engine_->SetBoundedHooks(ctx_, std::move(hooks));
}

BoundedEndpoint::~BoundedEndpoint() {
  // A rank that returns from its last allreduce and tears the group down right away
  // still has paced packets queued for its peers: let them go out (bounded wait).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (engine_->BoundedPending(ctx_) > 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // After this returns the engine calls neither hook (it takes the engine lock).
  engine_->SetBoundedHooks(ctx_, BoundedHooks());
}

void BoundedEndpoint::BeginOperation(uint64_t op, uint64_t bytes) {
  handover_.Begin(op);
  std::lock_guard<std::mutex> lock(sizes_mu_);
  const uint64_t key = op & ~uint64_t{1};
  for (auto& entry : sizes_) {
    if (entry.first == key) {
      entry.second = bytes;
      return;
    }
  }
  sizes_.emplace_back(key, bytes);
  if (sizes_.size() > kSizesKept) sizes_.pop_front();
}

uint64_t BoundedEndpoint::OperationBytes(uint64_t op) const {
  std::lock_guard<std::mutex> lock(sizes_mu_);
  const uint64_t key = op & ~uint64_t{1};
  for (const auto& entry : sizes_) {
    if (entry.first == key) return entry.second;
  }
  return 0;
}

std::unique_ptr<BoundedReceive> BoundedEndpoint::PostReceive(
    uint64_t op, std::vector<BoundedRegion> regions) {
  const uint64_t op_bytes = OperationBytes(op);
  return receiver_.Post(
      op, std::move(regions),
      [this](int peer, uint64_t op, const std::vector<ByteRange>& missing) {
        std::vector<std::pair<uint64_t, uint64_t>> ranges;
        ranges.reserve(missing.size());
        for (const ByteRange& r : missing) ranges.emplace_back(r.begin, r.end);
        // A failed request is like a lost one: the wait runs out.
        (void)engine_->RequestRepair(ctx_, peer, op, ranges);
      },
      op_bytes,
      [this, op_bytes](uint64_t op) {
        // Both phases: a peer may wait in either. A failed context sends nothing; its
        // peers learn of the failure from the context instead.
        (void)engine_->SendBoundedNotice(ctx_, op, op_bytes);
        (void)engine_->SendBoundedNotice(ctx_, SiblingPhaseOp(op), op_bytes);
      });
}

void BoundedEndpoint::Send(int peer, uint64_t op, const void* src, size_t nbytes,
                           bool estimated) {
  sources_.Register(op, peer, src, nbytes, estimated);
  const absl::Status status =
      engine_->SendBounded(ctx_, peer, op, nbytes, OperationBytes(op));
  if (!status.ok()) {
    // The caller's memory must not be read after the exception: nothing of `op` is served
    // any more (its peers' repairs are answered "gone" and they compensate).
    sources_.Release(op);
    GLOO_THROW_IO_EXCEPTION("optireduce bounded send: ", status.ToString());
  }
}

void BoundedEndpoint::FinishSends(uint64_t op, BoundedClock::time_point deadline) {
  // Normally nothing is left: the progress thread sends as fast as the device takes it.
  auto pause = std::chrono::microseconds(50);
  while (engine_->BoundedQueuedSends(ctx_, op) > 0 && BoundedClock::now() < deadline) {
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
}

void BoundedEndpoint::Detach(uint64_t op) { sources_.Detach(op); }

void BoundedEndpoint::OnOperationDone(double loss_fraction, bool late) {
  // Two threads may report at once: the limit set is the one this report produced, under
  // a lock so that the engine ends with the newest of them.
  std::lock_guard<std::mutex> lock(incast_mu_);
  const int senders = incast_.OnOperation(loss_fraction, late);
  if (senders != engine_->BoundedSenders(ctx_)) engine_->SetBoundedSenders(ctx_, senders);
}

BoundedChannel::CedeAnswer BoundedEndpoint::AskToCede(int leader, uint64_t op,
                                                      BoundedClock::time_point deadline) {
  // A request that cannot go (a failed context, a peer not connected) is like a lost one.
  if (!engine_->AskToCede(ctx_, leader, op).ok()) return CedeAnswer::kNoAnswer;
  const std::optional<bool> ceded = handover_.WaitAnswer(leader, op, deadline);
  if (!ceded) return CedeAnswer::kNoAnswer;
  return *ceded ? CedeAnswer::kCeded : CedeAnswer::kRefused;
}

void BoundedEndpoint::OnPeerFailed(int peer, const absl::Status& status) {
  receiver_.FailPeer(peer, status);
}

std::optional<bool> BoundedEndpoint::PollRecv(::gloo::transport::UnboundBuffer& buf, int* rank,
                                              std::chrono::milliseconds slice) {
  auto* ours = dynamic_cast<UnboundBuffer*>(&buf);
  if (ours == nullptr) return BoundedChannel::PollRecv(buf, rank, slice);
  switch (ours->pollRecv(rank, slice)) {
    case PollResult::kCompleted:
      return true;
    case PollResult::kAborted:
      return false;
    case PollResult::kNotYet:
      break;
  }
  return std::nullopt;
}

void BoundedEndpoint::WithdrawSends(::gloo::transport::UnboundBuffer& buf) {
  if (auto* ours = dynamic_cast<UnboundBuffer*>(&buf)) ours->withdrawSends();
}

size_t BoundedEndpoint::PacketPayload() const { return engine_->BoundedPayload(); }

}  // namespace transport
}  // namespace optireduce
