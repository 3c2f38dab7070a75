#include "transport_dpdk/gloo/buffer.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include "transport_dpdk/gloo/context.h"
#include "transport_dpdk/gloo/op_wait.h"

namespace optireduce {
namespace transport {

Buffer::Buffer(std::shared_ptr<Context> context, int peer, int slot,
               void* ptr, size_t size, bool is_recv)
    : ::gloo::transport::Buffer(slot, ptr, size),
      context_(std::move(context)),
      peer_(peer),
      is_recv_(is_recv) {
  if (is_recv_) {
    auto st = context_->engine().RegisterRecvBuffer(
        context_->id(), peer_, static_cast<uint64_t>(slot), ptr, size, sink_);
    GLOO_ENFORCE(st.ok(), st.ToString());
  }
}

Buffer::~Buffer() {
  if (is_recv_) {
    context_->engine().UnregisterRecvBuffer(
        context_->id(), peer_, static_cast<uint64_t>(slot_), sink_.get());
  }
  context_->engine().Cancel(sink_.get());
}

void Buffer::send(size_t offset, size_t length, size_t roffset) {
  GLOO_ENFORCE(!is_recv_, "send on a recv buffer");
  GLOO_ENFORCE(offset <= size_, "offset ", offset, " beyond buffer size ", size_);
  GLOO_ENFORCE(length <= size_ - offset, "offset ", offset, " + length ",
                  length, " exceeds buffer size ", size_);
  auto op = context_->engine().PostSend(
      context_->id(), peer_, MsgKind::kBuffer, static_cast<uint64_t>(slot_),
      static_cast<char*>(ptr_) + offset, length, roffset, sink_);
  GLOO_ENFORCE(op.ok(), op.status().ToString());
}

void Buffer::waitRecv() {
  WaitForCompletion(*sink_, false, nullptr, context_->getTimeout(),
                    [this] { return context_->engine().DebugState(context_->id()); },
                    [this](const std::string& why) { context_->FailAfterTimeout(why); },
                    &context_->engine());
}

void Buffer::waitSend() {
  WaitForCompletion(*sink_, true, nullptr, context_->getTimeout(),
                    [this] { return context_->engine().DebugState(context_->id()); },
                    [this](const std::string& why) { context_->FailAfterTimeout(why); },
                    &context_->engine());
}

}  // namespace transport
}  // namespace optireduce
