// The receive side of the bounded service, independent of how packets travel.
//
// The I/O path (the protocol engine, or an in-process test hub) calls OnData for every
// payload of a bounded operation; algorithms post receives and wait on them through the
// optireduce::BoundedReceive interface. This class owns the state machine:
//   not posted --(Post)--> posted --(receive destroyed)--> closed
// Payloads for a posted op land in place by offset; for an op not posted yet they go to a
// bounded staging area (a fast peer, no barrier) and are applied at Post; for a closed op
// (a straggler's late packets), or once Wait/Repair returned (the caller reads the
// regions then), they are dropped and counted, never written.
// Sizes: a payload whose sender's whole source differs from the region posted for it, or
// whose stated allreduce size differs from this rank's, is never written: the ranks called
// the operation with different sizes. The receive then fails (SizeAgreement names both
// sizes), its waits end at once, and `notice` tells the peers.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "algorithms/bounded_channel.h"

namespace optireduce {
namespace transport {

struct BoundedReceiverCounters {
  uint64_t applied_packets = 0;
  uint64_t staged_packets = 0;
  uint64_t stale_packets = 0;         // op already closed, or its wait already returned
  uint64_t out_of_bounds_packets = 0; // offset/length outside the posted region
  uint64_t unknown_peer_packets = 0;  // op posted, but no region for this sender
  uint64_t staging_overflow_packets = 0;  // dropped (or evicted) for the staging limits
  uint64_t staging_overflow_bytes = 0;    // their payload bytes
  uint64_t failed_peer_packets = 0;       // from a peer reported failed (FailPeer)
  // Its sender's source length differs from the posted region, or its stated allreduce
  // size from this rank's: the ranks' sizes differ.
  uint64_t size_mismatch_packets = 0;
  uint64_t duplicate_bytes = 0;
  uint64_t absent_answers = 0;  // senders that said they cannot serve a repair
};

class BoundedReceiver {
 public:
  // Asks `peer` to send the `missing` ranges of `op` again.
  using RepairRequest =
      std::function<void(int peer, uint64_t op, const std::vector<ByteRange>& missing)>;
  // Tells every peer that the ranks' sizes of `op` differ (called once per receive, from
  // the waiting thread, without the receiver's lock).
  using SizeNotice = std::function<void(uint64_t op)>;

  struct Options {
    // Staging holds packets of operations not posted yet (this rank is behind its peers):
    // at least `staging_bytes`, grown to `staged_posts` posts of the largest size posted so
    // far — a rank a whole operation (two phases) behind keeps all of it; with 64 MiB
    // buckets on 4 ranks one operation is 96 MiB, and a 64 MiB area dropped most of what a
    // lagging rank needed next — at most `max_staging_bytes`.
    // Every staged packet is charged its payload plus kStagedPacketCost, so zero-length
    // and tiny packets fill the area too; at most `max_staged_packets` packets of at
    // most `max_staged_ops` operations are staged however small they are.
    size_t staging_bytes = 64 << 20;
    size_t staged_posts = 4;
    size_t max_staging_bytes = size_t{1} << 30;
    size_t max_staged_packets = 1 << 18;
    size_t max_staged_ops = 1024;
    // When staging is full, data staged longer ago than this is garbage (never posted here)
    // and makes room; younger data is what this rank posts next, so the newcomer is dropped.
    std::chrono::milliseconds staged_max_age{10000};
    size_t closed_history = 8192;
    // A region whose sender sent a payload this recently is "streaming" (RequestMissing).
    std::chrono::microseconds streaming_window{5000};
  };

  BoundedReceiver();
  explicit BoundedReceiver(const Options& options);
  ~BoundedReceiver();

  // `op_bytes`: the size of this rank's whole allreduce (0: not checked).
  std::unique_ptr<BoundedReceive> Post(uint64_t op, std::vector<BoundedRegion> regions,
                                       RepairRequest repair, uint64_t op_bytes = 0,
                                       SizeNotice notice = nullptr);

  // One payload of `op` from `src`: bytes [offset, offset + len) of that sender's region;
  // `estimated`: the sender marked them as an estimate (BoundedChannel::Send). `total`:
  // the length of the sender's whole source (0: not stated, a notice); `op_bytes`: the
  // size of the sender's whole allreduce (0: not stated).
  void OnData(uint64_t op, int src, uint64_t offset, const void* data, size_t len, bool last,
              bool estimated = false, uint64_t total = 0, uint64_t op_bytes = 0);

  // `src` cannot serve repairs of `op`: its sources are released (the data never
  // comes), or `not_started` (it has not called this operation yet).
  void OnAbsent(uint64_t op, int src, bool not_started);

  // `peer` is gone (the transport's liveness says so): waits for its data end at once
  // and its regions report `status` (BoundedReceive::PeerStatus), in receives posted now
  // and later; its payloads are dropped and counted.
  void FailPeer(int peer, const absl::Status& status);

  // A posted receive still waits for data from `peer` (the transport's liveness judges
  // the peer while one does).
  bool Awaits(int peer) const;

  // Packets of `op` are staged: it is not posted here, but a peer sends it.
  bool HasStaged(uint64_t op) const;

  BoundedReceiverCounters counters() const;
  // Memory the staging area holds now, as charged against its limit (tests).
  size_t staged_bytes() const;
  size_t staged_packets() const;

  // What one staged packet costs beyond its payload: its bookkeeping and the heap block.
  static constexpr size_t kStagedPacketCost = 128;

 private:
  class Receive;
  struct Region {
    BoundedRegion spec;
    std::map<size_t, size_t> arrived;  // begin -> end, disjoint, merged
    size_t bytes = 0;
    bool last_seen = false;
    bool estimated = false;  // an applied payload carried the sender's "estimate" mark
    // The sender answered a repair request with "cannot serve": released for good, or
    // not started yet (since `absent_at`).
    bool released = false;
    bool not_started = false;
    bool given_up = false;  // BoundedReceive::GiveUp: not waited for, not asked
    // Wait ended at its unstarted cutoff before anything arrived here: payloads are
    // applied after the wait too (until complete or given up).
    bool held_open = false;
    absl::Status failure;   // FailPeer: the sender is gone
    BoundedClock::time_point absent_at{};
    // For the adaptive peer timeout: the first payload, and when the region was done
    // (complete, or its last packets in). Epoch (zero): not yet.
    BoundedClock::time_point first_arrival{};
    BoundedClock::time_point done_at{};
    // The latest payload: a sender heard from this recently is still streaming, and a
    // repair asks it only for holes, not for the tail it is about to send anyway.
    BoundedClock::time_point last_payload{};
  };
  struct Posted {
    std::vector<Region> regions;
    BoundedClock::time_point posted_at;
    BoundedClock::time_point last_arrival;
    // False once Wait or Repair returned (until the next Repair): the caller reads the
    // regions then, so late payloads are dropped (counted stale), never written — but
    // those of a region held open (Region::held_open).
    bool accepting = true;
    uint64_t op_bytes = 0;  // this rank's allreduce size (0: not checked)
    absl::Status mismatch;  // the first payload that showed the sizes differ
  };
  struct Staged {
    int src;
    uint64_t offset;
    bool last;
    bool estimated;
    uint64_t total;
    uint64_t op_bytes;
    std::vector<char> bytes;
  };

  void ApplyLocked(Posted& posted, int src, uint64_t offset, const void* data, size_t len,
                   bool last, bool estimated, uint64_t total, uint64_t op_bytes);
  // False (and the receive failed, counted) when the payload shows the sizes differ.
  bool SizesAgreeLocked(Posted& posted, const Region* region, int src, uint64_t total,
                        uint64_t op_bytes);
  void CloseLocked(uint64_t op);
  // True when `src`'s region of `posted` is held open past its wait (Region::held_open).
  static bool HeldOpenLocked(const Posted& posted, int src);
  // Drops every staged packet of `op` (counted as overflow).
  void EvictStagedLocked(uint64_t op);
  // Staged payload buffers are recycled: a fast peer stages a whole phase (megabytes in
  // 32 KiB packets) almost every operation, and fresh heap memory for each costs the
  // progress thread a page fault per 4 KiB once the allocator has returned it.
  std::vector<char> TakeBufferLocked(const void* data, size_t len);
  void RecycleLocked(std::vector<char>&& bytes);

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  absl::flat_hash_map<uint64_t, Posted*> posted_;
  absl::flat_hash_map<uint64_t, std::vector<Staged>> staged_;
  std::deque<std::pair<uint64_t, BoundedClock::time_point>> staged_order_;  // first packet
  size_t staged_bytes_ = 0;    // payloads + kStagedPacketCost per packet
  size_t staged_count_ = 0;    // packets staged
  size_t staging_limit_ = 0;  // options_.staging_bytes grown by the largest post (Options)
  std::vector<std::vector<char>> spare_buffers_;
  size_t spare_bytes_ = 0;  // capacity held in spare_buffers_, at most the staging limit
  absl::flat_hash_set<uint64_t> closed_;
  std::deque<uint64_t> closed_order_;
  absl::flat_hash_map<int, absl::Status> failed_peers_;
  BoundedReceiverCounters counters_;
};

}  // namespace transport
}  // namespace optireduce
