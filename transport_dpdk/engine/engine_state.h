// The engine's state: what it keeps per context (Ctx), per peer (Peer), per message
// sent (OutMsg, TxRecord) and received (InMsg, PostedRecv, RecvBufferReg, Arrival), and
// the limits that bound them. Private to the engine files.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "transport_dpdk/bounded/bounded_sender.h"
#include "transport_dpdk/engine/engine.h"
#include "transport_dpdk/engine/payload_pool.h"
#include "transport_dpdk/engine/peer_close_state.h"
#include "transport_dpdk/engine/peer_liveness_state.h"
#include "transport_dpdk/reliable/ack_scheduler.h"
#include "transport_dpdk/reliable/receive_window.h"
#include "transport_dpdk/reliable/reliable_sender.h"
#include "transport_dpdk/wire/wire_format.h"

namespace optireduce {
namespace transport {
namespace engine_internal {

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
  // Withdrawn by its sender (Engine::Withdraw): a kWithdraw follows once every packet is
  // acknowledged, and the receiver's credit ends it.
  bool withdrawn = false;
  uint64_t next_offset = 0;
  uint64_t packets_total = 0, packets_sent = 0, packets_acked = 0;
  std::shared_ptr<OpSink> sink;
  // The payload, copied at PostSend for messages up to eager_max_message
  // (Gloo's TCP writes those out inside send(), so callers may reuse the
  // buffer right after), or when the sender's buffer went away before the
  // send finished (see Engine::Cancel).
  PayloadPool::Bytes owned;
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
// Free payload-copy storage an engine keeps for reuse (PayloadPool).
constexpr size_t kPayloadCacheBytes = 32 << 20;

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
  PayloadPool::Bytes stash;  // eager bytes that arrived before the match
  // Which bytes of `stash` arrived ([begin, end), in arrival order, adjacent ones joined):
  // the rest is recycled pool memory, never copied to the receiver.
  std::vector<std::pair<uint64_t, uint64_t>> stashed;
  uint64_t received = 0;
  bool matched = false, discard = false, completed = false, done = false;
  bool withdrawn = false;  // its sender withdrew it before it was announced: dropped then
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
  // --- liveness: probes, PING ids, why it is gone (engine/peer_liveness_state.h) ---
  PeerLivenessState liveness;
  // --- closing (engine/peer_close_state.h, ReapClosing): whether the peer's context is
  // closing (a receive from several sources does not wait on it while another of them is
  // open, CheckLiveness, as Gloo's TCP pair closed by its peer fails only what was posted
  // on that pair), and our close probes and its confirmation while ours closes ---
  PeerCloseState close;
};

// A destroyed context's addressing, kept after it is released so that a peer's close
// probe for it is still answered (it needs nothing from us: released contexts have
// nothing outstanding or gave up).
struct ClosedCtx {
  uint32_t id = 0;
  int rank = 0;
  uint64_t token = 0;
  std::vector<std::pair<PeerHandle, uint32_t>> peers;  // by rank: handle, remote ctx
  std::vector<char> connected;
};
constexpr size_t kMaxClosedContexts = 64;

struct Arrival {
  int peer;
  std::shared_ptr<InMsg> msg;
};

struct Ctx {
  uint32_t id = 0;
  int rank = 0, size = 0;
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
  // The bounded sends and repairs queued for each peer, and how many peers are sent to at
  // once (incast control).
  BoundedSender bounded_tx;
  // A peer is gone or a wait timed out: every pending operation failed with
  // `failure`, every later one fails with it at once, and no packet of the
  // context is applied or sent any more (like Gloo TCP's signalException).
  bool failed = false;
  std::string failure;
};

// Where an engine's context ids start (engine.cc).
uint32_t RandomContextEpoch();

}  // namespace engine_internal
}  // namespace transport
}  // namespace optireduce
