// Two-level TAR (AllreduceOptions::Layout::kTwoLevel) over the loop device, ranks as
// threads: every rank's result is bit-identical to a serial reference in the documented
// order (TwoLevelReference below), for every type and op flat TAR supports and every Gloo
// call shape; kAuto's choice; a group size that does not divide N, and ranks that name
// different layouts, raise on every rank; OptiReduce mode runs it and says so.
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/types.h>
#include <gtest/gtest.h>

#include "algorithms/allreduce.h"
#include "algorithms/two_level_plan.h"
#include "tests/common/ranks.h"
#include "transport_dpdk/device.h"

namespace optireduce {
namespace {

using RawFunc = void (*)(void*, const void*, const void*, size_t);
using Layout = AllreduceOptions::Layout;

testing::RankOptions Loop() {
  testing::RankOptions options;
  options.device = [](int) { return transport::loop::CreateDevice(); };
  return options;
}

// Shard `j` of `count` elements cut in `parts`: count/parts each, the first count%parts
// one longer. Returns its first element; *len its length.
size_t Shard(size_t count, int parts, int j, size_t* len) {
  const size_t base = count / parts, extra = count % parts;
  *len = base + (static_cast<size_t>(j) < extra ? 1 : 0);
  return j * base + std::min<size_t>(j, extra);
}

// The documented reduction order of two-level TAR with N ranks in groups of G, one
// contribution per rank (`contrib[r]`, after the rank's local reduction): element x lies in
// part m (the G-way cut of the buffer) and, inside it, in piece k (the (N/G)-way cut of
// the part). Its value is, with S_j = v[jG + m] + v[jG + (m+1)%G] + ... + v[jG + (m+G-1)%G]
// (left to right) the sum of group j's members, S_k + S_(k+1)%(N/G) + ... (left to right).
template <typename T>
std::vector<T> TwoLevelReference(const std::vector<std::vector<T>>& contrib, int group,
                                 RawFunc reduce) {
  const int n = static_cast<int>(contrib.size());
  const int groups = n / group;
  const size_t count = contrib[0].size();
  std::vector<T> out(count);
  for (int m = 0; m < group; m++) {
    size_t part_len = 0;
    const size_t part = Shard(count, group, m, &part_len);
    for (int k = 0; k < groups; k++) {
      size_t len = 0;
      const size_t begin = part + Shard(part_len, groups, k, &len);
      for (size_t x = begin; x < begin + len; x++) {
        T total{};
        for (int jj = 0; jj < groups; jj++) {
          const int j = (k + jj) % groups;
          T s = contrib[j * group + m][x];
          for (int ii = 1; ii < group; ii++) {
            reduce(&s, &s, &contrib[j * group + (m + ii) % group][x], 1);
          }
          if (jj == 0) {
            total = s;
          } else {
            reduce(&total, &total, &s, 1);
          }
        }
        out[x] = total;
      }
    }
  }
  return out;
}

// Rank r's buffer b: values that make float sums order-sensitive (mixed magnitudes and
// signs), small positive integers for products.
template <typename T>
T Value(int rank, int buffer, size_t i, bool product) {
  const uint64_t h = (i * 2654435761u + rank * 40503u + buffer * 9973u) % 1000;
  if (product) return static_cast<T>(1 + h % 2);
  if constexpr (std::is_floating_point_v<T>) {
    const double scale = (h % 3 == 0) ? 1e-3 : (h % 3 == 1 ? 1.0 : 1e3);
    return static_cast<T>((static_cast<double>(h) - 500.0) / 7.0 * scale);
  } else if constexpr (std::is_same_v<T, gloo::float16>) {
    return gloo::cpu_float2half_rn(static_cast<float>(h % 64) / 8.0f - 4.0f);
  } else {
    return static_cast<T>(h % 100);
  }
}

// A call shape: inputs given separately (`inputs` of them, into one output), or outputs
// only (`outputs` of them, each contributing).
struct Shape {
  int inputs;
  int outputs;
};

// Runs one two-level allreduce on this rank and checks every output against the reference.
template <typename T>
void RunOne(const std::shared_ptr<gloo::Context>& ctx, int group, size_t count, RawFunc fn,
            bool product, Shape shape, uint32_t tag, size_t segment_bytes = 0,
            size_t chunk_bytes = 0) {
  const int n = ctx->size;
  const int buffers = shape.inputs > 0 ? shape.inputs : shape.outputs;
  // Every rank's contribution after its local reduction, for the reference.
  std::vector<std::vector<T>> contrib(n, std::vector<T>(count));
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < count; i++) {
      T acc = Value<T>(r, 0, i, product);
      for (int b = 1; b < buffers; b++) {
        const T v = Value<T>(r, b, i, product);
        fn(&acc, &acc, &v, 1);
      }
      contrib[r][i] = acc;
    }
  }
  const std::vector<T> want = TwoLevelReference(contrib, group, fn);
  std::vector<std::vector<T>> in(shape.inputs, std::vector<T>(count));
  std::vector<std::vector<T>> out(shape.outputs, std::vector<T>(count));
  for (int b = 0; b < shape.inputs; b++) {
    for (size_t i = 0; i < count; i++) in[b][i] = Value<T>(ctx->rank, b, i, product);
  }
  for (int b = 0; b < shape.outputs; b++) {
    for (size_t i = 0; i < count; i++) {
      out[b][i] = shape.inputs > 0 ? T{} : Value<T>(ctx->rank, b, i, product);
    }
  }
  std::vector<T*> in_ptrs, out_ptrs;
  for (auto& v : in) in_ptrs.push_back(v.data());
  for (auto& v : out) out_ptrs.push_back(v.data());
  AllreduceOptions opts(ctx);
  if (!in_ptrs.empty()) opts.setInputs(in_ptrs, count);
  opts.setOutputs(out_ptrs, count);
  opts.setReduceFunction(fn);
  opts.setTag(tag);
  opts.setSmallMessageBytes(0);  // TAR at every size
  opts.setLayout(Layout::kTwoLevel);
  opts.setGroupSize(group);
  if (segment_bytes > 0) opts.setMaxSegmentBytes(segment_bytes);
  opts.setPipelineChunkBytes(chunk_bytes);
  OpStats stats;
  opts.setStatsOutput(&stats);
  allreduce(opts);
  ASSERT_EQ(stats.group_size, group < n && group > 1 ? group : 0) << stats.ToJson();
  for (int b = 0; b < shape.outputs; b++) {
    ASSERT_EQ(std::memcmp(out[b].data(), want.data(), count * sizeof(T)), 0)
        << "rank " << ctx->rank << " of " << n << ", groups of " << group << ", " << count
        << " elements, output " << b << " of " << shape.outputs << ", " << shape.inputs
        << " inputs: not the reference's bytes";
  }
}

TEST(TwoLevelGroupSize, LargestDivisorUpToTheSquareRoot) {
  EXPECT_EQ(TwoLevelGroupSize(1), 1);
  EXPECT_EQ(TwoLevelGroupSize(2), 1);
  EXPECT_EQ(TwoLevelGroupSize(3), 1);
  EXPECT_EQ(TwoLevelGroupSize(4), 2);
  EXPECT_EQ(TwoLevelGroupSize(6), 2);
  EXPECT_EQ(TwoLevelGroupSize(7), 1);
  EXPECT_EQ(TwoLevelGroupSize(8), 2);
  EXPECT_EQ(TwoLevelGroupSize(9), 3);
  EXPECT_EQ(TwoLevelGroupSize(12), 3);
  EXPECT_EQ(TwoLevelGroupSize(64), 8);
  EXPECT_EQ(TwoLevelGroupSize(127), 1);
  EXPECT_EQ(TwoLevelGroupSize(128), 8);
  EXPECT_EQ(TwoLevelGroupSize(1024), 32);
  EXPECT_EQ(TwoLevelGroupSize(1000), 25);
}

TEST(TwoLevelReference, TheOrderShowsInFloatSums) {
  // The check below is only as good as its reference: for these values the two-level order
  // and the flat order (groups of 1) give different float sums.
  std::vector<std::vector<float>> contrib(12, std::vector<float>(1001));
  for (int r = 0; r < 12; r++) {
    for (size_t i = 0; i < 1001; i++) contrib[r][i] = Value<float>(r, 0, i, false);
  }
  const auto two_level = TwoLevelReference(contrib, 3, RawFunc(&gloo::sum<float>));
  const auto flat = TwoLevelReference(contrib, 1, RawFunc(&gloo::sum<float>));
  EXPECT_NE(std::memcmp(two_level.data(), flat.data(), 1001 * sizeof(float)), 0);
}

struct Geometry {
  int ranks;
  int group;
};

class TwoLevelExact : public ::testing::TestWithParam<Geometry> {};

TEST_P(TwoLevelExact, FloatSumIsTheReferenceBytesOnEveryRank) {
  const Geometry geo = GetParam();
  testing::RunThreads(geo.ranks, [&](const std::shared_ptr<gloo::Context>& ctx) {
    uint32_t tag = 1;
    // Fewer elements than ranks, fewer than groups, odd counts, and a larger buffer.
    for (size_t count : {size_t{1}, size_t{2}, size_t{5}, size_t{13}, size_t{1001}, size_t{40009}}) {
      RunOne<float>(ctx, geo.group, count, RawFunc(&gloo::sum<float>), false, {1, 1}, tag++);
      RunOne<double>(ctx, geo.group, count, RawFunc(&gloo::sum<double>), false, {0, 1}, tag++);
    }
    // Segment rounds and pipeline chunks: 64-byte segments, 24-byte chunks.
    RunOne<float>(ctx, geo.group, 1001, RawFunc(&gloo::sum<float>), false, {1, 1}, tag++, 64, 24);
    RunOne<double>(ctx, geo.group, 777, RawFunc(&gloo::sum<double>), false, {0, 2}, tag++, 128, 0);
  }, Loop());
}

INSTANTIATE_TEST_SUITE_P(Geometries, TwoLevelExact,
                         ::testing::Values(Geometry{4, 2}, Geometry{6, 2}, Geometry{6, 3},
                                           Geometry{8, 2}, Geometry{8, 4}, Geometry{9, 3},
                                           Geometry{12, 3}, Geometry{12, 4}, Geometry{12, 6}),
                         [](const ::testing::TestParamInfo<Geometry>& info) {
                           return std::to_string(info.param.ranks) + "RanksGroupsOf" +
                                  std::to_string(info.param.group);
                         });

template <typename T>
void EveryOp(const std::shared_ptr<gloo::Context>& ctx, int group, uint32_t* tag) {
  const std::vector<std::pair<RawFunc, bool>> ops = {
      {RawFunc(&gloo::sum<T>), false},
      {RawFunc(&gloo::product<T>), true},
      {RawFunc(&gloo::min<T>), false},
      {RawFunc(&gloo::max<T>), false},
  };
  for (const auto& [fn, product] : ops) {
    for (Shape shape : {Shape{1, 1}, Shape{2, 1}, Shape{1, 3}, Shape{0, 1}, Shape{0, 3}}) {
      for (size_t count : {size_t{3}, size_t{997}}) {
        RunOne<T>(ctx, group, count, fn, product, shape, (*tag)++);
      }
    }
  }
}

TEST(TwoLevel, EveryTypeOpAndCallShapeIsTheReferenceBytes) {
  testing::RunThreads(6, [&](const std::shared_ptr<gloo::Context>& ctx) {
    uint32_t tag = 100;
    for (int group : {2, 3}) {
      EveryOp<float>(ctx, group, &tag);
      EveryOp<double>(ctx, group, &tag);
      EveryOp<int8_t>(ctx, group, &tag);
      EveryOp<uint8_t>(ctx, group, &tag);
      EveryOp<int32_t>(ctx, group, &tag);
      EveryOp<int64_t>(ctx, group, &tag);
      EveryOp<uint64_t>(ctx, group, &tag);
      EveryOp<gloo::float16>(ctx, group, &tag);
    }
  }, Loop());
}

TEST(TwoLevel, ConcurrentOperationsWithDistinctTagsKeepTheirOwnData) {
  // Two-level operations of two tags and a flat one at once on every rank: their slots
  // never meet (each tag's and each layout's own).
  testing::RunThreads(8, [&](const std::shared_ptr<gloo::Context>& ctx) {
    for (int round = 0; round < 3; round++) {
      std::thread a([&] {
        RunOne<float>(ctx, 2, 3001, RawFunc(&gloo::sum<float>), false, {1, 1}, 7);
      });
      std::thread b([&] {
        RunOne<double>(ctx, 4, 2999, RawFunc(&gloo::sum<double>), false, {0, 1}, 8);
      });
      RunOne<float>(ctx, 8, 3001, RawFunc(&gloo::sum<float>), false, {1, 1}, 9);  // flat
      a.join();
      b.join();
    }
  }, Loop());
}

TEST(TwoLevel, WithTheHadamardTransformTheSumHoldsToRounding) {
  // Exact mode with Hadamard kOn: the transform wraps the two-level TAR as it wraps flat.
  testing::RunThreads(6, [&](const std::shared_ptr<gloo::Context>& ctx) {
    constexpr size_t kCount = 5003;
    std::vector<float> data(kCount);
    // Small integers: the transform's rounding stays far below 1e-3.
    auto value = [](int rank, size_t i) { return static_cast<float>((i * 7 + rank * 3) % 13); };
    for (size_t i = 0; i < kCount; i++) data[i] = value(ctx->rank, i);
    AllreduceOptions opts(ctx);
    opts.setOutput(data.data(), kCount);
    opts.setReduceFunction(RawFunc(&gloo::sum<float>));
    opts.setHadamard(AllreduceOptions::Hadamard::kOn);
    opts.setLayout(Layout::kTwoLevel);
    opts.setGroupSize(3);
    OpStats stats;
    opts.setStatsOutput(&stats);
    allreduce(opts);
    EXPECT_EQ(stats.group_size, 3);
    for (size_t i = 0; i < kCount; i++) {
      double want = 0;
      for (int r = 0; r < ctx->size; r++) want += value(r, i);
      ASSERT_NEAR(data[i], want, 1e-3) << "element " << i;
    }
  }, Loop());
}

// The layout an operation of `count` floats ran with these options (OpStats::group_size).
int GroupSizeRun(const std::shared_ptr<gloo::Context>& ctx, Layout layout, size_t group,
                 size_t count = 4096) {
  std::vector<float> data(count, 1.0f);
  AllreduceOptions opts(ctx);
  opts.setOutput(data.data(), data.size());
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setSmallMessageBytes(0);
  opts.setLayout(layout);
  opts.setGroupSize(group);
  OpStats stats;
  opts.setStatsOutput(&stats);
  allreduce(opts);
  for (float v : data) EXPECT_EQ(v, static_cast<float>(ctx->size));
  return stats.group_size;
}

TEST(TwoLevel, AutoIsFlatBelowTheSwitchOverAndForPrimeRankCounts) {
  static_assert(AllreduceOptions::kTwoLevelMinRanks == 128);
  testing::RunThreads(12, [&](const std::shared_ptr<gloo::Context>& ctx) {
    EXPECT_EQ(GroupSizeRun(ctx, Layout::kAuto, 0), 0);
    EXPECT_EQ(GroupSizeRun(ctx, Layout::kAuto, 4), 0);
    EXPECT_EQ(GroupSizeRun(ctx, Layout::kFlat, 3), 0);
    EXPECT_EQ(GroupSizeRun(ctx, Layout::kTwoLevel, 0), 3);  // TwoLevelGroupSize(12)
    EXPECT_EQ(GroupSizeRun(ctx, Layout::kTwoLevel, 12), 0);  // one group: flat
    EXPECT_EQ(GroupSizeRun(ctx, Layout::kTwoLevel, 1), 0);   // groups of one: flat
    // Small exact operations run recursive doubling whatever the layout.
    std::vector<float> small(8, 1.0f);
    AllreduceOptions opts(ctx);
    opts.setOutput(small.data(), small.size());
    opts.setReduceFunction(RawFunc(&gloo::sum<float>));
    opts.setLayout(Layout::kTwoLevel);
    OpStats stats;
    opts.setStatsOutput(&stats);
    allreduce(opts);
    EXPECT_EQ(stats.group_size, 0);
    EXPECT_EQ(small[0], 12.0f);
  }, Loop());
  testing::RunThreads(7, [&](const std::shared_ptr<gloo::Context>& ctx) {
    EXPECT_EQ(GroupSizeRun(ctx, Layout::kTwoLevel, 0), 0);  // prime: no group size
    EXPECT_EQ(GroupSizeRun(ctx, Layout::kAuto, 0), 0);
  }, Loop());
}

TEST(TwoLevel, AGroupSizeThatDoesNotDivideTheRanksRaisesOnEveryRank) {
  testing::RunThreads(6, [&](const std::shared_ptr<gloo::Context>& ctx) {
    for (size_t bad : {size_t{4}, size_t{7}}) {
      for (Layout layout : {Layout::kTwoLevel, Layout::kAuto, Layout::kFlat}) {
        std::vector<float> data(100, 1.0f);
        AllreduceOptions opts(ctx);
        opts.setOutput(data.data(), data.size());
        opts.setReduceFunction(RawFunc(&gloo::sum<float>));
        opts.setLayout(layout);
        opts.setGroupSize(bad);
        try {
          allreduce(opts);
          ADD_FAILURE() << "rank " << ctx->rank << ": group size " << bad << " did not raise";
        } catch (const gloo::EnforceNotMet& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("group size " + std::to_string(bad)), std::string::npos) << what;
          EXPECT_NE(what.find("the 6 ranks"), std::string::npos) << what;
        }
      }
    }
    // Nothing moved: the context is usable.
    EXPECT_EQ(GroupSizeRun(ctx, Layout::kTwoLevel, 2), 2);
  }, Loop());
}

TEST(TwoLevel, RanksNamingDifferentLayoutsRaiseOnEveryRankAndTheContextStaysUsable) {
  testing::RunThreads(8, [&](const std::shared_ptr<gloo::Context>& ctx) {
    // Half the ranks name groups of 2, half groups of 4; then two-level against flat.
    const std::vector<std::pair<Layout, size_t>> mine = {
        {Layout::kTwoLevel, ctx->rank < 4 ? size_t{2} : size_t{4}},
        {ctx->rank % 2 == 0 ? Layout::kTwoLevel : Layout::kFlat, 2},
    };
    for (const auto& [layout, group] : mine) {
      std::vector<float> data(4096, 1.0f);
      AllreduceOptions opts(ctx);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(RawFunc(&gloo::sum<float>));
      opts.setSmallMessageBytes(0);
      opts.setLayout(layout);
      opts.setGroupSize(group);
      try {
        allreduce(opts);
        ADD_FAILURE() << "rank " << ctx->rank << ": different layouts did not raise";
      } catch (const gloo::EnforceNotMet& e) {
        EXPECT_NE(std::string(e.what()).find("disagree on the layout"), std::string::npos)
            << e.what();
      }
    }
    EXPECT_EQ(GroupSizeRun(ctx, Layout::kTwoLevel, 4), 4);
  }, Loop());
}

// OptiReduce mode with the two-level layout runs it, calibration (exact two-level TAR)
// included; two_level_bounded_test.cc tests its loss, stragglers and carries.
TEST(TwoLevel, OptiReduceModeRunsTwoLevelAndSaysSo) {
  testing::RunThreads(8, [&](const std::shared_ptr<gloo::Context>& ctx) {
    TimeoutOptions o;
    o.calibration_ops = 2;
    o.min_bound = std::chrono::milliseconds(2000);
    o.hard_cap = std::chrono::seconds(10);
    auto policy = std::make_shared<TimeoutPolicy>(o);
    bool ran_bounded = false;
    for (int step = 0; step < 4; step++) {
      std::vector<float> data(5000);
      for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<float>((i + ctx->rank) % 7);
      AllreduceOptions opts(ctx);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(RawFunc(&gloo::sum<float>));
      opts.setMode(AllreduceOptions::Mode::kBounded);
      opts.setHadamard(AllreduceOptions::Hadamard::kOff);
      opts.setTimeoutPolicy(policy);
      opts.setLayout(Layout::kTwoLevel);
      opts.setGroupSize(2);
      OpStats stats;
      opts.setStatsOutput(&stats);
      allreduce(opts);
      EXPECT_EQ(stats.group_size, 2) << stats.ToJson();
      EXPECT_NE(stats.ToJson().find("\"group_size\":2"), std::string::npos);
      ran_bounded = ran_bounded || stats.mode == OpMode::kBounded;
      if (stats.damaged || stats.carried_in) continue;  // a rank left out: flagged, not held
      for (size_t i = 0; i < data.size(); i++) {
        float want = 0;
        for (int r = 0; r < ctx->size; r++) want += static_cast<float>((i + r) % 7);
        ASSERT_EQ(data[i], want) << "element " << i << " step " << step;
      }
    }
    EXPECT_TRUE(ran_bounded);
  }, Loop());
}

}  // namespace
}  // namespace optireduce
