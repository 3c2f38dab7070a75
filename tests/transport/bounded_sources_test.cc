// What the send side answers a repair request with (BoundedSources::With): the data, or why
// not — the peer's reaction depends on it (re-ask, wait for a start, or give up at once).
#include "transport_dpdk/bounded/bounded_sources.h"

#include <sys/resource.h>

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace optireduce {
namespace transport {
namespace {

using Access = BoundedSources::Access;

Access Ask(const BoundedSources& s, uint64_t op, int peer, std::string* got = nullptr) {
  return s.With(op, peer, [&](const char* src, size_t nbytes, bool) {
    if (got != nullptr) got->assign(src, nbytes);
  });
}

TEST(BoundedSources, AnswersFollowTheOperationsLife) {
  BoundedSources sources;
  const uint64_t op1 = 1000, op2 = 1001;  // the two phases of one TAR (BoundedOpId pairs)
  const std::string to_peer1 = "for peer 1", to_peer2 = "for peer 2";
  EXPECT_EQ(Ask(sources, op1, 1), Access::kNotStarted);

  // A rank registers its sends one peer at a time: a request from a peer whose part is not
  // registered yet is pending (asked again), never "gone" (the peer would give up on data
  // about to be sent).
  sources.Register(op1, 1, to_peer1.data(), to_peer1.size(), false);
  std::string got;
  EXPECT_EQ(Ask(sources, op1, 1, &got), Access::kDone);
  EXPECT_EQ(got, to_peer1);
  EXPECT_EQ(Ask(sources, op1, 2), Access::kPending);
  sources.Register(op1, 2, to_peer2.data(), to_peer2.size(), false);
  EXPECT_EQ(Ask(sources, op1, 2, &got), Access::kDone);
  EXPECT_EQ(got, to_peer2);

  // Phase 2 asked for while this rank is still in phase 1: pending.
  EXPECT_EQ(Ask(sources, op2, 1), Access::kPending);

  // Detached: served from a copy after the caller's memory is gone.
  sources.Register(op2, 1, to_peer1.data(), to_peer1.size(), true);
  sources.Release(op1);
  EXPECT_EQ(Ask(sources, op1, 1), Access::kGone);
  sources.Detach(op2);
  std::string original = to_peer1;
  bool estimated = false;
  EXPECT_EQ(sources.With(op2, 1,
                         [&](const char* src, size_t nbytes, bool est) {
                           got.assign(src, nbytes);
                           estimated = est;
                         }),
            Access::kDone);
  EXPECT_EQ(got, original);
  EXPECT_TRUE(estimated);
  sources.Release(op2);
  EXPECT_EQ(Ask(sources, op2, 1), Access::kGone);
}

long MinorFaultsOfThisThread() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

TEST(BoundedSources, ReservedDetachCopiesIntoFaultedInMemory) {
  // A bounded TAR detaches its reduced shard every operation; with a fresh copy each time
  // the page faults cost more than the operation (16 MiB: 80-190 ms with 4 ranks on 2
  // cores). After Reserve the copies land in touched memory, also for the next operations.
  constexpr size_t kBytes = 8 << 20;  // 2048 pages
  std::vector<char> shard(kBytes, 'x');
  BoundedSources sources;
  sources.Reserve(kBytes);
  // As many as the byte budget (64 MiB by default) lets detached operations keep, plus
  // the one being detached, at most kMaxSpares.
  EXPECT_EQ(sources.spares(), std::min<size_t>({BoundedSources::kDetachedOps + 1,
                                                (size_t{64} << 20) / kBytes + 1,
                                                BoundedSources::kMaxSpares}));
  long worst = 0;
  // Three times what the budget keeps: the copies of forgotten operations are reused.
  constexpr uint64_t kOps = 3 * ((size_t{64} << 20) / kBytes + 1);
  for (uint64_t op = 2; op < 2 + 2 * kOps; op += 2) {
    shard[op] = static_cast<char>(op);  // each operation's shard differs
    sources.Register(op, 1, shard.data(), kBytes, false);
    sources.Register(op, 2, shard.data(), kBytes, false);
    const long before = MinorFaultsOfThisThread();
    sources.Detach(op);
    worst = std::max(worst, MinorFaultsOfThisThread() - before);
    std::string got;
    ASSERT_EQ(Ask(sources, op, 2, &got), Access::kDone);
    EXPECT_EQ(got.size(), kBytes);
    EXPECT_EQ(got[op], static_cast<char>(op)) << "the copy is this operation's";
  }
  EXPECT_LT(worst, 64) << "a detach faulted pages in (2048 for a fresh copy)";


  // Without the reservation a copy faults its pages in (40 MiB: above glibc's largest
  // mmap threshold, so the memory is always fresh).
  std::vector<char> big(40 << 20, 'y');
  BoundedSources cold;
  cold.Register(2, 1, big.data(), big.size(), false);
  const long before = MinorFaultsOfThisThread();
  cold.Detach(2);
  EXPECT_GT(MinorFaultsOfThisThread() - before, 5000);
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
