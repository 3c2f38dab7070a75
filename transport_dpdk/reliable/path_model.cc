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

namespace {

// One run: the sender, the receiver and the link between them, stepped by Run.
class Model {
 public:
  explicit Model(const PathModelConfig& c)
      : c_(c),
        s_(c.sender),
        acks_(c.ack_every, c.window / 4, c.ack_delay),
        s_avail_(c, c.seed * 4 + 1),
        r_avail_(c, c.seed * 4 + 2),
        r_faults_(c, c.seed * 4 + 3),
        s_faults_(c, c.seed * 4 + 4),
        total_((c.message_bytes + c.payload - 1) / c.payload),
        sizes_(total_),
        acked_(total_, false),
        ns_per_byte_(8.0 / c.gbps) {
    for (uint64_t i = 0; i < total_; ++i) {
      sizes_[i] = static_cast<uint32_t>(
          std::min<uint64_t>(c.payload, c.message_bytes - i * c.payload));
    }
  }

  PathModelResult Run();

 private:
  void Transmit(uint64_t seq, Time now);
  void SendNew(Time now);
  bool Room() const {
    return next_new_ < total_ && unacked_payload_ + c_.payload <= c_.window &&
           next_new_ - s_.scoreboard().base() < ReceiveWindow::kSpan / 2;
  }
  Time SenderStep(Time now);
  Time ReceiverStep(Time now);

  const PathModelConfig& c_;
  PathModelResult res_;
  ReliableSender s_;
  ReceiveWindow rx_;
  AckScheduler acks_;
  Availability s_avail_, r_avail_;
  Faults r_faults_, s_faults_;
  const uint64_t total_;
  std::vector<uint32_t> sizes_;
  std::vector<bool> acked_;
  uint64_t next_new_ = 0, unacked_payload_ = 0;
  std::deque<Data> to_rx_;  // on the wire / queued at the receiver (FIFO link)
  std::deque<Ack> to_tx_;   // acks on the way back
  Time link_free_{};
  const double ns_per_byte_;
  uint64_t dsack_ = kNone;
};

void Model::Transmit(uint64_t seq, Time now) {
  const uint32_t bytes = sizes_[seq] + c_.header;
  link_free_ = std::max(link_free_, now) +
               std::chrono::nanoseconds(static_cast<long>(bytes * ns_per_byte_));
  const Time arrival = link_free_ + c_.one_way;
  if (r_faults_.Lost(false)) {
    ++res_.data_dropped;
    res_.data_bytes_dropped += sizes_[seq];
    return;
  }
  to_rx_.push_back({arrival, seq, sizes_[seq], seq + 1 == total_});
}

void Model::SendNew(Time now) {
  const uint64_t seq = next_new_++;
  unacked_payload_ += sizes_[seq];
  s_.OnSendNew(seq, sizes_[seq] + c_.header, now);
  Transmit(seq, now);
}

// The sender's work at `now` (engine Poll + Pump); returns its next deadline.
Time Model::SenderStep(Time now) {
  size_t n = 0;
  while (!to_tx_.empty() && to_tx_.front().arrival <= now && n < kRxPerPoll) {
    Ack a = std::move(to_tx_.front());
    to_tx_.pop_front();
    ++n;
    s_.OnAck(a.cum, a.sack.data(), a.sack.size(), a.dsack, now, [&](uint64_t seq) {
      if (!acked_[seq]) {
        acked_[seq] = true;
        unacked_payload_ -= sizes_[seq];
      }
    });
  }
  s_.OnTimer(now);
  res_.max_rto = std::max(res_.max_rto, s_.rtt().rto());
  for (uint64_t seq; (seq = s_.NextRetransmit(now)) != kNone;) {
    s_.OnRetransmit(seq, now);
    Transmit(seq, now);
  }
  if (s_.probe_pending()) {
    if (Room()) {
      const uint64_t seq = next_new_;
      SendNew(now);
      s_.OnProbeSent(seq);
    } else if (s_.ProbeSeq() != kNone) {
      const uint64_t seq = s_.ProbeSeq();
      s_.OnRetransmit(seq, now);
      Transmit(seq, now);
      s_.OnProbeSent(seq);
    } else {
      s_.OnProbeSent(kNone);
    }
  }
  for (int budget = kPeerBudget; budget > 0 && Room() &&
                                 s_.CanSendNew(c_.payload + c_.header, now);
       --budget) {
    SendNew(now);
  }
  Time next = s_.Deadline(now);
  if (Room() && next > now + us(1)) {
    // More new data may be allowed soon (pacing) or after the next ack.
    if (s_.CanSendNew(c_.payload + c_.header, now)) next = now + us(1);
  }
  if (!to_tx_.empty()) next = std::min(next, std::max(now, to_tx_.front().arrival));
  if (n == kRxPerPoll) next = now;  // more acks waiting
  return next;
}

// The receiver's work at `now`; returns its next deadline.
Time Model::ReceiverStep(Time now) {
  size_t n = 0;
  while (!to_rx_.empty() && to_rx_.front().arrival <= now && n < kRxPerPoll) {
    const Data d = to_rx_.front();
    to_rx_.pop_front();
    ++n;
    switch (rx_.Classify(d.seq)) {
      case ReceiveWindow::Verdict::kDuplicate:
        ++res_.duplicates;
        dsack_ = d.seq;
        acks_.OnArrival(now, 0, true);
        continue;
      case ReceiveWindow::Verdict::kOutOfWindow:
        continue;
      case ReceiveWindow::Verdict::kNew:
        break;
    }
    const bool in_order = d.seq == rx_.cum() && rx_.highest() <= d.seq;
    rx_.Mark(d.seq);
    acks_.OnArrival(now, d.payload, !in_order || d.last);
  }
  if (acks_.Due(now)) {
    Ack a;
    a.cum = rx_.cum();
    a.dsack = dsack_;
    dsack_ = kNone;
    a.sack.resize(kMaxSackBytes);
    a.sack.resize(rx_.Sack(a.sack.data(), kMaxSackBytes));
    a.arrival = now + c_.one_way;
    acks_.OnAckSent();
    ++res_.acks_sent;
    if (s_faults_.Lost(true)) {
      ++res_.acks_dropped;
    } else {
      to_tx_.push_back(std::move(a));
    }
  }
  Time next = Time::max();
  if (acks_.Pending()) next = acks_.Deadline();
  if (!to_rx_.empty()) next = std::min(next, std::max(now, to_rx_.front().arrival));
  if (n == kRxPerPoll) next = now;
  return next;
}

PathModelResult Model::Run() {
  const Time start = Time{} + std::chrono::seconds(1);
  const Time limit = start + c_.limit;
  Time s_next = start, r_next = Time::max();
  Time now = start;
  while (true) {
    const Time s_at = s_next == Time::max() ? s_next : s_avail_.At(s_next);
    // The receiver also wakes for data that arrived.
    Time r_due = r_next;
    if (!to_rx_.empty()) r_due = std::min(r_due, to_rx_.front().arrival);
    const Time r_at = r_due == Time::max() ? r_due : r_avail_.At(r_due);
    if (s_at == Time::max() && r_at == Time::max()) break;
    if (s_at <= r_at) {
      now = std::max(now, s_at);
      s_next = SenderStep(now);
      if (s_next <= now) s_next = now + us(1);
    } else {
      now = std::max(now, r_at);
      r_next = ReceiverStep(now);
      if (r_next <= now && r_next != Time::max()) r_next = now + us(1);
    }
    if (next_new_ == total_ && s_.scoreboard().empty()) {
      res_.completed = true;
      break;
    }
    if (now >= limit) break;
    // Acks queued for the sender wake it.
    if (!to_tx_.empty()) s_next = std::min(s_next, to_tx_.front().arrival);
  }
  res_.elapsed = std::chrono::duration_cast<us>(now - start);
  res_.sender = s_.counters();
  res_.final_srtt = s_.rtt().srtt();
  res_.final_rto = s_.rtt().rto();
  return res_;
}

}  // namespace

PathModelResult RunPathModel(const PathModelConfig& c) { return Model(c).Run(); }

}  // namespace transport
}  // namespace optireduce
