// unbound_buffer.h — Gloo's UnboundBuffer: memory not tied to a pair; sends
// and recvs (including recv-from-any) are posted to the engine and waited on
// through an OpSink.
#pragma once

#include "transport_dpdk/gloo/op_wait.h"

#include <memory>

#include <gloo/transport/unbound_buffer.h>

#include "transport_dpdk/engine/op_sink.h"

namespace optireduce {
namespace transport {

class Context;

class UnboundBuffer : public ::gloo::transport::UnboundBuffer {
 public:
  UnboundBuffer(std::shared_ptr<Context> context, void* ptr, size_t size);
  ~UnboundBuffer() override;

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override;
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override;
  // A receive wait of at most `slice` that is no Gloo wait: at the end of the
  // slice it returns PollResult::kNotYet and the context stays usable (a Gloo
  // wait that times out fails the context). For callers that poll, e.g.
  // optireduce::allreduce's agreement exchange (BoundedChannel::PollRecv).
  PollResult pollRecv(int* rank, std::chrono::milliseconds slice);
  // Withdraws this buffer's sends that no receive will take (Engine::Withdraw).
  void withdrawSends();
  void abortWaitRecv() override;
  void abortWaitSend() override;

  void send(int dst, uint64_t slot, size_t offset, size_t nbytes) override;
  void recv(int src, uint64_t slot, size_t offset, size_t nbytes) override;
  void recv(std::vector<int> srcs, uint64_t slot, size_t offset,
            size_t nbytes) override;

 private:
  size_t Resolve(size_t offset, size_t nbytes) const;
  std::chrono::milliseconds EffectiveTimeout(std::chrono::milliseconds t) const;

  std::shared_ptr<Context> context_;
  std::shared_ptr<OpSink> sink_ = std::make_shared<OpSink>();
};

}  // namespace transport
}  // namespace optireduce
