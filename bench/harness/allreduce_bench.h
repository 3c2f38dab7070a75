// One benchmark instance: an allreduce algorithm bound to a context and its buffers
// (--inputs float buffers of --elements each), with the harness's test pattern and its
// verification.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/algorithm.h>
#include <gloo/context.h>

#include "bench/harness/iteration_stats.h"
#include "bench/harness/run_optireduce.h"

namespace optireduce {
namespace bench {

class AllreduceBench {
 public:
  // Throws gloo::EnforceNotMet for an unknown name (the options parser rejects those first).
  // `optireduce`: how `optireduce` runs (--hadamard, --max-loss).
  AllreduceBench(const std::string& name, std::shared_ptr<gloo::Context> context,
                 size_t elements, int inputs, std::chrono::milliseconds timeout,
                 const OptiReduceSettings& optireduce = OptiReduceSettings());

  // Restores the test pattern.
  void Refill();
  // Before each timed iteration (untimed): restores the pattern only when one more
  // in-place sum could overflow. Each iteration multiplies the values by at most
  // size x inputs (a sum over every rank's inputs; OptiReduce mode's loss compensation
  // scales by at most N as well), so the pattern lasts RefillEvery() iterations. Refilling
  // every time cost a memcpy of every buffer per iteration — 7% of the CPU of a 4-rank run
  // on 2 cores, taken from peers still in their allreduce. Returns whether it refilled.
  bool RefillIfDue();
  long RefillEvery() const { return refill_every_; }
  // Restores the pattern into buffers at addresses no earlier operation used (Gloo's
  // algorithms, bound to their buffers at construction, keep theirs). OptiReduce mode adds
  // a part an operation deferred to the next operation on the same buffer (late, never
  // lost); the timed iterations' values grow until a refill, so such a part added to a
  // fresh pattern would read as an error of up to 1e23 in a verified result.
  void UseFreshBuffers();
  // One allreduce.
  void Run(IterationStats* stats);

  struct Check {
    size_t mismatches = 0;
    std::vector<std::string> errors;  // at most `max_errors` descriptions
    double rel_error = 0;             // ||got - want||_2 / ||want||_2 over all buffers
  };
  // Compares the buffers with the exact sum of every rank's pattern. Float sums are not
  // associative, and Hadamard rotates the data: an element passes when it is within
  // 1e-4 of max(|want|, rms(want)).
  Check Verify(size_t max_errors) const;

  size_t bytes() const { return elements_ * sizeof(float); }
  // Buffer k (for tests that tamper with a result).
  float* buffer(int k) { return buffers_.at(k).data(); }

 private:
  float Pattern(int rank, int input, size_t i) const;

  const std::string name_;
  const std::shared_ptr<gloo::Context> context_;
  const size_t elements_;
  const std::chrono::milliseconds timeout_;
  const OptiReduceSettings optireduce_;
  std::vector<std::vector<float>> buffers_;
  // Buffers replaced by UseFreshBuffers, kept so that no new one takes their address.
  std::vector<std::vector<float>> retired_;
  // The inputs as generated once: Refill copies them back (a memcpy, not a loop of integer
  // divisions per element: ranks refill while their peers are still reducing).
  std::vector<std::vector<float>> pristine_;
  std::vector<float*> ptrs_;
  long refill_every_ = 1;
  long since_refill_ = 0;  // iterations run since the pattern was last restored
  std::unique_ptr<gloo::Algorithm> old_style_;  // ring, ring_chunked, halving_doubling, bcube
};

}  // namespace bench
}  // namespace optireduce
