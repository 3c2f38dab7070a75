// context.h — the Gloo transport Context: one rank's view of a group on a
// device. Registers with the engine (which does recv-from-any arbitration
// across the group's pairs) and creates pairs and unbound buffers.
#pragma once

#include <chrono>
#include <memory>

#include <gloo/transport/context.h>

#include "algorithms/bounded_channel.h"
#include "transport_dpdk/bounded/bounded_endpoint.h"
#include "transport_dpdk/engine/engine.h"

namespace optireduce {
namespace transport {

class Device;

// Also owns OptiReduce's bounded channel for this group (optireduce::BoundedChannelOf).
class Context : public ::gloo::transport::Context,
                public optireduce::HasBoundedChannel,
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

  // A wait on this context timed out (`why` says which): the context fails as
  // Gloo TCP's does — every pending and later operation raises
  // gloo::IoException, and no late packet lands in memory given up on.
  void FailAfterTimeout(const std::string& why);

  // OptiReduce's bounded channel (bounded/bounded_endpoint.h).
  optireduce::BoundedChannel* bounded_channel() override { return bounded_.get(); }
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
