// dpdk_device.h — the Gloo device over the DPDK backend.
//
//   auto dev = optireduce::transport::dpdk::CreateDevice(attr, engine_options);
//
// EAL arguments come from attr.eal_args (gloo_ext::DpdkAttrFromEnvironment()
// takes them from OPTIREDUCE_EAL_ARGS). Multi-process
// over memif: give each rank one memif vdev per peer link, e.g. 2 ranks:
//   rank 0: --vdev=net_memif0,role=server,id=0,socket=/tmp/j/01.sock,socket-abstract=no
//   rank 1: --vdev=net_memif0,role=client,id=0,socket=/tmp/j/01.sock,socket-abstract=no
// (MemifMeshEalArgs builds these for N ranks). The device uses every port
// (or attr.ports) and routes by the peer's MAC (see packet_io_dpdk.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gloo/transport/device.h>

#include "absl/status/statusor.h"
#include "transport_dpdk/device.h"
#include "transport_dpdk/dpdk_attr.h"
#include "transport_dpdk/engine/engine_options.h"

namespace optireduce {
namespace transport {
namespace dpdk {

// Throws gloo::InvalidOperationException naming the problem. Without engine options,
// EngineOptions' defaults.
std::shared_ptr<::gloo::transport::Device> CreateDevice(const attr& attr,
                                                        const EngineOptions& engine = {});
absl::StatusOr<std::shared_ptr<Device>> CreateDeviceOrError(const attr& attr,
                                                            const EngineOptions& engine = {});

// EAL --vdev arguments for rank `rank` of a full memif mesh of `size` ranks
// whose sockets live in `socket_dir` (link i<j: rank i is the server of
// "<dir>/<i>-<j>.sock"). Port k of rank r is the link to the k-th other rank.
// buffer_size > 0 gives every link packet buffers of that many bytes
// ("bsize="; every rank must use the same), and the device then picks an MTU
// of min(65000, buffer_size - 14) on them (see packet_io_dpdk.cc); 0 keeps
// memif's 2048-byte buffers and MTU 1500. 9216 gives 9000-byte frames (6x
// fewer packets), 16384 16370-byte ones, 32768 32754-byte ones (fewer again;
// the bench's choice is in bench/local_ranks.cc). A link's mempool takes
// ~64-68 MiB of the EAL's memory at 16-32 KiB buffers; counted in frames, a
// pool of bigger ones would not fit, so packet_io_dpdk.cc bounds memif pools
// by bytes (64 MiB, at least 1792 frames: ~111 MiB at 64 KiB).
std::string MemifMeshEalArgs(const std::string& socket_dir, int rank, int size,
                             unsigned buffer_size = 0);

// Creates, in this process, a full mesh of net_ring port pairs for `size`
// endpoints (ranks as threads sharing one EAL): ring port "<prefix>_i_j"
// sends i->j and receives j->i. Returns, per endpoint, the port names to
// put in attr.ports. Initialises the EAL (eal_args as in attr) if needed.
absl::StatusOr<std::vector<std::vector<std::string>>> CreateRingMesh(
    const std::string& prefix, int size, const std::string& eal_args = "",
    unsigned ring_size = 2048);

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
