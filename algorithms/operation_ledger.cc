#include "algorithms/operation_ledger.h"

#include <algorithm>

namespace optireduce {
namespace {

struct Registry {
  struct Entry {
    std::weak_ptr<gloo::Context> context;
    std::shared_ptr<OperationLedger> ledger;
  };
  std::mutex mu;
  absl::flat_hash_map<const gloo::Context*, Entry> by_context;

  // Forgets the ledgers of destroyed contexts. Called on every new context, so the
  // registry holds at most the live contexts plus those destroyed since the last one.
  void SweepLocked() {
    for (auto it = by_context.begin(); it != by_context.end();) {
      auto next = std::next(it);
      if (it->second.context.expired()) by_context.erase(it);
      it = next;
    }
  }
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

}  // namespace

OperationLedger::OperationLedger() : tags_(kTagSlots) {}

std::shared_ptr<OperationLedger> OperationLedger::Of(
    const std::shared_ptr<gloo::Context>& context) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_context.find(context.get());
  if (it != r.by_context.end() && it->second.context.lock() == context) {
    return it->second.ledger;
  }
  // New, or another context at the address of a destroyed one.
  r.SweepLocked();
  auto ledger = std::make_shared<OperationLedger>();
  r.by_context[context.get()] = Registry::Entry{context, ledger};
  return ledger;
}

size_t OperationLedger::Live() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  size_t n = 0;
  for (const auto& [ptr, entry] : r.by_context) n += entry.context.expired() ? 0 : 1;
  return n;
}

uint64_t OperationLedger::Key(uint32_t tag, uint64_t sequence) {
  // Distinct for distinct (tag, sequence) while sequence < 2^32.
  return (static_cast<uint64_t>(tag) << 32) ^ sequence;
}

OperationLedger::Operation OperationLedger::Next(uint32_t tag, size_t bytes,
                                                 int calibration_ops) {
  std::lock_guard<std::mutex> lock(mu_);
  Operation op;
  TagSlot& slot = tags_[tag % kTagSlots];
  if (!slot.used || slot.tag != tag) slot = TagSlot{tag, true, 0};
  op.sequence = slot.next++;
  op.key = Key(tag, op.sequence);
  if (calibration_ops <= 0) return op;  // nothing to calibrate (or not OptiReduce mode)
  auto it = by_size_.find(bytes);
  if (it == by_size_.end()) {
    if (by_size_.size() >= kMaxSizes) {
      op.calibrate = true;  // not counted: exact always
      return op;
    }
    it = by_size_.emplace(bytes, SizeState{}).first;
  }
  SizeState& size = it->second;
  op.calibrate = size.started < calibration_ops;
  if (op.calibrate) {
    op.calibration_index = size.started++;
    size.unsettled++;
  }
  return op;
}

void OperationLedger::Settle(size_t bytes, const Operation& op,
                             const std::optional<Agreement>& agreement) {
  if (op.calibration_index < 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_size_.find(bytes);
    if (it == by_size_.end()) return;
    SizeState& size = it->second;
    if (size.unsettled > 0) size.unsettled--;
    if (agreement) {
      const auto later = [](const Agreement& a, const Agreement& b) {
        return a.index != b.index ? a.index > b.index : a.bound > b.bound;
      };
      if (!size.agreed || later(*agreement, *size.agreed)) size.agreed = agreement;
    }
  }
  settled_.notify_all();
}

std::optional<OperationLedger::Agreement> OperationLedger::AgreedBound(
    size_t bytes, std::chrono::steady_clock::time_point until, bool* settled) {
  std::unique_lock<std::mutex> lock(mu_);
  // Looked up afresh after every wake-up: other sizes may be added meanwhile (a rehash
  // moves the entries).
  const auto state = [&]() -> const SizeState* {
    auto it = by_size_.find(bytes);
    return it == by_size_.end() ? nullptr : &it->second;
  };
  *settled = settled_.wait_until(lock, until, [&] {
    const SizeState* s = state();
    return s == nullptr || s->unsettled == 0;
  });
  const SizeState* s = state();
  if (s == nullptr || !s->agreed) return std::nullopt;
  return s->agreed;
}

}  // namespace optireduce
