#include "transport_dpdk/gloo/unbound_buffer.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include "transport_dpdk/gloo/context.h"
#include "transport_dpdk/gloo/op_wait.h"

namespace optireduce {
namespace transport {

UnboundBuffer::UnboundBuffer(std::shared_ptr<Context> context, void* ptr,
                             size_t size)
    : ::gloo::transport::UnboundBuffer(ptr, size),
      context_(std::move(context)) {}

UnboundBuffer::~UnboundBuffer() {
  // Operations still in flight must not touch this memory any more.
  context_->engine().Cancel(sink_.get());
}

size_t UnboundBuffer::Resolve(size_t offset, size_t nbytes) const {
  // As Gloo's TCP transport: "the rest of the buffer" needs an offset within
  // it (at its end: an empty transfer); an empty transfer may name any
  // offset (Gloo's bcube allreduce posts them past the end when there are
  // fewer elements than ranks), since it touches no memory.
  if (nbytes == kUnspecifiedByteCount) {
    GLOO_ENFORCE(offset <= size, "offset ", offset, " beyond buffer size ", size);
    nbytes = size - offset;
  }
  if (nbytes == 0) return 0;
  GLOO_ENFORCE(offset <= size, "offset ", offset, " beyond buffer size ", size);
  GLOO_ENFORCE(nbytes <= size - offset, "offset ", offset, " + nbytes ",
               nbytes, " exceeds buffer size ", size);
  return nbytes;
}

std::chrono::milliseconds UnboundBuffer::EffectiveTimeout(
    std::chrono::milliseconds t) const {
  return t == ::gloo::transport::kUnsetTimeout ? context_->getTimeout() : t;
}

bool UnboundBuffer::waitRecv(int* rank, std::chrono::milliseconds timeout) {
  return WaitForCompletion(*sink_, false, rank, EffectiveTimeout(timeout),
                           [this] { return context_->engine().DebugState(context_->id()); },
                           [this](const std::string& why) { context_->FailAfterTimeout(why); },
                           &context_->engine());
}

PollResult UnboundBuffer::pollRecv(int* rank, std::chrono::milliseconds slice) {
  return PollForCompletion(*sink_, false, rank, slice, &context_->engine());
}

bool UnboundBuffer::waitSend(int* rank, std::chrono::milliseconds timeout) {
  return WaitForCompletion(*sink_, true, rank, EffectiveTimeout(timeout),
                           [this] { return context_->engine().DebugState(context_->id()); },
                           [this](const std::string& why) { context_->FailAfterTimeout(why); },
                           &context_->engine());
}

void UnboundBuffer::withdrawSends() { context_->engine().Withdraw(sink_.get()); }

void UnboundBuffer::abortWaitRecv() {
  {
    std::lock_guard<std::mutex> lock(sink_->mu);
    sink_->abort_recv = true;
    sink_->cv.notify_all();
  }
  // A wait that polls the engine itself sleeps in the device's wait, not on the sink.
  context_->engine().WakeWaiter();
}

void UnboundBuffer::abortWaitSend() {
  {
    std::lock_guard<std::mutex> lock(sink_->mu);
    sink_->abort_send = true;
    sink_->cv.notify_all();
  }
  context_->engine().WakeWaiter();
}

void UnboundBuffer::send(int dst, uint64_t slot, size_t offset,
                         size_t nbytes) {
  nbytes = Resolve(offset, nbytes);
  auto op = context_->engine().PostSend(
      context_->id(), dst, MsgKind::kUnbound, slot,
      static_cast<char*>(ptr) + (nbytes ? offset : 0), nbytes, 0, sink_);
  GLOO_ENFORCE(op.ok(), op.status().ToString());
}

void UnboundBuffer::recv(int src, uint64_t slot, size_t offset,
                         size_t nbytes) {
  recv(std::vector<int>{src}, slot, offset, nbytes);
}

void UnboundBuffer::recv(std::vector<int> srcs, uint64_t slot, size_t offset,
                         size_t nbytes) {
  nbytes = Resolve(offset, nbytes);
  auto op = context_->engine().PostRecv(context_->id(), srcs, slot,
                                        static_cast<char*>(ptr) + (nbytes ? offset : 0),
                                        nbytes, sink_);
  GLOO_ENFORCE(op.ok(), op.status().ToString());
}

}  // namespace transport
}  // namespace optireduce
