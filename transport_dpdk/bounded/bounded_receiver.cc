#include "transport_dpdk/bounded/bounded_receiver.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {

using Clock = BoundedClock;

class BoundedReceiver::Receive : public BoundedReceive {
 public:
  Receive(BoundedReceiver* owner, uint64_t op, std::unique_ptr<Posted> posted,
          RepairRequest repair, SizeNotice notice)
      : owner_(owner),
        op_(op),
        posted_(std::move(posted)),
        repair_(std::move(repair)),
        notice_(std::move(notice)) {}

  ~Receive() override {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    owner_->CloseLocked(op_);
  }

  PhaseEnd Wait(Clock::time_point deadline, std::chrono::microseconds quiet,
                double peer_factor, Clock::time_point unstarted_cutoff) override {
    PhaseEnd end;
    {
      std::unique_lock<std::mutex> lock(owner_->mu_);
      end = WaitLocked(lock, deadline, quiet, peer_factor, std::nullopt, unstarted_cutoff);
      // The caller reads the regions from now on (interface contract): no more writes,
      // but into regions that had not started at the cutoff (read once complete).
      posted_->accepting = false;
      if (Clock::now() >= unstarted_cutoff) {
        for (Region& r : posted_->regions) {
          if (StartedAfter(r, unstarted_cutoff) && !r.given_up) r.held_open = true;
        }
      }
    }
    NoticeMismatch();
    return end;
  }

  // The first time this receive learns that the sizes differ, every peer is told: a rank
  // that received nothing wrong itself (its own size matches the packets it got) learns
  // it from the notice of a rank whose size differs from its own.
  void NoticeMismatch() {
    {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      if (posted_->mismatch.ok() || noticed_) return;
      noticed_ = true;
    }
    if (notice_) notice_(op_);
  }

  absl::Status SizeAgreement() const override {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    return posted_->mismatch;
  }

  // True when nothing of `r` had arrived by `cutoff` (nothing yet, or its first payload
  // came later).
  static bool StartedAfter(const Region& r, Clock::time_point cutoff) {
    return r.first_arrival == Clock::time_point{} || r.first_arrival > cutoff;
  }

  // With `settle_grace` (repairs): also returns (kDeadline) once every incomplete region's
  // sender said it cannot serve — released, or not started for longer than the grace.
  // With `unstarted_cutoff` (Wait): also returns (kPeerTimeout) from then on once every
  // region is complete, given up, or had received nothing by the cutoff.
  PhaseEnd WaitLocked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline,
                      std::chrono::microseconds quiet, double peer_factor,
                      std::optional<std::chrono::microseconds> settle_grace,
                      Clock::time_point unstarted_cutoff = Clock::time_point::max()) {
    for (;;) {
      if (!posted_->mismatch.ok()) return PhaseEnd::kPeerFailed;
      bool complete = true;
      bool done_or_given_up = true;  // complete, but for regions given up
      bool done_or_unstarted = true;  // ... or but for regions that received nothing
      bool all_last = true;
      for (const Region& r : posted_->regions) {
        const bool full = r.bytes == r.spec.nbytes;
        if (!full && !r.given_up && !r.failure.ok()) return PhaseEnd::kPeerFailed;
        complete = complete && full;
        done_or_given_up = done_or_given_up && (full || r.given_up);
        done_or_unstarted =
            done_or_unstarted && (full || r.given_up || StartedAfter(r, unstarted_cutoff));
        all_last = all_last && (r.last_seen || full || r.given_up);
      }
      if (complete) return PhaseEnd::kComplete;
      // The others are in and a straggler was given up: cut by a timeout (its own phase 1).
      if (done_or_given_up) return PhaseEnd::kPeerTimeout;
      const auto now = Clock::now();
      // The others are in and the rest had not started by the cutoff.
      if (done_or_unstarted && now >= unstarted_cutoff) return PhaseEnd::kPeerTimeout;
      Clock::time_point settle_wake = Clock::time_point::max();
      if (settle_grace) {
        bool settled = true;
        for (const Region& r : posted_->regions) {
          if (r.bytes == r.spec.nbytes || r.released || r.given_up) continue;
          if (r.not_started && now >= r.absent_at + *settle_grace) continue;
          settled = false;
          if (r.not_started) settle_wake = std::min(settle_wake, r.absent_at + *settle_grace);
        }
        if (settled) return PhaseEnd::kDeadline;
      }
      if (all_last && now - posted_->last_arrival >= quiet) return PhaseEnd::kEarlyTimeout;
      if (now >= deadline) return PhaseEnd::kDeadline;
      auto wake = std::min(deadline, settle_wake);
      if (done_or_unstarted) wake = std::min(wake, unstarted_cutoff);
      if (all_last) wake = std::min(wake, posted_->last_arrival + quiet);
      if (peer_factor > 0) {
        const auto peer_deadline = PeerDeadline(deadline, quiet, peer_factor);
        if (peer_deadline && now >= *peer_deadline) return PhaseEnd::kPeerTimeout;
        if (peer_deadline) wake = std::min(wake, *peer_deadline);
      }
      owner_->cv_.wait_until(lock, wake);
    }
  }

  // The adaptive peer timeout (see BoundedReceive::Wait); nullopt while fewer than half of
  // the regions are done. Called with the owner's lock held.
  std::optional<Clock::time_point> PeerDeadline(Clock::time_point deadline,
                                                std::chrono::microseconds quiet,
                                                double factor) const {
    const auto& regions = posted_->regions;
    size_t counted = 0;  // regions given up are neither waited for nor a reference
    for (const Region& r : regions) counted += r.given_up ? 0 : 1;
    if (counted < 2) return std::nullopt;
    std::vector<Clock::time_point> done_at;
    std::vector<Clock::duration> took;
    for (const Region& r : regions) {
      if (r.given_up || r.done_at == Clock::time_point{}) continue;
      done_at.push_back(r.done_at);
      took.push_back(r.done_at - r.first_arrival);
    }
    const size_t half = (counted + 1) / 2;
    if (done_at.size() < half || done_at.size() == counted) return std::nullopt;
    std::sort(done_at.begin(), done_at.end());
    std::sort(took.begin(), took.end());
    const Clock::time_point half_done = done_at[half - 1];
    // At least a quarter of the phase's bound: ranks call an allreduce some time apart
    // (their compute differs), and a tiny transfer time says nothing about that skew.
    const Clock::duration allow = std::max<Clock::duration>(
        {quiet, (deadline - posted_->posted_at) / 4,
         std::chrono::duration_cast<Clock::duration>(took[(took.size() - 1) / 2] * factor)});
    Clock::time_point latest{};
    for (const Region& r : regions) {
      if (r.given_up || r.done_at != Clock::time_point{}) continue;
      const auto from = r.first_arrival == Clock::time_point{} ? half_done : r.first_arrival;
      latest = std::max(latest, from + allow);
    }
    return latest;
  }

  PhaseEnd Repair(Clock::time_point deadline,
                  std::chrono::microseconds not_started_grace) override {
    {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      posted_->accepting = true;
    }
    // Repairs are lossy too: ask again for what is still missing a few times per budget.
    const auto interval = std::max<Clock::duration>(
        std::chrono::milliseconds(1), (deadline - Clock::now()) / 8);
    for (;;) {
      RequestMissing();
      const auto until = std::min(deadline, Clock::now() + interval);
      std::unique_lock<std::mutex> lock(owner_->mu_);
      // Repairs come without "last" flags: wait for completeness, for every sender to have
      // said it cannot serve, or the deadline.
      const PhaseEnd end = WaitLocked(lock, until, std::chrono::hours(24), /*peer_factor=*/0,
                                      not_started_grace);
      if (end == PhaseEnd::kPeerFailed) {
        posted_->accepting = false;
        lock.unlock();
        NoticeMismatch();
        return end;
      }
      // kPeerTimeout here (no peer factor): complete but for the regions given up.
      if (end == PhaseEnd::kComplete || end == PhaseEnd::kPeerTimeout ||
          Clock::now() >= deadline || (end == PhaseEnd::kDeadline && Clock::now() < until)) {
        posted_->accepting = false;
        return end == PhaseEnd::kComplete ? end : PhaseEnd::kDeadline;
      }
    }
  }

  void RequestMissing() {
    std::vector<std::pair<int, std::vector<ByteRange>>> requests;
    {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      const auto now = Clock::now();
      for (const Region& r : posted_->regions) {
        // The data is gone, or not waited for.
        if (r.released || r.given_up || !r.failure.ok()) continue;
        std::vector<ByteRange> missing;
        size_t next = 0;
        for (const auto& [begin, end] : r.arrived) {
          if (begin > next) missing.push_back({next, begin});
          next = std::max(next, end);
        }
        // A sender that is late but streaming (a peer descheduled on a loaded host) sends
        // its tail anyway: asking for it too doubled the traffic of every repaired phase.
        // Once it has been quiet for the window, the tail is requested as well.
        const bool streaming = !r.last_seen && r.last_payload != Clock::time_point{} &&
                               now - r.last_payload < owner_->options_.streaming_window;
        if (next < r.spec.nbytes && !streaming) missing.push_back({next, r.spec.nbytes});
        if (!missing.empty()) requests.emplace_back(r.spec.peer, std::move(missing));
      }
    }
    if (repair_) {
      for (const auto& [peer, missing] : requests) repair_(peer, op_, missing);
    }
  }

  std::vector<ByteRange> Arrived(size_t index) const override {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    std::vector<ByteRange> out;
    if (index >= posted_->regions.size()) return out;
    for (const auto& [begin, end] : posted_->regions[index].arrived) out.push_back({begin, end});
    return out;
  }

  absl::Status PeerStatus(size_t index) const override {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    if (index >= posted_->regions.size()) return absl::OkStatus();
    return posted_->regions[index].failure;
  }

  bool Released(size_t index) const override {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    return index < posted_->regions.size() && posted_->regions[index].released;
  }

  bool Estimated(size_t index) const override {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    return index < posted_->regions.size() && posted_->regions[index].estimated;
  }

  void GiveUp(int peer) override {
    {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      for (Region& r : posted_->regions) {
        if (r.spec.peer == peer) r.given_up = true;
      }
    }
    owner_->cv_.notify_all();  // a waiter may be settled now
  }

  std::optional<Clock::time_point> FirstArrival(size_t index) const override {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    if (index >= posted_->regions.size()) return std::nullopt;
    const Clock::time_point t = posted_->regions[index].first_arrival;
    if (t == Clock::time_point{}) return std::nullopt;
    return t;
  }

 private:
  BoundedReceiver* owner_;
  const uint64_t op_;
  std::unique_ptr<Posted> posted_;
  RepairRequest repair_;
  SizeNotice notice_;
  bool noticed_ = false;  // under the owner's lock
};

BoundedReceiver::BoundedReceiver() : BoundedReceiver(Options()) {}
BoundedReceiver::BoundedReceiver(const Options& options)
    : options_(options), staging_limit_(options.staging_bytes) {}
BoundedReceiver::~BoundedReceiver() = default;

std::unique_ptr<BoundedReceive> BoundedReceiver::Post(uint64_t op,
                                                      std::vector<BoundedRegion> regions,
                                                      RepairRequest repair, uint64_t op_bytes,
                                                      SizeNotice notice) {
  auto posted = std::make_unique<Posted>();
  posted->op_bytes = op_bytes;
  std::lock_guard<std::mutex> lock(mu_);
  for (const BoundedRegion& spec : regions) {
    posted->regions.push_back(Region{});
    posted->regions.back().spec = spec;
    auto failed = failed_peers_.find(spec.peer);
    if (failed != failed_peers_.end()) posted->regions.back().failure = failed->second;
  }
  posted->posted_at = Clock::now();
  posted->last_arrival = posted->posted_at;
  size_t post_bytes = 0;
  for (const BoundedRegion& spec : regions) post_bytes += spec.nbytes;
  if (post_bytes > 0 && options_.staged_posts > 0) {
    const size_t want = post_bytes > options_.max_staging_bytes / options_.staged_posts
                            ? options_.max_staging_bytes
                            : post_bytes * options_.staged_posts;
    staging_limit_ = std::max(staging_limit_, std::min(want, options_.max_staging_bytes));
  }
  // An op id closed long ago may be reused only after it left the history; reopening it
  // means a new operation with the same id, so forget that it was closed.
  if (closed_.erase(op) > 0) {
    closed_order_.erase(std::find(closed_order_.begin(), closed_order_.end(), op));
  }
  posted_[op] = posted.get();
  auto it = staged_.find(op);
  if (it != staged_.end()) {
    for (Staged& s : it->second) {
      staged_bytes_ -= s.bytes.size() + kStagedPacketCost;
      staged_count_--;
      ApplyLocked(*posted, s.src, s.offset, s.bytes.data(), s.bytes.size(), s.last, s.estimated,
                  s.total, s.op_bytes);
      RecycleLocked(std::move(s.bytes));
    }
    staged_.erase(it);
    staged_order_.erase(std::find_if(staged_order_.begin(), staged_order_.end(),
                                     [op](const auto& e) { return e.first == op; }));
  }
  return std::make_unique<Receive>(this, op, std::move(posted), std::move(repair),
                                   std::move(notice));
}

bool BoundedReceiver::SizesAgreeLocked(Posted& posted, const Region* region, int src,
                                       uint64_t total, uint64_t op_bytes) {
  std::string why;
  if (op_bytes != 0 && posted.op_bytes != 0 && op_bytes != posted.op_bytes) {
    why = absl::StrCat("rank ", src, " allreduces ", op_bytes, " bytes, this rank ",
                       posted.op_bytes, " bytes");
  } else if (region != nullptr && total != 0 && total != region->spec.nbytes) {
    why = absl::StrCat("rank ", src, " sent a shard of ", total, " bytes where this rank",
                       posted.op_bytes != 0 ? absl::StrCat(" (", posted.op_bytes, " bytes)")
                                            : std::string(),
                       " expects ", region->spec.nbytes, " bytes");
  } else {
    return true;
  }
  counters_.size_mismatch_packets++;
  if (posted.mismatch.ok()) {
    posted.mismatch = absl::InvalidArgumentError(
        absl::StrCat("the ranks allreduce different sizes: ", why));
    cv_.notify_all();
  }
  return false;
}

void BoundedReceiver::ApplyLocked(Posted& posted, int src, uint64_t offset, const void* data,
                                  size_t len, bool last, bool estimated, uint64_t total,
                                  uint64_t op_bytes) {
  Region* region = nullptr;
  for (Region& r : posted.regions) {
    if (r.spec.peer == src) region = &r;
  }
  // Checked before anything else: a notice comes from a peer this receive may have no
  // region for.
  if (!SizesAgreeLocked(posted, region, src, total, op_bytes)) return;
  if (len == 0 && total == 0 && op_bytes != 0) return;  // a notice whose size agrees
  if (region == nullptr) {
    counters_.unknown_peer_packets++;
    return;
  }
  if (offset > region->spec.nbytes || len > region->spec.nbytes - offset) {
    counters_.out_of_bounds_packets++;
    return;
  }
  // Waiters only care when a region completes or its last packets show up (the quiet
  // period they time themselves): waking them for every packet would cost a context
  // switch per datagram.
  bool wake = last && !region->last_seen;
  if (last) region->last_seen = true;
  if (estimated) region->estimated = true;
  region->not_started = false;  // it has started after all
  const auto now = Clock::now();
  posted.last_arrival = now;
  if (region->first_arrival == Clock::time_point{}) region->first_arrival = now;
  if (last && region->done_at == Clock::time_point{}) region->done_at = now;
  if (len == 0) {
    if (wake) cv_.notify_all();
    return;
  }
  region->last_payload = now;
  if (region->bytes == region->spec.nbytes) {
    // A duplicate of a complete region (a repair crossing the original): the caller may
    // be reading it.
    counters_.duplicate_bytes += len;
    return;
  }
  std::memcpy(static_cast<char*>(region->spec.dst) + offset, data, len);
  counters_.applied_packets++;
  // Merge [offset, offset + len) into the arrived set, counting only new bytes.
  size_t begin = offset, end = offset + len;
  auto it = region->arrived.upper_bound(begin);
  if (it != region->arrived.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= begin) {
      it = prev;
    }
  }
  size_t overlap = 0;
  while (it != region->arrived.end() && it->first <= end) {
    overlap += std::min(end, it->second) - std::max(begin, it->first);
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = region->arrived.erase(it);
  }
  region->arrived.emplace(begin, end);
  region->bytes += len - overlap;
  counters_.duplicate_bytes += overlap;
  if (region->bytes == region->spec.nbytes) {
    wake = true;
    if (region->done_at == Clock::time_point{}) region->done_at = now;
  }
  if (wake) cv_.notify_all();
}

bool BoundedReceiver::HeldOpenLocked(const Posted& posted, int src) {
  for (const Region& r : posted.regions) {
    if (r.spec.peer == src) return r.held_open && !r.given_up;
  }
  return false;
}

void BoundedReceiver::OnData(uint64_t op, int src, uint64_t offset, const void* data,
                             size_t len, bool last, bool estimated, uint64_t total,
                             uint64_t op_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_peers_.contains(src)) {
    counters_.failed_peer_packets++;
    return;
  }
  auto it = posted_.find(op);
  if (it != posted_.end()) {
    if (!it->second->accepting && !HeldOpenLocked(*it->second, src)) {
      counters_.stale_packets++;
      return;
    }
    ApplyLocked(*it->second, src, offset, data, len, last, estimated, total, op_bytes);
    return;
  }
  if (closed_.contains(op)) {
    counters_.stale_packets++;
    return;
  }
  // Not posted yet: stage, within the limits on bytes (each packet charged its payload
  // plus its bookkeeping, so empty packets count too), packets and operations. When full,
  // only operations staged longer ago than the maximum age make room (garbage); the others
  // are what this rank posts next, oldest first, so it is the newcomer that is dropped.
  const size_t cost = len + kStagedPacketCost;
  auto full = [&] {
    return staged_bytes_ + cost > staging_limit_ ||
           staged_count_ >= options_.max_staged_packets ||
           (staged_.size() >= options_.max_staged_ops && !staged_.contains(op));
  };
  const auto now = Clock::now();
  while (full() && !staged_order_.empty() &&
         now - staged_order_.front().second > options_.staged_max_age) {
    const uint64_t victim = staged_order_.front().first;
    staged_order_.pop_front();
    EvictStagedLocked(victim);
  }
  if (full()) {
    counters_.staging_overflow_packets++;
    counters_.staging_overflow_bytes += len;
    return;
  }
  auto& list = staged_[op];
  if (list.empty()) staged_order_.emplace_back(op, now);
  list.push_back(
      Staged{src, offset, last, estimated, total, op_bytes, TakeBufferLocked(data, len)});
  staged_bytes_ += cost;
  staged_count_++;
  counters_.staged_packets++;
}

void BoundedReceiver::EvictStagedLocked(uint64_t op) {
  auto it = staged_.find(op);
  if (it == staged_.end()) return;
  for (Staged& s : it->second) {
    staged_bytes_ -= s.bytes.size() + kStagedPacketCost;
    staged_count_--;
    counters_.staging_overflow_packets++;
    counters_.staging_overflow_bytes += s.bytes.size();
    RecycleLocked(std::move(s.bytes));
  }
  staged_.erase(it);
}

std::vector<char> BoundedReceiver::TakeBufferLocked(const void* data, size_t len) {
  std::vector<char> bytes;
  if (!spare_buffers_.empty()) {
    bytes = std::move(spare_buffers_.back());
    spare_buffers_.pop_back();
    spare_bytes_ -= bytes.capacity();
  }
  const char* p = static_cast<const char*>(data);
  bytes.assign(p, p + len);
  return bytes;
}

void BoundedReceiver::RecycleLocked(std::vector<char>&& bytes) {
  // Freed when empty (nothing to reuse) or beyond the limits.
  if (bytes.capacity() == 0 || spare_bytes_ + bytes.capacity() > staging_limit_ ||
      spare_buffers_.size() >= options_.max_staged_packets) {
    return;
  }
  spare_bytes_ += bytes.capacity();
  spare_buffers_.push_back(std::move(bytes));
}

void BoundedReceiver::CloseLocked(uint64_t op) {
  posted_.erase(op);
  if (closed_.insert(op).second) {
    closed_order_.push_back(op);
    while (closed_order_.size() > options_.closed_history) {
      closed_.erase(closed_order_.front());
      closed_order_.pop_front();
    }
  }
}

void BoundedReceiver::OnAbsent(uint64_t op, int src, bool not_started) {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.absent_answers++;
  auto it = posted_.find(op);
  if (it == posted_.end()) return;
  for (Region& r : it->second->regions) {
    if (r.spec.peer != src) continue;
    if (!not_started) {
      r.released = true;
    } else if (!r.not_started) {
      r.not_started = true;
      r.absent_at = Clock::now();
    }
  }
  cv_.notify_all();
}

void BoundedReceiver::FailPeer(int peer, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Status failure = status.ok() ? absl::UnavailableError("peer failed") : status;
    failed_peers_[peer] = failure;
    for (auto& [op, posted] : posted_) {
      for (Region& r : posted->regions) {
        if (r.spec.peer == peer) r.failure = failure;
      }
    }
  }
  cv_.notify_all();
}

BoundedReceiverCounters BoundedReceiver::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

bool BoundedReceiver::Awaits(int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_peers_.contains(peer)) return false;
  for (const auto& [op, posted] : posted_) {
    if (!posted->accepting) continue;
    for (const Region& r : posted->regions) {
      if (r.spec.peer == peer && r.bytes < r.spec.nbytes && !r.given_up && !r.released &&
          r.failure.ok()) {
        return true;
      }
    }
  }
  return false;
}

bool BoundedReceiver::HasStaged(uint64_t op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return staged_.contains(op);
}

size_t BoundedReceiver::staged_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return staged_bytes_;
}

size_t BoundedReceiver::staged_packets() const {
  std::lock_guard<std::mutex> lock(mu_);
  return staged_count_;
}

}  // namespace transport
}  // namespace optireduce
