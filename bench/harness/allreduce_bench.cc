#include "bench/harness/allreduce_bench.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>

#include "absl/strings/str_format.h"
#include "algorithms/allreduce.h"
#include "bench/harness/run_optireduce.h"

namespace optireduce {
namespace bench {
namespace {
using RawFunc = void (*)(void*, const void*, const void*, size_t);
constexpr uint32_t kTag = 0x0b;
}  // namespace

AllreduceBench::AllreduceBench(const std::string& name, std::shared_ptr<gloo::Context> context,
                               size_t elements, int inputs, std::chrono::milliseconds timeout,
                               const OptiReduceSettings& optireduce)
    : name_(name),
      context_(std::move(context)),
      elements_(elements),
      timeout_(timeout),
      optireduce_(optireduce) {
  buffers_.resize(inputs);
  pristine_.resize(inputs);
  for (size_t k = 0; k < buffers_.size(); k++) {
    buffers_[k].resize(elements);
    ptrs_.push_back(buffers_[k].data());
    pristine_[k].resize(elements);
    for (size_t i = 0; i < elements; i++) pristine_[k][i] = Pattern(context_->rank, int(k), i);
  }
  Refill();
  // Values start at most size x inputs + 4 (Pattern) and grow at most size x inputs per
  // iteration; keep them below 1e30 (float overflows at 3.4e38; Hadamard coefficients are
  // up to sqrt(block) times the values, < 1e3 here).
  const double growth = double(context_->size) * inputs;
  const double start = growth + 4;
  refill_every_ = growth <= 1 ? (1L << 30)
                              : std::max(1L, long(std::floor(std::log(1e30 / start) /
                                                             std::log(growth))));
  const int count = static_cast<int>(elements);
  if (name == "allreduce_ring") {
    old_style_.reset(new gloo::AllreduceRing<float>(context_, ptrs_, count));
  } else if (name == "allreduce_ring_chunked") {
    old_style_.reset(new gloo::AllreduceRingChunked<float>(context_, ptrs_, count));
  } else if (name == "allreduce_halving_doubling") {
    old_style_.reset(new gloo::AllreduceHalvingDoubling<float>(context_, ptrs_, count));
  } else if (name == "allreduce_bcube") {
    old_style_.reset(new gloo::AllreduceBcube<float>(context_, ptrs_, count));
  } else {
    GLOO_ENFORCE(name == "allreduce" || name == "transpose" || name == "optireduce",
                 "unknown benchmark '", name, "'");
  }
}

// Small exact values: every partial sum is an exactly representable float, so the only
// differences from the exact sum come from the algorithm (e.g. the Hadamard rotation).
float AllreduceBench::Pattern(int rank, int input, size_t i) const {
  return static_cast<float>((rank + 1) * (input + 1)) + 0.25f * static_cast<float>(i % 17);
}

void AllreduceBench::Refill() {
  for (size_t k = 0; k < buffers_.size(); k++) {
    std::memcpy(buffers_[k].data(), pristine_[k].data(), elements_ * sizeof(float));
  }
  since_refill_ = 0;
}

void AllreduceBench::UseFreshBuffers() {
  if (!old_style_) {
    for (size_t k = 0; k < buffers_.size(); k++) {
      retired_.push_back(std::move(buffers_[k]));
      buffers_[k] = std::vector<float>(elements_);
      ptrs_[k] = buffers_[k].data();
    }
  }
  Refill();
}

bool AllreduceBench::RefillIfDue() {
  if (since_refill_ < refill_every_) return false;
  Refill();
  return true;
}

void AllreduceBench::Run(IterationStats* stats) {
  since_refill_++;
  *stats = IterationStats{};
  if (old_style_) {
    old_style_->run();
    return;
  }
  if (name_ == "allreduce") {
    gloo::AllreduceOptions opts(context_);
    opts.setInputs(ptrs_, elements_);
    opts.setOutputs(ptrs_, elements_);
    opts.setReduceFunction(RawFunc(&gloo::sum<float>));
    opts.setTag(kTag);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  } else if (name_ == "transpose") {
    optireduce::AllreduceOptions opts(context_);
    opts.setInputs(ptrs_, elements_);
    opts.setOutputs(ptrs_, elements_);
    opts.setReduceFunction(RawFunc(&gloo::sum<float>));
    opts.setTag(kTag);
    opts.setTimeout(timeout_);
    opts.setHadamard(AllreduceOptions::Hadamard::kOff);
    opts.setLayout(optireduce_.layout);
    opts.setGroupSize(optireduce_.group_size);
    optireduce::allreduce(opts);
  } else {
    OptiReduceCall call;
    call.context = context_;
    call.buffers = ptrs_;
    call.elements = elements_;
    call.tag = kTag;
    call.timeout = timeout_;
    call.settings = optireduce_;
    RunOptiReduce(call, stats);
  }
}

AllreduceBench::Check AllreduceBench::Verify(size_t max_errors) const {
  const int n = context_->size;
  const int k_inputs = static_cast<int>(buffers_.size());
  // want(i) = sum_r sum_k Pattern(r, k, i) = (sum_r (r+1)) (sum_k (k+1)) + n K 0.25 (i % 17)
  const double base = (n * (n + 1) / 2.0) * (k_inputs * (k_inputs + 1) / 2.0);
  auto want = [&](size_t i) { return base + n * k_inputs * 0.25 * double(i % 17); };
  double sum_sq = 0;
  for (size_t i = 0; i < 17 && i < elements_; i++) sum_sq += want(i) * want(i);
  const double rms = std::sqrt(sum_sq / double(std::min<size_t>(17, elements_)));
  Check c;
  double err_sq = 0, want_sq = 0;
  for (int k = 0; k < k_inputs; k++) {
    const float* p = buffers_[k].data();
    for (size_t i = 0; i < elements_; i++) {
      const double w = want(i), d = double(p[i]) - w;
      err_sq += d * d;
      want_sq += w * w;
      if (!(std::fabs(d) <= 1e-4 * std::max(std::fabs(w), rms))) {
        c.mismatches++;
        if (c.errors.size() < max_errors) {
          c.errors.push_back(absl::StrFormat("rank %d input %d element %zu: got %.6g, expected %.6g",
                                             context_->rank, k, i, p[i], w));
        }
      }
    }
  }
  c.rel_error = want_sq > 0 ? std::sqrt(err_sq / want_sq) : 0;
  if (!std::isfinite(c.rel_error)) c.rel_error = INFINITY;
  return c;
}

}  // namespace bench
}  // namespace optireduce
