// The reliable sender: sequence numbers for new packets (SendNew, SendNextData), what
// goes out per peer and iteration under the windows (Pump), retransmission, acks in
// both directions (SendAck, HandleAck) and the completion of sent messages.
#include "transport_dpdk/engine/engine_impl.h"

#include <algorithm>
#include <memory>

namespace optireduce {
namespace transport {
using namespace engine_internal;  // NOLINT: the engine's own state (engine_state.h)

void Engine::Impl::SendNew(Ctx& c, Peer& p, WireHeader h,
                           std::shared_ptr<OutMsg> msg) {
  FillHeader(c, p, &h);
  h.seq = p.next_seq++;
  // Every sequenced packet carries our cumulative ack. When that says all an ACK
  // would (no gap to report, no duplicate), the pending ACK is not sent.
  h.flags |= kFlagAckPiggyback;
  h.ack_seq = p.rx.cum();
  if (p.acks->Pending() && p.dsack == kNoSeq && p.rx.highest() <= p.rx.cum()) {
    p.acks->OnAckSent();
    Bump(stats.acks_piggybacked);
  }
  TxRecord r;
  r.h = h;
  r.msg = std::move(msg);
  p.inflight_bytes += h.payload_length;
  const uint8_t* body =
      r.msg && h.payload_length ? r.msg->data + h.offset : nullptr;
  p.unacked.push_back(std::move(r));
  p.sender->OnSendNew(h.seq, h.payload_length + kHeaderBytes, Clock::now());
  Emit(p, h, body, h.payload_length);
}

bool Engine::Impl::SendNextData(Ctx& c, Peer& p) {
  while (!p.data_queue.empty()) {
    std::shared_ptr<OutMsg> m = p.data_queue.front();
    if (m->cancelled || m->packets_sent == m->packets_total) {
      p.data_queue.pop_front();
      continue;
    }
    const uint64_t len = std::min<uint64_t>(p.max_payload, m->len - m->next_offset);
    WireHeader h;
    h.type = static_cast<uint8_t>(PacketType::kData);
    h.flags = (m->eager ? kFlagEager : 0) |
              (m->kind == MsgKind::kBuffer ? kFlagBufferKind : 0);
    h.message_id = m->id;
    h.slot = m->slot;
    h.offset = m->next_offset;
    h.total_length = m->len;
    h.aux = m->remote_offset;
    h.payload_length = static_cast<uint32_t>(len);
    m->next_offset += len;
    ++m->packets_sent;
    if (m->packets_sent == m->packets_total) p.data_queue.pop_front();
    SendNew(c, p, h, m);
    return true;
  }
  return false;
}

void Engine::Impl::Retransmit(Ctx& c, Peer& p, uint64_t seq,
                              Clock::time_point now) {
  if (seq < p.unacked_base || seq - p.unacked_base >= p.unacked.size()) return;
  TxRecord& r = p.unacked[seq - p.unacked_base];
  if (r.msg && r.msg->cancelled) {
    // The memory behind this packet is gone: fill the sequence number with
    // a NOP so the receiver's cumulative point can move on.
    p.inflight_bytes -= r.h.payload_length;
    WireHeader nop;
    FillHeader(c, p, &nop);
    nop.type = static_cast<uint8_t>(PacketType::kNop);
    nop.flags = kFlagAckPiggyback;
    nop.seq = r.h.seq;
    nop.message_id = r.h.message_id;
    r.h = nop;
    r.msg.reset();
  }
  r.h.ack_seq = p.rx.cum();  // the ack it carries is today's
  p.sender->OnRetransmit(seq, now);
  Bump(stats.retransmits);
  Bump(stats.retransmitted_bytes, r.h.payload_length);
  const uint8_t* body =
      r.msg && r.h.payload_length ? r.msg->data + r.h.offset : nullptr;
  Emit(p, r.h, body, r.h.payload_length);
}

void Engine::Impl::Pump(Ctx& c, Peer& p, Clock::time_point now,
                        Clock::time_point* deadline) {
  ReliableSender& s = *p.sender;
  // 1. Timers: RACK's reorder timer, the tail-loss probe, the RTO (which
  //    marks everything in flight lost; it is resent below under the window).
  const ReliableSender::Counters before = s.counters();
  s.OnTimer(now);
  Bump(stats.rto_events, s.counters().rto_events - before.rto_events);
  Bump(stats.fast_retransmits, s.counters().rack_lost - before.rack_lost);
  // 2. Lost packets, as the congestion window and pacing allow.
  while (!tx_blocked) {
    const uint64_t seq = s.NextRetransmit(now);
    if (seq == kNoSeq) break;
    Retransmit(c, p, seq, now);
  }
  // 3. A tail-loss probe: new data if the receiver's window has room, else
  //    the newest packet again.
  if (s.probe_pending() && !tx_blocked) {
    const bool room = p.next_seq - p.unacked_base < kMaxInflightPackets &&
                      p.inflight_bytes + p.max_payload <= c.window;
    const uint64_t seq = p.next_seq;
    if (room && SendNextData(c, p)) {
      s.OnProbeSent(seq);
    } else if (s.ProbeSeq() != kNoSeq) {
      const uint64_t probe = s.ProbeSeq();
      Retransmit(c, p, probe, now);
      s.OnProbeSent(probe);
    } else {
      s.OnProbeSent(kNoSeq);
    }
    Bump(stats.tlp_probes);
  }
  // 4. Control packets (they bypass the byte and congestion windows but not
  //    the seq window).
  while (!p.ctrl.empty() &&
         p.next_seq - p.unacked_base < kMaxInflightPackets) {
    SendNew(c, p, p.ctrl.front(), nullptr);
    p.ctrl.pop_front();
  }
  // 5. New data within the receiver's and the congestion window.
  int budget = kPeerBudget;
  while (budget > 0 && !tx_blocked && !p.data_queue.empty() &&
         p.next_seq - p.unacked_base < kMaxInflightPackets &&
         p.inflight_bytes + p.max_payload <= c.window &&
         s.CanSendNew(p.max_payload + kHeaderBytes, now)) {
    if (!SendNextData(c, p)) break;
    --budget;
  }
  const auto due = s.Deadline(now);
  if (due < *deadline) *deadline = due;
  // 6. Acknowledge what arrived, when the ack scheduler says so.
  if (p.acks->Due(now)) {
    SendAck(c, p);
  } else if (p.acks->Pending() && p.acks->Deadline() < *deadline) {
    *deadline = p.acks->Deadline();
  }
}

void Engine::Impl::SendAck(Ctx& c, Peer& p) {
  if (tx_n == kBurst) Flush();
  WireHeader h;
  FillHeader(c, p, &h);
  h.type = static_cast<uint8_t>(PacketType::kAck);
  h.ack_seq = p.rx.cum();
  if (p.dsack != kNoSeq) SetAckDuplicate(p.dsack, &h);
  p.dsack = kNoSeq;
  const size_t slot = tx_n;
  const size_t n = p.rx.Sack(tx_sack[slot], kMaxSackBytes);
  h.payload_length = static_cast<uint32_t>(n);
  Emit(p, h, n ? tx_sack[slot] : nullptr, static_cast<uint32_t>(n));
  p.acks->OnAckSent();
  Bump(stats.acks_sent);
}

void Engine::Impl::HandleAck(Ctx& c, Peer& p, uint64_t ack_seq, uint64_t dsack,
                             const uint8_t* sack, uint32_t sack_len) {
  ReliableSender& s = *p.sender;
  const ReliableSender::Counters before = s.counters();
  const bool ok = s.OnAck(ack_seq, sack, sack_len, dsack, Clock::now(),
                          [&](uint64_t seq) {
                            MarkAcked(c, p, p.unacked[seq - p.unacked_base]);
                          });
  if (!ok) {
    Bump(stats.unknown_message);  // acks what was never sent
    return;
  }
  while (p.unacked_base < s.scoreboard().base() && !p.unacked.empty()) {
    p.unacked.pop_front();
    ++p.unacked_base;
  }
  Bump(stats.fast_retransmits, s.counters().rack_lost - before.rack_lost);
  Bump(stats.spurious_retransmits, s.counters().spurious - before.spurious);
  Bump(stats.spurious_rtos, s.counters().spurious_rtos - before.spurious_rtos);
  Bump(stats.long_silences, s.counters().long_silences - before.long_silences);
  Bump(stats.long_silence_us, s.counters().long_silence_us - before.long_silence_us);
}

void Engine::Impl::MarkAcked(Ctx& c, Peer& p, TxRecord& r) {
  if (r.acked) return;
  r.acked = true;
  p.inflight_bytes -= r.h.payload_length;
  if (r.msg) {
    std::shared_ptr<OutMsg> m = std::move(r.msg);
    ++m->packets_acked;
    if (!m->cancelled && m->packets_acked == m->packets_total) {
      // Every packet is in: the receiver has the whole message when the kWithdraw reaches it.
      if (m->withdrawn && !m->delivered) QueueWithdraw(p, *m);
      CompleteOut(p, m);
    }
  }
}

void Engine::Impl::QueueWithdraw(Peer& p, const OutMsg& m) {
  WireHeader h;
  h.type = static_cast<uint8_t>(PacketType::kWithdraw);
  h.message_id = m.id;
  h.slot = m.slot;
  p.ctrl.push_back(h);
}

void Engine::Impl::CompleteOut(Peer& p, const std::shared_ptr<OutMsg>& m) {
  // An eager unbound send is done when the receiver took it (its credit
  // came back), not when its packets are acknowledged: a send nobody
  // receives times out, as over Gloo's TCP. Its payload is a private copy,
  // so retransmissions after that never read the caller's buffer.
  if (m->completed || (m->eager && m->kind == MsgKind::kUnbound && !m->delivered)) return;
  m->completed = true;
  p.out_msgs.erase(m->id);
  if (m->sink) m->sink->Complete(/*send=*/true, m->op, p.rank);
}

}  // namespace transport
}  // namespace optireduce
