#include "transport_dpdk/fault_injector.h"

#include "transport_dpdk/stats.h"

#include <cstdlib>
#include <cstring>

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
    else if (key == "seed") st = integer(&f.seed);
    else {
      return absl::InvalidArgumentError(absl::StrCat(
          "fault spec has unknown key '", key,
          "' (known: drop, dup, reorder, delay_us, corrupt, seed)"));
    }
    if (!st.ok()) return st;
  }
  return f;
}

FaultInjector::FaultInjector(std::unique_ptr<PacketIo> inner,
                             const FaultSpec& spec)
    : inner_(std::move(inner)), spec_(spec), rng_(spec.seed) {}

std::string FaultInjector::Describe() const {
  return absl::StrCat(inner_->Describe(), " +faults(drop=", spec_.drop,
                      ",dup=", spec_.dup, ",reorder=", spec_.reorder,
                      ",delay_us=", spec_.delay_us, ",corrupt=", spec_.corrupt,
                      ",seed=", spec_.seed, ")");
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
  if (!held_.empty()) {
    const auto now = Clock::now();
    auto soonest = timeout;
    for (const Held& h : held_) {
      auto wait = h.after_next_burst
                      ? std::chrono::microseconds(0)
                      : std::chrono::ceil<std::chrono::microseconds>(
                            h.release - now);
      if (wait < soonest) soonest = wait;
    }
    if (soonest.count() <= 0) return;
    timeout = soonest;
  }
  inner_->WaitForInput(timeout);
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
