// The progress loop: the thread that polls the device (Run, Poll), hands every
// datagram to the receive path, pumps every peer's sends, and the transmit batch that
// collects what goes out (Emit, FillHeader) and hands it to the device (Flush).
#include "transport_dpdk/engine/engine_impl.h"
#include "transport_dpdk/engine/poll_backoff.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

namespace optireduce {
namespace transport {
using namespace engine_internal;  // NOLINT: the engine's own state (engine_state.h)

void Engine::Impl::Run() {
  clockid_t cid;
  if (pthread_getcpuclockid(pthread_self(), &cid) == 0) {
    thread_clock = cid;
    have_clock = true;
  }
  // Spin after work, then sleep until input or the next timer, or back off on a
  // timer-only backend (poll_backoff.h).
  PollBackoff backoff(opts, wakes_on_input, liveness_every, Clock::now());
  // How the last sleep ended: 0 none since the last poll, 1 early, 2 at its timeout.
  int slept = 0;
  // While a user thread polls the input (engine_waiter.cc) this thread waits for Wake()
  // only, for wake_only_sleep: from waiter_handoff, doubling while the same waiter stays
  // (up to the liveness interval), so that after the waiter left the input is watched
  // again soon.
  us wake_only_sleep = waiter_handoff;
  uint64_t exits_seen = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    Clock::time_point deadline;
    bool worked;
    us wait{0};
    bool spinning = false;  // an empty poll within the spin after the last work
    bool wake_only = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      const uint64_t rx_before = stats.rx_packets.load(std::memory_order_relaxed);
      Bump(stats.progress_polls);
      worked = Poll(&deadline);
      const bool received = stats.rx_packets.load(std::memory_order_relaxed) != rx_before;
      if (slept != 0 && received) {
        Bump(slept == 1 ? stats.sleeps_woken_by_input : stats.late_inputs);
      }
      // What this poll took in may have completed the waiter's receive.
      if (received) WakeWaiterIfOthers();
      slept = 0;
      const auto now = Clock::now();
      if (kicked) {
        kicked = false;
        backoff.Restart(now);
      }
      if (!opts.busy_poll && waiter_active.load(std::memory_order_relaxed)) {
        wake_only_sleep = waiter_exits != exits_seen
                              ? waiter_handoff
                              : std::min(wake_only_sleep * 2,
                                         std::chrono::duration_cast<us>(liveness_every));
        exits_seen = waiter_exits;
        wait = deadline > now
                   ? std::min(wake_only_sleep,
                              std::chrono::duration_cast<us>(deadline - now) + us(1))
                   : us(0);
        if (wait.count() > 0) {
          sleeping_until = now + wait;
          wake_only = progress_waits_for_wake = true;
        }
      } else if (!opts.busy_poll) {
        switch (backoff.After(now, worked, deadline, &wait)) {
          case PollBackoff::Next::kPollNow:
            break;
          case PollBackoff::Next::kYield:
            spinning = true;
            break;
          case PollBackoff::Next::kSleep:
            // Published under the lock: a user thread that queues work with an earlier
            // timer than this (Kick) wakes the thread; otherwise it lets it sleep.
            sleeping_until = now + wait;
            break;
        }
      }
    }
    if (wait.count() <= 0) {
      // Spinning: give the core to any other runnable thread first (the application's,
      // a peer rank's), which on a host with more busy threads than cores is who
      // produces the input being polled for. (A poll that is due at once for a timer
      // does not yield.)
      if (spinning) {
        Bump(stats.progress_yields);
        sched_yield();
      }
      continue;
    }
    Bump(stats.progress_sleeps);
    const auto t0 = Clock::now();
    if (wake_only) {
      waits.WaitForWake(wait);
    } else {
      waits.WaitForInput(wait);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      sleeping_until = Clock::time_point::max();
      progress_waits_for_wake = false;
    }
    slept = Clock::now() - t0 < wait ? 1 : 2;
  }
}

bool Engine::Impl::Poll(Clock::time_point* deadline) {
  bool worked = false;
  for (int round = 0; round < 4; ++round) {
    const size_t n = io->RxBurst(rx, kBurst);
    for (size_t i = 0; i < n; ++i) HandleDatagram(rx[i].data, rx[i].len);
    if (n) worked = true;
    if (n < kBurst) break;
  }
  const auto now = Clock::now();
  // Timers below bring it closer; Run caps the sleep (max_sleep, or longer when idle).
  *deadline = now + std::max<Clock::duration>(liveness_every, opts.max_sleep);
  tx_blocked = false;
  const uint64_t sent_before = stats.tx_packets.load(std::memory_order_relaxed);
  TakeUnreachable();
  if (now >= next_liveness) {
    next_liveness = now + liveness_every;
    CheckLiveness(now);
  }
  *deadline = std::min(*deadline, next_liveness);
  for (auto& kv : contexts) {
    Ctx& c = *kv.second;
    if (c.failed) continue;
    for (Peer& p : c.peers) {
      if (p.connected) Pump(c, p, now, deadline);
    }
    PumpBoundedSends(c, now, deadline);
  }
  Flush();
  if (stats.tx_packets.load(std::memory_order_relaxed) != sent_before) {
    worked = true;
  }
  ReapClosing(now);
  return worked;
}

void Engine::Impl::Flush() {
  if (tx_n == 0) return;
  size_t sent = io->TxBurst(tx, tx_n);
  for (size_t i = 0; i < sent; ++i) {
    Bump(stats.tx_bytes, tx[i].head_len + tx[i].body_len);
  }
  Bump(stats.tx_packets, sent);
  if (sent < tx_n) {
    // Refused datagrams are lost at once: reliable packets are resent as
    // soon as the device takes more (no timeout, no congestion response),
    // acks are owed again.
    Bump(stats.tx_backpressure, tx_n - sent);
    tx_blocked = true;
    for (size_t i = sent; i < tx_n; ++i) {
      Peer* p = tx_peer[i];
      if (!p) continue;
      if (tx_seq[i] != kNoSeq && p->sender) {
        p->sender->OnLocalDrop(tx_seq[i]);
      } else if (tx_is_ack[i] && p->acks) {
        p->acks->OnArrival(Clock::now(), 0, /*urgent=*/true);
      }
    }
  }
  tx_n = 0;
}

void Engine::Impl::Emit(Peer& p, const WireHeader& h, const void* body,
                        uint32_t len) {
  EmitTo(&p, p.handle, h, body, len);
}

void Engine::Impl::EmitTo(Peer* p, PeerHandle handle, const WireHeader& h, const void* body,
                          uint32_t len) {
  if (tx_n == kBurst) Flush();
  const bool unreliable = (h.flags & kFlagUnreliable) != 0;
  const bool ack = static_cast<PacketType>(h.type) == PacketType::kAck;
  tx_peer[tx_n] = p;
  tx_seq[tx_n] = unreliable || ack ? kNoSeq : h.seq;
  tx_is_ack[tx_n] = ack && !unreliable;
  if (link_protects_payload) {
    WireHeader scoped = h;
    scoped.flags |= kFlagHeaderChecksum;
    EncodeHeader(scoped, body, len, tx_head[tx_n]);
  } else {
    EncodeHeader(h, body, len, tx_head[tx_n]);
  }
  tx[tx_n] = {handle, tx_head[tx_n], static_cast<uint32_t>(kHeaderBytes), body, len};
  ++tx_n;
}

void Engine::Impl::FillHeader(const Ctx& c, const Peer& p,
                              WireHeader* h) const {
  h->session_token = c.token;
  h->src_rank = static_cast<uint32_t>(c.rank);
  h->dst_rank = static_cast<uint32_t>(p.rank);
  h->dst_context = p.remote_ctx;
}

}  // namespace transport
}  // namespace optireduce
