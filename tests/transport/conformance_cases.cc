#include "tests/transport/conformance_cases.h"

#include "algorithms/allreduce.h"

#include <gloo/allgather.h>
#include <gloo/allgather_ring.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>

#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace optireduce {
namespace testing {
namespace {

using T = int32_t;
using Ctx = std::shared_ptr<gloo::Context>;

// Value rank r contributes at index i: small integers, so sums are exact.
T Value(int r, size_t i) { return static_cast<T>((r + 1) * ((i % 1013) + 1)); }
T SumAt(int n, size_t i) { return static_cast<T>(((i % 1013) + 1) * n * (n + 1) / 2); }

std::vector<T> Input(int r, size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Value(r, i);
  return v;
}

std::string Mismatch(const char* what, size_t i, T got, T want) {
  std::ostringstream s;
  s << what << ": element " << i << " is " << got << ", expected " << want;
  return s.str();
}

std::string CheckSum(const std::vector<T>& v, int n, const char* what) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != SumAt(n, i)) return Mismatch(what, i, v[i], SumAt(n, i));
  }
  return "";
}

void SumFn(void* c, const void* a, const void* b, size_t n) {
  gloo::sum<T>(c, a, b, n);
}

std::string NewAllreduce(const Ctx& c, size_t n, bool bcube) {
  auto v = Input(c->rank, n);
  gloo::AllreduceOptions o(c);
  o.setOutput(v.data(), n);
  o.setReduceFunction(&SumFn);
  o.setTag(bcube ? 2 : 1);
  if (bcube) o.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
  gloo::allreduce(o);
  return CheckSum(v, c->size, bcube ? "allreduce(bcube)" : "allreduce(ring)");
}

// Exact TAR (optireduce::allreduce) pipelined in small chunks that divide no shard, over
// several rounds: many messages per (peer, slot) in flight in both phases at once.
std::string Transpose(const Ctx& c, size_t n) {
  auto v = Input(c->rank, n);
  optireduce::AllreduceOptions o(c);
  o.setOutput(v.data(), n);
  o.setReduceFunction(&SumFn);
  o.setTag(3);
  o.setSmallMessageBytes(0);
  o.setPipelineChunkBytes(4004);
  o.setMaxSegmentBytes(64 * 1024);
  optireduce::allreduce(o);
  return CheckSum(v, c->size, "optireduce::allreduce (pipelined TAR)");
}

std::string NewAllgather(const Ctx& c, size_t n) {
  if (n == 0) return "";  // gloo::allgather divides by the input size
  auto in = Input(c->rank, n);
  std::vector<T> out(n * c->size, -1);
  gloo::AllgatherOptions o(c);
  o.setInput(in.data(), n);
  o.setOutput(out.data(), out.size());
  gloo::allgather(o);
  for (int r = 0; r < c->size; ++r)
    for (size_t i = 0; i < n; ++i)
      if (out[r * n + i] != Value(r, i))
        return Mismatch("allgather", r * n + i, out[r * n + i], Value(r, i));
  return "";
}

std::string NewAllgatherv(const Ctx& c, size_t n) {
  std::vector<size_t> counts(c->size);
  size_t total = 0;
  for (int r = 0; r < c->size; ++r) total += counts[r] = n + r;
  auto in = Input(c->rank, counts[c->rank]);
  std::vector<T> out(total, -1);
  gloo::AllgathervOptions o(c);
  o.setInput(in.data(), in.size());
  o.setOutput(out.data(), counts);
  gloo::allgatherv(o);
  size_t off = 0;
  for (int r = 0; r < c->size; ++r) {
    for (size_t i = 0; i < counts[r]; ++i)
      if (out[off + i] != Value(r, i))
        return Mismatch("allgatherv", off + i, out[off + i], Value(r, i));
    off += counts[r];
  }
  return "";
}

// Element i of the block rank `from` sends to rank `to`.
T A2A(int from, int to, size_t i) {
  return static_cast<T>(from * 100000 + to * 1000 + (i % 997));
}

std::string NewAlltoall(const Ctx& c, size_t n) {
  const int N = c->size;
  std::vector<T> in(n * N), out(n * N, -1);
  for (int to = 0; to < N; ++to)
    for (size_t i = 0; i < n; ++i) in[to * n + i] = A2A(c->rank, to, i);
  gloo::AlltoallOptions o(c);
  o.setInput(in.data(), in.size());
  o.setOutput(out.data(), out.size());
  gloo::alltoall(o);
  for (int from = 0; from < N; ++from)
    for (size_t i = 0; i < n; ++i)
      if (out[from * n + i] != A2A(from, c->rank, i))
        return Mismatch("alltoall", from * n + i, out[from * n + i],
                        A2A(from, c->rank, i));
  return "";
}

std::string NewAlltoallv(const Ctx& c, size_t n) {
  const int N = c->size;
  // Rank f sends n + f + t elements to rank t.
  auto len = [&](int f, int t) { return static_cast<int64_t>(n + f + t); };
  std::vector<int64_t> inLen(N), outLen(N);
  std::vector<T> in, out;
  for (int t = 0; t < N; ++t) {
    inLen[t] = len(c->rank, t);
    for (int64_t i = 0; i < inLen[t]; ++i) in.push_back(A2A(c->rank, t, i));
  }
  size_t outTotal = 0;
  for (int f = 0; f < N; ++f) outTotal += outLen[f] = len(f, c->rank);
  out.assign(outTotal, -1);
  gloo::AlltoallvOptions o(c);
  o.setInput(in.data(), inLen);
  o.setOutput(out.data(), outLen);
  gloo::alltoallv(o);
  size_t off = 0;
  for (int f = 0; f < N; ++f) {
    for (int64_t i = 0; i < outLen[f]; ++i)
      if (out[off + i] != A2A(f, c->rank, i))
        return Mismatch("alltoallv", off + i, out[off + i], A2A(f, c->rank, i));
    off += outLen[f];
  }
  return "";
}

std::string NewBarrier(const Ctx& c, size_t) {
  gloo::BarrierOptions o(c);
  gloo::barrier(o);
  return "";
}

std::string NewBroadcast(const Ctx& c, size_t n) {
  const int root = c->size - 1;
  // Separate input at the root: gloo::broadcast copies input to output
  // while its sends from the input may still be in flight.
  std::vector<T> in = Input(root, n), v(n, -1);
  gloo::BroadcastOptions o(c);
  o.setRoot(root);
  if (c->rank == root) o.setInput(in.data(), n);
  o.setOutput(v.data(), n);
  gloo::broadcast(o);
  for (size_t i = 0; i < n; ++i)
    if (v[i] != Value(root, i)) return Mismatch("broadcast", i, v[i], Value(root, i));
  return "";
}

std::string NewGather(const Ctx& c, size_t n) {
  auto in = Input(c->rank, n);
  std::vector<T> out(n * c->size, -1);
  gloo::GatherOptions o(c);
  o.setRoot(0);
  o.setInput(in.data(), n);
  if (c->rank == 0) o.setOutput(out.data(), out.size());
  gloo::gather(o);
  if (c->rank != 0) return "";
  for (int r = 0; r < c->size; ++r)
    for (size_t i = 0; i < n; ++i)
      if (out[r * n + i] != Value(r, i))
        return Mismatch("gather", r * n + i, out[r * n + i], Value(r, i));
  return "";
}

std::string NewReduce(const Ctx& c, size_t n) {
  const int root = 1 % c->size;
  auto in = Input(c->rank, n);
  std::vector<T> out(n, -1);
  gloo::ReduceOptions o(c);
  o.setRoot(root);
  o.setInput(in.data(), n);
  o.setOutput(out.data(), n);
  o.setReduceFunction(&SumFn);
  gloo::reduce(o);
  if (c->rank != root) return "";
  return CheckSum(out, c->size, "reduce");
}

std::string NewScatter(const Ctx& c, size_t n) {
  const int root = 0;
  std::vector<std::vector<T>> blocks(c->size);
  std::vector<T*> ptrs;
  for (int r = 0; r < c->size; ++r) {
    blocks[r] = Input(r + 7, n);
    ptrs.push_back(blocks[r].data());
  }
  std::vector<T> out(n, -1);
  gloo::ScatterOptions o(c);
  o.setRoot(root);
  if (c->rank == root) o.setInputs(ptrs, n);
  o.setOutput(out.data(), n);
  gloo::scatter(o);
  for (size_t i = 0; i < n; ++i)
    if (out[i] != Value(c->rank + 7, i))
      return Mismatch("scatter", i, out[i], Value(c->rank + 7, i));
  return "";
}

// Ring send/recv on unbound buffers; checks the rank waitRecv reports.
std::string SendRecv(const Ctx& c, size_t n) {
  const int N = c->size, right = (c->rank + 1) % N, left = (c->rank + N - 1) % N;
  auto in = Input(c->rank, n);
  std::vector<T> out(n, -1);
  auto sb = c->createUnboundBuffer(in.data(), n * sizeof(T));
  auto rb = c->createUnboundBuffer(out.data(), n * sizeof(T));
  const uint64_t slot = gloo::Slot::build(0x40, c->nextSlot());
  sb->send(right, slot);
  rb->recv(left, slot);
  int got = -1, sent = -1;
  rb->waitRecv(&got, c->getTimeout());
  sb->waitSend(&sent, c->getTimeout());
  if (got != left || sent != right) {
    std::ostringstream s;
    s << "sendrecv: waitRecv rank " << got << " (want " << left
      << "), waitSend rank " << sent << " (want " << right << ")";
    return s.str();
  }
  for (size_t i = 0; i < n; ++i)
    if (out[i] != Value(left, i)) return Mismatch("sendrecv", i, out[i], Value(left, i));
  return "";
}

// Rank 0 receives from any of the others, n-1 times, on one slot; each
// other rank sends once. Every sender must be seen exactly once.
std::string RecvAny(const Ctx& c, size_t n) {
  const uint64_t slot = gloo::Slot::build(0x41, c->nextSlot());
  if (c->rank != 0) {
    auto in = Input(c->rank, n);
    auto sb = c->createUnboundBuffer(in.data(), n * sizeof(T));
    sb->send(0, slot);
    sb->waitSend(c->getTimeout());
    return "";
  }
  std::vector<int> srcs;
  for (int r = 1; r < c->size; ++r) srcs.push_back(r);
  std::set<int> seen;
  std::vector<T> out(n);
  auto rb = c->createUnboundBuffer(out.data(), n * sizeof(T));
  for (int k = 1; k < c->size; ++k) {
    std::fill(out.begin(), out.end(), -1);
    rb->recv(srcs, slot);
    int got = -1;
    rb->waitRecv(&got, c->getTimeout());
    if (got < 1 || got >= c->size || !seen.insert(got).second) {
      return "recv_any: bad or repeated source rank " + std::to_string(got);
    }
    for (size_t i = 0; i < n; ++i)
      if (out[i] != Value(got, i)) return Mismatch("recv_any", i, out[i], Value(got, i));
  }
  return "";
}

// Sends posted long before the matching recvs, several messages on one slot
// (order must hold), a second slot, small (eager) and large (rendezvous).
std::string SendBeforeRecv(const Ctx& c, size_t n) {
  const uint32_t tag = c->nextSlot();
  const uint64_t s1 = gloo::Slot::build(0x42, tag), s2 = gloo::Slot::build(0x43, tag);
  if (c->rank == 1) {
    std::vector<std::vector<T>> msgs;
    for (int k = 0; k < 3; ++k) msgs.push_back(Input(k + 3, n + k * 1000));
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
    for (int k = 0; k < 3; ++k) {
      bufs.push_back(c->createUnboundBuffer(msgs[k].data(), msgs[k].size() * sizeof(T)));
      bufs.back()->send(0, k == 1 ? s2 : s1);
    }
    for (auto& b : bufs) b->waitSend(c->getTimeout());
    return "";
  }
  if (c->rank != 0) return "";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // Post in a different order than sent: slot 2 first.
  std::vector<std::vector<T>> outs(3);
  for (int k = 0; k < 3; ++k) outs[k].assign(n + k * 1000, -1);
  auto b1 = c->createUnboundBuffer(outs[1].data(), outs[1].size() * sizeof(T));
  b1->recv(1, s2);
  b1->waitRecv(c->getTimeout());
  auto b0 = c->createUnboundBuffer(outs[0].data(), outs[0].size() * sizeof(T));
  auto b2 = c->createUnboundBuffer(outs[2].data(), outs[2].size() * sizeof(T));
  b0->recv(1, s1);
  b2->recv(1, s1);
  b0->waitRecv(c->getTimeout());
  b2->waitRecv(c->getTimeout());
  for (int k = 0; k < 3; ++k)
    for (size_t i = 0; i < outs[k].size(); ++i)
      if (outs[k][i] != Value(k + 3, i))
        return Mismatch("send_before_recv", i, outs[k][i], Value(k + 3, i));
  return "";
}

template <typename Algo>
std::string OldAllreduce(const Ctx& c, size_t n, const char* what) {
  auto a = Input(c->rank, n), b = Input(c->rank, n);
  std::vector<T*> ptrs{a.data(), b.data()};
  Algo algo(c, ptrs, static_cast<int>(n));
  algo.run();
  // Two local inputs: the result is twice the cross-rank sum.
  for (size_t i = 0; i < n; ++i) {
    const T want = 2 * SumAt(c->size, i);
    if (a[i] != want) return Mismatch(what, i, a[i], want);
    if (b[i] != want) return Mismatch(what, i, b[i], want);
  }
  return "";
}

std::string OldBroadcast(const Ctx& c, size_t n) {
  const int root = c->size > 1 ? 1 : 0;
  std::vector<T> v = c->rank == root ? Input(root, n) : std::vector<T>(n, -1);
  std::vector<T*> ptrs{v.data()};
  gloo::BroadcastOneToAll<T> algo(c, ptrs, n, root);
  algo.run();
  for (size_t i = 0; i < n; ++i)
    if (v[i] != Value(root, i)) return Mismatch("BroadcastOneToAll", i, v[i], Value(root, i));
  return "";
}

std::string OldBarrier(const Ctx& c, size_t) {
  gloo::BarrierAllToAll algo(c);
  algo.run();
  return "";
}

std::string OldAllgather(const Ctx& c, size_t n) {
  auto in = Input(c->rank, n);
  std::vector<const T*> ptrs{in.data()};
  std::vector<T> out(n * c->size, -1);
  gloo::AllgatherRing<T> algo(c, ptrs, out.data(), static_cast<int>(n));
  algo.run();
  for (int r = 0; r < c->size; ++r)
    for (size_t i = 0; i < n; ++i)
      if (out[r * n + i] != Value(r, i))
        return Mismatch("AllgatherRing", r * n + i, out[r * n + i], Value(r, i));
  return "";
}

using CaseFn = std::function<std::string(const Ctx&, size_t)>;

const std::map<std::string, CaseFn>& Cases() {
  static const auto* cases = new std::map<std::string, CaseFn>{
      {"allreduce", [](const Ctx& c, size_t n) { return NewAllreduce(c, n, false); }},
      {"allreduce_bcube", [](const Ctx& c, size_t n) { return NewAllreduce(c, n, true); }},
      {"allgather", NewAllgather},
      {"allgatherv", NewAllgatherv},
      {"alltoall", NewAlltoall},
      {"alltoallv", NewAlltoallv},
      {"barrier", NewBarrier},
      {"broadcast", NewBroadcast},
      {"gather", NewGather},
      {"reduce", NewReduce},
      {"scatter", NewScatter},
      {"sendrecv", SendRecv},
      {"transpose", Transpose},
      {"recv_any", RecvAny},
      {"send_before_recv", SendBeforeRecv},
      {"AllreduceRing", [](const Ctx& c, size_t n) {
         return OldAllreduce<gloo::AllreduceRing<T>>(c, n, "AllreduceRing"); }},
      {"AllreduceRingChunked", [](const Ctx& c, size_t n) {
         return OldAllreduce<gloo::AllreduceRingChunked<T>>(c, n, "AllreduceRingChunked"); }},
      {"AllreduceHalvingDoubling", [](const Ctx& c, size_t n) {
         return OldAllreduce<gloo::AllreduceHalvingDoubling<T>>(c, n, "AllreduceHalvingDoubling"); }},
      {"AllreduceBcube", [](const Ctx& c, size_t n) -> std::string {
         // It needs a power-of-base rank count (base 2 here; fewer elements
         // than ranks included: tests/gloo_semantics covers bases 3 and 4).
         if (c->size & (c->size - 1)) return "";
         return OldAllreduce<gloo::AllreduceBcube<T>>(c, n, "AllreduceBcube"); }},
      {"BroadcastOneToAll", OldBroadcast},
      {"BarrierAllToAll", OldBarrier},
      {"AllgatherRing", OldAllgather},
  };
  return *cases;
}

}  // namespace

const std::vector<std::string>& AllCaseNames() {
  static const auto* names = [] {
    auto* v = new std::vector<std::string>;
    for (const auto& kv : Cases()) v->push_back(kv.first);
    return v;
  }();
  return *names;
}

std::string RunCase(const std::string& name, const Ctx& context,
                    size_t elements) {
  auto it = Cases().find(name);
  if (it == Cases().end()) return "unknown case " + name;
  try {
    // Some Gloo algorithms (AllreduceBcube) take one slot from nextSlot()
    // but use several; skip ahead so consecutive instances never share a
    // slot while an old instance's buffers may still be registered.
    context->nextSlot(1 << 12);
    std::string err = it->second(context, elements);
    if (!err.empty()) {
      return "rank " + std::to_string(context->rank) + " " + name + "(" +
             std::to_string(elements) + "): " + err;
    }
    return "";
  } catch (const std::exception& e) {
    return "rank " + std::to_string(context->rank) + " " + name + "(" +
           std::to_string(elements) + ") threw: " + e.what();
  }
}

std::shared_ptr<gloo::Context> ConnectContext(
    gloo::rendezvous::Store& store,
    std::shared_ptr<gloo::transport::Device> device, int rank, int size,
    std::chrono::milliseconds timeout) {
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);
  ctx->connectFullMesh(store, device);
  return ctx;
}

}  // namespace testing
}  // namespace optireduce
