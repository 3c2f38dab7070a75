// buffer.h — Gloo's old-style (pair-bound) Buffer used by the algorithm
// classes (AllreduceRing, ...): a send buffer writes into the peer's recv
// buffer of the same slot at a remote offset; waits count completions.
#pragma once

#include <memory>

#include <gloo/transport/buffer.h>

#include "transport_dpdk/engine/op_sink.h"

namespace optireduce {
namespace transport {

class Context;

class Buffer : public ::gloo::transport::Buffer {
 public:
  Buffer(std::shared_ptr<Context> context, int peer, int slot, void* ptr,
         size_t size, bool is_recv);
  ~Buffer() override;

  void send(size_t offset, size_t length, size_t roffset = 0) override;
  void waitRecv() override;
  void waitSend() override;

 private:
  std::shared_ptr<Context> context_;
  const int peer_;
  const bool is_recv_;
  std::shared_ptr<OpSink> sink_ = std::make_shared<OpSink>();
};

}  // namespace transport
}  // namespace optireduce
