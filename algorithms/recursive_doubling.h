// recursive_doubling.h — the latency-optimal exact allreduce optireduce::allreduce uses
// for small buffers (below AllreduceOptions::smallMessageBytes()).
//
// TAR sends N-1 messages per rank in each of its two phases; for a buffer of a few KiB the
// per-message cost dominates. Recursive doubling exchanges the whole buffer with one
// partner per round, ceil(log2 N) rounds (plus one fold-in and one fold-out message for
// ranks beyond the largest power of two P <= N: rank P+i hands its data to rank i first
// and gets the result back last).
//
// Exact: every rank ends with bit-identical values. Each pairwise reduction puts the
// lower rank's operand first (reduce(out, lower, higher)), so both partners compute the
// same value even for a reduce function that is not commutative bit for bit. The output of
// every reduction is its first operand.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>

#include <gloo/context.h>

namespace optireduce {

struct RecursiveDoublingArgs {
  gloo::Context* context = nullptr;
  char* data = nullptr;  // in: this rank's contribution; out: the reduction over all ranks
  size_t elements = 0;
  size_t element_size = 0;
  // Gloo's reduce function: out[i] = a[i] (op) b[i] for i < n (out may alias a or b).
  std::function<void(void*, const void*, const void*, size_t)> reduce;
  uint64_t slot = 0;  // one slot for every message of this call
  uint32_t tag = 0;   // for error messages
  // Whole-call budget; <= 0: the transport's default per wait.
  std::chrono::milliseconds timeout{0};
};

// Runs the allreduce. Throws gloo::IoException (naming the tag, the step and the peer)
// when a wait fails, is aborted or the budget runs out.
void RecursiveDoublingAllreduce(const RecursiveDoublingArgs& args);

}  // namespace optireduce
