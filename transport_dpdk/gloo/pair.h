// pair.h — the Gloo Pair: one rank's link to one peer inside a context.
// connect() records the peer's address with the engine and waits (up to the
// context's timeout) until the peer answers the handshake, as Gloo's TCP
// connect does. The peer answers once it has connected its own pair back;
// connectFullMesh connects pairs in rank order on every rank, so the
// lexicographically smallest pair still open is always being connected by
// both of its ranks and the mesh cannot deadlock. Packets a peer sends
// before this rank connected back are kept (engine.h) and applied then.
#pragma once

#include <gloo/transport/pair.h>

#include "transport_dpdk/gloo/address.h"

namespace optireduce {
namespace transport {

class Context;

class Pair : public ::gloo::transport::Pair {
 public:
  Pair(Context* context, int peer);
  ~Pair() override;

  const ::gloo::transport::Address& address() const override {
    return local_;
  }
  void connect(const std::vector<char>& bytes) override;
  void close() override;
  void setSync(bool enable, bool busy_poll) override {}  // always async

  std::unique_ptr<::gloo::transport::Buffer> createSendBuffer(
      int slot, void* ptr, size_t size) override;
  std::unique_ptr<::gloo::transport::Buffer> createRecvBuffer(
      int slot, void* ptr, size_t size) override;

  void send(::gloo::transport::UnboundBuffer* buf, uint64_t slot,
            size_t offset, size_t nbytes) override;
  void recv(::gloo::transport::UnboundBuffer* buf, uint64_t slot,
            size_t offset, size_t nbytes) override;

  int peer() const { return peer_; }

 private:
  Context* const context_;
  const int peer_;
  Address local_;
  bool connected_ = false;
};

}  // namespace transport
}  // namespace optireduce
