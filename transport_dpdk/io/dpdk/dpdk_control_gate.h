// dpdk_control_gate.h — keeps the EAL interrupt thread and our memif datapath apart.
//
// The net_memif PMD runs its control channel (connect, disconnect) in the EAL
// interrupt thread. When the peer process exits or is killed, that thread
// clears the port's "connected" flag and then unmaps the shared memory the
// link's rings and buffers live in. The PMD's rx/tx check the flag once, at
// the start of a burst: a burst that began before the flag was cleared keeps
// copying into or out of memory that is unmapped under it, and the process
// dies with SIGSEGV. The PMD offers no lock or callback around its teardown.
//
// The gate serialises the two with public EAL API only. It registers an
// always-readable eventfd as an interrupt source; the interrupt thread calls
// our callback for it in every round of its event loop, and the callback
// "parks" the thread there for a short period (kParkPeriod). The datapath
// touches memif ports only while the thread is parked, so no memif control
// handler (nor any other interrupt callback) runs during a memif burst. When
// the period ends, the callback waits for bursts in progress to finish,
// returns, the thread serves whatever else is ready (a disconnect unmaps only
// then) and parks again at once. A period that ends while a pass is held is
// extended in steps of kDeferRetry until no pass is held (at most kDeferLimit,
// then the thread closes the gate and waits for the holder): the gate closes
// only at a moment no burst runs, so it stays closed just while the interrupt
// thread, already running, goes round its loop, and not while that thread
// waits to be scheduled again after a holder finishes (on a host with more
// busy threads than cores that took hundreds of microseconds per round).
// Control events so wait at most about two periods plus kDeferLimit; datapath
// calls made while the thread is out skip the memif ports (nothing is
// received, frames wait in the TX backlog). The period is
// kParkPeriod while frames move and doubles up to kIdleParkPeriod while none
// do, so an idle process wakes its interrupt thread rarely; it is
// kConnectParkPeriod while a memif link is still connecting.
//
// One gate per process, created on first use and never destroyed (the
// interrupt thread may sit in it when the process exits).
#pragma once

#include <chrono>

#include "absl/status/statusor.h"

namespace optireduce {
namespace transport {
namespace dpdk {

class ControlGate {
 public:
  // How long the interrupt thread stays parked per round.
  static constexpr std::chrono::microseconds kParkPeriod{1000};
  static constexpr std::chrono::microseconds kIdleParkPeriod{8000};
  // While a memif link connects: its handshake takes one message per round at best.
  static constexpr std::chrono::microseconds kConnectParkPeriod{100};
  // A period ending while a pass is held is extended by this, again while one is
  // held, for at most kDeferLimit in all (a burst takes microseconds).
  static constexpr std::chrono::microseconds kDeferRetry{50};
  static constexpr std::chrono::milliseconds kDeferLimit{100};

  // The process's gate, installed in the EAL interrupt thread on the first call
  // (the EAL must be initialised). Thread-safe.
  static absl::StatusOr<ControlGate*> Get();

  // Permission to call into memif ports, held for one datapath call. Moves
  // only; leaving the scope gives it back.
  class Pass {
   public:
    Pass() = default;
    Pass(Pass&& o) noexcept : gate_(o.gate_) { o.gate_ = nullptr; }
    Pass& operator=(Pass&& o) noexcept;
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    ~Pass() { Release(); }
    explicit operator bool() const { return gate_ != nullptr; }
    void Release();

   private:
    friend class ControlGate;
    explicit Pass(ControlGate* g) : gate_(g) {}
    ControlGate* gate_ = nullptr;
  };

  // A pass if the interrupt thread is parked now, else an empty one (the
  // caller skips its memif ports this time). Never blocks for long.
  Pass TryEnter();
  // Waits until the interrupt thread is parked (about two periods at most),
  // for port start/stop, which must not run beside the PMD's control handler.
  // Empty after kEnterLimit (an interrupt thread stuck elsewhere): the caller
  // goes ahead ungated. Never call it from the interrupt thread or while
  // holding a pass.
  static constexpr std::chrono::seconds kEnterLimit{1};
  Pass Enter();

  // The datapath moved frames on a memif port (keeps the rounds short).
  void NoteTraffic();

  // A memif port's link is not up yet (short rounds for its handshake).
  void NoteConnecting();

  // Rounds the interrupt thread has been parked (tests, diagnostics).
  uint64_t parks() const;
  // Times a round's end was put off because a pass was held (kDeferRetry each).
  uint64_t deferrals() const;
  // Rounds that closed the gate while a pass was still held (after kDeferLimit).
  uint64_t closes_with_pass_held() const;

 private:
  ControlGate() = default;
  struct State;
  static void Park(void* arg);
  void Leave();
  State* s_ = nullptr;
};

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
