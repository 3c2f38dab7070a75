// Exact TAR: one pipelined round over a team of ranks, and the flat and two-level TAR built
// from it.
#include "algorithms/exact_transpose.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include "absl/strings/str_cat.h"
#include "algorithms/internal/thread_scratch.h"
#include "algorithms/transpose_plan.h"
#include "algorithms/two_level_plan.h"

namespace optireduce {
namespace {

using gloo::transport::UnboundBuffer;

// Which of TAR's two phases a round runs: phase 1 alone is a reduce-scatter (each member
// ends with its reduced shard), phase 2 alone an allgather of reduced shards.
enum class Phases { kScatter, kGather, kBoth };

// One round of TAR among `team` over elements [offset, offset + len) of every shard (len
// clipped to each shard's count) of the span of `plan.elements()` elements that starts at
// element `span_begin` of the buffer.
struct Round {
  const Team* team = nullptr;
  const TransposePlan* plan = nullptr;
  size_t span_begin = 0;
  size_t offset = 0;
  size_t len = 0;
  uint64_t slot1 = 0;
  uint64_t slot2 = 0;
  Phases phases = Phases::kBoth;

  // The piece of `owner`'s shard this round moves: its count, and its first element (in
  // the whole buffer) in *begin.
  size_t Piece(int owner, size_t* begin) const {
    const size_t count = plan->ShardCount(owner);
    if (offset >= count) return 0;
    *begin = span_begin + plan->ShardBegin(owner) + offset;
    return std::min(len, count - offset);
  }
};

// Chunks of a round's pieces (pipelining).
struct Chunks {
  size_t elems;
  size_t Of(size_t count) const { return (count + elems - 1) / elems; }
  size_t Len(size_t count, size_t c) const { return std::min(elems, count - c * elems); }
};

// The round is pipelined in chunks of tar.pipeline_chunk_bytes: every phase-1 chunk is
// sent at once, and an owner reduces chunk c and sends it on (phase 2) as soon as every
// peer's chunk c is in, while later chunks are still on the wire. Phase 2 receives land in
// place, over the regions this rank sends from in phase 1: an owner's reduced chunk c can
// only exist once it has all of this rank's chunk c, so nothing is overwritten before it
// has left. Chunks of one (peer, slot) are sent and received in the same order, which is
// how transports match them (Gloo's TCP pair and ours alike). The owner adds the
// contributions in the order own, member + 1, member + 2, ... (mod the team's size).
void TransposeRound(const ExactTar& tar, const Round& round, char* data, UnboundBuffer& send_buf,
                    UnboundBuffer& recv_buf) {
  gloo::Context& ctx = *tar.context;
  const Team& team = *round.team;
  const TransposePlan& plan = *round.plan;
  const int me = team.member;
  const int n = team.size;
  const size_t esz = tar.element_size;
  const bool scatter = round.phases != Phases::kGather;
  const bool gather = round.phases != Phases::kScatter;
  const Chunks chunks{tar.pipeline_chunk_bytes == 0
                          ? round.len
                          : std::max<size_t>(1, tar.pipeline_chunk_bytes / esz)};

  size_t my_begin = 0;
  const size_t my_count = round.Piece(me, &my_begin);
  const size_t my_chunks = chunks.Of(my_count);
  // One peer's contribution to this round's piece of my shard per step: sized by the
  // piece (at most the segment), not by the segment limit.
  const size_t step_bytes = scatter ? my_count * esz : 0;
  char* scratch = internal::ThreadScratch(internal::ScratchSlot::kReliableSteps,
                                          std::max<size_t>(1, (n - 1) * step_bytes));
  auto from_step = [&](int step) { return scratch + (step - 1) * step_bytes; };

  // Phase 1: post a receive per chunk of my shard from every peer (a buffer each, so a
  // chunk's arrival is known exactly), then send each owner its shard, chunk-major.
  std::vector<std::unique_ptr<UnboundBuffer>> from_peer;
  int sends = 0;
  if (scatter) {
    from_peer.resize((n - 1) * my_chunks);
    for (size_t c = 0; c < my_chunks; c++) {
      for (int step = 1; step < n; step++) {
        const size_t len = chunks.Len(my_count, c) * esz;
        auto& buf = from_peer[c * (n - 1) + (step - 1)];
        buf = ctx.createUnboundBuffer(from_step(step) + c * chunks.elems * esz, len);
        buf->recv(team.Rank(plan.RecvPeer(me, step)), round.slot1, 0, len);
      }
    }
    size_t unused = 0;
    const size_t most_chunks = chunks.Of(round.Piece(0, &unused));  // shard 0 is the longest
    for (size_t c = 0; c < most_chunks; c++) {
      for (int step = 1; step < n; step++) {
        const int peer = plan.SendPeer(me, step);
        size_t begin = 0;
        const size_t count = round.Piece(peer, &begin);
        if (c >= chunks.Of(count)) continue;
        send_buf.send(team.Rank(peer), round.slot1, (begin + c * chunks.elems) * esz,
                      chunks.Len(count, c) * esz);
        sends++;
      }
    }
  }

  // Phase 2 receives: every other owner's reduced shard, chunk by chunk, in place.
  int recvs = 0;
  for (int step = 1; gather && step < n; step++) {
    const int owner = plan.RecvPeer(me, step);
    size_t begin = 0;
    const size_t count = round.Piece(owner, &begin);
    for (size_t c = 0; c < chunks.Of(count); c++) {
      recv_buf.recv(team.Rank(owner), round.slot2, (begin + c * chunks.elems) * esz,
                    chunks.Len(count, c) * esz);
      recvs++;
    }
  }

  // Reduce each chunk in step order as its contributions arrive, and send it on at once.
  for (size_t c = 0; c < my_chunks; c++) {
    const size_t len = chunks.Len(my_count, c);
    char* mine = data + (my_begin + c * chunks.elems) * esz;
    for (int step = 1; scatter && step < n; step++) {
      WaitOne(*from_peer[c * (n - 1) + (step - 1)], /*recv=*/true, "receiving phase-1 data from",
              team.Rank(plan.RecvPeer(me, step)), tar.tag, *tar.deadline);
      (*tar.reduce)(mine, mine, from_step(step) + c * chunks.elems * esz, len);
    }
    for (int step = 1; gather && step < n; step++) {
      send_buf.send(team.Rank(plan.SendPeer(me, step)), round.slot2,
                    (my_begin + c * chunks.elems) * esz, len * esz);
      sends++;
    }
  }
  for (int i = 0; i < recvs; i++) {
    WaitOne(recv_buf, /*recv=*/true, "receiving phase-2 data from", -1, tar.tag, *tar.deadline);
  }
  for (int i = 0; i < sends; i++) {
    WaitOne(send_buf, /*recv=*/false, "sending data to", -1, tar.tag, *tar.deadline);
  }
}

// TAR among `team` of the span [span_begin, span_begin + count) in rounds of at most a
// segment per shard, so scratch memory stays bounded for buffers of any size.
void TeamTranspose(const ExactTar& tar, const Team& team, char* data, size_t span_begin,
                   size_t count, Phases phases, uint64_t slot1, uint64_t slot2,
                   UnboundBuffer& send_buf, UnboundBuffer& recv_buf) {
  if (team.size <= 1 || count == 0) return;
  const TransposePlan plan(count, team.size);
  const size_t segment_elems = std::max<size_t>(1, tar.max_segment_bytes / tar.element_size);
  const size_t rounds = (plan.MaxShardCount() + segment_elems - 1) / segment_elems;
  Round round;
  round.team = &team;
  round.plan = &plan;
  round.span_begin = span_begin;
  round.len = segment_elems;
  round.slot1 = slot1;
  round.slot2 = slot2;
  round.phases = phases;
  for (size_t r = 0; r < rounds; r++) {
    round.offset = r * segment_elems;
    TransposeRound(tar, round, data, send_buf, recv_buf);
  }
}

}  // namespace

int WaitOne(UnboundBuffer& buf, bool recv, const char* what, int peer, uint32_t tag,
            const Deadline& deadline) {
  int rank = peer;
  bool ok = false;
  try {
    const auto left = deadline.Remaining();
    ok = recv ? buf.waitRecv(&rank, left) : buf.waitSend(&rank, left);
  } catch (const gloo::IoException& e) {
    if (deadline.passed()) {
      throw gloo::IoException(absl::StrCat("optireduce::allreduce (tag ", tag, ") timed out after ",
                                           deadline.timeout().count(), " ms ", what, " rank ",
                                           peer, ": ", e.what()));
    }
    throw gloo::IoException(absl::StrCat("optireduce::allreduce (tag ", tag, ") failed ",
                                         what, " rank ", peer, ": ", e.what()));
  }
  if (!ok) {
    GLOO_THROW_IO_EXCEPTION("optireduce::allreduce (tag ", tag, ") aborted while ", what,
                            " rank ", peer);
  }
  return rank;
}

void FlatTransposeAllreduce(const ExactTar& tar, char* data, size_t elements, uint64_t slot1,
                            uint64_t slot2) {
  gloo::Context& ctx = *tar.context;
  const size_t bytes = elements * tar.element_size;
  auto send_buf = ctx.createUnboundBuffer(data, bytes);
  auto recv_buf = ctx.createUnboundBuffer(data, bytes);
  TeamTranspose(tar, Team::Flat(ctx.rank, ctx.size), data, 0, elements, Phases::kBoth, slot1,
                slot2, *send_buf, *recv_buf);
}

void TwoLevelTransposeAllreduce(const ExactTar& tar, char* data, size_t elements,
                                int group_size, uint64_t slot_base) {
  gloo::Context& ctx = *tar.context;
  GLOO_ENFORCE(group_size > 1 && group_size < ctx.size && ctx.size % group_size == 0,
               "optireduce::allreduce: two-level TAR needs a group size that divides the ",
               ctx.size, " ranks, got ", group_size);
  const size_t bytes = elements * tar.element_size;
  auto send_buf = ctx.createUnboundBuffer(data, bytes);
  auto recv_buf = ctx.createUnboundBuffer(data, bytes);
  const Team group = Team::Group(ctx.rank, group_size);
  const Team across = Team::Across(ctx.rank, ctx.size, group_size);
  // This rank's part: its shard of the within-group plan.
  const TransposePlan parts(elements, group_size);
  const size_t part_begin = parts.ShardBegin(group.member);
  const size_t part_count = parts.ShardCount(group.member);
  // A: reduce-scatter within the group; every member holds its group's sum of its part.
  TeamTranspose(tar, group, data, 0, elements, Phases::kScatter, slot_base, slot_base,
                *send_buf, *recv_buf);
  // B: TAR of the part among the ranks with this member index: the sum over all ranks.
  TeamTranspose(tar, across, data, part_begin, part_count, Phases::kBoth, slot_base + 1,
                slot_base + 2, *send_buf, *recv_buf);
  // C: allgather of the parts within the group.
  TeamTranspose(tar, group, data, 0, elements, Phases::kGather, slot_base + 3, slot_base + 3,
                *send_buf, *recv_buf);
}

namespace {

// One of two-level TAR's phases within this rank's group (A: kScatter, C: kGather).
void GroupPhase(const ExactTar& tar, char* data, size_t elements, int group_size,
                uint64_t slot, Phases phases) {
  gloo::Context& ctx = *tar.context;
  const size_t bytes = elements * tar.element_size;
  auto send_buf = ctx.createUnboundBuffer(data, bytes);
  auto recv_buf = ctx.createUnboundBuffer(data, bytes);
  TeamTranspose(tar, Team::Group(ctx.rank, group_size), data, 0, elements, phases, slot, slot,
                *send_buf, *recv_buf);
}

}  // namespace

void TwoLevelScatter(const ExactTar& tar, char* data, size_t elements, int group_size,
                     uint64_t slot) {
  GroupPhase(tar, data, elements, group_size, slot, Phases::kScatter);
}

void TwoLevelGather(const ExactTar& tar, char* data, size_t elements, int group_size,
                    uint64_t slot) {
  GroupPhase(tar, data, elements, group_size, slot, Phases::kGather);
}

size_t TwoLevelPart(size_t elements, int group_size, int member, size_t* count) {
  const TransposePlan parts(elements, group_size);
  *count = parts.ShardCount(member);
  return parts.ShardBegin(member);
}

size_t FlatScratchBytes(size_t elements, size_t element_size, size_t max_segment_bytes,
                        int rank, int ranks) {
  const size_t segment_elems = std::max<size_t>(1, max_segment_bytes / element_size);
  const size_t piece = std::min(TransposePlan(elements, ranks).ShardCount(rank), segment_elems);
  return static_cast<size_t>(ranks - 1) * piece * element_size;
}

}  // namespace optireduce
