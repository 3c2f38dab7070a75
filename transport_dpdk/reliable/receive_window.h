// receive_window.h — which packet sequence numbers of one peer arrived:
// a cumulative point plus a bitmap of the next kSpan sequence numbers.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace optireduce {
namespace transport {

class ReceiveWindow {
 public:
  static constexpr uint64_t kSpan = 8192;  // == kMaxSackBytes * 8

  enum class Verdict { kNew, kDuplicate, kOutOfWindow };

  Verdict Classify(uint64_t seq) const {
    if (seq < cum_) return Verdict::kDuplicate;
    if (seq >= cum_ + kSpan) return Verdict::kOutOfWindow;
    return Test(seq) ? Verdict::kDuplicate : Verdict::kNew;
  }

  // Records seq (must be kNew).
  void Mark(uint64_t seq) {
    bits_[(seq % kSpan) / 64] |= 1ull << (seq % 64);
    if (seq + 1 > highest_) highest_ = seq + 1;
    while (Test(cum_)) {
      bits_[(cum_ % kSpan) / 64] &= ~(1ull << (cum_ % 64));
      ++cum_;
    }
  }

  // All seq < cum() arrived.
  uint64_t cum() const { return cum_; }
  // One past the highest seq marked.
  uint64_t highest() const { return highest_; }

  // Writes the selective-ack bitmap (bit i <-> seq cum()+1+i) into out and
  // returns its length in bytes (at most max_bytes).
  size_t Sack(uint8_t* out, size_t max_bytes) const {
    if (highest_ <= cum_ + 1) return 0;
    uint64_t bits = highest_ - (cum_ + 1);
    size_t bytes = static_cast<size_t>((bits + 7) / 8);
    if (bytes > max_bytes) bytes = max_bytes;
    std::memset(out, 0, bytes);
    for (uint64_t i = 0; i < bytes * 8; ++i) {
      const uint64_t seq = cum_ + 1 + i;
      if (seq >= highest_) break;
      if (Test(seq)) out[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    }
    return bytes;
  }

 private:
  bool Test(uint64_t seq) const {
    return (bits_[(seq % kSpan) / 64] >> (seq % 64)) & 1;
  }
  uint64_t cum_ = 0;
  uint64_t highest_ = 0;  // one past the highest seq marked
  std::vector<uint64_t> bits_ = std::vector<uint64_t>(kSpan / 64, 0);
};

}  // namespace transport
}  // namespace optireduce
