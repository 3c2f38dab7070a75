// Every shape of a Gloo allreduce call (inputs and outputs, outputs only, one buffer or
// several) gives what stock Gloo gives for the same buffers: reliable TAR, recursive
// doubling and OptiReduce mode through optireduce::allreduce, and gloo::AllreduceTranspose
// against gloo::AllreduceRing. The reference is stock gloo::allreduce run on the same
// context with fresh copies of the same inputs; every input and output buffer is compared
// after the call.
#include <cmath>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/math.h>
#include <gtest/gtest.h>

#include "algorithms/allreduce.h"
#include "algorithms/allreduce_transpose.h"
#include "tests/common/ranks.h"
#include "transport_dpdk/device.h"

namespace optireduce {
namespace {

using RawFunc = void (*)(void*, const void*, const void*, size_t);

// One call shape: how many input and output buffers, and whether the inputs are the
// outputs themselves (as gloo::AllreduceRing and AllreduceTranspose pass them).
struct Shape {
  int inputs;
  int outputs;
  bool inputs_are_outputs;
  std::string Name() const {
    return std::to_string(inputs) + (inputs_are_outputs ? " in-place" : "") + " inputs, " +
           std::to_string(outputs) + " outputs";
  }
};

const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = {
      {0, 1, false}, {1, 1, false}, {1, 1, true},  {0, 2, false}, {0, 3, false},
      {2, 2, false}, {3, 3, false}, {3, 3, true},  {2, 1, false}, {1, 3, false},
  };
  return shapes;
}

// Buffer b of rank r (inputs first, then outputs): small integers, different per buffer
// and rank, so float sums are exact in any order and a buffer left out changes the result.
float Value(int rank, int buffer, size_t i) {
  return static_cast<float>((i * 7 + rank * 13 + buffer * 5) % 11) + 1 + 16 * buffer;
}

struct Buffers {
  std::vector<std::vector<float>> in, out;
  std::vector<float*> in_ptrs, out_ptrs;
};

Buffers Make(const Shape& s, int rank, size_t count) {
  Buffers b;
  b.out.resize(s.outputs);
  for (int k = 0; k < s.outputs; k++) {
    for (size_t i = 0; i < count; i++) b.out[k].push_back(Value(rank, s.inputs + k, i));
    b.out_ptrs.push_back(b.out[k].data());
  }
  if (s.inputs_are_outputs) {
    b.in_ptrs = b.out_ptrs;
  } else {
    b.in.resize(s.inputs);
    for (int k = 0; k < s.inputs; k++) {
      for (size_t i = 0; i < count; i++) b.in[k].push_back(Value(rank, k, i));
      b.in_ptrs.push_back(b.in[k].data());
    }
  }
  return b;
}

// Stock Gloo's result for this shape on this rank.
Buffers Stock(const std::shared_ptr<gloo::Context>& ctx, const Shape& s, size_t count,
              uint32_t tag) {
  Buffers b = Make(s, ctx->rank, count);
  gloo::AllreduceOptions opts(ctx);
  if (s.inputs > 0) opts.setInputs(b.in_ptrs, count);
  opts.setOutputs(b.out_ptrs, count);
  opts.setReduceFunction(RawFunc(&gloo::sum<float>));
  opts.setTag(tag);
  gloo::allreduce(opts);
  return b;
}

void ExpectSame(const Buffers& got, const Buffers& want, double tolerance,
                const std::string& what) {
  auto compare = [&](const std::vector<std::vector<float>>& g,
                     const std::vector<std::vector<float>>& w, const char* kind) {
    ASSERT_EQ(g.size(), w.size());
    for (size_t k = 0; k < g.size(); k++) {
      for (size_t i = 0; i < g[k].size(); i++) {
        ASSERT_NEAR(g[k][i], w[k][i], tolerance * std::max(1.0f, std::fabs(w[k][i])))
            << what << ": " << kind << " " << k << " element " << i;
      }
    }
  };
  compare(got.in, want.in, "input");
  compare(got.out, want.out, "output");
}

enum class Path { kTar, kRecursiveDoubling, kBounded, kBoundedHadamard };

const char* PathName(Path p) {
  switch (p) {
    case Path::kTar: return "reliable TAR";
    case Path::kRecursiveDoubling: return "recursive doubling";
    case Path::kBounded: return "OptiReduce mode";
    case Path::kBoundedHadamard: return "OptiReduce mode with Hadamard";
  }
  return "";
}

// Runs every shape through optireduce::allreduce on `path` and compares with stock Gloo.
// OptiReduce mode runs the shapes twice: the first operations calibrate (exact TAR), the
// second round is bounded (checked in the stats).
void RunShapes(const std::shared_ptr<gloo::Context>& ctx, Path path, size_t count) {
  const bool bounded = path == Path::kBounded || path == Path::kBoundedHadamard;
  TimeoutOptions t;
  t.calibration_ops = 2;
  t.peer_timeout_factor = 0;
  // Generous: no phase of an operation on a loaded test host ends before its data is in.
  t.min_bound = std::chrono::seconds(1);
  t.max_quiet = std::chrono::milliseconds(200);
  auto policy = std::make_shared<TimeoutPolicy>(t);
  uint32_t tag = 100;
  for (int round = 0; round < (bounded ? 2 : 1); round++) {
    for (const Shape& s : Shapes()) {
      const std::string what = std::string(PathName(path)) + ", " + s.Name() + ", rank " +
                               std::to_string(ctx->rank) + ", round " + std::to_string(round);
      const Buffers want = Stock(ctx, s, count, tag++);
      Buffers got = Make(s, ctx->rank, count);
      AllreduceOptions opts(ctx);
      if (s.inputs > 0) opts.setInputs(got.in_ptrs, count);
      opts.setOutputs(got.out_ptrs, count);
      opts.setReduceFunction(RawFunc(&gloo::sum<float>));
      opts.setTag(tag++);
      OpStats stats;
      opts.setStatsOutput(&stats);
      if (path == Path::kTar) opts.setSmallMessageBytes(0);
      if (bounded) {
        opts.setMode(AllreduceOptions::Mode::kBounded);
        opts.setTimeoutPolicy(policy);
        opts.setMaxLoss(0);  // any loss is repaired: the result is exact or flagged
        opts.setHadamard(path == Path::kBoundedHadamard ? AllreduceOptions::Hadamard::kOn
                                                        : AllreduceOptions::Hadamard::kOff);
      }
      allreduce(opts);
      if (bounded && round == 1 && ctx->size > 1) {
        ASSERT_EQ(stats.mode, OpMode::kBounded) << what << " " << stats.ToJson();
        ASSERT_FALSE(stats.damaged) << what << " " << stats.ToJson();
      }
      // The Hadamard transform rounds: a few float ulps of values up to ~100 per rank.
      ExpectSame(got, want, path == Path::kBoundedHadamard ? 1e-5 : 0, what);
    }
  }
}

testing::RankOptions Loop() {
  testing::RankOptions options;
  options.device = [](int) { return transport::loop::CreateDevice(); };
  return options;
}

class CallShapes : public ::testing::TestWithParam<int> {};

TEST_P(CallShapes, ReliableTarGivesWhatStockGlooGives) {
  testing::RunThreads(GetParam(), [](const std::shared_ptr<gloo::Context>& ctx) {
    RunShapes(ctx, Path::kTar, 1001);
  });
}

TEST_P(CallShapes, RecursiveDoublingGivesWhatStockGlooGives) {
  testing::RunThreads(GetParam(), [](const std::shared_ptr<gloo::Context>& ctx) {
    RunShapes(ctx, Path::kRecursiveDoubling, 37);
  });
}

TEST_P(CallShapes, OptiReduceModeGivesWhatStockGlooGives) {
  testing::RunThreads(GetParam(), [](const std::shared_ptr<gloo::Context>& ctx) {
    RunShapes(ctx, Path::kBounded, 4099);
  }, Loop());
}

TEST_P(CallShapes, OptiReduceModeWithHadamardGivesWhatStockGlooGivesToRounding) {
  testing::RunThreads(GetParam(), [](const std::shared_ptr<gloo::Context>& ctx) {
    RunShapes(ctx, Path::kBoundedHadamard, 4099);
  }, Loop());
}

TEST_P(CallShapes, AllreduceTransposeGivesWhatAllreduceRingGives) {
  testing::RunThreads(GetParam(), [](const std::shared_ptr<gloo::Context>& ctx) {
    constexpr size_t kCount = 1001;
    for (int buffers : {1, 2, 3}) {
      const Shape s{buffers, buffers, /*inputs_are_outputs=*/true};
      Buffers want = Make(s, ctx->rank, kCount);
      gloo::AllreduceRing<float>(ctx, want.out_ptrs, kCount).run();
      Buffers got = Make(s, ctx->rank, kCount);
      gloo::AllreduceTranspose<float>(ctx, got.out_ptrs, kCount).run();
      ExpectSame(got, want, 0, "AllreduceTranspose, " + std::to_string(buffers) + " buffers");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CallShapes, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param);
                         });

}  // namespace
}  // namespace optireduce
