#include "transport_dpdk/gloo/pair.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include "transport_dpdk/gloo/buffer.h"
#include "transport_dpdk/gloo/context.h"
#include "transport_dpdk/gloo/unbound_buffer.h"

namespace optireduce {
namespace transport {

Pair::Pair(Context* context, int peer)
    : context_(context),
      peer_(peer),
      local_(context->engine().LocalAddress(), context->rank, context->size,
             context->id(), context->local_token(),
             context->engine().MaxDatagram()) {}

Pair::~Pair() { close(); }

void Pair::connect(const std::vector<char>& bytes) {
  auto remote = Address::FromBytes(bytes);
  if (!remote.ok()) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("rank ", context_->rank,
                                           " connecting to rank ", peer_, ": ",
                                           remote.status().ToString());
  }
  if (remote->rank() != peer_ || remote->size() != context_->size) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION(
        "rank ", context_->rank, " expected the address of rank ", peer_,
        " of ", context_->size, " but got rank ", remote->rank(), " of ",
        remote->size());
  }
  auto st = context_->engine().ConnectPeer(context_->id(), peer_, remote->io(),
                                           remote->context_id(), remote->token(),
                                           remote->max_datagram());
  if (!st.ok()) {
    GLOO_THROW_IO_EXCEPTION("rank ", context_->rank, " connecting to rank ",
                            peer_, ": ", st.ToString());
  }
  connected_ = true;
  // Like Gloo's TCP connect, return only once the peer has answered: a dead,
  // unreachable or foreign address is an error here, not at the first op.
  const auto timeout = context_->getTimeout();
  st = context_->engine().WaitPeer(context_->id(), peer_, timeout);
  if (!st.ok()) {
    GLOO_THROW_IO_EXCEPTION("rank ", context_->rank, " connecting to rank ",
                            peer_, ": ", st.message());
  }
}

void Pair::close() {
  if (!connected_) return;
  connected_ = false;
  context_->engine().ClosePeer(context_->id(), peer_);
}

std::unique_ptr<::gloo::transport::Buffer> Pair::createSendBuffer(
    int slot, void* ptr, size_t size) {
  return std::make_unique<Buffer>(context_->shared_from_this(), peer_, slot,
                                  ptr, size, /*is_recv=*/false);
}

std::unique_ptr<::gloo::transport::Buffer> Pair::createRecvBuffer(
    int slot, void* ptr, size_t size) {
  return std::make_unique<Buffer>(context_->shared_from_this(), peer_, slot,
                                  ptr, size, /*is_recv=*/true);
}

void Pair::send(::gloo::transport::UnboundBuffer* buf, uint64_t slot,
                size_t offset, size_t nbytes) {
  auto* ub = dynamic_cast<UnboundBuffer*>(buf);
  GLOO_ENFORCE(ub != nullptr, "buffer was not created by this transport");
  ub->send(peer_, slot, offset, nbytes);
}

void Pair::recv(::gloo::transport::UnboundBuffer* buf, uint64_t slot,
                size_t offset, size_t nbytes) {
  auto* ub = dynamic_cast<UnboundBuffer*>(buf);
  GLOO_ENFORCE(ub != nullptr, "buffer was not created by this transport");
  ub->recv(peer_, slot, offset, nbytes);
}

}  // namespace transport
}  // namespace optireduce
