#include "transport_dpdk/device.h"

#include <gloo/common/error.h>

#include "absl/strings/str_cat.h"
#include "transport_dpdk/gloo/context.h"
#include "transport_dpdk/io/fault_injector.h"
#include "transport_dpdk/io/loop/packet_io_loop.h"
#include "transport_dpdk/io/udp/packet_io_udp.h"

namespace optireduce {
namespace transport {

Device::Device(std::shared_ptr<Engine> engine, EngineOptions options)
    : engine_(std::move(engine)), options_(std::move(options)) {}

Device::~Device() = default;

std::string Device::str() const {
  return absl::StrCat("optireduce datagram device (", engine_->Describe(), ")");
}

std::shared_ptr<::gloo::transport::Context> Device::createContext(int rank,
                                                                  int size) {
  GLOO_ENFORCE(rank >= 0 && rank < size, "bad rank ", rank, " for size ", size);
  return std::make_shared<Context>(shared_from_this(), rank, size);
}

absl::StatusOr<std::shared_ptr<Device>> CreateDeviceOverIo(
    std::unique_ptr<PacketIo> io, const EngineOptions& options,
    size_t rx_buffer_bytes) {
  auto faulty = MaybeInjectFaults(std::move(io), options.faults);
  if (!faulty.ok()) return faulty.status();
  auto engine = Engine::Create(std::move(*faulty), options, rx_buffer_bytes);
  if (!engine.ok()) return engine.status();
  return std::make_shared<Device>(std::move(*engine), options);
}

std::shared_ptr<::gloo::transport::Device> DeviceOrThrow(
    absl::StatusOr<std::shared_ptr<Device>> device, const char* what) {
  if (!device.ok()) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION(what, ": ", device.status().ToString());
  }
  return *std::move(device);
}

namespace udp {
absl::StatusOr<std::shared_ptr<Device>> CreateDeviceOrError(const attr& a,
                                                            const EngineOptions& engine) {
  auto io = UdpPacketIo::Create(a);
  if (!io.ok()) return io.status();
  // The kernel reports twice the usable size (bookkeeping overhead).
  const size_t rx = std::max<size_t>((*io)->ReceiveBufferBytes() / 2, 256 << 10);
  return CreateDeviceOverIo(std::move(*io), engine, rx);
}
std::shared_ptr<::gloo::transport::Device> CreateDevice(const attr& a,
                                                        const EngineOptions& engine) {
  return DeviceOrThrow(CreateDeviceOrError(a, engine), "udp::CreateDevice");
}
}  // namespace udp

namespace loop {
absl::StatusOr<std::shared_ptr<Device>> CreateDeviceOrError(const attr& a,
                                                            const EngineOptions& engine) {
  if (a.max_datagram < 256 || a.max_datagram > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loop attr max_datagram ", a.max_datagram, " outside [256, 1 MiB]"));
  }
  auto io = std::make_unique<LoopPacketIo>(a.max_datagram, a.queue_capacity);
  return CreateDeviceOverIo(std::move(io), engine, a.queue_capacity * a.max_datagram / 2);
}
std::shared_ptr<::gloo::transport::Device> CreateDevice(const attr& a,
                                                        const EngineOptions& engine) {
  return DeviceOrThrow(CreateDeviceOrError(a, engine), "loop::CreateDevice");
}
}  // namespace loop

}  // namespace transport
}  // namespace optireduce
