// Engine::Impl: the engine's private half, shared by the engine_*.cc files. Each group of
// its methods lives in the file named after its job (the progress loop, the reliable
// sender, the receive path and matching, the bounded service, liveness and failure).
#pragma once

#include <time.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport_dpdk/engine/engine.h"
#include "transport_dpdk/engine/engine_state.h"
#include "transport_dpdk/io/packet_io.h"
#include "transport_dpdk/engine/stats.h"

namespace optireduce {
namespace transport {

struct Engine::Impl {
  using Clock = engine_internal::Clock;
  using Ctx = engine_internal::Ctx;
  using Peer = engine_internal::Peer;
  using ClosedCtx = engine_internal::ClosedCtx;
  using OutMsg = engine_internal::OutMsg;
  using InMsg = engine_internal::InMsg;
  using TxRecord = engine_internal::TxRecord;
  using PostedRecv = engine_internal::PostedRecv;
  using RecvBufferReg = engine_internal::RecvBufferReg;
  static constexpr size_t kBurst = engine_internal::kBurst;


  Impl(std::unique_ptr<PacketIo> io_in, const EngineOptions& o, size_t rxbuf)
      : io(std::move(io_in)),
        waits(io->Waits()),
        opts(o),
        rx_buffer_bytes(rxbuf),
        link_protects_payload(io->ProtectsPayload()) {
    max_payload = io->MaxDatagram() - kHeaderBytes;
    bounded_payload = static_cast<uint32_t>(
        std::max<size_t>(64, std::min<size_t>(opts.bounded_payload, max_payload) / 64 * 64));
    bounded_pacer = BoundedPacer(opts.bounded_rate_gbps * 1e9 / 8, bounded_payload,
                                 kHeaderBytes);
    liveness_cadence = PeerLiveness::Cadence(opts.peer_dead);
    liveness_every = std::clamp<Clock::duration>(liveness_cadence / 16,
                                                 std::chrono::milliseconds(1),
                                                 std::chrono::milliseconds(50));
    liveness_first = std::min(liveness_every, PeerLiveness::FirstProbe(liveness_cadence));
  }

  std::unique_ptr<PacketIo> io;
  IoWaits& waits;  // io's (PacketIo::Waits): the sleeps between polls and their wake-ups
  const EngineOptions opts;
  const size_t rx_buffer_bytes;
  // Checksum headers only, and accept datagrams that did (wire_format.h).
  const bool link_protects_payload;
  uint32_t max_payload = 0;

  // Storage of the payload copies (send-time snapshots, detached sends, eager stashes),
  // reused so that a copy does not fault in fresh pages every time.
  const std::shared_ptr<PayloadPool> payloads = PayloadPool::Create(engine_internal::kPayloadCacheBytes);

  mutable std::mutex mu;
  // Signalled when a peer acknowledges its first packet (the connect handshake).
  std::condition_variable handshake_cv;
  std::map<uint32_t, std::unique_ptr<Ctx>> contexts;
  std::deque<ClosedCtx> closed;  // newest last, at most kMaxClosedContexts
  // Context ids start at a random epoch per engine (RandomContextEpoch).
  uint32_t next_ctx = engine_internal::RandomContextEpoch();
  uint64_t next_op = 1;
  AtomicStats stats;

  std::atomic<bool> stop{false};
  // When the progress thread's current sleep ends (max: it is not sleeping). Under mu.
  Clock::time_point sleeping_until = Clock::time_point::max();
  // A user thread transmitted (Kick) since the progress thread last looked. Under mu.
  bool kicked = false;
  const bool wakes_on_input = waits.WakesOnInput();

  // ---- waiter-driven receive (engine_waiter.cc) ----
  // A user thread polls the engine itself while it waits for a completion (at most one
  // at a time; Engine::DriveWait). Written under mu; read without it too.
  std::atomic<bool> waiter_active{false};
  // The waiter is inside its own Poll right now. Under mu.
  bool waiter_polling = false;
  // Waits that ended the waiter's polling, so far. Under mu.
  uint64_t waiter_exits = 0;
  // The progress thread sleeps in WaitForWake (a waiter watches the input). Under mu.
  bool progress_waits_for_wake = false;
  // Its first such sleep (later ones double while the same waiter stays); a waiter that
  // leaves wakes it only if it would sleep longer than this.
  const std::chrono::microseconds waiter_handoff =
      std::clamp<std::chrono::microseconds>(opts.max_sleep, std::chrono::microseconds(16),
                                            std::chrono::milliseconds(1));
  // Something other than the waiter's own poll may have completed or failed one of its
  // operations (lock held): its wait for input ends (WakeWaiter) so that it looks.
  void WakeWaiterIfOthers() {
    if (waiter_active.load(std::memory_order_relaxed) && !waiter_polling) waits.WakeWaiter();
  }

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
  // Bounded service: the device's payload per datagram and its pacing, a token bucket of
  // bytes shared by the contexts (no acks clock it).
  uint32_t bounded_payload = 0;
  BoundedPacer bounded_pacer;
  // Peer liveness: what the probe intervals derive from (PeerLiveness::Cadence), how
  // often peers are judged, and when next.
  std::chrono::milliseconds liveness_cadence{};
  Clock::duration liveness_every{};
  // How soon a newly posted receive's sources are first judged (PeerLiveness's
  // short probe interval).
  Clock::duration liveness_first{};
  Clock::time_point next_liveness{}, last_liveness{};

  // ---- progress thread ----
  void Run();
  bool Poll(Clock::time_point* deadline);
  void Flush();
  void Emit(Peer& p, const WireHeader& h, const void* body,
            uint32_t len);
  // p may be null (an answer on behalf of a released context): nothing to recover if
  // the device refuses it.
  void EmitTo(Peer* p, PeerHandle handle, const WireHeader& h, const void* body, uint32_t len);

  void SendNew(Ctx& c, Peer& p, WireHeader h, std::shared_ptr<OutMsg> msg);
  // Sends the next packet of the oldest queued message; false if none.
  bool SendNextData(Ctx& c, Peer& p);
  void Retransmit(Ctx& c, Peer& p, uint64_t seq, Clock::time_point now);
  void Pump(Ctx& c, Peer& p, Clock::time_point now,
            Clock::time_point* deadline);
  void SendAck(Ctx& c, Peer& p);
  // Sends context c's queued bounded packets (its BoundedSender, through the engine's
  // BoundedPort).
  void PumpBoundedSends(Ctx& c, Clock::time_point now, Clock::time_point* deadline);
  void HandleBounded(Ctx& c, Peer& p, const WireHeader& h,
                     const uint8_t* payload);
  void ReapClosing(Clock::time_point now);
  // Whether nothing is left between closing context c and peer p (probes p if needed).
  bool CloseSettled(Ctx& c, Peer& p, Clock::time_point now);
  void AnswerClosedProbe(const WireHeader& h);
  // Nothing of ours is waiting for p (no packet unacknowledged or queued).
  static bool NothingOutstanding(const Peer& p) {
    return p.unacked.empty() && p.data_queue.empty() && p.ctrl.empty();
  }

  // Sends what is ready for peer p right away from the calling (user)
  // thread, saving the hand-off to the progress thread. Lock held.
  void Kick(Ctx& c, Peer& p) {
    auto deadline = Clock::time_point::max();
    tx_blocked = false;
    Pump(c, p, Clock::now(), &deadline);
    Flush();
    // On a backend whose waits are timers only, the answer to this work (an ack, a
    // credit, a reply) is polled for: the progress thread counts it as work and spins.
    // Elsewhere the answer's arrival wakes it, and it is woken here only if this work has
    // a timer due before its current sleep ends (not an eventfd write and a thread
    // wake-up per message).
    if (!wakes_on_input) {
      kicked = true;
      waits.Wake();
    } else if (tx_blocked) {
      waits.Wake();
    } else {
      WakeIfSleepingPast(deadline);
    }
  }
  // Wakes the progress thread if it sleeps past `due` (something is due then). Lock held.
  void WakeIfSleepingPast(Clock::time_point due) {
    if (sleeping_until != Clock::time_point::max() && due < sleeping_until) waits.Wake();
  }
  bool HasClosing() const {
    for (const auto& kv : contexts) if (kv.second->closing) return true;
    return false;
  }
  void FillHeader(const Ctx& c, const Peer& p, WireHeader* h) const;

  // ---- peer liveness and context failure ----
  void TakeUnreachable();
  // Whether a backend's unreachable report proves peer `p` of `c` gone (engine_liveness.cc).
  bool ReportProvesGone(const Ctx& c, const Peer& p, const UnreachableReport& r) const;
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
  // An acknowledgement: cumulative point, DSACK (header aux form: 0 none, else seq + 1)
  // and SACK bitmap (sack_len bytes; none for a piggybacked ack).
  void HandleAck(Ctx& c, Peer& p, uint64_t ack_seq, uint64_t dsack, const uint8_t* sack,
                 uint32_t sack_len);
  void MarkAcked(Ctx& c, Peer& p, TxRecord& r);
  bool Apply(Ctx& c, Peer& p, const WireHeader& h, const uint8_t* payload);
  bool ApplyEager(Ctx& c, Peer& p, const WireHeader& h,
                  const uint8_t* payload);
  bool ApplyRdvData(Ctx& c, Peer& p, const WireHeader& h,
                    const uint8_t* payload);
  bool ApplyRts(Ctx& c, Peer& p, const WireHeader& h);
  bool ApplyCts(Ctx& c, Peer& p, const WireHeader& h);
  bool ApplyWithdraw(Ctx& c, Peer& p, const WireHeader& h);
  // Queues the kWithdraw of m for its receiver.
  void QueueWithdraw(Peer& p, const OutMsg& m);
  // Drops a message its sender withdrew, unmatched and out of any arrival queue: an
  // eager one completes as discarded (its credit goes back), a rendezvous one is forgotten.
  void DropWithdrawn(Ctx& c, Peer& p, const std::shared_ptr<InMsg>& m);

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

}  // namespace transport
}  // namespace optireduce
