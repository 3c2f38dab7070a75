// Liveness and closing on the packet path. Each peer's state and rules live in its
// PeerLivenessState and PeerCloseState (peer_liveness_state.h, peer_close_state.h); this
// file routes to them: reports that the device found a peer unreachable (verified here
// against what the context sent), probes of peers that owe something (CheckLiveness), an
// ABORT from a failed peer, failing every pending operation of a context, close probes,
// and releasing contexts that finished their linger.
#include "transport_dpdk/engine/engine_impl.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {
using namespace engine_internal;  // NOLINT: the engine's own state (engine_state.h)

namespace {
// Checks run at most this often, however soon a peer's next probe is due.
constexpr std::chrono::milliseconds kMinLivenessGap{1};
}  // namespace

void Engine::Impl::TakeUnreachable() {
  UnreachableReport reports[16];
  const size_t n = io->TakeUnreachable(reports, 16);
  for (size_t i = 0; i < n; ++i) {
    const UnreachableReport& r = reports[i];
    for (auto& kv : contexts) {
      for (Peer& p : kv.second->peers) {
        if (!p.connected || p.handle != r.peer || p.liveness.unreachable()) continue;
        if (!ReportProvesGone(*kv.second, p, r)) {
          // Forged, quoting too little, or about a packet this context need not hear
          // about: the peer is probed at once, and the answer (or a report that quotes the
          // probe) tells.
          p.liveness.ProbeSoon();
          Bump(stats.unreachable_unproven);
          continue;
        }
        // A peer of this context reported gone before is the likely cause: a survivor
        // that failed on it and exited is reported too, and the ABORT naming the first
        // may be lost with its link (memif rings vanish with the link).
        for (const Peer& q : kv.second->peers) {
          if (&q != &p && q.connected && q.liveness.GoneOnItsOwn()) {
            p.liveness.ExplainedBy(q.liveness, io->UnreachableCause());
          }
        }
        p.liveness.Unreachable();
        Bump(stats.peers_unreachable);
      }
    }
  }
  if (n > 0) next_liveness = Clock::now();  // judge them (or probe them) in this iteration
}

bool Engine::Impl::ReportProvesGone(const Ctx& c, const Peer& p,
                                    const UnreachableReport& r) const {
  if (r.link_down) return true;
  // The quoted datagram must be one this context sent this peer, which only a sender
  // that knows the job's token can name (as TCP accepts an ICMP error only for a
  // sequence number in flight): our header, the token, both ranks, the peer's context...
  WireHeader h;
  if (c.token == 0 ||
      ParseQuotedHeader(r.quoted.data(), std::min<size_t>(r.quoted_len, kQuotedBytes), &h) !=
          ParseError::kOk ||
      h.session_token != c.token || h.src_rank != static_cast<uint32_t>(c.rank) ||
      h.dst_rank != static_cast<uint32_t>(p.rank) || h.dst_context != p.remote_ctx) {
    return false;
  }
  // ... and one it still awaits an answer to: a PING among the last ones sent (liveness
  // or close probe), or a sequenced packet not yet acknowledged.
  const auto type = static_cast<PacketType>(h.type);
  if (type == PacketType::kPing) {
    return IsCloseProbe(h) ? PeerLivenessState::InFlight(h.message_id, p.close.probe_id())
                           : p.liveness.PingInFlight(h.message_id);
  }
  const bool sequenced = !(h.flags & kFlagUnreliable) && type != PacketType::kAck &&
                         type != PacketType::kPong && type != PacketType::kAbort;
  return sequenced && h.seq >= p.unacked_base && h.seq < p.next_seq;
}

// Only what needs the peer counts: a message from it that arrived whole and
// waits for its recv (it may have finished and closed its context since), or
// an announced one not matched yet, needs nothing more from it.
bool Engine::Impl::PendingWith(const Ctx& c, const Peer& p,
                               const std::vector<char>& posted_from) const {
  if (!p.unacked.empty() || !p.ctrl.empty() || !p.data_queue.empty() || !p.out_msgs.empty() ||
      posted_from[p.rank]) {
    return true;
  }
  for (const auto& kv : p.in_msgs) {
    const InMsg& m = *kv.second;
    if ((m.matched || m.eager) && m.received < m.total) return true;  // bytes to come
  }
  // An old-style recv buffer with a message bound to it still arriving, or one that a
  // waitRecv blocks on (Buffer recvs are never posted: nothing else says it waits).
  for (auto it = c.regs.lower_bound({p.rank, 0}); it != c.regs.end() && it->first.first == p.rank;
       ++it) {
    if (!it->second->order.empty()) return true;
    if (it->second->sink->blocked_recv_waits.load(std::memory_order_relaxed) > 0) return true;
  }
  // A bounded receive waiting for its data (OptiReduce mode absorbs a late or lossy peer,
  // not a gone one).
  return c.bounded.awaits && c.bounded.awaits(p.rank);
}

void Engine::Impl::CheckLiveness(Clock::time_point now) {
  // Checks run every liveness_every; a much longer gap means this thread was
  // not scheduled, and what it did not receive meanwhile may be queued.
  const bool stalled = last_liveness != Clock::time_point{} &&
                       now - last_liveness > std::max<Clock::duration>(4 * liveness_every,
                                                                       liveness_cadence / 4);
  last_liveness = now;
  std::vector<char> posted_from;
  for (auto& kv : contexts) {
    Ctx& c = *kv.second;
    if (c.failed || c.closing) continue;
    posted_from.assign(c.size, 0);
    for (const auto& slot : c.posted) {
      for (const PostedRecv& r : slot.second) {
        // A receive from several sources waits on those whose context is still open; on
        // all of them only when every one has closed (then nothing can complete it).
        bool any_open = false;
        for (int src : r.srcs) {
          if (src >= 0 && src < c.size && !c.peers[src].close.peer_closing()) any_open = true;
        }
        for (int src : r.srcs) {
          if (src >= 0 && src < c.size && (!any_open || !c.peers[src].close.peer_closing())) {
            posted_from[src] = 1;
          }
        }
      }
    }
    for (Peer& p : c.peers) {
      if (!p.connected) continue;
      // A stall of this thread, or a path the backend is still setting up (nothing can
      // arrive from the peer yet): a fresh window, not the peer's silence.
      if (stalled || io->LinkComingUp(p.handle)) p.liveness.Restart(now);
      const PeerLiveness::Verdict verdict =
          p.liveness.Check(now, PendingWith(c, p, posted_from));
      if (verdict == PeerLiveness::Verdict::kAlive || verdict == PeerLiveness::Verdict::kProbe) {
        // Its next probe may be due before the regular check (the short first intervals).
        next_liveness =
            std::min(next_liveness, std::max(p.liveness.NextProbe(), now + kMinLivenessGap));
      }
      switch (verdict) {
        case PeerLiveness::Verdict::kIdle:
        case PeerLiveness::Verdict::kAlive:
          break;
        case PeerLiveness::Verdict::kProbe:
          SendLiveness(c, p, PacketType::kPing, p.liveness.NextPingId());
          break;
        case PeerLiveness::Verdict::kDead:
          Bump(stats.peers_dead);
          FailContext(c,
                      absl::StrCat("rank ", c.rank, ": ",
                                   p.liveness.DeathReason(io->UnreachableCause())),
                      p.liveness.BlamedRank());
          break;
      }
      if (c.failed) break;
    }
  }
  Flush();
}

void Engine::Impl::SendLiveness(Ctx& c, Peer& p, PacketType type, uint64_t id) {
  if (c.token == 0 || !p.connected) return;  // the peer would drop it
  WireHeader h;
  FillHeader(c, p, &h);
  h.type = static_cast<uint8_t>(type);
  h.message_id = id;
  Emit(p, h, nullptr, 0);
  if (type == PacketType::kPing) Bump(stats.pings_sent);
}

void Engine::Impl::HandleAbort(Ctx& c, Peer& p, const WireHeader& h) {
  p.liveness.Aborted(c.rank, AbortBlamedRank(h, c.size));
  // The blamed rank is gone for this context too (the group shares its fate): what
  // is pending with it fails now rather than at this rank's own next probe.
  const int blamed = p.liveness.BlamedRank();
  if (blamed != p.rank) {
    Peer& x = c.peers[blamed];
    if (x.connected) x.liveness.GoneWith(p.liveness);
  }
  next_liveness = Clock::now();  // judged in this iteration if something is pending
}

void Engine::Impl::FailContext(Ctx& c, const std::string& why, int blamed) {
  if (c.failed) return;
  c.failed = true;
  WakeWaiterIfOthers();  // its wait ends with this failure
  handshake_cv.notify_all();  // a connect waiting for this context's handshake ends
  c.failure = why;
  Bump(stats.contexts_failed);
  // OptiReduce mode absorbs lateness and loss, not a gone peer: its waits end with the
  // error too.
  if (c.bounded.on_failed) c.bounded.on_failed(blamed, why);
  // Every pending operation fails; no memory of any of them is read or
  // written after this (the lock is held, and nothing of the context is
  // sent or applied any more).
  for (auto& slot : c.posted) {
    for (PostedRecv& r : slot.second) r.sink->Fail(false, r.op, why);
  }
  c.posted.clear();
  c.arrivals.clear();
  for (auto& kv : c.regs) {
    RecvBufferReg& reg = *kv.second;
    for (auto& m : reg.order) {
      m->discard = true;
      m->target = nullptr;
    }
    reg.order.clear();
    reg.sink->Fail(false, 0, why);
  }
  for (Peer& p : c.peers) {
    for (auto& kv : p.in_msgs) {
      InMsg& m = *kv.second;
      if (m.matched && !m.discard && m.sink && m.kind == MsgKind::kUnbound) {
        m.sink->Fail(false, m.op, why);
      }
      m.discard = true;
      m.target = nullptr;
    }
    p.in_msgs.clear();
    p.buffer_arrivals.clear();
    for (auto& kv : p.out_msgs) {
      OutMsg& m = *kv.second;
      m.cancelled = true;
      if (m.sink) m.sink->Fail(true, m.op, why);
      m.sink.reset();
    }
    p.out_msgs.clear();
    p.data_queue.clear();
    p.ctrl.clear();
    p.unacked.clear();
    p.unacked_base = p.next_seq;
    p.inflight_bytes = 0;
  }
  c.bounded_tx.Clear();
  // Tell the peers (like closing TCP connections): what they have pending
  // with this rank cannot complete. A lost ABORT leaves them their probes.
  for (Peer& p : c.peers) {
    if (!p.connected) continue;
    WireHeader h;
    FillHeader(c, p, &h);
    h.type = static_cast<uint8_t>(PacketType::kAbort);
    SetAbortBlame(blamed, &h);
    if (c.token != 0) Emit(p, h, nullptr, 0);
  }
  Flush();
}

uint64_t Engine::Impl::RefuseOnFailed(Ctx& c, bool send, const std::shared_ptr<OpSink>& sink) {
  const uint64_t op = next_op++;
  sink->Fail(send, op, c.failure);
  return op;
}

void Engine::Impl::ReapClosing(Clock::time_point now) {
  for (auto it = contexts.begin(); it != contexts.end();) {
    Ctx& c = *it->second;
    if (!c.closing) {
      ++it;
      continue;
    }
    // A failed context has nothing left to finish.
    bool done = c.failed || now - c.closing_since >= opts.linger_max;
    bool confirmed = false;
    if (!done) {
      // Released as soon as every peer is settled: nothing of ours outstanding, every
      // arrival acknowledged, and the peer confirmed it waits for nothing of ours (so no
      // retransmission of its will need our ack). Probes go out for unconfirmed peers.
      confirmed = true;
      for (Peer& p : c.peers) {
        if (!CloseSettled(c, p, now)) confirmed = false;
      }
      done = confirmed;
    }
    if (!done && now - c.last_rx >= opts.linger_quiet) {
      // Fallback (a peer that does not answer probes): peers quiet for linger_quiet.
      done = true;
      for (const Peer& p : c.peers) {
        // A peer that never answered the handshake has nothing of ours to finish.
        if (p.connected && p.unacked_base > 0 && !NothingOutstanding(p)) done = false;
      }
    }
    if (!done) {
      ++it;
      continue;
    }
    Bump(confirmed ? stats.closes_confirmed : stats.closes_lingered);
    ClosedCtx gone;
    gone.id = c.id;
    gone.rank = c.rank;
    gone.token = c.token;
    for (const Peer& p : c.peers) {
      gone.peers.emplace_back(p.handle, p.remote_ctx);
      gone.connected.push_back(p.connected ? 1 : 0);
    }
    closed.push_back(std::move(gone));
    if (closed.size() > kMaxClosedContexts) closed.pop_front();
    // The transmit batch names its datagrams' peers (for refused ones): nothing in it
    // may outlive the context's peers freed here (a close probe above may be in it).
    Flush();
    it = contexts.erase(it);
  }
}

bool Engine::Impl::CloseSettled(Ctx& c, Peer& p, Clock::time_point now) {
  // Never connected, or the handshake never completed: nothing between us. A peer whose
  // address the network reports unreachable is gone.
  if (!p.connected || p.unacked_base == 0 || p.liveness.unreachable()) return true;
  if (!NothingOutstanding(p) || p.acks->Pending()) return false;
  if (p.close.confirmed()) return true;
  if (c.token == 0) return false;  // the peer would drop a probe
  if (const uint64_t id = p.close.ProbeDue(now)) {
    WireHeader h;
    FillHeader(c, p, &h);
    h.type = static_cast<uint8_t>(PacketType::kPing);
    h.message_id = id;
    SetCloseProbe(&h);
    Emit(p, h, nullptr, 0);
    Bump(stats.close_probes_sent);
  }
  return false;
}

void Engine::Impl::AnswerClosedProbe(const WireHeader& h) {
  for (const ClosedCtx& g : closed) {
    if (g.id != h.dst_context) continue;
    if (g.token == 0 || h.session_token != g.token || h.dst_rank != static_cast<uint32_t>(g.rank) ||
        h.src_rank >= g.peers.size() || !g.connected[h.src_rank]) {
      return;
    }
    WireHeader pong;
    pong.session_token = g.token;
    pong.src_rank = static_cast<uint32_t>(g.rank);
    pong.dst_rank = h.src_rank;
    pong.dst_context = g.peers[h.src_rank].second;
    pong.type = static_cast<uint8_t>(PacketType::kPong);
    pong.message_id = h.message_id;
    SetCloseReply(CloseReply::kSettled, &pong);
    EmitTo(nullptr, g.peers[h.src_rank].first, pong, nullptr, 0);
    return;
  }
}

}  // namespace transport
}  // namespace optireduce
