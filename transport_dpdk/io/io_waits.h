// io_waits.h — how a thread that polls a backend's input sleeps between polls, and how
// other threads end that sleep: the small interface the engine's wait policy
// (poll_backoff.h, engine_loop.cc, engine_waiter.cc) uses. Every backend implements it
// beside PacketIo and hands it out with PacketIo::Waits().
//
// Threading: WaitForInput and WaitForWake are called only by the progress thread,
// WaitAsWaiter only by the one user thread that polls the engine while it waits for a
// completion (engine_waiter.cc), all without the engine's lock; they may overlap a
// TxBurst. Wake() and WakeWaiter() may be called from any thread at any time.
#pragma once

#include <chrono>

namespace optireduce {
namespace transport {

// The waits of one backend's input: how a thread that polls it sleeps until input may be
// there, and how other threads end that sleep.
class IoWaits {
 public:
  virtual ~IoWaits() = default;

  // Blocks until input may be available, Wake() is called, or timeout
  // passes (spurious returns are allowed). Used by the engine's backoff.
  virtual void WaitForInput(std::chrono::microseconds timeout) = 0;

  // Makes a concurrent or the next WaitForInput (or WaitForWake) return promptly.
  virtual void Wake() = 0;

  // The two threads that may poll the input wait apart: while a user thread polls the
  // engine for its completion (engine_waiter.cc), it waits in WaitAsWaiter (input, where
  // the backend wakes on it, or WakeWaiter() end it) and the progress thread in
  // WaitForWake (only Wake() or the timeout end it), so that one arrival wakes one
  // thread. The defaults are the plain wait and wake (both threads then share them).
  virtual void WaitForWake(std::chrono::microseconds timeout) { WaitForInput(timeout); }
  virtual void WaitAsWaiter(std::chrono::microseconds timeout) { WaitForInput(timeout); }
  virtual void WakeWaiter() { Wake(); }

  // True if WaitForInput returns as soon as a datagram arrives (udp: ppoll on the socket;
  // loop: its queue's condition variable), so the engine's progress thread may sleep until
  // its next timer (after EngineOptions::input_spin). False: waits are timers only (DPDK
  // ports have no descriptor to wait on in general), and the engine spins after work and
  // then sleeps for doubling timeouts.
  virtual bool WakesOnInput() const { return false; }
};

}  // namespace transport
}  // namespace optireduce
