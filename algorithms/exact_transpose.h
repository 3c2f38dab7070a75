// Exact Transpose AllReduce (TAR) over Gloo's reliable transport API: the flat TAR of all
// ranks and the two-level TAR (two_level_plan.h), both built from one pipelined round over
// a team of ranks. optireduce::allreduce (allreduce.h) checks the options, agrees with its
// peers and calls these.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include <gloo/allreduce.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

namespace optireduce {

// The operation's own time limit. It never throws by itself: a wait that starts after it
// passed still runs, with the shortest timeout, so that the transport times the operation
// out as a Gloo wait timeout does (Gloo's TCP device and ours then fail the context: no
// later operation on it succeeds, and nothing lands in this operation's buffers later).
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(std::chrono::milliseconds timeout) : timeout_(timeout) {
    if (timeout.count() > 0) end_ = Clock::now() + timeout;
  }
  // Time left for the next wait (at least kLastWait once passed); kUnsetTimeout means "the
  // transport's default".
  std::chrono::milliseconds Remaining() const {
    if (timeout_.count() <= 0) return gloo::transport::kUnsetTimeout;
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()),
                    kLastWait);
  }
  bool passed() const { return timeout_.count() > 0 && Clock::now() >= end_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  static constexpr std::chrono::milliseconds kLastWait{1};
  std::chrono::milliseconds timeout_;
  Clock::time_point end_;
};

// Waits for one completion on `buf` (a receive or a send) within the deadline; a timeout,
// an abort or a transport error becomes one gloo::IoException saying where TAR was.
// Returns the peer the transport reports.
int WaitOne(gloo::transport::UnboundBuffer& buf, bool recv, const char* what, int peer,
            uint32_t tag, const Deadline& deadline);

// What an exact TAR needs besides its buffer.
struct ExactTar {
  gloo::Context* context = nullptr;
  size_t element_size = 0;
  const gloo::AllreduceOptions::Func* reduce = nullptr;
  uint32_t tag = 0;
  size_t max_segment_bytes = 0;     // scratch per peer; larger shards go in rounds
  size_t pipeline_chunk_bytes = 0;  // 0: one chunk per round
  const Deadline* deadline = nullptr;
};

// Flat TAR of `elements` elements at `data` over every rank of the context, on two slots.
void FlatTransposeAllreduce(const ExactTar& tar, char* data, size_t elements, uint64_t slot1,
                            uint64_t slot2);

// Two-level TAR with groups of `group_size` (a divisor of the context's size, 1 < G < N),
// on the four slots slot_base .. slot_base + 3: reduce-scatter within the group, TAR of
// this rank's part among the ranks of its member index, allgather within the group. The
// reduction order: the owner of an element adds its group's members in the order own,
// +1, +2, ... (mod G), then the groups' sums in the order own group, +1, ... (mod N/G).
void TwoLevelTransposeAllreduce(const ExactTar& tar, char* data, size_t elements,
                                int group_size, uint64_t slot_base);

// Two-level TAR's phases A and C alone, on one slot each (two-level OptiReduce mode runs
// its phase B bounded between them: allreduce.cc). Scatter: each member of this rank's
// group ends with its group's sum of its part (TwoLevelPart); Gather: each member's part
// reaches the others of its group.
void TwoLevelScatter(const ExactTar& tar, char* data, size_t elements, int group_size,
                     uint64_t slot);
void TwoLevelGather(const ExactTar& tar, char* data, size_t elements, int group_size,
                    uint64_t slot);
// Member m's part of a buffer of `elements` cut for groups of `group_size`: its first
// element, and its count in *count.
size_t TwoLevelPart(size_t elements, int group_size, int member, size_t* count);

// Flat TAR's scratch per thread: one peer's piece of this rank's shard per step, the
// piece at most a segment.
size_t FlatScratchBytes(size_t elements, size_t element_size, size_t max_segment_bytes,
                        int rank, int ranks);

}  // namespace optireduce
