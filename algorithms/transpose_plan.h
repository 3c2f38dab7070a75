// How Transpose AllReduce (TAR) cuts a buffer into shards and orders its peers.
//
// N ranks, `elements` elements: shard j (owned by rank j) has elements/N elements, and the
// first elements % N shards one more (as the paper's code). Phase 1: rank r sends shard j to
// its owner j; phase 2: each owner sends its reduced shard to every other rank. Peers are
// visited in the staggered order (r - i) mod N for i = 1..N-1, so in step i every rank sends
// to a different rank and no owner is the target of everyone at once.
#pragma once

#include <algorithm>
#include <cstddef>

namespace optireduce {

class TransposePlan {
 public:
  TransposePlan(size_t elements, int ranks) : elements_(elements), ranks_(ranks) {}

  size_t elements() const { return elements_; }
  int ranks() const { return ranks_; }

  size_t ShardCount(int owner) const {
    const size_t base = elements_ / ranks_;
    const size_t extra = elements_ % ranks_;
    return base + (static_cast<size_t>(owner) < extra ? 1 : 0);
  }
  size_t ShardBegin(int owner) const {
    const size_t base = elements_ / ranks_;
    const size_t extra = elements_ % ranks_;
    return owner * base + std::min(static_cast<size_t>(owner), extra);
  }
  size_t MaxShardCount() const { return ShardCount(0); }

  // The peer `rank` sends to in step i (1 <= i < N).
  int SendPeer(int rank, int step) const { return (rank - step + ranks_) % ranks_; }
  // The peer `rank` receives from in step i: the rank whose SendPeer in step i is `rank`.
  int RecvPeer(int rank, int step) const { return (rank + step) % ranks_; }

 private:
  size_t elements_;
  int ranks_;
};

}  // namespace optireduce
