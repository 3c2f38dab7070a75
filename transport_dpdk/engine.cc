#include "transport_dpdk/engine.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport_dpdk/reliable/peer_liveness.h"
#include "transport_dpdk/reliable/ack_scheduler.h"
#include "transport_dpdk/reliable/receive_window.h"
#include "transport_dpdk/reliable/reliable_sender.h"
#include "transport_dpdk/wire_format.h"

namespace optireduce {
namespace transport {
namespace {

using Clock = std::chrono::steady_clock;
using us = std::chrono::microseconds;

constexpr size_t kBurst = 64;
// Reliable packets in flight per peer; well inside the receiver's bitmap.
constexpr uint64_t kMaxInflightPackets = ReceiveWindow::kSpan / 2;
// Messages a receiver tracks ahead of the next one to announce.
constexpr uint64_t kMaxPendingMessages = 1 << 16;
// Every eager message is charged at least this much credit, which bounds
// the number of records a receiver keeps.
constexpr uint64_t kMinEagerCharge = 256;
// New packets sent to one peer per progress iteration (fairness).
constexpr int kPeerBudget = 64;
// A receiver acks at once what the sender acts on (gaps, duplicates, ends of
// messages, control packets), else every kAckEvery packets or a quarter
// window, at the latest kAckDelay after the first unacked packet.
constexpr uint32_t kAckEvery = 16;
constexpr us kAckDelay{100};
constexpr uint64_t kNoSeq = ReliableSender::kNone;
// How long the bounded service waits before sending again what the device refused.
constexpr std::chrono::microseconds kBoundedTxRetry{20};
// Repair jobs (distinct operations) queued per peer at most; more requests are dropped
// (counted) and asked again by the requester's next round.
constexpr size_t kMaxQueuedRepairs = 64;
// Ranges one repair job holds at most (as many as one request carries).
constexpr size_t kMaxRepairRanges = 4096;

struct OutMsg {
  uint64_t id = 0, op = 0, slot = 0;
  int peer = 0;
  MsgKind kind = MsgKind::kUnbound;
  const uint8_t* data = nullptr;
  uint64_t len = 0, remote_offset = 0, charge = 0;
  bool eager = false, cancelled = false, waiting_cts = false;
  // An eager unbound send completes when the receiver returns its credit
  // (the message was matched and taken), as Gloo's TCP send completes only
  // once the peer posted its recv; `delivered` marks that credit.
  bool delivered = false, completed = false;
  uint64_t next_offset = 0;
  uint64_t packets_total = 0, packets_sent = 0, packets_acked = 0;
  std::shared_ptr<OpSink> sink;
  // The payload, copied at PostSend for messages up to eager_max_message
  // (Gloo's TCP writes those out inside send(), so callers may reuse the
  // buffer right after), or when the sender's buffer went away before the
  // send finished (see Engine::Cancel).
  std::vector<uint8_t> owned;
};

// Datagrams that arrive for a context before their sender is connected (or
// before the job's token is known) wait here, up to these bounds, and are
// applied once it is.
constexpr size_t kMaxEarlyDatagrams = 1024;
constexpr size_t kMaxEarlyBytes = 8 << 20;

// Sends up to this size outlive their buffer (copied); larger ones are
// abandoned. Gloo's algorithm classes destroy send buffers right after
// their last (small, unwaited) notification send.
constexpr uint64_t kDetachLimit = 1 << 20;
// Old-style Buffer sends up to this size are copied at send(), as the
// socket buffer of Gloo's TCP pair takes them there; larger ones are read
// in place (TCP writes those out lazily too).
constexpr uint64_t kBufferSnapshotLimit = 1 << 20;

// A reliable packet until it is cumulatively acknowledged (its transmission
// state lives in the peer's ReliableSender).
struct TxRecord {
  WireHeader h;
  std::shared_ptr<OutMsg> msg;  // DATA only: where the payload comes from
  bool acked = false;
};

struct RecvBufferReg;

struct InMsg {
  uint64_t id = 0, slot = 0, total = 0, remote_offset = 0, charge = 0;
  MsgKind kind = MsgKind::kUnbound;
  bool eager = false;
  std::vector<uint8_t> stash;  // eager bytes that arrived before the match
  uint64_t received = 0;
  bool matched = false, discard = false, completed = false, done = false;
  uint8_t* target = nullptr;  // where payload byte 0 goes once matched
  std::shared_ptr<OpSink> sink;
  uint64_t op = 0;
  std::weak_ptr<RecvBufferReg> reg;
};

struct PostedRecv {
  uint64_t op = 0;
  std::vector<int> srcs;
  uint8_t* ptr = nullptr;
  size_t capacity = 0;
  std::shared_ptr<OpSink> sink;
};

struct RecvBufferReg {
  int peer = 0;
  uint64_t slot = 0;
  uint8_t* base = nullptr;
  size_t size = 0;
  std::shared_ptr<OpSink> sink;
  std::deque<std::shared_ptr<InMsg>> order;  // bound messages, in order
};

// Unreliable bytes of one bounded operation still to send to a peer: the
// whole source at first, or the ranges a repair request asked for.
struct BoundedJob {
  uint64_t op = 0;
  uint64_t total = 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end)
  size_t range = 0;    // current range
  uint64_t next = 0;   // next offset within it
  uint64_t last_from = UINT64_MAX;  // packets at or after this carry kFlagLast
  // Submission order within the context (0: a repair, served first). Only the oldest
  // `bounded_senders` sends are active at a time: see PumpBoundedSends.
  uint64_t order = 0;
};

struct Peer {
  int rank = -1;
  bool connected = false;
  bool closed = false;  // Pair::close(): no new operations; still acks
  PeerHandle handle = 0;
  IoAddress io{};  // as published (for messages)
  uint32_t remote_ctx = 0;
  // Payload bytes per datagram with this peer: the smaller of both sides'
  // datagram limits (exchanged in the Address) minus the header.
  uint32_t max_payload = 0;
  uint32_t bounded_payload = 0;
  // --- sending side ---
  uint64_t next_seq = 0;
  uint64_t unacked_base = 0;  // seq of unacked.front()
  std::deque<TxRecord> unacked;
  uint64_t inflight_bytes = 0;  // unacknowledged payload (receiver's window)
  // Loss recovery, congestion window, pacing, RTT (reliable/reliable_sender.h).
  std::unique_ptr<ReliableSender> sender;
  std::deque<WireHeader> ctrl;  // RTS/CTS/CREDIT waiting for a seq
  std::deque<std::shared_ptr<OutMsg>> data_queue;
  std::deque<BoundedJob> bounded_queue;
  std::unordered_map<uint64_t, std::shared_ptr<OutMsg>> out_msgs;
  uint64_t next_msg_id = 0;
  int64_t eager_credit = 0;
  // --- receiving side ---
  ReceiveWindow rx;
  std::unique_ptr<AckScheduler> acks;
  uint64_t dsack = kNoSeq;  // a duplicate to report in the next ack
  std::map<uint64_t, std::shared_ptr<InMsg>> in_msgs;
  uint64_t next_announce = 0;
  uint64_t eager_stashed = 0;
  std::map<uint64_t, std::deque<std::shared_ptr<InMsg>>> buffer_arrivals;
  // --- liveness (see reliable/peer_liveness.h) ---
  PeerLiveness live;
  uint64_t pings = 0;
  // Set by the peer's ABORT: why it is gone, and the rank that failure blames.
  std::string gone_reason;
  int gone_blame = -1;
};

struct Arrival {
  int peer;
  std::shared_ptr<InMsg> msg;
};

struct Ctx {
  uint32_t id = 0;
  int rank = 0, size = 0;
  uint64_t local_token = 0;
  uint64_t token = 0;  // the job's token (rank 0's); 0 until known
  uint64_t window = 0;
  std::vector<Peer> peers;
  std::map<uint64_t, std::deque<PostedRecv>> posted;   // by slot
  std::map<uint64_t, std::deque<Arrival>> arrivals;    // by slot
  std::map<std::pair<int, uint64_t>, std::shared_ptr<RecvBufferReg>> regs;
  std::deque<std::vector<uint8_t>> early;  // see kMaxEarlyDatagrams
  size_t early_bytes = 0;
  // After the Gloo context is destroyed the engine keeps answering for it a
  // little while (like TCP's TIME_WAIT): a peer whose last ack was lost
  // retransmits, and must get its ack, or its final waitSend would time out.
  bool closing = false;
  Clock::time_point closing_since, last_rx;
  BoundedHooks bounded;
  uint64_t bounded_next_order = 1;
  int bounded_senders = 1;  // peers sent to at once (incast control)
  // A peer is gone or a wait timed out: every pending operation failed with
  // `failure`, every later one fails with it at once, and no packet of the
  // context is applied or sent any more (like Gloo TCP's signalException).
  bool failed = false;
  std::string failure;
};

// Where an engine's context ids start: random, so that a packet of an earlier run — same
// addresses, and the same session token when OPTIREDUCE_SESSION_TOKEN fixes it — names a
// context that does not exist in this one and is dropped (counted as bad_context) instead of
// being taken for one of this run's operations, whose ids restart at the same values.
uint32_t RandomContextEpoch() {
  std::random_device rd;
  const uint32_t epoch = rd() & 0x7fffffffu;  // leaves 2^31 ids before a wrap
  return epoch == 0 ? 1 : epoch;
}

std::string RanksToString(const std::vector<int>& r) {
  return absl::StrCat("[", absl::StrJoin(r, ","), "]");
}

// EngineOptions::peer_dead (0: the default, 1000 ms); gloo_ext fills it from
// OPTIREDUCE_PEER_DEAD_MS.
absl::StatusOr<std::chrono::milliseconds> ResolvePeerDead(std::chrono::milliseconds configured) {
  constexpr long kMin = 10, kMax = 3600000;
  if (configured.count() == 0) return std::chrono::milliseconds(1000);
  if (configured.count() < kMin || configured.count() > kMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine options: peer_dead ", configured.count(), " ms outside [", kMin, ", ", kMax,
        "] ms"));
  }
  return configured;
}

}  // namespace

struct Engine::Impl {
  Impl(std::unique_ptr<PacketIo> io_in, const EngineOptions& o, size_t rxbuf)
      : io(std::move(io_in)),
        opts(o),
        rx_buffer_bytes(rxbuf),
        link_protects_payload(io->ProtectsPayload()) {
    max_payload = io->MaxDatagram() - kHeaderBytes;
    bounded_payload = static_cast<uint32_t>(
        std::max<size_t>(64, std::min<size_t>(opts.bounded_payload, max_payload) / 64 * 64));
    liveness_every = std::clamp<Clock::duration>(opts.peer_dead / 16, std::chrono::milliseconds(1),
                                                 std::chrono::milliseconds(50));
  }

  std::unique_ptr<PacketIo> io;
  const EngineOptions opts;
  const size_t rx_buffer_bytes;
  // Checksum headers only, and accept datagrams that did (wire_format.h).
  const bool link_protects_payload;
  uint32_t max_payload = 0;

  mutable std::mutex mu;
  // Signalled when a peer acknowledges its first packet (the connect handshake).
  std::condition_variable handshake_cv;
  std::map<uint32_t, std::unique_ptr<Ctx>> contexts;
  // Context ids start at a random epoch per engine (RandomContextEpoch).
  uint32_t next_ctx = RandomContextEpoch();
  uint64_t next_op = 1;
  AtomicStats stats;

  std::atomic<bool> stop{false};
  std::thread thread;
  clockid_t thread_clock{};
  std::atomic<bool> have_clock{false};

  // Transmit batch (valid within one locked progress iteration).
  TxDatagram tx[kBurst];
  uint8_t tx_head[kBurst][kHeaderBytes];
  uint8_t tx_sack[kBurst][kMaxSackBytes];
  // What each queued datagram is, so one the device refuses is recovered:
  // its peer, and its seq (reliable packets) or kNoSeq (acks, bounded).
  Peer* tx_peer[kBurst] = {};
  uint64_t tx_seq[kBurst] = {};
  bool tx_is_ack[kBurst] = {};
  size_t tx_n = 0;
  bool tx_blocked = false;
  RxDatagram rx[kBurst];
  // Bounded service pacing: a token bucket of bytes (no acks clock it).
  uint32_t bounded_payload = 0;
  double bounded_tokens = 0;
  Clock::time_point bounded_refill{};
  // Peer liveness: how often peers are judged, and when next.
  Clock::duration liveness_every{};
  Clock::time_point next_liveness{}, last_liveness{};

  // ---- progress thread ----
  void Run();
  bool Poll(Clock::time_point* deadline);
  void Flush();
  void Emit(Peer& p, const WireHeader& h, const void* body,
            uint32_t len);
  void SendNew(Ctx& c, Peer& p, WireHeader h, std::shared_ptr<OutMsg> msg);
  // Sends the next packet of the oldest queued message; false if none.
  bool SendNextData(Ctx& c, Peer& p);
  void Retransmit(Ctx& c, Peer& p, uint64_t seq, Clock::time_point now);
  void Pump(Ctx& c, Peer& p, Clock::time_point now,
            Clock::time_point* deadline);
  void SendAck(Ctx& c, Peer& p);
  void PumpBoundedSends(Ctx& c, Clock::time_point now, Clock::time_point* deadline);
  void PumpBounded(Ctx& c, Peer& p, Clock::time_point now,
                   Clock::time_point* deadline);
  void HandleBounded(Ctx& c, Peer& p, const WireHeader& h,
                     const uint8_t* payload);
  void ReapClosing(Clock::time_point now);
  // Sends what is ready for peer p right away from the calling (user)
  // thread, saving the hand-off to the progress thread. Lock held.
  void Kick(Ctx& c, Peer& p) {
    auto deadline = Clock::now() + opts.max_sleep;
    tx_blocked = false;
    Pump(c, p, Clock::now(), &deadline);
    Flush();
    io->Wake();  // the progress thread recomputes its timers
  }
  bool HasClosing() const {
    for (const auto& kv : contexts) if (kv.second->closing) return true;
    return false;
  }
  void FillHeader(const Ctx& c, const Peer& p, WireHeader* h) const;

  // ---- peer liveness and context failure ----
  void TakeUnreachable();
  void CheckLiveness(Clock::time_point now);
  bool PendingWith(const Ctx& c, const Peer& p, const std::vector<char>& posted_from) const;
  void SendLiveness(Ctx& c, Peer& p, PacketType type, uint64_t id);
  // blamed: the rank this failure is about (-1: none, a wait timed out); peers
  // are told with an ABORT.
  void FailContext(Ctx& c, const std::string& why, int blamed);
  void HandleAbort(Ctx& c, Peer& p, const WireHeader& h);
  // An operation posted on a failed context: fails at once (its wait raises).
  uint64_t RefuseOnFailed(Ctx& c, bool send, const std::shared_ptr<OpSink>& sink);

  // ---- receive path ----
  void HandleDatagram(uint8_t* data, uint32_t len);
  // Whether h can be applied now; false: keep it until its peer connects.
  bool KeepForLater(const Ctx& c, const WireHeader& h) const;
  void Dispatch(Ctx& c, const WireHeader& h, const uint8_t* payload);
  void ReplayEarly(Ctx& c);
  void HandleAck(Ctx& c, Peer& p, const WireHeader& h, const uint8_t* sack);
  void MarkAcked(Ctx& c, Peer& p, TxRecord& r);
  bool Apply(Ctx& c, Peer& p, const WireHeader& h, const uint8_t* payload);
  bool ApplyEager(Ctx& c, Peer& p, const WireHeader& h,
                  const uint8_t* payload);
  bool ApplyRdvData(Ctx& c, Peer& p, const WireHeader& h,
                    const uint8_t* payload);
  bool ApplyRts(Ctx& c, Peer& p, const WireHeader& h);
  bool ApplyCts(Ctx& c, Peer& p, const WireHeader& h);

  // ---- matching ----
  void TryAnnounce(Ctx& c, Peer& p);
  void Announce(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m);
  void Bind(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m,
            const PostedRecv& r);
  void BindBuffer(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m,
                  const std::shared_ptr<RecvBufferReg>& reg);
  void AfterBind(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m);
  void MaybeComplete(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m);
  void CompleteOut(Peer& p, const std::shared_ptr<OutMsg>& m);

  Ctx* FindCtx(uint32_t id) {
    auto it = contexts.find(id);
    return it == contexts.end() ? nullptr : it->second.get();
  }
};

// ===================== progress thread =====================

void Engine::Impl::Run() {
  clockid_t cid;
  if (pthread_getcpuclockid(pthread_self(), &cid) == 0) {
    thread_clock = cid;
    have_clock = true;
  }
  auto last_work = Clock::now();
  us sleep = us(16);
  while (!stop.load(std::memory_order_relaxed)) {
    Clock::time_point deadline;
    bool worked;
    {
      std::lock_guard<std::mutex> lock(mu);
      worked = Poll(&deadline);
    }
    const auto now = Clock::now();
    if (worked) {
      last_work = now;
      sleep = us(16);
      continue;
    }
    if (opts.busy_poll || now - last_work < opts.spin) continue;
    us wait = std::min(sleep, opts.max_sleep);
    if (deadline > now) {
      wait = std::min(wait, std::chrono::duration_cast<us>(deadline - now) +
                                us(1));
    } else {
      wait = us(0);
    }
    if (wait.count() > 0) io->WaitForInput(wait);
    sleep = std::min(sleep * 2, opts.max_sleep);
  }
}

bool Engine::Impl::Poll(Clock::time_point* deadline) {
  bool worked = false;
  for (int round = 0; round < 4; ++round) {
    const size_t n = io->RxBurst(rx, kBurst);
    for (size_t i = 0; i < n; ++i) HandleDatagram(rx[i].data, rx[i].len);
    if (n) worked = true;
    if (n < kBurst) break;
  }
  const auto now = Clock::now();
  *deadline = now + opts.max_sleep;
  tx_blocked = false;
  const uint64_t sent_before = stats.tx_packets.load(std::memory_order_relaxed);
  TakeUnreachable();
  if (now >= next_liveness) {
    next_liveness = now + liveness_every;
    CheckLiveness(now);
  }
  for (auto& kv : contexts) {
    Ctx& c = *kv.second;
    if (c.failed) continue;
    for (Peer& p : c.peers) {
      if (p.connected) Pump(c, p, now, deadline);
    }
    PumpBoundedSends(c, now, deadline);
  }
  Flush();
  if (stats.tx_packets.load(std::memory_order_relaxed) != sent_before) {
    worked = true;
  }
  ReapClosing(now);
  return worked;
}

void Engine::Impl::Flush() {
  if (tx_n == 0) return;
  size_t sent = io->TxBurst(tx, tx_n);
  for (size_t i = 0; i < sent; ++i) {
    Bump(stats.tx_bytes, tx[i].head_len + tx[i].body_len);
  }
  Bump(stats.tx_packets, sent);
  if (sent < tx_n) {
    // Refused datagrams are lost at once: reliable packets are resent as
    // soon as the device takes more (no timeout, no congestion response),
    // acks are owed again.
    Bump(stats.tx_backpressure, tx_n - sent);
    tx_blocked = true;
    for (size_t i = sent; i < tx_n; ++i) {
      Peer* p = tx_peer[i];
      if (!p) continue;
      if (tx_seq[i] != kNoSeq && p->sender) {
        p->sender->OnLocalDrop(tx_seq[i]);
      } else if (tx_is_ack[i] && p->acks) {
        p->acks->OnArrival(Clock::now(), 0, /*urgent=*/true);
      }
    }
  }
  tx_n = 0;
}

void Engine::Impl::Emit(Peer& p, const WireHeader& h, const void* body,
                        uint32_t len) {
  if (tx_n == kBurst) Flush();
  const bool unreliable = (h.flags & kFlagUnreliable) != 0;
  const bool ack = static_cast<PacketType>(h.type) == PacketType::kAck;
  tx_peer[tx_n] = &p;
  tx_seq[tx_n] = unreliable || ack ? kNoSeq : h.seq;
  tx_is_ack[tx_n] = ack && !unreliable;
  if (link_protects_payload) {
    WireHeader scoped = h;
    scoped.flags |= kFlagHeaderChecksum;
    EncodeHeader(scoped, body, len, tx_head[tx_n]);
  } else {
    EncodeHeader(h, body, len, tx_head[tx_n]);
  }
  tx[tx_n] = {p.handle, tx_head[tx_n], static_cast<uint32_t>(kHeaderBytes),
              body, len};
  ++tx_n;
}

void Engine::Impl::FillHeader(const Ctx& c, const Peer& p,
                              WireHeader* h) const {
  h->session_token = c.token;
  h->src_rank = static_cast<uint32_t>(c.rank);
  h->dst_rank = static_cast<uint32_t>(p.rank);
  h->dst_context = p.remote_ctx;
}

void Engine::Impl::SendNew(Ctx& c, Peer& p, WireHeader h,
                           std::shared_ptr<OutMsg> msg) {
  FillHeader(c, p, &h);
  h.seq = p.next_seq++;
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
    nop.seq = r.h.seq;
    nop.message_id = r.h.message_id;
    r.h = nop;
    r.msg.reset();
  }
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

// Incast control for the bounded service. TAR submits its sends in the staggered peer
// order (in step i rank r sends to r - i, so every receiver has one sender per step);
// sending them all at once would turn each phase into an N-to-1 burst per receiver, which
// overflows receive rings. Only the `bounded_senders` oldest sends of a context are active
// at a time (the endpoint adapts the number from observed loss); repairs always go.
void Engine::Impl::PumpBoundedSends(Ctx& c, Clock::time_point now,
                                    Clock::time_point* deadline) {
  constexpr int kMaxActive = 16;
  Peer* active[kMaxActive];
  int n = 0;
  for (Peer& p : c.peers) {
    if (!p.connected || p.bounded_queue.empty()) continue;
    if (p.bounded_queue.front().order == 0) {  // a repair: not subject to the limit
      PumpBounded(c, p, now, deadline);
      if (p.bounded_queue.empty()) continue;
    }
    // Keep the `limit` oldest fronts (insertion into a short sorted array).
    const int limit = std::min(kMaxActive, std::max(1, c.bounded_senders));
    const uint64_t order = p.bounded_queue.front().order;
    int at = n;
    while (at > 0 && active[at - 1]->bounded_queue.front().order > order) --at;
    if (at >= limit) continue;
    if (n < limit) ++n;
    for (int k = n - 1; k > at; --k) active[k] = active[k - 1];
    active[at] = &p;
  }
  for (int k = 0; k < n; ++k) PumpBounded(c, *active[k], now, deadline);
}

void Engine::Impl::PumpBounded(Ctx& c, Peer& p, Clock::time_point now,
                               Clock::time_point* deadline) {
  // Refill the device's bucket (0: unpaced). The burst allows a millisecond at the rate,
  // so the progress thread wakes at most about once per millisecond to pace instead of
  // spinning between packets.
  const double rate = opts.bounded_rate_gbps * 1e9 / 8;  // bytes per second
  const double burst = std::max({256.0 * 1024, 4.0 * bounded_payload, rate * 1e-3});
  if (rate > 0) {
    const double dt = std::chrono::duration<double>(now - bounded_refill).count();
    bounded_tokens = std::min(burst, bounded_tokens + dt * rate);
    bounded_refill = now;
  }
  int budget = kPeerBudget;
  while (budget > 0 && !tx_blocked && !p.bounded_queue.empty()) {
    if (rate > 0 && bounded_tokens <= 0) {
      const auto wait = std::chrono::duration<double>(-bounded_tokens / rate + 1e-5);
      const auto due = now + std::chrono::duration_cast<Clock::duration>(wait);
      if (due < *deadline) *deadline = due;
      return;
    }
    BoundedJob& j = p.bounded_queue.front();
    // Skip finished ranges.
    while (j.range < j.ranges.size() && j.next >= j.ranges[j.range].second) {
      ++j.range;
      if (j.range < j.ranges.size()) j.next = j.ranges[j.range].first;
    }
    if (j.range >= j.ranges.size()) {
      p.bounded_queue.pop_front();
      continue;
    }
    if (j.next < j.ranges[j.range].first) j.next = j.ranges[j.range].first;
    // Emit packets straight from the source and hand them to the device before the
    // source is let go: it is guaranteed valid only inside read_source, and TxBurst
    // copies what it accepts (into the kernel, an mbuf or a queue) before returning, so
    // no bounce copy is needed (that copy was a fifth of a bounded operation's CPU). One
    // call sends at most one burst, so a caller detaching its sources waits for no more.
    // A packet the device refuses (TX backpressure) is not lost: the job rewinds to the
    // first refused packet, gives its tokens back and sends it again once the device
    // takes packets (PumpBounded is called again shortly), so no local refusal is ever
    // seen by the receiver as network loss.
    bool past_end = false;
    const int access = !c.bounded.read_source ? 0 :
        c.bounded.read_source(j.op, p.rank, [&](const char* src, size_t n, bool est) {
          const uint64_t end = std::min<uint64_t>(j.ranges[j.range].second, n);
          if (j.next >= end) {
            past_end = true;
            return;
          }
          Flush();  // from here the batch holds this job's packets only
          if (tx_blocked) return;
          uint64_t offsets[kBurst];
          uint64_t lens[kBurst];
          size_t emitted = 0;
          while (budget > 0 && !tx_blocked && j.next < end && emitted < kBurst &&
                 (rate <= 0 || bounded_tokens > 0)) {
            const uint64_t len = std::min<uint64_t>(p.bounded_payload, end - j.next);
            offsets[emitted] = j.next;
            lens[emitted] = len;
            WireHeader h;
            FillHeader(c, p, &h);
            h.type = static_cast<uint8_t>(PacketType::kData);
            h.flags = kFlagUnreliable | (j.next >= j.last_from ? kFlagLast : 0) |
                      (est ? kFlagEstimated : 0);
            h.message_id = j.op;
            h.offset = j.next;
            h.total_length = n;
            h.payload_length = static_cast<uint32_t>(len);
            Emit(p, h, src + j.next, static_cast<uint32_t>(len));
            j.next += len;
            bounded_tokens -= static_cast<double>(len + kHeaderBytes);
            --budget;
            ++emitted;
          }
          const size_t sent = tx_n == 0 ? 0 : io->TxBurst(tx, tx_n);
          for (size_t i = 0; i < sent; ++i) {
            Bump(stats.tx_bytes, tx[i].head_len + tx[i].body_len);
          }
          Bump(stats.tx_packets, sent);
          Bump(stats.bounded_tx_packets, sent);
          if (sent < tx_n) {
            Bump(stats.tx_backpressure, tx_n - sent);
            Bump(stats.bounded_tx_deferred, tx_n - sent);
            for (size_t i = sent; i < tx_n; ++i) {
              bounded_tokens += static_cast<double>(lens[i] + kHeaderBytes);
            }
            j.next = offsets[sent];
            tx_blocked = true;
          }
          tx_n = 0;
        });
    if (access == -1) break;  // the owner is detaching its sources: next iteration
    if (access != 1) {  // gone, not started or pending: nothing to send from
      p.bounded_queue.pop_front();
      continue;
    }
    if (past_end) j.next = j.ranges[j.range].second;  // range past the source's end
  }
  Flush();
  if (!p.bounded_queue.empty()) {
    // Refused by the device: again after a pause in which its queue drains, not in a spin.
    if (tx_blocked) {
      const auto retry = now + kBoundedTxRetry;
      if (retry < *deadline) *deadline = retry;
    } else if (now + opts.spin < *deadline) {
      *deadline = now;
    }
  }
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
                        (h.flags & kFlagEstimated) != 0);
      return;
    case PacketType::kRepair: {
      if (h.flags & kFlagAbsent) {
        Bump(stats.repair_absent_received);
        if (c.bounded.on_absent) c.bounded.on_absent(p.rank, h.message_id, h.aux == 1);
        return;
      }
      Bump(stats.repair_requests_received);
      // Data this rank cannot send (sources released, or the operation not started
      // here yet) is answered at once, so the requester stops waiting for it.
      const int can = !c.bounded.read_source ? 0 :
          c.bounded.read_source(h.message_id, p.rank, [](const char*, size_t, bool) {});
      if (can == -3) return;  // its other phase is running here: asked again later
      if (can == 0 || can == -2) {
        WireHeader r;
        FillHeader(c, p, &r);
        r.type = static_cast<uint8_t>(PacketType::kRepair);
        r.flags = kFlagUnreliable | kFlagAbsent;
        r.message_id = h.message_id;
        r.aux = can == -2 ? 1 : 0;
        Emit(p, r, nullptr, 0);
        Flush();
        Bump(stats.repair_absent_sent);
        return;
      }
      std::vector<std::pair<uint64_t, uint64_t>> asked;
      const size_t n = std::min<size_t>(h.payload_length / 16, kMaxRepairRanges);
      for (size_t i = 0; i < n; ++i) {
        uint64_t b, e;
        std::memcpy(&b, payload + 16 * i, 8);
        std::memcpy(&e, payload + 16 * i + 8, 8);
        if (b < e) asked.emplace_back(b, e);
      }
      if (asked.empty()) return;
      // Repairs go before the sends still queued (order 0), in arrival order; a request for
      // an operation whose repair is still queued is merged into it (the union of what is
      // left to send and what is asked), so repeated requests never grow the queue.
      // (A send interrupted half way keeps its position and resumes after them.)
      auto at = p.bounded_queue.begin();
      size_t repairs = 0;
      for (; at != p.bounded_queue.end() && at->order == 0; ++at, ++repairs) {
        if (at->op != h.message_id) continue;
        BoundedJob& q = *at;
        for (size_t r = q.range; r < q.ranges.size(); ++r) {
          const uint64_t b = r == q.range ? std::max(q.next, q.ranges[r].first) : q.ranges[r].first;
          if (b < q.ranges[r].second) asked.emplace_back(b, q.ranges[r].second);
        }
        std::sort(asked.begin(), asked.end());
        q.ranges.clear();
        for (const auto& [b, e] : asked) {
          if (!q.ranges.empty() && b <= q.ranges.back().second) {
            q.ranges.back().second = std::max(q.ranges.back().second, e);
          } else if (q.ranges.size() < kMaxRepairRanges) {
            q.ranges.emplace_back(b, e);
          }
        }
        q.range = 0;
        q.next = q.ranges.front().first;
        Bump(stats.repair_requests_merged);
        return;
      }
      if (repairs >= kMaxQueuedRepairs) {
        Bump(stats.repair_requests_dropped);
        return;
      }
      BoundedJob j;
      j.op = h.message_id;
      j.ranges = std::move(asked);
      p.bounded_queue.insert(at, std::move(j));
      return;
    }
    default:
      Bump(stats.unsupported);
      return;
  }
}

void Engine::Impl::ReapClosing(Clock::time_point now) {
  for (auto it = contexts.begin(); it != contexts.end();) {
    Ctx& c = *it->second;
    // A failed context has nothing left to finish.
    bool done = !c.closing ? false : c.failed || now - c.closing_since >= opts.linger_max;
    if (c.closing && !done && now - c.last_rx >= opts.linger_quiet) {
      done = true;
      for (const Peer& p : c.peers) {
        // A peer that never answered the handshake has nothing of ours to finish.
        if (p.connected && p.unacked_base > 0 &&
            (!p.unacked.empty() || !p.data_queue.empty() || !p.ctrl.empty())) {
          done = false;
        }
      }
    }
    it = done ? contexts.erase(it) : std::next(it);
  }
}

void Engine::Impl::SendAck(Ctx& c, Peer& p) {
  if (tx_n == kBurst) Flush();
  WireHeader h;
  FillHeader(c, p, &h);
  h.type = static_cast<uint8_t>(PacketType::kAck);
  h.ack_seq = p.rx.cum();
  h.aux = p.dsack == kNoSeq ? 0 : p.dsack + 1;
  p.dsack = kNoSeq;
  const size_t slot = tx_n;
  const size_t n = p.rx.Sack(tx_sack[slot], kMaxSackBytes);
  h.payload_length = static_cast<uint32_t>(n);
  Emit(p, h, n ? tx_sack[slot] : nullptr, static_cast<uint32_t>(n));
  p.acks->OnAckSent();
  Bump(stats.acks_sent);
}

// ===================== receive path =====================

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
  p.live.Heard(Clock::now());
  if (!p.gone_reason.empty()) {  // it spoke: whoever said it was gone was wrong
    p.gone_reason.clear();
    p.gone_blame = -1;
  }
  switch (static_cast<PacketType>(h.type)) {
    case PacketType::kPing:
      // A closing context does not answer: a peer still waiting for it learns
      // that it is gone (its acks still answer retransmissions meanwhile).
      if (!c.closing) SendLiveness(c, p, PacketType::kPong, h.message_id);
      return;
    case PacketType::kPong:
      Bump(stats.pongs_received);
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
  if (static_cast<PacketType>(h.type) == PacketType::kAck) {
    const bool first = p.unacked_base == 0;
    HandleAck(c, p, h, payload);
    if (first && p.unacked_base > 0) handshake_cv.notify_all();
    return;
  }
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

void Engine::Impl::HandleAck(Ctx& c, Peer& p, const WireHeader& h,
                             const uint8_t* sack) {
  Bump(stats.acks_received);
  ReliableSender& s = *p.sender;
  const ReliableSender::Counters before = s.counters();
  const uint64_t dsack = h.aux == 0 ? kNoSeq : h.aux - 1;
  const bool ok = s.OnAck(h.ack_seq, sack, h.payload_length, dsack, Clock::now(),
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
}

void Engine::Impl::MarkAcked(Ctx& c, Peer& p, TxRecord& r) {
  if (r.acked) return;
  r.acked = true;
  p.inflight_bytes -= r.h.payload_length;
  if (r.msg) {
    std::shared_ptr<OutMsg> m = std::move(r.msg);
    ++m->packets_acked;
    if (!m->cancelled && m->packets_acked == m->packets_total) {
      CompleteOut(p, m);
    }
  }
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
    case PacketType::kAck:
    case PacketType::kRepair:  // bounded only, handled before sequencing
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
    m->stash.resize(h.total_length);
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
    if (m->target && m->total) {
      // Bytes that have not arrived yet are garbage here and get
      // overwritten when they do.
      std::memcpy(m->target, m->stash.data(), m->total);
    }
    std::vector<uint8_t>().swap(m->stash);
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

// ===================== peer liveness and context failure =====================

void Engine::Impl::TakeUnreachable() {
  PeerHandle gone[16];
  const size_t n = io->TakeUnreachable(gone, 16);
  for (size_t i = 0; i < n; ++i) {
    for (auto& kv : contexts) {
      for (Peer& p : kv.second->peers) {
        if (p.connected && p.handle == gone[i] && !p.live.unreachable()) {
          // A peer of this context reported gone before is the likely cause: a survivor
          // that failed on it and exited is reported too, and the ABORT naming the first
          // may be lost with its link (memif rings vanish with the link).
          for (const Peer& q : kv.second->peers) {
            if (&q != &p && q.connected && q.live.unreachable() && q.gone_blame < 0 &&
                p.gone_reason.empty()) {
              p.gone_reason = absl::StrCat("peer rank ", q.rank, " is gone: ",
                                           io->UnreachableCause(), " (and then rank ", p.rank,
                                           " too)");
              p.gone_blame = q.rank;
            }
          }
          p.live.Unreachable();
          Bump(stats.peers_unreachable);
        }
      }
    }
  }
  if (n > 0) next_liveness = Clock::now();  // judge them in this iteration
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
                                                                       opts.peer_dead / 4);
  last_liveness = now;
  std::vector<char> posted_from;
  for (auto& kv : contexts) {
    Ctx& c = *kv.second;
    if (c.failed || c.closing) continue;
    posted_from.assign(c.size, 0);
    for (const auto& slot : c.posted) {
      for (const PostedRecv& r : slot.second) {
        for (int src : r.srcs) {
          if (src >= 0 && src < c.size) posted_from[src] = 1;
        }
      }
    }
    for (Peer& p : c.peers) {
      if (!p.connected) continue;
      if (stalled) p.live.Restart(now);
      switch (p.live.Check(now, PendingWith(c, p, posted_from))) {
        case PeerLiveness::Verdict::kIdle:
        case PeerLiveness::Verdict::kAlive:
          break;
        case PeerLiveness::Verdict::kProbe:
          SendLiveness(c, p, PacketType::kPing, ++p.pings);
          break;
        case PeerLiveness::Verdict::kDead: {
          Bump(stats.peers_dead);
          const std::string why =
              !p.gone_reason.empty() ? p.gone_reason
              : p.live.unreachable()
                  ? absl::StrCat("peer rank ", p.rank, " is gone: ", io->UnreachableCause())
                  : absl::StrCat("peer rank ", p.rank, " is gone: no packet from it for ",
                                 p.live.dead_after().count(),
                                 " ms while operations with it were pending "
                                 "(OPTIREDUCE_PEER_DEAD_MS)");
          FailContext(c, absl::StrCat("rank ", c.rank, ": ", why),
                      p.gone_blame >= 0 ? p.gone_blame : p.rank);
          break;
        }
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
  const int blamed = h.aux == 0 || h.aux > static_cast<uint64_t>(c.size)
                         ? -1 : static_cast<int>(h.aux - 1);
  if (blamed >= 0 && blamed != p.rank && blamed != c.rank) {
    p.gone_reason = absl::StrCat("peer rank ", blamed, " is gone (rank ", p.rank,
                                 "'s context failed on it and closed its connection)");
    p.gone_blame = blamed;
  } else {
    p.gone_reason = absl::StrCat("peer rank ", p.rank, " closed the connection: its context failed",
                                 blamed == c.rank ? " (it lost contact with this rank)"
                                                  : " (a wait there timed out)");
    p.gone_blame = p.rank;
  }
  p.live.Unreachable();
  // The blamed rank is gone for this context too (the group shares its fate): what
  // is pending with it fails now rather than at this rank's own next probe.
  if (p.gone_blame != p.rank) {
    Peer& x = c.peers[p.gone_blame];
    if (x.connected && x.gone_reason.empty()) {
      x.gone_reason = p.gone_reason;
      x.gone_blame = p.gone_blame;
      x.live.Unreachable();
    }
  }
  next_liveness = Clock::now();  // judged in this iteration if something is pending
}

void Engine::Impl::FailContext(Ctx& c, const std::string& why, int blamed) {
  if (c.failed) return;
  c.failed = true;
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
    p.bounded_queue.clear();
  }
  // Tell the peers (like closing TCP connections): what they have pending
  // with this rank cannot complete. A lost ABORT leaves them their probes.
  for (Peer& p : c.peers) {
    if (!p.connected) continue;
    WireHeader h;
    FillHeader(c, p, &h);
    h.type = static_cast<uint8_t>(PacketType::kAbort);
    h.aux = blamed >= 0 ? static_cast<uint64_t>(blamed) + 1 : 0;
    if (c.token != 0) Emit(p, h, nullptr, 0);
  }
  Flush();
}

uint64_t Engine::Impl::RefuseOnFailed(Ctx& c, bool send, const std::shared_ptr<OpSink>& sink) {
  const uint64_t op = next_op++;
  sink->Fail(send, op, c.failure);
  return op;
}

// ===================== public API =====================

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
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  impl_->stop = true;
  impl_->io->Wake();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint32_t Engine::RegisterContext(int rank, int size, uint64_t local_token) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto c = std::make_unique<Ctx>();
  c->id = impl_->next_ctx++;
  c->rank = rank;
  c->size = size;
  c->local_token = local_token;
  c->token = rank == 0 ? local_token : 0;
  // Incast: a receiver's buffer is shared by all of its senders.
  const size_t peers = size > 1 ? static_cast<size_t>(size - 1) : 1;
  const size_t share = impl_->rx_buffer_bytes / peers;
  c->window = std::max<uint64_t>(
      std::min<uint64_t>(impl_->opts.window_bytes, share),
      2 * static_cast<uint64_t>(impl_->max_payload));
  c->peers.resize(size);
  c->bounded_senders = std::clamp(impl_->opts.bounded_senders, 1, std::max(1, size - 1));
  for (int i = 0; i < size; ++i) {
    Peer& p = c->peers[i];
    p.rank = i;
    p.eager_credit = static_cast<int64_t>(impl_->opts.eager_budget_per_peer);
    p.max_payload = impl_->max_payload;
    p.bounded_payload = impl_->bounded_payload;
    p.live = PeerLiveness(impl_->opts.peer_dead);
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
  impl_->io->Wake();
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
  p.live.Connected(Clock::now());
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
    m->owned.assign(m->data, m->data + len);
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
  c->posted[slot].push_back(std::move(r));
  return c->posted[slot].back().op;
}

absl::Status Engine::RegisterRecvBuffer(uint32_t ctx, int peer, uint64_t slot,
                                        void* base, size_t size,
                                        const std::shared_ptr<OpSink>& sink) {
  std::lock_guard<std::mutex> lock(impl_->mu);
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
  impl_->io->Wake();
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
            m.owned.assign(m.data, m.data + m.len);
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

void Engine::SetBoundedHooks(uint32_t ctx, BoundedHooks hooks) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return;
  c->bounded = std::move(hooks);
  if (!c->bounded.read_source) {
    for (Peer& p : c->peers) p.bounded_queue.clear();
  }
}

absl::Status Engine::SendBounded(uint32_t ctx, int dst, uint64_t op, uint64_t total) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  // A failed context sends nothing: a send on it fails as every later operation does.
  if (c->failed) return absl::UnavailableError(c->failure);
  if (dst < 0 || dst >= c->size || dst == c->rank || !c->peers[dst].connected) {
    return absl::InvalidArgumentError(absl::StrCat("bounded send to rank ", dst,
                                                   " which is not a connected peer"));
  }
  Peer& p = c->peers[dst];
  BoundedJob j;
  j.op = op;
  j.total = total;
  j.ranges.emplace_back(0, total);
  // The last 1% of the packets (at least four, so that one lost packet does not turn
  // the early timeout into a deadline) carry kFlagLast.
  const uint64_t packets = (total + p.bounded_payload - 1) / p.bounded_payload;
  const uint64_t flagged = std::max<uint64_t>(4, packets / 100);
  j.last_from = packets > flagged ? (packets - flagged) * p.bounded_payload : 0;
  j.order = c->bounded_next_order++;
  p.bounded_queue.push_back(std::move(j));
  impl_->Kick(*c, p);
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
  const size_t per_packet = std::max<size_t>(1, p.max_payload / 16);
  for (size_t i = 0; i < missing.size(); i += per_packet) {
    const size_t n = std::min(per_packet, missing.size() - i);
    std::vector<uint8_t> body(16 * n);
    for (size_t k = 0; k < n; ++k) {
      std::memcpy(&body[16 * k], &missing[i + k].first, 8);
      std::memcpy(&body[16 * k + 8], &missing[i + k].second, 8);
    }
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
  impl_->io->Wake();
  return absl::OkStatus();
}

uint32_t Engine::BoundedPayload() const { return impl_->bounded_payload; }

size_t Engine::BoundedPending(uint32_t ctx) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Ctx* c = impl_->FindCtx(ctx);
  if (!c) return 0;
  size_t n = 0;
  for (const Peer& p : c->peers) n += p.bounded_queue.size();
  return n;
}

void Engine::SetBoundedSenders(uint32_t ctx, int senders) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (c) c->bounded_senders = std::clamp(senders, 1, std::max(1, c->size - 1));
}

int Engine::BoundedSenders(uint32_t ctx) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Ctx* c = impl_->FindCtx(ctx);
  return c ? c->bounded_senders : 0;
}

size_t Engine::BoundedQueuedSends(uint32_t ctx, uint64_t op) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Ctx* c = impl_->FindCtx(ctx);
  if (!c) return 0;
  size_t n = 0;
  for (const Peer& p : c->peers) {
    for (const BoundedJob& j : p.bounded_queue) n += j.op == op && j.order != 0 ? 1 : 0;
  }
  return n;
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
                    !p.live.heard() ? std::string("never heard")
                                    : absl::StrCat("heard ",
                                                   std::chrono::duration_cast<std::chrono::milliseconds>(
                                                       now - p.live.last_heard()).count(),
                                                   " ms ago"),
                    p.live.unreachable() ? " (unreachable)" : "");
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
