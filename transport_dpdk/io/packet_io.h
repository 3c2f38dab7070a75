// packet_io.h — the narrow datagram interface every backend implements.
//
// The protocol engine (engine.h) is the only user. A backend moves opaque
// datagrams between endpoints; it knows nothing about ranks, messages or
// reliability. Backends: udp (kernel sockets, packet_io_udp.h), loop
// (in-process queues, packet_io_loop.h), dpdk (any ethdev, packet_io_dpdk.h).
//
// How the threads that poll a backend sleep between polls and wake each other is a
// second, small interface (IoWaits, io_waits.h), which the engine's wait policy
// (poll_backoff.h, engine_loop.cc, engine_waiter.cc) uses; PacketIo::Waits() hands it out.
//
// Threading: TxBurst, RxBurst and ResolvePeer are called with the engine's
// lock held, so never concurrently (from the progress thread, or from a user
// thread that posts a send and transmits it inline); the waits may overlap a TxBurst
// (io_waits.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "transport_dpdk/io/io_waits.h"

namespace optireduce {
namespace transport {

// A backend's own address of an endpoint: opaque, fixed length, and carried
// inside the Gloo Address bytes (UDP: IPv4 + port; DPDK: MAC + IPv4 + port +
// queue; loop: endpoint id). Unused trailing bytes must be zero.
inline constexpr size_t kIoAddressBytes = 32;
using IoAddress = std::array<uint8_t, kIoAddressBytes>;

// A resolved destination, valid for the lifetime of the PacketIo.
using PeerHandle = uint32_t;

// One datagram to send: the engine's header followed by the payload. The two
// parts are separate so that payload bytes can go straight from user memory
// (scatter-gather) without an extra copy in the engine.
struct TxDatagram {
  PeerHandle peer = 0;
  const void* head = nullptr;
  uint32_t head_len = 0;
  const void* body = nullptr;  // may be null when body_len == 0
  uint32_t body_len = 0;
};

// One received datagram. The bytes belong to the backend and stay valid (and
// writable, so a fault injector may corrupt them in place) until the next
// RxBurst call on the same PacketIo.
struct RxDatagram {
  uint8_t* data = nullptr;
  uint32_t len = 0;
};

// A report that a peer cannot be reached (PacketIo::TakeUnreachable).
inline constexpr size_t kQuotedBytes = 96;  // the engine's header (wire_format.h)
struct UnreachableReport {
  PeerHandle peer = 0;
  // The backend saw its own path to the peer end (memif: the link went down): the report
  // proves the peer gone. Otherwise it rests on a message from the network, which anyone
  // who knows the addresses can forge (udp: an ICMP port unreachable from the socket's
  // error queue), and `quoted` holds the first quoted_len bytes (at most kQuotedBytes) of
  // the datagram it says could not be delivered: the engine believes it only if that is a
  // datagram it sent to this peer and still expects an answer to.
  bool link_down = false;
  uint32_t quoted_len = 0;
  std::array<uint8_t, kQuotedBytes> quoted{};
};

class PacketIo {
 public:
  virtual ~PacketIo() = default;

  // Human-readable description, e.g. "udp 127.0.0.1:40123".
  virtual std::string Describe() const = 0;

  // Largest datagram (head_len + body_len) TxBurst accepts and RxBurst returns.
  virtual uint32_t MaxDatagram() const = 0;

  // This endpoint's address, to be published through rendezvous.
  virtual IoAddress LocalAddress() const = 0;

  // Turns a peer's published address into a handle for TxBurst. Resolving the
  // same address twice returns the same handle.
  virtual absl::StatusOr<PeerHandle> ResolvePeer(const IoAddress& address) = 0;

  // Human-readable form of an address of this backend's kind.
  virtual std::string AddressToString(const IoAddress& address) const = 0;

  // Sends datagrams[0..n) in order; returns how many the backend accepted.
  // The rest were not sent (transient backpressure). Accepted datagrams may
  // still be lost on the way: the engine provides reliability.
  // The backend keeps no pointer into head or body after returning (it copied
  // what it accepted): the engine sends bounded packets straight from sources
  // that are valid only during the call.
  virtual size_t TxBurst(const TxDatagram* datagrams, size_t n) = 0;

  // Receives up to max datagrams without blocking; returns how many.
  // Invalidates the datagrams returned by the previous call.
  virtual size_t RxBurst(RxDatagram* out, size_t max) = 0;

  // The waits of this backend's input (IoWaits), valid as long as the PacketIo.
  virtual IoWaits& Waits() = 0;

  // True if this link never delivers a datagram whose bytes changed on the way
  // (host shared memory; the kernel's UDP checksum): the engine then checksums
  // headers only (wire_format.h, kFlagHeaderChecksum). False is always safe.
  virtual bool ProtectsPayload() const { return false; }

  // Reports since the last call that a peer cannot be reached (UnreachableReport): stores
  // up to max in out and returns how many. Called like RxBurst (engine lock held); cheap
  // when there is nothing to report. Backends without such reports return 0.
  virtual size_t TakeUnreachable(UnreachableReport* out, size_t max) {
    (void)out;
    (void)max;
    return 0;
  }
  // True while the backend is still setting up the path to `peer` (memif: the link is
  // not up yet, or either side still sends the primer frames that fault its ring in,
  // ahead of the engine's packets): the engine does not count that time as the peer's
  // silence (PeerLiveness). Called by the progress thread (engine lock held). Backends
  // whose path exists at once return false.
  virtual bool LinkComingUp(PeerHandle peer) const {
    (void)peer;
    return false;
  }
  // What a TakeUnreachable report means on this backend, for the error that
  // names the gone peer ("peer rank R is gone: <cause>").
  virtual std::string UnreachableCause() const {
    return "the network reported its address unreachable";
  }
};

}  // namespace transport
}  // namespace optireduce
