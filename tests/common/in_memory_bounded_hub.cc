#include "tests/common/in_memory_bounded_hub.h"

#include <algorithm>
#include <atomic>
#include <vector>

namespace optireduce {
namespace testing {

class InMemoryBoundedHub::Endpoint : public BoundedChannel {
 public:
  Endpoint(InMemoryBoundedHub* hub, int rank, double drop, uint64_t seed, size_t payload)
      : hub_(hub), rank_(rank), drop_(drop), rng_(seed), payload_(payload) {}

  void BeginOperation(uint64_t op, uint64_t) override { handover_.Begin(op); }
  // The leader's answer comes at once, as its engine answers on its progress thread.
  CedeAnswer AskToCede(int leader, uint64_t op, BoundedClock::time_point) override {
    Endpoint& l = *hub_->endpoints_[leader];
    if (l.exited) return CedeAnswer::kNoAnswer;
    const bool ceded = l.handover_.OnAsk(op);
    if (hub_->lost_cede_answer_ && !hub_->cede_answer_lost_.exchange(true)) {
      hub_->lost_cede_answer_(leader, rank_, op);
      return CedeAnswer::kNoAnswer;
    }
    return ceded ? CedeAnswer::kCeded : CedeAnswer::kRefused;
  }
  bool Ceded(uint64_t op) const override { return handover_.Ceded(op); }

  std::unique_ptr<BoundedReceive> PostReceive(uint64_t op,
                                              std::vector<BoundedRegion> regions) override {
    return receiver_.Post(op, std::move(regions),
                          [this](int peer, uint64_t op, const std::vector<ByteRange>& missing) {
                            hub_->endpoints_[peer]->Serve(rank_, op, missing);
                          });
  }

  void Send(int peer, uint64_t op, const void* src, size_t nbytes, bool estimated) override {
    sources_.Register(op, peer, src, nbytes, estimated);
    struct Noted {  // after the packets went
      InMemoryBoundedHub* hub;
      int src, dst;
      uint64_t op;
      ~Noted() {
        {
          std::lock_guard<std::mutex> lock(hub->sent_mu_);
          hub->sent_.emplace(src, dst, op);
        }
        hub->sent_cv_.notify_all();
      }
    } noted{hub_, rank_, peer, op};
    const size_t packets = (nbytes + payload_ - 1) / payload_;
    const size_t last_from = packets - std::max<size_t>(1, packets / 100);
    for (size_t i = 0; i < packets; i++) {
      const size_t off = i * payload_;
      const char* data = static_cast<const char*>(src) + off;
      const size_t len = std::min(payload_, nbytes - off);
      if (hold_last_phase2 && (op & 1) && i + 1 == packets) {
        std::lock_guard<std::mutex> lock(mu_);
        held_.push_back({peer, op, std::vector<char>(data, data + len), off, estimated});
        continue;
      }
      Deliver(peer, op, data, off, len, i >= last_from, estimated, false);
    }
  }

  void FinishSends(uint64_t op, BoundedClock::time_point) override {
    std::vector<Held> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = held_.begin(); it != held_.end();) {
        if (it->op == op) {
          out.push_back(std::move(*it));
          it = held_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const Held& h : out) {
      Deliver(h.peer, h.op, h.bytes.data(), h.offset, h.bytes.size(), true, h.estimated, false);
    }
  }

  void Exit() {
    exited = true;
    std::lock_guard<std::mutex> lock(mu_);
    held_.clear();
  }

  void Detach(uint64_t op) override { sources_.Detach(op); }
  void Release(uint64_t op) override { sources_.Release(op); }
  size_t PacketPayload() const override { return payload_; }
  bool HasUnpostedData(uint64_t op) const override { return receiver_.HasStaged(op); }
  void OnOperationDone(double loss_fraction, bool) override {
    std::lock_guard<std::mutex> lock(mu_);
    loss_reports_.push_back(loss_fraction);
  }
  std::vector<double> loss_reports() const {
    std::lock_guard<std::mutex> lock(mu_);
    return loss_reports_;
  }

  // A peer asks for `missing` ranges of what this rank sent it as `op`; what this rank
  // cannot send (released, or not started) it says so, as the engine does.
  void Serve(int peer, uint64_t op, const std::vector<ByteRange>& missing) {
    if (exited) return;
    const auto access = sources_.With(op, peer, [&](const char* src, size_t nbytes, bool estimated) {
      for (const ByteRange& r : missing) {
        for (size_t off = r.begin; off < std::min(r.end, nbytes); off += payload_) {
          Deliver(peer, op, src + off, off, std::min({payload_, r.end - off, nbytes - off}),
                  false, estimated, true);
        }
      }
    });
    if (access == transport::BoundedSources::Access::kGone ||
        access == transport::BoundedSources::Access::kNotStarted) {
      hub_->endpoints_[peer]->receiver().OnAbsent(
          op, rank_, access == transport::BoundedSources::Access::kNotStarted);
    }
  }

  transport::BoundedReceiver& receiver() { return receiver_; }
  std::atomic<uint64_t> sent{0}, dropped{0};
  std::atomic<bool> hold_last_phase2{false}, exited{false};

 private:
  struct Held {
    int peer;
    uint64_t op;
    std::vector<char> bytes;
    size_t offset;
    bool estimated;
  };

  void Deliver(int peer, uint64_t op, const char* data, size_t offset, size_t len, bool last,
               bool estimated, bool repair) {
    if (exited) return;
    sent++;
    bool lose = hub_->drop_if_ && hub_->drop_if_(rank_, peer, op, offset, repair);
    if (!lose) {
      std::lock_guard<std::mutex> lock(mu_);
      lose = std::uniform_real_distribution<double>(0, 1)(rng_) < drop_;
    }
    if (lose) {
      dropped++;
      return;
    }
    hub_->endpoints_[peer]->receiver().OnData(op, rank_, offset, data, len, last, estimated);
  }

  InMemoryBoundedHub* hub_;
  const int rank_;
  const double drop_;
  mutable std::mutex mu_;
  std::mt19937_64 rng_;
  const size_t payload_;
  std::vector<Held> held_;  // under mu_
  std::vector<double> loss_reports_;  // under mu_: OnOperationDone's, in order
  transport::BoundedReceiver receiver_;
  transport::BoundedSources sources_;
  transport::DecisionHandover handover_;
};

InMemoryBoundedHub::InMemoryBoundedHub(int size, double drop, uint64_t seed, size_t payload) {
  for (int r = 0; r < size; r++) {
    endpoints_.push_back(std::make_unique<Endpoint>(this, r, drop, seed * 1000 + r, payload));
  }
}

InMemoryBoundedHub::~InMemoryBoundedHub() = default;

BoundedChannel* InMemoryBoundedHub::channel(int rank) { return endpoints_[rank].get(); }

void InMemoryBoundedHub::HoldLastPhase2Packets(int rank) {
  endpoints_[rank]->hold_last_phase2 = true;
}

void InMemoryBoundedHub::Exit(int rank) { endpoints_[rank]->Exit(); }

bool InMemoryBoundedHub::WaitSent(int src, int dst, uint64_t op,
                                  std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(sent_mu_);
  return sent_cv_.wait_for(lock, timeout,
                           [&] { return sent_.count(std::make_tuple(src, dst, op)) > 0; });
}

transport::BoundedReceiverCounters InMemoryBoundedHub::counters(int rank) const {
  return endpoints_[rank]->receiver().counters();
}

std::vector<double> InMemoryBoundedHub::loss_reports(int rank) const {
  return endpoints_[rank]->loss_reports();
}

uint64_t InMemoryBoundedHub::sent_packets() const {
  uint64_t n = 0;
  for (const auto& e : endpoints_) n += e->sent;
  return n;
}

uint64_t InMemoryBoundedHub::dropped_packets() const {
  uint64_t n = 0;
  for (const auto& e : endpoints_) n += e->dropped;
  return n;
}

}  // namespace testing
}  // namespace optireduce
