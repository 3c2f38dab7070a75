// source_access.h — what a lookup of a bounded operation's source found: the answer
// BoundedSources gives and BoundedHooks::read_source hands the engine, one enum for both.
#pragma once

#include <cstdint>

namespace optireduce {
namespace transport {

enum class SourceAccess : uint8_t {
  kDone,        // the source was valid and handed to the callback
  kGone,        // released: it is never served again
  kBusy,        // its owner is changing it right now (try again; never blocks)
  kNotStarted,  // this rank has not started the operation
  kPending,     // not registered yet, but this rank is in the other phase of the same
                // operation: a repair request is ignored (the requester asks again)
};

}  // namespace transport
}  // namespace optireduce
