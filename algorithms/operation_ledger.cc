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
  auto it = started_by_size_.find(bytes);
  if (it == started_by_size_.end()) {
    if (started_by_size_.size() >= kMaxSizes) {
      op.calibrate = true;  // not counted: exact always
      return op;
    }
    it = started_by_size_.emplace(bytes, 0).first;
  }
  op.calibrate = it->second < calibration_ops;
  if (op.calibrate) it->second++;
  return op;
}

}  // namespace optireduce
