#include "transport_dpdk/bounded/bounded_sources.h"

#include <algorithm>

#include "algorithms/bounded_channel.h"

namespace optireduce {
namespace transport {

void BoundedSources::Register(uint64_t op, int peer, const void* src, size_t nbytes,
                              bool estimated) {
  const auto lock = LockForUpdate();
  auto& list = sources_[op];
  forgotten_.erase(op);  // an id reused long after (stays in forgotten_order_ until it ages)
  const Source fresh{static_cast<const char*>(src), nbytes, estimated, nullptr};
  for (auto& [p, source] : list) {
    if (p == peer) {
      source = fresh;
      return;
    }
  }
  list.emplace_back(peer, fresh);
}

void BoundedSources::Detach(uint64_t op) {
  // The caller still owns the sources while it detaches, so the copies are made without
  // the lock: the progress thread keeps sending from the originals meanwhile, and only
  // the pointer swap below waits for it.
  std::vector<std::pair<const char*, size_t>> originals;
  {
    const auto lock = LockForUpdate();
    auto it = sources_.find(op);
    if (it == sources_.end()) return;
    for (const auto& [peer, source] : it->second) {
      if (source.owned) continue;
      bool seen = false;  // phase 2 sends one shard to every peer: copy it once
      for (const auto& o : originals) seen = seen || (o.first == source.src && o.second == source.nbytes);
      if (!seen) originals.emplace_back(source.src, source.nbytes);
    }
  }
  std::vector<std::shared_ptr<std::vector<char>>> copies;
  {
    const auto lock = LockForUpdate();
    for (size_t i = 0; i < originals.size(); i++) {
      if (spare_.empty()) break;
      // A spare big enough needs no new pages; else any (it grows once).
      auto fit = std::find_if(spare_.begin(), spare_.end(), [&](const auto& sp) {
        return sp->capacity() >= originals[i].second;
      });
      if (fit == spare_.end()) fit = spare_.end() - 1;
      copies.push_back(std::move(*fit));
      spare_.erase(fit);
    }
  }
  while (copies.size() < originals.size()) copies.push_back(std::make_shared<std::vector<char>>());
  for (size_t i = 0; i < originals.size(); i++) {
    copies[i]->assign(originals[i].first, originals[i].first + originals[i].second);
  }
  const auto lock = LockForUpdate();
  auto it = sources_.find(op);
  if (it == sources_.end()) return;
  for (auto& [peer, source] : it->second) {
    if (source.owned) continue;
    for (size_t i = 0; i < originals.size(); i++) {
      if (originals[i].first == source.src && originals[i].second == source.nbytes) {
        source.owned = copies[i];
        source.src = copies[i]->data();
      }
    }
  }
  for (const auto& [src, nbytes] : originals) detached_bytes_ += nbytes;
  detached_order_.push_back(op);
  while ((detached_bytes_ > budget_ || detached_order_.size() > kDetachedOps) &&
         !detached_order_.empty()) {
    const uint64_t victim = detached_order_.front();
    detached_order_.pop_front();
    auto v = sources_.find(victim);
    if (v == sources_.end()) continue;
    std::vector<std::shared_ptr<std::vector<char>>> owned;
    for (auto& [peer, source] : v->second) {
      if (!source.owned) continue;
      if (std::find(owned.begin(), owned.end(), source.owned) != owned.end()) continue;
      owned.push_back(source.owned);
      detached_bytes_ -= source.nbytes;
    }
    sources_.erase(v);
    ForgetLocked(victim);
    for (auto& o : owned) {
      if (o.use_count() == 1 && spare_.size() < kMaxSpares) spare_.push_back(std::move(o));
    }
  }
}

void BoundedSources::Reserve(size_t bytes) {
  if (bytes == 0) return;
  const size_t want = std::min<size_t>({kDetachedOps + 1, budget_ / bytes + 1, kMaxSpares});
  size_t have = 0;
  {
    const auto lock = LockForUpdate();
    for (const auto& s : spare_) have += s->capacity() >= bytes ? 1 : 0;
  }
  std::vector<std::shared_ptr<std::vector<char>>> made;
  // Value-initialised: every page is touched here, outside the lock.
  for (size_t i = have; i < want; i++) made.push_back(std::make_shared<std::vector<char>>(bytes));
  const auto lock = LockForUpdate();
  for (auto& m : made) {
    if (spare_.size() >= kMaxSpares) {
      // Make room by dropping a spare too small to serve `bytes`.
      auto small = std::find_if(spare_.begin(), spare_.end(),
                                [&](const auto& s) { return s->capacity() < bytes; });
      if (small == spare_.end()) break;
      spare_.erase(small);
    }
    spare_.push_back(std::move(m));
  }
}

size_t BoundedSources::spares() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spare_.size();
}

void BoundedSources::Release(uint64_t op) {
  const auto lock = LockForUpdate();
  auto it = sources_.find(op);
  if (it == sources_.end()) return;
  for (const auto& [peer, source] : it->second) {
    if (source.owned) detached_bytes_ -= source.nbytes;  // one owner per entry here
  }
  sources_.erase(it);
  ForgetLocked(op);
}

void BoundedSources::ForgetLocked(uint64_t op) {
  if (!forgotten_.insert(op).second) return;
  forgotten_order_.push_back(op);
  while (forgotten_order_.size() > 4096) {
    forgotten_.erase(forgotten_order_.front());
    forgotten_order_.pop_front();
  }
}

BoundedSources::Access BoundedSources::MissingLocked(uint64_t op) const {
  if (forgotten_.contains(op)) return Access::kGone;
  return sources_.contains(SiblingPhaseOp(op)) ? Access::kPending : Access::kNotStarted;
}

std::unique_lock<std::mutex> BoundedSources::LockForUpdate() const {
  updaters_.fetch_add(1, std::memory_order_acq_rel);
  std::unique_lock<std::mutex> lock(mu_);
  updaters_.fetch_sub(1, std::memory_order_acq_rel);
  return lock;
}

BoundedSources::Access BoundedSources::TryWith(uint64_t op, int peer, const ReadFn& fn) const {
  // Yield to a waiting update: the progress thread would otherwise take the lock again
  // between its bursts (std::mutex is not fair) and hold off a Register or Detach for as
  // long as it has data to send.
  if (updaters_.load(std::memory_order_acquire) > 0) return Access::kBusy;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return Access::kBusy;
  return ReadLocked(op, peer, fn);
}

BoundedSources::Access BoundedSources::With(uint64_t op, int peer, const ReadFn& fn) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ReadLocked(op, peer, fn);
}

BoundedSources::Access BoundedSources::ReadLocked(uint64_t op, int peer,
                                                  const ReadFn& fn) const {
  auto it = sources_.find(op);
  if (it == sources_.end()) return MissingLocked(op);
  for (const auto& [p, source] : it->second) {
    if (p == peer) {
      fn(source.src, source.nbytes, source.estimated);
      return Access::kDone;
    }
  }
  // The operation is registered but not yet this peer's part: the caller is still in its
  // send loop (a rank registers its sends one peer at a time). "Gone" here made the peer
  // stop waiting for data that was about to be sent.
  return Access::kPending;
}

}  // namespace transport
}  // namespace optireduce
