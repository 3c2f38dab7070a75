// Registers optireduce's devices in PyTorch's c10d::GlooDeviceRegistry, so that
// GLOO_DEVICE_TRANSPORT=UDP (or DPDK) makes ProcessGroupGloo use them.
//
// C10_REGISTER_CREATOR would register unconditionally at static-initialisation time, and
// c10's registry calls exit(1) when a key is registered twice with the same priority —
// which happens when two copies of this library end up in one process (say, LD_PRELOAD of
// the build tree's copy plus `import optireduce` of the installed one). So this file does
// what the macro does (a static registration inside namespace c10d) but skips keys that are
// already present.
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>

#include <gloo/common/logging.h>
#include <torch/csrc/distributed/c10d/GlooDeviceFactory.hpp>

#include "gloo_ext/config.h"
#include "gloo_ext/devices.h"

namespace c10d {
namespace {

using DeviceCreator = std::shared_ptr<::gloo::transport::Device> (*)(const std::string&,
                                                                     const std::string&);
// The registry's own creator type. torch 1.13 and 2.6 pass (interface, hostname); later
// torch appends arguments (lazy initialisation), which our devices do not need: the
// adapter below takes the first two and ignores the rest, so this file compiles against
// either declaration of GlooDeviceRegistry.
using Registry = std::remove_pointer_t<decltype(GlooDeviceRegistry())>;

template <DeviceCreator create>
Registry::Creator Adapt() {
  return [](const std::string& interface, const std::string& hostname, auto&&...) {
    return create(interface, hostname);
  };
}

// Errors become exceptions that torch reports as a Python RuntimeError at
// init_process_group, naming the variable at fault.
std::shared_ptr<::gloo::transport::Device> ThrowOnError(
    const char* name,
    const absl::StatusOr<std::shared_ptr<::gloo::transport::Device>>& device) {
  GLOO_ENFORCE(device.ok(), "optireduce: GLOO_DEVICE_TRANSPORT=", name, ": ",
               device.status().ToString());
  return *device;
}

std::shared_ptr<::gloo::transport::Device> CreateOptiReduceUdpDevice(
    const std::string& interface, const std::string& hostname) {
  const optireduce::gloo_ext::Config& config = optireduce::gloo_ext::GetConfigOrThrow();
  return ThrowOnError("UDP", optireduce::gloo_ext::CreateUdpDevice(config, interface, hostname));
}

std::shared_ptr<::gloo::transport::Device> CreateOptiReduceDpdkDevice(
    const std::string& interface, const std::string& hostname) {
  const optireduce::gloo_ext::Config& config = optireduce::gloo_ext::GetConfigOrThrow();
  return ThrowOnError("DPDK",
                      optireduce::gloo_ext::CreateDpdkDevice(config, interface, hostname));
}

bool RegisterOnce(const char* name, Registry::Creator creator) {
  Registry* registry = GlooDeviceRegistry();
  if (registry->Has(name)) {
    // Another copy of this library (or someone else) registered it first: keep theirs.
    return false;
  }
  registry->Register(name, creator);
  return true;
}

// Static registration, like C10_REGISTER_CREATOR(GlooDeviceRegistry, UDP, ...).
const bool kUdpRegistered = RegisterOnce("UDP", Adapt<&CreateOptiReduceUdpDevice>());
// Always registered: without DPDK in the build, the creator explains that instead of
// torch's generic "unsupported gloo device".
const bool kDpdkRegistered = RegisterOnce("DPDK", Adapt<&CreateOptiReduceDpdkDevice>());

}  // namespace
}  // namespace c10d

extern "C" __attribute__((visibility("default"))) int optireduce_torch_devices_registered() {
  return (c10d::kUdpRegistered ? 1 : 0) | (c10d::kDpdkRegistered ? 2 : 0);
}

// The hook of patches/pytorch (a PyTorch whose GlooDeviceFactory registers UDP/DPDK itself
// and asks this library, found through dlsym(RTLD_DEFAULT), for the device). Returns 0 and
// sets *out, or nonzero with *error set. C++ types cross this boundary: both sides must be
// built against the same Gloo headers and C++ ABI.
extern "C" __attribute__((visibility("default"))) int optireduce_create_gloo_device(
    const char* transport, const std::string* interface, const std::string* hostname,
    std::shared_ptr<::gloo::transport::Device>* out, std::string* error) {
  try {
    const std::string name = transport != nullptr ? transport : "";
    if (name == "UDP") {
      *out = c10d::CreateOptiReduceUdpDevice(*interface, *hostname);
    } else if (name == "DPDK") {
      *out = c10d::CreateOptiReduceDpdkDevice(*interface, *hostname);
    } else {
      *error = "optireduce: unknown transport '" + name + "' (allowed: UDP, DPDK)";
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    *error = e.what();
    return 1;
  }
}
