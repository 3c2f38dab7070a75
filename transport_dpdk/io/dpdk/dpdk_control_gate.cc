#include "transport_dpdk/io/dpdk/dpdk_control_gate.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include <rte_errno.h>
#include <rte_interrupts.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {
namespace dpdk {

struct ControlGate::State {
  std::mutex mu;
  std::condition_variable parked_cv;  // Enter waits for parked
  std::condition_variable users_cv;   // Park waits for users == 0
  std::condition_variable sleep_cv;   // Park's timed sleep: never notified
  bool parked = false;  // the interrupt thread is inside Park
  int users = 0;        // passes held
  uint64_t parks = 0;
  uint64_t deferrals = 0;            // round ends put off because a pass was held
  uint64_t closes_with_pass_held = 0;  // rounds that closed the gate on a held pass
  std::chrono::microseconds period = kParkPeriod;
  bool traffic = false;     // NoteTraffic since the last round
  bool connecting = false;  // NoteConnecting since the last round
  rte_intr_handle* handle = nullptr;
  int fd = -1;
};

ControlGate::Pass& ControlGate::Pass::operator=(Pass&& o) noexcept {
  if (this != &o) {
    Release();
    gate_ = o.gate_;
    o.gate_ = nullptr;
  }
  return *this;
}

void ControlGate::Pass::Release() {
  if (gate_) gate_->Leave();
  gate_ = nullptr;
}

absl::StatusOr<ControlGate*> ControlGate::Get() {
  static std::mutex mu;
  static ControlGate* gate = nullptr;  // never freed: the interrupt thread may be in Park
  static absl::Status failed;
  std::lock_guard<std::mutex> lock(mu);
  if (gate) return gate;
  if (!failed.ok()) return failed;
  auto* g = new ControlGate();
  g->s_ = new State();
  // An eventfd with a count that is never read stays readable: the EAL's
  // level-triggered epoll reports it in every round (RTE_INTR_HANDLE_EXT
  // sources are not read by the EAL).
  g->s_->fd = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);
  if (g->s_->fd < 0) {
    failed = absl::InternalError(absl::StrCat("dpdk control gate: eventfd: ", std::strerror(errno)));
    return failed;
  }
  g->s_->handle = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
  if (g->s_->handle == nullptr) {
    failed = absl::ResourceExhaustedError(absl::StrCat(
        "dpdk control gate: rte_intr_instance_alloc: ", rte_strerror(rte_errno)));
    return failed;
  }
  int ret = rte_intr_fd_set(g->s_->handle, g->s_->fd);
  if (ret == 0) ret = rte_intr_type_set(g->s_->handle, RTE_INTR_HANDLE_EXT);
  if (ret == 0) ret = rte_intr_callback_register(g->s_->handle, &ControlGate::Park, g);
  if (ret != 0) {
    failed = absl::InternalError(absl::StrCat(
        "dpdk control gate: cannot register with the EAL interrupt thread: ",
        rte_strerror(ret < 0 ? -ret : ret)));
    return failed;
  }
  gate = g;
  return gate;
}

void ControlGate::Park(void* arg) {
  State& s = *static_cast<ControlGate*>(arg)->s_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.parked = true;
  ++s.parks;
  s.parked_cv.notify_all();
  // Short rounds while frames move, longer ones (fewer wake-ups) while idle.
  s.period = s.connecting ? kConnectParkPeriod
             : s.traffic  ? kParkPeriod
                          : std::min(2 * s.period, kIdleParkPeriod);
  s.traffic = s.connecting = false;
  auto until = std::chrono::steady_clock::now() + s.period;
  while (s.sleep_cv.wait_until(lock, until) != std::cv_status::timeout) {
  }
  // Leave at a moment no burst is in progress: the gate is then closed only while this
  // thread runs back to its next round. Closing it while a pass is held would keep it
  // closed until the holder finishes and this thread is scheduled again, which on a
  // host with more busy threads than cores takes far longer than the burst.
  const auto defer_until = until + kDeferLimit;
  while (s.users > 0 && std::chrono::steady_clock::now() < defer_until) {
    ++s.deferrals;
    until = std::chrono::steady_clock::now() + kDeferRetry;
    while (s.sleep_cv.wait_until(lock, until) != std::cv_status::timeout) {
    }
  }
  s.parked = false;
  if (s.users > 0) ++s.closes_with_pass_held;
  // Bursts in progress finish before this thread may run a control handler.
  s.users_cv.wait(lock, [&] { return s.users == 0; });
}

ControlGate::Pass ControlGate::TryEnter() {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->parked) return Pass();
  ++s_->users;
  return Pass(this);
}

ControlGate::Pass ControlGate::Enter() {
  std::unique_lock<std::mutex> lock(s_->mu);
  if (!s_->parked_cv.wait_for(lock, kEnterLimit, [&] { return s_->parked; })) return Pass();
  ++s_->users;
  return Pass(this);
}

void ControlGate::Leave() {
  std::lock_guard<std::mutex> lock(s_->mu);
  // Park waits for the last pass only once it stopped parking.
  if (--s_->users == 0 && !s_->parked) s_->users_cv.notify_one();
}

void ControlGate::NoteTraffic() {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->traffic = true;
}

void ControlGate::NoteConnecting() {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->connecting = true;
}

uint64_t ControlGate::parks() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->parks;
}

uint64_t ControlGate::deferrals() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->deferrals;
}

uint64_t ControlGate::closes_with_pass_held() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->closes_with_pass_held;
}

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
