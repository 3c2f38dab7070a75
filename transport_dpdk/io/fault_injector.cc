#include "transport_dpdk/io/fault_injector.h"

#include <algorithm>

#include "common/counter_list.h"
#include "transport_dpdk/wire/wire_format.h"

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace optireduce {
namespace transport {

absl::StatusOr<FaultSpec> ParseFaultSpec(const std::string& spec) {
  FaultSpec f;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    std::pair<std::string, std::string> kv = absl::StrSplit(item, '=');
    const std::string& key = kv.first;
    const std::string& value = kv.second;
    if (value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fault spec item '", item, "' has no value (want key=value)"));
    }
    auto prob = [&](double* out) -> absl::Status {
      double v;
      if (!absl::SimpleAtod(value, &v) || !(v >= 0.0 && v <= 1.0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "fault spec ", key, "=", value,
            ": want a probability in [0, 1]"));
      }
      *out = v;
      return absl::OkStatus();
    };
    auto integer = [&](uint64_t* out) -> absl::Status {
      if (!absl::SimpleAtoi(value, out)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "fault spec ", key, "=", value, ": want a non-negative integer"));
      }
      return absl::OkStatus();
    };
    absl::Status st;
    if (key == "drop") st = prob(&f.drop);
    else if (key == "dup") st = prob(&f.dup);
    else if (key == "reorder") st = prob(&f.reorder);
    else if (key == "corrupt") st = prob(&f.corrupt);
    else if (key == "delay_us") st = integer(&f.delay_us);
    else if (key == "burst_loss") st = prob(&f.burst_loss);
    else if (key == "burst_len") {
      if (!absl::SimpleAtod(value, &f.burst_len) || !(f.burst_len >= 1.0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "fault spec burst_len=", value, ": want a mean burst length >= 1"));
      }
    }
    else if (key == "ack_drop") st = prob(&f.ack_drop);
    else if (key == "tail") st = integer(&f.tail);
    else if (key == "tx_partial") st = prob(&f.tx_partial);
    else if (key == "seed") st = integer(&f.seed);
    else {
      return absl::InvalidArgumentError(absl::StrCat(
          "fault spec has unknown key '", key,
          "' (known: drop, dup, reorder, delay_us, corrupt, burst_loss, burst_len, "
          "ack_drop, tail, tx_partial, seed)"));
    }
    if (!st.ok()) return st;
  }
  if (f.burst_loss >= 1.0) {
    return absl::InvalidArgumentError(
        "fault spec burst_loss=1: want an average loss below 1");
  }
  return f;
}

FaultInjector::FaultInjector(std::unique_ptr<PacketIo> inner,
                             const FaultSpec& spec)
    : inner_(std::move(inner)), spec_(spec), rng_(spec.seed), tx_rng_(spec.seed ^ 0x9e3779b97f4a7c15ull) {}

std::string FaultInjector::Describe() const {
  return absl::StrCat(inner_->Describe(), " +faults(drop=", spec_.drop,
                      ",dup=", spec_.dup, ",reorder=", spec_.reorder,
                      ",delay_us=", spec_.delay_us, ",corrupt=", spec_.corrupt,
                      ",burst_loss=", spec_.burst_loss, ",burst_len=", spec_.burst_len,
                      ",ack_drop=", spec_.ack_drop, ",tail=", spec_.tail,
                      ",tx_partial=", spec_.tx_partial, ",seed=", spec_.seed, ")");
}

bool FaultInjector::BurstLoss() {
  if (spec_.burst_loss <= 0) return false;
  // Stationary P(bad) = g / (g + b) = burst_loss with b = 1 / burst_len.
  const double b = 1.0 / spec_.burst_len;
  const double g = spec_.burst_loss * b / (1.0 - spec_.burst_loss);
  if (bad_) {
    if (Chance(b)) bad_ = false;
  } else if (Chance(g)) {
    bad_ = true;
    Bump(counters_.bursts);
  }
  return bad_;
}

bool FaultInjector::IsAck(const RxDatagram& d) const {
  HeaderKind kind;
  if (!PeekHeaderKind(d.data, d.len, &kind)) return false;
  return kind.type == static_cast<uint8_t>(PacketType::kAck) &&
         !(kind.flags & kFlagUnreliable);
}

bool FaultInjector::TailDrop(const RxDatagram& d) {
  if (spec_.tail == 0 || d.len < kHeaderBytes) return false;
  WireHeader h;
  if (ParseDatagram(d.data, d.len, &h, /*link_protects_payload=*/true) != ParseError::kOk) {
    return false;
  }
  if (h.type != static_cast<uint8_t>(PacketType::kData) || (h.flags & kFlagUnreliable) ||
      h.payload_length == 0) {
    return false;
  }
  // Packets from the end of the message: every packet but the last is full.
  const uint64_t after = h.total_length - h.offset - h.payload_length;
  const uint64_t from_end = 1 + (after + h.payload_length - 1) / h.payload_length;
  if (from_end > spec_.tail) return false;
  const std::array<uint64_t, 4> key = {
      h.session_token, (uint64_t{h.src_rank} << 32) | h.dst_context, h.message_id,
      h.offset};
  if (!tail_seen_.insert(key).second) return false;  // dropped once already
  tail_order_.push_back(key);
  if (tail_order_.size() > (1u << 20)) {
    tail_seen_.erase(tail_order_.front());
    tail_order_.pop_front();
  }
  return true;
}

void FaultInjector::CountDropped(const RxDatagram& d) {
  if (d.len < kHeaderBytes) return;
  WireHeader h;
  if (ParseDatagram(d.data, d.len, &h, /*link_protects_payload=*/true) != ParseError::kOk) {
    return;
  }
  if (h.type == static_cast<uint8_t>(PacketType::kData)) {
    Bump((h.flags & kFlagUnreliable) ? counters_.bounded_bytes_dropped
                                     : counters_.data_bytes_dropped,
         h.payload_length);
  }
}

size_t FaultInjector::TxBurst(const TxDatagram* d, size_t n) {
  Bump(counters_.tx_offered, n);
  size_t offer = n;
  if (n > 0 && spec_.tx_partial > 0 &&
      std::uniform_real_distribution<double>(0.0, 1.0)(tx_rng_) < spec_.tx_partial) {
    offer = std::uniform_int_distribution<size_t>(0, n - 1)(tx_rng_);
  }
  const size_t sent = offer ? inner_->TxBurst(d, offer) : 0;
  Bump(counters_.tx_refused, n - sent);
  return sent;
}

bool FaultInjector::Chance(double p) {
  if (p <= 0) return false;
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p;
}

void FaultInjector::Emit(RxDatagram* out, size_t* n,
                         std::vector<uint8_t> bytes) {
  emitted_.push_back(std::move(bytes));
  out[*n].data = emitted_.back().data();
  out[*n].len = static_cast<uint32_t>(emitted_.back().size());
  ++*n;
}

size_t FaultInjector::RxBurst(RxDatagram* out, size_t max) {
  const size_t n = ReceiveAndHold(out, max);
  // The waits read only this (they run without the engine's lock, beside an RxBurst).
  int64_t next = kNoRelease;
  for (const Held& h : held_) {
    next = std::min<int64_t>(next, h.after_next_burst ? 0 : h.release.time_since_epoch().count());
  }
  next_release_.store(next, std::memory_order_relaxed);
  return n;
}

std::chrono::microseconds FaultInjector::BoundByHeld(std::chrono::microseconds timeout) const {
  const int64_t next = next_release_.load(std::memory_order_relaxed);
  if (next == kNoRelease) return timeout;
  const auto wait = std::chrono::ceil<std::chrono::microseconds>(
      Clock::time_point(Clock::duration(next)) - Clock::now());
  return std::max(std::chrono::microseconds(0), std::min(timeout, wait));
}

size_t FaultInjector::ReceiveAndHold(RxDatagram* out, size_t max) {
  emitted_.clear();
  emitted_.reserve(max);  // pointers into emitted_ must stay valid
  size_t n = 0;
  const auto now = Clock::now();
  // Held datagrams due now go first (they were received earlier).
  for (auto it = held_.begin(); it != held_.end() && n < max;) {
    if (it->after_next_burst) {
      it->after_next_burst = false;
      ++it;
    } else if (it->release <= now) {
      Emit(out, &n, std::move(it->bytes));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  // Each received datagram may be emitted twice (duplicate): leave room.
  const size_t room = (max - n) / 2;
  if (room == 0) return n;
  scratch_.resize(room);
  const size_t got = inner_->RxBurst(scratch_.data(), room);
  for (size_t i = 0; i < got; ++i) {
    RxDatagram d = scratch_[i];
    Bump(counters_.seen);
    if (Chance(spec_.drop)) {
      Bump(counters_.dropped);
      CountDropped(d);
      continue;
    }
    if (BurstLoss()) {
      Bump(counters_.burst_dropped);
      CountDropped(d);
      continue;
    }
    if (spec_.ack_drop > 0 && IsAck(d) && Chance(spec_.ack_drop)) {
      Bump(counters_.acks_dropped);
      continue;
    }
    if (TailDrop(d)) {
      Bump(counters_.tail_dropped);
      CountDropped(d);
      continue;
    }
    if (d.len > 0 && Chance(spec_.corrupt)) {
      std::uniform_int_distribution<uint32_t> pos(0, d.len - 1);
      d.data[pos(rng_)] ^= static_cast<uint8_t>(1u << (rng_() % 8));
      Bump(counters_.corrupted);
    }
    const bool dup = Chance(spec_.dup);
    if (dup) Bump(counters_.duplicated);
    for (int copy = 0; copy < (dup ? 2 : 1); ++copy) {
      if (Chance(spec_.reorder)) {
        Bump(counters_.reordered);
        held_.push_back({std::vector<uint8_t>(d.data, d.data + d.len), now,
                         true});
      } else if (spec_.delay_us > 0) {
        Bump(counters_.delayed);
        std::uniform_int_distribution<uint64_t> us(0, spec_.delay_us);
        held_.push_back({std::vector<uint8_t>(d.data, d.data + d.len),
                         now + std::chrono::microseconds(us(rng_)), false});
      } else {
        out[n++] = d;
      }
    }
  }
  return n;
}

void FaultInjector::WaitForInput(std::chrono::microseconds timeout) {
  timeout = BoundByHeld(timeout);
  if (timeout.count() > 0) inner_->Waits().WaitForInput(timeout);
}

void FaultInjector::WaitForWake(std::chrono::microseconds timeout) {
  timeout = BoundByHeld(timeout);
  if (timeout.count() > 0) inner_->Waits().WaitForWake(timeout);
}

void FaultInjector::WaitAsWaiter(std::chrono::microseconds timeout) {
  timeout = BoundByHeld(timeout);
  if (timeout.count() > 0) inner_->Waits().WaitAsWaiter(timeout);
}

absl::StatusOr<std::unique_ptr<PacketIo>> MaybeInjectFaults(
    std::unique_ptr<PacketIo> io, const std::string& spec) {
  if (spec.empty()) return io;
  auto parsed = ParseFaultSpec(spec);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attr faults: ", parsed.status().message()));
  }
  if (!parsed->Any()) return io;
  return std::unique_ptr<PacketIo>(
      new FaultInjector(std::move(io), *parsed));
}

}  // namespace transport
}  // namespace optireduce
