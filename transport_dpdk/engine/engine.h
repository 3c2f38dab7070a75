// engine.h — the datagram protocol engine of one device: contexts, peers,
// message matching (eager / rendezvous), per-peer reliability (sequence
// numbers, cumulative + selective acks, RACK-TLP loss recovery, RTO, congestion
// window and pacing: reliable/reliable_sender.h), flow control
// (per-peer byte window, eager credit) and one progress thread with adaptive
// backoff. It drives a PacketIo and knows nothing about Gloo classes; the
// adapter (device.h, context.h, ...) translates.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport_dpdk/bounded/source_access.h"
#include "transport_dpdk/engine/engine_options.h"
#include "transport_dpdk/engine/op_sink.h"
#include "transport_dpdk/io/packet_io.h"
#include "transport_dpdk/engine/stats.h"

namespace optireduce {
namespace transport {

// What a message targets at the receiver.
enum class MsgKind : uint8_t {
  kUnbound,  // matched against posted UnboundBuffer recvs (by slot, in order)
  kBuffer,   // written into the peer's registered old-style recv Buffer
};

// The bounded service's hooks into a context (see bounded/bounded_endpoint.h).
// Both run on the progress thread with the engine lock held: they must not
// call back into the engine.
struct BoundedHooks {
  // One payload of bounded operation `op` from `src`.
  // `estimated`: the sender marked the bytes as an estimate (kFlagEstimated).
  // `total`: the length of the sender's whole source (the header's total_length);
  // `op_bytes`: the byte count of the sender's whole allreduce (aux; 0: not stated).
  std::function<void(int src, uint64_t op, uint64_t offset, const uint8_t* data,
                     size_t len, bool last, bool estimated, uint64_t total,
                     uint64_t op_bytes)>
      on_data;
  // Calls fn(bytes, size, estimated) with the source of `op` sent to `peer`
  // while it is valid (kDone); otherwise says why it did not (SourceAccess).
  // Never blocks the progress thread.
  std::function<SourceAccess(uint64_t op, int peer,
                             const std::function<void(const char*, size_t, bool)>& fn)>
      read_source;
  // `src` answered a repair request for `op`: it cannot serve it (its sources
  // are released, or with `not_started` it has not started the operation).
  std::function<void(int src, uint64_t op, bool not_started)> on_absent;
  // `src`, the deputy of `op`, asks for its decision (kCede): true hands it over (this
  // rank had not begun `op` and never decides it), false keeps it. Unset: kept.
  std::function<bool(int src, uint64_t op)> on_cede_ask;
  // The leader `src` answered such a request: `ceded` or not.
  std::function<void(int src, uint64_t op, bool ceded)> on_cede_answer;
  // True while a posted bounded receive waits for data from `peer`: the engine's
  // liveness judges a peer while anything needs it, bounded receives included.
  std::function<bool(int peer)> awaits;
  // The context failed (Engine::FailContext): `blamed` is the gone peer (-1: a wait timed
  // out, no peer to blame), `why` the error every operation of the context reports.
  std::function<void(int blamed, const std::string& why)> on_failed;
};

class Engine {
 public:
  struct Impl;

  // rx_buffer_bytes: how much the backend can queue on receive; the engine
  // shares it among a context's peers as their send window (incast).
  static absl::StatusOr<std::shared_ptr<Engine>> Create(
      std::unique_ptr<PacketIo> io, const EngineOptions& options,
      size_t rx_buffer_bytes);
  ~Engine();

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Contexts. A context id is local to this engine and travels in the
  // Address so peers can address it. local_token: this rank's proposal for
  // the session token (the job uses rank 0's).
  uint32_t RegisterContext(int rank, int size, uint64_t local_token);
  void UnregisterContext(uint32_t ctx);
  // Records the peer (its datagram limit too: the pair uses the smaller of
  // both sides') and starts the handshake; does not block.
  absl::Status ConnectPeer(uint32_t ctx, int peer_rank, const IoAddress& io,
                           uint32_t remote_ctx, uint64_t remote_token,
                           uint32_t remote_max_datagram);
  // Waits until the connected peer has answered the handshake (it runs, is
  // reachable, belongs to this job and has connected back to this rank):
  // DeadlineExceeded after `timeout`.
  absl::Status WaitPeer(uint32_t ctx, int peer_rank, std::chrono::milliseconds timeout);
  // Largest datagram this engine sends and receives (published in the Address).
  uint32_t MaxDatagram() const;
  void ClosePeer(uint32_t ctx, int peer_rank);

  // Operations. Memory must stay valid until the op completes or the sink
  // is cancelled. Return the op id (for the sink's bookkeeping).
  absl::StatusOr<uint64_t> PostSend(uint32_t ctx, int dst, MsgKind kind,
                                    uint64_t slot, const void* data,
                                    size_t len, uint64_t remote_offset,
                                    const std::shared_ptr<OpSink>& sink);
  absl::StatusOr<uint64_t> PostRecv(uint32_t ctx, const std::vector<int>& srcs,
                                    uint64_t slot, void* data, size_t capacity,
                                    const std::shared_ptr<OpSink>& sink);
  // Old-style Buffer: every kBuffer message from peer on slot lands in
  // [base, base+size) at its remote offset and completes on sink, in order.
  absl::Status RegisterRecvBuffer(uint32_t ctx, int peer, uint64_t slot,
                                  void* base, size_t size,
                                  const std::shared_ptr<OpSink>& sink);
  void UnregisterRecvBuffer(uint32_t ctx, int peer, uint64_t slot,
                            const OpSink* sink);
  // Forgets every operation that refers to sink (its memory is going away):
  // nothing is written to that memory afterwards.
  void Cancel(const OpSink* sink);
  // Withdraws the unbound sends of `sink` that no receive may ever take (a peer that
  // will not post one): eager ones are dropped by their receiver, which returns their
  // credit, rendezvous ones not granted yet are forgotten on both sides; neither is
  // reported to the sink any more. Sends a receive has already taken finish as usual.
  void Withdraw(const OpSink* sink);
  // What the engine holds of unfinished exchanges with its peers, over all contexts:
  // sends not finished, eager credit lent to peers and not returned, and the eager
  // charge of peers' messages stashed here without a receive.
  struct Backlog {
    size_t sends = 0;
    int64_t credit_lent = 0;
    uint64_t stashed = 0;
  };
  Backlog GetBacklog() const;

  // Bounded service (OptiReduce mode): unreliable, paced sends without
  // acknowledgements; the receiver asks for missing ranges with RequestRepair.
  void SetBoundedHooks(uint32_t ctx, BoundedHooks hooks);
  // Queues the whole source of `op` for `dst` (read through read_source). Its packets
  // state `op_bytes`, the size of the whole allreduce on this rank (0: not stated).
  absl::Status SendBounded(uint32_t ctx, int dst, uint64_t op, uint64_t total,
                           uint64_t op_bytes = 0);
  // Sends every connected peer one empty DATA packet of `op` stating `op_bytes`: a rank
  // that found its peers' sizes differ tells the ranks that may have seen no wrong
  // packet themselves (each then compares the stated size with its own).
  absl::Status SendBoundedNotice(uint32_t ctx, uint64_t op, uint64_t op_bytes);
  // Asks `dst`, the leader of bounded operation `op`, to hand its decision over to this
  // rank (kCede); the answer comes through BoundedHooks::on_cede_answer.
  absl::Status AskToCede(uint32_t ctx, int dst, uint64_t op);
  absl::Status RequestRepair(uint32_t ctx, int dst, uint64_t op,
                             const std::vector<std::pair<uint64_t, uint64_t>>& missing);
  uint32_t BoundedPayload() const;
  // Bounded packets still queued for sending in this context.
  size_t BoundedPending(uint32_t ctx) const;
  // Sends of `op` (not repairs) still queued in this context.
  size_t BoundedQueuedSends(uint32_t ctx, uint64_t op) const;
  // How many peers this context's bounded sends go to at once (incast control; clamped
  // to [1, size - 1]); the oldest sends go first, so TAR's staggered order is kept.
  void SetBoundedSenders(uint32_t ctx, int senders);
  int BoundedSenders(uint32_t ctx) const;
  // Fails the context (as a gone peer does): every pending operation's wait
  // raises gloo::IoException with `why`, every later one at once, and nothing
  // of the context is sent or applied any more. Gloo waits that time out call
  // it (Gloo TCP poisons its context the same way). Idempotent: the first
  // reason stays.
  void FailContext(uint32_t ctx, const std::string& why);
  // OK while the context works; UNAVAILABLE with the reason (naming the gone
  // peer's rank, or the timed-out wait) once it failed; NOT_FOUND if unknown.
  absl::Status ContextFailure(uint32_t ctx) const;
  // Ranks of a registered context (0 if unknown).
  int ContextSize(uint32_t ctx) const;

  // Waiter-driven receive (engine_waiter.cc): a user thread that waits for a completion
  // (a receive, or the acknowledgement that completes a send) polls the device itself,
  // so that the thread that needs an arrival takes it in: on backends whose wait returns
  // on input (IoWaits::WakesOnInput) the arrival wakes that thread and not the progress
  // thread first and the waiter after it; on timer-only ones (dpdk) one thread per rank
  // polls instead of two. `sink_lock` holds the lock of the sink waited on;
  // `ready()` (called with it held) says whether the wait is over. Returns with the lock
  // held: kReady once ready() holds, kTimedOut at `until` (it does not hold), kNotDriven
  // at once if this moment has no waiter polling (another thread is the waiter;
  // busy_poll): the caller then waits on the sink's condition variable.
  enum class DriveResult { kReady, kTimedOut, kNotDriven };
  DriveResult DriveWait(std::unique_lock<std::mutex>& sink_lock,
                        const std::function<bool()>& ready,
                        std::chrono::steady_clock::time_point until);
  // Ends a DriveWait's current wait for input promptly (an abort).
  void WakeWaiter();

  Stats GetStats() const;
  // Per-peer protocol state of one context, for diagnostics (timeouts).
  std::string DebugState(uint32_t ctx) const;
  IoAddress LocalAddress() const;
  std::string Describe() const;
  uint64_t ContextToken(uint32_t ctx) const;
  // CPU time consumed by the progress thread so far.
  double ProgressThreadCpuSeconds() const;
  PacketIo* io();

 private:
  Engine() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace transport
}  // namespace optireduce
