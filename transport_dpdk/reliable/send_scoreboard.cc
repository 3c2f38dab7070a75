#include "transport_dpdk/reliable/send_scoreboard.h"

#include <algorithm>
#include <cstring>

namespace optireduce {
namespace transport {

void SendScoreboard::OnSend(uint64_t seq, uint32_t bytes, Time now) {
  if (seq != next_) return;  // contract: sequence numbers are sent in order
  Segment s;
  s.sent = s.first_sent = now;
  s.bytes = bytes;
  s.transmissions = 1;
  segs_.push_back(s);
  ++next_;
  Link(seq);
  pipe_ += bytes;
  ++in_flight_;
}

void SendScoreboard::OnRetransmit(uint64_t seq, Time now) {
  if (!Tracks(seq)) return;
  Segment& s = At(seq);
  if (s.state == State::kSacked) return;
  if (s.state == State::kInFlight) {
    Unlink(seq);
  } else {
    --lost_;
    pipe_ += s.bytes;
    ++in_flight_;
  }
  s.state = State::kInFlight;
  s.sent = now;
  ++s.transmissions;
  Link(seq);
}

void SendScoreboard::Link(uint64_t seq) {
  Segment& s = At(seq);
  s.prev = tail_;
  s.next = kNone;
  if (tail_ != kNone) {
    At(tail_).next = seq;
  } else {
    head_ = seq;
  }
  tail_ = seq;
}

void SendScoreboard::Unlink(uint64_t seq) {
  Segment& s = At(seq);
  if (s.prev != kNone) {
    At(s.prev).next = s.next;
  } else {
    head_ = s.next;
  }
  if (s.next != kNone) {
    At(s.next).prev = s.prev;
  } else {
    tail_ = s.prev;
  }
  s.prev = s.next = kNone;
}

void SendScoreboard::Deliver(
    uint64_t seq, absl::FunctionRef<void(uint64_t, const Segment&)> delivered) {
  Segment& s = At(seq);
  if (s.state == State::kSacked) return;
  if (s.state == State::kInFlight) {
    Unlink(seq);
    pipe_ -= s.bytes;
    --in_flight_;
  } else {
    --lost_;
  }
  s.state = State::kSacked;
  highest_ = std::max(highest_, seq + 1);
  delivered(seq, s);
}

void SendScoreboard::SackRange(
    uint64_t b, uint64_t e,
    absl::FunctionRef<void(uint64_t, const Segment&)> delivered) {
  b = std::max(b, base_);
  e = std::min(e, next_);
  if (b >= e) return;
  uint64_t start = b, end = e, x = b;
  auto it = sacked_.upper_bound(b);
  if (it != sacked_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= b) it = prev;
  }
  while (it != sacked_.end() && it->first <= e) {
    for (uint64_t seq = x; seq < std::min(it->first, e); ++seq) Deliver(seq, delivered);
    x = std::max(x, it->second);
    start = std::min(start, it->first);
    end = std::max(end, it->second);
    it = sacked_.erase(it);
  }
  for (uint64_t seq = x; seq < e; ++seq) Deliver(seq, delivered);
  sacked_.emplace(start, end);
}

bool SendScoreboard::OnAck(
    uint64_t cum, const uint8_t* sack, size_t sack_bytes,
    absl::FunctionRef<void(uint64_t, const Segment&)> delivered) {
  if (cum > next_) return false;
  // Cumulative part: every packet below cum not already reported.
  while (base_ < cum) {
    Deliver(base_, delivered);
    segs_.pop_front();
    ++base_;
  }
  while (!sacked_.empty() && sacked_.begin()->first < base_) {
    const uint64_t end = sacked_.begin()->second;
    sacked_.erase(sacked_.begin());
    if (end > base_) sacked_.emplace(base_, end);
    break;  // intervals are disjoint: only the first can straddle base_
  }
  while (!sacked_.empty() && sacked_.begin()->second <= base_) {
    sacked_.erase(sacked_.begin());
  }
  // Selective part, one run of set bits at a time.
  for (size_t off = 0; off < sack_bytes; off += 8) {
    uint64_t w = 0;
    const size_t n = std::min<size_t>(8, sack_bytes - off);
    for (size_t k = 0; k < n; ++k) {
      w |= static_cast<uint64_t>(sack[off + k]) << (8 * k);
    }
    const uint64_t first = cum + 1 + 8 * off;  // seq of bit 0 of this word
    if (first >= next_) break;
    while (w) {
      const int lo = __builtin_ctzll(w);
      const uint64_t rest = ~(w >> lo);
      const int run = rest == 0 ? 64 - lo : std::min(64 - lo, __builtin_ctzll(rest));
      SackRange(first + lo, first + lo + run, delivered);
      if (lo + run >= 64) break;
      w &= ~((run == 64 ? ~0ull : ((1ull << run) - 1)) << lo);
    }
  }
  return true;
}

void SendScoreboard::MarkLost(uint64_t seq) {
  if (!Tracks(seq)) return;
  Segment& s = At(seq);
  if (s.state != State::kInFlight) return;
  Unlink(seq);
  pipe_ -= s.bytes;
  --in_flight_;
  s.state = State::kLost;
  ++lost_;
  if (!s.lost_queued) {
    s.lost_queued = true;
    lost_fifo_.push_back(seq);
  }
}

void SendScoreboard::MarkAllLost() {
  while (head_ != kNone) MarkLost(head_);
}

void SendScoreboard::RestoreLost() {
  // Prepend in FIFO order (oldest marked first), before the current head.
  uint64_t first = kNone, last = kNone;
  for (uint64_t seq : lost_fifo_) {
    if (!Tracks(seq)) continue;
    Segment& s = At(seq);
    s.lost_queued = false;
    if (s.state != State::kLost) continue;
    s.state = State::kInFlight;
    --lost_;
    pipe_ += s.bytes;
    ++in_flight_;
    s.prev = last;
    s.next = kNone;
    if (last != kNone) {
      At(last).next = seq;
    } else {
      first = seq;
    }
    last = seq;
  }
  lost_fifo_.clear();
  if (first == kNone) return;
  At(last).next = head_;
  if (head_ != kNone) {
    At(head_).prev = last;
  } else {
    tail_ = last;
  }
  head_ = first;
}

uint64_t SendScoreboard::PeekLost() {
  while (!lost_fifo_.empty()) {
    const uint64_t seq = lost_fifo_.front();
    if (Tracks(seq)) {
      Segment& s = At(seq);
      if (s.state == State::kLost) return seq;
      s.lost_queued = false;
    }
    lost_fifo_.pop_front();
  }
  return kNone;
}

uint64_t SendScoreboard::PopLost() {
  const uint64_t seq = PeekLost();
  if (seq == kNone) return kNone;
  lost_fifo_.pop_front();
  At(seq).lost_queued = false;
  return seq;
}

}  // namespace transport
}  // namespace optireduce
