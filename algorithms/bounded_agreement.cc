#include "algorithms/bounded_agreement.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "algorithms/internal/splitmix64.h"

namespace optireduce {
namespace {

constexpr uint64_t kMagic = 0x4f52444543ULL;  // "ORDEC"
constexpr uint64_t kVersion = 1;

uint64_t Header(int ranks) {
  return (kMagic << 24) | (kVersion << 16) | static_cast<uint64_t>(ranks & 0xffff);
}

template <typename T>
void AddValues(void* dst, const void* src, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; i++) d[i] += s[i];
}

void Add(DataType type, void* dst, const void* src, size_t n) {
  if (type == DataType::kFloat64) {
    AddValues<double>(dst, src, n);
  } else {
    AddValues<float>(dst, src, n);
  }
}

// Calls fn(begin, end, inside) for the pieces of [begin, end) inside and outside the
// sorted, disjoint `ranges`, in order.
template <typename Fn>
void SplitByRanges(const std::vector<std::pair<size_t, size_t>>& ranges, size_t begin,
                   size_t end, Fn fn) {
  size_t at = begin;
  for (const auto& [b, e] : ranges) {
    if (e <= at) continue;
    if (b >= end) break;
    if (b > at) fn(at, b, false);
    const size_t stop = std::min(e, end);
    fn(std::max(at, b), stop, true);
    at = stop;
    if (at >= end) return;
  }
  if (at < end) fn(at, end, false);
}

// The union of two sorted, disjoint range lists, sorted and disjoint (touching ranges
// merged).
std::vector<std::pair<size_t, size_t>> Union(const std::vector<std::pair<size_t, size_t>>& x,
                                             const std::vector<std::pair<size_t, size_t>>& y) {
  std::vector<std::pair<size_t, size_t>> all(x);
  all.insert(all.end(), y.begin(), y.end());
  std::sort(all.begin(), all.end());
  std::vector<std::pair<size_t, size_t>> out;
  for (const auto& r : all) {
    if (!out.empty() && r.first <= out.back().second) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

int LeaderOf(uint64_t op_key, int ranks) {
  return static_cast<int>(internal::SplitMix64(op_key ^ 0x6c656164ULL) %
                          static_cast<uint64_t>(ranks));
}

std::vector<uint64_t> Decision::Encode() const {
  const int ranks = static_cast<int>(counted.size());
  std::vector<uint64_t> words(WireWords(ranks), 0);
  words[0] = Header(ranks);
  words[1] = op;
  for (int r = 0; r < ranks; r++) {
    if (counted[r]) words[2 + r / 64] |= uint64_t{1} << (r % 64);
  }
  return words;
}

absl::StatusOr<Decision> Decision::Decode(const std::vector<uint64_t>& words, int ranks,
                                          uint64_t op) {
  if (words.size() != WireWords(ranks) || words[0] != Header(ranks)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the leader's decision has header 0x", absl::Hex(words.empty() ? 0 : words[0]),
                     ", expected 0x", absl::Hex(Header(ranks)), " (", ranks, " ranks)"));
  }
  if (words[1] != op) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the leader's decision is for operation ", words[1], ", expected ", op));
  }
  Decision d;
  d.op = op;
  d.counted.resize(ranks);
  for (int r = 0; r < ranks; r++) d.counted[r] = (words[2 + r / 64] >> (r % 64)) & 1;
  return d;
}

size_t BoundedContextState::AddCarry(const CarryKey& key, Carry&& values) {
  const size_t esz = ElementSize(key.type);
  const size_t bytes = key.elements * esz;
  if (values.values.size() < bytes) values.values.resize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = carry_.find(key);
  if (it != carry_.end()) {
    // Where the held carry has values the new ones add up; elsewhere they are copied.
    Carry& held = it->second.carry;
    for (const auto& [b, e] : values.ranges) {
      SplitByRanges(held.ranges, b, e, [&](size_t pb, size_t pe, bool inside) {
        char* dst = held.values.data() + pb * esz;
        const char* src = values.values.data() + pb * esz;
        if (inside) {
          Add(key.type, dst, src, pe - pb);
        } else {
          std::memcpy(dst, src, (pe - pb) * esz);
        }
      });
    }
    held.ranges = Union(held.ranges, values.ranges);
    oldest_first_.splice(oldest_first_.end(), oldest_first_, it->second.age);
    RecycleLocked(std::move(values.values));
    return 0;
  }
  size_t dropped = 0;
  while (!oldest_first_.empty() && carry_bytes_ + bytes > kCarryBudgetBytes) {
    auto old = carry_.find(oldest_first_.front());
    carry_bytes_ -= old->second.carry.values.size();
    carry_.erase(old);
    oldest_first_.pop_front();
    dropped++;
  }
  Entry e;
  values.values.resize(bytes);
  e.carry = std::move(values);
  e.age = oldest_first_.insert(oldest_first_.end(), key);
  carry_.emplace(key, std::move(e));
  carry_bytes_ += bytes;
  return dropped;
}

bool BoundedContextState::TakeCarry(const CarryKey& key, void* data) {
  Entry e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = carry_.find(key);
    if (it == carry_.end()) return false;
    e = std::move(it->second);
    oldest_first_.erase(e.age);
    carry_bytes_ -= e.carry.values.size();
    carry_.erase(it);
  }
  const size_t esz = ElementSize(key.type);
  for (const auto& [b, end] : e.carry.ranges) {
    Add(key.type, static_cast<char*>(data) + b * esz, e.carry.values.data() + b * esz, end - b);
  }
  std::lock_guard<std::mutex> lock(mu_);
  RecycleLocked(std::move(e.carry.values));
  return true;
}

void BoundedContextState::MarkDeferred(const CarryKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!deferred_marks_.emplace(key, marks_made_).second) return;
  marks_oldest_first_.emplace_back(key, marks_made_++);
  // The queue also holds marks taken since (at most as many as it holds live ones).
  while (deferred_marks_.size() > kMaxDeferredMarks ||
         marks_oldest_first_.size() > 2 * kMaxDeferredMarks) {
    const auto& [old, when] = marks_oldest_first_.front();
    auto it = deferred_marks_.find(old);
    if (it != deferred_marks_.end() && it->second == when) deferred_marks_.erase(it);
    marks_oldest_first_.pop_front();
  }
}

bool BoundedContextState::TakeDeferredMark(const CarryKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return deferred_marks_.erase(key) > 0;
}

Carry BoundedContextState::SpareCarry(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Carry c;
  for (auto it = spare_carries_.begin(); it != spare_carries_.end(); ++it) {
    if (it->capacity() >= bytes) {
      c.values = std::move(*it);
      spare_carries_.erase(it);
      return c;
    }
  }
  return c;
}

void BoundedContextState::ReturnSpareCarry(Carry&& v) {
  std::lock_guard<std::mutex> lock(mu_);
  RecycleLocked(std::move(v.values));
}

void BoundedContextState::RecycleLocked(std::vector<char>&& v) {
  // The values stay: a carry written into it later covers only its own ranges.
  if (v.capacity() == 0) return;
  if (spare_carries_.size() < kSpareCarries) {
    spare_carries_.push_back(std::move(v));
    return;
  }
  // Keep the largest ones: they serve any smaller carry.
  auto smallest = std::min_element(spare_carries_.begin(), spare_carries_.end(),
                                   [](const auto& x, const auto& y) { return x.capacity() < y.capacity(); });
  if (smallest->capacity() < v.capacity()) *smallest = std::move(v);
}

size_t BoundedContextState::carry_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return carry_bytes_;
}

size_t BoundedContextState::MaxLeftOutInARow(size_t op_bytes, int ranks) {
  const size_t n = static_cast<size_t>(std::max(ranks, 1));
  const size_t shard_bytes = (op_bytes + n - 1) / n;
  return std::clamp<size_t>(kCatchUpBytes / std::max<size_t>(shard_bytes, 1), 1,
                            kMaxLeftOutInARow);
}

BoundedContextState::WaitRule BoundedContextState::MustWait(int ranks,
                                                           size_t max_in_a_row) const {
  std::lock_guard<std::mutex> lock(mu_);
  WaitRule rule;
  rule.must_wait.assign(ranks, false);
  rule.slow.assign(ranks, false);
  rule.catching_up.assign(ranks, false);
  std::vector<size_t> in_window(ranks, 0);
  for (const std::vector<bool>& left_out : recent_left_out_) {
    for (size_t r = 0; r < left_out.size() && r < in_window.size(); r++) in_window[r] += left_out[r];
  }
  for (int r = 0; r < ranks; r++) {
    const size_t row = static_cast<size_t>(r) < left_out_in_a_row_.size() ? left_out_in_a_row_[r] : 0;
    rule.slow[r] = in_window[r] > kMaxLeftOutInWindow;
    rule.must_wait[r] = rule.slow[r] || row >= std::max<size_t>(max_in_a_row, 1);
    rule.catching_up[r] = row > 0;
  }
  return rule;
}

void BoundedContextState::NoteDecision(const Decision& d, int leader) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<bool> left_out(d.counted.size(), false);
  if (left_out_in_a_row_.size() < d.counted.size()) left_out_in_a_row_.resize(d.counted.size(), 0);
  for (size_t r = 0; r < d.counted.size(); r++) {
    left_out[r] = !d.counted[r];
    if (left_out[r]) {
      left_out_in_a_row_[r]++;
    } else if (static_cast<int>(r) != leader) {
      left_out_in_a_row_[r] = 0;
    }
  }
  recent_left_out_.push_back(std::move(left_out));
  while (recent_left_out_.size() > kWindow) recent_left_out_.pop_front();
}

}  // namespace optireduce
