#include "transport_dpdk/gloo/context.h"

#include <gloo/common/logging.h>

#include <random>

#include "absl/strings/str_cat.h"

#include "transport_dpdk/device.h"
#include "transport_dpdk/gloo/pair.h"
#include "transport_dpdk/gloo/unbound_buffer.h"

namespace optireduce {
namespace transport {
namespace {
uint64_t RandomToken() {
  std::random_device rd;
  uint64_t t = 0;
  while (t == 0) t = (uint64_t(rd()) << 32) ^ rd();
  return t;
}
}  // namespace

Context::Context(std::shared_ptr<Device> device, int rank, int size)
    : ::gloo::transport::Context(rank, size),
      device_(std::move(device)),
      engine_(device_->engine()) {
  // The base leaves the timeout uninitialised; Gloo's default is 30 s.
  timeout_ = std::chrono::milliseconds(30000);
  const uint64_t configured = device_->options().session_token;
  local_token_ = configured ? configured : RandomToken();
  id_ = engine_->RegisterContext(rank, size, local_token_);
  bounded_ = std::make_unique<BoundedEndpoint>(engine_, id_);
  pairs_.resize(size);
}

Context::~Context() {
  // Pairs refer to this context and its engine: destroy them first.
  pairs_.clear();
  bounded_.reset();  // unhooks from the engine before the context goes
  engine_->UnregisterContext(id_);
}

void Context::FailAfterTimeout(const std::string& why) {
  engine_->FailContext(id_, absl::StrCat("rank ", rank, ": context failed after a wait timed out (",
                                         why, ")"));
}

std::unique_ptr<::gloo::transport::Pair>& Context::createPair(int peer) {
  GLOO_ENFORCE(peer >= 0 && peer < size && peer != rank, "bad peer rank ",
               peer, " for rank ", rank, " of ", size);
  pairs_[peer] = std::make_unique<Pair>(this, peer);
  return pairs_[peer];
}

std::unique_ptr<::gloo::transport::UnboundBuffer> Context::createUnboundBuffer(
    void* ptr, size_t size) {
  return std::make_unique<UnboundBuffer>(shared_from_this(), ptr, size);
}

}  // namespace transport
}  // namespace optireduce
