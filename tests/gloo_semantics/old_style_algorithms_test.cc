// Gloo's old-style algorithm classes (they use Buffer, reuse buffers right
// after send() and start sending as soon as their own pairs are connected)
// on our udp and loop devices, ranks as threads of this process: every
// result must be exact.
//
// The default is a sample that runs in seconds. OPTIREDUCE_TEST_OLD_STYLE_FULL=1
// runs every rank count 2..16 (and 27 for bcube base 3) with more sizes;
// OPTIREDUCE_TEST_OLD_STYLE_RANKS=9,16 picks the rank counts;
// OPTIREDUCE_TEST_OLD_STYLE_RUNS=N repeats every configuration N times, each on
// freshly connected contexts; OPTIREDUCE_TEST_TCP_BASELINE=1 adds Gloo's TCP
// device as a reference.
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/reduce_scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/common/ranks.h"
#include "transport_dpdk/device.h"

namespace optireduce {
namespace testing {
namespace {

using T = int32_t;
using Ctx = std::shared_ptr<gloo::Context>;

bool Full() { return std::getenv("OPTIREDUCE_TEST_OLD_STYLE_FULL") != nullptr; }

int Runs() {
  const char* v = std::getenv("OPTIREDUCE_TEST_OLD_STYLE_RUNS");
  return v ? std::max(1, std::atoi(v)) : 1;
}

T Value(int r, size_t i) { return static_cast<T>((r + 1) * ((i % 1013) + 1)); }
T SumAt(int n, size_t i) { return static_cast<T>(((i % 1013) + 1) * n * (n + 1) / 2); }

[[noreturn]] void Mismatch(const std::string& what, int rank, size_t n, size_t i, T got, T want) {
  std::ostringstream s;
  s << what << " rank " << rank << " count " << n << ": element " << i << " is " << got
    << ", expected " << want;
  throw std::runtime_error(s.str());
}

// Two local inputs per rank, as Gloo's own tests use: the result is twice
// the cross-rank sum.
template <typename Algo, typename... Extra>
void Allreduce(const Ctx& c, size_t n, const std::string& what, Extra... extra) {
  std::vector<T> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = b[i] = Value(c->rank, i);
  Algo algo(c, std::vector<T*>{a.data(), b.data()}, static_cast<int>(n), extra...);
  algo.run();
  for (size_t i = 0; i < n; ++i) {
    const T want = 2 * SumAt(c->size, i);
    if (a[i] != want) Mismatch(what, c->rank, n, i, a[i], want);
    if (b[i] != want) Mismatch(what, c->rank, n, i, b[i], want);
  }
}

void ReduceScatter(const Ctx& c, size_t n) {
  std::vector<T> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = b[i] = Value(c->rank, i);
  std::vector<int> counts(c->size, static_cast<int>(n / c->size));
  for (size_t r = 0; r < n % c->size; ++r) ++counts[r];
  gloo::ReduceScatterHalvingDoubling<T> algo(c, {a.data(), b.data()}, static_cast<int>(n),
                                             counts);
  algo.run();
  size_t begin = 0;
  for (int r = 0; r < c->rank; ++r) begin += counts[r];
  // This rank's block [begin, begin + counts[rank]) of the sum lands at the
  // start of the first input.
  for (size_t j = 0; j < static_cast<size_t>(counts[c->rank]); ++j) {
    const T want = 2 * SumAt(c->size, begin + j);
    if (a[j] != want) Mismatch("ReduceScatterHalvingDoubling", c->rank, n, j, a[j], want);
  }
}

void Broadcast(const Ctx& c, size_t n) {
  const int root = c->size - 1;
  std::vector<T> v(n, -1);
  if (c->rank == root)
    for (size_t i = 0; i < n; ++i) v[i] = Value(root, i);
  gloo::BroadcastOneToAll<T> algo(c, {v.data()}, n, root);
  algo.run();
  for (size_t i = 0; i < n; ++i)
    if (v[i] != Value(root, i)) Mismatch("BroadcastOneToAll", c->rank, n, i, v[i], Value(root, i));
}

std::vector<size_t> Sizes() {
  if (Full()) return {1, 2, 7, 64, 1000, 4097, 100000};
  return {1, 1000, 100000};
}

// Runs every algorithm that fits `ranks` (and bcube with `base` when
// ranks is a power of it) on fresh contexts, Runs() times.
void RunAll(const std::string& kind, int ranks, const std::vector<int>& bcube_bases) {
  RankOptions o;
  o.context_timeout = std::chrono::milliseconds(20000);
  o.device = [kind](int) -> std::shared_ptr<gloo::transport::Device> {
    if (kind == "tcp") return TcpDevice(0);
    if (kind == "udp") {
      transport::udp::attr a;
      a.hostname = "127.0.0.1";
      return transport::udp::CreateDevice(a);
    }
    return transport::loop::CreateDevice(transport::loop::attr{});
  };
  for (int run = 0; run < Runs(); ++run) {
    SCOPED_TRACE(kind + " " + std::to_string(ranks) + " ranks, run " + std::to_string(run));
    RunThreads(ranks, [&](const Ctx& c) {
      for (size_t n : Sizes()) {
        // Algorithms take slots from nextSlot(); bcube takes one and uses
        // several: keep instances apart.
        c->nextSlot(1 << 12);
        Allreduce<gloo::AllreduceRing<T>>(c, n, "AllreduceRing");
        c->nextSlot(1 << 12);
        Allreduce<gloo::AllreduceRingChunked<T>>(c, n, "AllreduceRingChunked");
        c->nextSlot(1 << 12);
        Allreduce<gloo::AllreduceHalvingDoubling<T>>(c, n, "AllreduceHalvingDoubling");
        c->nextSlot(1 << 12);
        ReduceScatter(c, n);
        c->nextSlot(1 << 12);
        Broadcast(c, n);
        for (int base : bcube_bases) {
          c->nextSlot(1 << 12);
          c->base = base;
          Allreduce<gloo::AllreduceBcube<T>>(c, n, "AllreduceBcube base " + std::to_string(base));
          c->base = 2;
        }
      }
      c->nextSlot(1 << 12);
      gloo::BarrierAllToAll(c).run();
      c->nextSlot(1 << 12);
      gloo::BarrierAllToOne(c, c->size - 1).run();
    }, o);
  }
}

bool IsPowerOf(int n, int base) {
  while (n > 1 && n % base == 0) n /= base;
  return n == 1;
}

std::vector<int> BasesFor(int ranks) {
  std::vector<int> b;
  for (int base : {2, 3, 4})
    if (ranks >= base && IsPowerOf(ranks, base)) b.push_back(base);
  return b;
}

std::vector<int> RankCounts() {
  if (const char* only = std::getenv("OPTIREDUCE_TEST_OLD_STYLE_RANKS")) {
    std::vector<int> r;
    std::stringstream list(only);
    for (std::string item; std::getline(list, item, ',');) r.push_back(std::stoi(item));
    return r;
  }
  if (Full()) return {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 27};
  return {2, 3, 9, 16};
}

std::vector<std::string> Kinds() {
  std::vector<std::string> k{"udp", "loop"};
  if (std::getenv("OPTIREDUCE_TEST_TCP_BASELINE")) k.push_back("tcp");
  return k;
}

class OldStyle : public ::testing::TestWithParam<std::string> {};

TEST_P(OldStyle, EveryResultExact) {
  for (int ranks : RankCounts()) {
    // 27 ranks only run bcube base 3 (and the rest, as they fit).
    RunAll(GetParam(), ranks, BasesFor(ranks));
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, OldStyle, ::testing::ValuesIn(Kinds()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace testing
}  // namespace optireduce
