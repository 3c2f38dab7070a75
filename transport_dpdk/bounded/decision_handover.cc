#include "transport_dpdk/bounded/decision_handover.h"

namespace optireduce {
namespace transport {

void DecisionHandover::RecentSet::Insert(uint64_t key) {
  if (!keys.insert(key).second) return;
  order.push_back(key);
  while (order.size() > kRemembered) {
    keys.erase(order.front());
    order.pop_front();
  }
}

void DecisionHandover::Begin(uint64_t op) {
  std::lock_guard<std::mutex> lock(mu_);
  begun_.Insert(Key(op));
}

bool DecisionHandover::OnAsk(uint64_t op) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t key = Key(op);
  if (begun_.keys.contains(key)) return ceded_.keys.contains(key);
  ceded_.Insert(key);
  return true;
}

bool DecisionHandover::Ceded(uint64_t op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ceded_.keys.contains(Key(op));
}

void DecisionHandover::OnAnswer(int leader, uint64_t op, bool ceded) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t key = Key(op);
    if (answers_.insert_or_assign(key, Answer{leader, ceded}).second) {
      answers_order_.push_back(key);
    }
    while (answers_order_.size() > kAnswersKept) {
      answers_.erase(answers_order_.front());
      answers_order_.pop_front();
    }
  }
  answered_.notify_all();
}

std::optional<bool> DecisionHandover::WaitAnswer(int leader, uint64_t op,
                                                 BoundedClock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t key = Key(op);
  std::optional<bool> got;
  answered_.wait_until(lock, deadline, [&] {
    auto it = answers_.find(key);
    if (it == answers_.end() || it->second.leader != leader) return false;
    got = it->second.ceded;
    answers_.erase(it);
    for (auto o = answers_order_.begin(); o != answers_order_.end(); ++o) {
      if (*o == key) {
        answers_order_.erase(o);
        break;
      }
    }
    return true;
  });
  return got;
}

}  // namespace transport
}  // namespace optireduce
