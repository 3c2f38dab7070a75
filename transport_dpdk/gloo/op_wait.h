// op_wait.h — how Gloo-facing waits block on an OpSink: timeout from the
// caller or the context, gloo::IoException naming the pending peer(s) and
// slot(s) on timeout or failure, false on abort.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "transport_dpdk/engine/op_sink.h"

namespace optireduce {
namespace transport {

class Engine;

// Waits for one completed send (send=true) or recv on sink. Returns true
// and stores the peer rank in *rank (if non-null) on completion; false if
// the wait was aborted. timeout <= 0 means no timeout (Gloo's kNoTimeout).
// diagnostics() (may be empty) is appended to timeout messages.
// on_timeout(message) (may be empty) runs before a timeout is raised, without
// the sink lock: the adapters fail the context there (Engine::FailContext), so
// the timed-out operation can never write into the caller's memory later and
// every other pending or later operation of the context raises too.
// engine (may be null): the sink's engine; the wait polls it itself while it waits
// where the backend allows (Engine::DriveWait, waiter-driven receive), so an arrival
// needs no hand-off from the progress thread. Aborts must then also Engine::WakeWaiter.
bool WaitForCompletion(OpSink& sink, bool send, int* rank,
                       std::chrono::milliseconds timeout,
                       const std::function<std::string()>& diagnostics = {},
                       const std::function<void(const std::string&)>& on_timeout = {},
                       Engine* engine = nullptr);

// A poll of the same completions: waits at most `slice` and, unlike a Gloo
// wait, treats the end of the slice as no failure: the operation stays posted
// and the context usable. Errors still raise gloo::IoException.
enum class PollResult { kCompleted, kAborted, kNotYet };
// engine (may be null): polled by the waiting thread, as in WaitForCompletion.
PollResult PollForCompletion(OpSink& sink, bool send, int* rank, std::chrono::milliseconds slice,
                             Engine* engine = nullptr);

}  // namespace transport
}  // namespace optireduce
