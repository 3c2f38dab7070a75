// Fuzz target: transport::BoundedReceiver, where bounded-service payloads from the
// network are written into the user's gradient buffers by offset.
//
// Input: a header byte choosing up to 4 regions (peer, size), then a program of steps —
// post a receive for an op, drop (close) it, or deliver a payload (op, src, offset, len,
// last). Regions are exact-size heap blocks, so any write outside them is an ASan error
// in the fuzz build. After every step, every open receive's Arrived() ranges must be
// sorted, disjoint, non-empty and inside the region, and every arrived byte must hold what
// its sender sent at that offset. A "wait" step calls Wait(), which must report
// completeness exactly when the ranges cover the region; after it nothing more may arrive
// (the caller reads the regions then).
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "transport_dpdk/bounded/bounded_receiver.h"

namespace {

using optireduce::BoundedReceive;
using optireduce::BoundedRegion;
using optireduce::ByteRange;
using optireduce::PhaseEnd;
using optireduce::transport::BoundedReceiver;

constexpr int kOps = 6;

// What `src` sends at byte `offset` of its region (any op): checkable after staging.
uint8_t Pattern(int src, uint64_t offset) {
  return static_cast<uint8_t>(src * 37 + offset * 13 + (offset >> 8));
}

class Input {
 public:
  Input(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  uint8_t U8() { return i_ < n_ ? d_[i_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint64_t U64() {
    uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v |= uint64_t(U8()) << (8 * k);
    return v;
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

struct Open {
  std::unique_ptr<BoundedReceive> receive;
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<BoundedRegion> regions;
  bool waited = false;
  size_t covered_at_wait = 0;
};

// Checks the ranges and data; returns the bytes covered, sets *complete.
size_t CheckRanges(const Open& o, bool* complete_out) {
  bool complete = true;
  size_t total = 0;
  for (size_t i = 0; i < o.regions.size(); ++i) {
    const BoundedRegion& r = o.regions[i];
    const std::vector<ByteRange> arrived = o.receive->Arrived(i);
    size_t covered = 0, prev_end = 0;
    for (size_t k = 0; k < arrived.size(); ++k) {
      const ByteRange& a = arrived[k];
      FUZZ_CHECK(a.begin < a.end, "empty range [%zu, %zu)", a.begin, a.end);
      FUZZ_CHECK(a.end <= r.nbytes, "range [%zu, %zu) past region of %zu", a.begin, a.end,
                 r.nbytes);
      FUZZ_CHECK(k == 0 || a.begin > prev_end, "ranges overlap or touch at %zu", a.begin);
      for (size_t b = a.begin; b < a.end; ++b) {
        FUZZ_CHECK(static_cast<uint8_t*>(r.dst)[b] == Pattern(r.peer, b),
                   "byte %zu of peer %d's region holds the wrong data", b, r.peer);
      }
      covered += a.size();
      prev_end = a.end;
    }
    // Two regions for one peer: only the last one receives (the first stays empty).
    complete = complete && covered == r.nbytes;
    total += covered;
  }
  *complete_out = complete;
  return total;
}

void CheckReceive(const Open& o) {
  bool complete = false;
  const size_t covered = CheckRanges(o, &complete);
  FUZZ_CHECK(!o.waited || covered == o.covered_at_wait,
             "%zu bytes arrived after Wait returned", covered - o.covered_at_wait);
}

void WaitOn(Open& o) {
  bool complete = false;
  const size_t covered = CheckRanges(o, &complete);
  // A deadline in the past: Wait reports the state without blocking.
  const PhaseEnd end = o.receive->Wait(optireduce::BoundedClock::now() - std::chrono::seconds(1),
                                       std::chrono::hours(1));
  FUZZ_CHECK((end == PhaseEnd::kComplete) == complete, "Wait says %s, ranges say %s",
             optireduce::PhaseEndName(end), complete ? "complete" : "incomplete");
  o.waited = true;
  o.covered_at_wait = covered;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  BoundedReceiver::Options options;
  options.staging_bytes = 1 + in.U16() % 20000;  // small: exercise eviction
  options.closed_history = 1 + in.U8() % 4;      // small: exercise op id reuse
  BoundedReceiver receiver(options);
  const int nregions = 1 + in.U8() % 4;
  struct Spec {
    int peer;
    size_t nbytes;
  };
  std::vector<Spec> specs;
  for (int i = 0; i < nregions; ++i) specs.push_back({in.U8() % 5, size_t(in.U16() % 3000)});

  std::unique_ptr<Open> open[kOps];
  std::vector<uint8_t> payload;
  for (int steps = 0; !in.empty() && steps < 2000; ++steps) {
    const uint8_t kind = in.U8();
    const int op = (kind >> 4) % kOps;
    switch (kind % 8) {
      case 0: {  // post (legal only when op has no open receive)
        if (open[op]) break;
        auto o = std::make_unique<Open>();
        for (const Spec& s : specs) {
          o->buffers.emplace_back(new uint8_t[s.nbytes ? s.nbytes : 1]);
          std::memset(o->buffers.back().get(), 0xCD, s.nbytes ? s.nbytes : 1);
          o->regions.push_back({s.peer, o->buffers.back().get(), s.nbytes});
        }
        o->receive = receiver.Post(op, o->regions, nullptr);
        open[op] = std::move(o);
        break;
      }
      case 1:  // the algorithm is done with the op
        open[op].reset();
        break;
      case 2:  // the algorithm waits, then reads the regions
        if (open[op]) WaitOn(*open[op]);
        break;
      default: {  // a payload from the network
        const int src = static_cast<int>(in.U8() % 7) - 1;  // -1..5
        const uint8_t shape = in.U8();
        uint64_t offset = in.U16();
        if (shape & 1) offset = in.U64();  // anything at all
        if (shape & 2) offset %= 3000;
        size_t len = in.U16() % 3100;
        const bool last = shape & 4;
        payload.resize(len);
        for (size_t k = 0; k < len; ++k) payload[k] = Pattern(src, offset + k);
        receiver.OnData(op, src, offset, payload.data(), len, last);
        break;
      }
    }
    for (const auto& o : open) {
      if (o) CheckReceive(*o);
    }
  }
  receiver.counters();
  return 0;
}
