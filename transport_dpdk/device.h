// device.h — the Gloo Device of the datagram transport: owns the engine
// (and through it the packet I/O backend and the progress thread).
#pragma once

#include <memory>
#include <string>

#include <gloo/transport/device.h>

#include "absl/status/statusor.h"
#include "transport_dpdk/attr.h"
#include "transport_dpdk/engine/engine.h"
#include "transport_dpdk/engine/engine_options.h"
#include "transport_dpdk/engine/stats.h"

namespace optireduce {
namespace transport {

class Device : public ::gloo::transport::Device,
               public std::enable_shared_from_this<Device> {
 public:
  Device(std::shared_ptr<Engine> engine, EngineOptions options);
  ~Device() override;

  std::string str() const override;
  const std::string& getPCIBusID() const override { return pci_bus_id_; }
  std::shared_ptr<::gloo::transport::Context> createContext(int rank,
                                                            int size) override;

  Stats stats() const { return engine_->GetStats(); }
  double ProgressThreadCpuSeconds() const {
    return engine_->ProgressThreadCpuSeconds();
  }
  const std::shared_ptr<Engine>& engine() const { return engine_; }
  const EngineOptions& options() const { return options_; }

 private:
  std::shared_ptr<Engine> engine_;
  const EngineOptions options_;
  const std::string pci_bus_id_;
};

// Builds the device over a ready PacketIo (used by every backend's
// CreateDevice; fault injection per options.faults).
absl::StatusOr<std::shared_ptr<Device>> CreateDeviceOverIo(
    std::unique_ptr<PacketIo> io, const EngineOptions& options,
    size_t rx_buffer_bytes);

// The device of a CreateDeviceOrError, or gloo::InvalidOperationException with the error
// after `what` ("udp::CreateDevice"): every backend's throwing CreateDevice.
std::shared_ptr<::gloo::transport::Device> DeviceOrThrow(
    absl::StatusOr<std::shared_ptr<Device>> device, const char* what);

// Every backend's factory takes its attr and the engine's options (EngineOptions'
// defaults when left out).
namespace udp {
// Throws gloo::InvalidOperationException on bad attributes or socket errors.
std::shared_ptr<::gloo::transport::Device> CreateDevice(const attr& attr,
                                                        const EngineOptions& engine = {});
absl::StatusOr<std::shared_ptr<Device>> CreateDeviceOrError(const attr& attr,
                                                            const EngineOptions& engine = {});
}  // namespace udp

namespace loop {
std::shared_ptr<::gloo::transport::Device> CreateDevice(const attr& attr = {},
                                                        const EngineOptions& engine = {});
absl::StatusOr<std::shared_ptr<Device>> CreateDeviceOrError(const attr& attr,
                                                            const EngineOptions& engine = {});
}  // namespace loop

}  // namespace transport
}  // namespace optireduce
