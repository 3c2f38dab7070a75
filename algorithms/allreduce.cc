// Transpose AllReduce over Gloo's public transport API (UnboundBuffer send/recv).
#include "algorithms/allreduce.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "algorithms/hadamard.h"
#include "algorithms/reduce_classifier.h"
#include "algorithms/transpose_plan.h"

namespace optireduce {
namespace {

using Impl = gloo::detail::AllreduceOptionsImpl;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Slot prefix for TAR messages; Gloo's own collectives use 0x01..0x08.
constexpr uint8_t kTransposeSlotPrefix = 0x20;

struct ImplAccess : gloo::AllreduceOptions {
  static const Impl& Get(const gloo::AllreduceOptions& opts) {
    return opts.*(&ImplAccess::impl_);
  }
};

// Per-(context, tag) operation counters: every rank calls allreduce with a given tag in the
// same order, so the counters agree and the Hadamard signs change every operation.
uint64_t NextOperation(const gloo::Context* context, uint32_t tag) {
  static std::mutex mu;
  static auto* counters =
      new absl::flat_hash_map<std::tuple<const gloo::Context*, uint32_t>, uint64_t>();
  std::lock_guard<std::mutex> lock(mu);
  return (*counters)[std::make_tuple(context, tag)]++;
}

// Scratch memory for one peer's shard per step; grows, never shrinks, one per thread so
// concurrent allreduces from several threads never share it.
char* ScratchBytes(size_t bytes) {
  struct Scratch {
    char* data = nullptr;
    size_t size = 0;
    ~Scratch() { std::free(data); }
  };
  thread_local Scratch scratch;
  if (scratch.size < bytes) {
    std::free(scratch.data);
    const size_t rounded = (bytes + 63) / 64 * 64;
    scratch.data = static_cast<char*>(std::aligned_alloc(64, rounded));
    GLOO_ENFORCE(scratch.data != nullptr, "optireduce::allreduce: cannot allocate ",
                 rounded, " bytes of scratch memory");
    scratch.size = rounded;
  }
  return scratch.data;
}

class Deadline {
 public:
  explicit Deadline(milliseconds timeout) : timeout_(timeout) {
    if (timeout.count() > 0) end_ = Clock::now() + timeout;
  }
  // Time left for the next wait; kUnsetTimeout means "the transport's default".
  milliseconds Remaining(const char* what, int peer) const {
    if (timeout_.count() <= 0) return gloo::transport::kUnsetTimeout;
    auto left = std::chrono::duration_cast<milliseconds>(end_ - Clock::now());
    if (left.count() <= 0) {
      GLOO_THROW_IO_EXCEPTION("optireduce::allreduce timed out after ", timeout_.count(),
                              " ms ", what, " rank ", peer);
    }
    return left;
  }

 private:
  milliseconds timeout_;
  Clock::time_point end_;
};

struct Job {
  const Impl& gloo;
  DataType type;
  ReduceOp op;
  bool hadamard;
  uint64_t hadamard_seed;
  int hadamard_log2_block;
  size_t max_segment_bytes;
};

void Wait(bool ok, const char* what, int peer, uint32_t tag) {
  if (!ok) {
    GLOO_THROW_IO_EXCEPTION("optireduce::allreduce (tag ", tag, ") aborted while ", what,
                            " rank ", peer);
  }
}

// Annotates a transport error with where in TAR it happened.
template <typename Fn>
void WithContext(const char* what, int peer, uint32_t tag, Fn fn) {
  try {
    fn();
  } catch (const gloo::IoException& e) {
    throw gloo::IoException(absl::StrCat("optireduce::allreduce (tag ", tag, ") failed ",
                                         what, " rank ", peer, ": ", e.what()));
  }
}

void Validate(const Impl& g) {
  GLOO_ENFORCE(g.context != nullptr, "optireduce::allreduce: no context");
  GLOO_ENFORCE(!g.out.empty(), "optireduce::allreduce: no output buffer (setOutput)");
  GLOO_ENFORCE(g.elementSize > 0, "optireduce::allreduce: element size is 0");
  GLOO_ENFORCE(static_cast<bool>(g.reduce),
               "optireduce::allreduce: no reduce function (setReduceFunction)");
  const size_t bytes = g.elements * g.elementSize;
  for (size_t i = 0; i < g.out.size(); i++) {
    GLOO_ENFORCE(g.out[i] != nullptr, "optireduce::allreduce: output ", i, " is null");
    GLOO_ENFORCE(bytes == 0 || g.out[i]->ptr != nullptr, "optireduce::allreduce: output ",
                 i, " has a null pointer and ", g.elements, " elements");
    GLOO_ENFORCE(g.out[i]->size >= bytes, "optireduce::allreduce: output ", i, " holds ",
                 g.out[i]->size, " bytes, ", bytes, " needed");
  }
  for (size_t i = 0; i < g.in.size(); i++) {
    GLOO_ENFORCE(g.in[i] != nullptr, "optireduce::allreduce: input ", i, " is null");
    GLOO_ENFORCE(bytes == 0 || g.in[i]->ptr != nullptr, "optireduce::allreduce: input ", i,
                 " has a null pointer and ", g.elements, " elements");
    GLOO_ENFORCE(g.in[i]->size >= bytes, "optireduce::allreduce: input ", i, " holds ",
                 g.in[i]->size, " bytes, ", bytes, " needed");
  }
}

void HadamardTransform(const Job& job, char* data, uint64_t seed, bool forward) {
  hadamard::Options options;
  if (job.hadamard_log2_block > 0) options.log2_block = job.hadamard_log2_block;
  const size_t n = job.gloo.elements;
  if (job.type == DataType::kFloat32) {
    auto* p = reinterpret_cast<float*>(data);
    forward ? hadamard::Forward(p, n, seed, options) : hadamard::Inverse(p, n, seed, options);
  } else {
    auto* p = reinterpret_cast<double*>(data);
    forward ? hadamard::Forward(p, n, seed, options) : hadamard::Inverse(p, n, seed, options);
  }
}

// One round of TAR over elements [offset, offset + len) of every shard (len clipped to each
// shard's count), so scratch memory stays bounded for buffers of any size.
void TransposeRound(const Job& job, char* data, gloo::transport::UnboundBuffer& send_buf,
                    gloo::transport::UnboundBuffer& recv_buf, const TransposePlan& plan,
                    size_t round_offset, size_t round_len, const Deadline& deadline,
                    uint64_t slot1, uint64_t slot2) {
  const Impl& g = job.gloo;
  gloo::Context& ctx = *g.context;
  const int rank = ctx.rank;
  const int n = ctx.size;
  const size_t esz = g.elementSize;
  auto piece = [&](int owner, size_t* begin) -> size_t {
    const size_t count = plan.ShardCount(owner);
    if (round_offset >= count) return 0;
    *begin = plan.ShardBegin(owner) + round_offset;
    return std::min(round_len, count - round_offset);
  };

  size_t my_begin = 0;
  const size_t my_count = piece(rank, &my_begin);
  char* scratch = ScratchBytes(std::max<size_t>(1, (n - 1) * round_len * esz));

  // Phase 1: post receives of my shard from every peer, then send each owner its shard.
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> from_peer(n - 1);
  if (my_count > 0) {
    for (int step = 1; step < n; step++) {
      const int peer = plan.RecvPeer(rank, step);
      from_peer[step - 1] = ctx.createUnboundBuffer(scratch + (step - 1) * round_len * esz,
                                                    my_count * esz);
      from_peer[step - 1]->recv(peer, slot1, 0, my_count * esz);
    }
  }
  int sends = 0;
  for (int step = 1; step < n; step++) {
    const int peer = plan.SendPeer(rank, step);
    size_t begin = 0;
    const size_t count = piece(peer, &begin);
    if (count == 0) continue;
    send_buf.send(peer, slot1, begin * esz, count * esz);
    sends++;
  }
  // Reduce contributions in step order while later ones are still in flight.
  char* mine = data + my_begin * esz;
  if (my_count > 0) {
    for (int step = 1; step < n; step++) {
      const int peer = plan.RecvPeer(rank, step);
      WithContext("receiving phase-1 data from", peer, g.tag, [&] {
        Wait(from_peer[step - 1]->waitRecv(nullptr, deadline.Remaining("receiving phase-1 data from", peer)),
             "receiving phase-1 data from", peer, g.tag);
      });
      g.reduce(mine, mine, scratch + (step - 1) * round_len * esz, my_count);
    }
  }
  for (int i = 0; i < sends; i++) {
    WithContext("sending phase-1 data to", -1, g.tag, [&] {
      Wait(send_buf.waitSend(nullptr, deadline.Remaining("sending phase-1 data to", -1)),
           "sending phase-1 data to", -1, g.tag);
    });
  }

  // Phase 2: owners send their reduced shard to everyone; receive every other shard in place.
  int recvs = 0;
  for (int step = 1; step < n; step++) {
    const int owner = plan.RecvPeer(rank, step);
    size_t begin = 0;
    const size_t count = piece(owner, &begin);
    if (count == 0) continue;
    recv_buf.recv(owner, slot2, begin * esz, count * esz);
    recvs++;
  }
  sends = 0;
  if (my_count > 0) {
    for (int step = 1; step < n; step++) {
      send_buf.send(plan.SendPeer(rank, step), slot2, my_begin * esz, my_count * esz);
      sends++;
    }
  }
  for (int i = 0; i < recvs; i++) {
    int peer = -1;
    WithContext("receiving phase-2 data from", peer, g.tag, [&] {
      Wait(recv_buf.waitRecv(&peer, deadline.Remaining("receiving phase-2 data from", -1)),
           "receiving phase-2 data from", peer, g.tag);
    });
  }
  for (int i = 0; i < sends; i++) {
    WithContext("sending phase-2 data to", -1, g.tag, [&] {
      Wait(send_buf.waitSend(nullptr, deadline.Remaining("sending phase-2 data to", -1)),
           "sending phase-2 data to", -1, g.tag);
    });
  }
}

// What every rank must agree on before data moves. Sent to each peer ahead of the data on
// its own slot: on an ordered transport it arrives first, so a rank with a different count
// is reported with a clear error before any receive of the wrong size is posted (Gloo's
// TCP device aborts the process on a size mismatch).
struct PeerFingerprint {
  uint64_t elements;
  uint32_t element_size;
  uint8_t type;
  uint8_t op;
  uint8_t hadamard;
  uint8_t version;
};
static_assert(sizeof(PeerFingerprint) == 16, "fingerprint is sent as raw bytes");

void VerifyPeersAgree(const Job& job, uint64_t slot, const Deadline& deadline) {
  const Impl& g = job.gloo;
  gloo::Context& ctx = *g.context;
  const int n = ctx.size;
  PeerFingerprint mine{g.elements, static_cast<uint32_t>(g.elementSize),
                       static_cast<uint8_t>(job.type), static_cast<uint8_t>(job.op),
                       static_cast<uint8_t>(job.hadamard), 1};
  std::vector<PeerFingerprint> theirs(n);
  auto send_buf = ctx.createUnboundBuffer(&mine, sizeof(mine));
  auto recv_buf = ctx.createUnboundBuffer(theirs.data(), theirs.size() * sizeof(mine));
  for (int peer = 0; peer < n; peer++) {
    if (peer == ctx.rank) continue;
    recv_buf->recv(peer, slot, peer * sizeof(mine), sizeof(mine));
    send_buf->send(peer, slot, 0, sizeof(mine));
  }
  for (int i = 0; i < 2 * (n - 1); i++) {
    int peer = -1;
    const bool recv = i < n - 1;
    const char* what = recv ? "exchanging operation sizes with" : "sending operation sizes to";
    WithContext(what, peer, g.tag, [&] {
      const auto left = deadline.Remaining(what, -1);
      Wait(recv ? recv_buf->waitRecv(&peer, left) : send_buf->waitSend(&peer, left), what,
           peer, g.tag);
    });
  }
  for (int peer = 0; peer < n; peer++) {
    if (peer == ctx.rank) continue;
    const PeerFingerprint& t = theirs[peer];
    GLOO_ENFORCE(t.elements == mine.elements && t.element_size == mine.element_size,
                 "optireduce::allreduce (tag ", g.tag, "): rank ", ctx.rank, " has ",
                 mine.elements, " elements of ", mine.element_size, " bytes but rank ", peer,
                 " has ", t.elements, " elements of ", t.element_size, " bytes");
    GLOO_ENFORCE(t.hadamard == mine.hadamard && t.op == mine.op,
                 "optireduce::allreduce (tag ", g.tag, "): ranks ", ctx.rank, " and ", peer,
                 " disagree on the reduce op or the Hadamard setting");
  }
}

void Run(const Job& job) {
  const Impl& g = job.gloo;
  const size_t bytes = g.elements * g.elementSize;
  char* data = static_cast<char*>(g.out[0]->ptr);

  // Local reduction of all inputs into the first output.
  if (!g.in.empty() && bytes > 0) {
    if (g.in[0]->ptr != data) std::memcpy(data, g.in[0]->ptr, bytes);
    for (size_t i = 1; i < g.in.size(); i++) g.reduce(data, data, g.in[i]->ptr, g.elements);
  }

  gloo::Context& ctx = *g.context;
  if (ctx.size > 1) {
    const Deadline deadline(g.timeout);
    const uint64_t slot1 = gloo::Slot::build(kTransposeSlotPrefix, g.tag);
    const uint64_t slot2 = gloo::Slot::build(kTransposeSlotPrefix, g.tag) + uint8_t{1};
    const uint64_t slot_meta = gloo::Slot::build(kTransposeSlotPrefix, g.tag) + uint8_t{2};
    // Also with 0 elements: a rank with 0 and a rank with more must both hear of it.
    VerifyPeersAgree(job, slot_meta, deadline);
    if (g.elements > 0) {
      uint64_t seed = 0;
      if (job.hadamard) {
        seed = hadamard::OperationSeed(job.hadamard_seed, NextOperation(&ctx, g.tag));
        HadamardTransform(job, data, seed, /*forward=*/true);
      }
      const TransposePlan plan(g.elements, ctx.size);
      const size_t segment_elems = std::max<size_t>(1, job.max_segment_bytes / g.elementSize);
      const size_t rounds = (plan.MaxShardCount() + segment_elems - 1) / segment_elems;
      auto send_buf = ctx.createUnboundBuffer(data, bytes);
      auto recv_buf = ctx.createUnboundBuffer(data, bytes);
      for (size_t r = 0; r < rounds; r++) {
        TransposeRound(job, data, *send_buf, *recv_buf, plan, r * segment_elems,
                       segment_elems, deadline, slot1, slot2);
      }
      if (job.hadamard) HadamardTransform(job, data, seed, /*forward=*/false);
    }
  }

  for (size_t i = 1; i < g.out.size(); i++) {
    if (g.out[i]->ptr != data && bytes > 0) std::memcpy(g.out[i]->ptr, data, bytes);
  }
}

Job MakeJob(const Impl& g, DataType type, ReduceOp op, AllreduceOptions::Hadamard mode,
            uint64_t seed, int log2_block, size_t max_segment_bytes) {
  Validate(g);
  if (type == DataType::kUnknown || op == ReduceOp::kUnknown) {
    const ReduceKind kind = ClassifyReduce(g.reduce, g.elementSize);
    if (type == DataType::kUnknown) type = kind.type;
    if (op == ReduceOp::kUnknown) op = kind.op;
  }
  const bool transformable = IsFloatingPoint(type) && op == ReduceOp::kSum &&
                             ElementSize(type) == g.elementSize;
  GLOO_ENFORCE(mode != AllreduceOptions::Hadamard::kOn || transformable,
               "optireduce::allreduce: the Hadamard transform needs a float32/float64 sum, "
               "got type ", DataTypeName(type), " and op ", ReduceOpName(op));
  GLOO_ENFORCE(max_segment_bytes > 0, "optireduce::allreduce: max segment bytes is 0");
  const bool hadamard = mode != AllreduceOptions::Hadamard::kOff && transformable;
  return Job{g, type, op, hadamard, seed, log2_block, max_segment_bytes};
}

}  // namespace

const gloo::detail::AllreduceOptionsImpl& GlooOptionsOf(const gloo::AllreduceOptions& opts) {
  return ImplAccess::Get(opts);
}

void allreduce(const AllreduceOptions& opts) {
  Run(MakeJob(opts.glooOptions(), opts.dataType(), opts.reduceOp(), opts.hadamard(),
              opts.hadamardSeed(), opts.hadamardLog2Block(), opts.maxSegmentBytes()));
}

void allreduce(const gloo::AllreduceOptions& opts, AllreduceOptions::Hadamard hadamard) {
  Run(MakeJob(GlooOptionsOf(opts), DataType::kUnknown, ReduceOp::kUnknown, hadamard,
              AllreduceOptions::kDefaultHadamardSeed, /*log2_block=*/-1,
              AllreduceOptions::kDefaultMaxSegmentBytes));
}

}  // namespace optireduce
