// Fuzz target: transport::SendScoreboard, the reliable sender's record of the packets
// in flight to a peer, fed acknowledgements from that (untrusted) peer: arbitrary
// cumulative points (behind, inside and past what was sent) and selective-ack bitmaps
// (any length, any bits), mixed with sends, retransmissions, loss marks and RTO-style
// mark-all / restore.
//
// Input: a stream of operations (first byte % 7, then its operands). Checked against a
// plain model (a map of packet states, a list in send order, a FIFO of lost packets):
// every packet is reported delivered exactly once and only if sent; an invalid ack
// changes nothing; after every operation the bytes and packets in flight, the lost
// count, the in-flight list (contents and order) and the base agree with the model.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <set>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "transport_dpdk/reliable/send_scoreboard.h"

using optireduce::transport::SendScoreboard;
using State = SendScoreboard::State;

namespace {

struct Model {
  struct P {
    State state = State::kInFlight;
    uint32_t bytes = 0;
    bool queued = false;
  };
  std::map<uint64_t, P> pkts;  // base .. next-1
  std::list<uint64_t> order;   // in flight, by last send
  std::deque<uint64_t> fifo;
  uint64_t base = 0, next = 0;

  void Unlink(uint64_t s) { order.remove(s); }
  void MarkLost(uint64_t s) {
    auto it = pkts.find(s);
    if (it == pkts.end() || it->second.state != State::kInFlight) return;
    Unlink(s);
    it->second.state = State::kLost;
    if (!it->second.queued) {
      it->second.queued = true;
      fifo.push_back(s);
    }
  }
  uint64_t PeekLost() {
    while (!fifo.empty()) {
      auto it = pkts.find(fifo.front());
      if (it != pkts.end()) {
        if (it->second.state == State::kLost) return fifo.front();
        it->second.queued = false;
      }
      fifo.pop_front();
    }
    return SendScoreboard::kNone;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SendScoreboard sb;
  Model m;
  const auto t0 = std::chrono::steady_clock::time_point{} + std::chrono::seconds(1);
  long tick = 0;
  size_t i = 0;
  auto next_byte = [&]() -> uint8_t { return i < size ? data[i++] : 0; };
  while (i < size) {
    const uint8_t op = next_byte() % 7;
    const auto now = t0 + std::chrono::microseconds(++tick);
    const uint64_t outstanding = m.next - m.base;
    switch (op) {
      case 0: {  // send 1..16 packets
        const int k = 1 + next_byte() % 16;
        for (int j = 0; j < k; ++j) {
          const uint32_t bytes = 1 + next_byte();
          sb.OnSend(m.next, bytes, now);
          m.pkts[m.next] = {State::kInFlight, bytes, false};
          m.order.push_back(m.next);
          ++m.next;
        }
        break;
      }
      case 1: {  // an ack from the peer
        const uint64_t span = outstanding + 3;
        const uint64_t r = next_byte() % span;
        const uint64_t cum = m.base + r >= 1 ? m.base + r - 1 : 0;  // base-1 .. next+1
        const size_t len = next_byte() % 40;
        std::vector<uint8_t> sack(len);
        for (auto& b : sack) b = next_byte();
        std::set<uint64_t> got;
        const bool ok = sb.OnAck(cum, sack.data(), sack.size(),
                                 [&](uint64_t seq, const SendScoreboard::Segment& s) {
          FUZZ_CHECK(got.insert(seq).second, "seq %llu delivered twice in one ack",
                     (unsigned long long)seq);
          auto it = m.pkts.find(seq);
          FUZZ_CHECK(it != m.pkts.end(), "seq %llu delivered but not outstanding",
                     (unsigned long long)seq);
          FUZZ_CHECK(it->second.state != State::kSacked, "seq %llu delivered again",
                     (unsigned long long)seq);
          FUZZ_CHECK(s.bytes == it->second.bytes, "bytes of %llu", (unsigned long long)seq);
        });
        FUZZ_CHECK(ok == (cum <= m.next), "ack cum %llu next %llu: ok %d",
                   (unsigned long long)cum, (unsigned long long)m.next, int(ok));
        if (!ok) {
          FUZZ_CHECK(got.empty(), "an invalid ack delivered packets");
          break;
        }
        // The model: everything below cum, and every bit set, is delivered.
        std::set<uint64_t> want;
        for (auto& [seq, p] : m.pkts) {
          if (p.state == State::kSacked) continue;
          bool hit = seq < cum;
          if (!hit && seq > cum) {
            const uint64_t bit = seq - cum - 1;
            hit = bit < len * 8 && ((sack[bit / 8] >> (bit % 8)) & 1);
          }
          if (hit) want.insert(seq);
        }
        FUZZ_CHECK(got == want, "ack delivered %zu packets, model %zu", got.size(), want.size());
        for (uint64_t seq : want) {
          if (m.pkts[seq].state == State::kInFlight) m.Unlink(seq);
          m.pkts[seq].state = State::kSacked;
        }
        while (m.base < cum) {
          m.pkts.erase(m.base);
          ++m.base;
        }
        break;
      }
      case 2: {  // retransmit
        if (!outstanding) break;
        const uint64_t seq = m.base + next_byte() % outstanding;
        sb.OnRetransmit(seq, now);
        Model::P& p = m.pkts[seq];
        if (p.state == State::kSacked) break;
        if (p.state == State::kInFlight) m.Unlink(seq);
        p.state = State::kInFlight;
        m.order.push_back(seq);
        break;
      }
      case 3: {  // RACK marks one lost
        if (!outstanding) break;
        const uint64_t seq = m.base + next_byte() % outstanding;
        sb.MarkLost(seq);
        m.MarkLost(seq);
        break;
      }
      case 4: {  // RTO
        sb.MarkAllLost();
        while (!m.order.empty()) m.MarkLost(m.order.front());
        break;
      }
      case 5: {  // the next lost packet is resent
        const uint64_t want = m.PeekLost();
        const uint64_t seq = sb.PopLost();
        FUZZ_CHECK(seq == want, "PopLost %llu, model %llu", (unsigned long long)seq,
                   (unsigned long long)want);
        if (seq == SendScoreboard::kNone) break;
        m.fifo.pop_front();
        m.pkts[seq].queued = false;
        sb.OnRetransmit(seq, now);
        m.pkts[seq].state = State::kInFlight;
        m.order.push_back(seq);
        break;
      }
      case 6: {  // a spurious RTO: restore
        sb.RestoreLost();
        std::list<uint64_t> front;
        for (uint64_t seq : m.fifo) {
          auto it = m.pkts.find(seq);
          if (it == m.pkts.end()) continue;
          it->second.queued = false;
          if (it->second.state != State::kLost) continue;
          it->second.state = State::kInFlight;
          front.push_back(seq);
        }
        m.fifo.clear();
        m.order.splice(m.order.begin(), front);
        break;
      }
    }
    // Invariants.
    FUZZ_CHECK(sb.base() == m.base && sb.next_seq() == m.next, "base/next %llu/%llu, model %llu/%llu",
               (unsigned long long)sb.base(), (unsigned long long)sb.next_seq(),
               (unsigned long long)m.base, (unsigned long long)m.next);
    uint64_t pipe = 0, lost = 0;
    for (auto& [seq, p] : m.pkts) {
      if (p.state == State::kInFlight) pipe += p.bytes;
      if (p.state == State::kLost) ++lost;
    }
    FUZZ_CHECK(sb.pipe_bytes() == pipe, "pipe %llu, model %llu",
               (unsigned long long)sb.pipe_bytes(), (unsigned long long)pipe);
    FUZZ_CHECK(sb.lost_packets() == lost, "lost %llu, model %llu",
               (unsigned long long)sb.lost_packets(), (unsigned long long)lost);
    FUZZ_CHECK(sb.in_flight_packets() == m.order.size(), "in flight %llu, model %zu",
               (unsigned long long)sb.in_flight_packets(), m.order.size());
    auto it = m.order.begin();
    for (uint64_t seq = sb.OldestInFlight(); seq != SendScoreboard::kNone;
         seq = sb.NextInFlight(seq), ++it) {
      FUZZ_CHECK(it != m.order.end() && *it == seq, "in-flight list differs at %llu",
                 (unsigned long long)seq);
    }
    FUZZ_CHECK(it == m.order.end(), "in-flight list too short");
    if (m.next > 2000) break;  // keep runs fast
  }
  return 0;
}
