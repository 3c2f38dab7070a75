// The Engine's public calls: creation and shutdown, contexts and peers (register,
// connect, wait, close), posting sends and recvs, recv buffers, cancellation, and the
// read-only views (stats, debug state, failure). The work itself is in engine_*.cc.
#include "transport_dpdk/engine/engine.h"

#include <time.h>

#include <algorithm>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport_dpdk/engine/engine_impl.h"

namespace optireduce {
namespace transport {
using namespace engine_internal;  // NOLINT: the engine's own state (engine_state.h)

namespace engine_internal {

// Where an engine's context ids start: random, so that a packet of an earlier run — same
// addresses, and the same session token when OPTIREDUCE_SESSION_TOKEN fixes it — names a
// context that does not exist in this one and is dropped (counted as bad_context) instead of
// being taken for one of this run's operations, whose ids restart at the same values.
uint32_t RandomContextEpoch() {
  std::random_device rd;
  const uint32_t epoch = rd() & 0x7fffffffu;  // leaves 2^31 ids before a wrap
  return epoch == 0 ? 1 : epoch;
}

}  // namespace engine_internal

namespace {

std::string RanksToString(const std::vector<int>& r) {
  return absl::StrCat("[", absl::StrJoin(r, ","), "]");
}

// EngineOptions::peer_dead (0: no silence bound); gloo_ext fills it from
// OPTIREDUCE_PEER_DEAD_MS.
absl::StatusOr<std::chrono::milliseconds> ResolvePeerDead(std::chrono::milliseconds configured) {
  constexpr long kMin = 10, kMax = 3600000;
  if (configured.count() == 0) return configured;
  if (configured.count() < kMin || configured.count() > kMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine options: peer_dead ", configured.count(), " ms outside [", kMin, ", ", kMax,
        "] ms"));
  }
  return configured;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Engine>> Engine::Create(
    std::unique_ptr<PacketIo> io, const EngineOptions& options,
    size_t rx_buffer_bytes) {
  if (!io) return absl::InvalidArgumentError("Engine needs a PacketIo");
  if (io->MaxDatagram() < kHeaderBytes + 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backend datagram size ", io->MaxDatagram(), " is below the ",
        kHeaderBytes + 64, " bytes the protocol needs"));
  }
  if (options.min_rto.count() <= 0 || options.max_rto < options.min_rto) {
    return absl::InvalidArgumentError("engine options: need 0 < min_rto <= max_rto");
  }
  EngineOptions resolved = options;
  auto peer_dead = ResolvePeerDead(options.peer_dead);
  if (!peer_dead.ok()) return peer_dead.status();
  resolved.peer_dead = *peer_dead;
  std::shared_ptr<Engine> e(new Engine());
  e->impl_ = std::make_unique<Impl>(std::move(io), resolved, rx_buffer_bytes);
  Impl* impl = e->impl_.get();
  impl->thread = std::thread([impl] { impl->Run(); });
  return e;
}

Engine::~Engine() {
  if (!impl_) return;
  // Let closing contexts finish their linger (bounded by linger_max).
  const auto give_up = Clock::now() + impl_->opts.linger_max;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      if (!impl_->HasClosing()) break;
    }
    if (Clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  impl_->stop = true;
  impl_->waits.Wake();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint32_t Engine::RegisterContext(int rank, int size, uint64_t local_token) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto c = std::make_unique<Ctx>();
  c->id = impl_->next_ctx++;
  c->rank = rank;
  c->size = size;
  c->token = rank == 0 ? local_token : 0;
  // Incast: a receiver's buffer is shared by all of its senders.
  const size_t peers = size > 1 ? static_cast<size_t>(size - 1) : 1;
  const size_t share = impl_->rx_buffer_bytes / peers;
  c->window = std::max<uint64_t>(
      std::min<uint64_t>(impl_->opts.window_bytes, share),
      2 * static_cast<uint64_t>(impl_->max_payload));
  c->peers.resize(size);
  c->bounded_tx = BoundedSender(size, impl_->opts.bounded_senders);
  for (int i = 0; i < size; ++i) {
    Peer& p = c->peers[i];
    p.rank = i;
    p.eager_credit = static_cast<int64_t>(impl_->opts.eager_budget_per_peer);
    p.max_payload = impl_->max_payload;
    p.bounded_payload = impl_->bounded_payload;
    p.liveness = PeerLivenessState(i, impl_->opts.peer_dead);
    ReliableSender::Options so;
    so.initial_rto = impl_->opts.initial_rto;
    so.min_rto = impl_->opts.min_rto;
    so.max_rto = impl_->opts.max_rto;
    so.max_ack_delay = kAckDelay;
    so.min_pto = std::max(impl_->opts.min_rto / 4, us(200));
    so.mss = impl_->max_payload + static_cast<uint32_t>(kHeaderBytes);
    so.window = c->window + (c->window / impl_->max_payload + 1) * kHeaderBytes;
    p.sender = std::make_unique<ReliableSender>(so);
    p.acks = std::make_unique<AckScheduler>(kAckEvery, c->window / 4, kAckDelay);
  }
  const uint32_t id = c->id;
  impl_->contexts.emplace(id, std::move(c));
  return id;
}

void Engine::UnregisterContext(uint32_t ctx) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return;
  // Every buffer of the context is gone (they hold the context), so nothing
  // below refers to user memory any more; keep acking for a while.
  c->posted.clear();
  c->arrivals.clear();
  c->regs.clear();
  c->early.clear();
  c->early_bytes = 0;
  for (Peer& p : c->peers) {
    // Sends whose buffers went away were cancelled or detached (copied)
    // by Cancel(); the detached ones (e.g. the last notification of an
    // algorithm, sent without waiting) must still go out.
    p.data_queue.erase(
        std::remove_if(p.data_queue.begin(), p.data_queue.end(),
                       [](const std::shared_ptr<OutMsg>& m) {
                         return m->cancelled;
                       }),
        p.data_queue.end());
    p.buffer_arrivals.clear();
  }
  c->closing = true;
  c->closing_since = c->last_rx = Clock::now();
  impl_->waits.Wake();
}

absl::Status Engine::ConnectPeer(uint32_t ctx, int peer_rank,
                                 const IoAddress& io, uint32_t remote_ctx,
                                 uint64_t remote_token,
                                 uint32_t remote_max_datagram) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  if (peer_rank < 0 || peer_rank >= c->size || peer_rank == c->rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot connect rank ", c->rank, " to rank ", peer_rank,
        " in a context of size ", c->size));
  }
  if (remote_max_datagram < kHeaderBytes + 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", peer_rank, " announces a datagram size of ", remote_max_datagram,
        " bytes, below the ", kHeaderBytes + 64, " the protocol needs"));
  }
  Peer& p = c->peers[peer_rank];
  if (p.connected) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", c->rank, " is already connected to rank ", peer_rank));
  }
  auto handle = impl_->io->ResolvePeer(io);
  if (!handle.ok()) return handle.status();
  p.handle = *handle;
  p.io = io;
  p.remote_ctx = remote_ctx;
  p.max_payload = std::min<uint32_t>(impl_->max_payload, remote_max_datagram - kHeaderBytes);
  p.bounded_payload = std::min<uint32_t>(impl_->bounded_payload, p.max_payload / 64 * 64);
  p.connected = true;
  p.liveness.Connected(Clock::now());
  if (peer_rank == 0) c->token = remote_token;
  // The handshake: the first packet to a peer (sequence 0) is a NOP, and
  // its ack (WaitPeer) says the peer is there and has connected back.
  WireHeader hello;
  hello.type = static_cast<uint8_t>(PacketType::kNop);
  p.ctrl.push_front(hello);
  // Packets the peer sent before this rank connected to it (or before the
  // job's token was known) apply now.
  impl_->ReplayEarly(*c);
  // Hello: a peer that connected its side first hears that we are here (and
  // answers), so both sides judge each other's liveness from now on.
  impl_->SendLiveness(*c, p, PacketType::kPing, 0);
  impl_->Kick(*c, p);
  // Replayed datagrams may have left acks and grants for other peers: the progress
  // thread pumps them now.
  impl_->waits.Wake();
  return absl::OkStatus();
}

absl::Status Engine::WaitPeer(uint32_t ctx, int peer_rank,
                              std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  if (peer_rank < 0 || peer_rank >= c->size || !c->peers[peer_rank].connected) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", c->rank, " has not connected to rank ", peer_rank));
  }
  const int rank = c->rank;
  auto answered = [&] {
    Ctx* now = impl_->FindCtx(ctx);
    return now == nullptr || now->failed || now->peers[peer_rank].unacked_base > 0;
  };
  if (!impl_->handshake_cv.wait_for(lock, timeout, answered)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", rank, ": no answer from rank ", peer_rank, " at ",
        impl_->io->AddressToString(c->peers[peer_rank].io), " within ",
        timeout.count(), " ms (is it running, reachable, and part of this job?)"));
  }
  const Ctx* now = impl_->FindCtx(ctx);
  if (!now) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  // A peer the network reports gone (ICMP) fails the context before it answers.
  if (now->failed) return absl::UnavailableError(now->failure);
  return absl::OkStatus();
}

void Engine::ClosePeer(uint32_t ctx, int peer_rank) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c || peer_rank < 0 || peer_rank >= c->size) return;
  // Keep the peer connected at the packet level: it may still need acks
  // for what it sent us (see the linger in UnregisterContext).
  c->peers[peer_rank].closed = true;
}

absl::StatusOr<uint64_t> Engine::PostSend(uint32_t ctx, int dst, MsgKind kind,
                                          uint64_t slot, const void* data,
                                          size_t len, uint64_t remote_offset,
                                          const std::shared_ptr<OpSink>& sink) {
  auto m = std::make_shared<OutMsg>();
  m->data = static_cast<const uint8_t*>(data);
  if (len > 0 && (len <= impl_->opts.eager_max_message ||
                  (kind == MsgKind::kBuffer && len <= kBufferSnapshotLimit))) {
    // Taken now, as Gloo's TCP pair writes a message of this size into its
    // socket inside send(): the caller may reuse its buffer at once (Gloo's
    // algorithm classes do: reduce-scatter overwrites what it sent before
    // waiting), and no retransmission reads it later.
    m->owned = impl_->payloads->Copy(m->data, len);
    m->data = m->owned.data();
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  if (dst < 0 || dst >= c->size || dst == c->rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", c->rank, " cannot send to rank ", dst, " (context size ",
        c->size, ")"));
  }
  Peer& p = c->peers[dst];
  if (c->failed) return impl_->RefuseOnFailed(*c, /*send=*/true, sink);
  if (!p.connected || p.closed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pair from rank ", c->rank, " to rank ", dst,
        p.closed ? " is closed" : " is not connected"));
  }
  m->id = p.next_msg_id++;
  m->op = impl_->next_op++;
  m->slot = slot;
  m->peer = dst;
  m->kind = kind;
  m->len = len;
  m->remote_offset = remote_offset;
  m->sink = sink;
  m->packets_total = len == 0 ? 1 : (len + p.max_payload - 1) / p.max_payload;
  m->charge = std::max<uint64_t>(len, kMinEagerCharge);
  sink->AddPending(true, m->op,
                   absl::StrCat("send of ", len, " bytes to rank ", dst,
                                " on slot ", slot));
  WireHeader h;
  h.flags = kind == MsgKind::kBuffer ? kFlagBufferKind : 0;
  h.message_id = m->id;
  h.slot = slot;
  h.total_length = len;
  h.aux = remote_offset;
  if (len <= impl_->opts.eager_max_message &&
      p.eager_credit >= static_cast<int64_t>(m->charge)) {
    m->eager = true;
    p.eager_credit -= static_cast<int64_t>(m->charge);
    p.data_queue.push_back(m);
    Bump(impl_->stats.eager_messages);
  } else {
    // Rendezvous: announce, and send the data when the receiver grants it.
    m->waiting_cts = true;
    h.type = static_cast<uint8_t>(PacketType::kRts);
    p.ctrl.push_back(h);
    Bump(impl_->stats.rendezvous_messages);
  }
  p.out_msgs.emplace(m->id, m);
  impl_->Kick(*c, p);
  return m->op;
}

absl::StatusOr<uint64_t> Engine::PostRecv(uint32_t ctx,
                                          const std::vector<int>& srcs,
                                          uint64_t slot, void* data,
                                          size_t capacity,
                                          const std::shared_ptr<OpSink>& sink) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  // A stashed message may complete it at once (another thread may wait for it).
  impl_->WakeWaiterIfOthers();
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  if (srcs.empty()) {
    return absl::InvalidArgumentError("recv needs at least one source rank");
  }
  if (c->failed) return impl_->RefuseOnFailed(*c, /*send=*/false, sink);
  std::vector<int> from;
  from.reserve(srcs.size());
  for (int s : srcs) {
    if (s < 0 || s >= c->size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", c->rank, " cannot recv from rank ", s, " (context size ",
          c->size, ")"));
    }
    // A recv-from-any set may name this rank (torch's recv without src
    // passes the whole group): nothing comes from it, as over Gloo's TCP.
    if (s == c->rank) continue;
    if (!c->peers[s].connected || c->peers[s].closed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pair from rank ", c->rank, " to rank ", s, " is not connected"));
    }
    from.push_back(s);
  }
  PostedRecv r;
  r.op = impl_->next_op++;
  r.srcs = std::move(from);
  r.ptr = static_cast<uint8_t*>(data);
  r.capacity = capacity;
  r.sink = sink;
  sink->AddPending(false, r.op,
                   absl::StrCat("recv of up to ", capacity,
                                " bytes from rank(s) ", RanksToString(srcs),
                                " on slot ", slot));
  const std::vector<int>& allowed = r.srcs;
  // Earliest arrival from any allowed source wins (recv-from-any).
  auto arr = c->arrivals.find(slot);
  if (arr != c->arrivals.end()) {
    auto& q = arr->second;
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (std::find(allowed.begin(), allowed.end(), it->peer) == allowed.end()) continue;
      Arrival a = std::move(*it);
      q.erase(it);
      if (q.empty()) c->arrivals.erase(arr);
      impl_->Bind(*c, c->peers[a.peer], a.msg, r);
      impl_->Kick(*c, c->peers[a.peer]);
      return r.op;
    }
  }
  // Its sources are judged from now on (a quiet one is probed soon, see PeerLiveness).
  const auto first_check = Clock::now() + impl_->liveness_first;
  impl_->next_liveness = std::min(impl_->next_liveness, first_check);
  impl_->WakeIfSleepingPast(first_check);
  c->posted[slot].push_back(std::move(r));
  return c->posted[slot].back().op;
}

absl::Status Engine::RegisterRecvBuffer(uint32_t ctx, int peer, uint64_t slot,
                                        void* base, size_t size,
                                        const std::shared_ptr<OpSink>& sink) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  // A stashed message may complete it at once (another thread may wait for it).
  impl_->WakeWaiterIfOthers();
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  if (peer < 0 || peer >= c->size || peer == c->rank) {
    return absl::InvalidArgumentError(absl::StrCat("bad peer rank ", peer));
  }
  auto key = std::make_pair(peer, slot);
  if (c->regs.count(key)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "a recv buffer for rank ", peer, " slot ", slot, " already exists"));
  }
  auto reg = std::make_shared<RecvBufferReg>();
  reg->peer = peer;
  reg->slot = slot;
  reg->base = static_cast<uint8_t*>(base);
  reg->size = size;
  reg->sink = sink;
  c->regs.emplace(key, reg);
  if (c->failed) {
    impl_->RefuseOnFailed(*c, /*send=*/false, sink);
    return absl::OkStatus();
  }
  Peer& p = c->peers[peer];
  auto arr = p.buffer_arrivals.find(slot);
  if (arr != p.buffer_arrivals.end()) {
    auto q = std::move(arr->second);
    p.buffer_arrivals.erase(arr);
    for (auto& m : q) impl_->BindBuffer(*c, p, m, reg);
  }
  impl_->waits.Wake();
  return absl::OkStatus();
}

void Engine::UnregisterRecvBuffer(uint32_t ctx, int peer, uint64_t slot,
                                  const OpSink* sink) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return;
  auto it = c->regs.find({peer, slot});
  if (it == c->regs.end() || it->second->sink.get() != sink) return;
  for (auto& m : it->second->order) {
    m->discard = true;
    m->target = nullptr;
  }
  c->regs.erase(it);
}

void Engine::Cancel(const OpSink* sink) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& kv : impl_->contexts) {
    Ctx& c = *kv.second;
    for (auto pit = c.posted.begin(); pit != c.posted.end();) {
      auto& q = pit->second;
      q.erase(std::remove_if(q.begin(), q.end(),
                             [&](const PostedRecv& r) {
                               return r.sink.get() == sink;
                             }),
              q.end());
      pit = q.empty() ? c.posted.erase(pit) : std::next(pit);
    }
    for (Peer& p : c.peers) {
      for (auto& im : p.in_msgs) {
        InMsg& m = *im.second;
        if (m.matched && m.sink.get() == sink) {
          m.discard = true;
          m.target = nullptr;
        }
      }
      for (auto it = p.out_msgs.begin(); it != p.out_msgs.end();) {
        OutMsg& m = *it->second;
        if (m.sink.get() != sink) {
          ++it;
        } else if (m.len <= kDetachLimit) {
          // Finish it from a private copy, reporting to nobody.
          if (m.len > 0 && m.owned.empty()) {
            m.owned = impl_->payloads->Copy(m.data, m.len);
            m.data = m.owned.data();
          }
          m.sink.reset();
          ++it;
        } else {
          m.cancelled = true;
          it = p.out_msgs.erase(it);
        }
      }
      p.data_queue.erase(
          std::remove_if(p.data_queue.begin(), p.data_queue.end(),
                         [](const std::shared_ptr<OutMsg>& m) {
                           return m->cancelled;
                         }),
          p.data_queue.end());
    }
  }
}

void Engine::Withdraw(const OpSink* sink) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& kv : impl_->contexts) {
    Ctx& c = *kv.second;
    for (Peer& p : c.peers) {
      bool queued = false;
      for (auto it = p.out_msgs.begin(); it != p.out_msgs.end();) {
        OutMsg& m = *it->second;
        if (m.sink.get() != sink || m.kind != MsgKind::kUnbound || m.completed) {
          ++it;
        } else if (m.eager) {
          // Its payload is a private copy (eager sends are copied at PostSend).
          if (m.len > 0 && m.owned.empty()) {
            m.owned = impl_->payloads->Copy(m.data, m.len);
            m.data = m.owned.data();
          }
          m.sink.reset();
          m.withdrawn = true;
          if (m.packets_acked == m.packets_total && !m.delivered) {
            impl_->QueueWithdraw(p, m);
            queued = true;
          }
          ++it;
        } else if (m.waiting_cts) {
          // Announced, not granted: the receiver forgets the announcement.
          impl_->QueueWithdraw(p, m);
          queued = true;
          m.sink.reset();
          m.cancelled = true;
          it = p.out_msgs.erase(it);
        } else {
          ++it;  // granted: the receiver takes it
        }
      }
      if (queued && p.connected && !c.failed) impl_->Kick(c, p);
    }
  }
}

Engine::Backlog Engine::GetBacklog() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Backlog b;
  for (const auto& kv : impl_->contexts) {
    for (const Peer& p : kv.second->peers) {
      if (!p.connected) continue;
      b.sends += p.out_msgs.size();
      b.credit_lent += static_cast<int64_t>(impl_->opts.eager_budget_per_peer) - p.eager_credit;
      b.stashed += p.eager_stashed;
    }
  }
  return b;
}

int Engine::ContextSize(uint32_t ctx) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Ctx* c = impl_->FindCtx(ctx);
  return c ? c->size : 0;
}

Stats Engine::GetStats() const { return impl_->stats.Snapshot(); }

std::string Engine::DebugState(uint32_t ctx) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return "context gone";
  std::string s = absl::StrCat("rank ", c->rank, " token ", c->token != 0);
  if (c->failed) absl::StrAppend(&s, " FAILED (", c->failure, ")");
  const auto now = Clock::now();
  for (const Peer& p : c->peers) {
    if (!p.connected) continue;
    absl::StrAppend(&s, "; peer ", p.rank, ": ",
                    !p.liveness.heard()
                        ? std::string("never heard")
                        : absl::StrCat("heard ",
                                       std::chrono::duration_cast<std::chrono::milliseconds>(
                                           now - p.liveness.last_heard())
                                           .count(),
                                       " ms ago"),
                    p.liveness.unreachable() ? " (unreachable)" : "");
    absl::StrAppend(&s, "; peer ", p.rank, ": tx seq ", p.next_seq, " unacked ",
                    p.next_seq - p.unacked_base, " (", p.inflight_bytes,
                    " B) queued ", p.data_queue.size(), "+", p.ctrl.size(),
                    " out_msgs ", p.out_msgs.size(), " credit ", p.eager_credit,
                    " rto ", p.sender->rtt().rto().count(), "us srtt ",
                    p.sender->rtt().srtt().count(), "us cwnd ", p.sender->cwnd().cwnd(),
                    " lost ", p.sender->scoreboard().lost_packets(), "; rx cum ", p.rx.cum(),
                    " in_msgs ", p.in_msgs.size(), " next_announce ",
                    p.next_announce);
  }
  absl::StrAppend(&s, "; posted slots ", c->posted.size(), " arrival slots ",
                  c->arrivals.size(), "; ", impl_->stats.Snapshot().ToString());
  return s;
}

void Engine::FailContext(uint32_t ctx, const std::string& why) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (c) impl_->FailContext(*c, why, -1);
}

absl::Status Engine::ContextFailure(uint32_t ctx) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  return c->failed ? absl::UnavailableError(c->failure) : absl::OkStatus();
}

IoAddress Engine::LocalAddress() const { return impl_->io->LocalAddress(); }

uint32_t Engine::MaxDatagram() const { return impl_->io->MaxDatagram(); }

std::string Engine::Describe() const { return impl_->io->Describe(); }

uint64_t Engine::ContextToken(uint32_t ctx) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  return c ? c->token : 0;
}

double Engine::ProgressThreadCpuSeconds() const {
  if (!impl_->have_clock) return 0;
  timespec ts{};
  if (clock_gettime(impl_->thread_clock, &ts) != 0) return 0;
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

PacketIo* Engine::io() { return impl_->io.get(); }

}  // namespace transport
}  // namespace optireduce
