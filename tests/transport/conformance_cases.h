// conformance_cases.h — Gloo collectives run on any transport device and
// checked exactly (integer data), shared by the in-process (loop) tests and
// the multi-process (udp) worker.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

namespace optireduce {
namespace testing {

// Every case name RunCase understands.
const std::vector<std::string>& AllCaseNames();

// Runs one case with `elements` elements per rank; returns "" on success or
// a description of the first mismatch.
std::string RunCase(const std::string& name,
                    const std::shared_ptr<gloo::Context>& context,
                    size_t elements);

// connectFullMesh over store with the given device.
std::shared_ptr<gloo::Context> ConnectContext(
    gloo::rendezvous::Store& store,
    std::shared_ptr<gloo::transport::Device> device, int rank, int size,
    std::chrono::milliseconds timeout);

}  // namespace testing
}  // namespace optireduce
