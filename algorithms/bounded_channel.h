// The one interface OptiReduce's bounded mode needs from a transport.
//
// A bounded channel moves bytes without retransmission: a receive posted with a deadline
// completes when all bytes arrived, at an early timeout, or at the deadline, and reports
// which byte ranges arrived. algorithms/ declares it; transport_dpdk/ implements it on the
// same packet path as its reliable service. Gloo's own transports have none, so
// BoundedChannelOf returns nullptr for them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <gloo/transport/unbound_buffer.h>

#include "absl/status/status.h"

namespace gloo {
class Context;
}

namespace optireduce {

using BoundedClock = std::chrono::steady_clock;

// Bounded operation ids come in pairs: the two phases of one operation (phase 1 an even
// id, phase 2 the next one; BoundedOpId). The id of the other phase of `op`; the
// algorithms and the transport's source bookkeeping both use it.
constexpr uint64_t SiblingPhaseOp(uint64_t op) { return op ^ 1; }

// Bytes [begin, end) of a region.
struct ByteRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};

// Why a bounded receive stopped waiting.
enum class PhaseEnd : uint8_t {
  kComplete,      // every byte arrived
  kEarlyTimeout,  // every peer's last packets arrived and the input went quiet
  kDeadline,      // the hard bound of the phase passed
  kPeerTimeout,   // most peers were done; the others ran past what a typical peer needed
  kPeerFailed,    // a peer whose data is missing is gone (PeerStatus says which and why)
};
const char* PhaseEndName(PhaseEnd end);

// One destination of a bounded receive: `nbytes` bytes from `peer` land at `dst` by offset.
struct BoundedRegion {
  int peer = -1;
  void* dst = nullptr;
  size_t nbytes = 0;
};

class BoundedReceive {
 public:
  virtual ~BoundedReceive() = default;

  // Waits until every region is complete, or every peer's last packets arrived and nothing
  // arrived for `quiet`, or `deadline`. With `peer_factor` > 0 and two regions or more, also
  // until the adaptive peer timeout (the original's median estimate): once at least half of
  // the regions are done (complete, or their last packets in), a region still running gets
  // `peer_factor` times the median transfer time of the done ones from its first packet
  // (one that has not started: from the moment half were done), at least `quiet` and a
  // quarter of the time from the post to `deadline`.
  // With `unstarted_cutoff`, a region that had received nothing by then (nothing yet, or
  // its first payload came later) no longer holds the wait: once every other region is
  // complete, Wait returns kPeerTimeout (a decider leaves a peer that had not started by
  // the start grace out without also waiting out the peer timeout or its transfer).
  // No byte is written into the regions after Wait (or Repair) returns, until Repair is
  // called — except into a region that Wait ended without (nothing had arrived at the
  // cutoff): its late start keeps landing in place until it is complete or given up
  // (GiveUp), so a peer counted after all needs no repair of what it sent meanwhile. The
  // caller reads such a region only once it is complete.
  virtual PhaseEnd Wait(BoundedClock::time_point deadline, std::chrono::microseconds quiet,
                        double peer_factor = 0,
                        BoundedClock::time_point unstarted_cutoff =
                            BoundedClock::time_point::max()) = 0;

  // Asks the senders to send the missing ranges again and waits until complete or
  // `deadline`. A sender that cannot serve says so: one whose sources are released is not
  // waited for any longer; one that has not started the operation yet (a straggler) gets
  // `not_started_grace` from its answer to start (its data is then repaired), else it is
  // given up too. A sender that does not answer at all (dead) is waited for until `deadline`.
  virtual PhaseEnd Repair(BoundedClock::time_point deadline,
                          std::chrono::microseconds not_started_grace) = 0;

  // Byte ranges of region `index` that arrived, sorted and disjoint.
  virtual std::vector<ByteRange> Arrived(size_t index) const = 0;

  // True when the sender of region `index` marked its bytes as an estimate (its own inputs
  // were incomplete: see BoundedChannel::Send), in any packet that arrived.
  virtual bool Estimated(size_t index) const = 0;
  // Not OK when the sender of region `index` is gone (the transport's liveness reported it
  // failed): its data never comes, and Wait/Repair return kPeerFailed instead of waiting
  // for it. OptiReduce mode absorbs loss and lateness, never a dead peer: the allreduce
  // raises gloo::IoException naming that rank.
  virtual absl::Status PeerStatus(size_t index) const {
    (void)index;
    return absl::OkStatus();
  }
  // True when the sender of region `index` answered a repair that its sources are released
  // (its operation ended — by an exception, or long ago): what is still missing never
  // comes.
  virtual bool Released(size_t index) const {
    (void)index;
    return false;
  }
  // Not OK (INVALID_ARGUMENT, naming both sizes) once a packet showed that the ranks called
  // this operation with different sizes (BoundedChannel::BeginOperation): Wait and Repair
  // then return kPeerFailed at once, and the allreduce raises. Default: OK (not checked).
  virtual absl::Status SizeAgreement() const { return absl::OkStatus(); }
  // When the first payload of region `index` arrived (payloads staged before the post
  // count as arriving at the post); nullopt while nothing has. How late peers start is
  // learned from it (TimeoutPolicy::RecordStartLag).
  virtual std::optional<BoundedClock::time_point> FirstArrival(size_t index) const {
    (void)index;
    return std::nullopt;
  }  // Stops waiting for `peer` (a straggler given up in phase 1 of the same operation: it
  // cannot send its phase-2 data before it has done its own phase 1). Wait and Repair treat
  // its region as settled — they end as soon as the others are complete — and ask it for
  // nothing; what it still sends before they return is applied. Default: no-op (waited for).
  virtual void GiveUp(int peer) { (void)peer; }
};

class BoundedChannel {
 public:
  virtual ~BoundedChannel() = default;

  // Both phases of the bounded operation `op` (and SiblingPhaseOp(op)) belong to an
  // allreduce of `bytes` bytes on this rank: the transport states the size in the packets
  // it sends for them and checks it, and each packet's source length, against what this
  // rank posted (BoundedReceive::SizeAgreement). Called before PostReceive and Send of
  // that operation. Default: no check.
  virtual void BeginOperation(uint64_t op, uint64_t bytes) {
    (void)op;
    (void)bytes;
  }

  // Posts the regions of operation `op`. Every rank names an operation by the same id;
  // packets of `op` that arrived before the post (a fast peer) are applied now; packets
  // of operations already closed are dropped and counted.
  virtual std::unique_ptr<BoundedReceive> PostReceive(uint64_t op,
                                                       std::vector<BoundedRegion> regions) = 0;

  // Sends `nbytes` at `src` to `peer` as operation `op`, without retransmission; the last
  // packets carry a "last" flag. `src` stays readable for repairs until Release(op).
  // `estimated`: the bytes are an estimate, not the exact value (TAR's owner of a shard
  // whose phase-1 inputs stayed incomplete): every packet, repairs too, says so, so each
  // receiver learns that its result is damaged, not only the owner.
  virtual void Send(int peer, uint64_t op, const void* src, size_t nbytes,
                    bool estimated) = 0;

  // Copies the sources of `op` into the channel's own memory so the caller may reuse them;
  // repairs of `op` are then served from the copies, kept within a memory budget (oldest
  // operations are forgotten first).
  virtual void Detach(uint64_t op) = 0;
  // Makes the next Detach calls of up to `bytes` per source copy into memory that is
  // already faulted in (calibration operations call it, outside their measured time: a
  // fresh 16 MiB copy took 80-190 ms of page faults with 4 ranks on 2 cores).
  virtual void ReserveDetach(size_t bytes) { (void)bytes; }
  // Stops serving `op` at all (its sources are about to change): later repair requests
  // for it go unanswered and the requester compensates. Sends of `op` still queued are
  // dropped: call FinishSends first.
  virtual void Release(uint64_t op) = 0;
  // Waits until the sends of `op` queued by Send have left this rank (a transport that
  // paces or staggers its sends may still hold some), or until `deadline`.
  virtual void FinishSends(uint64_t op, BoundedClock::time_point deadline) {
    (void)op;
    (void)deadline;
  }

  // True when packets of `op` arrived although no receive of it is posted here yet: a peer
  // runs that operation bounded. A rank that calibrates it (exact TAR) learns from this
  // that it disagrees with its peers and joins them (algorithms/allreduce.cc).
  virtual bool HasUnpostedData(uint64_t op) const {
    (void)op;
    return false;
  }

  // Waits at most `slice` for a receive of `buf` (a buffer of this channel's context):
  // true on a completion, false when the wait was aborted, nullopt when the slice ended
  // first. Unlike buf.waitRecv, the end of the slice is no failure: the receive stays
  // posted and the context usable (a Gloo wait that times out fails its context), so a
  // caller can poll. Default: buf.waitRecv(rank, slice), whose timeout raises.
  virtual std::optional<bool> PollRecv(gloo::transport::UnboundBuffer& buf, int* rank,
                                       std::chrono::milliseconds slice) {
    return buf.waitRecv(rank, slice);
  }

  // Withdraws the sends of `buf` (a buffer of this channel's context) that no peer will
  // receive: the peers drop them and nothing of them stays pending on either side (the
  // fingerprint of a calibrating rank that joined bounded peers). Default: nothing (the
  // sends stay until the context ends).
  virtual void WithdrawSends(gloo::transport::UnboundBuffer& buf) { (void)buf; }

  // The hand-over of a late leader's decision (algorithms/README.md, "Who decides when the
  // leader is late"). AskToCede, on the operation's deputy: asks `leader` for the decision of
  // `op` and waits for its answer until `deadline`. The leader's transport answers at
  // once, whatever its own thread does: kCeded when it had not begun `op` (BeginOperation)
  // — it then never decides it, this rank does — kRefused when it had. Ceded, on the
  // leader (after BeginOperation of `op`): true when it ceded `op` to its deputy.
  enum class CedeAnswer : uint8_t { kCeded, kRefused, kNoAnswer, kUnsupported };
  virtual CedeAnswer AskToCede(int leader, uint64_t op, BoundedClock::time_point deadline) {
    (void)leader;
    (void)op;
    (void)deadline;
    return CedeAnswer::kUnsupported;
  }
  virtual bool Ceded(uint64_t op) const {
    (void)op;
    return false;
  }

  // Largest payload per packet; ranges arrive in multiples of it (except the tail).
  virtual size_t PacketPayload() const = 0;

  // Feedback after each operation: the fraction of the bytes this rank expected that were
  // lost on the way (holes below the furthest byte that arrived from a peer when its phase
  // ended: a peer that started late or was still sending is no loss), and whether a phase
  // ran late although every peer had started (the network's pace, not a straggler's). The
  // transport adapts its incast control to both.
  virtual void OnOperationDone(double loss_fraction, bool late) {
    (void)loss_fraction;
    (void)late;
  }
};

// Implemented by a transport context that owns a bounded channel. The context hands out its
// channel object instead of implementing BoundedChannel itself: a forwarding layer would
// have to repeat every method, and one it forgot would silently fall back to a default.
class HasBoundedChannel {
 public:
  virtual ~HasBoundedChannel() = default;
  virtual BoundedChannel* bounded_channel() = 0;
};

// The bounded channel of a context whose transport has one, else nullptr.
BoundedChannel* BoundedChannelOf(gloo::Context& context);

}  // namespace optireduce
