#include "transport_dpdk/bounded/bounded_sender.h"

#include <algorithm>
#include <utility>

namespace optireduce {
namespace transport {

BoundedPacer::BoundedPacer(double rate, uint32_t payload, size_t overhead)
    : rate_(rate),
      burst_(std::max({256.0 * 1024, 4.0 * payload, rate * 1e-3})),
      overhead_(overhead) {}

void BoundedPacer::Refill(Clock::time_point now) {
  if (rate_ <= 0) return;
  const double dt = std::chrono::duration<double>(now - refill_).count();
  tokens_ = std::min(burst_, tokens_ + dt * rate_);
  refill_ = now;
}

BoundedPacer::Clock::time_point BoundedPacer::Due(Clock::time_point now) const {
  const auto wait = std::chrono::duration<double>(-tokens_ / rate_ + 1e-5);
  return now + std::chrono::duration_cast<Clock::duration>(wait);
}

BoundedJob BoundedJob::Send(uint64_t op, uint64_t total, uint64_t last_from, uint64_t order,
                            uint64_t op_bytes) {
  BoundedJob j;
  j.op = op;
  j.total = total;
  j.op_bytes = op_bytes;
  j.ranges.emplace_back(0, total);
  j.last_from = last_from;
  j.order = order;
  return j;
}

BoundedJob BoundedJob::Repair(uint64_t op, std::vector<Range> ranges) {
  BoundedJob j;
  j.op = op;
  j.ranges = std::move(ranges);
  return j;
}

BoundedSender::BoundedSender(int size, int senders)
    : size_(size),
      queues_(static_cast<size_t>(std::max(0, size))),
      senders_(std::clamp(senders, 1, std::max(1, size - 1))) {}

void BoundedSender::QueueSend(int peer, uint64_t op, uint64_t total, uint32_t payload,
                              uint64_t op_bytes) {
  // The last 1% of the packets (at least four, so that one lost packet does not turn
  // the early timeout into a deadline) carry the "last" flag.
  const uint64_t packets = (total + payload - 1) / payload;
  const uint64_t flagged = std::max<uint64_t>(4, packets / 100);
  const uint64_t last_from = packets > flagged ? (packets - flagged) * payload : 0;
  queues_[peer].push_back(BoundedJob::Send(op, total, last_from, next_order_++, op_bytes));
}

BoundedSender::RepairQueued BoundedSender::QueueRepair(int peer, uint64_t op,
                                                       std::vector<Range> asked,
                                                       uint64_t source_bytes) {
  std::deque<BoundedJob>& q = queues_[peer];
  // Repairs go before the sends still queued (order 0), in arrival order; a request for
  // an operation whose repair is still queued is merged into it (the union of what is
  // left to send and what is asked), so repeated requests never grow the queue.
  // (A send interrupted half way keeps its position and resumes after them.)
  auto at = q.begin();
  size_t repairs = 0;
  BoundedJob* queued = nullptr;
  for (; at != q.end() && at->is_repair(); ++at, ++repairs) {
    if (at->op != op) continue;
    queued = &*at;
    for (size_t r = queued->range; r < queued->ranges.size(); ++r) {
      const uint64_t b = r == queued->range ? std::max(queued->next, queued->ranges[r].first)
                                            : queued->ranges[r].first;
      if (b < queued->ranges[r].second) asked.emplace_back(b, queued->ranges[r].second);
    }
    break;
  }
  // The union, within the source: a job never sends a byte twice, whatever the request
  // holds (overlapping or repeated ranges, ranges past the source's end), so one request
  // costs at most one pass over the source.
  std::sort(asked.begin(), asked.end());
  std::vector<Range> ranges;
  for (const auto& [b, e_asked] : asked) {
    const uint64_t e = std::min(e_asked, source_bytes);
    if (b >= e) continue;
    if (!ranges.empty() && b <= ranges.back().second) {
      ranges.back().second = std::max(ranges.back().second, e);
    } else if (ranges.size() < kMaxRepairRanges) {
      ranges.emplace_back(b, e);
    }
  }
  if (queued != nullptr) {
    if (ranges.empty()) {
      q.erase(at);
      return RepairQueued::kMerged;
    }
    queued->ranges = std::move(ranges);
    queued->range = 0;
    queued->next = queued->ranges.front().first;
    return RepairQueued::kMerged;
  }
  if (ranges.empty()) return RepairQueued::kNothing;
  if (repairs >= kMaxQueuedRepairs) return RepairQueued::kDropped;
  q.insert(at, BoundedJob::Repair(op, std::move(ranges)));
  return RepairQueued::kQueued;
}

// Incast control. TAR submits its sends in the staggered peer order (in step i rank r
// sends to r - i, so every receiver has one sender per step); sending them all at once
// would turn each phase into an N-to-1 burst per receiver, which overflows receive rings.
// Only the `senders_` oldest sends are active at a time; repairs always go.
void BoundedSender::Pump(BoundedPort& port, BoundedPacer& pacer, Clock::time_point now,
                         Clock::duration spin, Clock::time_point* deadline) {
  constexpr int kMaxActive = 16;
  int active[kMaxActive];
  int n = 0;
  for (int peer = 0; peer < size_; ++peer) {
    std::deque<BoundedJob>& q = queues_[peer];
    if (q.empty() || !port.Connected(peer)) continue;
    if (q.front().is_repair()) {  // not subject to the limit
      PumpPeer(port, pacer, peer, now, spin, deadline);
      if (q.empty()) continue;
    }
    // Keep the `limit` oldest fronts (insertion into a short sorted array).
    const int limit = std::min(kMaxActive, std::max(1, senders_));
    const uint64_t order = q.front().order;
    int at = n;
    while (at > 0 && queues_[active[at - 1]].front().order > order) --at;
    if (at >= limit) continue;
    if (n < limit) ++n;
    for (int k = n - 1; k > at; --k) active[k] = active[k - 1];
    active[at] = peer;
  }
  for (int k = 0; k < n; ++k) PumpPeer(port, pacer, active[k], now, spin, deadline);
}

void BoundedSender::PumpPeer(BoundedPort& port, BoundedPacer& pacer, int peer,
                             Clock::time_point now, Clock::duration spin,
                             Clock::time_point* deadline) {
  std::deque<BoundedJob>& q = queues_[peer];
  pacer.Refill(now);
  int budget = kPeerBudget;
  while (budget > 0 && !port.Blocked() && !q.empty()) {
    if (!pacer.MaySend()) {
      const auto due = pacer.Due(now);
      if (due < *deadline) *deadline = due;
      return;
    }
    BoundedJob& j = q.front();
    // Skip finished ranges.
    while (j.range < j.ranges.size() && j.next >= j.ranges[j.range].second) {
      ++j.range;
      if (j.range < j.ranges.size()) j.next = j.ranges[j.range].first;
    }
    if (j.range >= j.ranges.size()) {
      q.pop_front();
      continue;
    }
    if (j.next < j.ranges[j.range].first) j.next = j.ranges[j.range].first;
    bool past_end = false;
    const SourceAccess access =
        port.ReadSource(j.op, peer, [&](const char* src, size_t n, bool est) {
          past_end = !SendFrom(port, pacer, peer, j, src, n, est, &budget);
        });
    if (access == SourceAccess::kBusy) break;  // the owner is detaching its sources: next iteration
    if (access != SourceAccess::kDone) {  // gone, not started or pending: nothing to send from
      q.pop_front();
      continue;
    }
    if (past_end) j.next = j.ranges[j.range].second;  // range past the source's end
  }
  port.Flush();
  if (!q.empty()) {
    // Refused by the device: again after a pause in which its queue drains, not in a spin.
    if (port.Blocked()) {
      const auto retry = now + kTxRetry;
      if (retry < *deadline) *deadline = retry;
    } else if (now + spin < *deadline) {
      *deadline = now;
    }
  }
}

// Packets go to the device straight from the source, before the source is let go: it is
// valid only inside ReadSource, and the device copies what it accepts (into the kernel,
// an mbuf or a queue) before returning, so no bounce copy is needed. One call sends at
// most one burst, so a caller detaching its sources waits for no more. A packet the
// device refuses (TX backpressure) is not lost: the job rewinds to the first refused
// packet, gives its tokens back and sends it again once the device takes packets, so no
// local refusal is ever seen by the receiver as network loss.
bool BoundedSender::SendFrom(BoundedPort& port, BoundedPacer& pacer, int peer, BoundedJob& j,
                             const char* src, size_t n, bool est, int* budget) {
  const uint64_t end = std::min<uint64_t>(j.ranges[j.range].second, n);
  if (j.next >= end) return false;
  port.Flush();  // from here the device's batch holds this job's packets only
  if (port.Blocked()) return true;
  const uint32_t payload = port.Payload(peer);
  BoundedPacket packets[kMaxBurst];
  size_t emitted = 0;
  while (*budget > 0 && j.next < end && emitted < kMaxBurst && pacer.MaySend()) {
    const uint64_t len = std::min<uint64_t>(payload, end - j.next);
    BoundedPacket& pk = packets[emitted];
    pk.op = j.op;
    pk.offset = j.next;
    pk.total = n;
    pk.op_bytes = j.op_bytes;
    pk.data = src + j.next;
    pk.len = static_cast<uint32_t>(len);
    pk.last = j.next >= j.last_from;
    pk.estimated = est;
    j.next += len;
    pacer.Spend(len);
    --*budget;
    ++emitted;
  }
  const size_t sent = emitted == 0 ? 0 : port.Transmit(peer, packets, emitted);
  if (sent < emitted) {
    for (size_t i = sent; i < emitted; ++i) pacer.GiveBack(packets[i].len);
    j.next = packets[sent].offset;
  }
  return true;
}

void BoundedSender::Clear() {
  for (auto& q : queues_) q.clear();
}

size_t BoundedSender::Pending() const {
  size_t n = 0;
  for (const auto& q : queues_) n += q.size();
  return n;
}

size_t BoundedSender::QueuedSends(uint64_t op) const {
  size_t n = 0;
  for (const auto& q : queues_) {
    for (const BoundedJob& j : q) n += j.op == op && !j.is_repair() ? 1 : 0;
  }
  return n;
}

void BoundedSender::SetSenders(int senders) {
  senders_ = std::clamp(senders, 1, std::max(1, size_ - 1));
}

}  // namespace transport
}  // namespace optireduce
