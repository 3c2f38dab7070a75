// engine_options.h — the protocol engine's settings, the same for every backend. A
// device factory takes them beside its backend's attr (transport_dpdk/device.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace optireduce {
namespace transport {

// Protocol engine settings shared by every backend.
struct EngineOptions {
  // Per-job token carried by every packet. 0: each context draws a random
  // one and the job adopts rank 0's (it travels in the Gloo Address).
  uint64_t session_token = 0;
  // Fault injection spec (see fault_injector.h); empty: none.
  std::string faults;
  // Messages up to this size are sent eagerly (without a grant) while the
  // peer's eager budget lasts; larger ones use rendezvous.
  size_t eager_max_message = 64 * 1024;
  // Bytes of unmatched eager messages a receiver holds per sending peer.
  size_t eager_budget_per_peer = 1 << 20;
  // Bytes in flight (unacknowledged) per peer. The engine further divides
  // the receive buffer among the context's peers (incast).
  size_t window_bytes = 4 << 20;
  // Backoff of the progress thread (and of a user thread that polls the device while it
  // waits for a completion, engine_waiter.cc) on backends whose waits are timers only
  // (DPDK ports): spin this long after the last work (each empty poll of the spin
  // yields the core to any other runnable thread: with more busy threads than
  // cores, those produce what is polled for), then sleep doubling up to
  // max_sleep. On backends whose wait returns when a datagram arrives (udp,
  // loop: IoWaits::WakesOnInput) it spins input_spin, yielding the same way
  // (an answer that comes within it is taken without a wake-up of the thread),
  // and then sleeps until its next timer (at most max_sleep). After PollBackoff::kIdleAfter (100 ms, poll_backoff.h) without work the device is
  // idle: a timer-only backend sleeps up to idle_sleep between polls (input that
  // arrives meanwhile waits that long, but a user's post wakes the thread at
  // once), an input-waking one until its next timer or liveness check (at most
  // 50 ms). An idle device so costs a few wake-ups per 10 ms, not one per ms.
  std::chrono::microseconds spin{100};
  std::chrono::microseconds input_spin{50};
  std::chrono::microseconds max_sleep{1000};
  std::chrono::microseconds idle_sleep{4000};
  bool busy_poll = false;  // never sleep (dedicated cores only)
  // Bounded service (OptiReduce mode): payload bytes per unreliable packet
  // (a lost packet loses this much; rounded down to a multiple of 64 and
  // capped by the backend's datagram size: DPDK frames keep it near the MTU)
  // and the pacing rate of a device's unreliable sends, which carry no
  // acknowledgements to clock them (0: unpaced). Keep it below the receivers'
  // drain rate: unpaced, a 16 MiB shard overruns a loopback receiver's 8 MiB
  // socket buffer whenever its progress thread waits for a core (most phases
  // then lose data and repair). With 32 MiB socket buffers, 40 Gb/s loses
  // nothing at 16 and 64 MiB buckets with 4 ranks on 2 cores and is faster
  // than lower rates; set it near the link rate.
  size_t bounded_payload = 32768;
  double bounded_rate_gbps = 40.0;
  // Peers a context's bounded sends go to at once, at start (the endpoint
  // adapts it from observed loss): 1 keeps TAR's staggered order, one sender
  // per receiver per step.
  int bounded_senders = 1;
  // Retransmission timeout bounds.
  std::chrono::microseconds min_rto{4000};
  std::chrono::microseconds initial_rto{20000};
  std::chrono::microseconds max_rto{200000};
  // After a context is destroyed, keep acknowledging its peers until they
  // have been quiet this long (and our own sends are acked), at most
  // linger_max. The device destructor waits for lingering contexts.
  std::chrono::microseconds linger_quiet{400000};  // 2 x max_rto
  std::chrono::microseconds linger_max{2000000};
  // Silence bound of peer liveness (reliable/peer_liveness.h): a peer that
  // something is pending with and that stays silent this long (PINGs unanswered)
  // is gone: the context fails (every pending and later operation raises
  // gloo::IoException naming it). 0 (the default): no bound — silence fails
  // nothing, each wait's timeout decides, as on Gloo's TCP transport. A proven
  // death (a verified unreachable report) fails the context at once either way.
  // Otherwise 10..3600000 ms; gloo_ext sets it from OPTIREDUCE_PEER_DEAD_MS.
  std::chrono::milliseconds peer_dead{0};
};

}  // namespace transport
}  // namespace optireduce
