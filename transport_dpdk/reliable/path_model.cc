#include "transport_dpdk/reliable/path_model.h"

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "transport_dpdk/reliable/ack_scheduler.h"
#include "transport_dpdk/reliable/receive_window.h"

namespace optireduce {
namespace transport {
namespace {

using Time = ReliableSender::Time;
using us = std::chrono::microseconds;
constexpr uint64_t kNone = ReliableSender::kNone;
constexpr size_t kRxPerPoll = 256;  // the engine's poll: 4 bursts of 64
constexpr int kPeerBudget = 64;      // new packets per wake-up, as the engine
constexpr size_t kMaxSackBytes = ReceiveWindow::kSpan / 8;

// One end's scheduling: when it can run something due at t.
class Availability {
 public:
  Availability(const PathModelConfig& c, uint64_t seed) : c_(c), rng_(seed) { Draw(Time{}); }
  Time At(Time t) {
    if (c_.stall_every.count() <= 0) return t;
    while (t >= start_) {
      if (t < end_) return end_;
      Draw(end_);
    }
    return t;
  }

 private:
  void Draw(Time from) {
    if (c_.stall_every.count() <= 0) return;
    std::exponential_distribution<double> gap(1.0 / static_cast<double>(c_.stall_every.count()));
    std::uniform_int_distribution<long> len(c_.stall_min.count(), c_.stall_max.count());
    start_ = from + us(static_cast<long>(gap(rng_)) + 1);
    end_ = start_ + us(len(rng_));
  }
  const PathModelConfig& c_;
  std::mt19937_64 rng_;
  Time start_{Time::max()}, end_{Time::max()};
};

// Loss decisions of one receiving end (as FaultInjector::RxBurst).
class Faults {
 public:
  Faults(const PathModelConfig& c, uint64_t seed) : c_(c), rng_(seed) {}
  // Is this datagram lost? ack: a reliable ack.
  bool Lost(bool ack) {
    if (Chance(c_.drop)) return true;
    if (c_.burst_loss > 0) {
      const double b = 1.0 / c_.burst_len;
      const double g = c_.burst_loss * b / (1.0 - c_.burst_loss);
      if (bad_) {
        if (Chance(b)) bad_ = false;
      } else if (Chance(g)) {
        bad_ = true;
      }
      if (bad_) return true;
    }
    return ack && Chance(c_.ack_drop);
  }

 private:
  bool Chance(double p) {
    return p > 0 && std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p;
  }
  const PathModelConfig& c_;
  std::mt19937_64 rng_;
  bool bad_ = false;
};

struct Data {
  Time arrival;
  uint64_t seq;
  uint32_t payload;
  bool last;
};
struct Ack {
  Time arrival;
  uint64_t cum, dsack;
  std::vector<uint8_t> sack;
};

}  // namespace

PathModelConfig PathModelConfig::Defaults() {
  PathModelConfig c;
  c.sender.initial_rto = us(20000);
  c.sender.min_rto = us(4000);
  c.sender.max_rto = us(200000);
  c.sender.max_ack_delay = c.ack_delay;
  c.sender.min_pto = std::max(c.sender.min_rto / 4, us(200));
  c.sender.mss = c.payload + c.header;
  c.sender.window = c.window + (c.window / c.payload + 1) * c.header;
  c.sender.pacing = true;
  return c;
}

PathModelResult RunPathModel(const PathModelConfig& c) {
  PathModelResult res;
  ReliableSender s(c.sender);
  ReceiveWindow rx;
  AckScheduler acks(c.ack_every, c.window / 4, c.ack_delay);
  Availability s_avail(c, c.seed * 4 + 1), r_avail(c, c.seed * 4 + 2);
  Faults r_faults(c, c.seed * 4 + 3), s_faults(c, c.seed * 4 + 4);
  const uint64_t total = (c.message_bytes + c.payload - 1) / c.payload;
  std::vector<uint32_t> sizes(total);
  for (uint64_t i = 0; i < total; ++i) {
    sizes[i] = static_cast<uint32_t>(std::min<uint64_t>(c.payload, c.message_bytes - i * c.payload));
  }
  std::vector<bool> acked(total, false);
  uint64_t next_new = 0, unacked_payload = 0;
  std::deque<Data> to_rx;   // on the wire / queued at the receiver (FIFO link)
  std::deque<Ack> to_tx;    // acks on the way back
  Time link_free{};
  const double ns_per_byte = 8.0 / c.gbps;
  uint64_t dsack = kNone;
  const Time start = Time{} + std::chrono::seconds(1);
  const Time limit = start + c.limit;

  auto transmit = [&](uint64_t seq, Time now) {
    const uint32_t bytes = sizes[seq] + c.header;
    link_free = std::max(link_free, now) +
                std::chrono::nanoseconds(static_cast<long>(bytes * ns_per_byte));
    const Time arrival = link_free + c.one_way;
    if (r_faults.Lost(false)) {
      ++res.data_dropped;
      res.data_bytes_dropped += sizes[seq];
      return;
    }
    to_rx.push_back({arrival, seq, sizes[seq], seq + 1 == total});
  };
  auto send_new = [&](Time now) {
    const uint64_t seq = next_new++;
    unacked_payload += sizes[seq];
    s.OnSendNew(seq, sizes[seq] + c.header, now);
    transmit(seq, now);
  };
  auto room = [&]() {
    return next_new < total && unacked_payload + c.payload <= c.window &&
           next_new - s.scoreboard().base() < ReceiveWindow::kSpan / 2;
  };

  // The sender's work at `now` (engine Poll + Pump); returns its next deadline.
  auto sender_step = [&](Time now) {
    size_t n = 0;
    while (!to_tx.empty() && to_tx.front().arrival <= now && n < kRxPerPoll) {
      Ack a = std::move(to_tx.front());
      to_tx.pop_front();
      ++n;
      s.OnAck(a.cum, a.sack.data(), a.sack.size(), a.dsack, now, [&](uint64_t seq) {
        if (!acked[seq]) {
          acked[seq] = true;
          unacked_payload -= sizes[seq];
        }
      });
    }
    s.OnTimer(now);
    res.max_rto = std::max(res.max_rto, s.rtt().rto());
    for (uint64_t seq; (seq = s.NextRetransmit(now)) != kNone;) {
      s.OnRetransmit(seq, now);
      transmit(seq, now);
    }
    if (s.probe_pending()) {
      if (room()) {
        const uint64_t seq = next_new;
        send_new(now);
        s.OnProbeSent(seq);
      } else if (s.ProbeSeq() != kNone) {
        const uint64_t seq = s.ProbeSeq();
        s.OnRetransmit(seq, now);
        transmit(seq, now);
        s.OnProbeSent(seq);
      } else {
        s.OnProbeSent(kNone);
      }
    }
    for (int budget = kPeerBudget; budget > 0 && room() &&
                                   s.CanSendNew(c.payload + c.header, now);
         --budget) {
      send_new(now);
    }
    Time next = s.Deadline(now);
    if (room() && next > now + us(1)) {
      // More new data may be allowed soon (pacing) or after the next ack.
      if (s.CanSendNew(c.payload + c.header, now)) next = now + us(1);
    }
    if (!to_tx.empty()) next = std::min(next, std::max(now, to_tx.front().arrival));
    if (n == kRxPerPoll) next = now;  // more acks waiting
    return next;
  };
  // The receiver's work at `now`; returns its next deadline.
  auto receiver_step = [&](Time now) {
    size_t n = 0;
    while (!to_rx.empty() && to_rx.front().arrival <= now && n < kRxPerPoll) {
      const Data d = to_rx.front();
      to_rx.pop_front();
      ++n;
      switch (rx.Classify(d.seq)) {
        case ReceiveWindow::Verdict::kDuplicate:
          ++res.duplicates;
          dsack = d.seq;
          acks.OnArrival(now, 0, true);
          continue;
        case ReceiveWindow::Verdict::kOutOfWindow:
          continue;
        case ReceiveWindow::Verdict::kNew:
          break;
      }
      const bool in_order = d.seq == rx.cum() && rx.highest() <= d.seq;
      rx.Mark(d.seq);
      acks.OnArrival(now, d.payload, !in_order || d.last);
    }
    if (acks.Due(now)) {
      Ack a;
      a.cum = rx.cum();
      a.dsack = dsack;
      dsack = kNone;
      a.sack.resize(kMaxSackBytes);
      a.sack.resize(rx.Sack(a.sack.data(), kMaxSackBytes));
      a.arrival = now + c.one_way;
      acks.OnAckSent();
      ++res.acks_sent;
      if (s_faults.Lost(true)) {
        ++res.acks_dropped;
      } else {
        to_tx.push_back(std::move(a));
      }
    }
    Time next = Time::max();
    if (acks.Pending()) next = acks.Deadline();
    if (!to_rx.empty()) next = std::min(next, std::max(now, to_rx.front().arrival));
    if (n == kRxPerPoll) next = now;
    return next;
  };

  Time s_next = start, r_next = Time::max();
  Time now = start;
  while (true) {
    const Time s_at = s_next == Time::max() ? s_next : s_avail.At(s_next);
    // The receiver also wakes for data that arrived.
    Time r_due = r_next;
    if (!to_rx.empty()) r_due = std::min(r_due, to_rx.front().arrival);
    const Time r_at = r_due == Time::max() ? r_due : r_avail.At(r_due);
    if (s_at == Time::max() && r_at == Time::max()) break;
    if (s_at <= r_at) {
      now = std::max(now, s_at);
      s_next = sender_step(now);
      if (s_next <= now) s_next = now + us(1);
    } else {
      now = std::max(now, r_at);
      r_next = receiver_step(now);
      if (r_next <= now && r_next != Time::max()) r_next = now + us(1);
    }
    if (next_new == total && s.scoreboard().empty()) {
      res.completed = true;
      break;
    }
    if (now >= limit) break;
    // Acks queued for the sender wake it.
    if (!to_tx.empty()) s_next = std::min(s_next, to_tx.front().arrival);
  }
  res.elapsed = std::chrono::duration_cast<us>(now - start);
  res.sender = s.counters();
  res.final_srtt = s.rtt().srtt();
  res.final_rto = s.rtt().rto();
  return res;
}

}  // namespace transport
}  // namespace optireduce
