// path_model.h — a deterministic model of one reliable path on a virtual clock:
// the engine's sender components (ReliableSender) and receiver components
// (ReceiveWindow, AckScheduler) exchange one message over a link with a fixed
// delay and rate, through seeded faults, with both ends descheduled at random
// (a loaded host), so loss recovery can be measured and tested without
// threads, sockets or real time. Test and benchmark support: built as its own static
// library (optireduce_path_model), not part of liboptireduce, not installed.
//
// The sender is driven as the engine drives it (Engine::Impl::Pump in
// engine/engine_reliable_send.cc, called by the progress loop in engine/engine_loop.cc):
// received acks first (at most kRxPerPoll per wake-up, as the engine's poll), then timers,
// retransmissions, a tail-loss probe, new data within the byte window. The
// receiver handles what arrived, then acks when its AckScheduler says so.
// Faults are decided per datagram on receipt, as transport_dpdk/io/fault_injector
// does: random drop, Gilbert-Elliott bursts (both directions), ack-only drop.
#pragma once

#include <chrono>
#include <cstdint>

#include "transport_dpdk/reliable/reliable_sender.h"

namespace optireduce {
namespace transport {

struct PathModelConfig {
  using us = std::chrono::microseconds;
  ReliableSender::Options sender;  // as the engine sets them (see Defaults)
  uint64_t message_bytes = 4 << 20;
  uint32_t payload = 1400;         // payload bytes of a full packet
  uint32_t header = 64;            // wire bytes added to each packet
  uint64_t window = 4 << 20;       // the receiver's byte window (payload)
  us one_way{20};                  // link delay each way
  double gbps = 10;                // link rate (data direction)
  uint32_t ack_every = 16;         // receiver: ack every N packets...
  us ack_delay{100};               // ...or this long after the first unacked one
  // Faults (each end decides for what it receives).
  double drop = 0, burst_loss = 0, burst_len = 8, ack_drop = 0;
  // Descheduling: each end stops for `stall` (uniform in [stall_min, stall_max])
  // after an exponentially distributed time of mean `stall_every`; 0: never.
  us stall_every{0}, stall_min{0}, stall_max{0};
  uint64_t seed = 1;
  // Gives up (completed = false) after this much virtual time.
  us limit{10'000'000};

  // The engine's settings (engine.cc RegisterContext) for this payload and window.
  static PathModelConfig Defaults();
};

struct PathModelResult {
  bool completed = false;
  std::chrono::microseconds elapsed{0};  // first send to last ack
  ReliableSender::Counters sender;
  uint64_t data_dropped = 0, data_bytes_dropped = 0, acks_dropped = 0;
  uint64_t acks_sent = 0, duplicates = 0;
  std::chrono::microseconds final_srtt{0}, final_rto{0}, max_rto{0};
};

PathModelResult RunPathModel(const PathModelConfig& config);

}  // namespace transport
}  // namespace optireduce
