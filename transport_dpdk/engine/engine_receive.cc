// The receive path: a datagram from parse to the packet handlers (HandleDatagram,
// Dispatch), early datagrams kept until their peer connects, eager and rendezvous data,
// and matching arrivals to posted recvs and registered recv buffers.
#include "transport_dpdk/engine/engine_impl.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {
using namespace engine_internal;  // NOLINT: the engine's own state (engine_state.h)

void Engine::Impl::HandleDatagram(uint8_t* data, uint32_t len) {
  Bump(stats.rx_packets);
  Bump(stats.rx_bytes, len);
  WireHeader h;
  const ParseError err = ParseDatagram(data, len, &h, link_protects_payload);
  if (err != ParseError::kOk) {
    Bump(stats.malformed[static_cast<int>(err)]);
    return;
  }
  Ctx* c = FindCtx(h.dst_context);
  if (!c) {
    Bump(stats.bad_context);
    if (static_cast<PacketType>(h.type) == PacketType::kPing && IsCloseProbe(h)) {
      AnswerClosedProbe(h);
    }
    return;
  }
  if (c->closing) c->last_rx = Clock::now();
  if (KeepForLater(*c, h)) {
    // A peer that finished connecting sends before this rank has connected
    // back (connectFullMesh connects pairs one by one): keep its packets
    // instead of making it wait for a retransmission.
    if (c->early.size() >= kMaxEarlyDatagrams || c->early_bytes + len > kMaxEarlyBytes) {
      Bump(stats.early_dropped);
      return;
    }
    c->early.emplace_back(data, data + len);
    c->early_bytes += len;
    Bump(stats.early_kept);
    return;
  }
  Dispatch(*c, h, data + kHeaderBytes);
}

bool Engine::Impl::KeepForLater(const Ctx& c, const WireHeader& h) const {
  if (c.closing || h.dst_rank != static_cast<uint32_t>(c.rank) ||
      h.src_rank >= static_cast<uint32_t>(c.size) ||
      h.src_rank == static_cast<uint32_t>(c.rank)) {
    return false;
  }
  if (c.token != 0 && h.session_token != c.token) return false;
  return c.token == 0 || !c.peers[h.src_rank].connected;
}

void Engine::Impl::ReplayEarly(Ctx& c) {
  for (auto it = c.early.begin(); it != c.early.end();) {
    WireHeader h;
    if (ParseDatagram(it->data(), it->size(), &h, link_protects_payload) != ParseError::kOk) {
      Bump(stats.malformed[static_cast<int>(ParseError::kBadLength)]);  // cannot happen
    } else if (KeepForLater(c, h)) {
      ++it;
      continue;
    } else {
      Dispatch(c, h, it->data() + kHeaderBytes);
    }
    c.early_bytes -= it->size();
    it = c.early.erase(it);
  }
}

void Engine::Impl::Dispatch(Ctx& c, const WireHeader& h, const uint8_t* payload) {
  if (c.token == 0 || h.session_token != c.token) {
    Bump(stats.bad_token);
    return;
  }
  if (h.dst_rank != static_cast<uint32_t>(c.rank) ||
      h.src_rank >= static_cast<uint32_t>(c.size) ||
      h.src_rank == static_cast<uint32_t>(c.rank) ||
      !c.peers[h.src_rank].connected) {
    Bump(stats.bad_rank);
    return;
  }
  Peer& p = c.peers[h.src_rank];
  if (c.failed) {
    Bump(stats.failed_context);
    return;
  }
  // It spoke: alive, whatever anyone said about it.
  p.liveness.Heard(Clock::now(), static_cast<PacketType>(h.type) == PacketType::kPong);
  switch (static_cast<PacketType>(h.type)) {
    case PacketType::kPing:
      if (IsCloseProbe(h)) {
        // A closing peer asks whether we wait for anything of its: answered whatever
        // our own state (open or closing).
        p.close.PeerClosing();
        WireHeader pong;
        FillHeader(c, p, &pong);
        pong.type = static_cast<uint8_t>(PacketType::kPong);
        pong.message_id = h.message_id;
        SetCloseReply(NothingOutstanding(p) ? CloseReply::kSettled : CloseReply::kBusy, &pong);
        Emit(p, pong, nullptr, 0);
        return;
      }
      // A closing context does not answer: nothing more comes from it for a peer
      // still waiting (its acks still answer retransmissions meanwhile).
      if (!c.closing) SendLiveness(c, p, PacketType::kPong, h.message_id);
      return;
    case PacketType::kPong:
      Bump(stats.pongs_received);
      if (c.closing) p.close.Answered(h.message_id, IsCloseSettled(h));
      return;
    case PacketType::kAbort:
      HandleAbort(c, p, h);
      return;
    default:
      break;
  }
  if (h.flags & kFlagUnreliable) {
    if (!c.closing) HandleBounded(c, p, h, payload);
    return;
  }
  // An ACK, or a sequenced packet's piggybacked ack (taken even from a duplicate: it is
  // refreshed on every retransmission; only one that moves the cumulative point says
  // anything). The first one completes the connect handshake.
  const bool ack = static_cast<PacketType>(h.type) == PacketType::kAck;
  const bool unacked_none = p.unacked_base == 0;
  if (ack) {
    Bump(stats.acks_received);
    HandleAck(c, p, h.ack_seq, AckDuplicateOf(h).value_or(kNoSeq), payload, h.payload_length);
  } else if ((h.flags & kFlagAckPiggyback) && h.ack_seq > p.unacked_base) {
    Bump(stats.piggybacked_acks_received);
    HandleAck(c, p, h.ack_seq, kNoSeq, nullptr, 0);
  }
  if (unacked_none && p.unacked_base > 0) handshake_cv.notify_all();
  if (ack) return;
  // It sent something: ask again once it is acknowledged (answers to earlier probes
  // describe it before this packet).
  p.close.SequencedArrival();
  switch (p.rx.Classify(h.seq)) {
    case ReceiveWindow::Verdict::kDuplicate:
      Bump(stats.duplicates);
      // Our ack may have been lost, or the sender resent needlessly: ack
      // now and report the duplicate (the sender undoes what it spent).
      p.dsack = h.seq;
      p.acks->OnArrival(Clock::now(), 0, /*urgent=*/true);
      return;
    case ReceiveWindow::Verdict::kOutOfWindow:
      Bump(stats.out_of_window);
      return;
    case ReceiveWindow::Verdict::kNew:
      break;
  }
  // Only packets that were fully validated and applied consume their seq;
  // a rejected forgery cannot shadow the real packet with that number.
  // Ack at once when the sender acts on it: a gap opened or filled, a
  // control packet, or the last packet of a message.
  const bool in_order = h.seq == p.rx.cum() && p.rx.highest() <= h.seq;
  const bool urgent = !in_order || static_cast<PacketType>(h.type) != PacketType::kData ||
                      h.offset + h.payload_length >= h.total_length;
  if (!Apply(c, p, h, payload)) return;
  p.rx.Mark(h.seq);
  p.acks->OnArrival(Clock::now(), h.payload_length, urgent);
}

bool Engine::Impl::Apply(Ctx& c, Peer& p, const WireHeader& h,
                         const uint8_t* payload) {
  switch (static_cast<PacketType>(h.type)) {
    case PacketType::kData:
      return (h.flags & kFlagEager) ? ApplyEager(c, p, h, payload)
                                    : ApplyRdvData(c, p, h, payload);
    case PacketType::kRts:
      return ApplyRts(c, p, h);
    case PacketType::kCts:
      return ApplyCts(c, p, h);
    case PacketType::kCredit:
      if (p.eager_credit + static_cast<int64_t>(h.aux) >
          static_cast<int64_t>(opts.eager_budget_per_peer)) {
        Bump(stats.unknown_message);  // returns credit never lent
        return false;
      }
      p.eager_credit += static_cast<int64_t>(h.aux);
      if (auto it = p.out_msgs.find(h.message_id);
          it != p.out_msgs.end() && it->second->eager) {
        std::shared_ptr<OutMsg> m = it->second;
        m->delivered = true;
        CompleteOut(p, m);
      }
      return true;
    case PacketType::kNop:
      return true;
    case PacketType::kWithdraw:
      return ApplyWithdraw(c, p, h);
    case PacketType::kAck:
    case PacketType::kRepair:  // bounded only, handled before sequencing
    case PacketType::kCede:
    case PacketType::kPing:    // liveness, handled before sequencing
    case PacketType::kPong:
    case PacketType::kAbort:
      break;
  }
  return false;
}

bool Engine::Impl::ApplyEager(Ctx& c, Peer& p, const WireHeader& h,
                              const uint8_t* payload) {
  const MsgKind kind =
      (h.flags & kFlagBufferKind) ? MsgKind::kBuffer : MsgKind::kUnbound;
  std::shared_ptr<InMsg> m;
  bool created = false;
  auto it = p.in_msgs.find(h.message_id);
  if (it == p.in_msgs.end()) {
    const uint64_t charge = std::max<uint64_t>(h.total_length, kMinEagerCharge);
    if (h.message_id < p.next_announce ||
        h.message_id >= p.next_announce + kMaxPendingMessages ||
        h.total_length > opts.eager_max_message ||
        p.eager_stashed + charge > opts.eager_budget_per_peer) {
      Bump(stats.unknown_message);
      return false;
    }
    m = std::make_shared<InMsg>();
    m->id = h.message_id;
    m->slot = h.slot;
    m->total = h.total_length;
    m->remote_offset = h.aux;
    m->kind = kind;
    m->eager = true;
    m->charge = charge;
    m->stash = payloads->Take(h.total_length);
    p.eager_stashed += charge;
    p.in_msgs.emplace(m->id, m);
    created = true;
  } else {
    m = it->second;
    if (!m->eager || m->total != h.total_length || m->slot != h.slot ||
        m->kind != kind ||
        (kind == MsgKind::kBuffer && m->remote_offset != h.aux)) {
      Bump(stats.unknown_message);
      return false;
    }
  }
  if (h.payload_length > 0) {
    if (m->matched) {
      if (m->target) std::memcpy(m->target + h.offset, payload, h.payload_length);
    } else {
      std::memcpy(m->stash.data() + h.offset, payload, h.payload_length);
      const uint64_t end = h.offset + h.payload_length;
      if (!m->stashed.empty() && m->stashed.back().second == h.offset) {
        m->stashed.back().second = end;
      } else {
        m->stashed.emplace_back(h.offset, end);
      }
    }
  }
  m->received += h.payload_length;
  if (created) TryAnnounce(c, p);
  MaybeComplete(c, p, m);
  return true;
}

bool Engine::Impl::ApplyRdvData(Ctx& c, Peer& p, const WireHeader& h,
                                const uint8_t* payload) {
  auto it = p.in_msgs.find(h.message_id);
  if (it == p.in_msgs.end() || it->second->eager || !it->second->matched ||
      it->second->completed || it->second->slot != h.slot) {
    Bump(stats.unknown_message);
    return false;
  }
  std::shared_ptr<InMsg> m = it->second;
  if (m->total != h.total_length) {
    Bump(stats.bad_offset);
    return false;
  }
  if (m->target && h.payload_length) {
    std::memcpy(m->target + h.offset, payload, h.payload_length);
  }
  m->received += h.payload_length;
  MaybeComplete(c, p, m);
  return true;
}

bool Engine::Impl::ApplyRts(Ctx& c, Peer& p, const WireHeader& h) {
  if (h.message_id < p.next_announce ||
      h.message_id >= p.next_announce + kMaxPendingMessages ||
      p.in_msgs.count(h.message_id)) {
    Bump(stats.unknown_message);
    return false;
  }
  auto m = std::make_shared<InMsg>();
  m->id = h.message_id;
  m->slot = h.slot;
  m->total = h.total_length;
  m->remote_offset = h.aux;
  m->kind = (h.flags & kFlagBufferKind) ? MsgKind::kBuffer : MsgKind::kUnbound;
  m->eager = false;
  p.in_msgs.emplace(m->id, m);
  TryAnnounce(c, p);
  return true;
}

bool Engine::Impl::ApplyCts(Ctx& c, Peer& p, const WireHeader& h) {
  auto it = p.out_msgs.find(h.message_id);
  if (it == p.out_msgs.end()) {
    // A grant for a send that was cancelled (its buffer went away).
    return true;
  }
  std::shared_ptr<OutMsg> m = it->second;
  if (!m->waiting_cts) {
    Bump(stats.unknown_message);
    return false;
  }
  m->waiting_cts = false;
  p.data_queue.push_back(m);
  return true;
}

bool Engine::Impl::ApplyWithdraw(Ctx& c, Peer& p, const WireHeader& h) {
  auto it = p.in_msgs.find(h.message_id);
  // Gone: a receive took it (its credit went back with its completion).
  if (it == p.in_msgs.end()) return true;
  std::shared_ptr<InMsg> m = it->second;
  if (m->kind != MsgKind::kUnbound || m->slot != h.slot) {
    Bump(stats.unknown_message);
    return false;
  }
  if (m->matched) return true;  // taken: it completes as usual
  Bump(stats.withdrawn_messages);
  if (m->id >= p.next_announce) {
    m->withdrawn = true;  // not announced yet: dropped when its turn comes (Announce)
    return true;
  }
  auto a = c.arrivals.find(m->slot);
  if (a != c.arrivals.end()) {
    auto& q = a->second;
    q.erase(std::remove_if(q.begin(), q.end(),
                           [&](const Arrival& x) { return x.peer == p.rank && x.msg == m; }),
            q.end());
    if (q.empty()) c.arrivals.erase(a);
  }
  DropWithdrawn(c, p, m);
  return true;
}

void Engine::Impl::DropWithdrawn(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m) {
  if (!m->eager) {
    p.in_msgs.erase(m->id);
    return;
  }
  m->matched = true;
  m->discard = true;
  m->target = nullptr;
  m->stash.Release();
  m->stashed = {};
  MaybeComplete(c, p, m);
}

// ===================== matching =====================

void Engine::Impl::TryAnnounce(Ctx& c, Peer& p) {
  // Messages are announced strictly in message-id order per peer, so sends
  // from one peer on one slot match recvs in the order they were posted.
  for (;;) {
    auto it = p.in_msgs.find(p.next_announce);
    if (it == p.in_msgs.end()) return;
    ++p.next_announce;
    std::shared_ptr<InMsg> m = it->second;
    Announce(c, p, m);
  }
}

void Engine::Impl::Announce(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m) {
  if (m->withdrawn) {
    DropWithdrawn(c, p, m);
    return;
  }
  if (m->kind == MsgKind::kBuffer) {
    auto reg = c.regs.find({p.rank, m->slot});
    if (reg != c.regs.end()) {
      BindBuffer(c, p, m, reg->second);
    } else {
      p.buffer_arrivals[m->slot].push_back(m);
    }
    return;
  }
  auto posted = c.posted.find(m->slot);
  if (posted != c.posted.end()) {
    auto& q = posted->second;
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (std::find(it->srcs.begin(), it->srcs.end(), p.rank) ==
          it->srcs.end()) {
        continue;
      }
      PostedRecv r = std::move(*it);
      q.erase(it);
      if (q.empty()) c.posted.erase(posted);
      Bind(c, p, m, r);
      return;
    }
  }
  c.arrivals[m->slot].push_back({p.rank, m});
}

void Engine::Impl::Bind(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m,
                        const PostedRecv& r) {
  m->matched = true;
  m->sink = r.sink;
  m->op = r.op;
  if (m->total > r.capacity) {
    r.sink->Fail(false, r.op,
                 absl::StrCat("rank ", p.rank, " sent ", m->total,
                              " bytes on slot ", m->slot,
                              " but the recv has room for ", r.capacity));
    m->discard = true;
    m->target = nullptr;
  } else {
    m->target = r.ptr;
  }
  AfterBind(c, p, m);
}

void Engine::Impl::BindBuffer(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m,
                              const std::shared_ptr<RecvBufferReg>& reg) {
  m->matched = true;
  m->sink = reg->sink;
  m->reg = reg;
  if (m->remote_offset > reg->size || m->total > reg->size - m->remote_offset) {
    Bump(stats.bad_offset);
    reg->sink->Fail(false, 0,
                    absl::StrCat("rank ", p.rank, " wrote ", m->total,
                                 " bytes at offset ", m->remote_offset,
                                 " into a recv buffer of ", reg->size,
                                 " bytes on slot ", m->slot));
    m->discard = true;
    m->target = nullptr;
  } else {
    m->target = reg->base + m->remote_offset;
  }
  reg->order.push_back(m);
  AfterBind(c, p, m);
}

void Engine::Impl::AfterBind(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m) {
  if (m->eager) {
    if (m->target) {
      // Only the bytes that arrived: the rest of the stash is recycled memory (another
      // message's data), and a receive that fails before they come must not leave it
      // in the caller's buffer. Later packets are written in place.
      for (const auto& [begin, end] : m->stashed) {
        std::memcpy(m->target + begin, m->stash.data() + begin, end - begin);
      }
    }
    m->stash.Release();
    m->stashed = {};
  } else {
    WireHeader cts;
    cts.type = static_cast<uint8_t>(PacketType::kCts);
    cts.message_id = m->id;
    cts.slot = m->slot;
    cts.total_length = m->total;
    p.ctrl.push_back(cts);
  }
  MaybeComplete(c, p, m);
}

void Engine::Impl::MaybeComplete(Ctx& c, Peer& p,
                                 const std::shared_ptr<InMsg>& m) {
  if (m->completed || !m->matched || m->received < m->total) return;
  m->completed = true;
  if (m->eager) {
    p.eager_stashed -= m->charge;
    WireHeader credit;
    credit.type = static_cast<uint8_t>(PacketType::kCredit);
    credit.message_id = m->id;  // completes the sender's send (CompleteOut)
    credit.aux = m->charge;
    p.ctrl.push_back(credit);
  }
  p.in_msgs.erase(m->id);
  if (m->kind == MsgKind::kUnbound) {
    if (!m->discard && m->sink) m->sink->Complete(false, m->op, p.rank);
    return;
  }
  m->done = true;
  auto reg = m->reg.lock();
  if (!reg) return;
  while (!reg->order.empty() && reg->order.front()->done) {
    auto front = reg->order.front();
    reg->order.pop_front();
    if (!front->discard) reg->sink->Complete(false, 0, reg->peer);
  }
}

}  // namespace transport
}  // namespace optireduce
