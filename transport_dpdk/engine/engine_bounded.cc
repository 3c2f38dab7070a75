// The bounded (unreliable) service: sends of whole sources and repairs, paced and
// limited to a few senders at once (PumpBoundedSends, PumpBounded), the handler of
// bounded packets and repair requests, and the Engine calls that drive them.
#include "transport_dpdk/engine/engine_impl.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {
using namespace engine_internal;  // NOLINT: the engine's own state (engine_state.h)

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
    if (p.bounded_queue.front().is_repair()) {  // not subject to the limit
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
    const SourceAccess access = !c.bounded.read_source ? SourceAccess::kGone :
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
            h.aux = j.op_bytes;
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
    if (access == SourceAccess::kBusy) break;  // the owner is detaching its sources: next iteration
    if (access != SourceAccess::kDone) {  // gone, not started or pending: nothing to send from
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
                        (h.flags & kFlagEstimated) != 0, h.total_length, h.aux);
      return;
    case PacketType::kRepair: {
      if (h.flags & kFlagAbsent) {
        Bump(stats.repair_absent_received);
        if (c.bounded.on_absent) {
          c.bounded.on_absent(p.rank, h.message_id,
                              AbsentReasonOf(h) == AbsentReason::kNotStarted);
        }
        return;
      }
      Bump(stats.repair_requests_received);
      // Data this rank cannot send (sources released, or the operation not started
      // here yet) is answered at once, so the requester stops waiting for it.
      uint64_t source_bytes = UINT64_MAX;
      const SourceAccess can = !c.bounded.read_source ? SourceAccess::kGone :
          c.bounded.read_source(h.message_id, p.rank,
                                [&](const char*, size_t n, bool) { source_bytes = n; });
      // Its other phase is running here: asked again later.
      if (can == SourceAccess::kPending) return;
      if (can == SourceAccess::kGone || can == SourceAccess::kNotStarted) {
        WireHeader r;
        FillHeader(c, p, &r);
        r.type = static_cast<uint8_t>(PacketType::kRepair);
        r.flags = kFlagUnreliable | kFlagAbsent;
        r.message_id = h.message_id;
        SetAbsentReason(can == SourceAccess::kNotStarted ? AbsentReason::kNotStarted
                                                         : AbsentReason::kReleased,
                        &r);
        Emit(p, r, nullptr, 0);
        Flush();
        Bump(stats.repair_absent_sent);
        return;
      }
      std::vector<RepairRange> asked;
      RepairRangeRejects rejects;
      ParseRepairRanges(payload, h.payload_length, kMaxRepairRanges, &asked, &rejects);
      Bump(stats.repair_ranges_empty, rejects.empty);
      Bump(stats.repair_ranges_over_limit, rejects.over_limit);
      if (asked.empty()) return;
      // Repairs go before the sends still queued (order 0), in arrival order; a request for
      // an operation whose repair is still queued is merged into it (the union of what is
      // left to send and what is asked), so repeated requests never grow the queue.
      // (A send interrupted half way keeps its position and resumes after them.)
      auto at = p.bounded_queue.begin();
      size_t repairs = 0;
      BoundedJob* queued = nullptr;
      for (; at != p.bounded_queue.end() && at->is_repair(); ++at, ++repairs) {
        if (at->op != h.message_id) continue;
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
      std::vector<RepairRange> ranges;
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
        Bump(stats.repair_requests_merged);
        if (ranges.empty()) {
          p.bounded_queue.erase(at);
          return;
        }
        queued->ranges = std::move(ranges);
        queued->range = 0;
        queued->next = queued->ranges.front().first;
        return;
      }
      if (ranges.empty()) return;
      if (repairs >= kMaxQueuedRepairs) {
        Bump(stats.repair_requests_dropped);
        return;
      }
      p.bounded_queue.insert(at, BoundedJob::Repair(h.message_id, std::move(ranges)));
      return;
    }
    default:
      Bump(stats.unsupported);
      return;
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

absl::Status Engine::SendBounded(uint32_t ctx, int dst, uint64_t op, uint64_t total,
                                 uint64_t op_bytes) {
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
  // The last 1% of the packets (at least four, so that one lost packet does not turn
  // the early timeout into a deadline) carry kFlagLast.
  const uint64_t packets = (total + p.bounded_payload - 1) / p.bounded_payload;
  const uint64_t flagged = std::max<uint64_t>(4, packets / 100);
  const uint64_t last_from = packets > flagged ? (packets - flagged) * p.bounded_payload : 0;
  p.bounded_queue.push_back(
      BoundedJob::Send(op, total, last_from, c->bounded_next_order++, op_bytes));
  // The progress thread sends bounded jobs (paced, in incast order): wake it.
  impl_->waits.Wake();
  return absl::OkStatus();
}

absl::Status Engine::SendBoundedNotice(uint32_t ctx, uint64_t op, uint64_t op_bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Ctx* c = impl_->FindCtx(ctx);
  if (!c) return absl::NotFoundError(absl::StrCat("no context ", ctx));
  if (c->failed) return absl::OkStatus();  // see SendBounded
  for (Peer& p : c->peers) {
    if (p.rank == c->rank || !p.connected) continue;
    WireHeader h;
    impl_->FillHeader(*c, p, &h);
    h.type = static_cast<uint8_t>(PacketType::kData);
    h.flags = kFlagUnreliable;
    h.message_id = op;
    h.aux = op_bytes;
    impl_->Emit(p, h, nullptr, 0);
    impl_->Flush();
    Bump(impl_->stats.bounded_tx_packets);
  }
  impl_->waits.Wake();
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
  const size_t per_packet = std::max<size_t>(1, p.max_payload / kRepairRangeBytes);
  for (size_t i = 0; i < missing.size(); i += per_packet) {
    const size_t n = std::min(per_packet, missing.size() - i);
    std::vector<uint8_t> body(kRepairRangeBytes * n);
    EncodeRepairRanges(missing.data() + i, n, body.data());
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
  impl_->waits.Wake();
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
    for (const BoundedJob& j : p.bounded_queue) n += j.op == op && !j.is_repair() ? 1 : 0;
  }
  return n;
}

}  // namespace transport
}  // namespace optireduce
