#include "algorithms/bounded_channel.h"

#include <gloo/context.h>
#include <gloo/transport/context.h>

namespace optireduce {
namespace {

// gloo::Context keeps its transport context protected; reading it through a derived
// class's member pointer is the one sanctioned way in without patching Gloo.
struct ContextAccess : gloo::Context {
  static gloo::transport::Context* Get(gloo::Context& context) {
    return (context.*(&ContextAccess::transportContext_)).get();
  }
};

}  // namespace

const char* PhaseEndName(PhaseEnd end) {
  switch (end) {
    case PhaseEnd::kComplete: return "complete";
    case PhaseEnd::kEarlyTimeout: return "early_timeout";
    case PhaseEnd::kDeadline: return "deadline";
    case PhaseEnd::kPeerTimeout: return "peer_timeout";
    case PhaseEnd::kPeerFailed: return "peer_failed";
  }
  return "unknown";
}

BoundedChannel* BoundedChannelOf(gloo::Context& context) {
  auto* owner = dynamic_cast<HasBoundedChannel*>(ContextAccess::Get(context));
  return owner != nullptr ? owner->bounded_channel() : nullptr;
}

}  // namespace optireduce
