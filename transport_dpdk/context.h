// context.h — the Gloo transport Context: one rank's view of a group on a
// device. Registers with the engine (which does recv-from-any arbitration
// across the group's pairs) and creates pairs and unbound buffers.
#pragma once

#include <chrono>
#include <memory>

#include <gloo/transport/context.h>

#include "algorithms/bounded_channel.h"
#include "transport_dpdk/bounded/bounded_endpoint.h"
#include "transport_dpdk/engine.h"

namespace optireduce {
namespace transport {

class Device;

// Also OptiReduce's bounded channel for this group (optireduce::BoundedChannelOf).
class Context : public ::gloo::transport::Context,
                public optireduce::BoundedChannel,
                public std::enable_shared_from_this<Context> {
 public:
  Context(std::shared_ptr<Device> device, int rank, int size);
  ~Context() override;

  std::unique_ptr<::gloo::transport::Pair>& createPair(int rank) override;
  std::unique_ptr<::gloo::transport::UnboundBuffer> createUnboundBuffer(
      void* ptr, size_t size) override;

  Engine& engine() const { return *engine_; }
  const std::shared_ptr<Engine>& engine_ptr() const { return engine_; }
  uint32_t id() const { return id_; }
  uint64_t local_token() const { return local_token_; }
  // The job's session token once the pair to rank 0 is connected.
  uint64_t session_token() const { return engine_->ContextToken(id_); }

  // optireduce::BoundedChannel, served by bounded_ (bounded/bounded_endpoint.h).
  std::unique_ptr<BoundedReceive> PostReceive(uint64_t op,
                                              std::vector<BoundedRegion> regions) override {
    return bounded_->PostReceive(op, std::move(regions));
  }
  void Send(int peer, uint64_t op, const void* src, size_t nbytes) override {
    bounded_->Send(peer, op, src, nbytes);
  }
  void Detach(uint64_t op) override { bounded_->Detach(op); }
  void Release(uint64_t op) override { bounded_->Release(op); }
  size_t PacketPayload() const override { return bounded_->PacketPayload(); }
  BoundedReceiverCounters bounded_counters() const { return bounded_->counters(); }

 private:
  std::shared_ptr<Device> device_;
  std::shared_ptr<Engine> engine_;
  uint64_t local_token_ = 0;
  uint32_t id_ = 0;
  std::unique_ptr<BoundedEndpoint> bounded_;
};

}  // namespace transport
}  // namespace optireduce
