#include "transport_dpdk/io/loop/packet_io_loop.h"

#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {

class LoopEndpoint {
 public:
  LoopEndpoint(uint32_t id, size_t capacity) : id(id), capacity_(capacity) {}
  const uint32_t id;

  // Returns false when the queue is full (the datagram is dropped).
  bool Push(std::vector<uint8_t> d) {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= capacity_) return false;
    queue_.push_back(std::move(d));
    cv_.notify_all();  // the progress thread may wait for a wake only (Wait)
    return true;
  }
  size_t Pop(std::vector<std::vector<uint8_t>>* out, size_t max) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    while (n < max && !queue_.empty()) {
      out->push_back(std::move(queue_.front()));
      queue_.pop_front();
      ++n;
    }
    return n;
  }
  // The waits of PacketIo: the progress thread's (for input or not, ended by Wake) and
  // the polling user thread's (input or WakeWaiter).
  void Wait(std::chrono::microseconds timeout, bool input) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return woken_ || (input && !queue_.empty()); });
    woken_ = false;
  }
  void WaitAsWaiter(std::chrono::microseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return waiter_woken_ || !queue_.empty(); });
    waiter_woken_ = false;
  }
  void Wake(bool waiter) {
    std::lock_guard<std::mutex> lock(mu_);
    (waiter ? waiter_woken_ : woken_) = true;
    cv_.notify_all();
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> queue_;
  bool woken_ = false;
  bool waiter_woken_ = false;
};

namespace {

// The process-wide registry of loop endpoints.
class Fabric {
 public:
  static Fabric& Get() {
    static Fabric* fabric = new Fabric();  // never destroyed: used at exit
    return *fabric;
  }
  std::shared_ptr<LoopEndpoint> Create(size_t capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    auto ep = std::make_shared<LoopEndpoint>(next_id_++, capacity);
    endpoints_[ep->id] = ep;
    return ep;
  }
  void Remove(uint32_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    endpoints_.erase(id);
  }
  std::shared_ptr<LoopEndpoint> Find(uint32_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = endpoints_.find(id);
    return it == endpoints_.end() ? nullptr : it->second.lock();
  }

 private:
  std::mutex mu_;
  uint32_t next_id_ = 1;
  std::unordered_map<uint32_t, std::weak_ptr<LoopEndpoint>> endpoints_;
};

constexpr uint8_t kLoopTag = 'L';

IoAddress MakeAddress(uint32_t id) {
  IoAddress a{};
  a[0] = kLoopTag;
  const uint32_t pid = static_cast<uint32_t>(getpid());
  std::memcpy(&a[4], &id, 4);
  std::memcpy(&a[8], &pid, 4);
  return a;
}

}  // namespace

LoopPacketIo::LoopPacketIo(size_t max_datagram, size_t queue_capacity)
    : max_datagram_(static_cast<uint32_t>(max_datagram)),
      self_(Fabric::Get().Create(queue_capacity)) {}

LoopPacketIo::~LoopPacketIo() { Fabric::Get().Remove(self_->id); }

std::string LoopPacketIo::Describe() const {
  return absl::StrCat("loop endpoint ", self_->id);
}

IoAddress LoopPacketIo::LocalAddress() const { return MakeAddress(self_->id); }

std::string LoopPacketIo::AddressToString(const IoAddress& a) const {
  uint32_t id = 0, pid = 0;
  std::memcpy(&id, &a[4], 4);
  std::memcpy(&pid, &a[8], 4);
  return absl::StrCat("loop:", id, "@pid", pid);
}

absl::StatusOr<PeerHandle> LoopPacketIo::ResolvePeer(const IoAddress& a) {
  uint32_t id = 0, pid = 0;
  std::memcpy(&id, &a[4], 4);
  std::memcpy(&pid, &a[8], 4);
  if (a[0] != kLoopTag) {
    return absl::InvalidArgumentError("not a loop backend address");
  }
  if (pid != static_cast<uint32_t>(getpid())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loop address ", AddressToString(a),
        " belongs to another process; the loop backend is in-process only"));
  }
  for (size_t i = 0; i < peer_addresses_.size(); ++i) {
    if (peer_addresses_[i] == a) return static_cast<PeerHandle>(i);
  }
  // An endpoint that is already gone resolves to a black hole, like a UDP
  // port nobody listens on: its peer finished and left.
  peers_.push_back(Fabric::Get().Find(id));
  peer_addresses_.push_back(a);
  return static_cast<PeerHandle>(peers_.size() - 1);
}

size_t LoopPacketIo::TxBurst(const TxDatagram* d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (d[i].peer >= peers_.size()) continue;  // dropped
    auto ep = peers_[d[i].peer].lock();
    if (!ep) continue;  // peer gone: the datagram is lost, as on a wire
    std::vector<uint8_t> bytes(d[i].head_len + d[i].body_len);
    std::memcpy(bytes.data(), d[i].head, d[i].head_len);
    if (d[i].body_len) {
      std::memcpy(bytes.data() + d[i].head_len, d[i].body, d[i].body_len);
    }
    ep->Push(std::move(bytes));  // a full queue drops, like a NIC ring
  }
  return n;
}

size_t LoopPacketIo::RxBurst(RxDatagram* out, size_t max) {
  rx_held_.clear();
  const size_t popped = self_->Pop(&rx_held_, max);
  size_t n = 0;
  for (size_t i = 0; i < popped; ++i) {
    // Larger than this endpoint takes: dropped, as a NIC drops frames
    // beyond its MTU (a peer must respect both sides' limits).
    if (rx_held_[i].size() > max_datagram_) continue;
    out[n].data = rx_held_[i].data();
    out[n].len = static_cast<uint32_t>(rx_held_[i].size());
    ++n;
  }
  return n;
}

void LoopPacketIo::WaitForInput(std::chrono::microseconds timeout) {
  self_->Wait(timeout, /*input=*/true);
}

void LoopPacketIo::WaitForWake(std::chrono::microseconds timeout) {
  self_->Wait(timeout, /*input=*/false);
}

void LoopPacketIo::WaitAsWaiter(std::chrono::microseconds timeout) {
  self_->WaitAsWaiter(timeout);
}

void LoopPacketIo::Wake() { self_->Wake(/*waiter=*/false); }

void LoopPacketIo::WakeWaiter() { self_->Wake(/*waiter=*/true); }

}  // namespace transport
}  // namespace optireduce
