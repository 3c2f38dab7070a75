// AllreduceBench's verification (a one-rank context, where the allreduce leaves the pattern
// unchanged) and the straggler distributions.
#include <cmath>
#include <memory>
#include <random>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include "bench/harness/allreduce_bench.h"
#include "bench/harness/straggler.h"
#include "bench/local_ranks.h"

namespace optireduce {
namespace bench {
namespace {

std::shared_ptr<gloo::Context> OneRankContext() {
  gloo::rendezvous::HashStore store;
  auto ctx = std::make_shared<gloo::rendezvous::Context>(0, 1);
  auto device = MakeDevice("tcp");
  ctx->connectFullMesh(store, device);
  return ctx;
}

TEST(AllreduceBenchVerify, PassesExactAndRoundedResults) {
  AllreduceBench b("transpose", OneRankContext(), 1000, 2, std::chrono::seconds(10));
  IterationStats st;
  b.Run(&st);
  AllreduceBench::Check c = b.Verify(20);
  EXPECT_EQ(c.mismatches, 0u);
  EXPECT_EQ(c.rel_error, 0.0);
  b.buffer(1)[7] *= 1.0f + 1e-6f;  // rounding-sized error: still correct
  c = b.Verify(20);
  EXPECT_EQ(c.mismatches, 0u);
  EXPECT_GT(c.rel_error, 0.0);
}

TEST(AllreduceBenchVerify, ReportsWrongElementsAndNaN) {
  AllreduceBench b("allreduce_ring", OneRankContext(), 5000, 1, std::chrono::seconds(10));
  IterationStats st;
  b.Run(&st);
  b.buffer(0)[42] += 1.0f;
  b.buffer(0)[4999] = NAN;
  AllreduceBench::Check c = b.Verify(1);
  EXPECT_EQ(c.mismatches, 2u);
  ASSERT_EQ(c.errors.size(), 1u);  // capped at max_errors
  EXPECT_NE(c.errors[0].find("element 42"), std::string::npos) << c.errors[0];
  EXPECT_TRUE(std::isinf(c.rel_error) || std::isnan(c.rel_error) || c.rel_error > 0);
}

TEST(AllreduceBenchVerify, RefillRestoresThePattern) {
  AllreduceBench b("allreduce", OneRankContext(), 100, 1, std::chrono::seconds(10));
  b.buffer(0)[3] = 1e30f;
  b.Refill();
  EXPECT_EQ(b.Verify(0).mismatches, 0u);
}

// The verified operation after the timed ones runs on buffers no timed operation used:
// an OptiReduce-mode carry is keyed by the buffer's address, so none rides into it.
TEST(AllreduceBenchVerify, FreshBuffersHaveNewAddressesAndThePattern) {
  AllreduceBench b("optireduce", OneRankContext(), 100, 1, std::chrono::seconds(10));
  std::vector<float*> used = {b.buffer(0)};
  for (int round = 0; round < 3; round++) {
    b.buffer(0)[3] = 1e30f;
    b.UseFreshBuffers();
    for (float* p : used) EXPECT_NE(b.buffer(0), p) << "round " << round;
    used.push_back(b.buffer(0));
    EXPECT_EQ(b.Verify(0).mismatches, 0u);  // one rank, one input: the pattern is the sum
    IterationStats st;
    b.Run(&st);  // runs on the fresh buffer
    EXPECT_EQ(b.Verify(0).mismatches, 0u);
  }
}

TEST(AllreduceBenchVerify, RefillsOnlyBeforeTheSumsCouldOverflow) {
  // One rank, 2 inputs: each allreduce doubles the values (both outputs get the sum), from
  // at most 1 x 2 + 4 = 6: 6 x 2^97 < 1e30 < 6 x 2^98.
  AllreduceBench b("allreduce", OneRankContext(), 64, 2, std::chrono::seconds(10));
  ASSERT_EQ(b.RefillEvery(), 97);
  IterationStats st;
  int refills = 0;
  for (int i = 0; i < 300; i++) {
    const bool refilled = b.RefillIfDue();
    if (refilled) {
      refills++;
      EXPECT_EQ(i % 97, 0) << i;
    }
    b.Run(&st);
    // The run after a refill starts from the pattern again: the verified result.
    if (refilled) {
      EXPECT_EQ(b.Verify(0).mismatches, 0u) << i;
    }
    for (int k = 0; k < 2; k++) {
      for (int e = 0; e < 64; e++) {
        ASSERT_TRUE(std::isfinite(b.buffer(k)[e])) << i;
        ASSERT_LT(std::fabs(b.buffer(k)[e]), 1e30f) << i;
      }
    }
  }
  EXPECT_EQ(refills, 3);  // before iterations 97, 194 and 291
  // Without refills the same run overflows: the limit is not loose by orders of magnitude.
  AllreduceBench never("allreduce", OneRankContext(), 64, 2, std::chrono::seconds(10));
  for (int i = 0; i < 130; i++) never.Run(&st);
  EXPECT_FALSE(std::isfinite(never.buffer(0)[0]));
}

TEST(StragglerDist, ParsesAndDraws) {
  std::mt19937_64 rng(1);
  auto c = StragglerDist::Parse("const:3");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->Draw(rng), 3.0);
  auto e = StragglerDist::Parse("exp:5");
  ASSERT_TRUE(e.ok());
  double sum = 0;
  for (int i = 0; i < 20000; i++) sum += e->Draw(rng);
  EXPECT_NEAR(sum / 20000, 5.0, 0.3);
  auto u = StragglerDist::Parse("uniform:2:4");
  ASSERT_TRUE(u.ok());
  for (int i = 0; i < 100; i++) {
    const double x = u->Draw(rng);
    EXPECT_GE(x, 2.0);
    EXPECT_LE(x, 4.0);
  }
  auto n = StragglerDist::Parse("normal:0:1");
  ASSERT_TRUE(n.ok());
  for (int i = 0; i < 100; i++) EXPECT_GE(n->Draw(rng), 0.0);  // clamped
  auto p = StragglerDist::Parse("pareto:1:2");
  ASSERT_TRUE(p.ok());
  for (int i = 0; i < 100; i++) EXPECT_GE(p->Draw(rng), 1.0);
  // spike: 0 or exactly MS, MS with about probability P.
  auto s = StragglerDist::Parse("spike:0.25:80");
  ASSERT_TRUE(s.ok());
  int spikes = 0;
  for (int i = 0; i < 4000; i++) {
    const double x = s->Draw(rng);
    EXPECT_TRUE(x == 0.0 || x == 80.0) << x;
    spikes += x == 80.0;
  }
  EXPECT_NEAR(spikes, 1000, 150);
}

TEST(StragglerDist, RejectsBadSpecs) {
  for (const char* bad : {"", "exp", "exp:", "exp:-1", "exp:1:2", "uniform:4:2", "pareto:0:1",
                          "gamma:1", "const:nan", "const:abc", "spike:1.5:10",
                          "spike:0.1", "spike:-0.1:10"}) {
    EXPECT_FALSE(StragglerDist::Parse(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace bench
}  // namespace optireduce
