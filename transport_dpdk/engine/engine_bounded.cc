// The bounded (unreliable) service on the engine's packet path: the port through which a
// context's BoundedSender hands the device its datagrams, the handler of bounded packets
// and repair requests, and the Engine calls that drive them.
#include "transport_dpdk/engine/engine_impl.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {
using namespace engine_internal;  // NOLINT: the engine's own state (engine_state.h)

namespace {

static_assert(Engine::Impl::kBurst >= BoundedSender::kMaxBurst,
              "a bounded burst fits the transmit batch");

// Context c's side of its BoundedSender: peers, sources, and the device's transmit batch.
class EngineBoundedPort final : public BoundedPort {
 public:
  EngineBoundedPort(Engine::Impl& e, Ctx& c) : e_(e), c_(c) {}

  bool Connected(int peer) const override { return c_.peers[peer].connected; }
  uint32_t Payload(int peer) const override { return c_.peers[peer].bounded_payload; }
  SourceAccess ReadSource(uint64_t op, int peer,
                          const std::function<void(const char*, size_t, bool)>& fn) override {
    return c_.bounded.read_source ? c_.bounded.read_source(op, peer, fn) : SourceAccess::kGone;
  }
  void Flush() override { e_.Flush(); }
  bool Blocked() const override { return e_.tx_blocked; }
  size_t Transmit(int peer, const BoundedPacket* packets, size_t n) override {
    Peer& p = c_.peers[peer];
    for (size_t i = 0; i < n; ++i) {
      const BoundedPacket& pk = packets[i];
      WireHeader h;
      e_.FillHeader(c_, p, &h);
      h.type = static_cast<uint8_t>(PacketType::kData);
      h.flags = kFlagUnreliable | (pk.last ? kFlagLast : 0) | (pk.estimated ? kFlagEstimated : 0);
      h.message_id = pk.op;
      h.offset = pk.offset;
      h.total_length = pk.total;
      h.aux = pk.op_bytes;
      h.payload_length = pk.len;
      e_.Emit(p, h, pk.data, pk.len);
    }
    const size_t queued = e_.tx_n;
    const size_t sent = queued == 0 ? 0 : e_.io->TxBurst(e_.tx, queued);
    for (size_t i = 0; i < sent; ++i) {
      Bump(e_.stats.tx_bytes, e_.tx[i].head_len + e_.tx[i].body_len);
    }
    Bump(e_.stats.tx_packets, sent);
    Bump(e_.stats.bounded_tx_packets, sent);
    if (sent < queued) {
      Bump(e_.stats.tx_backpressure, queued - sent);
      Bump(e_.stats.bounded_tx_deferred, queued - sent);
      e_.tx_blocked = true;
    }
    e_.tx_n = 0;
    return sent;
  }

 private:
  Engine::Impl& e_;
  Ctx& c_;
};

}  // namespace

void Engine::Impl::PumpBoundedSends(Ctx& c, Clock::time_point now,
                                    Clock::time_point* deadline) {
  EngineBoundedPort port(*this, c);
  c.bounded_tx.Pump(port, bounded_pacer, now, opts.spin, deadline);
}

void Engine::Impl::HandleBounded(Ctx& c, Peer& p, const WireHeader& h,
                                 const uint8_t* payload) {
  switch (static_cast<PacketType>(h.type)) {
    case PacketType::kData:
      Bump(stats.bounded_rx_packets);
      if (!c.bounded.on_data) {
        Bump(stats.unsupported);
        return;
      }
      c.bounded.on_data(p.rank, h.message_id, h.offset, payload,
                        h.payload_length, (h.flags & kFlagLast) != 0,
                        (h.flags & kFlagEstimated) != 0, h.total_length, h.aux);
      return;
    case PacketType::kRepair: {
      if (h.flags & kFlagAbsent) {
        Bump(stats.repair_absent_received);
        if (c.bounded.on_absent) {
          c.bounded.on_absent(p.rank, h.message_id,
                              AbsentReasonOf(h) == AbsentReason::kNotStarted);
        }
        return;
      }
      Bump(stats.repair_requests_received);
      // Data this rank cannot send (sources released, or the operation not started
      // here yet) is answered at once, so the requester stops waiting for it.
      uint64_t source_bytes = UINT64_MAX;
      const SourceAccess can = !c.bounded.read_source ? SourceAccess::kGone :
          c.bounded.read_source(h.message_id, p.rank,
                                [&](const char*, size_t n, bool) { source_bytes = n; });
      // Its other phase is running here: asked again later.
      if (can == SourceAccess::kPending) return;
      if (can == SourceAccess::kGone || can == SourceAccess::kNotStarted) {
        WireHeader r;
        FillHeader(c, p, &r);
        r.type = static_cast<uint8_t>(PacketType::kRepair);
        r.flags = kFlagUnreliable | kFlagAbsent;
        r.message_id = h.message_id;
        SetAbsentReason(can == SourceAccess::kNotStarted ? AbsentReason::kNotStarted
                                                         : AbsentReason::kReleased,
                        &r);
        Emit(p, r, nullptr, 0);
        Flush();
        Bump(stats.repair_absent_sent);
        return;
      }
      std::vector<RepairRange> asked;
      RepairRangeRejects rejects;
      ParseRepairRanges(payload, h.payload_length, BoundedSender::kMaxRepairRanges, &asked,
                        &rejects);
      Bump(stats.repair_ranges_empty, rejects.empty);
      Bump(stats.repair_ranges_over_limit, rejects.over_limit);
      if (asked.empty()) return;
      switch (c.bounded_tx.QueueRepair(p.rank, h.message_id, std::move(asked), source_bytes)) {
        case BoundedSender::RepairQueued::kMerged:
          Bump(stats.repair_requests_merged);
          return;
        case BoundedSender::RepairQueued::kDropped:
          Bump(stats.repair_requests_dropped);
          return;
        case BoundedSender::RepairQueued::kQueued:
        case BoundedSender::RepairQueued::kNothing:
          return;
      }
      return;
    }
    case PacketType::kCede: {
      const std::optional<CedeMessage> m = CedeMessageOf(h);
      if (!m) {
        Bump(stats.unsupported);
        return;
      }
      if (*m != CedeMessage::kAsk) {
        Bump(stats.cede_answers_received);
        if (c.bounded.on_cede_answer) {
          c.bounded.on_cede_answer(p.rank, h.message_id, *m == CedeMessage::kCeded);
        }
        return;
      }
      Bump(stats.cede_asks_received);
      const bool ceded = c.bounded.on_cede_ask && c.bounded.on_cede_ask(p.rank, h.message_id);
      WireHeader r;
      FillHeader(c, p, &r);
      r.type = static_cast<uint8_t>(PacketType::kCede);
      r.flags = kFlagUnreliable;
      r.message_id = h.message_id;
      SetCedeMessage(ceded ? CedeMessage::kCeded : CedeMessage::kRefused, &r);
      Emit(p, r, nullptr, 0);
      Flush();
      if (ceded) Bump(stats.cede_granted);
      return;
    }
    default:
      Bump(stats.unsupported);
      return;
  }
}

void Engine::SetBoundedHooks(uint32_t ctx, BoundedHooks hooks) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return;
  c->bounded = std::move(hooks);
  if (!c->bounded.read_source) c->bounded_tx.Clear();
}

absl::Status Engine::SendBounded(uint32_t ctx, int dst, uint64_t op, uint64_t total,
                                 uint64_t op_bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  // A failed context sends nothing: a send on it fails as every later operation does.
  if (c->failed) return absl::UnavailableError(c->failure);
  if (dst < 0 || dst >= c->size || dst == c->rank || !c->peers[dst].connected) {
    return absl::InvalidArgumentError(absl::StrCat("bounded send to rank ", dst,
                                                   " which is not a connected peer"));
  }
  c->bounded_tx.QueueSend(dst, op, total, c->peers[dst].bounded_payload, op_bytes);
  // The progress thread sends bounded jobs (paced, in incast order): wake it.
  impl_->waits.Wake();
  return absl::OkStatus();
}

absl::Status Engine::SendBoundedNotice(uint32_t ctx, uint64_t op, uint64_t op_bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  if (c->failed) return absl::OkStatus();  // see SendBounded
  for (Peer& p : c->peers) {
    if (p.rank == c->rank || !p.connected) continue;
    WireHeader h;
    impl_->FillHeader(*c, p, &h);
    h.type = static_cast<uint8_t>(PacketType::kData);
    h.flags = kFlagUnreliable;
    h.message_id = op;
    h.aux = op_bytes;
    impl_->Emit(p, h, nullptr, 0);
    impl_->Flush();
    Bump(impl_->stats.bounded_tx_packets);
  }
  impl_->waits.Wake();
  return absl::OkStatus();
}

absl::Status Engine::AskToCede(uint32_t ctx, int dst, uint64_t op) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  if (c->failed) return absl::UnavailableError(c->failure);
  if (dst < 0 || dst >= c->size || dst == c->rank || !c->peers[dst].connected) {
    return absl::InvalidArgumentError(absl::StrCat("cede request to rank ", dst,
                                                   " which is not a connected peer"));
  }
  Peer& p = c->peers[dst];
  WireHeader h;
  impl_->FillHeader(*c, p, &h);
  h.type = static_cast<uint8_t>(PacketType::kCede);
  h.flags = kFlagUnreliable;
  h.message_id = op;
  SetCedeMessage(CedeMessage::kAsk, &h);
  impl_->Emit(p, h, nullptr, 0);
  impl_->Flush();
  Bump(impl_->stats.cede_asks_sent);
  impl_->waits.Wake();
  return absl::OkStatus();
}

absl::Status Engine::RequestRepair(
    uint32_t ctx, int dst, uint64_t op,
    const std::vector<std::pair<uint64_t, uint64_t>>& missing) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  if (c->failed) return absl::OkStatus();  // see SendBounded
  if (dst < 0 || dst >= c->size || dst == c->rank || !c->peers[dst].connected) {
    return absl::InvalidArgumentError(absl::StrCat("repair request to rank ", dst,
                                                   " which is not a connected peer"));
  }
  Peer& p = c->peers[dst];
  const size_t per_packet = std::max<size_t>(1, p.max_payload / kRepairRangeBytes);
  for (size_t i = 0; i < missing.size(); i += per_packet) {
    const size_t n = std::min(per_packet, missing.size() - i);
    std::vector<uint8_t> body(kRepairRangeBytes * n);
    EncodeRepairRanges(missing.data() + i, n, body.data());
    WireHeader h;
    impl_->FillHeader(*c, p, &h);
    h.type = static_cast<uint8_t>(PacketType::kRepair);
    h.flags = kFlagUnreliable;
    h.message_id = op;
    h.payload_length = static_cast<uint32_t>(body.size());
    impl_->Emit(p, h, body.data(), h.payload_length);
    impl_->Flush();  // body lives on this stack frame
    Bump(impl_->stats.repair_requests_sent);
  }
  impl_->waits.Wake();
  return absl::OkStatus();
}

uint32_t Engine::BoundedPayload() const { return impl_->bounded_payload; }

size_t Engine::BoundedPending(uint32_t ctx) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Ctx* c = impl_->FindCtx(ctx);
  return c ? c->bounded_tx.Pending() : 0;
}

void Engine::SetBoundedSenders(uint32_t ctx, int senders) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (c) c->bounded_tx.SetSenders(senders);
}

int Engine::BoundedSenders(uint32_t ctx) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Ctx* c = impl_->FindCtx(ctx);
  return c ? c->bounded_tx.senders() : 0;
}

size_t Engine::BoundedQueuedSends(uint32_t ctx, uint64_t op) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Ctx* c = impl_->FindCtx(ctx);
  return c ? c->bounded_tx.QueuedSends(op) : 0;
}

}  // namespace transport
}  // namespace optireduce
